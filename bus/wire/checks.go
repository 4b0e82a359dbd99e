package wire

import (
	"errors"
	"strconv"

	"github.com/tinylib/msgp/msgp"
)

// The checks message (README, "Many checks in one message"): many independent checks of one
// workspace in one message. Its request body has the batch's shape
// ({"checks": [ {namespace, identifier, limit, duration, cost}, ... ]}), but
// a bad check spoils only its own result: the body is refused as a whole
// only when it cannot be read as a whole.

// Limits of the checks message.
const (
	// MaxChecks is the most checks one checks message may hold.
	MaxChecks = 1000
	// MaxChecksBody is the largest checks request body, in bytes: NATS's
	// default max_payload, which 1000 checks of 64-character namespaces and
	// 512-byte identifiers fit in either encoding.
	MaxChecksBody = 1 << 20
)

// ChecksItem is one check of a checks message as the limiter reads it:
// either a BatchCheck satisfying every rule of the contract (Err nil), or
// Err, the *BadRequestError saying what is wrong with this check alone. Its
// message is the one the single check or batch endpoint gives for the same
// fields, without an index (the result's position says which check).
type ChecksItem struct {
	BatchCheck
	Err error
}

// ChecksResult answers one check of a checks message: a decision
// (CheckResponse), or an error when Error is not empty, for which nothing
// was counted.
type ChecksResult struct {
	CheckResponse
	// Error says why the check was not decided; empty for a decision.
	Error string
	// Code is the error's class, as in the micro convention: 400 the
	// check's fields are bad (fix them), 503 the limiter stopped before it
	// decided this check (send it again: a peer decides it), 500 an
	// internal fault. 0 for a decision.
	Code int
}

// ChecksResponse is the answer to a checks message: Results[i] answers
// Checks[i].
type ChecksResponse struct {
	Results []ChecksResult
}

// DecodeChecksRequestView decodes a checks request body in encoding enc (any
// value other than JSON is treated as Msgpack), appending one item per check
// to dst[:0] and returning the extended slice. A check whose fields are bad
// becomes an item with Err set; the error returned (a *BadRequestError) is
// for a body that cannot be read as a whole: empty or over MaxChecksBody,
// malformed, not a map, unknown or repeated top-level keys, no checks, not an
// array, or more than MaxChecks checks. Errors about the structure of one
// check (a truncated or malformed msgpack value) are prefixed with its index,
// as in "checks[3]: ...": such a body cannot be read past that check.
//
// In msgpack the strings of the items alias body (valid while body is
// neither modified nor reused); in JSON they are copies.
func DecodeChecksRequestView(enc Encoding, body []byte, dst []ChecksItem) ([]ChecksItem, error) {
	l := checkList{max: MaxChecks, perItem: true, view: true, items: dst[:0]}
	if err := l.decode(enc, body, MaxChecksBody); err != nil {
		return l.items[:0], err
	}
	return l.items, nil
}

// checkList receives the checks of a batch or checks body
// ({"checks": [...]}) as the one walker of each encoding reads them
// (decodeJSON, decodeMsgpack): into batch, where a bad check refuses the
// body with an error prefixed by its index, or with perItem into items,
// where a bad check is its item's Err and the walk goes on.
type checkList struct {
	max     int  // the most checks the array may hold
	perItem bool // a bad check is recorded in its item, not the body's error
	view    bool // msgpack strings alias the body
	batch   []BatchCheck
	items   []ChecksItem
}

// decode checks the size of body and reads it in enc.
func (l *checkList) decode(enc Encoding, body []byte, maxBody int) error {
	if err := wireCheckBodySize(body, maxBody); err != nil {
		return err
	}
	if enc == JSON {
		return l.decodeJSON(body)
	}
	return l.decodeMsgpack(body)
}

// open accepts an array of n checks, 1 to max, and makes a batch's room.
func (l *checkList) open(n uint64) error {
	if n == 0 || n > uint64(l.max) {
		return wireErr("checks must hold 1 to " + strconv.Itoa(l.max) + " checks, got " + strconv.FormatUint(n, 10))
	}
	if !l.perItem {
		l.batch = make([]BatchCheck, n)
	}
	return nil
}

// slot returns the zeroed check i, the next one.
func (l *checkList) slot(i int) *BatchCheck {
	if !l.perItem {
		return &l.batch[i]
	}
	l.items = append(l.items, ChecksItem{})
	return &l.items[len(l.items)-1].BatchCheck
}

// fail records err for check i, the last slot, or returns the body's error.
func (l *checkList) fail(i int, err error) error {
	if !l.perItem {
		return wireAtIndex(i, err)
	}
	l.items[len(l.items)-1] = ChecksItem{Err: err}
	return nil
}

// AppendChecksRequest appends a checks request of checks encoded in enc
// (any value other than JSON is treated as Msgpack) to dst: the batch's
// shape, each check with all five keys. checks is not validated; the
// UTF-8 caveat of AppendCheckRequest applies.
func AppendChecksRequest(dst []byte, enc Encoding, checks []BatchCheck) []byte {
	return AppendBatchRequest(dst, enc, BatchRequest{Checks: checks})
}

// AppendChecksResponse appends r encoded in enc (any value other than JSON
// is treated as Msgpack) to dst: {"results": [...]}, each decision written
// as by AppendCheckResponse, each error as {"error": msg} when its code is
// 400 (the contract's shape) and {"error": msg, "code": code} otherwise.
func AppendChecksResponse(dst []byte, enc Encoding, r ChecksResponse) []byte {
	return enc.appendClose(appendResults(enc.appendOpen(dst, 1, mpResults, jsResults), enc, r.Results, appendChecksResult))
}

