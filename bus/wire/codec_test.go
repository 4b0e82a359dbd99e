package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/msgptest"

	"github.com/sluicehq/sluice/window"
)

// --- msgpack test builder ---------------------------------------------------

type (
	twKV  = msgptest.KV
	twMap = msgptest.Map
	twRaw = msgptest.Raw
)

// twMP encodes v, each Go type in its own msgpack form.
func twMP(v any) []byte { return msgptest.Encode(v) }

// twGoodCheck is a valid single check in msgpack form.
var twGoodCheck = twMap{
	{"identifier", "user-1"},
	{"limit", 100},
	{"duration", 60000},
	{"cost", 2},
}

func twGoodBatchCheck() twMap { return append(twMap{{"namespace", "api_v1-x"}}, twGoodCheck...) }

const twGoodCheckJSON = `{"identifier":"user-1","limit":100,"duration":60000,"cost":2}`

// twJSONCheck returns the JSON of twGoodCheck with field name replaced by the twRaw
// JSON text value ("" deletes it).
func twJSONCheck(name, value string) string {
	fields := []struct{ k, v string }{
		{"identifier", `"user-1"`}, {"limit", "100"}, {"duration", "60000"}, {"cost", "2"},
	}
	var parts []string
	found := false
	for _, f := range fields {
		if f.k == name {
			found = true
			if value == "" {
				continue
			}
			f.v = value
		}
		parts = append(parts, `"`+f.k+`":`+f.v)
	}
	if !found && value != "" {
		parts = append(parts, `"`+name+`":`+value)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func twWantBadRequest(t *testing.T, err error, want string, prefix bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	var bre *BadRequestError
	if !errors.As(err, &bre) {
		t.Fatalf("error %v (%T) is not a *BadRequestError", err, err)
	}
	if bre.Error() != bre.Msg {
		t.Fatalf("Error() = %q, Msg = %q", bre.Error(), bre.Msg)
	}
	if prefix {
		if !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("error %q, want prefix %q", err, want)
		}
	} else if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// --- single check -----------------------------------------------------------

func TestDecodeCheckRequestValid(t *testing.T) {
	want := CheckRequest{Identifier: "user-1", Limit: 100, Duration: 60000, Cost: 2}
	tests := []struct {
		name string
		enc  Encoding
		body []byte
		want CheckRequest
	}{
		{"json", JSON, []byte(twGoodCheckJSON), want},
		{"json whitespace and order", JSON, []byte(" \t\r\n{ \"cost\" : 2 , \"duration\":60000,\"limit\":100,\"identifier\":\"user-1\" } \n"), want},
		{"json cost default", JSON, []byte(twJSONCheck("cost", "")), CheckRequest{"user-1", 100, 60000, 1, false, false, 0}},
		{"json cost zero", JSON, []byte(twJSONCheck("cost", "0")), CheckRequest{"user-1", 100, 60000, 0, false, false, 0}},
		{"json bounds max", JSON, []byte(`{"identifier":"x","limit":1000000000000000,"duration":31622400000,"cost":1000000000000000}`),
			CheckRequest{"x", MaxLimit, MaxDuration, MaxCost, false, false, 0}},
		{"json bounds min", JSON, []byte(`{"identifier":"x","limit":0,"duration":1000,"cost":-0}`), CheckRequest{"x", 0, MinDuration, 0, false, false, 0}},
		{"json escapes", JSON, []byte(`{"identifier":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\u0000","limit":1,"duration":1000}`),
			CheckRequest{"a\"b\\c/d\b\f\n\r\té😀\x00", 1, 1000, 1, false, false, 0}},
		{"json lone surrogate", JSON, []byte(`{"identifier":"\ud800x\udc00\ud800\u0041","limit":1,"duration":1000}`),
			CheckRequest{"\uFFFDx\uFFFD\uFFFDA", 1, 1000, 1, false, false, 0}},
		{"json twRaw non-utf8 kept", JSON, []byte("{\"identifier\":\"\xff\xfe\",\"limit\":1,\"duration\":1000}"), CheckRequest{"\xff\xfe", 1, 1000, 1, false, false, 0}},
		{"json escaped key", JSON, []byte(`{"\u0069dentifier":"user-1","limit":100,"duration":60000,"cost":2}`), want},
		{"json identifier 512", JSON, []byte(twJSONCheck("identifier", `"`+strings.Repeat("a", 512)+`"`)),
			CheckRequest{strings.Repeat("a", 512), 100, 60000, 2, false, false, 0}},
		{"json identifier 512 escaped", JSON, []byte(twJSONCheck("identifier", `"`+strings.Repeat(`\u0001`, 512)+`"`)),
			CheckRequest{strings.Repeat("\x01", 512), 100, 60000, 2, false, false, 0}},
		{"msgpack", Msgpack, twMP(twGoodCheck), want},
		{"msgpack cost default", Msgpack, twMP(twGoodCheck.Without("cost")), CheckRequest{"user-1", 100, 60000, 1, false, false, 0}},
		{"msgpack bin identifier", Msgpack, twMP(twGoodCheck.With("identifier", []byte{0, 0xff, 'x'})), CheckRequest{"\x00\xffx", 100, 60000, 2, false, false, 0}},
		{"msgpack bin keys", Msgpack, twMP(twMap{{[]byte("identifier"), "user-1"}, {[]byte("limit"), 100}, {[]byte("duration"), 60000}, {[]byte("cost"), 2}}), want},
		{"msgpack int widths", Msgpack, twMP(twMap{{"identifier", "user-1"}, {"limit", uint8(100)}, {"duration", int32(60000)}, {"cost", int8(2)}}), want},
		{"msgpack uint widths", Msgpack, twMP(twMap{{"identifier", "user-1"}, {"limit", uint64(100)}, {"duration", uint32(60000)}, {"cost", uint16(2)}}), want},
		{"msgpack int64 encodings", Msgpack, twMP(twMap{{"identifier", "x"}, {"limit", twRaw{0xd3, 0, 0, 0, 0, 0, 0, 0, 100}}, {"duration", twRaw{0xcf, 0, 0, 0, 0, 0, 0, 0x03, 0xe8}}, {"cost", int16(0)}}),
			CheckRequest{"x", 100, 1000, 0, false, false, 0}},
		{"msgpack bounds max", Msgpack, twMP(twMap{{"identifier", "x"}, {"limit", uint64(MaxLimit)}, {"duration", int64(MaxDuration)}, {"cost", int64(MaxCost)}}),
			CheckRequest{"x", MaxLimit, MaxDuration, MaxCost, false, false, 0}},
		{"msgpack identifier 512", Msgpack, twMP(twGoodCheck.With("identifier", strings.Repeat("é", 256))), CheckRequest{strings.Repeat("é", 256), 100, 60000, 2, false, false, 0}},
		{"json shadow", JSON, []byte(twJSONCheck("shadow", "true")), CheckRequest{"user-1", 100, 60000, 2, true, false, 0}},
		{"json shadow false", JSON, []byte(twJSONCheck("shadow", "false")), want},
		{"msgpack shadow", Msgpack, twMP(twGoodCheck.With("shadow", true)), CheckRequest{"user-1", 100, 60000, 2, true, false, 0}},
		{"msgpack shadow false", Msgpack, twMP(twGoodCheck.With("shadow", false)), want},
		{"msgpack map16", Msgpack, append(twRaw{0xde, 0, 3}, twMP(twGoodCheck.Without("cost"))[1:]...), CheckRequest{"user-1", 100, 60000, 1, false, false, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeCheckRequest(tt.enc, tt.body)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDecodeCheckRequestErrors(t *testing.T) {
	const (
		limitRange    = "limit must be between 0 and 1000000000000000, got "
		durationRange = "duration must be between 1000 and 31622400000 milliseconds, got "
		costRange     = "cost must be between 0 and 1000000000000000, got "
	)
	type tc struct {
		name   string
		enc    Encoding
		body   []byte
		want   string
		prefix bool // want is a prefix of the message
	}
	j := func(name, body, want string) tc {
		return tc{name: "json/" + name, enc: JSON, body: []byte(body), want: want}
	}
	jp := func(name, body, want string) tc {
		return tc{name: "json/" + name, enc: JSON, body: []byte(body), want: want, prefix: true}
	}
	m := func(name string, body []byte, want string) tc {
		return tc{name: "msgpack/" + name, enc: Msgpack, body: body, want: want}
	}
	mpGood := twMP(twGoodCheck)
	tests := []tc{
		// Size.
		j("empty", "", "empty request body"),
		m("empty", nil, "empty request body"),
		j("oversized", twJSONCheck("identifier", `"`+strings.Repeat("a", MaxCheckBody)+`"`),
			"request body of 4151 bytes exceeds the limit of 4096 bytes"),
		m("oversized", twMP(twGoodCheck.With("identifier", strings.Repeat("a", MaxCheckBody))),
			"request body of 4138 bytes exceeds the limit of 4096 bytes"),
		// Structure.
		j("array", `[1,2]`, "body must be a JSON object"),
		j("string", `"x"`, "body must be a JSON object"),
		j("null", `null`, "body must be a JSON object"),
		jp("blank", "   ", "malformed JSON: "),
		jp("truncated", `{"identifier":"x","limit":1`, "malformed JSON: "),
		jp("truncated string", `{"identifier":"x`, "malformed JSON: "),
		jp("trailing garbage", twGoodCheckJSON+`x`, "malformed JSON: unexpected tail"),
		jp("two objects", twGoodCheckJSON+twGoodCheckJSON, "malformed JSON: unexpected tail"),
		jp("trailing comma", `{"identifier":"x","limit":1,"duration":1000,}`, "malformed JSON: "),
		jp("single quotes", `{'identifier':"x"}`, "malformed JSON: "),
		jp("unquoted key", `{identifier:"x"}`, "malformed JSON: "),
		j("control char in string", twJSONCheck("identifier", "\"a\nb\""), "malformed JSON: control character 0x0a in string"),
		j("bad escape", twJSONCheck("identifier", `"a\qb"`), "malformed JSON: invalid escape sequence in string"),
		j("bad unicode escape", twJSONCheck("identifier", `"a\u12g4"`), "malformed JSON: invalid escape sequence in string"),
		j("short unicode escape", twJSONCheck("identifier", `"a\u12"`), "malformed JSON: invalid escape sequence in string"),
		m("array", twMP([]any{1, 2}), "body must be a msgpack map"),
		m("int", twMP(7), "body must be a msgpack map"),
		m("string", twMP("{}"), "body must be a msgpack map"),
		m("nil", twMP(nil), "body must be a msgpack map"),
		m("invalid prefix", []byte{0xc1}, "malformed msgpack: unrecognized type prefix 0xc1"),
		m("invalid prefix value", twMP(twGoodCheck.With("limit", twRaw{0xc1})), "malformed msgpack: unrecognized type prefix 0xc1"),
		m("truncated header", []byte{0xde, 0}, "malformed msgpack: unexpected end of data"),
		m("truncated value", mpGood[:len(mpGood)-1], "malformed msgpack: unexpected end of data"),
		m("truncated string", mpGood[:5], "malformed msgpack: unexpected end of data"),
		m("truncated after key", twMP(twMap{{"identifier", "x"}, {"limit", twRaw{}}}), "malformed msgpack: unexpected end of data"),
		m("missing pair", twMP(twGoodCheck)[:len(mpGood)-6], "malformed msgpack: unexpected end of data"),
		m("trailing byte", append(twMP(twGoodCheck), 0), "malformed msgpack: 1 trailing bytes after the map"),
		m("two maps", append(twMP(twGoodCheck), mpGood...), "malformed msgpack: 46 trailing bytes after the map"),
		m("int key", twMP(twMap{{1, "x"}}), "msgpack map keys must be strings"),
		m("nil key", twMP(twMap{{nil, "x"}}), "msgpack map keys must be strings"),
		// Keys.
		j("unknown field", twJSONCheck("cots", "1"), `unknown field "cots"`),
		j("namespace in single check", twJSONCheck("namespace", `"ns"`), `unknown field "namespace"`),
		j("duplicate field", `{"identifier":"x","limit":1,"limit":1,"duration":1000}`, `duplicate field "limit"`),
		j("duplicate escaped field", `{"identifier":"x","limit":1,"l\u0069mit":1,"duration":1000}`, `duplicate field "limit"`),
		j("long unknown field", twJSONCheck(strings.Repeat("k", 100), "1"), `unknown field "`+strings.Repeat("k", 64)+`"...`),
		m("unknown field", twMP(twGoodCheck.With("cots", 1)), `unknown field "cots"`),
		m("namespace in single check", twMP(twGoodCheck.With("namespace", "ns")), `unknown field "namespace"`),
		m("duplicate field", twMP(append(twGoodCheck, twKV{"limit", 1})), `duplicate field "limit"`),
		// Required.
		j("empty object", `{}`, "identifier is required"),
		j("missing identifier", twJSONCheck("identifier", ""), "identifier is required"),
		j("missing limit", twJSONCheck("limit", ""), "limit is required"),
		j("missing duration", twJSONCheck("duration", ""), "duration is required"),
		m("empty map", twMP(twMap{}), "identifier is required"),
		m("missing identifier", twMP(twGoodCheck.Without("identifier")), "identifier is required"),
		m("missing limit", twMP(twGoodCheck.Without("limit")), "limit is required"),
		m("missing duration", twMP(twGoodCheck.Without("duration")), "duration is required"),
		// Identifier.
		j("identifier number", twJSONCheck("identifier", "12"), "identifier must be a string"),
		j("identifier null", twJSONCheck("identifier", "null"), "identifier must be a string"),
		j("identifier bool", twJSONCheck("identifier", "true"), "identifier must be a string"),
		j("identifier array", twJSONCheck("identifier", `["x"]`), "identifier must be a string"),
		j("identifier object", twJSONCheck("identifier", `{"x":1}`), "identifier must be a string"),
		j("identifier empty", twJSONCheck("identifier", `""`), "identifier must be 1 to 512 bytes, got 0"),
		j("identifier 600", twJSONCheck("identifier", `"`+strings.Repeat("a", 600)+`"`), "identifier must be 1 to 512 bytes, got 600"),
		j("identifier 513 after unescape", twJSONCheck("identifier", `"`+strings.Repeat(`\u00e9`, 257)+`"`), "identifier must be 1 to 512 bytes, got 514"),
		m("identifier int", twMP(twGoodCheck.With("identifier", 12)), "identifier must be a string"),
		m("identifier nil", twMP(twGoodCheck.With("identifier", nil)), "identifier must be a string"),
		m("identifier float", twMP(twGoodCheck.With("identifier", 1.5)), "identifier must be a string"),
		m("identifier array", twMP(twGoodCheck.With("identifier", []any{"x"})), "identifier must be a string"),
		m("identifier map", twMP(twGoodCheck.With("identifier", twMap{})), "identifier must be a string"),
		m("identifier empty", twMP(twGoodCheck.With("identifier", "")), "identifier must be 1 to 512 bytes, got 0"),
		m("identifier empty bin", twMP(twGoodCheck.With("identifier", []byte{})), "identifier must be 1 to 512 bytes, got 0"),
		m("identifier 600", twMP(twGoodCheck.With("identifier", strings.Repeat("a", 600))), "identifier must be 1 to 512 bytes, got 600"),
		m("identifier 600 bin", twMP(twGoodCheck.With("identifier", bytes.Repeat([]byte{1}, 600))), "identifier must be 1 to 512 bytes, got 600"),
		// Shadow.
		j("shadow string", twJSONCheck("shadow", `"true"`), "shadow must be a boolean"),
		j("shadow null", twJSONCheck("shadow", "null"), "shadow must be a boolean"),
		j("shadow number", twJSONCheck("shadow", "1"), "shadow must be a boolean"),
		j("shadow twice", strings.Replace(twJSONCheck("shadow", "true"), "{", `{"shadow":false,`, 1), `duplicate field "shadow"`),
		m("shadow int", twMP(twGoodCheck.With("shadow", 1)), "shadow must be a boolean"),
		m("shadow nil", twMP(twGoodCheck.With("shadow", nil)), "shadow must be a boolean"),
		m("shadow string", twMP(twGoodCheck.With("shadow", "true")), "shadow must be a boolean"),
		// Limit.
		j("limit string", twJSONCheck("limit", `"100"`), "limit must be an integer"),
		j("limit null", twJSONCheck("limit", "null"), "limit must be an integer"),
		j("limit bool", twJSONCheck("limit", "false"), "limit must be an integer"),
		j("limit object", twJSONCheck("limit", "{}"), "limit must be an integer"),
		j("limit fraction", twJSONCheck("limit", "1.5"), "limit must be an integer"),
		j("limit point zero", twJSONCheck("limit", "100.0"), "limit must be an integer"),
		j("limit exponent", twJSONCheck("limit", "1e3"), "limit must be an integer"),
		j("limit exponent upper", twJSONCheck("limit", "1E+3"), "limit must be an integer"),
		j("limit negative exponent", twJSONCheck("limit", "-1.5e-3"), "limit must be an integer"),
		j("limit negative", twJSONCheck("limit", "-5"), limitRange+"-5"),
		j("limit above max", twJSONCheck("limit", "1000000000000001"), limitRange+"1000000000000001"),
		j("limit max int64", twJSONCheck("limit", "9223372036854775807"), limitRange+"9223372036854775807"),
		j("limit min int64", twJSONCheck("limit", "-9223372036854775808"), limitRange+"-9223372036854775808"),
		j("limit above int64", twJSONCheck("limit", "9223372036854775808"), limitRange+"9223372036854775808"),
		j("limit below int64", twJSONCheck("limit", "-9223372036854775809"), limitRange+"-9223372036854775809"),
		j("limit huge", twJSONCheck("limit", "99999999999999999999"), limitRange+"99999999999999999999"),
		j("limit leading zero", twJSONCheck("limit", "0100"), `malformed JSON: invalid number "0100"`),
		j("limit NaN", twJSONCheck("limit", "NaN"), `malformed JSON: invalid number "NaN"`),
		j("limit Inf", twJSONCheck("limit", "-Inf"), `malformed JSON: invalid number "-Inf"`),
		j("limit dot", twJSONCheck("limit", "1."), `malformed JSON: invalid number "1."`),
		j("limit plus", twJSONCheck("limit", "+1"), `malformed JSON: invalid number "+1"`),
		jp("limit minus", twJSONCheck("limit", "-"), "malformed JSON: "),
		j("limit minus zero-led", twJSONCheck("limit", "-01"), `malformed JSON: invalid number "-01"`),
		j("limit bad exponent", twJSONCheck("limit", "1e"), `malformed JSON: invalid number "1e"`),
		j("limit double dot", twJSONCheck("limit", "1.2.3"), `malformed JSON: invalid number "1.2.3"`),
		m("limit string", twMP(twGoodCheck.With("limit", "100")), "limit must be an integer"),
		m("limit nil", twMP(twGoodCheck.With("limit", nil)), "limit must be an integer"),
		m("limit bool", twMP(twGoodCheck.With("limit", true)), "limit must be an integer"),
		m("limit float64", twMP(twGoodCheck.With("limit", 100.0)), "limit must be an integer"),
		m("limit float32", twMP(twGoodCheck.With("limit", float32(100))), "limit must be an integer"),
		m("limit bin", twMP(twGoodCheck.With("limit", []byte{1})), "limit must be an integer"),
		m("limit array", twMP(twGoodCheck.With("limit", []any{1})), "limit must be an integer"),
		m("limit ext", twMP(twGoodCheck.With("limit", twRaw{0xd4, 1, 1})), "limit must be an integer"),
		m("limit negative fixint", twMP(twGoodCheck.With("limit", -5)), limitRange+"-5"),
		m("limit negative int8", twMP(twGoodCheck.With("limit", int8(-100))), limitRange+"-100"),
		m("limit negative int64", twMP(twGoodCheck.With("limit", int64(math.MinInt64))), limitRange+"-9223372036854775808"),
		m("limit above max", twMP(twGoodCheck.With("limit", int64(MaxLimit+1))), limitRange+"1000000000000001"),
		m("limit above max uint", twMP(twGoodCheck.With("limit", uint64(MaxLimit+1))), limitRange+"1000000000000001"),
		m("limit max uint64", twMP(twGoodCheck.With("limit", uint64(math.MaxUint64))), limitRange+"18446744073709551615"),
		m("limit int8 encoding of negative", twMP(twGoodCheck.With("limit", twRaw{0xd0, 0xff})), limitRange+"-1"),
		// Duration.
		j("duration 10", twJSONCheck("duration", "10"), durationRange+"10"),
		j("duration 0", twJSONCheck("duration", "0"), durationRange+"0"),
		j("duration above max", twJSONCheck("duration", "31622400001"), durationRange+"31622400001"),
		j("duration fraction", twJSONCheck("duration", "1000.5"), "duration must be an integer"),
		j("duration string", twJSONCheck("duration", `"1m"`), "duration must be an integer"),
		m("duration 10", twMP(twGoodCheck.With("duration", 10)), durationRange+"10"),
		m("duration above max", twMP(twGoodCheck.With("duration", uint64(31622400001))), durationRange+"31622400001"),
		m("duration negative", twMP(twGoodCheck.With("duration", int32(-2000))), durationRange+"-2000"),
		m("duration float", twMP(twGoodCheck.With("duration", 1000.0)), "duration must be an integer"),
		// Cost.
		j("cost negative", twJSONCheck("cost", "-1"), costRange+"-1"),
		j("cost above max", twJSONCheck("cost", "1000000000000001"), costRange+"1000000000000001"),
		j("cost null", twJSONCheck("cost", "null"), "cost must be an integer"),
		j("cost exponent", twJSONCheck("cost", "1e0"), "cost must be an integer"),
		m("cost negative", twMP(twGoodCheck.With("cost", -1)), costRange+"-1"),
		m("cost above max", twMP(twGoodCheck.With("cost", uint64(MaxCost+1))), costRange+"1000000000000001"),
		m("cost nil", twMP(twGoodCheck.With("cost", nil)), "cost must be an integer"),
		m("cost float", twMP(twGoodCheck.With("cost", 0.5)), "cost must be an integer"),
		// The first problem wins.
		j("first error wins", `{"limit":"x","identifier":5}`, "limit must be an integer"),
		m("first error wins", twMP(twMap{{"limit", "x"}, {"identifier", 5}}), "limit must be an integer"),
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeCheckRequest(tt.enc, tt.body)
			twWantBadRequest(t, err, tt.want, tt.prefix)
			if got != (CheckRequest{}) {
				t.Fatalf("got %+v with an error", got)
			}
		})
	}
}

// --- batch ------------------------------------------------------------------

func TestDecodeBatchRequestValid(t *testing.T) {
	want := BatchRequest{Checks: []BatchCheck{
		{Namespace: "api_v1-x", CheckRequest: CheckRequest{"user-1", 100, 60000, 2, false, false, 0}},
		{Namespace: "n", CheckRequest: CheckRequest{"u2", 5, 1000, 1, false, false, 0}},
	}}
	jsonBody := `{"checks":[{"namespace":"api_v1-x","identifier":"user-1","limit":100,"duration":60000,"cost":2},` +
		`{"identifier":"u2","limit":5,"duration":1000,"namespace":"n"}]}`
	mpBody := twMP(twMap{{"checks", []any{twGoodBatchCheck(), twMap{{"identifier", "u2"}, {"limit", 5}, {"duration", 1000}, {"namespace", "n"}}}}})
	for name, tt := range map[string]struct {
		enc  Encoding
		body []byte
	}{"json": {JSON, []byte(jsonBody)}, "msgpack": {Msgpack, mpBody}} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeBatchRequest(tt.enc, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}

	// 100 checks of 64-character namespaces and 512-byte identifiers fit.
	big := BatchRequest{}
	for i := 0; i < MaxBatchChecks; i++ {
		big.Checks = append(big.Checks, BatchCheck{Namespace: strings.Repeat("N", 64),
			CheckRequest: CheckRequest{strings.Repeat("i", 512), MaxLimit, MaxDuration, MaxCost, false, false, 0}})
	}
	for _, enc := range []Encoding{JSON, Msgpack} {
		body := AppendBatchRequest(nil, enc, big)
		got, err := DecodeBatchRequest(enc, body)
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		if !reflect.DeepEqual(got, big) {
			t.Fatalf("%v: maximal batch does not round-trip", enc)
		}
	}
}

func TestDecodeBatchRequestErrors(t *testing.T) {
	type tc struct {
		name   string
		enc    Encoding
		body   []byte
		want   string
		prefix bool
	}
	jc := `{"namespace":"ns","identifier":"x","limit":1,"duration":1000}`
	jbatch := func(checks ...string) string { return `{"checks":[` + strings.Join(checks, ",") + `]}` }
	mbatch := func(checks ...any) []byte { return twMP(twMap{{"checks", checks}}) }
	mc := twGoodBatchCheck()
	many := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = mc
		}
		return out
	}
	manyJSON := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = jc
		}
		return out
	}
	tests := []tc{
		{"json/empty", JSON, nil, "empty request body", false},
		{"msgpack/empty", Msgpack, []byte{}, "empty request body", false},
		{"json/oversized", JSON, []byte(`{"checks":[` + strings.Repeat(" ", MaxBatchBody) + `]}`), "request body of 131085 bytes exceeds the limit of 131072 bytes", false},
		{"msgpack/oversized", Msgpack, append(mbatch(mc), make([]byte, MaxBatchBody)...), "request body of 131146 bytes exceeds the limit of 131072 bytes", false},
		{"json/not object", JSON, []byte(`[` + jc + `]`), "body must be a JSON object", false},
		{"msgpack/not map", Msgpack, twMP([]any{mc}), "body must be a msgpack map", false},
		{"json/malformed", JSON, []byte(`{"checks":[` + jc), "malformed JSON: ", true},
		{"json/trailing", JSON, []byte(jbatch(jc) + `]`), "malformed JSON: unexpected tail", true},
		{"msgpack/truncated", Msgpack, mbatch(mc)[:20], "checks[0]: malformed msgpack: unexpected end of data", false},
		{"msgpack/trailing", Msgpack, append(mbatch(mc), 0xc0), "malformed msgpack: 1 trailing bytes after the map", false},
		{"json/checks missing", JSON, []byte(`{}`), "checks is required", false},
		{"msgpack/checks missing", Msgpack, twMP(twMap{}), "checks is required", false},
		{"json/unknown field", JSON, []byte(`{"checks":[` + jc + `],"x":1}`), `unknown field "x"`, false},
		{"msgpack/unknown field", Msgpack, twMP(twMap{{"checks", []any{mc}}, {"x", 1}}), `unknown field "x"`, false},
		{"json/duplicate checks", JSON, []byte(`{"checks":[` + jc + `],"checks":[` + jc + `]}`), `duplicate field "checks"`, false},
		{"msgpack/duplicate checks", Msgpack, twMP(twMap{{"checks", []any{mc}}, {"checks", []any{mc}}}), `duplicate field "checks"`, false},
		{"json/checks not array", JSON, []byte(`{"checks":{}}`), "checks must be an array", false},
		{"json/checks null", JSON, []byte(`{"checks":null}`), "checks must be an array", false},
		{"msgpack/checks not array", Msgpack, twMP(twMap{{"checks", mc}}), "checks must be an array", false},
		{"msgpack/checks nil", Msgpack, twMP(twMap{{"checks", nil}}), "checks must be an array", false},
		{"json/zero checks", JSON, []byte(jbatch()), "checks must hold 1 to 100 checks, got 0", false},
		{"msgpack/zero checks", Msgpack, mbatch(), "checks must hold 1 to 100 checks, got 0", false},
		{"json/101 checks", JSON, []byte(jbatch(manyJSON(101)...)), "checks must hold 1 to 100 checks, got 101", false},
		{"msgpack/101 checks", Msgpack, mbatch(many(101)...), "checks must hold 1 to 100 checks, got 101", false},
		{"msgpack/huge array header", Msgpack, twMP(twMap{{"checks", twRaw{0xdd, 0xff, 0xff, 0xff, 0xff}}}), "checks must hold 1 to 100 checks, got 4294967295", false},
		{"json/check not object", JSON, []byte(jbatch(jc, `[]`)), "checks[1]: check must be a JSON object", false},
		{"msgpack/check not map", Msgpack, mbatch(mc, []any{}), "checks[1]: check must be a msgpack map", false},
		{"json/namespace missing", JSON, []byte(jbatch(jc, `{"identifier":"x","limit":1,"duration":1000}`)), "checks[1]: namespace is required", false},
		{"msgpack/namespace missing", Msgpack, mbatch(mc, mc.Without("namespace")), "checks[1]: namespace is required", false},
		{"json/namespace empty", JSON, []byte(jbatch(jc, jc, jc, `{"namespace":"","identifier":"x","limit":1,"duration":1000}`)), "checks[3]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"json/namespace bad char", JSON, []byte(jbatch(`{"namespace":"a.b","identifier":"x","limit":1,"duration":1000}`)), "checks[0]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"json/namespace escaped bad char", JSON, []byte(jbatch(`{"namespace":"a\u0020b","identifier":"x","limit":1,"duration":1000}`)), "checks[0]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"json/namespace too long", JSON, []byte(jbatch(`{"namespace":"` + strings.Repeat("a", 65) + `","identifier":"x","limit":1,"duration":1000}`)), "checks[0]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"json/namespace number", JSON, []byte(jbatch(`{"namespace":1,"identifier":"x","limit":1,"duration":1000}`)), "checks[0]: namespace must be a string", false},
		{"msgpack/namespace bad char", Msgpack, mbatch(mc, mc, mc, mc.With("namespace", "a/b")), "checks[3]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"msgpack/namespace too long", Msgpack, mbatch(mc.With("namespace", strings.Repeat("a", 65))), "checks[0]: namespace must be 1 to 64 characters of [A-Za-z0-9_-]", false},
		{"msgpack/namespace nil", Msgpack, mbatch(mc.With("namespace", nil)), "checks[0]: namespace must be a string", false},
		{"json/check field error", JSON, []byte(jbatch(jc, jc, `{"namespace":"ns","identifier":"x","limit":1.5,"duration":1000}`)), "checks[2]: limit must be an integer", false},
		{"msgpack/check field error", Msgpack, mbatch(mc, mc, mc.With("limit", 1.5)), "checks[2]: limit must be an integer", false},
		{"json/check unknown field", JSON, []byte(jbatch(`{"namespace":"ns","identifier":"x","limit":1,"duration":1000,"workspace":"w"}`)), `checks[0]: unknown field "workspace"`, false},
		{"msgpack/check unknown field", Msgpack, mbatch(mc.With("workspace", "w")), `checks[0]: unknown field "workspace"`, false},
		{"json/check duplicate field", JSON, []byte(jbatch(`{"namespace":"ns","namespace":"ns","identifier":"x","limit":1,"duration":1000}`)), `checks[0]: duplicate field "namespace"`, false},
		{"msgpack/check missing duration", Msgpack, mbatch(mc.Without("duration")), "checks[0]: duration is required", false},
		{"msgpack/check identifier too long", Msgpack, mbatch(mc.With("identifier", strings.Repeat("x", 513))), "checks[0]: identifier must be 1 to 512 bytes, got 513", false},
		{"json/check cost range", JSON, []byte(jbatch(`{"namespace":"ns","identifier":"x","limit":1,"duration":1000,"cost":-3}`)), "checks[0]: cost must be between 0 and 1000000000000000, got -3", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeBatchRequest(tt.enc, tt.body)
			twWantBadRequest(t, err, tt.want, tt.prefix)
			if got.Checks != nil {
				t.Fatalf("got %+v with an error", got)
			}
		})
	}
}

