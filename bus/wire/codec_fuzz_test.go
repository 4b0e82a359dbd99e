package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/window"
)

// twEncodingOf maps the fuzzer's bool to an encoding.
func twEncodingOf(isJSON bool) Encoding {
	if isJSON {
		return JSON
	}
	return Msgpack
}

// twCheckRules fails unless r satisfies every rule of the contract.
func twCheckRules(t *testing.T, r CheckRequest) {
	t.Helper()
	if n := len(r.Identifier); n < 1 || n > 512 {
		t.Fatalf("identifier of %d bytes accepted", n)
	}
	if r.Limit < 0 || r.Limit > 1_000_000_000_000_000 {
		t.Fatalf("limit %d accepted", r.Limit)
	}
	if (r.Duration < 1000 || r.Duration > 31_622_400_000) && (window.ValidDuration(r.Duration) != nil || !r.Fixed) {
		t.Fatalf("duration %d accepted (fixed %v)", r.Duration, r.Fixed)
	}
	if r.Cost < 0 || r.Cost > 1_000_000_000_000_000 {
		t.Fatalf("cost %d accepted", r.Cost)
	}
}

// twCheckNamespace fails unless ns is 1 to 64 characters of [A-Za-z0-9_-];
// written apart from ValidToken on purpose.
func twCheckNamespace(t *testing.T, ns string) {
	t.Helper()
	if len(ns) < 1 || len(ns) > 64 || strings.Trim(ns, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
		t.Fatalf("namespace %q accepted", ns)
	}
}

// twCheckDecodeError fails unless err is a *BadRequestError with a message.
func twCheckDecodeError(t *testing.T, err error) {
	t.Helper()
	var bre *BadRequestError
	if !errors.As(err, &bre) || bre.Msg == "" {
		t.Fatalf("error %v (%T) is not a *BadRequestError with a message", err, err)
	}
}

// twEncodingJSONView checks the object obj, as encoding/json decoded it from a
// body that our decoder accepted, against the check we decoded: same keys,
// same values (identifiers compared after encoding/json's UTF-8 repair).
func twEncodingJSONView(t *testing.T, obj map[string]any, want BatchCheck, batch bool) {
	t.Helper()
	allowed := map[string]bool{"identifier": true, "limit": true, "duration": true, "cost": true, "namespace": batch,
		"shadow": true, "window": true, "charge": true}
	for k := range obj {
		if !allowed[k] {
			t.Fatalf("key %q accepted", k)
		}
	}
	if s, ok := obj["identifier"].(string); !ok || s != twJSONSanitize(want.Identifier) {
		t.Fatalf("identifier: encoding/json sees %q, we decoded %q", obj["identifier"], want.Identifier)
	}
	if batch {
		if s, ok := obj["namespace"].(string); !ok || s != want.Namespace {
			t.Fatalf("namespace: encoding/json sees %q, we decoded %q", obj["namespace"], want.Namespace)
		}
	}
	if b, ok := obj["shadow"]; ok && b != want.Shadow || !ok && want.Shadow {
		t.Fatalf("shadow: encoding/json sees %v, we decoded %v", b, want.Shadow)
	}
	w, _ := obj["window"].(string)
	code, calendar, _ := window.ParseCalendar(w)
	switch {
	case calendar && (want.Duration != code || !want.Fixed || obj["duration"] != nil):
		t.Fatalf("window %q: we decoded duration %d, fixed %v; the body has duration %v", w, want.Duration, want.Fixed, obj["duration"])
	case !calendar && want.Fixed != (w == "fixed"):
		t.Fatalf("window %q: we decoded fixed %v", w, want.Fixed)
	}
	if c, ok := obj["charge"].(string); ok {
		if ch, err := window.ParseCharge(c); err != nil || ch != want.Charge {
			t.Fatalf("charge %q: we decoded %v", c, want.Charge)
		}
	} else if want.Charge != window.ChargeAll {
		t.Fatalf("no charge: we decoded %v", want.Charge)
	}
	wantCost := want.Cost
	if _, ok := obj["cost"]; !ok {
		if want.Cost != 1 {
			t.Fatalf("cost %d without a cost key", want.Cost)
		}
		obj["cost"] = json.Number("1")
	}
	fields := []struct {
		k string
		v int64
	}{{"limit", want.Limit}, {"cost", wantCost}}
	if !calendar {
		fields = append(fields, struct {
			k string
			v int64
		}{"duration", want.Duration})
	}
	for _, f := range fields {
		n, ok := obj[f.k].(json.Number)
		if !ok {
			t.Fatalf("%s: encoding/json sees %#v", f.k, obj[f.k])
		}
		v, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil || v != f.v {
			t.Fatalf("%s: encoding/json sees %s, we decoded %d", f.k, n, f.v)
		}
	}
}

