package wire

import (
	"bytes"
	"encoding/json"
	"errors"
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
		return d, nil, wireErrMalformedJSON(err)
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

// decodeJSON reads the JSON body of a batch or checks message into l.
func (l *checkList) decodeJSON(body []byte) error {
	d, o, err := parseJSON(body)
	defer putJSON(d)
	if err != nil {
		return err
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
		return err
	}
	if checks == nil {
		return wireErrRequired("checks")
	}
	if checks.Type() != fastjson.TypeArray {
		return wireErr("checks must be an array")
	}
	arr, _ := checks.Array()
	if err := l.open(uint64(len(arr))); err != nil {
		return err
	}
	prevNS, bad := "", false
	for i, ev := range arr {
		c := l.slot(i)
		eo, err := ev.Object()
		if err != nil {
			err = wireErr("check must be a JSON object")
		} else if err = decodeCheckObjectJSON(d, eo, c, true, prevNS); err == nil {
			prevNS = c.Namespace
			continue
		}
		if err := l.fail(i, err); err != nil {
			return err
		}
		bad = true
	}
	// A bad check may hold values no rule looked at (fastjson lets NaN, 01
	// and the like through): the body must still be JSON.
	if bad {
		if err := fastjson.ValidateBytes(body); err != nil {
			return wireErrMalformedJSON(err)
		}
	}
	return nil
}

func wireErrMalformedJSON(err error) error {
	return wireErr("malformed JSON: " + strings.TrimPrefix(err.Error(), "cannot parse JSON: "))
}

// decodeCheckObjectJSON fills c from the keys of o, accepting namespace only
// in a batch check, and validates every field. A namespace equal to prevNS
// reuses that string.
func decodeCheckObjectJSON(d *jsonDecoder, o *fastjson.Object, c *BatchCheck, batch bool, prevNS string) error {
	var (
		err  error
		seen checkSeen
	)
	o.Visit(func(key []byte, v *fastjson.Value) {
		if err != nil {
			return
		}
		f := checkFieldOf(key, batch)
		if f == nil {
			err = wireErrUnknownField(key)
			return
		}
		if err = seen.add(f, key); err != nil {
			return
		}
		if f.ints != nil {
			var n int64
			if n, err = jsonIntField(d, v, f.ints); err == nil {
				f.setInt(c, n)
			}
			return
		}
		if f.boolean {
			switch v.Type() {
			case fastjson.TypeTrue:
				f.setBool(c, true)
			case fastjson.TypeFalse:
				f.setBool(c, false)
			default:
				err = f.typeError()
			}
			return
		}
		var s []byte
		if s, err = jsonString(d, v, f.name); err == nil {
			err = f.setString(c, s, false, prevNS, &seen)
		}
	})
	if err != nil {
		return err
	}
	return seen.finish(c, batch)
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
	d := bytes.TrimPrefix(s, []byte("-"))
	var u uint64
	for i, c := range d {
		if c < '0' || c > '9' || i == 1 && d[0] == '0' {
			return 0, jsonNotInt(s)
		}
		if u < 1<<60 { // u*10+9 cannot wrap
			u = u*10 + uint64(c-'0')
		} else {
			u = 1<<64 - 1 // past int64 whatever follows
		}
	}
	switch {
	case len(d) == 0:
		return 0, jsonNumInvalid
	case len(d) < len(s) && u <= 1<<63:
		return int64(-u), jsonNumInt
	case len(d) == len(s) && u < 1<<63:
		return int64(u), jsonNumInt
	}
	return 0, jsonNumOverflow
}

// jsonNotInt classifies the text of a number token that is no integer: a
// number with a fraction or an exponent, as encoding/json's scanner judges
// it, or invalid.
func jsonNotInt(s []byte) jsonNumKind {
	if json.Valid(s) && s[0] > ' ' && s[len(s)-1] > ' ' { // one token, no white space around it
		return jsonNumFraction
	}
	return jsonNumInvalid
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
	v, err := strconv.ParseUint(string(b[:4]), 16, 16) // hex digits only: no sign, prefix or '_' in base 16
	if err != nil {
		return -1
	}
	return rune(v)
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

// appendJSONValue appends v, a client's request shape (msg.go), as
// encoding/json writes it: each byte of invalid UTF-8 as U+FFFD. The shapes
// hold strings, integers and slices, which cannot fail to encode.
func appendJSONValue(dst []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("wire: encoding/json failed on a request shape: " + err.Error())
	}
	return append(dst, b...)
}

// Client-side decoders: encoding/json into shapes whose pointers tell a
// missing key from a zero value. As encoding/json does, keys match
// case-insensitively, the last of repeated keys wins and unknown keys are
// ignored.

type checkResponseJSON struct {
	Success    *bool  `json:"success"`
	Limit      *int64 `json:"limit"`
	Remaining  *int64 `json:"remaining"`
	Reset      *int64 `json:"reset"`
	RetryAfter *int64 `json:"retry_after"`
	// ShadowDenied is optional: absent means false.
	ShadowDenied *bool `json:"shadow_denied"`
	// Override is optional: absent means none applied.
	Override *string `json:"override"`
}

func (in *checkResponseJSON) response() (CheckResponse, error) {
	if err := errMissing(checkResponseKeys, in.Success != nil, in.Limit != nil, in.Remaining != nil, in.Reset != nil, in.RetryAfter != nil); err != nil {
		return CheckResponse{}, err
	}
	r := CheckResponse{Success: *in.Success, Limit: *in.Limit, Remaining: *in.Remaining, Reset: *in.Reset, RetryAfter: *in.RetryAfter,
		ShadowDenied: in.ShadowDenied != nil && *in.ShadowDenied}
	if in.Override != nil {
		r.Override = *in.Override
	}
	return r, nil
}

func decodeCheckResponseJSON(body []byte) (CheckResponse, error) {
	var in checkResponseJSON
	if err := unmarshalJSON(body, &in); err != nil {
		return CheckResponse{}, err
	}
	return in.response()
}

func decodeBatchResponseJSON(body []byte) (BatchResponse, error) {
	var in struct {
		Success *bool              `json:"success"`
		Results *[]json.RawMessage `json:"results"`
	}
	if err := unmarshalJSON(body, &in); err != nil {
		return BatchResponse{}, err
	}
	if err := errMissing([]string{"success", "results"}, in.Success != nil, in.Results != nil); err != nil {
		return BatchResponse{}, err
	}
	r := BatchResponse{Success: *in.Success, Results: make([]CheckResponse, len(*in.Results))}
	for i, raw := range *in.Results {
		var res checkResponseJSON
		err := unmarshalJSON(raw, &res)
		if err == nil {
			r.Results[i], err = res.response()
		}
		if err != nil {
			return BatchResponse{}, errAtResult(i, err)
		}
	}
	return r, nil
}

func decodeErrorJSON(body []byte) (string, error) {
	var in struct {
		Error *string `json:"error"`
	}
	if err := unmarshalJSON(body, &in); err != nil {
		return "", err
	}
	if in.Error == nil {
		return "", errors.New("error is required")
	}
	return *in.Error, nil
}

// unmarshalJSON decodes the object body into v, describing an error without
// encoding/json's prefix.
func unmarshalJSON(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}