// --- content type -----------------------------------------------------------

func TestDetectEncoding(t *testing.T) {
	msgpackBody := twMP(twGoodCheck)
	tests := []struct {
		ct   string
		body []byte
		want Encoding
		err  string
	}{
		{"application/json", msgpackBody, JSON, ""},
		{"Application/JSON", nil, JSON, ""},
		{"application/json; charset=utf-8", nil, JSON, ""},
		{"  application/json ;charset=UTF-8", nil, JSON, ""},
		{"application/msgpack", []byte("{}"), Msgpack, ""},
		{"application/x-msgpack", nil, Msgpack, ""},
		{"APPLICATION/VND.MSGPACK", nil, Msgpack, ""},
		{"application/vnd.msgpack; foo=bar", nil, Msgpack, ""},
		{"", []byte(`{"identifier":"x"}`), JSON, ""},
		{"", []byte(" \t\r\n{}"), JSON, ""},
		{"", msgpackBody, Msgpack, ""},
		{"", []byte(" [1]"), Msgpack, ""},
		{"", []byte("   "), Msgpack, ""},
		{"", nil, Msgpack, ""},
		{"  ", []byte("{}"), JSON, ""},
		{"; charset=utf-8", []byte("{}"), JSON, ""},
		{"text/plain", []byte("{}"), 0, `unsupported Content-Type "text/plain": use application/json or application/msgpack`},
		{"text/plain; charset=utf-8", nil, 0, `unsupported Content-Type "text/plain; charset=utf-8": use application/json or application/msgpack`},
		{"application/json-seq", nil, 0, `unsupported Content-Type "application/json-seq": use application/json or application/msgpack`},
		{"application/jsonx", nil, 0, `unsupported Content-Type "application/jsonx": use application/json or application/msgpack`},
		{"json", nil, 0, `unsupported Content-Type "json": use application/json or application/msgpack`},
	}
	for _, tt := range tests {
		got, err := DetectEncoding(tt.ct, tt.body)
		if tt.err != "" {
			if err == nil {
				t.Errorf("DetectEncoding(%q) = %v, want error %q", tt.ct, got, tt.err)
				continue
			}
			var bre *BadRequestError
			if !errors.As(err, &bre) || err.Error() != tt.err {
				t.Errorf("DetectEncoding(%q) error %q (%T), want %q", tt.ct, err, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("DetectEncoding(%q, %q) = %v, %v; want %v", tt.ct, tt.body, got, err, tt.want)
		}
	}
	if JSON.String() != "json" || Msgpack.String() != "msgpack" ||
		JSON.ContentType() != "application/json" || Msgpack.ContentType() != "application/msgpack" {
		t.Error("Encoding String/ContentType")
	}
}

func TestValidToken(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "A-z_09": true, strings.Repeat("x", 64): true,
		"": false, strings.Repeat("x", 65): false, "a b": false, "a.b": false, "é": false, "a\x00": false, "a/b": false,
	} {
		if ValidToken(s) != want || window.ValidToken([]byte(s)) != want {
			t.Errorf("ValidToken(%q) != %v", s, want)
		}
	}
}

// --- round trips ------------------------------------------------------------

var twEncodings = []struct {
	name string
	enc  Encoding
}{{"json", JSON}, {"msgpack", Msgpack}}

// twNasty are valid UTF-8 strings that need escaping in JSON.
var twNasty = []string{
	"user-1", "a\"b\\c/d", "\x00\x01\x1f\x7f", "\b\f\n\r\t", "é日本😀", "\u2028\u2029", "<script>&amp;",
	strings.Repeat("z", 512), "\uFFFD", `\u0041`,
}

func TestCheckRequestRoundTrip(t *testing.T) {
	for _, e := range twEncodings {
		for _, id := range twNasty {
			for _, r := range []CheckRequest{
				{id, 0, MinDuration, 0, false, false, 0},
				{id, MaxLimit, MaxDuration, MaxCost, true, false, 0},
				{id, 100, 60000, 1, false, false, 0},
				{id, 1 << 40, 1 << 31, 1 << 33, true, false, 0},
			} {
				body := AppendCheckRequest(nil, e.enc, r)
				got, err := DecodeCheckRequest(e.enc, body)
				if err != nil || got != r {
					t.Fatalf("%s: %+v -> %q -> %+v, %v", e.name, r, body, got, err)
				}
				if e.enc == JSON {
					want := map[string]any{"identifier": id, "limit": r.Limit, "duration": r.Duration, "cost": r.Cost}
					if r.Shadow {
						want["shadow"] = true // written only when set
					}
					twCheckJSONView(t, body, want)
				}
				// Appending keeps what is already in the buffer.
				prefixed := AppendCheckRequest([]byte("xyz"), e.enc, r)
				if !bytes.Equal(prefixed, append([]byte("xyz"), body...)) {
					t.Fatalf("%s: append to a non-empty buffer", e.name)
				}
			}
		}
	}
}

func TestCheckRequestJSONInvalidUTF8(t *testing.T) {
	r := CheckRequest{"a\xffb\xc3", 1, 1000, 1, false, false, 0}
	body := AppendCheckRequest(nil, JSON, r)
	if !json.Valid(body) || !utf8.Valid(body) {
		t.Fatalf("invalid JSON %q", body)
	}
	got, err := DecodeCheckRequest(JSON, body)
	if err != nil || got.Identifier != "a\uFFFDb\uFFFD" {
		t.Fatalf("got %+v, %v", got, err)
	}
	// msgpack keeps every byte.
	got, err = DecodeCheckRequest(Msgpack, AppendCheckRequest(nil, Msgpack, r))
	if err != nil || got != r {
		t.Fatalf("msgpack got %+v, %v", got, err)
	}
}

func TestBatchRequestRoundTrip(t *testing.T) {
	var r BatchRequest
	for i, id := range twNasty {
		r.Checks = append(r.Checks, BatchCheck{Namespace: []string{"a", "B-2_c", strings.Repeat("n", 64)}[i%3],
			CheckRequest: CheckRequest{id, int64(i), MinDuration + int64(i), int64(i % 2), i%3 == 1, false, 0}})
	}
	for _, e := range twEncodings {
		body := AppendBatchRequest(nil, e.enc, r)
		got, err := DecodeBatchRequest(e.enc, body)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("%s: %+v -> %+v, %v", e.name, r, got, err)
		}
		if e.enc == JSON {
			var checks []any
			for _, c := range r.Checks {
				check := map[string]any{"namespace": c.Namespace, "identifier": c.Identifier,
					"limit": c.Limit, "duration": c.Duration, "cost": c.Cost}
				if c.Shadow {
					check["shadow"] = true
				}
				checks = append(checks, check)
			}
			twCheckJSONView(t, body, map[string]any{"checks": checks})
		}
	}
}

