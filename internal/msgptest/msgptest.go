// Package msgptest builds msgpack bodies for tests of decoders, with the
// msgp Append* primitives and apart from the codecs under test: maps keep
// their order, keys may be any value, and raw bytes can be spliced in, so
// that malformed and unusual encodings can be written on purpose.
package msgptest

import (
	"reflect"

	"github.com/tinylib/msgp/msgp"
)

// KV is one key and value of a Map, in that order; the key may be any
// encodable value.
type KV [2]any

// Map is a msgpack map whose entries keep their order.
type Map []KV

// Raw is appended verbatim.
type Raw []byte

// Encode returns v in msgpack, each Go type in its own form: int and int64
// signed, uint64 unsigned, []byte bin, string str, nil nil, []any array,
// Map map, Raw as is.
func Encode(v any) []byte { return appendValue(nil, v, false) }

// EncodeUnsigned is Encode with a non-negative int in its unsigned form, as
// encoders that write counts and sizes do.
func EncodeUnsigned(v any) []byte { return appendValue(nil, v, true) }

func appendValue(b []byte, v any, unsigned bool) []byte {
	switch v := v.(type) {
	case nil:
		return msgp.AppendNil(b)
	case Raw:
		return append(b, v...)
	case string:
		return msgp.AppendString(b, v)
	case []byte:
		return msgp.AppendBytes(b, v)
	case bool:
		return msgp.AppendBool(b, v)
	case int:
		if unsigned && v >= 0 {
			return msgp.AppendUint64(b, uint64(v))
		}
		return msgp.AppendInt64(b, int64(v))
	case int8:
		return msgp.AppendInt8(b, v)
	case int16:
		return msgp.AppendInt16(b, v)
	case int32:
		return msgp.AppendInt32(b, v)
	case int64:
		return msgp.AppendInt64(b, v)
	case uint8:
		return msgp.AppendUint8(b, v)
	case uint16:
		return msgp.AppendUint16(b, v)
	case uint32:
		return msgp.AppendUint32(b, v)
	case uint64:
		return msgp.AppendUint64(b, v)
	case float32:
		return msgp.AppendFloat32(b, v)
	case float64:
		return msgp.AppendFloat64(b, v)
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(v)))
		for _, e := range v {
			b = appendValue(b, e, unsigned)
		}
		return b
	case Map:
		b = msgp.AppendMapHeader(b, uint32(len(v)))
		for _, e := range v {
			b = appendValue(b, e[0], unsigned)
			b = appendValue(b, e[1], unsigned)
		}
		return b
	}
	panic("msgptest: unsupported type " + reflect.TypeOf(v).String())
}

// With returns a copy of m with key k set to v (appended when absent).
func (m Map) With(k string, v any) Map {
	out := append(Map(nil), m...)
	for i := range out {
		if out[i][0] == k {
			out[i][1] = v
			return out
		}
	}
	return append(out, KV{k, v})
}

// Without returns a copy of m without key k.
func (m Map) Without(k string) Map {
	var out Map
	for _, e := range m {
		if e[0] != k {
			out = append(out, e)
		}
	}
	return out
}
