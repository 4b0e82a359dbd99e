package event

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/policy"
)

// Policies is the event that carries overrides and reset marks between
// limiters, bridges and regions (docs/architecture.md, "Carrying and
// storing policies"):
//
//	{"v": 1, "o": [override, ...], "r": [mark, ...], "m": more, "g": digest, "s": seq, "d": [part, ...]}
//	override: [workspace, namespace, pattern, limit, duration, flags, at, origin]
//	mark:     [workspace, namespace, identifier, duration, epoch]
//
// flags: 1 shadow, 2 deleted (a tombstone: limit and duration 0); at and
// origin are the entry's version. "m" (a snapshot chunk: more follow) and
// "g" (the sender's digest: its policy.Table.Digest XOR its
// policy.Marks.Digest) are optional, written only when set, and so is "s"
// (the bridge's policy sequence: a broadcast, a snapshot's last chunk or
// the answer to a limiter's barrier carries the sequence of the last change
// it holds; Bridge.PolicySeq) and "d" (the sender's digest in its
// policy.DigestShards parts, exactly that many: a snapshot request and its
// last chunk carry it, so that each side sends only the parts in which
// they differ); so is "r" (a
// mark's duration 0: every duration), so an event without marks keeps the
// bytes it had before marks existed. The pattern and the identifier are
// msgpack bin (any bytes), read from bin or str.
//
// DecodePolicies treats the event as hostile, as the other decoders do: a
// version 1 map with "o", each known key once, at most MaxEntries entries
// of exactly eight fields, each entry valid by policy.Entry.Validate, at
// most MaxEntries marks of exactly five fields, each valid by
// policy.Mark.Validate, and nothing after the map; unknown keys are
// skipped.
type Policies struct {
	Overrides []policy.Entry
	// Marks are reset marks; nil when the event has none.
	Marks  []policy.Mark
	More   bool
	Digest uint64
	// Seq is the bridge's policy sequence ("s"); 0: none.
	Seq uint64
	// Shards are the sender's digest in parts ("d": policy.Digests.Shards
	// of its table XOR its marks), so that the receiver sends only the
	// parts that differ; nil: none (every part is sent).
	Shards []uint64
}

// minMarkBytes is the fewest bytes a mark takes: the array header, two
// one-byte tokens, a one-byte identifier and two one-byte integers, with
// their headers.
const minMarkBytes = 1 + 2 + 2 + 3 + 1 + 1

// The flags of an override entry.
const (
	flagShadow  = 1
	flagDeleted = 2
)

// minOverrideBytes is the fewest bytes an override entry takes: the array
// header, two one-byte tokens, a one-byte pattern, five one-byte integers
// and a one-byte origin, with their headers.
const minOverrideBytes = 1 + 2 + 2 + 3 + 1 + 1 + 1 + 1 + 2

// AppendPolicies appends p as a policies event to dst. It does not
// validate the entries or bound their number: senders split snapshots into
// events of at most MaxEntries.
func AppendPolicies(dst []byte, p Policies) []byte {
	n := uint32(2)
	if len(p.Marks) > 0 {
		n++
	}
	if p.More {
		n++
	}
	if p.Digest != 0 {
		n++
	}
	if p.Seq != 0 {
		n++
	}
	if len(p.Shards) > 0 {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "v")
	dst = msgp.AppendUint64(dst, Version)
	dst = msgp.AppendString(dst, "o")
	dst = msgp.AppendArrayHeader(dst, uint32(len(p.Overrides)))
	for i := range p.Overrides {
		e := &p.Overrides[i]
		var flags uint64
		if e.Shadow {
			flags |= flagShadow
		}
		if e.Deleted {
			flags |= flagDeleted
		}
		dst = msgp.AppendArrayHeader(dst, 8)
		dst = msgp.AppendString(dst, e.Workspace)
		dst = msgp.AppendString(dst, e.Namespace)
		dst = msgp.AppendBytes(dst, []byte(e.Pattern))
		dst = msgp.AppendUint64(dst, uint64(max(e.Limit, 0)))
		dst = msgp.AppendUint64(dst, uint64(max(e.Duration, 0)))
		dst = msgp.AppendUint64(dst, flags)
		dst = msgp.AppendUint64(dst, uint64(max(e.Version.At, 0)))
		dst = msgp.AppendString(dst, e.Version.Origin)
	}
	if len(p.Marks) > 0 {
		dst = msgp.AppendString(dst, "r")
		dst = msgp.AppendArrayHeader(dst, uint32(len(p.Marks)))
		for i := range p.Marks {
			m := &p.Marks[i]
			dst = msgp.AppendArrayHeader(dst, 5)
			dst = msgp.AppendString(dst, m.Workspace)
			dst = msgp.AppendString(dst, m.Namespace)
			dst = msgp.AppendBytes(dst, []byte(m.Identifier))
			dst = msgp.AppendUint64(dst, uint64(max(m.Duration, 0)))
			dst = msgp.AppendUint64(dst, uint64(max(m.Epoch, 0)))
		}
	}
	if p.More {
		dst = msgp.AppendString(dst, "m")
		dst = msgp.AppendBool(dst, true)
	}
	if p.Digest != 0 {
		dst = msgp.AppendString(dst, "g")
		dst = msgp.AppendUint64(dst, p.Digest)
	}
	if p.Seq != 0 {
		dst = msgp.AppendString(dst, "s")
		dst = msgp.AppendUint64(dst, p.Seq)
	}
	if len(p.Shards) > 0 {
		dst = msgp.AppendString(dst, "d")
		dst = msgp.AppendArrayHeader(dst, uint32(len(p.Shards)))
		for _, h := range p.Shards {
			dst = msgp.AppendUint64(dst, h)
		}
	}
	return dst
}

