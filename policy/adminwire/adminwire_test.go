package adminwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// isBadRequest reports whether err is the package's decoding error: a
// *wire.BadRequestError with a message.
func isBadRequest(err error) bool {
	var bad *wire.BadRequestError
	return errors.As(err, &bad) && bad.Msg != ""
}

// mp builds a msgpack map from alternating keys and values, written apart
// from the encoders under test.
func mp(kv ...any) []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i, x := range kv {
		switch v := x.(type) {
		case string:
			b = msgp.AppendString(b, v)
		case []byte:
			b = msgp.AppendBytes(b, v)
		case int:
			b = msgp.AppendInt64(b, int64(v))
		case uint64:
			b = msgp.AppendUint64(b, v)
		case float64:
			b = msgp.AppendFloat64(b, v)
		case bool:
			b = msgp.AppendBool(b, v)
		case nil:
			b = msgp.AppendNil(b)
		default:
			panic(i)
		}
	}
	return b
}

func TestDecodeSetAcceptsBothEncodings(t *testing.T) {
	want := SetRequest{Namespace: "api", Identifier: "user_*", Limit: 100, Duration: 60_000, Shadow: true}
	for _, c := range []struct {
		name string
		body []byte
		enc  Encoding
	}{
		{"json", []byte(` {"namespace":"api","identifier":"user_*","limit":100,"duration":60000,"shadow":true} `), JSON},
		{"json-reordered", []byte(`{"shadow":true,"duration":60000,"limit":100,"identifier":"user_*","namespace":"api"}`), JSON},
		{"msgpack", mp("namespace", "api", "identifier", "user_*", "limit", 100, "duration", 60000, "shadow", true), Msgpack},
		{"msgpack-bin-identifier-uint", mp("namespace", "api", "identifier", []byte("user_*"), "limit", uint64(100), "duration", uint64(60000), "shadow", true), Msgpack},
	} {
		got, err := DecodeSet(c.body, c.enc)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, want)
		}
	}
	// shadow is optional.
	got, err := DecodeSet([]byte(`{"namespace":"api","identifier":"a","limit":0,"duration":1000}`), JSON)
	if err != nil || got.Shadow || got.Limit != 0 {
		t.Errorf("without shadow: %+v, %v", got, err)
	}
}

// Set, get and delete take a pattern with '*' anywhere, in both encodings,
// and a cursor may stand on one; the pattern is the override's id.
func TestPatternsWithStarsAnywhereAreAccepted(t *testing.T) {
	for _, p := range []string{"org:*:admin", "*:admin", "a*b*c", "*", "x\xff*\x00"} {
		for _, enc := range []Encoding{JSON, Msgpack} {
			if enc == JSON && !utf8.ValidString(p) {
				continue
			}
			set := SetRequest{Namespace: "api", Identifier: p, Limit: 3, Duration: 60_000}
			if got, err := DecodeSet(set.Append(nil, enc), enc); err != nil || got != set {
				t.Errorf("%v set %q: %+v, %v", enc, p, got, err)
			}
			get := GetRequest{Namespace: "api", Identifier: p}
			if got, err := DecodeGet(get.Append(nil, enc), enc); err != nil || got != get {
				t.Errorf("%v get %q: %+v, %v", enc, p, got, err)
			}
			del := DeleteRequest{Namespace: "api", Identifier: p}
			if got, err := DecodeDelete(del.Append(nil, enc), enc); err != nil || got != del {
				t.Errorf("%v delete %q: %+v, %v", enc, p, got, err)
			}
		}
		pos := policy.Position{Namespace: "api", Pattern: p}
		if got, err := DecodeCursor(EncodeCursor(pos)); err != nil || got != pos {
			t.Errorf("cursor at %q: %+v, %v", p, got, err)
		}
	}
}

