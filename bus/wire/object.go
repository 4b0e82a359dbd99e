package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// The strict object decoder over a field table: the one decoder of bodies
// that are a single flat object of scalar fields, or lists of values left
// to a decoder of their own (the admin endpoints' bodies and replies,
// package policy/adminwire). A table says which keys an
// object has, which are required, and what type each value is; the decoder
// reads the body in its encoding and stores each value where its field
// says. What a value must be beyond its type (an integer's range, a
// pattern's syntax) is the caller's to check once DecodeObject has
// returned, so that a body is refused first for its shape and only then
// for its values. The check, batch and checks bodies keep their own
// table (fields.go), whose messages are the check contract's.

// FieldKind is the type of a Field's value.
type FieldKind uint8

// The kinds of field.
const (
	// FieldToken is a string satisfying ValidToken: a JSON string or a
	// msgpack str (not bin). It is stored in Field.Str.
	FieldToken FieldKind = iota + 1
	// FieldBytes is any bytes of at most Field.MaxLen: a JSON string or a
	// msgpack str or bin. It is stored in Field.Str.
	FieldBytes
	// FieldString is a string of at most Field.MaxLen bytes: a JSON string
	// or a msgpack str (not bin). It is stored in Field.Str.
	FieldString
	// FieldInt is an integer that fits int64: a JSON number without a
	// fraction or an exponent, or a msgpack int or uint (not a float). It
	// is stored in Field.Int.
	FieldInt
	// FieldBool is true or false. It is stored in Field.Bool.
	FieldBool
	// FieldList is an array of any values, each kept undecoded (a copy of
	// its JSON text or msgpack bytes) for a decoder of its own. It is
	// stored in Field.List.
	FieldList
)

// Field describes one key of an object and where its value goes. The
// destination of the field's kind (Str, Int or Bool) must not be nil.
type Field struct {
	// Name is the key.
	Name string
	// Kind is the type of the value.
	Kind FieldKind
	// Required: an object without the key is refused.
	Required bool
	// MaxLen is the most bytes a FieldBytes or FieldString value holds.
	MaxLen int
	// LongHint ends the error for a value longer than MaxLen, telling the
	// client what to send instead (": pass ... as it is"); it may be "".
	LongHint string
	// Str, Int, Bool and List receive the value, by Kind.
	Str  *string
	Int  *int64
	Bool *bool
	List *[][]byte
}

// MaxObjectFields is the most fields a table given to DecodeObject holds.
const MaxObjectFields = 64

// Present records which fields of a table an object held: bit i for the
// table's field i.
type Present uint64

// Has reports whether the object held the table's field i.
func (p Present) Has(i int) bool { return i >= 0 && i < MaxObjectFields && p&(1<<uint(i)) != 0 }

// DecodeObject decodes body, one object in enc, into the destinations of
// fields and returns which fields it held. It guarantees that on success
// the body was exactly one JSON object or msgpack map (nothing after it)
// whose keys are names of fields, each at most once, holding every
// required field, each value of its field's kind (integers only: a
// fraction, an exponent, a float or an integer beyond int64 is refused;
// null is a value of the wrong type); strings are copied, never aliasing
// body. A JSON body must be valid UTF-8 as a whole.
//
// Any other body is refused with a *BadRequestError saying what to fix,
// the first problem met reading the body front to back; a missing field is
// reported after the whole body was read, the first in the table's order.
// Destinations may then hold part of the values. An encoding other than
// JSON and Msgpack is refused too. DecodeObject never panics on any body;
// a table of more than MaxObjectFields fields is refused with a plain
// error.
func DecodeObject(body []byte, enc Encoding, fields []Field) (Present, error) {
	if len(fields) > MaxObjectFields {
		return 0, errors.New("wire: a field table of " + strconv.Itoa(len(fields)) + " fields, more than " + strconv.Itoa(MaxObjectFields))
	}
	o := object{fields: fields}
	var err error
	switch enc {
	case JSON:
		err = o.decodeJSON(body)
	case Msgpack:
		err = o.decodeMsgpack(body)
	default:
		err = wireErr(fmt.Sprintf("unknown encoding %d", enc))
	}
	if err != nil {
		return o.seen, err
	}
	for i := range fields {
		if fields[i].Required && !o.seen.Has(i) {
			return o.seen, wireErr(fmt.Sprintf("missing field %q", fields[i].Name))
		}
	}
	return o.seen, nil
}

// object is one decoding of a table: the fields and those read so far.
type object struct {
	fields []Field
	seen   Present
}

// lookup returns the field named key, or an error for an unknown or
// duplicate one.
func (o *object) lookup(key []byte) (*Field, error) {
	for i := range o.fields {
		if o.fields[i].Name == string(key) {
			if o.seen.Has(i) {
				return nil, wireErr(fmt.Sprintf("duplicate field %q", key))
			}
			o.seen |= 1 << uint(i)
			return &o.fields[i], nil
		}
	}
	return nil, wireErr(fmt.Sprintf("unknown field %q", cutQuoted(key)))
}

// cutQuoted shortens a key or value for an error message, so that a
// hostile one cannot blow up the reply.
func cutQuoted(k []byte) string {
	if len(k) > 64 {
		return string(k[:64]) + "…"
	}
	return string(k)
}

// isString reports whether f takes a string value.
func (f *Field) isString() bool {
	return f.Kind == FieldToken || f.Kind == FieldBytes || f.Kind == FieldString
}

