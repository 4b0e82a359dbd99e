package wire

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// BadRequestError is an error in a client's input: a body or header that
// breaks the wire contract. Msg says what the client must fix and is meant to
// be sent back verbatim in an error body (see AppendError). Every error
// returned by DetectEncoding, DecodeCheckRequest and DecodeBatchRequest is a
// *BadRequestError; use errors.As to tell them from other failures.
type BadRequestError struct {
	Msg string
}

// Error returns Msg.
func (e *BadRequestError) Error() string { return e.Msg }

func wireErr(msg string) error { return &BadRequestError{Msg: msg} }

// DetectEncoding chooses the encoding of a request from its NATS Content-Type
// header and its body. The media type is compared case-insensitively and its
// parameters (such as "; charset=utf-8") are ignored:
//
//   - application/json is JSON;
//   - application/msgpack, application/x-msgpack and application/vnd.msgpack
//     are Msgpack;
//   - an empty (or blank) header means JSON when the first byte of body that
//     is not JSON whitespace is '{', and Msgpack otherwise (including an empty
//     body);
//   - any other header is a *BadRequestError.
//
// DetectEncoding does not allocate unless it fails.
func DetectEncoding(contentType string, body []byte) (Encoding, error) {
	mt := contentType
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.TrimSpace(mt)
	switch {
	case mt == "":
		if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '{' {
			return JSON, nil
		}
		return Msgpack, nil
	case strings.EqualFold(mt, "application/json"):
		return JSON, nil
	case strings.EqualFold(mt, "application/msgpack"),
		strings.EqualFold(mt, "application/x-msgpack"),
		strings.EqualFold(mt, "application/vnd.msgpack"):
		return Msgpack, nil
	}
	return Msgpack, wireErr("unsupported Content-Type " + wireQuote(strings.TrimSpace(contentType)) +
		": use application/json or application/msgpack")
}

// DecodeCheckRequest decodes and validates a single check request body in
// encoding enc (any value other than JSON is treated as Msgpack). On success
// the request satisfies every rule of the contract and Cost is 1 when the body
// did not carry it. The result does not alias body. Every error is a
// *BadRequestError whose message tells the client what to fix.
//
// The only allocation on success is the Identifier string.
func DecodeCheckRequest(enc Encoding, body []byte) (CheckRequest, error) {
	var c CheckRequest
	err := decodeCheck(enc, body, false, &c)
	return c, err
}

// DecodeCheckRequestView is DecodeCheckRequest for the limiter's hot path:
// a msgpack identifier aliases body rather than being copied, so the result
// is valid only while body is neither modified nor reused. nats.go gives
// every message its own payload, so a handler may use it for the message's
// lifetime. It decodes into c, which is undefined after an error.
func DecodeCheckRequestView(enc Encoding, body []byte, c *CheckRequest) (err error) {
	return decodeCheck(enc, body, true, c)
}

// decodeCheck decodes a single check request into c (after an error,
// unchanged or zero): in msgpack by the fast path for the usual shape, else
// by the general decoder, which explains what is wrong.
func decodeCheck(enc Encoding, body []byte, view bool, c *CheckRequest) (err error) {
	if err := wireCheckBodySize(body, MaxCheckBody); err != nil {
		return err
	}
	switch {
	case enc == JSON:
		*c, err = decodeCheckJSON(body)
	case !fastCheckMsgpack(body, view, c):
		*c, err = decodeCheckMsgpackGeneral(body, view)
	}
	return err
}

// DecodeBatchRequest decodes and validates a batch request body in encoding
// enc (any value other than JSON is treated as Msgpack). On success the
// request holds 1 to MaxBatchChecks checks, each satisfying every rule of the
// contract (namespace included), with Cost 1 where the body did not carry it.
// The result does not alias body. Every error is a *BadRequestError; errors
// about one check are prefixed with its index, as in "checks[3]: ...".
func DecodeBatchRequest(enc Encoding, body []byte) (BatchRequest, error) {
	l := checkList{max: MaxBatchChecks}
	if err := l.decode(enc, body, MaxBatchBody); err != nil {
		return BatchRequest{}, err
	}
	return BatchRequest{Checks: l.batch}, nil
}

