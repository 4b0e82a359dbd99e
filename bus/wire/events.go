package wire

// Internal events: what limiters and bridges tell each other, possibly across
// regions, on NATS subjects. Every event is a msgpack map
//
//	{"v": 1, "<list key>": [entry, entry, ...]}
//
// whose list key says what the entries are: "c" for components, "d" for
// denials, "i" for imports. A snapshot chunk also carries "m": a boolean,
// true when more chunks follow. Encoders write "v" first, then the list,
// then "m". Each entry is a msgpack array of exactly its fields, in this
// order:
//
//	component: [workspace, namespace, identifier, duration, sequence, region, count, expire_at]
//	denial:    [workspace, namespace, identifier, duration, sequence, region, usage, expire_at]
//	import:    [workspace, namespace, identifier, duration, sequence, foreign, own, floor, expire_at]
//
// Tokens (workspace, namespace, region) are msgpack str; identifiers are
// written as msgpack bin, so they may hold any bytes, and read from bin or
// str; integers are written in their shortest msgpack form (unsigned when not
// negative) and read from any integer form that holds the value.
//
// Decoders treat every event as hostile: they reject, with an error that
// names the entry and the field, anything but a version 1 map holding its
// entry list (and "m" for a chunk) with valid entries and nothing after the
// map. Keys they do not know are skipped, so that later versions of the
// encoders may add some. Every rule an entry must satisfy:
//
//   - workspace, namespace and region: ValidToken (1 to 64 characters of
//     [A-Za-z0-9_-]);
//   - identifier: 1 to MaxIdentifierLen bytes of anything;
//   - duration: MinDuration to MaxDuration milliseconds;
//   - sequence and expire_at: 0 to math.MaxInt64;
//   - count, usage, foreign, own and floor: 0 to window.MaxCount.