// DecodePolicies decodes a policies event (see Policies for its rules).
func DecodePolicies(b []byte) (Policies, error) {
	p, err := decodePolicies(b)
	if err != nil {
		return Policies{}, invalid("policies", err)
	}
	return p, nil
}

func decodePolicies(b []byte) (Policies, error) {
	var p Policies
	if err := checkMap(b); err != nil {
		return p, err
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return p, malformed(err)
	}
	var seenV, seenO, seenR, seenM, seenG, seenS, seenD bool
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return p, malformed(err)
		}
		dup := func(seen *bool) error {
			if *seen {
				return &wireError{"duplicate key " + strconv.Quote(string(key))}
			}
			*seen = true
			return nil
		}
		switch string(key) {
		case "v":
			if err = dup(&seenV); err != nil {
				return p, err
			}
			var v uint64
			if v, b, err = msgp.ReadUint64Bytes(b); err != nil {
				return p, &wireError{"version: " + eventMessage(err)}
			}
			if v != Version {
				return p, &wireError{"unsupported version " + strconv.FormatUint(v, 10)}
			}
		case "o":
			if err = dup(&seenO); err != nil {
				return p, err
			}
			if p.Overrides, b, err = readOverrides(b); err != nil {
				return p, err
			}
		case "r":
			if err = dup(&seenR); err != nil {
				return p, err
			}
			if p.Marks, b, err = readMarks(b); err != nil {
				return p, err
			}
		case "m":
			if err = dup(&seenM); err != nil {
				return p, err
			}
			if p.More, b, err = msgp.ReadBoolBytes(b); err != nil {
				return p, &wireError{`"m": ` + eventMessage(err)}
			}
		case "g":
			if err = dup(&seenG); err != nil {
				return p, err
			}
			if p.Digest, b, err = msgp.ReadUint64Bytes(b); err != nil {
				return p, &wireError{`"g": ` + eventMessage(err)}
			}
		case "s":
			if err = dup(&seenS); err != nil {
				return p, err
			}
			if p.Seq, b, err = msgp.ReadUint64Bytes(b); err != nil {
				return p, &wireError{`"s": ` + eventMessage(err)}
			}
		case "d":
			if err = dup(&seenD); err != nil {
				return p, err
			}
			if p.Shards, b, err = readShards(b); err != nil {
				return p, err
			}
		default:
			if b, err = msgp.Skip(b); err != nil {
				return p, malformed(err)
			}
		}
	}
	if len(b) != 0 {
		return p, &wireError{"malformed msgpack: " + strconv.Itoa(len(b)) + " trailing bytes after the map"}
	}
	if err := checkPresent(seenV, seenO, "o"); err != nil {
		return p, err
	}
	return p, nil
}

// readShards reads the digest parts of a policies event: exactly
// policy.DigestShards integers.
func readShards(b []byte) ([]uint64, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, &wireError{`"d": ` + eventMessage(err)}
	}
	if n != policy.DigestShards {
		return nil, b, &wireError{`"d" must hold ` + strconv.Itoa(policy.DigestShards) + " parts, not " + strconv.FormatUint(uint64(n), 10)}
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], b, err = msgp.ReadUint64Bytes(b); err != nil {
			return nil, b, &wireError{`"d": ` + eventMessage(err)}
		}
	}
	return out, b, nil
}

// readOverrides reads the entry list of a policies event.
func readOverrides(b []byte) ([]policy.Entry, []byte, error) {
	if msgp.NextType(b) != msgp.ArrayType {
		return nil, b, &wireError{`"o" must be an array`}
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, malformed(err)
	}
	if n > MaxEntries {
		return nil, b, &wireError{fmt.Sprintf("%d overrides, more than %d", n, MaxEntries)}
	}
	if int(n) > len(b)/minOverrideBytes {
		return nil, b, malformed(msgp.ErrShortBytes)
	}
	es := make([]policy.Entry, n)
	for i := range es {
		if es[i], b, err = readOverride(b); err != nil {
			return nil, b, &wireError{"override " + strconv.Itoa(i) + ": " + err.Error()}
		}
	}
	return es, b, nil
}

