package wire

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tinylib/msgp/msgp"
)

// Request decoding reads the body front to back and stops at the first
// problem: an unknown key or a value of the wrong type is an error at once.
// Only a checks message reads on past a bad check, by skipping it.

// decodeCheckMsgpackGeneral decodes any msgpack check request and explains
// what is wrong with a bad one.
func decodeCheckMsgpackGeneral(body []byte, view bool) (CheckRequest, error) {
	c := BatchCheck{}
	rest, err := decodeCheckMapMsgpack(body, &c, false, "", view)
	if err != nil {
		return CheckRequest{}, err
	}
	if len(rest) != 0 {
		return CheckRequest{}, wireErrTrailing(len(rest))
	}
	return c.CheckRequest, nil
}

// decodeMsgpack reads the msgpack body of a batch or checks message into
// l. A bad check of a checks message is skipped, so a body whose check
// cannot be skipped is refused at that check's index.
func (l *checkList) decodeMsgpack(body []byte) error {
	n, b, err := msgpHeader(body, msgp.MapType, "body must be a msgpack map")
	if err != nil {
		return err
	}
	seen := false
	for range n {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return err
		}
		if string(key) != "checks" {
			return wireErrUnknownField(key)
		}
		if seen {
			return wireErrDuplicateField(key)
		}
		seen = true
		var count uint32
		if count, b, err = msgpHeader(b, msgp.ArrayType, "checks must be an array"); err != nil {
			return err
		}
		if err := l.open(uint64(count)); err != nil {
			return err
		}
		prevNS := ""
		for i := range int(count) {
			c := l.slot(i)
			c.Namespace = prevNS
			if rest, ok := fastCheckMap(b, &c.CheckRequest, &c.Namespace, l.view); ok {
				b, prevNS = rest, c.Namespace
				continue
			}
			*c = BatchCheck{}
			rest, err := decodeCheckMapMsgpack(b, c, true, prevNS, l.view)
			if err == nil {
				b, prevNS = rest, c.Namespace
				continue
			}
			if err := l.fail(i, err); err != nil {
				return err
			}
			// The check's item says why it is bad, if the body can be read
			// past it.
			if b, err = msgp.Skip(b); err != nil {
				return wireAtIndex(i, msgpMalformed(err))
			}
		}
	}
	if len(b) != 0 {
		return wireErrTrailing(len(b))
	}
	if !seen {
		return wireErrRequired("checks")
	}
	return nil
}

// decodeCheckMapMsgpack fills c from the map at the start of b, accepting
// namespace only in a batch check, validates every field and returns the
// bytes after the map. A namespace equal to prevNS reuses that string. With
// view, the identifier and the namespace alias b instead of being copied.
func decodeCheckMapMsgpack(b []byte, c *BatchCheck, batch bool, prevNS string, view bool) ([]byte, error) {
	notMap := "body must be a msgpack map"
	if batch {
		notMap = "check must be a msgpack map"
	}
	n, b, err := msgpHeader(b, msgp.MapType, notMap)
	if err != nil {
		return nil, err
	}
	var seen checkSeen
	for range n {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return nil, err
		}
		f := checkFieldOf(key, batch)
		if f == nil {
			return nil, wireErrUnknownField(key)
		}
		if err := seen.add(f, key); err != nil {
			return nil, err
		}
		if f.ints != nil {
			var v int64
			if v, b, err = msgpIntField(b, f.ints); err == nil {
				f.setInt(c, v)
			}
		} else if f.boolean {
			var v bool
			if msgp.NextType(b) != msgp.BoolType {
				if msgp.NextType(b) == msgp.InvalidType {
					return nil, msgpBadValue(b)
				}
				return nil, f.typeError()
			}
			if v, b, err = msgp.ReadBoolBytes(b); err != nil {
				return nil, msgpMalformed(err)
			}
			f.setBool(c, v)
		} else {
			var s []byte
			if s, b, err = msgpString(b, f.name); err == nil {
				err = f.setString(c, s, view, prevNS, &seen)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return b, seen.finish(c, batch)
}

// msgpHeader reads the header of a map or an array (want), failing with
// wrong when b holds another type.
func msgpHeader(b []byte, want msgp.Type, wrong string) (uint32, []byte, error) {
	switch msgp.NextType(b) {
	case want:
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	default:
		return 0, nil, wireErr(wrong)
	}
	read := msgp.ReadMapHeaderBytes
	if want == msgp.ArrayType {
		read = msgp.ReadArrayHeaderBytes
	}
	n, o, err := read(b)
	if err != nil {
		return 0, nil, msgpMalformed(err)
	}
	return n, o, nil
}

// msgpKey reads a map key, which must be a str (or a bin).
func msgpKey(b []byte) ([]byte, []byte, error) { return msgpString(b, "") }

// msgpString reads a str or bin without copying it: the value of field
// name, or a map key when name is "".
func msgpString(b []byte, name string) (v, o []byte, err error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
		v, o, err = msgp.ReadStringZC(b)
	case msgp.BinType:
		v, o, err = msgp.ReadBytesZC(b)
	case msgp.InvalidType:
		return nil, nil, msgpBadValue(b)
	default:
		if name == "" {
			return nil, nil, wireErr("msgpack map keys must be strings")
		}
		return nil, nil, wireErrNotString(name)
	}
	if err != nil {
		return nil, nil, msgpMalformed(err)
	}
	return v, o, nil
}

// msgpIntField reads an integer of any width and checks it against f.
func msgpIntField(b []byte, f *wireIntField) (int64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType, msgp.UintType:
		v, o, err := msgp.ReadInt64Bytes(b)
		over, isOver := err.(msgp.UintOverflow) // a uint above int64's range, unwrapped
		switch {
		case isOver:
			return 0, nil, f.rangeError(strconv.FormatUint(over.Value, 10))
		case err != nil:
			return 0, nil, msgpMalformed(err)
		case !f.inRange(v):
			return 0, nil, f.rangeError(strconv.FormatInt(v, 10))
		}
		return v, o, nil
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	}
	return 0, nil, f.typeError()
}

