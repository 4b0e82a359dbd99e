package event

// Errors in wire terms. Every message is a *wire.BadRequestError built by
// bad: the hand-written types return one with a whole message (to which
// the list, the entry and the kind of event are added on the way out), or
// a *fieldError (a message about a field that msgp names); errors of msgp's
// own (types, arrays of the wrong length, negative integers, truncation,
// duplicate keys) are worded here, with msgp's path ("C/3/Count") turned
// into the wire's ("components[3]: count"). What the exported decoders
// return is invalid's *wire.BadRequestError, never a *fieldError.

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus/wire"
)

// bad is the error of msg, a complete message.
func bad(msg string) error { return &wire.BadRequestError{Msg: msg} }

// fieldError is a message about a field of an entry, which the field's wire
// name precedes (entryMessage): the type that reads the field cannot name
// it, since only the path msgp adds to the error does.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

var (
	errNotString = &fieldError{"must be a string"}
	errNotArray  = bad("entry must be an array")
	errTruncated = bad("malformed msgpack: unexpected end of data")
)

// outOfRange is the error for v in the field f.
func outOfRange(f wireField, v uint64) error {
	return bad(rangeMessage(f, strconv.FormatUint(v, 10)))
}

// rangeMessage says that got, an integer of the field f, is outside its
// range.
func rangeMessage(f wireField, got string) string {
	return f.name + " " + got + " out of range " + strconv.FormatInt(f.min, 10) + ".." + strconv.FormatInt(f.max, 10)
}

// badValue explains why b does not start with a msgpack value: it is empty
// (truncated input) or starts with 0xc1, the one byte msgpack leaves unused.
func badValue(b []byte) error {
	if len(b) == 0 {
		return msgp.ErrShortBytes
	}
	return msgp.InvalidPrefixError(b[0])
}

// malformed words an error of msgp about the bytes themselves, without the
// path msgp may have added.
func malformed(err error) error {
	if errors.Is(err, msgp.ErrShortBytes) {
		return errTruncated
	}
	msg, _ := splitPath(msgp.Cause(err).Error())
	return bad("malformed msgpack: " + strings.TrimPrefix(msg, "msgp: "))
}

// splitPath splits an error message of msgp into the message and the path
// msgp appended (" at C/3/Count"), empty when there is none.
func splitPath(s string) (msg, path string) {
	if i := strings.LastIndex(s, " at "); i >= 0 && !strings.ContainsAny(s[i+4:], ` "`) {
		return s[:i], s[i+4:]
	}
	return s, ""
}

// entryError words err, the failure of entry i of a list of kind k, as
// "name[i]: field ...".
func entryError(k *listKind, i int, err error) error {
	return bad(k.name + "[" + strconv.Itoa(i) + "]: " + entryMessage(k, err))
}

func entryMessage(k *listKind, err error) string {
	var (
		we  *wire.BadRequestError
		fe  *fieldError
		ae  msgp.ArrayError
		ube msgp.UintBelowZero
		te  msgp.TypeError
	)
	// The generated code names the field (its Go name) after " at ".
	_, path := splitPath(err.Error())
	field := k.field[path]
	switch {
	case errors.As(err, &we):
		return we.Msg
	case errors.As(err, &ae):
		return "entry must be an array of " + strconv.FormatUint(uint64(ae.Wanted), 10) + " fields, got " +
			strconv.FormatUint(uint64(ae.Got), 10)
	case field.name == "":
	case errors.As(err, &fe):
		return field.name + " " + fe.msg
	case errors.As(err, &ube):
		return rangeMessage(field, strconv.FormatInt(ube.Value, 10))
	case errors.As(err, &te) && te.Encoded != msgp.InvalidType:
		return field.name + " must be " + typeName(te.Method)
	}
	return malformed(err).Error()
}

// typeName names what a msgp decoding method reads, for "must be ...".
func typeName(t msgp.Type) string {
	switch t {
	case msgp.IntType, msgp.UintType:
		return "an integer"
	case msgp.StrType:
		return "a string"
	case msgp.BoolType:
		return "a boolean"
	case msgp.ArrayType:
		return "an array"
	case msgp.MapType:
		return "a map"
	}
	return "a " + t.String()
}

// eventMessage words err, the failure of the generated decoder of an event
// map. The path msgp adds is the Go name of a field, its key upper-cased.
func eventMessage(err error) string {
	var (
		we  *wire.BadRequestError
		te  msgp.TypeError
		ube msgp.UintBelowZero
	)
	_, path := splitPath(err.Error())
	key := strconv.Quote(strings.ToLower(path))
	switch {
	case errors.As(err, &we):
		return we.Msg
	case errors.Is(err, msgp.ErrDuplicateEntry):
		return "duplicate field " + key
	case path != "" && errors.As(err, &te) && te.Encoded != msgp.InvalidType:
		// A value the generated decoder reads itself (a policies event's
		// "g" or "s").
		return key + " must be " + typeName(te.Method)
	case path != "" && errors.As(err, &ube):
		return key + " " + strconv.FormatInt(ube.Value, 10) + " is negative"
	case errors.As(err, &te):
		// A key.
		if te.Encoded == msgp.InvalidType {
			// 0xc1 is the one byte msgpack gives no type.
			return "malformed msgpack: unrecognized type prefix 0xc1"
		}
		return "msgpack map keys must be strings"
	}
	return malformed(err).Error()
}

// quote quotes s for an error message, cutting it after 64 bytes so that a
// hostile value cannot blow up the message.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
