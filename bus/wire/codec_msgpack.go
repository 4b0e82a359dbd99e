package wire

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
)

// Request decoding reads the body front to back and stops at the first
// problem, so it never has to skip (or recurse into) a value it does not
// want: an unknown key or a value of the wrong type is an error at once.

// decodeCheckMsgpack decodes a msgpack check request into c: the fast path
// for the usual shape, else the general decoder, which explains what is
// wrong. c is undefined after an error.
func decodeCheckMsgpack(body []byte, view bool, c *CheckRequest) (err error) {
	if fastCheckMsgpack(body, view, c) {
		return nil
	}
	*c, err = decodeCheckMsgpackGeneral(body, view)
	return err
}

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

func decodeBatchMsgpack(body []byte) (BatchRequest, error) {
	n, b, err := msgpMapHeader(body, "body must be a msgpack map")
	if err != nil {
		return BatchRequest{}, err
	}
	var req BatchRequest
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return BatchRequest{}, err
		}
		if string(key) != "checks" {
			return BatchRequest{}, wireErrUnknownField(key)
		}
		if req.Checks != nil {
			return BatchRequest{}, wireErrDuplicateField(key)
		}
		switch msgp.NextType(b) {
		case msgp.ArrayType:
		case msgp.InvalidType:
			return BatchRequest{}, msgpBadValue(b)
		default:
			return BatchRequest{}, wireErr("checks must be an array")
		}
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return BatchRequest{}, msgpMalformed(err)
		}
		if count == 0 || count > MaxBatchChecks {
			return BatchRequest{}, wireErrBatchCount(uint64(count))
		}
		req.Checks = make([]BatchCheck, count)
		prevNS := ""
		for j := range req.Checks {
			if b, err = decodeCheckMapMsgpack(b, &req.Checks[j], true, prevNS, false); err != nil {
				return BatchRequest{}, wireAtIndex(j, err)
			}
			prevNS = req.Checks[j].Namespace
		}
	}
	if len(b) != 0 {
		return BatchRequest{}, wireErrTrailing(len(b))
	}
	if req.Checks == nil {
		return BatchRequest{}, wireErrRequired("checks")
	}
	return req, nil
}

// decodeCheckMapMsgpack fills c from the map at the start of b, accepting
// namespace only in a batch check, validates every field and returns the
// bytes after the map. A namespace equal to prevNS reuses that string. With
// view, the identifier aliases b instead of being copied.
func decodeCheckMapMsgpack(b []byte, c *BatchCheck, batch bool, prevNS string, view bool) ([]byte, error) {
	notMap := "body must be a msgpack map"
	if batch {
		notMap = "check must be a msgpack map"
	}
	n, b, err := msgpMapHeader(b, notMap)
	if err != nil {
		return nil, err
	}
	var seen uint8
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return nil, err
		}
		bit := wireCheckFieldBit(key, batch)
		if bit == 0 {
			return nil, wireErrUnknownField(key)
		}
		if seen&bit != 0 {
			return nil, wireErrDuplicateField(key)
		}
		seen |= bit
		switch bit {
		case ckNamespace:
			var s []byte
			if s, b, err = msgpString(b, "namespace"); err != nil {
				return nil, err
			}
			if !wireValidToken(s) {
				return nil, wireErrNamespace
			}
			c.Namespace = wireInternNS(s, prevNS)
		case ckIdentifier:
			var s []byte
			if s, b, err = msgpString(b, "identifier"); err != nil {
				return nil, err
			}
			if len(s) == 0 || len(s) > MaxIdentifierLen {
				return nil, wireErrIdentifierLen(len(s))
			}
			if view {
				c.Identifier = unsafe.String(unsafe.SliceData(s), len(s))
			} else {
				c.Identifier = string(s)
			}
		case ckLimit:
			c.Limit, b, err = msgpIntField(b, &wireLimitField)
		case ckDuration:
			c.Duration, b, err = msgpIntField(b, &wireDurationField)
		case ckCost:
			c.Cost, b, err = msgpIntField(b, &wireCostField)
		}
		if err != nil {
			return nil, err
		}
	}
	return b, wireFinishCheck(c, seen, batch)
}

// msgpMapHeader reads a map header, failing with notMap when b holds another
// type.
func msgpMapHeader(b []byte, notMap string) (uint32, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.MapType:
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	default:
		return 0, nil, wireErr(notMap)
	}
	n, o, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return 0, nil, msgpMalformed(err)
	}
	return n, o, nil
}

// msgpKey reads a map key, which must be a str (or a bin).
func msgpKey(b []byte) ([]byte, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.StrType, msgp.BinType:
	case msgp.InvalidType:
		return nil, nil, msgpBadValue(b)
	default:
		return nil, nil, wireErr("msgpack map keys must be strings")
	}
	k, o, err := msgp.ReadMapKeyZC(b)
	if err != nil {
		return nil, nil, msgpMalformed(err)
	}
	return k, o, nil
}

