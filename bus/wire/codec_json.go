package wire

import (
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// jsonDecoder is a pooled fastjson parser plus a scratch buffer for the raw
// text of values. A fastjson.ParserPool cannot carry the scratch buffer, and
// a stack buffer would escape (fastjson's MarshalTo leaks its argument), so
// both live in one sync.Pool entry. Values of the parser must not be used
// after the decoder goes back to the pool: no decoded value aliases it.
type jsonDecoder struct {
	p       fastjson.Parser
	scratch []byte
}

var jsonDecoders = sync.Pool{New: func() any {
	return &jsonDecoder{scratch: make([]byte, 0, jsonScratchSize)}
}}

// jsonScratchSize is the initial scratch size: the raw text of a maximal
// identifier without escapes, plus quotes, fits.
const jsonScratchSize = MaxIdentifierLen + 64

// jsonMaxPooledScratch bounds the scratch buffer kept in the pool.
const jsonMaxPooledScratch = 8 << 10

// parseJSON parses body with a pooled decoder, which the caller must release
// with putJSON whether or not parsing failed.
func parseJSON(body []byte) (d *jsonDecoder, o *fastjson.Object, err error) {
	d = jsonDecoders.Get().(*jsonDecoder)
	v, err := d.p.ParseBytes(body)
	if err != nil {
		return d, nil, wireErr("malformed JSON: " + strings.TrimPrefix(err.Error(), "cannot parse JSON: "))
	}
	if v.Type() != fastjson.TypeObject {
		return d, nil, wireErr("body must be a JSON object")
	}
	o, _ = v.Object()
	return d, o, nil
}

func putJSON(d *jsonDecoder) {
	if cap(d.scratch) > jsonMaxPooledScratch {
		d.scratch = make([]byte, 0, jsonScratchSize)
	}
	jsonDecoders.Put(d)
}

func decodeCheckJSON(body []byte) (CheckRequest, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return CheckRequest{}, err
	}
	var c BatchCheck
	if err := decodeCheckObjectJSON(d, o, &c, false, ""); err != nil {
		return CheckRequest{}, err
	}
	return c.CheckRequest, nil
}

func decodeBatchJSON(body []byte) (BatchRequest, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return BatchRequest{}, err
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
		return BatchRequest{}, err
	}
	if checks == nil {
		return BatchRequest{}, wireErrRequired("checks")
	}
	if checks.Type() != fastjson.TypeArray {
		return BatchRequest{}, wireErr("checks must be an array")
	}
	arr, _ := checks.Array()
	if len(arr) == 0 || len(arr) > MaxBatchChecks {
		return BatchRequest{}, wireErrBatchCount(uint64(len(arr)))
	}
	req := BatchRequest{Checks: make([]BatchCheck, len(arr))}
	prevNS := ""
	for i, ev := range arr {
		eo, err := ev.Object()
		if err != nil {
			return BatchRequest{}, wireAtIndex(i, wireErr("check must be a JSON object"))
		}
		if err := decodeCheckObjectJSON(d, eo, &req.Checks[i], true, prevNS); err != nil {
			return BatchRequest{}, wireAtIndex(i, err)
		}
		prevNS = req.Checks[i].Namespace
	}
	return req, nil
}

// decodeCheckObjectJSON fills c from the keys of o, accepting namespace only
// in a batch check, and validates every field. A namespace equal to prevNS
// reuses that string.
func decodeCheckObjectJSON(d *jsonDecoder, o *fastjson.Object, c *BatchCheck, batch bool, prevNS string) error {
	var (
		err  error
		seen uint8
	)
	o.Visit(func(key []byte, v *fastjson.Value) {
		if err != nil {
			return
		}
		bit := wireCheckFieldBit(key, batch)
		if bit == 0 {
			err = wireErrUnknownField(key)
			return
		}
		if seen&bit != 0 {
			err = wireErrDuplicateField(key)
			return
		}
		seen |= bit
		switch bit {
		case ckNamespace:
			var s []byte
			if s, err = jsonString(d, v, "namespace"); err == nil {
				if !wireValidToken(s) {
					err = wireErrNamespace
					return
				}
				c.Namespace = wireInternNS(s, prevNS)
			}
		case ckIdentifier:
			var s []byte
			if s, err = jsonString(d, v, "identifier"); err == nil {
				if len(s) == 0 || len(s) > MaxIdentifierLen {
					err = wireErrIdentifierLen(len(s))
					return
				}
				c.Identifier = string(s)
			}
		case ckLimit:
			c.Limit, err = jsonIntField(d, v, &wireLimitField)
		case ckDuration:
			c.Duration, err = jsonIntField(d, v, &wireDurationField)
		case ckCost:
			c.Cost, err = jsonIntField(d, v, &wireCostField)
		}
	})
	if err != nil {
		return err
	}
	return wireFinishCheck(c, seen, batch)
}

