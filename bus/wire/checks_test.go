package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// twItemErrs returns the error text of each item, "" for a good one.
func twItemErrs(items []ChecksItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		if it.Err != nil {
			out[i] = it.Err.Error()
		}
	}
	return out
}

// A checks message with good and bad checks decodes every good one and
// explains each bad one in the words the batch endpoint uses, without its
// index; the same body in JSON and msgpack gives the same items.
func TestDecodeChecksRequestMixesGoodAndBadChecks(t *testing.T) {
	mc := twGoodBatchCheck()
	mpBody := twMP(twMap{{"checks", []any{
		mc,
		mc.With("limit", 1.5),
		mc.Without("namespace"),
		[]any{1, 2},
		mc.With("workspace", "w"),
		mc.With("identifier", strings.Repeat("x", 513)),
		twMap{{"identifier", "u2"}, {"limit", 5}, {"duration", 1000}, {"namespace", "n"}},
		mc.With("namespace", "a.b"),
		twMap{{"namespace", "ns"}, {"namespace", "ns"}, {"identifier", "x"}, {"limit", 1}, {"duration", 1000}},
		mc.With("cost", -3),
		twMap{{1, "x"}},
		mc.With("identifier", twMap{{"deep", []any{[]any{1}}}}),
	}}})
	jc := `{"namespace":"api_v1-x","identifier":"user-1","limit":100,"duration":60000,"cost":2}`
	jsonBody := `{"checks":[` + strings.Join([]string{
		jc,
		`{"namespace":"api_v1-x","identifier":"user-1","limit":1.5,"duration":60000,"cost":2}`,
		`{"identifier":"user-1","limit":100,"duration":60000,"cost":2}`,
		`[1,2]`,
		`{"namespace":"api_v1-x","identifier":"user-1","limit":100,"duration":60000,"cost":2,"workspace":"w"}`,
		`{"namespace":"api_v1-x","identifier":"` + strings.Repeat("x", 513) + `","limit":100,"duration":60000,"cost":2}`,
		`{"identifier":"u2","limit":5,"duration":1000,"namespace":"n"}`,
		`{"namespace":"a.b","identifier":"user-1","limit":100,"duration":60000,"cost":2}`,
		`{"namespace":"ns","namespace":"ns","identifier":"x","limit":1,"duration":1000}`,
		`{"namespace":"api_v1-x","identifier":"user-1","limit":100,"duration":60000,"cost":-3}`,
		`7`,
		`{"namespace":"api_v1-x","identifier":{"deep":[[1]]},"limit":100,"duration":60000,"cost":2}`,
	}, ",") + `]}`
	wantErrs := []string{
		"",
		"limit must be an integer",
		"namespace is required",
		"", // check not a map: encoding-specific, below
		`unknown field "workspace"`,
		"identifier must be 1 to 512 bytes, got 513",
		"",
		"namespace must be 1 to 64 characters of [A-Za-z0-9_-]",
		`duplicate field "namespace"`,
		"cost must be between 0 and 1000000000000000, got -3",
		"", // encoding-specific, below
		"identifier must be a string",
	}
	good := []BatchCheck{
		{Namespace: "api_v1-x", CheckRequest: CheckRequest{"user-1", 100, 60000, 2, false, false, 0}},
		{Namespace: "n", CheckRequest: CheckRequest{"u2", 5, 1000, 1, false, false, 0}},
	}
	for name, tt := range map[string]struct {
		enc            Encoding
		body           []byte
		notMap, badKey string
	}{
		"json":    {JSON, []byte(jsonBody), "check must be a JSON object", "check must be a JSON object"},
		"msgpack": {Msgpack, mpBody, "check must be a msgpack map", "msgpack map keys must be strings"},
	} {
		t.Run(name, func(t *testing.T) {
			items, err := DecodeChecksRequestView(tt.enc, tt.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := append([]string(nil), wantErrs...)
			want[3], want[10] = tt.notMap, tt.badKey
			if got := twItemErrs(items); !reflect.DeepEqual(got, want) {
				t.Fatalf("errors\n got %q\nwant %q", got, want)
			}
			for _, it := range items {
				if it.Err != nil {
					twCheckDecodeError(t, it.Err)
				}
			}
			if got := []BatchCheck{items[0].BatchCheck, items[6].BatchCheck}; !reflect.DeepEqual(got, good) {
				t.Fatalf("good checks %+v, want %+v", got, good)
			}
		})
	}
}

// A body that cannot be read as a whole is refused as a whole, in the
// batch's words where the rule is the same.
func TestDecodeChecksRequestRefusesUnreadableBodies(t *testing.T) {
	mc := twGoodBatchCheck()
	jc := `{"namespace":"ns","identifier":"x","limit":1,"duration":1000}`
	many := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = mc
		}
		return out
	}
	manyJSON := strings.TrimSuffix(strings.Repeat(jc+",", MaxChecks+1), ",")
	mchecks := func(checks ...any) []byte { return twMP(twMap{{"checks", checks}}) }
	tests := []struct {
		name   string
		enc    Encoding
		body   []byte
		want   string
		prefix bool
	}{
		{"json/empty", JSON, nil, "empty request body", false},
		{"msgpack/empty", Msgpack, []byte{}, "empty request body", false},
		{"json/oversized", JSON, []byte(`{"checks":[` + strings.Repeat(" ", MaxChecksBody) + `]}`), "request body of 1048589 bytes exceeds the limit of 1048576 bytes", false},
		{"json/not object", JSON, []byte(`[` + jc + `]`), "body must be a JSON object", false},
		{"msgpack/not map", Msgpack, twMP([]any{mc}), "body must be a msgpack map", false},
		{"json/malformed", JSON, []byte(`{"checks":[` + jc), "malformed JSON: ", true},
		{"msgpack/truncated in a check", Msgpack, mchecks(mc)[:20], "checks[0]: malformed msgpack: unexpected end of data", false},
		{"msgpack/truncated after a bad check", Msgpack, mchecks(mc, mc.With("limit", "x"))[:len(mchecks(mc))+12], "checks[1]: malformed msgpack: unexpected end of data", false},
		{"msgpack/invalid byte", Msgpack, mchecks(mc, twRaw{0xc1}), "checks[1]: malformed msgpack: ", true},
		{"msgpack/trailing", Msgpack, append(mchecks(mc), 0xc0), "malformed msgpack: 1 trailing bytes after the map", false},
		{"json/checks missing", JSON, []byte(`{}`), "checks is required", false},
		{"msgpack/checks missing", Msgpack, twMP(twMap{}), "checks is required", false},
		{"json/unknown field", JSON, []byte(`{"checks":[` + jc + `],"x":1}`), `unknown field "x"`, false},
		{"msgpack/unknown field", Msgpack, twMP(twMap{{"checks", []any{mc}}, {"x", 1}}), `unknown field "x"`, false},
		{"json/duplicate checks", JSON, []byte(`{"checks":[` + jc + `],"checks":[` + jc + `]}`), `duplicate field "checks"`, false},
		{"msgpack/duplicate checks", Msgpack, twMP(twMap{{"checks", []any{mc}}, {"checks", []any{mc}}}), `duplicate field "checks"`, false},
		{"json/checks not array", JSON, []byte(`{"checks":{}}`), "checks must be an array", false},
		{"msgpack/checks nil", Msgpack, twMP(twMap{{"checks", nil}}), "checks must be an array", false},
		{"json/zero checks", JSON, []byte(`{"checks":[]}`), "checks must hold 1 to 1000 checks, got 0", false},
		{"msgpack/zero checks", Msgpack, mchecks(), "checks must hold 1 to 1000 checks, got 0", false},
		{"json/1001 checks", JSON, []byte(`{"checks":[` + manyJSON + `]}`), "checks must hold 1 to 1000 checks, got 1001", false},
		{"msgpack/1001 checks", Msgpack, mchecks(many(MaxChecks + 1)...), "checks must hold 1 to 1000 checks, got 1001", false},
		{"msgpack/huge array header", Msgpack, twMP(twMap{{"checks", twRaw{0xdd, 0xff, 0xff, 0xff, 0xff}}}), "checks must hold 1 to 1000 checks, got 4294967295", false},
		{"msgpack/short array", Msgpack, twMP(twMap{{"checks", twRaw{0xdc, 0, 3}}}), "checks[0]: malformed msgpack: unexpected end of data", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items, err := DecodeChecksRequestView(tt.enc, tt.body, make([]ChecksItem, 0, 4))
			twWantBadRequest(t, err, tt.want, tt.prefix)
			if len(items) != 0 {
				t.Fatalf("%d items returned with an error", len(items))
			}
		})
	}
}