func TestDecodersRefuseBadBodiesWithClearErrors(t *testing.T) {
	big := strings.Repeat("a", 513)
	for _, c := range []struct {
		name string
		op   Op
		body []byte
		enc  Encoding
		want string
	}{
		{"not json", OpSet, []byte(`{"namespace":`), JSON, "malformed JSON"},
		{"array", OpSet, []byte(`[1]`), JSON, "must be a JSON object"},
		{"unknown field", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":1000,"cost":1}`), JSON, `unknown field "cost"`},
		{"duplicate field", OpSet, []byte(`{"namespace":"api","namespace":"web","identifier":"a","limit":1,"duration":1000}`), JSON, `duplicate field "namespace"`},
		{"missing limit", OpSet, []byte(`{"namespace":"api","identifier":"a","duration":1000}`), JSON, `missing field "limit"`},
		{"fraction", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1.5,"duration":1000}`), JSON, "limit must be an integer"},
		{"exponent", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1e3,"duration":1000}`), JSON, "limit must be an integer"},
		{"string limit", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":"1","duration":1000}`), JSON, "limit must be an integer"},
		{"null", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":null,"duration":1000}`), JSON, "limit must be an integer"},
		{"nested", OpSet, []byte(`{"namespace":"api","identifier":{"a":1},"limit":1,"duration":1000}`), JSON, "identifier must be a string"},
		{"shadow not bool", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":1000,"shadow":1}`), JSON, "shadow must be true or false"},
		{"huge", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":99999999999999999999,"duration":1000}`), JSON, "limit 99999999999999999999 is out of range"},
		{"limit range", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1000000000000001,"duration":1000}`), JSON, "limit 1000000000000001 out of range"},
		{"negative limit", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":-1,"duration":1000}`), JSON, "limit -1 out of range"},
		{"duration range", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":999}`), JSON, "duration 999 out of range"},
		{"bad namespace", OpSet, []byte(`{"namespace":"a.b","identifier":"a","limit":1,"duration":1000}`), JSON, `namespace "a.b" is not`},
		{"two stars", OpSet, []byte(`{"namespace":"api","identifier":"a**b","limit":1,"duration":1000}`), JSON, `pattern "a**b" has two adjacent *; one * already matches any run of bytes`},
		{"empty pattern", OpSet, []byte(`{"namespace":"api","identifier":"","limit":1,"duration":1000}`), JSON, "pattern is empty"},
		{"long pattern", OpSet, []byte(`{"namespace":"api","identifier":"` + big + `","limit":1,"duration":1000}`), JSON, "513 bytes"},
		{"trailing", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":1000} {}`), JSON, "trailing bytes"},
		{"not utf-8", OpSet, []byte("{\"namespace\":\"api\",\"identifier\":\"\xff\",\"limit\":1,\"duration\":1000}"), JSON, "not valid UTF-8"},
		{"oversized", OpSet, []byte(`{"namespace":"api","identifier":"` + strings.Repeat(`\u0041`, 2000) + `"}`), JSON, "larger than 8192"},
		{"mp not map", OpSet, msgp.AppendArrayHeader(nil, 0), Msgpack, "must be a msgpack map"},
		{"mp float", OpSet, mp("namespace", "api", "identifier", "a", "limit", 1.0, "duration", 1000), Msgpack, "limit must be an integer"},
		{"mp nil", OpSet, mp("namespace", "api", "identifier", nil, "limit", 1, "duration", 1000), Msgpack, "identifier must be a string"},
		{"mp bin namespace", OpSet, mp("namespace", []byte("api"), "identifier", "a", "limit", 1, "duration", 1000), Msgpack, "namespace must be a string"},
		{"mp uint64 overflow", OpSet, mp("namespace", "api", "identifier", "a", "limit", uint64(1<<63), "duration", 1000), Msgpack, "limit 9223372036854775808 is out of range"},
		{"mp truncated", OpSet, mp("namespace", "api", "identifier", "a", "limit", 1, "duration", 1000)[:20], Msgpack, "malformed msgpack"},
		{"mp trailing", OpSet, append(mp("namespace", "api", "identifier", "a", "limit", 1, "duration", 1000), 0xc0), Msgpack, "1 trailing bytes"},
		{"mp too many keys", OpSet, mp("namespace", "api", "identifier", "a", "limit", 1, "duration", 1000, "shadow", false, "x", 1), Msgpack, `unknown field "x"`},
		{"mp duplicate", OpDelete, mp("namespace", "api", "identifier", "a", "identifier", "b"), Msgpack, `duplicate field "identifier"`},
		{"mp header lies", OpDelete, append(msgp.AppendMapHeader(nil, 1<<31), 0xa1, 'x'), Msgpack, `unknown field "x"`},
		{"delete missing identifier", OpDelete, []byte(`{"namespace":"api"}`), JSON, `missing field "identifier"`},
		{"delete extra", OpDelete, []byte(`{"namespace":"api","identifier":"a","limit":1}`), JSON, `unknown field "limit"`},
		{"list bad namespace", OpList, []byte(`{"namespace":""}`), JSON, `namespace "" is not`},
		{"list unknown", OpList, []byte(`{"ns":"api"}`), JSON, `unknown field "ns"`},
		{"get missing identifier", OpGet, []byte(`{"namespace":"api"}`), JSON, `missing field "identifier"`},
		{"get two stars", OpGet, mp("namespace", "api", "identifier", "org:**"), Msgpack, "has two adjacent *"},
		{"delete two stars", OpDelete, []byte(`{"namespace":"api","identifier":"**"}`), JSON, "has two adjacent *"},
		{"get extra", OpGet, []byte(`{"namespace":"api","identifier":"a","cursor":"x"}`), JSON, `unknown field "cursor"`},
		{"window and duration", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":1000,"window":"month"}`), JSON, "duration and window both given"},
		{"window not calendar", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"window":"fixed"}`), JSON, `window "fixed" is not a calendar period: minute, hour`},
		{"window bad zone", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"window":"day@Mars/Olympus"}`), JSON, `time zone "Mars/Olympus" is not an IANA zone name`},
		{"neither", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1}`), JSON, "duration is required (or a calendar window)"},
		{"code as duration", OpSet, []byte(`{"namespace":"api","identifier":"a","limit":1,"duration":1099511627781}`), JSON, "duration 1099511627781 out of range"},
		{"reset window and duration", OpReset, []byte(`{"namespace":"api","identifier":"a","duration":1000,"window":"day"}`), JSON, "duration and window both given"},
		{"reset duration range", OpReset, []byte(`{"namespace":"api","identifier":"a","duration":999}`), JSON, "duration 999 out of range"},
		{"reset duration zero", OpReset, []byte(`{"namespace":"api","identifier":"a","duration":0}`), JSON, "leave it out to reset every duration"},
		{"reset empty identifier", OpReset, []byte(`{"namespace":"api","identifier":""}`), JSON, "identifier of 0 bytes"},
		{"reset long identifier", OpReset, []byte(`{"namespace":"api","identifier":"` + big + `"}`), JSON, "identifier of 513 bytes is longer than 512"},
	} {
		err := decode(c.op, c.body, c.enc)
		if !isBadRequest(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a *wire.BadRequestError with %q", c.name, err, c.want)
		}
	}
}

// decode runs op's request decoder.
func decode(op Op, body []byte, enc Encoding) error {
	var err error
	switch op {
	case OpSet:
		_, err = DecodeSet(body, enc)
	case OpDelete:
		_, err = DecodeDelete(body, enc)
	case OpList:
		_, err = DecodeList(body, enc)
	case OpReset:
		_, err = DecodeReset(body, enc)
	case OpGet:
		_, err = DecodeGet(body, enc)
	}
	return err
}

func TestDecodeListAndResetTakeTheirOptionalFields(t *testing.T) {
	for _, body := range []string{"", "  ", "{}"} {
		if r, err := DecodeList([]byte(body), JSON); err != nil || r.Namespace != "" {
			t.Errorf("list %q: %+v, %v", body, r, err)
		}
	}
	if r, err := DecodeList(nil, Msgpack); err != nil || r.Namespace != "" {
		t.Errorf("empty msgpack list: %+v, %v", r, err)
	}
	if r, err := DecodeList(mp("namespace", "web"), Msgpack); err != nil || r.Namespace != "web" {
		t.Errorf("list of web: %+v, %v", r, err)
	}
	r, err := DecodeReset([]byte(`{"namespace":"api","identifier":"a*b"}`), JSON)
	if err != nil || r != (ResetRequest{Namespace: "api", Identifier: "a*b"}) {
		t.Errorf("reset of every duration (an identifier with * is literal): %+v, %v", r, err)
	}
	r, err = DecodeReset(mp("namespace", "api", "identifier", []byte{0, 0xff}, "duration", 60000), Msgpack)
	if err != nil || r != (ResetRequest{Namespace: "api", Identifier: "\x00\xff", Duration: 60000}) {
		t.Errorf("reset of one duration: %+v, %v", r, err)
	}
}

func TestRequestsRoundTripInBothEncodings(t *testing.T) {
	for _, enc := range []Encoding{JSON, Msgpack} {
		for _, s := range []SetRequest{
			{Namespace: "api", Identifier: "user_*", Limit: 100, Duration: 60_000, Shadow: true},
			{Namespace: "api", Identifier: "é\x00", Limit: 0, Duration: 1000},
			{Namespace: "api", Identifier: "tenant_*", Limit: 10_000, Duration: calendar(t, "month@Europe/Berlin")},
		} {
			if got, err := DecodeSet(s.Append(nil, enc), enc); err != nil || got != s {
				t.Errorf("enc %d: set %+v came back %+v, %v", enc, s, got, err)
			}
		}
		d := DeleteRequest{Namespace: "api", Identifier: "*"}
		if got, err := DecodeDelete(d.Append(nil, enc), enc); err != nil || got != d {
			t.Errorf("enc %d: delete came back %+v, %v", enc, got, err)
		}
		for _, l := range []ListRequest{{}, {Namespace: "web"}} {
			if got, err := DecodeList(l.Append(nil, enc), enc); err != nil || got != l {
				t.Errorf("enc %d: list %+v came back %+v, %v", enc, l, got, err)
			}
		}
		for _, r := range []ResetRequest{{Namespace: "api", Identifier: "a"}, {Namespace: "api", Identifier: "a", Duration: 1000},
			{Namespace: "api", Identifier: "a", Duration: calendar(t, "day@Asia/Tokyo")}} {
			if got, err := DecodeReset(r.Append(nil, enc), enc); err != nil || got != r {
				t.Errorf("enc %d: reset %+v came back %+v, %v", enc, r, got, err)
			}
		}
	}
}

func TestResponsesRoundTripInBothEncodings(t *testing.T) {
	o := Override{Namespace: "api", Identifier: "user_*", Limit: 5, Duration: 60_000, Shadow: true}
	for _, enc := range []Encoding{JSON, Msgpack} {
		if got, err := DecodeOverride(AppendOverride(nil, enc, o), enc); err != nil || got != o {
			t.Errorf("enc %d: override came back %+v, %v", enc, got, err)
		}
		monthly := Override{Namespace: "api", Identifier: "tenant_*", Limit: 10_000, Duration: calendar(t, "month@Europe/Berlin")}
		if b := AppendOverride(nil, enc, monthly); !bytes.Contains(b, []byte("month@Europe/Berlin")) || bytes.Contains(b, []byte("duration")) {
			t.Errorf("enc %d: a monthly override written as %q, want its window and no duration", enc, b)
		} else if got, err := DecodeOverride(b, enc); err != nil || got != monthly {
			t.Errorf("enc %d: a monthly override came back %+v, %v", enc, got, err)
		}
		for _, r := range []ResetResponse{{Namespace: "api", Identifier: "\x00*", Reset: 1800000000000},
			{Namespace: "api", Identifier: "u", Duration: calendar(t, "week"), Reset: 1},
			{Namespace: "api", Identifier: "u", Duration: 60_000, Reset: 1}} {
			if got, err := DecodeResetResponse(AppendReset(nil, enc, r), enc); err != nil || got != r {
				t.Errorf("enc %d: reset reply came back %+v, %v", enc, got, err)
			}
		}
		if _, err := DecodeResetResponse(AppendOverride(nil, enc, o), enc); !isBadRequest(err) {
			t.Errorf("enc %d: an override read as a reset reply: %v", enc, err)
		}
		for _, l := range []ListResponse{{}, {Overrides: []Override{o, {Namespace: "web", Identifier: "x", Limit: 1, Duration: 1000}}}} {
			got, err := DecodeListResponse(AppendList(nil, enc, l), enc)
			if err != nil || len(got.Overrides) != len(l.Overrides) {
				t.Fatalf("enc %d: list came back %+v, %v", enc, got, err)
			}
			for i := range l.Overrides {
				if got.Overrides[i] != l.Overrides[i] {
					t.Errorf("enc %d: override %d came back %+v", enc, i, got.Overrides[i])
				}
			}
		}
	}
	if got := string(AppendList(nil, JSON, ListResponse{})); got != `{"overrides":[]}` {
		t.Errorf("empty JSON list = %s", got)
	}
	if got := string(AppendDelete(nil, JSON, DeleteResponse{Deleted: true})); got != `{"deleted":true}` {
		t.Errorf("delete reply = %s", got)
	}
	if got := string(AppendReset(nil, JSON, ResetResponse{Namespace: "api", Identifier: "a", Reset: 1800000000000})); got != `{"namespace":"api","identifier":"a","duration":0,"reset":1800000000000}` {
		t.Errorf("reset reply = %s", got)
	}
	want := mp("deleted", true)
	if got := AppendDelete(nil, Msgpack, DeleteResponse{Deleted: true}); string(got) != string(want) {
		t.Errorf("msgpack delete reply = %x, want %x", got, want)
	}
	want = mp("namespace", "api", "identifier", "a", "duration", 0, "reset", 1800000000000)
	if got := AppendReset(nil, Msgpack, ResetResponse{Namespace: "api", Identifier: "a", Reset: 1800000000000}); string(got) != string(want) {
		t.Errorf("msgpack reset reply = %x, want %x", got, want)
	}
	if _, err := DecodeListResponse([]byte(`{"overrides":[{"namespace":"api"}]}`), JSON); !isBadRequest(err) || !strings.Contains(err.Error(), "override 0") {
		t.Errorf("a list with an incomplete override: %v", err)
	}
	if _, err := DecodeListResponse([]byte(`{"items":[]}`), JSON); !isBadRequest(err) {
		t.Errorf("a list of the wrong field: %v", err)
	}
	if _, err := DecodeListResponse(mp("items", 1), Msgpack); !isBadRequest(err) {
		t.Errorf("a msgpack list of the wrong field: %v", err)
	}
}

func TestSubjects(t *testing.T) {
	for _, op := range Ops() {
		s := Subject("ratelimit", "acme", op)
		ws, got, err := ParseSubject("ratelimit", s)
		if err != nil || ws != "acme" || got != op {
			t.Errorf("%s: %q %q %v", s, ws, got, err)
		}
	}
	if got := Subject("rl", "acme", OpSet); got != "rl.admin.acme.override.set" {
		t.Errorf("Subject = %s", got)
	}
	for _, s := range []string{"ratelimit.admin.acme", "ratelimit.admin.acme.override.put", "ratelimit.check.acme.api", "ratelimit.admin.a*b.reset", "other.admin.acme.reset"} {
		if _, _, err := ParseSubject("ratelimit", s); !isBadRequest(err) {
			t.Errorf("ParseSubject(%q) = %v", s, err)
		}
	}
}

func calendar(t *testing.T, s string) int64 {
	t.Helper()
	d, ok, err := window.ParseCalendar(s)
	if !ok || err != nil {
		t.Fatalf("%s: %v, %v", s, ok, err)
	}
	return d
}
