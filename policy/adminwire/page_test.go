package adminwire

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/policy"
)

// rawCursor is the base64url of version, then each part with its uvarint
// length, written apart from EncodeCursor.
func rawCursor(version byte, parts ...string) string {
	b := []byte{version}
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// Cursors come back as the position they were made of, at every length up
// to the longest, which is MaxCursorLen long.
func TestCursorsRoundTrip(t *testing.T) {
	longest := policy.Position{Namespace: strings.Repeat("n", 64), Pattern: strings.Repeat("\xff", 511) + "*"}
	for _, p := range []policy.Position{{Namespace: "api", Pattern: "user_*"}, {Namespace: "a", Pattern: "\x00"}, longest} {
		c := EncodeCursor(p)
		if got, err := DecodeCursor(c); err != nil || got != p {
			t.Errorf("%+v: cursor %q came back %+v, %v", p, c, got, err)
		}
		if strings.ContainsAny(c, "+/=") || len(c) > MaxCursorLen {
			t.Errorf("%+v: cursor %q is not unpadded base64url of at most %d", p, c, MaxCursorLen)
		}
	}
	if got := len(EncodeCursor(longest)); got != MaxCursorLen {
		t.Errorf("the longest cursor is %d long, MaxCursorLen %d", got, MaxCursorLen)
	}
	if got := EncodeCursor(policy.Position{Namespace: "api", Pattern: "a"}); got != rawCursor(1, "api", "a") {
		t.Errorf("cursor %q, want version 1 and length-prefixed parts %q", got, rawCursor(1, "api", "a"))
	}
}

// A list request takes a cursor and a limit, in both encodings; a bad
// cursor or limit is a clear *wire.BadRequestError.
func TestDecodeListTakesACursorAndALimit(t *testing.T) {
	cur := EncodeCursor(policy.Position{Namespace: "api", Pattern: "user_9"})
	for _, c := range []struct {
		name string
		body []byte
		enc  Encoding
		want ListRequest
	}{
		{"json", []byte(`{"namespace":"api","cursor":"` + cur + `","limit":5}`), JSON, ListRequest{Namespace: "api", Cursor: cur, Limit: 5}},
		{"json no namespace", []byte(`{"cursor":"` + cur + `"}`), JSON, ListRequest{Cursor: cur}},
		{"json limit only", []byte(`{"limit":1000}`), JSON, ListRequest{Limit: 1000}},
		{"msgpack", mp("limit", uint64(1), "cursor", cur, "namespace", "api"), Msgpack, ListRequest{Namespace: "api", Cursor: cur, Limit: 1}},
	} {
		got, err := DecodeList(c.body, c.enc)
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	r, _ := DecodeList([]byte(`{"cursor":"`+cur+`"}`), JSON)
	if r.Start() != (policy.Position{Namespace: "api", Pattern: "user_9"}) || r.PageLimit() != DefaultListLimit {
		t.Errorf("start %+v, page limit %d", r.Start(), r.PageLimit())
	}
	if r := (ListRequest{}); r.Start() != (policy.Position{}) || r.PageLimit() != 1000 {
		t.Errorf("a first page starts at %+v with %d", r.Start(), r.PageLimit())
	}

	long := rawCursor(1, "api", strings.Repeat("p", 513))
	b := []byte{1, 3, 'a', 'p', 'i', 1, 'a'}
	overlong := base64.RawURLEncoding.EncodeToString([]byte{1, 0x83, 0, 'a', 'p', 'i', 1, 'a'})
	for _, c := range []struct {
		name string
		body []byte
		enc  Encoding
		want string
	}{
		{"limit 0", []byte(`{"limit":0}`), JSON, "limit 0 out of range 1..1000 (leave it out for 1000)"},
		{"limit 1001", []byte(`{"limit":1001}`), JSON, "limit 1001 out of range 1..1000"},
		{"limit negative", mp("limit", -3), Msgpack, "limit -3 out of range"},
		{"limit string", []byte(`{"limit":"5"}`), JSON, "limit must be an integer"},
		{"limit fraction", []byte(`{"limit":2.5}`), JSON, "limit must be an integer"},
		{"limit float", mp("limit", 2.0), Msgpack, "limit must be an integer"},
		{"limit huge", []byte(`{"limit":99999999999999999999}`), JSON, "limit 99999999999999999999 is out of range"},
		{"cursor number", []byte(`{"cursor":5}`), JSON, "cursor must be a string"},
		{"cursor null", []byte(`{"cursor":null}`), JSON, "cursor must be a string"},
		{"cursor bin", mp("cursor", []byte(cur)), Msgpack, "cursor must be a string"},
		{"cursor empty", []byte(`{"cursor":""}`), JSON, "cursor is not one this service wrote (empty)"},
		{"cursor only a line break", []byte(`{"cursor":"\n"}`), JSON, "(no bytes)"},
		{"cursor not base64", []byte(`{"cursor":"!!!"}`), JSON, "(not base64url"},
		{"cursor std base64", []byte(`{"cursor":"` + base64.StdEncoding.EncodeToString(b) + `"}`), JSON, "(not base64url"},
		{"cursor version", []byte(`{"cursor":"` + rawCursor(2, "api", "a") + `"}`), JSON, "(version 2, want 1)"},
		{"cursor version 0", []byte(`{"cursor":"` + rawCursor(0, "api", "a") + `"}`), JSON, "(version 0, want 1)"},
		{"cursor namespace too long", []byte(`{"cursor":"` + rawCursor(1, strings.Repeat("n", 65), "a") + `"}`), JSON, "(no valid namespace)"},
		{"cursor namespace not a token", []byte(`{"cursor":"` + rawCursor(1, "a.b", "a") + `"}`), JSON, "(no valid namespace)"},
		{"cursor namespace empty", []byte(`{"cursor":"` + rawCursor(1, "", "a") + `"}`), JSON, "(no valid namespace)"},
		{"cursor pattern too long", []byte(`{"cursor":"` + long + `"}`), JSON, "(no valid pattern)"},
		{"cursor pattern two stars", []byte(`{"cursor":"` + rawCursor(1, "api", "a**b") + `"}`), JSON, "(no valid pattern)"},
		{"cursor pattern empty", []byte(`{"cursor":"` + rawCursor(1, "api", "") + `"}`), JSON, "(no valid pattern)"},
		{"cursor length past the end", []byte(`{"cursor":"` + base64.RawURLEncoding.EncodeToString(b[:6]) + `"}`), JSON, "(no valid pattern)"},
		{"cursor no pattern", []byte(`{"cursor":"` + base64.RawURLEncoding.EncodeToString(b[:5]) + `"}`), JSON, "(no valid pattern)"},
		{"cursor trailing", []byte(`{"cursor":"` + base64.RawURLEncoding.EncodeToString(append(b, 0)) + `"}`), JSON, "(1 trailing bytes)"},
		{"cursor overlong length", []byte(`{"cursor":"` + overlong + `"}`), JSON, "(not in its canonical form)"},
		{"cursor line break", []byte(`{"cursor":"` + cur[:4] + `\n` + cur[4:] + `"}`), JSON, "(not in its canonical form)"},
		{"cursor too long", []byte(`{"cursor":"` + strings.Repeat("A", MaxCursorLen+1) + `"}`), JSON, "cursor of 775 bytes is longer than 774"},
		{"cursor of another namespace", []byte(`{"namespace":"web","cursor":"` + cur + `"}`), JSON, `cursor continues a listing of namespace "api", not of "web"`},
		{"cursor of another namespace msgpack", mp("namespace", "web", "cursor", cur), Msgpack, `not of "web"`},
		{"duplicate cursor", mp("cursor", cur, "cursor", cur), Msgpack, `duplicate field "cursor"`},
		{"duplicate limit", []byte(`{"limit":1,"limit":2}`), JSON, `duplicate field "limit"`},
	} {
		_, err := DecodeList(c.body, c.enc)
		if !isBadRequest(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a *wire.BadRequestError with %q", c.name, err, c.want)
		}
	}
}

func TestGetAndPagedListRequestsRoundTrip(t *testing.T) {
	cur := EncodeCursor(policy.Position{Namespace: "web", Pattern: "x*"})
	for _, enc := range []Encoding{JSON, Msgpack} {
		for _, g := range []GetRequest{{Namespace: "api", Identifier: "user_*"}, {Namespace: "api", Identifier: "\x00é"}} {
			if got, err := DecodeGet(g.Append(nil, enc), enc); err != nil || got != g {
				t.Errorf("enc %d: get %+v came back %+v, %v", enc, g, got, err)
			}
		}
		for _, l := range []ListRequest{{Cursor: cur}, {Limit: 7}, {Namespace: "web", Cursor: cur, Limit: 1000}} {
			if got, err := DecodeList(l.Append(nil, enc), enc); err != nil || got != l {
				t.Errorf("enc %d: list %+v came back %+v, %v", enc, l, got, err)
			}
		}
	}
	if got := string(ListRequest{Namespace: "web", Cursor: cur, Limit: 3}.Append(nil, JSON)); got != `{"namespace":"web","cursor":"`+cur+`","limit":3}` {
		t.Errorf("JSON list request = %s", got)
	}
	if got, want := (ListRequest{Cursor: cur}).Append(nil, Msgpack), mp("cursor", cur); string(got) != string(want) {
		t.Errorf("msgpack list request = %x, want %x", got, want)
	}
}

// A list reply carries next when more follow, in both encodings; JSON is
// what encoding/json writes; the client's decoder refuses a bad next.
func TestListRepliesCarryNext(t *testing.T) {
	o := Override{Namespace: "api", Identifier: "<a>&\x01", Limit: 5, Duration: 60_000}
	next := EncodeCursor(policy.Position{Namespace: "api", Pattern: o.Identifier})
	for _, l := range []ListResponse{{}, {Overrides: []Override{o}}, {Overrides: []Override{o, o}, Next: next}} {
		want, _ := json.Marshal(ListResponse{Overrides: append([]Override{}, l.Overrides...), Next: l.Next})
		if got := AppendList(nil, JSON, l); string(got) != string(want) {
			t.Errorf("JSON list %s, encoding/json writes %s", got, want)
		}
		for _, enc := range []Encoding{JSON, Msgpack} {
			got, err := DecodeListResponse(AppendList(nil, enc, l), enc)
			if err != nil || got.Next != l.Next || len(got.Overrides) != len(l.Overrides) {
				t.Errorf("enc %d: %+v came back %+v, %v", enc, l, got, err)
			}
		}
	}
	emptyWith := func(next any) []byte { // {"overrides": [], "next": next}
		return append(msgp.AppendArrayHeader(msgp.AppendString(msgp.AppendMapHeader(nil, 2), "overrides"), 0), mp("next", next)[1:]...)
	}
	if got, want := AppendList(nil, Msgpack, ListResponse{Next: "abc"}), emptyWith("abc"); string(got) != string(want) {
		t.Errorf("msgpack list with next = %x, want %x", got, want)
	}
	for _, c := range []struct {
		name string
		body []byte
		enc  Encoding
	}{
		{"next empty", []byte(`{"overrides":[],"next":""}`), JSON},
		{"next null", []byte(`{"overrides":[],"next":null}`), JSON},
		{"next number", []byte(`{"overrides":[],"next":1}`), JSON},
		{"next too long", []byte(`{"overrides":[],"next":"` + strings.Repeat("A", MaxCursorLen+1) + `"}`), JSON},
		{"mp next only", mp("next", "abc"), Msgpack},
		{"mp next bin", emptyWith([]byte("abc")), Msgpack},
		{"mp duplicate next", mp("next", "a", "next", "b"), Msgpack},
		{"mp three fields", msgp.AppendMapHeader(nil, 3), Msgpack},
		{"mp other field", mp("overrides", 1, "more", true), Msgpack},
	} {
		if _, err := DecodeListResponse(c.body, c.enc); !isBadRequest(err) {
			t.Errorf("%s: %v, want a *wire.BadRequestError", c.name, err)
		}
	}
}

// A ListWriter stops before the reply, with the longest next, would pass
// its budget, and never at the first override; what it writes is
// AppendList's reply of the overrides it took.
func TestListWriterKeepsTheReplyWithinItsBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	longNext := strings.Repeat("A", MaxCursorLen)
	for round := range 200 {
		enc := Encoding(round % 2)
		budget := 1 + r.IntN(20_000)
		w := NewListWriter(enc, budget)
		var took []Override
		for {
			id := make([]byte, 1+r.IntN(512))
			for i := range id {
				id[i] = "a<\x01é"[r.IntN(4)]
			}
			o := Override{Namespace: "api", Identifier: string(id), Limit: r.Int64N(1e15), Duration: 1000}
			if !w.Add(o) {
				break
			}
			took = append(took, o)
			if len(took) > 1000 {
				t.Fatalf("budget %d: no end", budget)
			}
		}
		if len(took) == 0 || w.Len() != len(took) {
			t.Fatalf("budget %d: took %d, Len %d; want at least the first", budget, len(took), w.Len())
		}
		body := w.Append(nil, longNext)
		if len(took) > 1 && len(body) > budget {
			t.Fatalf("enc %d: %d overrides in %d bytes, budget %d", enc, len(took), len(body), budget)
		}
		if want := AppendList(nil, enc, ListResponse{Overrides: took, Next: longNext}); string(body) != string(want) {
			t.Fatalf("enc %d: writer and AppendList differ", enc)
		}
	}
}