// appendChecksResult appends one result of a checks response.
func appendChecksResult(dst []byte, enc Encoding, r ChecksResult) []byte {
	switch {
	case r.Error == "":
		return AppendCheckResponse(dst, enc, r.CheckResponse)
	case r.Code == 400 || r.Code == 0:
		return AppendError(dst, enc, r.Error)
	}
	dst = enc.appendString(enc.appendOpen(dst, 2, mpError, jsError), r.Error)
	return enc.appendClose(enc.appendInt(enc.appendKey(dst, mpCode, jsCode), int64(r.Code)))
}

// DecodeChecksResponse decodes a checks response body in encoding enc (any
// value other than JSON is treated as Msgpack). results is required; each
// result is an error when it carries "error" (its "code" defaulting to 400;
// an empty error reads as "unknown error", so that Error is empty only for
// a decision) and otherwise needs the five keys of a check response;
// unknown keys are ignored. Errors are plain errors prefixed with "invalid checks response: ".
func DecodeChecksResponse(enc Encoding, body []byte) (ChecksResponse, error) {
	return decodeResponse("checks", enc, body, decodeChecksResponseJSON, decodeChecksResponseMsgpack)
}

type checksResultJSON struct {
	checkResponseJSON
	Error *string `json:"error"`
	Code  *int    `json:"code"`
}

func decodeChecksResponseJSON(body []byte) (ChecksResponse, error) {
	var in struct {
		Results *[]checksResultJSON `json:"results"`
	}
	if err := unmarshalJSON(body, &in); err != nil {
		return ChecksResponse{}, err
	}
	if in.Results == nil {
		return ChecksResponse{}, errors.New("results is required")
	}
	r := ChecksResponse{Results: make([]ChecksResult, len(*in.Results))}
	for i := range *in.Results {
		res := &(*in.Results)[i]
		if res.Error != nil {
			r.Results[i] = errorResult(*res.Error, res.Code)
			continue
		}
		cr, err := res.response()
		if err != nil {
			return ChecksResponse{}, errAtResult(i, err)
		}
		r.Results[i].CheckResponse = cr
	}
	return r, nil
}

// errorResult is a result that carried the error msg and code (400 when
// nil); an empty msg reads "unknown error", so that Error is empty only for
// a decision.
func errorResult(msg string, code *int) ChecksResult {
	r := ChecksResult{Error: msg, Code: 400}
	if msg == "" {
		r.Error = "unknown error"
	}
	if code != nil {
		r.Code = *code
	}
	return r
}

func decodeChecksResponseMsgpack(body []byte) (ChecksResponse, error) {
	var head checksResponseHeadIn
	rest, err := head.UnmarshalMsg(body)
	if err != nil {
		return ChecksResponse{}, msgpResponseError(err)
	}
	if len(rest) != 0 {
		return ChecksResponse{}, wireErrTrailing(len(rest))
	}
	if head.Results == nil {
		return ChecksResponse{}, errors.New("results is required")
	}
	results, _, err := msgpResults(head.Results, checksResultMsgpack)
	return ChecksResponse{Results: results}, err
}

// checksResultMsgpack reads one result of a checks response.
func checksResultMsgpack(b []byte) (ChecksResult, []byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return ChecksResult{}, nil, msgpResponseError(err)
	}
	var (
		r    ChecksResult
		seen uint16
	)
	const (
		sSuccess = 1 << iota
		sLimit
		sRemaining
		sReset
		sRetryAfter
		sError
		sCode
		sShadowDenied
		sOverride
	)
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return ChecksResult{}, nil, msgpResponseError(err)
		}
		var bit uint16
		var dst *int64
		switch string(key) {
		case "success":
			bit = sSuccess
			r.Success, b, err = msgp.ReadBoolBytes(b)
		case "limit":
			bit, dst = sLimit, &r.Limit
		case "remaining":
			bit, dst = sRemaining, &r.Remaining
		case "reset":
			bit, dst = sReset, &r.Reset
		case "retry_after":
			bit, dst = sRetryAfter, &r.RetryAfter
		case "shadow_denied":
			bit = sShadowDenied
			r.ShadowDenied, b, err = msgp.ReadBoolBytes(b)
		case "override":
			bit = sOverride
			var o strOrBin
			b, err = o.UnmarshalMsg(b)
			r.Override = string(o)
		case "error":
			bit = sError
			r.Error, b, err = msgp.ReadStringBytes(b)
		case "code":
			bit = sCode
			r.Code, b, err = msgp.ReadIntBytes(b)
		default:
			b, err = msgp.Skip(b)
		}
		if dst != nil {
			*dst, b, err = msgp.ReadInt64Bytes(b)
		}
		if err != nil {
			return ChecksResult{}, nil, msgpResponseError(err)
		}
		if bit != 0 && seen&bit != 0 {
			return ChecksResult{}, nil, errors.New("duplicate field " + strconv.Quote(string(key)))
		}
		seen |= bit
	}
	if seen&sError != 0 {
		code := &r.Code
		if seen&sCode == 0 {
			code = nil
		}
		return errorResult(r.Error, code), b, nil
	}
	if err := errMissing(checkResponseKeys, seen&sSuccess != 0, seen&sLimit != 0, seen&sRemaining != 0,
		seen&sReset != 0, seen&sRetryAfter != 0); err != nil {
		return ChecksResult{}, nil, err
	}
	r.Code = 0
	return r, b, nil
}