// msgpBadValue explains why b does not start with a value: it is empty
// (truncated input) or starts with the unused prefix byte 0xc1.
func msgpBadValue(b []byte) error {
	if len(b) == 0 {
		return msgpMalformed(msgp.ErrShortBytes)
	}
	return msgpMalformed(msgp.InvalidPrefixError(b[0]))
}

func msgpMalformed(err error) error {
	if errors.Is(err, msgp.ErrShortBytes) {
		return wireErrTruncated
	}
	return wireErr("malformed msgpack: " + strings.TrimPrefix(err.Error(), "msgp: "))
}

var wireErrTruncated = wireErr("malformed msgpack: unexpected end of data")

func wireErrTrailing(n int) error {
	return wireErr("malformed msgpack: " + strconv.Itoa(n) + " trailing bytes after the map")
}

// Client-side decoders, generated from the In shapes in msg.go: unknown keys
// are skipped, a repeated key is an error, and these check that every key
// is present and nothing follows the map.

var checkResponseKeys = []string{"success", "limit", "remaining", "reset", "retry_after"}

func decodeCheckResponseMsgpack(body []byte) (CheckResponse, error) {
	r, rest, err := checkResponseMsgpack(body)
	if err != nil {
		return CheckResponse{}, err
	}
	if len(rest) != 0 {
		return CheckResponse{}, wireErrTrailing(len(rest))
	}
	return r, nil
}

func checkResponseMsgpack(b []byte) (CheckResponse, []byte, error) {
	var in checkResponseIn
	rest, err := in.UnmarshalMsg(b)
	if err != nil {
		return CheckResponse{}, nil, msgpResponseError(err)
	}
	if err := errMissing(checkResponseKeys, in.Success.ok, in.Limit.ok, in.Remaining.ok, in.Reset.ok, in.RetryAfter.ok); err != nil {
		return CheckResponse{}, nil, err
	}
	return CheckResponse{Success: in.Success.v, Limit: in.Limit.v, Remaining: in.Remaining.v, Reset: in.Reset.v, RetryAfter: in.RetryAfter.v,
		ShadowDenied: in.ShadowDenied.v, Override: string(in.Override)}, rest, nil
}

func decodeBatchResponseMsgpack(body []byte) (BatchResponse, error) {
	var head batchResponseHeadIn
	rest, err := head.UnmarshalMsg(body)
	if err != nil {
		return BatchResponse{}, msgpResponseError(err)
	}
	if len(rest) != 0 {
		return BatchResponse{}, wireErrTrailing(len(rest))
	}
	if err := errMissing([]string{"success", "results"}, head.Success.ok, head.Results != nil); err != nil {
		return BatchResponse{}, err
	}
	results, _, err := msgpResults(head.Results, checkResponseMsgpack)
	if err != nil {
		return BatchResponse{}, err
	}
	return BatchResponse{Success: head.Success.v, Results: results}, nil
}

// msgpResults reads the array of results at the start of b, each by read,
// and returns the bytes after it.
func msgpResults[T any](b []byte, read func([]byte) (T, []byte, error)) ([]T, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, errors.New("results must be an array")
	}
	// Each result takes at least one byte: never trust n beyond len(b).
	results := make([]T, 0, min(int(n), len(b)))
	for i := range int(n) {
		var r T
		if r, b, err = read(b); err != nil {
			return nil, nil, errAtResult(i, err)
		}
		results = append(results, r)
	}
	return results, b, nil
}

// errAtResult prefixes an error about results[i] of a response with its
// position.
func errAtResult(i int, err error) error {
	return errors.New("results[" + strconv.Itoa(i) + "]: " + err.Error())
}

func decodeErrorMsgpack(body []byte) (string, error) {
	var in errorIn
	rest, err := in.UnmarshalMsg(body)
	if err != nil {
		return "", msgpResponseError(err)
	}
	if len(rest) != 0 {
		return "", wireErrTrailing(len(rest))
	}
	if !in.Error.ok {
		return "", errors.New("error is required")
	}
	return in.Error.v, nil
}

// msgpResponseError describes a generated decoder's error without msgp's
// prefix.
func msgpResponseError(err error) error {
	if errors.Is(err, msgp.ErrShortBytes) {
		return errors.New("malformed msgpack: unexpected end of data")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "msgp: "))
}