// 1000 checks of 64-character namespaces and 512-byte identifiers fit, in
// both encodings, and decode to what was written.
func TestDecodeChecksRequestTakesTheLargestMessage(t *testing.T) {
	var checks []BatchCheck
	for range MaxChecks {
		checks = append(checks, BatchCheck{Namespace: strings.Repeat("N", 64),
			CheckRequest: CheckRequest{strings.Repeat("i", 512), MaxLimit, MaxDuration, MaxCost, false, false, 0}})
	}
	for _, enc := range []Encoding{JSON, Msgpack} {
		body := AppendChecksRequest(nil, enc, checks)
		items, err := DecodeChecksRequestView(enc, body, nil)
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		for i, it := range items {
			if it.Err != nil || it.BatchCheck != checks[i] {
				t.Fatalf("%v: item %d is %+v", enc, i, it)
			}
		}
	}
}

// Responses round-trip in both encodings; a 400 result has the contract's
// shape {"error": ...} and other errors carry their code.
func TestChecksResponseRoundTrip(t *testing.T) {
	r := ChecksResponse{Results: []ChecksResult{
		{CheckResponse: CheckResponse{Success: true, Limit: 10, Remaining: 9, Reset: 1700000060000}},
		{Error: "limit must be an integer", Code: 400},
		{CheckResponse: CheckResponse{Success: false, Limit: 0, Remaining: 0, Reset: 1, RetryAfter: RetryNever}},
		{Error: "limiter is shutting down", Code: 503},
		{Error: "internal error", Code: 500},
		{CheckResponse: CheckResponse{Success: true, Limit: 3, Remaining: 2, Reset: 1, Override: "user_*"}},
	}}
	for _, enc := range []Encoding{JSON, Msgpack} {
		body := AppendChecksResponse(nil, enc, r)
		got, err := DecodeChecksResponse(enc, body)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("%v: %+v, %v; want %+v", enc, got, err, r)
		}
	}
	body := AppendChecksResponse(nil, JSON, r)
	var generic map[string][]map[string]any
	if err := json.Unmarshal(body, &generic); err != nil {
		t.Fatal(err)
	}
	if res := generic["results"][1]; len(res) != 1 || res["error"] != "limit must be an integer" {
		t.Fatalf("a 400 result is %v, want only its error", res)
	}
	if res := generic["results"][3]; res["code"] != 503.0 {
		t.Fatalf("a 503 result is %v", res)
	}
	// Unknown keys are ignored, a missing key of a decision is not.
	mp := twMP(twMap{{"v", 2}, {"results", []any{twMap{{"error", "x"}, {"hint", 1}}, twMap{{"success", true}}}}})
	if _, err := DecodeChecksResponse(Msgpack, mp); err == nil || !strings.Contains(err.Error(), "results[1]: limit is required") {
		t.Fatalf("missing key: %v", err)
	}
}