import (
	"errors"
	"math"
	"strconv"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// EventVersion is the version every internal event carries; decoders reject others.
const EventVersion = 1

// MaxEventEntries is the most entries one internal event may carry: decoders
// reject a longer list. Encoders do not check it, so senders of more entries
// (a bridge answering with a snapshot, for one) must split them into several
// events.
const MaxEventEntries = 100_000

// Keys of the event maps.
const (
	eventKeyVersion    = "v"
	eventKeyComponents = "c"
	eventKeyDenials    = "d"
	eventKeyImports    = "i"
	eventKeyMore       = "m"
)

// Fields of each kind of entry.
const (
	eventComponentFields = 8
	eventDenialFields    = 8
	eventImportFields    = 9
)

// SnapshotChunk is the answer to a limiter asking its bridge for the current
// imports, possibly in several chunks: one chunk of them, and whether more
// follow.
type SnapshotChunk struct {
	// Imports are the imports this chunk carries. A decoded chunk holds a
	// non-nil slice, empty when the chunk carries none.
	Imports []global.Import
	// More reports whether chunks follow this one; the last chunk of a
	// snapshot has More false.
	More bool
}

// AppendComponents appends the components event carrying cs to dst and
// returns the extended buffer: {"v": 1, "c": [...]}, each component written
// as [workspace, namespace, identifier, duration, sequence, region, count,
// expire_at]. A nil cs is written as an empty list. cs is not validated, and
// splitting more than MaxEventEntries components is up to the caller. It
// allocates only when dst lacks capacity.
func AppendComponents(dst []byte, cs []global.Component) []byte {
	size := eventHeadSize(len(cs))
	for i := range cs {
		c := &cs[i]
		size += 1 + eventCellSize(&c.Cell) + eventStrSize(c.Region) + eventIntSize(c.Count) + eventIntSize(c.ExpireAt)
	}
	dst = eventGrow(dst, size)
	dst = eventAppendHead(dst, 2, eventKeyComponents, len(cs))
	for i := range cs {
		c := &cs[i]
		dst = msgp.AppendArrayHeader(dst, eventComponentFields)
		dst = eventAppendCell(dst, &c.Cell)
		dst = msgp.AppendString(dst, c.Region)
		dst = eventAppendInt(dst, c.Count)
		dst = eventAppendInt(dst, c.ExpireAt)
	}
	return dst
}

// DecodeComponents decodes and validates a components event, as written by
// AppendComponents. It accepts only a version 1 map holding the list "c" of
// at most MaxEventEntries valid components and nothing after the map; it
// skips keys it does not know. A valid entry has tokens (workspace, namespace,
// region) satisfying ValidToken, an identifier (bin or str) of 1 to
// MaxIdentifierLen bytes, a duration of MinDuration to MaxDuration, a
// sequence and an expire_at not negative, and a count of 0 to
// window.MaxCount. The result is a new non-nil slice (empty for an empty
// list) that does not alias b. Errors are plain errors
// prefixed with "invalid components event: "; those about one entry then
// name it and its field, as in "components[3]: duration 10 out of range
// 1000..2592000000".
func DecodeComponents(b []byte) ([]global.Component, error) {
	cs, _, err := eventDecode(b, eventKeyComponents, "components", false, eventComponentFields, eventDecodeComponent)
	if err != nil {
		return nil, eventError("components event", err)
	}
	return cs, nil
}

// AppendDenials appends the denials event carrying ds to dst and returns the
// extended buffer: {"v": 1, "d": [...]}, each denial written as [workspace,
// namespace, identifier, duration, sequence, region, usage, expire_at]. A nil
// ds is written as an empty list. ds is not validated, and splitting more than
// MaxEventEntries denials is up to the caller. It allocates only when dst lacks
// capacity.
func AppendDenials(dst []byte, ds []global.Denial) []byte {
	size := eventHeadSize(len(ds))
	for i := range ds {
		d := &ds[i]
		size += 1 + eventCellSize(&d.Cell) + eventStrSize(d.Region) + eventIntSize(d.Usage) + eventIntSize(d.ExpireAt)
	}
	dst = eventGrow(dst, size)
	dst = eventAppendHead(dst, 2, eventKeyDenials, len(ds))
	for i := range ds {
		d := &ds[i]
		dst = msgp.AppendArrayHeader(dst, eventDenialFields)
		dst = eventAppendCell(dst, &d.Cell)
		dst = msgp.AppendString(dst, d.Region)
		dst = eventAppendInt(dst, d.Usage)
		dst = eventAppendInt(dst, d.ExpireAt)
	}
	return dst
}

// DecodeDenials decodes and validates a denials event, as written by
// AppendDenials: the list is "d", and each denial satisfies the rules of
// DecodeComponents, with its usage in place of the count. The result is a new
// non-nil slice that does not alias b.
// Errors are plain errors prefixed with "invalid denials event: "; those about
// one entry then name it and its field, as in "denials[0]: usage -1 out of
// range 0..4611686018427387904".
func DecodeDenials(b []byte) ([]global.Denial, error) {
	ds, _, err := eventDecode(b, eventKeyDenials, "denials", false, eventDenialFields, eventDecodeDenial)
	if err != nil {
		return nil, eventError("denials event", err)
	}
	return ds, nil
}

// AppendImports appends the imports event carrying is to dst and returns the
// extended buffer: {"v": 1, "i": [...]}, each import written as [workspace,
// namespace, identifier, duration, sequence, foreign, own, floor, expire_at].
// A nil is is written as an empty list. is is not validated, and splitting
// more than MaxEventEntries imports is up to the caller. It allocates only when
// dst lacks capacity.
func AppendImports(dst []byte, is []global.Import) []byte {
	dst = eventGrow(dst, eventHeadSize(len(is))+eventImportsSize(is))
	dst = eventAppendHead(dst, 2, eventKeyImports, len(is))
	return eventAppendImports(dst, is)
}

// DecodeImports decodes and validates an imports event, as written by
// AppendImports: the list is "i", and each import satisfies the rules of
// DecodeComponents for its cell, with foreign, own and floor of 0 to
// window.MaxCount and expire_at not negative. The result is a new non-nil
// slice that does not alias b.
// Errors are plain errors prefixed with "invalid imports event: "; those about
// one entry then name it and its field, as in "imports[2]: workspace must be a
// string".
func DecodeImports(b []byte) ([]global.Import, error) {
	is, _, err := eventDecode(b, eventKeyImports, "imports", false, eventImportFields, eventDecodeImport)
	if err != nil {
		return nil, eventError("imports event", err)
	}
	return is, nil
}

// AppendSnapshotChunk appends the snapshot chunk c to dst and returns the
// extended buffer: {"v": 1, "i": [...], "m": c.More}, each import written as
// by AppendImports. A nil c.Imports is written as an empty list. c is not
// validated, and a chunk must not carry more than MaxEventEntries imports. It
// allocates only when dst lacks capacity.
func AppendSnapshotChunk(dst []byte, c SnapshotChunk) []byte {
	// The head, the imports, then "m" and its bool.
	dst = eventGrow(dst, eventHeadSize(len(c.Imports))+eventImportsSize(c.Imports)+3)
	dst = eventAppendHead(dst, 3, eventKeyImports, len(c.Imports))
	dst = eventAppendImports(dst, c.Imports)
	dst = msgp.AppendString(dst, eventKeyMore)
	return msgp.AppendBool(dst, c.More)
}

// DecodeSnapshotChunk decodes and validates a snapshot chunk, as written by
// AppendSnapshotChunk: "i" and "m" are both required, and each import
// satisfies the rules of DecodeImports. The Imports of the result are a new
// non-nil slice that does not alias b. Errors are plain errors prefixed with
// "invalid snapshot chunk: ".
func DecodeSnapshotChunk(b []byte) (SnapshotChunk, error) {
	is, more, err := eventDecode(b, eventKeyImports, "imports", true, eventImportFields, eventDecodeImport)
	if err != nil {
		return SnapshotChunk{}, eventError("snapshot chunk", err)
	}
	return SnapshotChunk{Imports: is, More: more}, nil
}

// --- encoding ----------------------------------------------------------------

// Encoders first compute the exact size of what they append, so that they
// allocate at most once, and not at all when dst has room for the event.

// eventHeadSize is the size of the map header, the version, the list key and
// the header of a list of n entries.
func eventHeadSize(n int) int {
	switch {
	case n <= 15:
		return 6 + 1
	case n <= math.MaxUint16:
		return 6 + 3
	}
	return 6 + 5
}

// eventCellSize is the size of the five fields of c.
func eventCellSize(c *window.Cell) int {
	return eventStrSize(c.Workspace) + eventStrSize(c.Namespace) + eventBinSize(c.Identifier) +
		eventIntSize(c.Duration) + eventIntSize(c.Sequence)
}

// eventImportsSize is the size of the entries of is.
func eventImportsSize(is []global.Import) int {
	size := 0
	for i := range is {
		im := &is[i]
		size += 1 + eventCellSize(&im.Cell) + eventIntSize(im.Foreign) + eventIntSize(im.Own) +
			eventIntSize(im.Floor) + eventIntSize(im.ExpireAt)
	}
	return size
}

// eventStrSize is the size of s written by msgp.AppendString.
func eventStrSize(s string) int {
	switch n := len(s); {
	case n <= 31:
		return 1 + n
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	}
	return 5 + len(s)
}

// eventBinSize is the size of s written as a bin.
func eventBinSize(s string) int {
	switch n := len(s); {
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	}
	return 5 + len(s)
}

// eventIntSize is the size of v written by eventAppendInt.
func eventIntSize(v int64) int {
	if v >= 0 {
		switch {
		case v <= 127:
			return 1
		case v <= math.MaxUint8:
			return 2
		case v <= math.MaxUint16:
			return 3
		case v <= math.MaxUint32:
			return 5
		}
		return 9
	}
	switch {
	case v >= -32:
		return 1
	case v >= math.MinInt8:
		return 2
	case v >= math.MinInt16:
		return 3
	case v >= math.MinInt32:
		return 5
	}
	return 9
}

// eventGrow makes room for n more bytes after dst.
func eventGrow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]byte, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