// msgpString reads a str or bin value without copying it.
func msgpString(b []byte, name string) (v, o []byte, err error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
		v, o, err = msgp.ReadStringZC(b)
	case msgp.BinType:
		v, o, err = msgp.ReadBytesZC(b)
	case msgp.InvalidType:
		return nil, nil, msgpBadValue(b)
	default:
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
	case msgp.IntType:
		v, o, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		if !f.inRange(v) {
			return 0, nil, f.rangeError(strconv.FormatInt(v, 10))
		}
		return v, o, nil
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		if u > uint64(f.max) || int64(u) < f.min {
			return 0, nil, f.rangeError(strconv.FormatUint(u, 10))
		}
		return int64(u), o, nil
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	}
	return 0, nil, f.typeError()
}

// msgpInt64 reads an integer of any width and sign that fits int64.
func msgpInt64(b []byte, name string) (int64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType:
		v, o, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		return v, o, nil
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, nil, msgpMalformed(err)
		}
		if u > math.MaxInt64 {
			return 0, nil, wireErr(name + " does not fit in 64 bits, got " + strconv.FormatUint(u, 10))
		}
		return int64(u), o, nil
	case msgp.InvalidType:
		return 0, nil, msgpBadValue(b)
	}
	return 0, nil, wireErr(name + " must be an integer")
}

func msgpBool(b []byte, name string) (bool, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.BoolType:
		v, o, err := msgp.ReadBoolBytes(b)
		if err != nil {
			return false, nil, msgpMalformed(err)
		}
		return v, o, nil
	case msgp.InvalidType:
		return false, nil, msgpBadValue(b)
	}
	return false, nil, wireErr(name + " must be a boolean")
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

// Encoders.

// The check response's keys, each with its fixstr prefix, and the map
// header in front of the first: the reply is written with a few appends of
// constants, as the check endpoint writes one per request.
const (
	mpCheckRespHead = "\x85\xa7success"
	mpKeyLimit      = "\xa5limit"
	mpKeyRemaining  = "\xa9remaining"
	mpKeyReset      = "\xa5reset"
	mpKeyRetryAfter = "\xabretry_after"
	mpTrue, mpFalse = 0xc3, 0xc2
)

func appendCheckResponseMsgpack(dst []byte, r CheckResponse) []byte {
	dst = append(dst, mpCheckRespHead...)
	if r.Success {
		dst = append(dst, mpTrue)
	} else {
		dst = append(dst, mpFalse)
	}
	dst = append(dst, mpKeyLimit...)
	dst = msgp.AppendInt64(dst, r.Limit)
	dst = append(dst, mpKeyRemaining...)
	dst = msgp.AppendInt64(dst, r.Remaining)
	dst = append(dst, mpKeyReset...)
	dst = msgp.AppendInt64(dst, r.Reset)
	dst = append(dst, mpKeyRetryAfter...)
	return msgp.AppendInt64(dst, r.RetryAfter)
}

func appendBatchResponseMsgpack(dst []byte, r BatchResponse) []byte {
	dst = msgp.AppendMapHeader(dst, 2)
	dst = msgp.AppendString(dst, "success")
	dst = msgp.AppendBool(dst, r.Success)
	dst = msgp.AppendString(dst, "results")
	dst = msgp.AppendArrayHeader(dst, uint32(len(r.Results)))
	for _, res := range r.Results {
		dst = appendCheckResponseMsgpack(dst, res)
	}
	return dst
}

func appendErrorMsgpack(dst []byte, msg string) []byte {
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "error")
	return msgp.AppendString(dst, msg)
}

// appendCheckFieldsMsgpack appends the four check keys and values, without a
// map header.
func appendCheckFieldsMsgpack(dst []byte, r *CheckRequest) []byte {
	dst = msgp.AppendString(dst, "identifier")
	dst = msgp.AppendString(dst, r.Identifier)
	dst = msgp.AppendString(dst, "limit")
	dst = msgp.AppendInt64(dst, r.Limit)
	dst = msgp.AppendString(dst, "duration")
	dst = msgp.AppendInt64(dst, r.Duration)
	dst = msgp.AppendString(dst, "cost")
	return msgp.AppendInt64(dst, r.Cost)
}

func appendCheckRequestMsgpack(dst []byte, r CheckRequest) []byte {
	dst = msgp.AppendMapHeader(dst, 4)
	return appendCheckFieldsMsgpack(dst, &r)
}

func appendBatchRequestMsgpack(dst []byte, r BatchRequest) []byte {
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "checks")
	dst = msgp.AppendArrayHeader(dst, uint32(len(r.Checks)))
	for i := range r.Checks {
		c := &r.Checks[i]
		dst = msgp.AppendMapHeader(dst, 5)
		dst = msgp.AppendString(dst, "namespace")
		dst = msgp.AppendString(dst, c.Namespace)
		dst = appendCheckFieldsMsgpack(dst, &c.CheckRequest)
	}
	return dst
}