var twSampleResponses = []CheckResponse{
	{},
	{Success: true, Limit: 100, Remaining: 99, Reset: 1_700_000_000_000, RetryAfter: 0},
	{Success: false, Limit: MaxLimit, Remaining: 0, Reset: math.MaxInt64, RetryAfter: 59_999},
	{Success: true, Limit: -1, Remaining: math.MinInt64, Reset: -5, RetryAfter: 1 << 40},
	{Success: true, Limit: 10, Remaining: 0, Reset: 1_700_000_060_000, ShadowDenied: true},
	{Success: false, Limit: 5, Remaining: 0, Reset: 1_700_000_060_000, RetryAfter: 1200, Override: "org:*:admin"},
	{Success: true, Limit: 0, Remaining: 0, Reset: 1, ShadowDenied: true, Override: "x\x00\"\\é😀\u2028*"},
	{Success: true, Limit: 1, Override: strings.Repeat("o", MaxIdentifierLen)},
}

func twResponseView(r CheckResponse) map[string]any {
	v := map[string]any{"success": r.Success, "limit": r.Limit, "remaining": r.Remaining, "reset": r.Reset, "retry_after": r.RetryAfter}
	if r.ShadowDenied {
		v["shadow_denied"] = true // written only when true
	}
	if r.Override != "" {
		v["override"] = r.Override // written only when an override applied
	}
	return v
}