// jsonString returns the decoded contents of the string v, written into
// scratch. It must run before anything calls v.Type(), which replaces the raw
// text that fastjson keeps with its own (lenient) unescaping.
func jsonString(d *jsonDecoder, v *fastjson.Value, name string) ([]byte, error) {
	raw := v.MarshalTo(d.scratch[:0])
	d.scratch = raw[:0]
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, wireErrNotString(name)
	}
	return unescapeJSON(raw[1 : len(raw)-1])
}

// jsonIntField returns the integer v after checking it against f.
func jsonIntField(d *jsonDecoder, v *fastjson.Value, f *wireIntField) (int64, error) {
	if v.Type() != fastjson.TypeNumber {
		return 0, f.typeError()
	}
	raw := v.MarshalTo(d.scratch[:0])
	d.scratch = raw[:0]
	n, kind := parseJSONInt(raw)
	switch kind {
	case jsonNumFraction:
		return 0, f.typeError()
	case jsonNumInvalid:
		return 0, wireErrBadNumber(raw)
	case jsonNumOverflow:
		return 0, f.rangeError(string(raw))
	}
	if !f.inRange(n) {
		return 0, f.rangeError(strconv.FormatInt(n, 10))
	}
	return n, nil
}

func wireErrBadNumber(raw []byte) error {
	return wireErr("malformed JSON: invalid number " + wireQuote(string(raw)))
}

// jsonNumKind classifies the text of a JSON number token.
type jsonNumKind uint8

const (
	jsonNumInt      jsonNumKind = iota // an integer that fits int64
	jsonNumFraction                    // a valid JSON number with a fraction or an exponent
	jsonNumOverflow                    // a valid JSON integer that does not fit int64
	jsonNumInvalid                     // not a JSON number (fastjson lets NaN, Inf, 01, 1. ... through)
)

// parseJSONInt parses s, the text of a number token, by the strict JSON
// grammar -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func parseJSONInt(s []byte) (int64, jsonNumKind) {
	i := 0
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	digits := s[start:i]
	if len(digits) == 0 || digits[0] == '0' && len(digits) > 1 {
		return 0, jsonNumInvalid
	}
	if i < len(s) {
		if s[i] == '.' {
			i++
			j := i
			for i < len(s) && '0' <= s[i] && s[i] <= '9' {
				i++
			}
			if i == j {
				return 0, jsonNumInvalid
			}
		}
		if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
			i++
			if i < len(s) && (s[i] == '+' || s[i] == '-') {
				i++
			}
			j := i
			for i < len(s) && '0' <= s[i] && s[i] <= '9' {
				i++
			}
			if i == j {
				return 0, jsonNumInvalid
			}
		}
		if i != len(s) {
			return 0, jsonNumInvalid
		}
		return 0, jsonNumFraction
	}
	if len(digits) > 19 {
		return 0, jsonNumOverflow
	}
	var u uint64 // 19 digits always fit
	for _, c := range digits {
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, jsonNumOverflow
		}
		return int64(-u), jsonNumInt
	}
	if u > 1<<63-1 {
		return 0, jsonNumOverflow
	}
	return int64(u), jsonNumInt
}

// unescapeJSON validates the raw contents of a JSON string (the text between
// its quotes) and decodes its escapes in place, returning the decoded bytes.
// Bytes >= 0x80 are kept as they are; an escaped lone surrogate becomes
// U+FFFD, as with encoding/json. Decoding never makes the text longer.
func unescapeJSON(b []byte) ([]byte, error) {
	i := 0
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return nil, wireErrControlChar(b[i])
		}
		if b[i] == '\\' {
			break
		}
	}
	if i == len(b) {
		return b, nil
	}
	w := i
	for i < len(b) {
		c := b[i]
		if c < 0x20 {
			return nil, wireErrControlChar(c)
		}
		if c != '\\' {
			b[w] = c
			w++
			i++
			continue
		}
		if i+1 >= len(b) {
			return nil, wireErrBadEscape
		}
		switch e := b[i+1]; e {
		case '"', '\\', '/':
			b[w] = e
		case 'b':
			b[w] = '\b'
		case 'f':
			b[w] = '\f'
		case 'n':
			b[w] = '\n'
		case 'r':
			b[w] = '\r'
		case 't':
			b[w] = '\t'
		case 'u':
			r := jsonHex4(b[i+2:])
			if r < 0 {
				return nil, wireErrBadEscape
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if r2 := jsonU4(b[i:]); r2 >= 0 {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						i += 6
						w += utf8.EncodeRune(b[w:], d)
						continue
					}
				}
				r = utf8.RuneError
			}
			w += utf8.EncodeRune(b[w:], r)
			continue
		default:
			return nil, wireErrBadEscape
		}
		w++
		i += 2
	}
	return b[:w], nil
}