// Client-side decoders. Unknown keys are skipped, so these use msgp.Skip.

func decodeCheckResponseMsgpack(body []byte) (CheckResponse, error) {
	r, rest, err := checkResponseMapMsgpack(body, "body must be a msgpack map")
	if err != nil {
		return CheckResponse{}, err
	}
	if len(rest) != 0 {
		return CheckResponse{}, wireErrTrailing(len(rest))
	}
	return r, nil
}

func checkResponseMapMsgpack(b []byte, notMap string) (CheckResponse, []byte, error) {
	n, b, err := msgpMapHeader(b, notMap)
	if err != nil {
		return CheckResponse{}, nil, err
	}
	var (
		r    CheckResponse
		seen uint8
	)
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return CheckResponse{}, nil, err
		}
		bit := wireResponseFieldBit(key)
		if bit != 0 && seen&bit != 0 {
			return CheckResponse{}, nil, wireErrDuplicateField(key)
		}
		seen |= bit
		switch bit {
		case 0:
			b, err = msgpSkip(b)
		case rsSuccess:
			r.Success, b, err = msgpBool(b, "success")
		case rsLimit:
			r.Limit, b, err = msgpInt64(b, "limit")
		case rsRemaining:
			r.Remaining, b, err = msgpInt64(b, "remaining")
		case rsReset:
			r.Reset, b, err = msgpInt64(b, "reset")
		case rsRetryAfter:
			r.RetryAfter, b, err = msgpInt64(b, "retry_after")
		}
		if err != nil {
			return CheckResponse{}, nil, err
		}
	}
	if seen != rsAll {
		return CheckResponse{}, nil, wireErrMissingResponseField(seen)
	}
	return r, b, nil
}

func decodeBatchResponseMsgpack(body []byte) (BatchResponse, error) {
	n, b, err := msgpMapHeader(body, "body must be a msgpack map")
	if err != nil {
		return BatchResponse{}, err
	}
	var (
		r    BatchResponse
		seen uint8
	)
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return BatchResponse{}, err
		}
		var bit uint8
		switch string(key) {
		case "success":
			bit = 1
		case "results":
			bit = 2
		}
		if bit != 0 && seen&bit != 0 {
			return BatchResponse{}, wireErrDuplicateField(key)
		}
		seen |= bit
		switch bit {
		case 0:
			b, err = msgpSkip(b)
		case 1:
			r.Success, b, err = msgpBool(b, "success")
		case 2:
			r.Results, b, err = checkResponsesMsgpack(b)
		}
		if err != nil {
			return BatchResponse{}, err
		}
	}
	if len(b) != 0 {
		return BatchResponse{}, wireErrTrailing(len(b))
	}
	if seen&1 == 0 {
		return BatchResponse{}, wireErrRequired("success")
	}
	if seen&2 == 0 {
		return BatchResponse{}, wireErrRequired("results")
	}
	return r, nil
}

func checkResponsesMsgpack(b []byte) ([]CheckResponse, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
	case msgp.InvalidType:
		return nil, nil, msgpBadValue(b)
	default:
		return nil, nil, wireErr("results must be an array")
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, msgpMalformed(err)
	}
	// Each result takes at least one byte: never trust n beyond len(b).
	results := make([]CheckResponse, 0, min(int(n), len(b)))
	for i := uint32(0); i < n; i++ {
		var res CheckResponse
		if res, b, err = checkResponseMapMsgpack(b, "result must be a msgpack map"); err != nil {
			return nil, nil, wireErr("results[" + strconv.FormatUint(uint64(i), 10) + "]: " + err.Error())
		}
		results = append(results, res)
	}
	return results, b, nil
}

func decodeErrorMsgpack(body []byte) (string, error) {
	n, b, err := msgpMapHeader(body, "body must be a msgpack map")
	if err != nil {
		return "", err
	}
	var (
		msg  string
		seen bool
	)
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return "", err
		}
		if string(key) != "error" {
			if b, err = msgpSkip(b); err != nil {
				return "", err
			}
			continue
		}
		if seen {
			return "", wireErrDuplicateField(key)
		}
		seen = true
		var s []byte
		if s, b, err = msgpString(b, "error"); err != nil {
			return "", err
		}
		msg = string(s)
	}
	if len(b) != 0 {
		return "", wireErrTrailing(len(b))
	}
	if !seen {
		return "", wireErrRequired("error")
	}
	return msg, nil
}

func msgpSkip(b []byte) ([]byte, error) {
	o, err := msgp.Skip(b)
	if err != nil {
		return nil, msgpMalformed(err)
	}
	return o, nil
}