// setString stores a copy of s in f after checking it against f's kind.
func (f *Field) setString(s []byte) error {
	switch f.Kind {
	case FieldToken:
		if !window.ValidToken(s) {
			return wireErr(fmt.Sprintf("%s %q is not %s", f.Name, cutQuoted(s), window.TokenRule))
		}
	default:
		if len(s) > f.MaxLen {
			return wireErr(fmt.Sprintf("%s of %d bytes is longer than %d%s", f.Name, len(s), f.MaxLen, f.LongHint))
		}
	}
	*f.Str = string(s)
	return nil
}

// typeError is the error for a value of the wrong type.
func (f *Field) typeError() error {
	switch f.Kind {
	case FieldInt:
		return wireErr(f.Name + " must be an integer")
	case FieldBool:
		return wireErr(f.Name + " must be true or false")
	case FieldList:
		return wireErr(f.Name + " must be an array")
	}
	return wireErr(f.Name + " must be a string")
}

// decodeJSON decodes one JSON object of scalar fields.
func (o *object) decodeJSON(body []byte) error {
	if !utf8.Valid(body) {
		return wireErr("JSON body is not valid UTF-8 (send identifiers of other bytes in msgpack)")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return objectJSONError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return wireErr("body must be a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return objectJSONError(err)
		}
		key, _ := tok.(string) // object keys are always strings
		f, err := o.lookup([]byte(key))
		if err != nil {
			return err
		}
		if tok, err = dec.Token(); err != nil {
			return objectJSONError(err)
		}
		if d, ok := tok.(json.Delim); ok && d == '[' && f.Kind == FieldList {
			if err := f.readJSONList(dec); err != nil {
				return err
			}
			continue
		}
		switch v := tok.(type) {
		case string:
			if !f.isString() {
				return f.typeError()
			}
			if err := f.setString([]byte(v)); err != nil {
				return err
			}
		case json.Number:
			if f.Kind != FieldInt || strings.ContainsAny(string(v), ".eE") {
				return f.typeError()
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return wireErr(fmt.Sprintf("%s %s is out of range", f.Name, v))
			}
			*f.Int = n
		case bool:
			if f.Kind != FieldBool {
				return f.typeError()
			}
			*f.Bool = v
		default: // null, or an object or array
			return f.typeError()
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return objectJSONError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return wireErr("trailing bytes after the JSON object")
	}
	return nil
}

// readJSONList reads the values of the list f after its '[' and the ']'.
func (f *Field) readJSONList(dec *json.Decoder) error {
	for dec.More() {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return objectJSONError(err)
		}
		*f.List = append(*f.List, v)
	}
	if _, err := dec.Token(); err != nil {
		return objectJSONError(err)
	}
	return nil
}

// objectJSONError describes an error of encoding/json's tokenizer.
func objectJSONError(err error) error {
	if errors.Is(err, io.EOF) {
		return wireErr("malformed JSON: unexpected end of body")
	}
	return wireErr("malformed JSON: " + err.Error())
}

// decodeMsgpack decodes one msgpack map of scalar fields.
func (o *object) decodeMsgpack(b []byte) error {
	if msgp.NextType(b) != msgp.MapType {
		return wireErr("body must be a msgpack map")
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return objectMsgpackError(err)
	}
	// More keys than fields: one is unknown or a duplicate, found by the
	// time one more key than the table holds is read.
	n = min(n, uint32(len(o.fields)+1))
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return objectMsgpackError(err)
		}
		f, err := o.lookup(key)
		if err != nil {
			return err
		}
		if b, err = f.readMsgpack(b); err != nil {
			return err
		}
	}
	if len(b) != 0 {
		return wireErr(fmt.Sprintf("%d trailing bytes after the msgpack map", len(b)))
	}
	return nil
}

// readMsgpack reads the value of f at the start of b, stores it and
// returns the bytes after it.
func (f *Field) readMsgpack(b []byte) ([]byte, error) {
	var err error
	switch t := msgp.NextType(b); {
	case t == msgp.StrType && f.isString(), t == msgp.BinType && f.Kind == FieldBytes:
		var s []byte
		if t == msgp.StrType {
			s, b, err = msgp.ReadStringZC(b)
		} else {
			s, b, err = msgp.ReadBytesZC(b)
		}
		if err != nil {
			return nil, objectMsgpackError(err)
		}
		return b, f.setString(s)
	case (t == msgp.IntType || t == msgp.UintType) && f.Kind == FieldInt:
		if *f.Int, b, err = msgp.ReadInt64Bytes(b); err != nil {
			var ie msgp.UintOverflow
			if errors.As(err, &ie) {
				return nil, wireErr(fmt.Sprintf("%s %d is out of range", f.Name, ie.Value))
			}
			return nil, objectMsgpackError(err)
		}
		return b, nil
	case t == msgp.ArrayType && f.Kind == FieldList:
		n, b, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, objectMsgpackError(err)
		}
		// Each value takes a byte at least: never trust n beyond len(b).
		*f.List = make([][]byte, 0, min(int(n), len(b)))
		for range n {
			rest, err := msgp.Skip(b)
			if err != nil {
				return nil, objectMsgpackError(err)
			}
			*f.List = append(*f.List, bytes.Clone(b[:len(b)-len(rest)]))
			b = rest
		}
		return b, nil
	case t == msgp.BoolType && f.Kind == FieldBool:
		if *f.Bool, b, err = msgp.ReadBoolBytes(b); err != nil {
			return nil, objectMsgpackError(err)
		}
		return b, nil
	}
	return nil, f.typeError()
}

// objectMsgpackError describes an error of the msgp reader, in its words.
func objectMsgpackError(err error) error {
	return wireErr("malformed msgpack: " + err.Error())
}