// AppendCheckResponse appends r encoded in enc (any value other than JSON is
// treated as Msgpack) to dst and returns the extended buffer. Keys are
// written in the order success, limit, remaining, reset, retry_after, then
// shadow_denied only when true and override only when not empty, so a reply
// with neither has the contract's five keys and nothing else. It allocates
// only when dst lacks capacity.
func AppendCheckResponse(dst []byte, enc Encoding, r CheckResponse) []byte {
	// The contract's five keys in a straight line an encoding: this runs
	// once per check (BenchmarkAppendCheckResponse).
	if enc == JSON {
		dst = strconv.AppendBool(append(dst, `{"success":`...), r.Success)
		dst = strconv.AppendInt(append(dst, jsLimit...), r.Limit, 10)
		dst = strconv.AppendInt(append(dst, jsRemaining...), r.Remaining, 10)
		dst = strconv.AppendInt(append(dst, jsReset...), r.Reset, 10)
		dst = strconv.AppendInt(append(dst, jsRetryAfter...), r.RetryAfter, 10)
	} else {
		dst = append(dst, 0x85+byte(b2i(r.ShadowDenied)+b2i(r.Override != "")))
		dst = msgp.AppendBool(append(dst, mpSuccess...), r.Success)
		dst = msgp.AppendInt64(append(dst, mpLimit...), r.Limit)
		dst = msgp.AppendInt64(append(dst, mpRemaining...), r.Remaining)
		dst = msgp.AppendInt64(append(dst, mpReset...), r.Reset)
		dst = msgp.AppendInt64(append(dst, mpRetryAfter...), r.RetryAfter)
	}
	if r.ShadowDenied {
		dst = enc.appendBool(enc.appendKey(dst, mpShadowDenied, jsShadowDenied), true)
	}
	if r.Override != "" {
		dst = enc.appendString(enc.appendKey(dst, mpOverride, jsOverride), r.Override)
	}
	return enc.appendClose(dst)
}

// AppendBatchResponse appends r encoded in enc (any value other than JSON is
// treated as Msgpack) to dst and returns the extended buffer: an object with
// success and results, each result written as by AppendCheckResponse. A nil
// Results is written as an empty array. It allocates only when dst lacks
// capacity.
func AppendBatchResponse(dst []byte, enc Encoding, r BatchResponse) []byte {
	dst = enc.appendBool(enc.appendOpen(dst, 2, mpSuccess, jsSuccess), r.Success)
	return enc.appendClose(appendResults(enc.appendKey(dst, mpResults, jsResults), enc, r.Results, AppendCheckResponse))
}

// appendResults appends rs, the array of a batch or checks response, each
// result by item.
func appendResults[T any](dst []byte, enc Encoding, rs []T, item func([]byte, Encoding, T) []byte) []byte {
	if enc != JSON {
		dst = msgp.AppendArrayHeader(dst, uint32(len(rs)))
	} else {
		dst = append(dst, '[')
	}
	for i, r := range rs {
		if enc == JSON && i > 0 {
			dst = append(dst, ',')
		}
		dst = item(dst, enc, r)
	}
	if enc == JSON {
		dst = append(dst, ']')
	}
	return dst
}

// AppendError appends the error body {"error": msg} encoded in enc (any value
// other than JSON is treated as Msgpack) to dst and returns the extended
// buffer. The JSON form is valid JSON for any msg: control characters are
// escaped and each byte of invalid UTF-8 becomes U+FFFD. It allocates only
// when dst lacks capacity.
func AppendError(dst []byte, enc Encoding, msg string) []byte {
	return enc.appendClose(enc.appendString(enc.appendOpen(dst, 1, mpError, jsError), msg))
}

// The limiter's responses are written key by key, each key from constant
// bytes and each value as its encoding writes it: a msgpack map, or a JSON
// object (no white space, strings by appendJSONString).

// The keys of the responses as each encoding writes them: a msgpack str,
// and the start of a JSON member (a comma, the quoted name, a colon).
// Constants, which append copies fastest.
const (
	mpSuccess, jsSuccess           = "\xa7success", `,"success":`
	mpLimit, jsLimit               = "\xa5limit", `,"limit":`
	mpRemaining, jsRemaining       = "\xa9remaining", `,"remaining":`
	mpReset, jsReset               = "\xa5reset", `,"reset":`
	mpRetryAfter, jsRetryAfter     = "\xabretry_after", `,"retry_after":`
	mpShadowDenied, jsShadowDenied = "\xadshadow_denied", `,"shadow_denied":`
	mpOverride, jsOverride         = "\xa8override", `,"override":`
	mpResults, jsResults           = "\xa7results", `,"results":`
	mpError, jsError               = "\xa5error", `,"error":`
	mpCode, jsCode                 = "\xa4code", `,"code":`
)

// appendOpen begins an object of n keys with its first key, mp or js.
func (e Encoding) appendOpen(dst []byte, n int, mp, js string) []byte {
	if e == JSON {
		return append(append(dst, '{'), js[1:]...)
	}
	return append(msgp.AppendMapHeader(dst, uint32(n)), mp...)
}