func readOverride(b []byte) (policy.Entry, []byte, error) {
	var e policy.Entry
	if msgp.NextType(b) != msgp.ArrayType {
		return e, b, errors.New("must be an array")
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return e, b, errors.New(eventMessage(err))
	}
	if n != 8 {
		return e, b, fmt.Errorf("has %d fields, want 8", n)
	}
	field := func(name string, err error) error { return fmt.Errorf("%s: %s", name, eventMessage(err)) }
	if e.Workspace, b, err = msgp.ReadStringBytes(b); err != nil {
		return e, b, field("workspace", err)
	}
	if e.Namespace, b, err = msgp.ReadStringBytes(b); err != nil {
		return e, b, field("namespace", err)
	}
	var pattern []byte
	switch msgp.NextType(b) {
	case msgp.StrType:
		pattern, b, err = msgp.ReadStringZC(b)
	default:
		pattern, b, err = msgp.ReadBytesZC(b)
	}
	if err != nil {
		return e, b, field("pattern", err)
	}
	e.Pattern = string(pattern)
	var limit, duration, flags, at uint64
	for _, f := range []struct {
		name string
		dst  *uint64
	}{{"limit", &limit}, {"duration", &duration}, {"flags", &flags}, {"at", &at}} {
		if *f.dst, b, err = msgp.ReadUint64Bytes(b); err != nil {
			return e, b, field(f.name, err)
		}
	}
	if e.Version.Origin, b, err = msgp.ReadStringBytes(b); err != nil {
		return e, b, field("origin", err)
	}
	if flags > flagShadow|flagDeleted {
		return e, b, fmt.Errorf("flags %d: unknown bits", flags)
	}
	if limit > math.MaxInt64 || duration > math.MaxInt64 || at > math.MaxInt64 {
		return e, b, errors.New("an integer is out of range")
	}
	e.Limit, e.Duration, e.Version.At = int64(limit), int64(duration), int64(at)
	e.Shadow, e.Deleted = flags&flagShadow != 0, flags&flagDeleted != 0
	if err := e.Validate(); err != nil {
		return e, b, err
	}
	return e, b, nil
}

// readMarks reads the mark list of a policies event; an empty list reads
// as nil, as an absent one.
func readMarks(b []byte) ([]policy.Mark, []byte, error) {
	if msgp.NextType(b) != msgp.ArrayType {
		return nil, b, &wireError{`"r" must be an array`}
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, malformed(err)
	}
	if n > MaxEntries {
		return nil, b, &wireError{fmt.Sprintf("%d reset marks, more than %d", n, MaxEntries)}
	}
	if int(n) > len(b)/minMarkBytes {
		return nil, b, malformed(msgp.ErrShortBytes)
	}
	if n == 0 {
		return nil, b, nil
	}
	ms := make([]policy.Mark, n)
	for i := range ms {
		if ms[i], b, err = readMark(b); err != nil {
			return nil, b, &wireError{"reset mark " + strconv.Itoa(i) + ": " + err.Error()}
		}
	}
	return ms, b, nil
}

func readMark(b []byte) (policy.Mark, []byte, error) {
	var m policy.Mark
	if msgp.NextType(b) != msgp.ArrayType {
		return m, b, errors.New("must be an array")
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return m, b, errors.New(eventMessage(err))
	}
	if n != 5 {
		return m, b, fmt.Errorf("has %d fields, want 5", n)
	}
	field := func(name string, err error) error { return fmt.Errorf("%s: %s", name, eventMessage(err)) }
	if m.Workspace, b, err = msgp.ReadStringBytes(b); err != nil {
		return m, b, field("workspace", err)
	}
	if m.Namespace, b, err = msgp.ReadStringBytes(b); err != nil {
		return m, b, field("namespace", err)
	}
	var id []byte
	switch msgp.NextType(b) {
	case msgp.StrType:
		id, b, err = msgp.ReadStringZC(b)
	default:
		id, b, err = msgp.ReadBytesZC(b)
	}
	if err != nil {
		return m, b, field("identifier", err)
	}
	m.Identifier = string(id)
	var duration, epoch uint64
	if duration, b, err = msgp.ReadUint64Bytes(b); err != nil {
		return m, b, field("duration", err)
	}
	if epoch, b, err = msgp.ReadUint64Bytes(b); err != nil {
		return m, b, field("epoch", err)
	}
	if duration > math.MaxInt64 || epoch > math.MaxInt64 {
		return m, b, errors.New("an integer is out of range")
	}
	m.Duration, m.Epoch = int64(duration), int64(epoch)
	if err := m.Validate(); err != nil {
		return m, b, err
	}
	return m, b, nil
}