// eventAppendHead appends a map header of n keys, the version and the header
// of an entry list of count entries under key.
func eventAppendHead(dst []byte, n uint32, key string, count int) []byte {
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, eventKeyVersion)
	dst = msgp.AppendUint64(dst, EventVersion)
	dst = msgp.AppendString(dst, key)
	return msgp.AppendArrayHeader(dst, uint32(count))
}

func eventAppendImports(dst []byte, is []global.Import) []byte {
	for i := range is {
		im := &is[i]
		dst = msgp.AppendArrayHeader(dst, eventImportFields)
		dst = eventAppendCell(dst, &im.Cell)
		dst = eventAppendInt(dst, im.Foreign)
		dst = eventAppendInt(dst, im.Own)
		dst = eventAppendInt(dst, im.Floor)
		dst = eventAppendInt(dst, im.ExpireAt)
	}
	return dst
}

// eventAppendCell appends the five fields of a cell; the identifier is a bin.
func eventAppendCell(dst []byte, c *window.Cell) []byte {
	dst = msgp.AppendString(dst, c.Workspace)
	dst = msgp.AppendString(dst, c.Namespace)
	dst = msgp.AppendBytesHeader(dst, uint32(len(c.Identifier)))
	dst = append(dst, c.Identifier...)
	dst = eventAppendInt(dst, c.Duration)
	return eventAppendInt(dst, c.Sequence)
}