// twDecodeStd decodes body with encoding/json, numbers as json.Number.
func twDecodeStd(t *testing.T, body []byte) any {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("accepted invalid JSON %q", body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	return v
}

// twReencoded returns what r becomes after a trip through enc: JSON turns
// each byte of invalid UTF-8 into U+FFFD.
func twReencoded(enc Encoding, s string) string {
	if enc == JSON && !utf8.ValidString(s) {
		return twJSONSanitize(s)
	}
	return s
}

func twCheckSeeds() [][]byte {
	var seeds [][]byte
	for _, s := range []string{
		twGoodCheckJSON,
		`{"identifier":"x","limit":0,"duration":1000}`,
		`{"identifier":"a\"b\\c\u00e9\ud83d\ude00\ud800","limit":1000000000000000,"duration":31622400000,"cost":1000000000000000}`,
		" {\"identifier\":\"\xff\",\"limit\":1,\"duration\":1000} ",
		`{"identifier":"x","limit":1.5,"duration":1000}`,
		`{"identifier":"x","limit":1e3,"duration":1000}`,
		`{"identifier":"x","limit":-5,"duration":1000}`,
		`{"identifier":"x","limit":99999999999999999999,"duration":1000}`,
		`{"identifier":"x","limit":01,"duration":1000}`,
		`{"identifier":"x","limit":NaN,"duration":1000}`,
		`{"identifier":"x","limit":1,"duration":10}`,
		`{"identifier":null,"limit":1,"duration":1000}`,
		`{"identifier":"","limit":1,"duration":1000}`,
		`{"identifier":"x","limit":1,"limit":1,"duration":1000}`,
		`{"identifier":"x","cots":1,"limit":1,"duration":1000}`,
		`{"identifier":"x\u0000\u12","limit":1,"duration":1000}`,
		`{"identifier":"x","limit":1,"duration":1000} x`,
		`{"identifier":"x","limit":1,"window":"month@Europe/Berlin"}`,
		`{"identifier":"x","limit":1,"window":"day@","cost":2}`,
		`{"identifier":"x","limit":1,"window":"week","duration":1000}`,
		`{"identifier":"x","limit":1,"window":"year@Mars/Olympus"}`,
		`{"identifier":"x","limit":1`,
		`[]`, `{}`, ``, `{`, `"x"`, `nul`,
	} {
		seeds = append(seeds, []byte(s))
	}
	for _, m := range []twMap{
		twGoodCheck,
		twGoodCheck.Without("cost"),
		twGoodCheck.With("identifier", []byte{0, 0xff}),
		twGoodCheck.With("identifier", strings.Repeat("i", 512)),
		twGoodCheck.With("identifier", strings.Repeat("i", 513)),
		twGoodCheck.With("limit", uint64(math.MaxUint64)),
		twGoodCheck.With("limit", int64(math.MinInt64)),
		twGoodCheck.With("limit", uint64(MaxLimit)),
		twGoodCheck.With("limit", 1.0),
		twGoodCheck.With("limit", float32(1)),
		twGoodCheck.With("limit", nil),
		twGoodCheck.With("duration", int8(-1)),
		twGoodCheck.With("cost", "1"),
		twGoodCheck.With("cots", 1),
		append(twGoodCheck, twKV{"limit", 1}),
		{{1, 2}},
		{},
	} {
		seeds = append(seeds, twMP(m))
	}
	good := twMP(twGoodCheck)
	seeds = append(seeds, good[:len(good)-1], append(twMP(twGoodCheck), 0), []byte{0xc1}, twMP([]any{1}),
		[]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	return seeds
}

func FuzzDecodeCheckRequest(f *testing.F) {
	for _, s := range twCheckSeeds() {
		f.Add(true, s)
		f.Add(false, s)
	}
	f.Fuzz(func(t *testing.T, isJSON bool, input []byte) {
		enc := twEncodingOf(isJSON)
		body := bytes.Clone(input)
		req, err := DecodeCheckRequest(enc, body)
		if err != nil {
			twCheckDecodeError(t, err)
			if req != (CheckRequest{}) {
				t.Fatalf("%+v returned with error %v", req, err)
			}
			return
		}
		twCheckRules(t, req)
		if enc == JSON {
			obj, ok := twDecodeStd(t, body).(map[string]any)
			if !ok {
				t.Fatalf("accepted a JSON non-object")
			}
			twEncodingJSONView(t, obj, BatchCheck{CheckRequest: req}, false)
		}
		// The result does not alias the body.
		want := req
		want.Identifier = strings.Clone(req.Identifier)
		for i := range body {
			body[i] ^= 0xa5
		}
		if req != want {
			t.Fatalf("decoded request aliases the body")
		}
		// Re-encoding and decoding again gives the same request, in either
		// encoding.
		for _, e := range twEncodings {
			again := AppendCheckRequest(nil, e.enc, req)
			got, err := DecodeCheckRequest(e.enc, again)
			exp := req
			exp.Identifier = twReencoded(e.enc, req.Identifier)
			if len(exp.Identifier) > MaxIdentifierLen {
				if err == nil {
					t.Fatalf("%s: identifier of %d bytes accepted", e.name, len(exp.Identifier))
				}
				continue
			}
			if err != nil || got != exp {
				t.Fatalf("%s: %+v re-encoded as %q decodes to %+v, %v", e.name, req, again, got, err)
			}
		}
	})
}

func twBatchSeeds() [][]byte {
	var seeds [][]byte
	one := BatchRequest{Checks: []BatchCheck{{Namespace: "ns", CheckRequest: CheckRequest{"user-1", 100, 60000, 1, false, false, 0}}}}
	mixed := BatchRequest{Checks: []BatchCheck{
		{Namespace: "a", CheckRequest: CheckRequest{"x\x00\"\\", 0, MinDuration, 0, false, false, 0}},
		{Namespace: "a", CheckRequest: CheckRequest{"é😀", MaxLimit, MaxDuration, MaxCost, false, false, 0}},
		{Namespace: strings.Repeat("Z", 64), CheckRequest: CheckRequest{"\xff", 1, 1000, 1, false, false, 0}},
	}}
	var full BatchRequest
	for i := 0; i < MaxBatchChecks; i++ {
		full.Checks = append(full.Checks, one.Checks[0])
	}
	over := BatchRequest{Checks: append(append([]BatchCheck(nil), full.Checks...), one.Checks[0])}
	badNS := BatchRequest{Checks: []BatchCheck{{Namespace: "a.b", CheckRequest: one.Checks[0].CheckRequest}}}
	badCheck := BatchRequest{Checks: []BatchCheck{one.Checks[0], {Namespace: "ns", CheckRequest: CheckRequest{"", -1, 10, -1, false, false, 0}}}}
	for _, e := range twEncodings {
		for _, r := range []BatchRequest{one, mixed, full, over, badNS, badCheck, {}} {
			seeds = append(seeds, AppendBatchRequest(nil, e.enc, r))
		}
	}
	for _, s := range []string{
		`{"checks":[{"namespace":"ns","identifier":"x","limit":1,"duration":1000}]}`,
		`{"checks":[{"identifier":"x","limit":1,"duration":1000}]}`,
		`{"checks":[{"namespace":"ns","identifier":"x","limit":1,"duration":1000,"cost":0.5}]}`,
		`{"checks":[1]}`, `{"checks":{}}`, `{"checks":null}`, `{}`, `[]`, `{"checks":[],"x":1}`,
		`{"checks":[{"namespace":"ns","identifier":"x","limit":1,"duration":1000}],"checks":[]}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	seeds = append(seeds,
		twMP(twMap{{"checks", []any{twGoodBatchCheck(), twGoodBatchCheck().Without("namespace")}}}),
		twMP(twMap{{"checks", []any{twGoodBatchCheck().With("namespace", []byte("bin-ns"))}}}),
		twMP(twMap{{"checks", twRaw{0xdd, 0, 0, 0, 1}}}),
		twMP(twMap{{"checks", nil}}),
	)
	return seeds
}

func FuzzDecodeBatchRequest(f *testing.F) {
	for _, s := range twBatchSeeds() {
		f.Add(true, s)
		f.Add(false, s)
	}
	f.Fuzz(func(t *testing.T, isJSON bool, input []byte) {
		enc := twEncodingOf(isJSON)
		body := bytes.Clone(input)
		req, err := DecodeBatchRequest(enc, body)
		if err != nil {
			twCheckDecodeError(t, err)
			if req.Checks != nil {
				t.Fatalf("%+v returned with error %v", req, err)
			}
			return
		}
		if n := len(req.Checks); n < 1 || n > 100 {
			t.Fatalf("%d checks accepted", n)
		}
		for _, c := range req.Checks {
			twCheckNamespace(t, c.Namespace)
			twCheckRules(t, c.CheckRequest)
		}
		if enc == JSON {
			top, ok := twDecodeStd(t, body).(map[string]any)
			if !ok || len(top) != 1 {
				t.Fatalf("encoding/json sees %#v", top)
			}
			checks, ok := top["checks"].([]any)
			if !ok || len(checks) != len(req.Checks) {
				t.Fatalf("encoding/json sees checks %#v", top["checks"])
			}
			for i, c := range checks {
				obj, ok := c.(map[string]any)
				if !ok {
					t.Fatalf("checks[%d]: encoding/json sees %#v", i, c)
				}
				twEncodingJSONView(t, obj, req.Checks[i], true)
			}
		}
		want := BatchRequest{Checks: make([]BatchCheck, len(req.Checks))}
		for i, c := range req.Checks {
			want.Checks[i] = BatchCheck{Namespace: strings.Clone(c.Namespace), CheckRequest: c.CheckRequest}
			want.Checks[i].Identifier = strings.Clone(c.Identifier)
		}
		for i := range body {
			body[i] ^= 0xa5
		}
		if !reflect.DeepEqual(req, want) {
			t.Fatalf("decoded request aliases the body")
		}
		for _, e := range twEncodings {
			again := AppendBatchRequest(nil, e.enc, req)
			exp := BatchRequest{Checks: make([]BatchCheck, len(req.Checks))}
			tooLong := false
			for i, c := range req.Checks {
				c.Identifier = twReencoded(e.enc, c.Identifier)
				tooLong = tooLong || len(c.Identifier) > MaxIdentifierLen
				exp.Checks[i] = c
			}
			got, err := DecodeBatchRequest(e.enc, again)
			if tooLong || len(again) > MaxBatchBody {
				continue // sanitizing or escaping may legitimately grow past a limit
			}
			if err != nil || !reflect.DeepEqual(got, exp) {
				t.Fatalf("%s: %+v re-encoded as %q decodes to %+v, %v", e.name, req, again, got, err)
			}
		}
	})
}

func FuzzDecodeCheckResponse(f *testing.F) {
	for _, e := range twEncodings {
		for _, r := range twSampleResponses {
			f.Add(e.enc == JSON, AppendCheckResponse(nil, e.enc, r))
		}
		f.Add(e.enc == JSON, AppendBatchResponse(nil, e.enc, BatchResponse{Success: true, Results: twSampleResponses}))
		f.Add(e.enc == JSON, AppendError(nil, e.enc, "limit must be an integer \xff"))
	}
	for _, s := range []string{
		`{"success":true,"limit":1,"remaining":0,"reset":5}`,
		`{"success":1,"limit":1,"remaining":0,"reset":5,"retry_after":0}`,
		`{"success":true,"limit":1.5,"remaining":0,"reset":5,"retry_after":0,"x":[1,{"y":null}]}`,
		`{"success":true,"results":[{"success":true}]}`,
		`{"error":"\ud800"}`, `[]`, `{`, ``,
	} {
		f.Add(true, []byte(s))
		f.Add(false, []byte(s))
	}
	f.Add(false, twMP(twMap{{"success", true}, {"limit", 1}, {"remaining", 0}, {"reset", 5}, {"retry_after", uint64(math.MaxUint64)}}))
	f.Add(false, twMP(twMap{{"extra", []any{twMap{}, nil, 1.5}}, {"error", []byte("bin")}}))
	f.Fuzz(func(t *testing.T, isJSON bool, input []byte) {
		enc := twEncodingOf(isJSON)
		body := bytes.Clone(input)
		var bre *BadRequestError

		r, err := DecodeCheckResponse(enc, body)
		if err != nil {
			if errors.As(err, &bre) || !strings.HasPrefix(err.Error(), "invalid check response: ") {
				t.Fatalf("error %v (%T)", err, err)
			}
		} else {
			if enc == JSON {
				twDecodeStd(t, body)
			}
			if got, err := DecodeCheckResponse(enc, AppendCheckResponse(nil, enc, r)); err != nil || got != r {
				t.Fatalf("%+v round-trips to %+v, %v", r, got, err)
			}
		}

		br, err := DecodeBatchResponse(enc, body)
		if err != nil {
			if errors.As(err, &bre) || !strings.HasPrefix(err.Error(), "invalid batch response: ") {
				t.Fatalf("error %v (%T)", err, err)
			}
		} else {
			if br.Results == nil {
				t.Fatalf("nil results decoded")
			}
			if got, err := DecodeBatchResponse(enc, AppendBatchResponse(nil, enc, br)); err != nil || !reflect.DeepEqual(got, br) {
				t.Fatalf("%+v round-trips to %+v, %v", br, got, err)
			}
		}

		msg, err := DecodeError(enc, body)
		if err != nil {
			if errors.As(err, &bre) || !strings.HasPrefix(err.Error(), "invalid error response: ") {
				t.Fatalf("error %v (%T)", err, err)
			}
		} else if got, err := DecodeError(enc, AppendError(nil, enc, msg)); err != nil || got != twReencoded(enc, msg) {
			t.Fatalf("%q round-trips to %q, %v", msg, got, err)
		}
	})
}
