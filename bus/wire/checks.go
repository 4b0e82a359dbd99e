package wire

import (
	"errors"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fastjson"

	"github.com/sluicehq/sluice/window"
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
	dst = dst[:0]
	if err := wireCheckBodySize(body, MaxChecksBody); err != nil {
		return dst, err
	}
	if enc == JSON {
		return decodeChecksJSON(body, dst)
	}
	return decodeChecksMsgpack(body, dst)
}

func wireErrChecksCount(n uint64) error {
	return wireErr("checks must hold 1 to " + strconv.Itoa(MaxChecks) +
		" checks, got " + strconv.FormatUint(n, 10))
}

func decodeChecksJSON(body []byte, dst []ChecksItem) ([]ChecksItem, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return dst, err
	}
	var checks *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		switch {
		case err != nil:
		case string(key) != "checks":
			err = wireErrUnknownField(key)
		case checks != nil:
			err = wireErrDuplicateField(key)
		default:
			checks = v
		}
	})
	if err != nil {
		return dst, err
	}
	if checks == nil {
		return dst, wireErrRequired("checks")
	}
	if checks.Type() != fastjson.TypeArray {
		return dst, wireErr("checks must be an array")
	}
	arr, _ := checks.Array()
	if len(arr) == 0 || len(arr) > MaxChecks {
		return dst, wireErrChecksCount(uint64(len(arr)))
	}
	prevNS := ""
	bad := false
	for _, ev := range arr {
		dst = append(dst, ChecksItem{})
		it := &dst[len(dst)-1]
		eo, err := ev.Object()
		if err != nil {
			it.Err, bad = wireErr("check must be a JSON object"), true
			continue
		}
		if err := decodeCheckObjectJSON(d, eo, &it.BatchCheck, true, prevNS); err != nil {
			*it, bad = ChecksItem{Err: err}, true
			continue
		}
		prevNS = it.Namespace
	}
	if bad {
		// A bad check may hold values no rule looked at (fastjson lets
		// NaN, 01 and the like through): the body must still be JSON.
		if err := fastjson.ValidateBytes(body); err != nil {
			return dst[:0], wireErr("malformed JSON: " + strings.TrimPrefix(err.Error(), "cannot parse JSON: "))
		}
	}
	return dst, nil
}

func decodeChecksMsgpack(body []byte, dst []ChecksItem) ([]ChecksItem, error) {
	n, b, err := msgpMapHeader(body, "body must be a msgpack map")
	if err != nil {
		return dst, err
	}
	seen := false
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgpKey(b); err != nil {
			return dst[:0], err
		}
		if string(key) != "checks" {
			return dst[:0], wireErrUnknownField(key)
		}
		if seen {
			return dst[:0], wireErrDuplicateField(key)
		}
		seen = true
		switch msgp.NextType(b) {
		case msgp.ArrayType:
		case msgp.InvalidType:
			return dst[:0], msgpBadValue(b)
		default:
			return dst[:0], wireErr("checks must be an array")
		}
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return dst[:0], msgpMalformed(err)
		}
		if count == 0 || count > MaxChecks {
			return dst[:0], wireErrChecksCount(uint64(count))
		}
		prevNS := ""
		for j := range int(count) {
			dst = append(dst, ChecksItem{})
			it := &dst[len(dst)-1]
			if rest, ok := fastChecksItem(b, &it.BatchCheck, true, prevNS); ok {
				b = rest
				prevNS = it.Namespace
				continue
			}
			*it = ChecksItem{}
			rest, err := decodeCheckMapMsgpack(b, &it.BatchCheck, true, prevNS, true)
			if err == nil {
				b = rest
				prevNS = it.Namespace
				continue
			}
			// The check is bad; its result says why, if the body can be
			// read past it.
			rest, serr := msgp.Skip(b)
			if serr != nil {
				return dst[:0], wireAtIndex(j, msgpMalformed(serr))
			}
			*it = ChecksItem{Err: err}
			b = rest
		}
	}
	if len(b) != 0 {
		return dst[:0], wireErrTrailing(len(b))
	}
	if !seen {
		return dst[:0], wireErrRequired("checks")
	}
	return dst, nil
}