// appendKey begins the next member of an object, key mp or js.
func (e Encoding) appendKey(dst []byte, mp, js string) []byte {
	if e == JSON {
		return append(dst, js...)
	}
	return append(dst, mp...)
}

// appendClose ends an object.
func (e Encoding) appendClose(dst []byte) []byte {
	if e == JSON {
		return append(dst, '}')
	}
	return dst
}

func (e Encoding) appendInt(dst []byte, v int64) []byte {
	if e == JSON {
		return strconv.AppendInt(dst, v, 10)
	}
	return msgp.AppendInt64(dst, v)
}

func (e Encoding) appendBool(dst []byte, v bool) []byte {
	if e == JSON {
		return strconv.AppendBool(dst, v)
	}
	return msgp.AppendBool(dst, v)
}

func (e Encoding) appendString(dst []byte, s string) []byte {
	if e == JSON {
		return appendJSONString(dst, s)
	}
	return msgp.AppendString(dst, s)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// AppendCheckRequest appends the client-side request r encoded in enc (any
// value other than JSON is treated as Msgpack) to dst and returns the
// extended buffer. All four keys are written, cost included; r is not
// validated. In JSON, each byte of invalid UTF-8 in Identifier becomes U+FFFD,
// so send identifiers that are not UTF-8 with Msgpack, which keeps every
// byte.
func AppendCheckRequest(dst []byte, enc Encoding, r CheckRequest) []byte {
	if enc == JSON {
		return appendJSONValue(dst, outOfCheck(r))
	}
	out := outOfCheck(r)
	dst, _ = out.MarshalMsg(dst)
	return dst
}

// AppendBatchRequest appends the client-side batch r encoded in enc (any value
// other than JSON is treated as Msgpack) to dst and returns the extended
// buffer. Each check is written with all five keys; r is not validated. The
// UTF-8 caveat of AppendCheckRequest applies.
func AppendBatchRequest(dst []byte, enc Encoding, r BatchRequest) []byte {
	if enc == JSON {
		checks := make([]batchCheckOut, len(r.Checks))
		for i := range r.Checks {
			checks[i] = outOfBatchCheck(&r.Checks[i])
		}
		return appendJSONValue(dst, struct {
			Checks []batchCheckOut `json:"checks"`
		}{checks})
	}
	dst = append(dst, "\x81\xa6checks"...)
	dst = msgp.AppendArrayHeader(dst, uint32(len(r.Checks)))
	for i := range r.Checks {
		out := outOfBatchCheck(&r.Checks[i])
		dst, _ = out.MarshalMsg(dst)
	}
	return dst
}

// DecodeCheckResponse decodes a single check response body in encoding enc
// (any value other than JSON is treated as Msgpack). All five keys are
// required; shadow_denied and override are optional (override a msgpack str
// or bin); unknown keys are ignored (for forward compatibility) and values
// are type-checked but not range-checked. Errors are plain errors (not
// *BadRequestError), prefixed with "invalid check response: ".
func DecodeCheckResponse(enc Encoding, body []byte) (CheckResponse, error) {
	return decodeResponse("check", enc, body, decodeCheckResponseJSON, decodeCheckResponseMsgpack)
}

// DecodeBatchResponse decodes a batch response body in encoding enc (any value
// other than JSON is treated as Msgpack). success and results are required,
// each result is decoded as by DecodeCheckResponse and unknown keys are
// ignored. Errors are plain errors prefixed with "invalid batch response: ".
func DecodeBatchResponse(enc Encoding, body []byte) (BatchResponse, error) {
	return decodeResponse("batch", enc, body, decodeBatchResponseJSON, decodeBatchResponseMsgpack)
}

// DecodeError decodes an error body {"error": "..."} in encoding enc (any
// value other than JSON is treated as Msgpack) and returns the message. The
// error key is required and unknown keys are ignored. Errors are plain errors
// prefixed with "invalid error response: ".
func DecodeError(enc Encoding, body []byte) (string, error) {
	return decodeResponse("error", enc, body, decodeErrorJSON, decodeErrorMsgpack)
}

// decodeResponse decodes a response body of kind in enc with the decoder of
// the encoding. Every error is a plain error saying the response is invalid:
// a malformed response is not the client's bad request.
func decodeResponse[T any](kind string, enc Encoding, body []byte, fromJSON, fromMsgpack func([]byte) (T, error)) (T, error) {
	var (
		r   T
		err error
	)
	switch {
	case len(body) == 0:
		err = wireErrEmptyResponse
	case enc == JSON:
		r, err = fromJSON(body)
	default:
		r, err = fromMsgpack(body)
	}
	if err != nil {
		var zero T
		return zero, errors.New("invalid " + kind + " response: " + err.Error())
	}
	return r, nil
}

var wireErrEmptyResponse = wireErr("empty response body")

func wireCheckBodySize(body []byte, max int) error {
	if len(body) == 0 {
		return wireErr("empty request body")
	}
	if len(body) > max {
		return wireErr("request body of " + strconv.Itoa(len(body)) +
			" bytes exceeds the limit of " + strconv.Itoa(max) + " bytes")
	}
	return nil
}

// Field bits, to spot duplicate and missing keys (fields.go).
const (
	ckNamespace uint8 = 1 << iota
	ckIdentifier
	ckLimit
	ckDuration
	ckCost
	ckShadow
	ckWindow
	ckCharge
)

// wireIntField describes an integer field of a check and its range.
type wireIntField struct {
	name     string
	min, max int64
	unit     string
}

var (
	wireLimitField    = wireIntField{name: "limit", min: 0, max: MaxLimit}
	wireDurationField = wireIntField{name: "duration", min: MinDuration, max: MaxDuration, unit: " milliseconds"}
	wireCostField     = wireIntField{name: "cost", min: 0, max: MaxCost}
)

func (f *wireIntField) inRange(v int64) bool { return f.min <= v && v <= f.max }

func (f *wireIntField) typeError() error { return wireErr(f.name + " must be an integer") }

// rangeError reports an out of range value; got is its decimal text.
func (f *wireIntField) rangeError(got string) error {
	return wireErr(f.name + " must be between " + strconv.FormatInt(f.min, 10) + " and " +
		strconv.FormatInt(f.max, 10) + f.unit + ", got " + got)
}

func wireErrRequired(name string) error { return wireErr(name + " is required") }

func wireErrNotString(name string) error { return wireErr(name + " must be a string") }

func wireErrUnknownField(key []byte) error { return wireErr("unknown field " + wireQuote(string(key))) }

func wireErrDuplicateField(key []byte) error {
	return wireErr("duplicate field " + wireQuote(string(key)))
}

func wireErrIdentifierLen(n int) error {
	return wireErr("identifier must be 1 to " + strconv.Itoa(MaxIdentifierLen) +
		" bytes, got " + strconv.Itoa(n))
}

var wireErrNamespace = wireErr("namespace must be " + window.TokenRule)

// wireAtIndex prefixes an error about checks[i] with its position.
func wireAtIndex(i int, err error) error {
	return wireErr("checks[" + strconv.Itoa(i) + "]: " + err.Error())
}

// wireQuote quotes s for an error message, cutting it after 64 bytes so
// that a hostile key cannot blow up the reply.
func wireQuote(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}

// appendJSONString appends s as a JSON string. The output is valid JSON for
// any s: '"', '\\' and control characters are escaped, U+2028 and U+2029 are
// escaped for JavaScript's sake, and each byte of invalid UTF-8 becomes
// \ufffd, as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// outOfCheck returns r as the client writes it.
func outOfCheck(r CheckRequest) checkRequestOut {
	return checkRequestOut{Identifier: r.Identifier, Limit: r.Limit, Duration: durationKey(r.Duration), Cost: r.Cost, Shadow: r.Shadow,
		Window: windowKey(r.Fixed, r.Duration), Charge: chargeKey(r.Charge)}
}

// outOfBatchCheck returns c as the client writes it in a batch or checks
// message.
func outOfBatchCheck(c *BatchCheck) batchCheckOut {
	return batchCheckOut{Namespace: c.Namespace, Identifier: c.Identifier, Limit: c.Limit, Duration: durationKey(c.Duration), Cost: c.Cost,
		Shadow: c.Shadow, Window: windowKey(c.Fixed, c.Duration), Charge: chargeKey(c.Charge)}
}

// windowKey is the "window" value of a check: its calendar period's name
// (window.CalendarName), "fixed", or none (the default, sliding).
func windowKey(fixed bool, duration int64) string {
	if window.IsCalendar(duration) {
		return window.CalendarName(duration)
	}
	if fixed {
		return "fixed"
	}
	return ""
}

// durationKey is the "duration" value of a check: none (0) with a calendar
// period, which the window key names instead.
func durationKey(d int64) int64 {
	if window.IsCalendar(d) {
		return 0
	}
	return d
}

// chargeKey is the "charge" value of a check: its name, or none for the
// default, all.
func chargeKey(c window.Charge) string {
	if c == window.ChargeAll {
		return ""
	}
	return c.String()
}