// jsonHex4 decodes 4 hex digits at the start of b, or returns -1.
func jsonHex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// jsonU4 decodes a \uXXXX escape at the start of b, or returns -1.
func jsonU4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	return jsonHex4(b[2:])
}

var wireErrBadEscape = wireErr("malformed JSON: invalid escape sequence in string")

func wireErrControlChar(c byte) error {
	const hex = "0123456789abcdef"
	return wireErr("malformed JSON: control character 0x" + string([]byte{hex[c>>4], hex[c&0xf]}) + " in string")
}

// Encoders.

func appendCheckResponseJSON(dst []byte, r CheckResponse) []byte {
	dst = append(dst, `{"success":`...)
	dst = strconv.AppendBool(dst, r.Success)
	dst = append(dst, `,"limit":`...)
	dst = strconv.AppendInt(dst, r.Limit, 10)
	dst = append(dst, `,"remaining":`...)
	dst = strconv.AppendInt(dst, r.Remaining, 10)
	dst = append(dst, `,"reset":`...)
	dst = strconv.AppendInt(dst, r.Reset, 10)
	dst = append(dst, `,"retry_after":`...)
	dst = strconv.AppendInt(dst, r.RetryAfter, 10)
	return append(dst, '}')
}

func appendBatchResponseJSON(dst []byte, r BatchResponse) []byte {
	dst = append(dst, `{"success":`...)
	dst = strconv.AppendBool(dst, r.Success)
	dst = append(dst, `,"results":[`...)
	for i, res := range r.Results {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendCheckResponseJSON(dst, res)
	}
	return append(dst, "]}"...)
}

func appendErrorJSON(dst []byte, msg string) []byte {
	dst = append(dst, `{"error":`...)
	dst = appendJSONString(dst, msg)
	return append(dst, '}')
}

// appendCheckFieldsJSON appends the four check keys, without braces.
func appendCheckFieldsJSON(dst []byte, r *CheckRequest) []byte {
	dst = append(dst, `"identifier":`...)
	dst = appendJSONString(dst, r.Identifier)
	dst = append(dst, `,"limit":`...)
	dst = strconv.AppendInt(dst, r.Limit, 10)
	dst = append(dst, `,"duration":`...)
	dst = strconv.AppendInt(dst, r.Duration, 10)
	dst = append(dst, `,"cost":`...)
	return strconv.AppendInt(dst, r.Cost, 10)
}

func appendCheckRequestJSON(dst []byte, r CheckRequest) []byte {
	dst = append(dst, '{')
	dst = appendCheckFieldsJSON(dst, &r)
	return append(dst, '}')
}