func TestCheckResponseRoundTrip(t *testing.T) {
	for _, e := range twEncodings {
		for _, r := range twSampleResponses {
			body := AppendCheckResponse(nil, e.enc, r)
			got, err := DecodeCheckResponse(e.enc, body)
			if err != nil || got != r {
				t.Fatalf("%s: %+v -> %q -> %+v, %v", e.name, r, body, got, err)
			}
			if e.enc == JSON {
				twCheckJSONView(t, body, twResponseView(r))
				// Fixed key order.
				if !strings.HasPrefix(string(body), `{"success":`) ||
					!twKeysInOrder(string(body), `"success"`, `"limit"`, `"remaining"`, `"reset"`, `"retry_after"`) {
					t.Fatalf("key order: %s", body)
				}
			}
		}
	}
	want := `{"success":true,"limit":100,"remaining":99,"reset":1700000000000,"retry_after":0}`
	if got := string(AppendCheckResponse(nil, JSON, twSampleResponses[1])); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func twKeysInOrder(s string, keys ...string) bool {
	last := -1
	for _, k := range keys {
		i := strings.Index(s, k)
		if i <= last {
			return false
		}
		last = i
	}
	return true
}

func TestBatchResponseRoundTrip(t *testing.T) {
	for _, e := range twEncodings {
		for _, r := range []BatchResponse{
			{Success: true, Results: twSampleResponses},
			{Success: false, Results: twSampleResponses[:1]},
			{Success: false, Results: []CheckResponse{}},
		} {
			body := AppendBatchResponse(nil, e.enc, r)
			got, err := DecodeBatchResponse(e.enc, body)
			if err != nil || !reflect.DeepEqual(got, r) {
				t.Fatalf("%s: %+v -> %+v, %v", e.name, r, got, err)
			}
			if e.enc == JSON {
				results := []any{}
				for _, res := range r.Results {
					results = append(results, twResponseView(res))
				}
				twCheckJSONView(t, body, map[string]any{"success": r.Success, "results": results})
			}
		}
		// nil Results is written as an empty array.
		got, err := DecodeBatchResponse(e.enc, AppendBatchResponse(nil, e.enc, BatchResponse{Success: true}))
		if err != nil || !got.Success || got.Results == nil || len(got.Results) != 0 {
			t.Fatalf("%s: nil results: %+v, %v", e.name, got, err)
		}
	}
}

func TestErrorRoundTrip(t *testing.T) {
	msgs := append([]string{"", `unknown field "cots"`, "bad \xff\xfe utf-8"}, twNasty...)
	for _, e := range twEncodings {
		for _, msg := range msgs {
			body := AppendError(nil, e.enc, msg)
			got, err := DecodeError(e.enc, body)
			want := msg
			if e.enc == JSON {
				want = twJSONSanitize(msg)
				twCheckJSONView(t, body, map[string]any{"error": msg})
			}
			if err != nil || got != want {
				t.Fatalf("%s: %q -> %q -> %q, %v", e.name, msg, body, got, err)
			}
		}
	}
	if got := string(AppendError(nil, JSON, "a\"b\n")); got != `{"error":"a\"b\n"}` {
		t.Fatalf("got %s", got)
	}
}

// twJSONSanitize is what encoding/json makes of s: each invalid UTF-8 byte
// becomes U+FFFD.
func twJSONSanitize(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// twCheckJSONView checks that body is valid JSON and that encoding/json decodes
// it to want (numbers as int64, strings after twJSONSanitize).
func twCheckJSONView(t *testing.T, body []byte, want map[string]any) {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("invalid JSON: %q", body)
	}
	if !utf8.Valid(body) {
		t.Fatalf("JSON is not UTF-8: %q", body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var got any
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	if w := twNormalize(want); !reflect.DeepEqual(twNormalize(got), w) {
		t.Fatalf("encoding/json sees %#v, want %#v", twNormalize(got), w)
	}
}

func twNormalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			out[k] = twNormalize(e)
		}
		return out
	case []any:
		out := []any{}
		for _, e := range v {
			out = append(out, twNormalize(e))
		}
		return out
	case json.Number:
		return string(v)
	case int64:
		return json.Number(twItoa(v)).String()
	case string:
		return "s:" + twJSONSanitize(v)
	}
	return v
}

func twItoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

func TestJSONStringEscaping(t *testing.T) {
	// Every single byte and a sample of runes must give valid JSON that
	// encoding/json reads back as it would read its own encoding.
	var inputs []string
	for c := 0; c < 256; c++ {
		inputs = append(inputs, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	inputs = append(inputs, twNasty...)
	inputs = append(inputs, "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "a\xe2\x82", string(rune(0x10FFFF)))
	for _, s := range inputs {
		b := appendJSONString(nil, s)
		if !json.Valid(b) || !utf8.Valid(b) {
			t.Fatalf("%q -> invalid JSON %q", s, b)
		}
		var got string
		if err := json.Unmarshal(b, &got); err != nil || got != twJSONSanitize(s) {
			t.Fatalf("%q -> %q -> %q, want %q", s, b, got, twJSONSanitize(s))
		}
		// And our decoder agrees.
		u, err := unescapeJSON(append([]byte(nil), b[1:len(b)-1]...))
		if err != nil || string(u) != got {
			t.Fatalf("unescapeJSON(%q) = %q, %v; want %q", b, u, err, got)
		}
	}
}

func TestUnescapeMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{
		`\ud800`, `\udc00`, `\ud800\udc00`, `\ud83d\ude00`, `\ud800\u0041`, `\ud800\ud800\udc00`, `x\ud800`, `\ud800x`,
		`\u0000`, `\u00e9`, `\uFFFF`, `\/`, `\\u0041`, `\"`, `abc`, "",
	} {
		var want string
		if err := json.Unmarshal([]byte(`"`+s+`"`), &want); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		got, err := unescapeJSON([]byte(s))
		if err != nil || string(got) != want {
			t.Errorf("unescapeJSON(%s) = %q, %v; want %q", s, got, err, want)
		}
	}
}

// --- response decoding errors -----------------------------------------------

// TestDecodeResponseErrors checks that the client refuses a malformed
// response with a plain error naming the problem. Past the missing keys and
// the framing, which Sluice checks itself, the messages are those of msgp and
// encoding/json.
func TestDecodeResponseErrors(t *testing.T) {
	good := twMap{{"success", true}, {"limit", 1}, {"remaining", 0}, {"reset", 5}, {"retry_after", 7}}
	tests := []struct {
		name string
		enc  Encoding
		body []byte
		want string
	}{
		{"json empty", JSON, nil, "invalid check response: empty response body"},
		{"msgpack empty", Msgpack, nil, "invalid check response: empty response body"},
		{"json missing", JSON, []byte(`{"success":true,"limit":1,"remaining":0,"reset":5}`), "invalid check response: retry_after is required"},
		{"msgpack missing", Msgpack, twMP(good.Without("success")), "invalid check response: success is required"},
		{"json wrong type", JSON, []byte(`{"success":1,"limit":1,"remaining":0,"reset":5,"retry_after":0}`), "invalid check response: cannot unmarshal number into Go struct field checkResponseJSON.success of type bool"},
		{"json fraction", JSON, []byte(`{"success":true,"limit":1.5,"remaining":0,"reset":5,"retry_after":0}`), "invalid check response: cannot unmarshal number 1.5 into Go struct field checkResponseJSON.limit of type int64"},
		{"json overflow", JSON, []byte(`{"success":true,"limit":1,"remaining":0,"reset":9223372036854775808,"retry_after":0}`), "invalid check response: cannot unmarshal number 9223372036854775808 into Go struct field checkResponseJSON.reset of type int64"},
		{"msgpack float", Msgpack, twMP(good.With("remaining", 1.0)), `invalid check response: attempted to decode type "float64" with method for "int" at Remaining`},
		{"msgpack uint64 overflow", Msgpack, twMP(good.With("reset", uint64(math.MaxUint64))), "invalid check response: 18446744073709551615 overflows uint64 at Reset"},
		{"msgpack duplicate", Msgpack, twMP(append(good, twKV{"limit", 2})), "invalid check response: duplicate map key or field at Limit"},
		{"msgpack trailing", Msgpack, append(twMP(good), 1), "invalid check response: malformed msgpack: 1 trailing bytes after the map"},
		{"msgpack truncated unknown", Msgpack, twMP(good.With("extra", twRaw{0x92, 1})), "invalid check response: malformed msgpack: unexpected end of data"},
		{"json not object", JSON, []byte(`[]`), "invalid check response: cannot unmarshal array into Go value of type wire.checkResponseJSON"},
	}
	for _, tt := range tests {
		_, err := DecodeCheckResponse(tt.enc, tt.body)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
		var bre *BadRequestError
		if errors.As(err, &bre) {
			t.Errorf("%s: response errors must not be *BadRequestError", tt.name)
		}
	}

	// Unknown keys are ignored, whatever their value.
	withExtra := twMP(append(twMap{{"extra", twMap{{"a", []any{1, nil, "x"}}}}}, good...))
	if r, err := DecodeCheckResponse(Msgpack, withExtra); err != nil || r != (CheckResponse{true, 1, 0, 5, 7, false, ""}) {
		t.Errorf("unknown msgpack key: %+v, %v", r, err)
	}
	if r, err := DecodeCheckResponse(JSON, []byte(`{"x":[{}],"success":true,"limit":1,"remaining":0,"reset":5,"retry_after":7,"y":null}`)); err != nil || r != (CheckResponse{true, 1, 0, 5, 7, false, ""}) {
		t.Errorf("unknown JSON key: %+v, %v", r, err)
	}
	if _, err := DecodeBatchResponse(JSON, []byte(`{"success":true,"results":[{"success":true}]}`)); err == nil ||
		err.Error() != "invalid batch response: results[0]: limit is required" {
		t.Errorf("batch result error: %v", err)
	}
	if _, err := DecodeBatchResponse(Msgpack, twMP(twMap{{"success", true}})); err == nil ||
		err.Error() != "invalid batch response: results is required" {
		t.Errorf("batch missing results: %v", err)
	}
	if _, err := DecodeError(JSON, []byte(`{"message":"x"}`)); err == nil || err.Error() != "invalid error response: error is required" {
		t.Errorf("error body: %v", err)
	}
	if msg, err := DecodeError(Msgpack, twMP(twMap{{"code", 3}, {"error", "boom"}})); err != nil || msg != "boom" {
		t.Errorf("error body: %q, %v", msg, err)
	}
}

// --- allocations and benchmarks ---------------------------------------------

func twRaceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

func TestAllocations(t *testing.T) {
	if twRaceEnabled() {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	resp := CheckResponse{true, 100, 99, 1_700_000_000_000, 0, false, ""}
	buf := make([]byte, 0, 256)
	for _, e := range twEncodings {
		body := AppendCheckRequest(nil, e.enc, CheckRequest{"user-1", 100, 60000, 2, false, false, 0})
		if n := testing.AllocsPerRun(200, func() { _, _ = DecodeCheckRequest(e.enc, body) }); n > 1 {
			t.Errorf("%s: DecodeCheckRequest allocates %v times, want 1", e.name, n)
		}
		if n := testing.AllocsPerRun(200, func() { buf = AppendCheckResponse(buf[:0], e.enc, resp) }); n != 0 {
			t.Errorf("%s: AppendCheckResponse allocates %v times", e.name, n)
		}
		over := CheckResponse{Success: true, Limit: 5, Remaining: 4, Reset: 1_700_000_000_000, ShadowDenied: true, Override: "org:*:admin"}
		if n := testing.AllocsPerRun(200, func() { buf = AppendCheckResponse(buf[:0], e.enc, over) }); n != 0 {
			t.Errorf("%s: AppendCheckResponse with an override allocates %v times", e.name, n)
		}
		if n := testing.AllocsPerRun(200, func() { buf = AppendError(buf[:0], e.enc, "limit must be an integer") }); n != 0 {
			t.Errorf("%s: AppendError allocates %v times", e.name, n)
		}
		if n := testing.AllocsPerRun(200, func() { _, _ = DetectEncoding("application/json; charset=utf-8", body) }); n != 0 {
			t.Errorf("DetectEncoding allocates %v times", n)
		}
	}
}

func BenchmarkDecodeCheckRequest(b *testing.B) {
	for _, e := range twEncodings {
		body := AppendCheckRequest(nil, e.enc, CheckRequest{"user:12345", 100, 60000, 1, false, false, 0})
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := DecodeCheckRequest(e.enc, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// What the check endpoint runs: msgpack, the identifier aliasing body.
	body := AppendCheckRequest(nil, Msgpack, CheckRequest{"user:12345", 100, 60000, 1, false, false, 0})
	b.Run("msgpack-view", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		var c CheckRequest
		for b.Loop() {
			if err := DecodeCheckRequestView(Msgpack, body, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkAppendCheckResponse(b *testing.B) {
	resp := CheckResponse{true, 100, 99, 1_700_000_000_000, 0, false, ""}
	for _, e := range twEncodings {
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 256)
			for b.Loop() {
				buf = AppendCheckResponse(buf[:0], e.enc, resp)
			}
		})
	}
}

func BenchmarkDecodeBatchRequest(b *testing.B) {
	var r BatchRequest
	for i := 0; i < MaxBatchChecks; i++ {
		r.Checks = append(r.Checks, BatchCheck{Namespace: "api", CheckRequest: CheckRequest{"user:12345", 100, 60000, 1, false, false, 0}})
	}
	for _, e := range twEncodings {
		body := AppendBatchRequest(nil, e.enc, r)
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := DecodeBatchRequest(e.enc, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A reply where no override applied keeps the contract's bytes, key for
// key, with or without shadow_denied; one where an override applied adds
// "override" after every other key.
func TestCheckResponseBytesAreFixed(t *testing.T) {
	plain := CheckResponse{Success: true, Limit: 100, Remaining: 99, Reset: 1_700_000_000_000}
	shadow := CheckResponse{Success: true, Limit: 10, Reset: 1_700_000_060_000, ShadowDenied: true}
	over := CheckResponse{Limit: 5, Reset: 1_700_000_060_000, RetryAfter: 1200, Override: "org:*:admin"}
	both := shadow
	both.Override = "org:*:admin"
	for _, c := range []struct {
		r           CheckResponse
		json, mpHex string
	}{
		{plain, `{"success":true,"limit":100,"remaining":99,"reset":1700000000000,"retry_after":0}`,
			"85a773756363657373c3a56c696d697464a972656d61696e696e6763a57265736574d30000018bcfe56800ab72657472795f616674657200"},
		{shadow, `{"success":true,"limit":10,"remaining":0,"reset":1700000060000,"retry_after":0,"shadow_denied":true}`,
			"86a773756363657373c3a56c696d69740aa972656d61696e696e6700a57265736574d30000018bcfe65260ab72657472795f616674657200ad736861646f775f64656e696564c3"},
		{over, `{"success":false,"limit":5,"remaining":0,"reset":1700000060000,"retry_after":1200,"override":"org:*:admin"}`,
			"86a773756363657373c2a56c696d697405a972656d61696e696e6700a57265736574d30000018bcfe65260ab72657472795f6166746572d104b0a86f76657272696465ab6f72673a2a3a61646d696e"},
		{both, `{"success":true,"limit":10,"remaining":0,"reset":1700000060000,"retry_after":0,"shadow_denied":true,"override":"org:*:admin"}`,
			"87a773756363657373c3a56c696d69740aa972656d61696e696e6700a57265736574d30000018bcfe65260ab72657472795f616674657200ad736861646f775f64656e696564c3a86f76657272696465ab6f72673a2a3a61646d696e"},
	} {
		if got := string(AppendCheckResponse(nil, JSON, c.r)); got != c.json {
			t.Errorf("JSON of %+v:\n got %s\nwant %s", c.r, got, c.json)
		}
		if got := hex.EncodeToString(AppendCheckResponse(nil, Msgpack, c.r)); got != c.mpHex {
			t.Errorf("msgpack of %+v:\n got %s\nwant %s", c.r, got, c.mpHex)
		}
	}
	// In a batch and a checks message, each result is the same bytes.
	for _, enc := range []Encoding{JSON, Msgpack} {
		batch := AppendBatchResponse(nil, enc, BatchResponse{Results: []CheckResponse{plain, over}})
		checks := AppendChecksResponse(nil, enc, ChecksResponse{Results: []ChecksResult{{CheckResponse: plain}, {CheckResponse: over}}})
		for _, r := range []CheckResponse{plain, over} {
			want := AppendCheckResponse(nil, enc, r)
			if !bytes.Contains(batch, want) || !bytes.Contains(checks, want) {
				t.Errorf("%v: batch %q or checks %q does not hold the result's bytes %q", enc, batch, checks, want)
			}
		}
	}
}

// A client reads "override" from a msgpack str or bin (as the limiter reads
// identifiers), in a check response, a batch's results and a checks
// message's results; in JSON, bytes that are not UTF-8 become U+FFFD.
func TestOverrideIsReadFromStrOrBin(t *testing.T) {
	fields := twMap{{"success", true}, {"limit", 1}, {"remaining", 0}, {"reset", 5}, {"retry_after", 0}, {"override", []byte("a*\xff")}}
	want := CheckResponse{Success: true, Limit: 1, Reset: 5, Override: "a*\xff"}
	if r, err := DecodeCheckResponse(Msgpack, twMP(fields)); err != nil || r != want {
		t.Fatalf("check: %+v, %v; want %+v", r, err, want)
	}
	br, err := DecodeBatchResponse(Msgpack, twMP(twMap{{"success", true}, {"results", []any{fields}}}))
	if err != nil || len(br.Results) != 1 || br.Results[0] != want {
		t.Fatalf("batch: %+v, %v", br, err)
	}
	cr, err := DecodeChecksResponse(Msgpack, twMP(twMap{{"results", []any{fields}}}))
	if err != nil || len(cr.Results) != 1 || cr.Results[0].CheckResponse != want {
		t.Fatalf("checks: %+v, %v", cr, err)
	}
	dup := twMP(twMap{{"results", []any{append(fields, twMap{{"override", "b"}}...)}}})
	if _, err := DecodeChecksResponse(Msgpack, dup); err == nil || !strings.Contains(err.Error(), `duplicate field "override"`) {
		t.Fatalf("checks with a repeated override: %v", err)
	}
	for _, body := range [][]byte{
		twMP(append(fields[:5:5], twMap{{"override", 7}}...)),
		twMP(twMap{{"results", []any{append(fields[:5:5], twMap{{"override", 7}}...)}}}),
	} {
		if _, err := DecodeCheckResponse(Msgpack, body); err == nil {
			if _, err := DecodeChecksResponse(Msgpack, body); err == nil {
				t.Fatalf("an integer override was read: % x", body)
			}
		}
	}
	j := AppendCheckResponse(nil, JSON, want)
	if r, err := DecodeCheckResponse(JSON, j); err != nil || r.Override != "a*\ufffd" {
		t.Fatalf("JSON of a non-UTF-8 override: %s -> %+v, %v", j, r, err)
	}
}

// TestCheckResponseMatchesTheGeneratedEncoder holds the hand-written check
// response encoder, kept for the check endpoint's speed, to the bytes msgp
// generates for the same shape.
func TestCheckResponseMatchesTheGeneratedEncoder(t *testing.T) {
	for _, r := range append(twSampleResponses, CheckResponse{Limit: math.MaxInt64, Remaining: math.MinInt64, Reset: -1, RetryAfter: 1 << 40}) {
		out := checkResponseOut(r)
		want, err := out.MarshalMsg(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendCheckResponse(nil, Msgpack, r); !bytes.Equal(got, want) {
			t.Errorf("%+v: hand-written % x, generated % x", r, got, want)
		}
	}
}