// fastChecksItem decodes the usual shape of one msgpack check of a checks or
// batch message into c: a fixmap of up to five fixstr keys, str values for
// namespace and identifier, integers for the rest, each key once,
// everything valid. With view its strings alias b; without, they are
// copies (a namespace equal to prevNS reuses it). It returns false for
// anything else (c is then undefined), and the caller runs the general
// decoder, which explains what is wrong. The five keys have distinct
// lengths.
func fastChecksItem(b []byte, c *BatchCheck, view bool, prevNS string) (rest []byte, ok bool) {
	if len(b) == 0 || b[0]&0xf0 != 0x80 {
		return nil, false
	}
	n := int(b[0] & 0x0f)
	b = b[1:]
	var seen uint8
	c.Cost, c.Fixed, c.Charge = 1, false, window.ChargeAll
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
			if !ok {
				return nil, false
			}
			if bit == ckNamespace {
				if !window.ValidToken(s) {
					return nil, false
				}
				if view {
					c.Namespace = unsafe.String(unsafe.SliceData(s), len(s))
				} else {
					c.Namespace = wireInternNS(s, prevNS)
				}
			} else {
				if len(s) == 0 || len(s) > MaxIdentifierLen {
					return nil, false
				}
				if view {
					c.Identifier = unsafe.String(unsafe.SliceData(s), len(s))
				} else {
					c.Identifier = string(s)
				}
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
	if enc == JSON {
		dst = append(dst, `{"results":[`...)
		for i := range r.Results {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendChecksResultJSON(dst, &r.Results[i])
		}
		return append(dst, "]}"...)
	}
	dst = append(dst, mpResultsHead...)
	dst = msgp.AppendArrayHeader(dst, uint32(len(r.Results)))
	for i := range r.Results {
		dst = appendChecksResultMsgpack(dst, &r.Results[i])
	}
	return dst
}

// mpResultsHead is the checks response's map header and its one key.
const mpResultsHead = "\x81\xa7results"

func appendChecksResultJSON(dst []byte, r *ChecksResult) []byte {
	if r.Error == "" {
		return appendCheckResponseJSON(dst, r.CheckResponse)
	}
	if r.Code == 400 || r.Code == 0 {
		return appendErrorJSON(dst, r.Error)
	}
	dst = append(dst, `{"error":`...)
	dst = appendJSONString(dst, r.Error)
	dst = append(dst, `,"code":`...)
	dst = strconv.AppendInt(dst, int64(r.Code), 10)
	return append(dst, '}')
}

func appendChecksResultMsgpack(dst []byte, r *ChecksResult) []byte {
	if r.Error == "" {
		return appendCheckResponseMsgpack(dst, r.CheckResponse)
	}
	if r.Code == 400 || r.Code == 0 {
		return appendErrorMsgpack(dst, r.Error)
	}
	dst = append(dst, "\x82\xa5error"...)
	dst = msgp.AppendString(dst, r.Error)
	dst = append(dst, "\xa4code"...)
	return msgp.AppendInt(dst, r.Code)
}

// DecodeChecksResponse decodes a checks response body in encoding enc (any
// value other than JSON is treated as Msgpack). results is required; each
// result is an error when it carries "error" (its "code" defaulting to 400;
// an empty error reads as "unknown error", so that Error is empty only for
// a decision) and otherwise needs the five keys of a check response;
// unknown keys are ignored. Errors are plain errors prefixed with "invalid checks response: ".
func DecodeChecksResponse(enc Encoding, body []byte) (ChecksResponse, error) {
	var r ChecksResponse
	var err error
	if len(body) == 0 {
		err = wireErrEmptyResponse
	} else if enc == JSON {
		r, err = decodeChecksResponseJSON(body)
	} else {
		r, err = decodeChecksResponseMsgpack(body)
	}
	if err != nil {
		return ChecksResponse{}, wireResponseError("checks", err)
	}
	return r, nil
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
			r.Results[i] = ChecksResult{Error: *res.Error, Code: 400}
			if *res.Error == "" {
				r.Results[i].Error = "unknown error"
			}
			if res.Code != nil {
				r.Results[i].Code = *res.Code
			}
			continue
		}
		cr, err := res.response()
		if err != nil {
			return ChecksResponse{}, errors.New("results[" + strconv.Itoa(i) + "]: " + err.Error())
		}
		r.Results[i].CheckResponse = cr
	}
	return r, nil
}

func decodeChecksResponseMsgpack(body []byte) (ChecksResponse, error) {
	n, b, err := msgp.ReadMapHeaderBytes(body)
	if err != nil {
		return ChecksResponse{}, msgpResponseError(err)
	}
	var r ChecksResponse
	found := false
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return ChecksResponse{}, msgpResponseError(err)
		}
		if string(key) != "results" {
			if b, err = msgp.Skip(b); err != nil {
				return ChecksResponse{}, msgpResponseError(err)
			}
			continue
		}
		if found {
			return ChecksResponse{}, errors.New(`duplicate field "results"`)
		}
		found = true
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return ChecksResponse{}, errors.New("results must be an array")
		}
		// Each result takes at least one byte: never trust count beyond len(b).
		r.Results = make([]ChecksResult, 0, min(int(count), len(b)))
		for i := range count {
			var res ChecksResult
			if res, b, err = checksResultMsgpack(b); err != nil {
				return ChecksResponse{}, errors.New("results[" + strconv.FormatUint(uint64(i), 10) + "]: " + err.Error())
			}
			r.Results = append(r.Results, res)
		}
	}
	if len(b) != 0 {
		return ChecksResponse{}, wireErrTrailing(len(b))
	}
	if !found {
		return ChecksResponse{}, errors.New("results is required")
	}
	return r, nil
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
		if seen&sCode == 0 {
			r.Code = 400
		}
		if r.Error == "" {
			r.Error = "unknown error"
		}
		return ChecksResult{Error: r.Error, Code: r.Code}, b, nil
	}
	if err := errMissing(checkResponseKeys, seen&sSuccess != 0, seen&sLimit != 0, seen&sRemaining != 0,
		seen&sReset != 0, seen&sRetryAfter != 0); err != nil {
		return ChecksResult{}, nil, err
	}
	r.Code = 0
	return r, b, nil
}