func appendBatchRequestJSON(dst []byte, r BatchRequest) []byte {
	dst = append(dst, `{"checks":[`...)
	for i := range r.Checks {
		c := &r.Checks[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"namespace":`...)
		dst = appendJSONString(dst, c.Namespace)
		dst = append(dst, ',')
		dst = appendCheckFieldsJSON(dst, &c.CheckRequest)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// Client-side decoders.

// Response field bits.
const (
	rsSuccess uint8 = 1 << iota
	rsLimit
	rsRemaining
	rsReset
	rsRetryAfter
	rsAll = rsSuccess | rsLimit | rsRemaining | rsReset | rsRetryAfter
)

// wireResponseFieldBit maps a key of a check response to its bit, or 0 when the
// key is unknown (and ignored).
func wireResponseFieldBit(key []byte) uint8 {
	switch string(key) {
	case "success":
		return rsSuccess
	case "limit":
		return rsLimit
	case "remaining":
		return rsRemaining
	case "reset":
		return rsReset
	case "retry_after":
		return rsRetryAfter
	}
	return 0
}

// wireErrMissingResponseField names the first field missing from seen.
func wireErrMissingResponseField(seen uint8) error {
	for _, f := range [...]struct {
		bit  uint8
		name string
	}{{rsSuccess, "success"}, {rsLimit, "limit"}, {rsRemaining, "remaining"}, {rsReset, "reset"}, {rsRetryAfter, "retry_after"}} {
		if seen&f.bit == 0 {
			return wireErrRequired(f.name)
		}
	}
	return nil
}

func decodeCheckResponseJSON(body []byte) (CheckResponse, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return CheckResponse{}, err
	}
	return checkResponseObjectJSON(d, o)
}

func checkResponseObjectJSON(d *jsonDecoder, o *fastjson.Object) (CheckResponse, error) {
	var (
		r    CheckResponse
		err  error
		seen uint8
	)
	o.Visit(func(key []byte, v *fastjson.Value) {
		if err != nil {
			return
		}
		bit := wireResponseFieldBit(key)
		if bit == 0 {
			return
		}
		if seen&bit != 0 {
			err = wireErrDuplicateField(key)
			return
		}
		seen |= bit
		switch bit {
		case rsSuccess:
			r.Success, err = jsonBool(v, "success")
		case rsLimit:
			r.Limit, err = jsonInt64(d, v, "limit")
		case rsRemaining:
			r.Remaining, err = jsonInt64(d, v, "remaining")
		case rsReset:
			r.Reset, err = jsonInt64(d, v, "reset")
		case rsRetryAfter:
			r.RetryAfter, err = jsonInt64(d, v, "retry_after")
		}
	})
	if err != nil {
		return CheckResponse{}, err
	}
	if seen != rsAll {
		return CheckResponse{}, wireErrMissingResponseField(seen)
	}
	return r, nil
}

func decodeBatchResponseJSON(body []byte) (BatchResponse, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return BatchResponse{}, err
	}
	var (
		r       BatchResponse
		results *fastjson.Value
		seen    uint8
	)
	o.Visit(func(key []byte, v *fastjson.Value) {
		if err != nil {
			return
		}
		var bit uint8
		switch string(key) {
		case "success":
			bit = 1
		case "results":
			bit = 2
		default:
			return
		}
		if seen&bit != 0 {
			err = wireErrDuplicateField(key)
			return
		}
		seen |= bit
		if bit == 1 {
			r.Success, err = jsonBool(v, "success")
		} else {
			results = v
		}
	})
	if err != nil {
		return BatchResponse{}, err
	}
	if seen&1 == 0 {
		return BatchResponse{}, wireErrRequired("success")
	}
	if results == nil {
		return BatchResponse{}, wireErrRequired("results")
	}
	if results.Type() != fastjson.TypeArray {
		return BatchResponse{}, wireErr("results must be an array")
	}
	arr, _ := results.Array()
	r.Results = make([]CheckResponse, len(arr))
	for i, ev := range arr {
		eo, err := ev.Object()
		if err != nil {
			return BatchResponse{}, wireErr("results[" + strconv.Itoa(i) + "]: result must be a JSON object")
		}
		if r.Results[i], err = checkResponseObjectJSON(d, eo); err != nil {
			return BatchResponse{}, wireErr("results[" + strconv.Itoa(i) + "]: " + err.Error())
		}
	}
	return r, nil
}

func decodeErrorJSON(body []byte) (string, error) {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return "", err
	}
	var (
		msg  string
		seen bool
	)
	o.Visit(func(key []byte, v *fastjson.Value) {
		if err != nil || string(key) != "error" {
			return
		}
		if seen {
			err = wireErrDuplicateField(key)
			return
		}
		seen = true
		var s []byte
		if s, err = jsonString(d, v, "error"); err == nil {
			msg = string(s)
		}
	})
	if err != nil {
		return "", err
	}
	if !seen {
		return "", wireErrRequired("error")
	}
	return msg, nil
}

func jsonBool(v *fastjson.Value, name string) (bool, error) {
	switch v.Type() {
	case fastjson.TypeTrue:
		return true, nil
	case fastjson.TypeFalse:
		return false, nil
	}
	return false, wireErr(name + " must be a boolean")
}

// jsonInt64 returns the integer v, of any sign.
func jsonInt64(d *jsonDecoder, v *fastjson.Value, name string) (int64, error) {
	if v.Type() != fastjson.TypeNumber {
		return 0, wireErr(name + " must be an integer")
	}
	raw := v.MarshalTo(d.scratch[:0])
	d.scratch = raw[:0]
	n, kind := parseJSONInt(raw)
	switch kind {
	case jsonNumFraction:
		return 0, wireErr(name + " must be an integer")
	case jsonNumInvalid:
		return 0, wireErrBadNumber(raw)
	case jsonNumOverflow:
		return 0, wireErr(name + " does not fit in 64 bits, got " + string(raw))
	}
	return n, nil
}