// eventAppendInt appends v in its shortest form: unsigned unless negative
// (which only an invalid value is), as unsigned forms are the shorter.
func eventAppendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

// --- decoding ----------------------------------------------------------------

// eventError turns a decoding error into the error a caller sees.
func eventError(kind string, err error) error {
	return errors.New("invalid " + kind + ": " + err.Error())
}

// eventErr makes a decoding error; eventError adds the kind of event.
func eventErr(msg string) error { return errors.New(msg) }

// Bits of the top-level keys, to spot duplicate and missing keys.
const (
	evVersion uint8 = 1 << iota
	evList
	evMore
)

// eventDecode decodes the event map in b: its version, its entry list under
// listKey (named name in errors), each entry an array of fields values read by
// entry, and, when chunk, "m".
func eventDecode[T any](b []byte, listKey, name string, chunk bool, fields uint32,
	entry func(b []byte, e, prev *T) ([]byte, error)) (list []T, more bool, err error) {
	if len(b) == 0 {
		return nil, false, eventErr("empty message")
	}
	n, b, err := msgpMapHeader(b, "event must be a msgpack map")
	if err != nil {
		return nil, false, err
	}
	var seen uint8
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return nil, false, err
		}
		var bit uint8
		switch string(key) {
		case eventKeyVersion:
			bit = evVersion
		case listKey:
			bit = evList
		case eventKeyMore:
			if chunk {
				bit = evMore
			}
		}
		if bit != 0 && seen&bit != 0 {
			return nil, false, wireErrDuplicateField(key)
		}
		seen |= bit
		switch bit {
		case 0:
			b, err = msgpSkip(b)
		case evVersion:
			var v int64
			if v, b, err = msgpInt64(b, `version "v"`); err == nil && v != EventVersion {
				err = eventErr("unsupported version " + strconv.FormatInt(v, 10) +
					", want " + strconv.Itoa(EventVersion))
			}
		case evList:
			list, b, err = eventDecodeList(b, listKey, name, fields, entry)
		case evMore:
			more, b, err = msgpBool(b, `more "m"`)
		}
		if err != nil {
			return nil, false, err
		}
	}
	if len(b) != 0 {
		return nil, false, wireErrTrailing(len(b))
	}
	switch {
	case seen&evVersion == 0:
		return nil, false, eventErr(`missing version "v"`)
	case seen&evList == 0:
		return nil, false, eventErr(`missing entry list "` + listKey + `"`)
	case chunk && seen&evMore == 0:
		return nil, false, eventErr(`missing more "m"`)
	}
	return list, more, nil
}

// eventDecodeList decodes an entry list of at most MaxEventEntries entries,
// each an array of exactly fields values read by entry.
func eventDecodeList[T any](b []byte, key, name string, fields uint32,
	entry func(b []byte, e, prev *T) ([]byte, error)) ([]T, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
	case msgp.InvalidType:
		return nil, nil, msgpBadValue(b)
	default:
		return nil, nil, eventErr(`entry list "` + key + `" must be an array`)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, msgpMalformed(err)
	}
	if n > MaxEventEntries {
		return nil, nil, eventErr(`entry list "` + key + `" holds ` + strconv.FormatUint(uint64(n), 10) +
			" entries, more than " + strconv.Itoa(MaxEventEntries))
	}
	// Each entry takes at least a byte per field plus its header: never
	// allocate for entries that cannot be there.
	if uint64(n)*uint64(fields+1) > uint64(len(b)) {
		return nil, nil, eventErr(`malformed msgpack: entry list "` + key + `" announces ` +
			strconv.FormatUint(uint64(n), 10) + " entries but only " + strconv.Itoa(len(b)) + " bytes follow")
	}
	list := make([]T, n)
	for i := range list {
		// The first entry is its own prev: entry reads each field of prev
		// before setting that field, so it sees only zero values (and no
		// zero T escapes to the heap).
		prev := &list[i]
		if i > 0 {
			prev = &list[i-1]
		}
		if b, err = eventDecodeEntry(b, fields, &list[i], prev, entry); err != nil {
			return nil, nil, eventErr(name + "[" + strconv.Itoa(i) + "]: " + err.Error())
		}
	}
	return list, b, nil
}

func eventDecodeEntry[T any](b []byte, fields uint32, e, prev *T,
	entry func(b []byte, e, prev *T) ([]byte, error)) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
	case msgp.InvalidType:
		return nil, msgpBadValue(b)
	default:
		return nil, eventErr("entry must be an array")
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, msgpMalformed(err)
	}
	if n != fields {
		return nil, eventErr("entry must be an array of " + strconv.FormatUint(uint64(fields), 10) +
			" fields, got " + strconv.FormatUint(uint64(n), 10))
	}
	return entry(b, e, prev)
}

