package wire

import (
	"encoding/binary"
	"unsafe"

	"github.com/sluicehq/sluice/window"
)

// fastCheckMsgpack decodes the usual shape of a msgpack check request, one
// check map and nothing after it (fastCheckMap), into c. It returns false
// for anything else, and the caller then runs the general decoder, which
// explains what is wrong; c is then undefined. With view it allocates
// nothing. The check endpoint decodes every request with it on its single
// callback goroutine (BenchmarkDecodeCheckRequest compares it with the
// general decoder).
func fastCheckMsgpack(b []byte, view bool, c *CheckRequest) bool {
	rest, ok := fastCheckMap(b, c, nil, view)
	return ok && len(rest) == 0
}

// fastCheckMap decodes the usual shape of one msgpack check into c: a
// fixmap of fixstr keys, each once, a str identifier (and namespace),
// integers for the rest, everything valid. Only a check of a batch or
// checks message has a namespace, read into *ns (ns is nil for a single
// check), which holds the previous check's on entry. With view the strings
// alias b; without, they are copies (bodyString). It accepts a subset of
// what the field table (fields.go) accepts and returns false for anything
// else, leaving every refusal, and its message, to the general decoder; c
// and *ns are then undefined. The five keys have distinct lengths, which
// pick the field.
func fastCheckMap(b []byte, c *CheckRequest, ns *string, view bool) (rest []byte, ok bool) {
	if len(b) == 0 || b[0]&0xf0 != 0x80 {
		return nil, false
	}
	n := int(b[0] & 0x0f)
	b = b[1:]
	var seen uint8
	if ns == nil {
		seen = ckNamespace // so that a namespace key is refused as a repeat
	}
	c.Cost, c.Shadow, c.Fixed, c.Charge = 1, false, false, window.ChargeAll
	for range n {
		if len(b) == 0 || b[0]&0xe0 != 0xa0 {
			return nil, false
		}
		kl := int(b[0] & 0x1f)
		if len(b) < 1+kl {
			return nil, false
		}
		key := b[1 : 1+kl]
		b = b[1+kl:]
		var (
			bit   uint8
			dst   *int64
			field *wireIntField
		)
		switch kl {
		case len("namespace"):
			if string(key) != "namespace" {
				return nil, false
			}
			bit = ckNamespace
		case len("identifier"):
			if string(key) != "identifier" {
				return nil, false
			}
			bit = ckIdentifier
		case len("limit"):
			if string(key) != "limit" {
				return nil, false
			}
			bit, dst, field = ckLimit, &c.Limit, &wireLimitField
		case len("duration"):
			if string(key) != "duration" {
				return nil, false
			}
			bit, dst, field = ckDuration, &c.Duration, &wireDurationField
		case len("cost"):
			if string(key) != "cost" {
				return nil, false
			}
			bit, dst, field = ckCost, &c.Cost, &wireCostField
		default:
			return nil, false
		}
		if seen&bit != 0 {
			return nil, false
		}
		seen |= bit
		if dst == nil {
			s, r, ok := fastStr(b)
			switch {
			case !ok:
				return nil, false
			case bit == ckNamespace:
				if !window.ValidToken(s) {
					return nil, false
				}
				*ns = bodyString(s, view, *ns)
			case len(s) == 0 || len(s) > MaxIdentifierLen:
				return nil, false
			default:
				c.Identifier = bodyString(s, view, "")
			}
			b = r
			continue
		}
		v, r, ok := fastInt(b)
		if !ok || !field.inRange(v) {
			return nil, false
		}
		*dst = v
		b = r
	}
	const required = ckNamespace | ckIdentifier | ckLimit | ckDuration
	return b, seen&required == required
}

// bodyString returns the string s of a body: a view of the body with view,
// else a copy, or prev when s spells it (the usual batch whose checks share
// a namespace allocates it once).
func bodyString(s []byte, view bool, prev string) string {
	if view {
		return unsafe.String(unsafe.SliceData(s), len(s))
	}
	if string(s) == prev {
		return prev
	}
	return string(s)
}

// fastStr reads a fixstr, str8 or str16.
func fastStr(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	var l, h int
	switch t := b[0]; {
	case t&0xe0 == 0xa0:
		l, h = int(t&0x1f), 1
	case t == 0xd9 && len(b) >= 2:
		l, h = int(b[1]), 2
	case t == 0xda && len(b) >= 3:
		l, h = int(binary.BigEndian.Uint16(b[1:])), 3
	default:
		return nil, nil, false
	}
	if len(b) < h+l {
		return nil, nil, false
	}
	return b[h : h+l], b[h+l:], true
}

// fastInt reads an integer of any msgpack width that fits int64: a
// positive fixint, or a uint or int of 1, 2, 4 or 8 bytes (0xcc to 0xd3).
func fastInt(b []byte) (v int64, rest []byte, ok bool) {
	if len(b) > 0 && b[0] <= 0x7f {
		return int64(b[0]), b[1:], true
	}
	if len(b) == 0 || b[0] < 0xcc || b[0] > 0xd3 {
		return 0, nil, false
	}
	size := 1 << ((b[0] - 0xcc) & 3)
	if len(b) < 1+size {
		return 0, nil, false
	}
	var u uint64
	switch p := b[1 : 1+size]; size {
	case 1:
		u = uint64(p[0])
	case 2:
		u = uint64(binary.BigEndian.Uint16(p))
	case 4:
		u = uint64(binary.BigEndian.Uint32(p))
	default:
		u = binary.BigEndian.Uint64(p)
	}
	if shift := 64 - 8*size; b[0] >= 0xd0 { // an int: extend its sign
		return int64(u<<shift) >> shift, b[1+size:], true
	}
	return int64(u), b[1+size:], u <= 1<<63-1
}
