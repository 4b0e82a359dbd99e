package wire

import (
	"errors"

	"github.com/tinylib/msgp/msgp"
)

// gotBool, gotInt and gotString are values that remember whether a decoder
// set them: the msgp shims in msg.go decode into them through markBool,
// markInt and markString.
type (
	gotBool struct {
		v  bool
		ok bool
	}
	gotInt struct {
		v  int64
		ok bool
	}
	gotString struct {
		v  string
		ok bool
	}
)

func (g gotBool) value() bool       { return g.v }
func (g gotInt) value() int64       { return g.v }
func (g gotString) value() string   { return g.v }
func markBool(v bool) gotBool       { return gotBool{v, true} }
func markInt(v int64) gotInt        { return gotInt{v, true} }
func markString(v string) gotString { return gotString{v, true} }

// rawValue is one msgpack value kept undecoded: a view of the decoder's
// input, valid while it is. nil means the key was absent.
type rawValue []byte

// UnmarshalMsg implements msgp.Unmarshaler: it keeps the next value of b
// without copying it.
func (r *rawValue) UnmarshalMsg(b []byte) ([]byte, error) {
	rest, err := msgp.Skip(b)
	if err != nil {
		return b, err
	}
	*r = b[: len(b)-len(rest) : len(b)-len(rest)]
	return rest, nil
}

// strOrBin is a string the client reads from a msgpack str or bin, as the
// limiter reads identifiers (a bin carries bytes that are not UTF-8 as
// they are).
type strOrBin string

// UnmarshalMsg implements msgp.Unmarshaler: it reads a str or a bin.
func (s *strOrBin) UnmarshalMsg(b []byte) ([]byte, error) {
	if msgp.NextType(b) == msgp.BinType {
		v, rest, err := msgp.ReadBytesZC(b)
		if err != nil {
			return b, err
		}
		*s = strOrBin(v)
		return rest, nil
	}
	v, rest, err := msgp.ReadStringBytes(b)
	if err != nil {
		return b, err
	}
	*s = strOrBin(v)
	return rest, nil
}

// errMissing reports the first key of names whose present flag is false.
func errMissing(names []string, present ...bool) error {
	for i, ok := range present {
		if !ok {
			return errors.New(names[i] + " is required")
		}
	}
	return nil
}