func twChecksSeeds() [][]byte {
	var seeds [][]byte
	one := []BatchCheck{{Namespace: "ns", CheckRequest: CheckRequest{"user-1", 100, 60000, 1, false, false, 0}}}
	mixed := []BatchCheck{
		{Namespace: "a", CheckRequest: CheckRequest{"x\x00\"\\", 0, MinDuration, 0, false, false, 0}},
		{Namespace: "a.b", CheckRequest: CheckRequest{"é😀", MaxLimit, MaxDuration, MaxCost, false, false, 0}},
		{Namespace: strings.Repeat("Z", 64), CheckRequest: CheckRequest{"", -1, 10, -1, false, false, 0}},
	}
	for _, e := range twEncodings {
		for _, r := range [][]BatchCheck{one, mixed, nil} {
			seeds = append(seeds, AppendChecksRequest(nil, e.enc, r))
		}
	}
	for _, s := range []string{
		`{"checks":[{"namespace":"ns","identifier":"x","limit":1,"duration":1000},7,[],{"x":1}]}`,
		`{"checks":{}}`, `{}`, `[]`, `{"checks":[],"x":1}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	mc := twGoodBatchCheck()
	seeds = append(seeds,
		twMP(twMap{{"checks", []any{mc, mc.Without("namespace"), mc.With("limit", []any{twMap{{"a", 1}}}), twRaw{0xc1}}}}),
		twMP(twMap{{"checks", twRaw{0xdd, 0, 0, 0, 1}}}),
	)
	return seeds
}

// Whatever the body, the decoder refuses it with a *BadRequestError or
// returns 1 to 1000 items, each a valid check or a *BadRequestError; what it
// accepts in JSON encoding/json reads the same way, and good checks survive
// re-encoding.
func FuzzDecodeChecksRequest(f *testing.F) {
	for _, s := range twChecksSeeds() {
		f.Add(true, s)
		f.Add(false, s)
	}
	f.Fuzz(func(t *testing.T, isJSON bool, input []byte) {
		enc := twEncodingOf(isJSON)
		body := bytes.Clone(input)
		items, err := DecodeChecksRequestView(enc, body, nil)
		if err != nil {
			twCheckDecodeError(t, err)
			if len(items) != 0 {
				t.Fatalf("%d items returned with error %v", len(items), err)
			}
			return
		}
		if n := len(items); n < 1 || n > MaxChecks {
			t.Fatalf("%d checks accepted", n)
		}
		var good []BatchCheck
		for _, it := range items {
			if it.Err != nil {
				twCheckDecodeError(t, it.Err)
				if it.BatchCheck != (BatchCheck{}) {
					t.Fatalf("bad item keeps fields %+v", it.BatchCheck)
				}
				continue
			}
			twCheckNamespace(t, it.Namespace)
			twCheckRules(t, it.CheckRequest)
			good = append(good, BatchCheck{Namespace: strings.Clone(it.Namespace),
				CheckRequest: CheckRequest{strings.Clone(it.Identifier), it.Limit, it.Duration, it.Cost, false, false, 0}})
		}
		if enc == JSON {
			top, ok := twDecodeStd(t, body).(map[string]any)
			if !ok || len(top) != 1 {
				t.Fatalf("encoding/json sees %#v", top)
			}
			checks, ok := top["checks"].([]any)
			if !ok || len(checks) != len(items) {
				t.Fatalf("encoding/json sees checks %#v", top["checks"])
			}
			for i, c := range checks {
				if obj, ok := c.(map[string]any); ok && items[i].Err == nil {
					twEncodingJSONView(t, obj, items[i].BatchCheck, true)
				}
			}
		}
		if len(good) == 0 {
			return
		}
		for _, e := range twEncodings {
			exp := make([]BatchCheck, len(good))
			tooLong := false
			for i, c := range good {
				c.Identifier = twReencoded(e.enc, c.Identifier)
				tooLong = tooLong || len(c.Identifier) > MaxIdentifierLen
				exp[i] = c
			}
			again := AppendChecksRequest(nil, e.enc, good)
			if tooLong || len(again) > MaxChecksBody {
				continue
			}
			got, err := DecodeChecksRequestView(e.enc, again, nil)
			if err != nil || len(got) != len(exp) {
				t.Fatalf("%s: %+v re-encoded decodes to %d items, %v", e.name, good, len(got), err)
			}
			for i := range got {
				if got[i].Err != nil || got[i].BatchCheck != exp[i] {
					t.Fatalf("%s: item %d re-encoded is %+v, want %+v", e.name, i, got[i], exp[i])
				}
			}
		}
	})
}

// The decoder of the usual msgpack shape allocates nothing once its item
// slice has room.
func TestDecodeChecksRequestMsgpackDoesNotAllocate(t *testing.T) {
	if twRaceEnabled() {
		t.Skip("allocations are not measured under the race detector")
	}
	checks := make([]BatchCheck, 64)
	for i := range checks {
		checks[i] = BatchCheck{Namespace: "api", CheckRequest: CheckRequest{"user-" + strings.Repeat("x", i%7), 100, 60000, 1, false, false, 0}}
	}
	body := AppendChecksRequest(nil, Msgpack, checks)
	items := make([]ChecksItem, 0, 64)
	allocs := testing.AllocsPerRun(200, func() {
		var err error
		if items, err = DecodeChecksRequestView(Msgpack, body, items); err != nil || len(items) != 64 {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per message, want 0", allocs)
	}
}

func BenchmarkDecodeChecksRequest(b *testing.B) {
	checks := make([]BatchCheck, 64)
	for i := range checks {
		checks[i] = BatchCheck{Namespace: "api", CheckRequest: CheckRequest{"user-" + strings.Repeat("x", i%7), 100, 60000, 1, false, false, 0}}
	}
	for _, enc := range []Encoding{Msgpack, JSON} {
		body := AppendChecksRequest(nil, enc, checks)
		items := make([]ChecksItem, 0, 64)
		b.Run(enc.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				items, _ = DecodeChecksRequestView(enc, body, items)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/check")
		})
	}
}

// Whatever a limiter (or anything on its subject) replies, the client's
// decoder returns a response or an error without panicking; what it
// accepts re-encodes to the same response.
func FuzzDecodeChecksResponse(f *testing.F) {
	sample := ChecksResponse{Results: []ChecksResult{
		{CheckResponse: CheckResponse{Success: true, Limit: 10, Remaining: 9, Reset: 1}},
		{Error: "limit must be an integer", Code: 400},
		{Error: "limiter is shutting down", Code: 503},
		{CheckResponse: CheckResponse{Success: true, Limit: 2, Reset: 1, ShadowDenied: true, Override: "org:*:admin"}},
	}}
	for _, e := range twEncodings {
		f.Add(e.enc == JSON, AppendChecksResponse(nil, e.enc, sample))
		f.Add(e.enc == JSON, AppendChecksResponse(nil, e.enc, ChecksResponse{}))
	}
	f.Add(false, twMP(twMap{{"results", []any{twMap{{"error", ""}}, 1}}}))
	f.Fuzz(func(t *testing.T, isJSON bool, body []byte) {
		enc := twEncodingOf(isJSON)
		r, err := DecodeChecksResponse(enc, body)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "invalid checks response: ") {
				t.Fatalf("error %q lacks its prefix", err)
			}
			return
		}
		for _, res := range r.Results {
			if res.Error == "" && res.Code != 0 || res.Error != "" && res.CheckResponse != (CheckResponse{}) {
				t.Fatalf("result %+v is neither a decision nor an error", res)
			}
		}
		again, err := DecodeChecksResponse(enc, AppendChecksResponse(nil, enc, r))
		if err != nil || len(again.Results) != len(r.Results) {
			t.Fatalf("%+v re-encoded: %+v, %v", r, again, err)
		}
		for i := range r.Results {
			w := r.Results[i]
			if w.Error != "" && w.Code == 0 {
				w.Code = 400 // written in the contract's 400 shape
			}
			if enc == JSON {
				w.Error = twJSONSanitize(w.Error)
			}
			if again.Results[i] != w {
				t.Fatalf("result %d: %+v re-encoded as %+v", i, w, again.Results[i])
			}
		}
	})
}