func eventDecodeComponent(b []byte, c, prev *global.Component) (_ []byte, err error) {
	if b, err = eventDecodeCell(b, &c.Cell, &prev.Cell); err != nil {
		return nil, err
	}
	if c.Region, b, err = eventToken(b, "region", prev.Region); err != nil {
		return nil, err
	}
	if c.Count, b, err = eventInt(b, "count", 0, window.MaxCount); err != nil {
		return nil, err
	}
	return eventExpireAt(b, &c.ExpireAt)
}

func eventDecodeDenial(b []byte, d, prev *global.Denial) (_ []byte, err error) {
	if b, err = eventDecodeCell(b, &d.Cell, &prev.Cell); err != nil {
		return nil, err
	}
	if d.Region, b, err = eventToken(b, "region", prev.Region); err != nil {
		return nil, err
	}
	if d.Usage, b, err = eventInt(b, "usage", 0, window.MaxCount); err != nil {
		return nil, err
	}
	return eventExpireAt(b, &d.ExpireAt)
}

func eventDecodeImport(b []byte, im, prev *global.Import) (_ []byte, err error) {
	if b, err = eventDecodeCell(b, &im.Cell, &prev.Cell); err != nil {
		return nil, err
	}
	if im.Foreign, b, err = eventInt(b, "foreign", 0, window.MaxCount); err != nil {
		return nil, err
	}
	if im.Own, b, err = eventInt(b, "own", 0, window.MaxCount); err != nil {
		return nil, err
	}
	if im.Floor, b, err = eventInt(b, "floor", 0, window.MaxCount); err != nil {
		return nil, err
	}
	return eventExpireAt(b, &im.ExpireAt)
}

func eventExpireAt(b []byte, v *int64) (_ []byte, err error) {
	*v, b, err = eventInt(b, "expire_at", 0, math.MaxInt64)
	return b, err
}

// eventDecodeCell reads the five fields of a cell. Tokens equal to those of
// prev, the entry before, reuse its strings.
func eventDecodeCell(b []byte, c, prev *window.Cell) (_ []byte, err error) {
	if c.Workspace, b, err = eventToken(b, "workspace", prev.Workspace); err != nil {
		return nil, err
	}
	if c.Namespace, b, err = eventToken(b, "namespace", prev.Namespace); err != nil {
		return nil, err
	}
	var id []byte
	if id, b, err = msgpString(b, "identifier"); err != nil {
		return nil, err
	}
	if len(id) == 0 || len(id) > MaxIdentifierLen {
		return nil, wireErrIdentifierLen(len(id))
	}
	c.Identifier = string(id)
	if c.Duration, b, err = eventInt(b, "duration", MinDuration, MaxDuration); err != nil {
		return nil, err
	}
	c.Sequence, b, err = eventInt(b, "sequence", 0, math.MaxInt64)
	return b, err
}

// eventToken reads a str satisfying ValidToken: prev when it spells it, a
// copy otherwise.
func eventToken(b []byte, name, prev string) (string, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
	case msgp.InvalidType:
		return "", nil, msgpBadValue(b)
	default:
		return "", nil, wireErrNotString(name)
	}
	s, o, err := msgp.ReadStringZC(b)
	if err != nil {
		return "", nil, msgpMalformed(err)
	}
	if !wireValidToken(s) {
		return "", nil, eventErr(name + " " + wireQuote(string(s)) + " is not 1 to 64 characters of [A-Za-z0-9_-]")
	}
	if string(s) == prev {
		return prev, o, nil
	}
	return string(s), o, nil
}

// eventInt reads an integer of any msgpack form and checks that it lies in
// min..max; min is not negative.
func eventInt(b []byte, name string, min, max int64) (int64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType:
		v, o, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		if v < min || v > max {
			return 0, nil, eventErrRange(name, strconv.FormatInt(v, 10), min, max)
		}
		return v, o, nil
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		if u < uint64(min) || u > uint64(max) {
			return 0, nil, eventErrRange(name, strconv.FormatUint(u, 10), min, max)
		}
		return int64(u), o, nil
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	}
	return 0, nil, eventErr(name + " must be an integer")
}

func eventErrRange(name, got string, min, max int64) error {
	return eventErr(name + " " + got + " out of range " + strconv.FormatInt(min, 10) + ".." + strconv.FormatInt(max, 10))
}
