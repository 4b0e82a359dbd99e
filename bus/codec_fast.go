package bus

import (
	"encoding/binary"
	"unsafe"
)

// fastCheckMsgpack decodes the usual shape of a msgpack check request in one
// pass: a fixmap of up to four fixstr keys, a str identifier and integer
// values, each key once, everything valid. It returns ok false for anything
// else, and the caller then runs the general decoder, which explains what is
// wrong. With view the identifier aliases b. It allocates nothing with view.
//
// It exists because the check endpoint decodes every request on its single
// callback goroutine; it took about half the time of the general decoder.
func fastCheckMsgpack(b []byte, view bool) (c CheckRequest, ok bool) {
	if len(b) == 0 || b[0]&0xf0 != 0x80 {
		return c, false
	}
	n := int(b[0] & 0x0f)
	b = b[1:]
	var seen uint8
	c.Cost = 1
	for range n {
		if len(b) == 0 || b[0]&0xe0 != 0xa0 {
			return c, false
		}
		kl := int(b[0] & 0x1f)
		if len(b) < 1+kl {
			return c, false
		}
		key := b[1 : 1+kl]
		b = b[1+kl:]
		var bit uint8
		switch string(key) {
		case "identifier":
			bit = ckIdentifier
		case "limit":
			bit = ckLimit
		case "duration":
			bit = ckDuration
		case "cost":
			bit = ckCost
		default:
			return c, false
		}
		if seen&bit != 0 {
			return c, false
		}
		seen |= bit
		if bit == ckIdentifier {
			var s []byte
			if s, b, ok = fastStr(b); !ok || len(s) == 0 || len(s) > MaxIdentifierLen {
				return c, false
			}
			if view {
				c.Identifier = unsafe.String(unsafe.SliceData(s), len(s))
			} else {
				c.Identifier = string(s)
			}
			continue
		}
		var v int64
		if v, b, ok = fastInt(b); !ok {
			return c, false
		}
		switch bit {
		case ckLimit:
			ok = wireLimitField.inRange(v)
			c.Limit = v
		case ckDuration:
			ok = wireDurationField.inRange(v)
			c.Duration = v
		case ckCost:
			ok = wireCostField.inRange(v)
			c.Cost = v
		}
		if !ok {
			return c, false
		}
	}
	const required = ckIdentifier | ckLimit | ckDuration
	return c, len(b) == 0 && seen&required == required
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

// fastInt reads a non-negative integer of any msgpack width that fits int64.
func fastInt(b []byte) (v int64, rest []byte, ok bool) {
	if len(b) == 0 {
		return 0, nil, false
	}
	t := b[0]
	var size int
	switch {
	case t <= 0x7f:
		return int64(t), b[1:], true
	case t == 0xcc || t == 0xd0:
		size = 1
	case t == 0xcd || t == 0xd1:
		size = 2
	case t == 0xce || t == 0xd2:
		size = 4
	case t == 0xcf || t == 0xd3:
		size = 8
	default:
		return 0, nil, false
	}
	if len(b) < 1+size {
		return 0, nil, false
	}
	p := b[1 : 1+size]
	signed := t >= 0xd0
	switch size {
	case 1:
		if signed {
			v = int64(int8(p[0]))
		} else {
			v = int64(p[0])
		}
	case 2:
		if signed {
			v = int64(int16(binary.BigEndian.Uint16(p)))
		} else {
			v = int64(binary.BigEndian.Uint16(p))
		}
	case 4:
		if signed {
			v = int64(int32(binary.BigEndian.Uint32(p)))
		} else {
			v = int64(binary.BigEndian.Uint32(p))
		}
	case 8:
		u := binary.BigEndian.Uint64(p)
		if !signed && u > 1<<63-1 {
			return 0, nil, false
		}
		v = int64(u)
	}
	if v < 0 {
		return 0, nil, false
	}
	return v, b[1+size:], true
}
