package adminwire

import (
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// FuzzDecodeRequests feeds any bytes to every request decoder in both
// encodings (sel's low bit picks the encoding, the rest, modulo 5, the
// decoder: set, delete, list, reset, get): they never panic, refuse with
// a *wire.BadRequestError, and what they accept is valid by package policy's rules
// and comes back the same from its own encoder.
func FuzzDecodeRequests(f *testing.F) {
	for _, s := range []SetRequest{{Namespace: "api", Identifier: "user_*", Limit: 100, Duration: 60_000, Shadow: true}, {Namespace: "a", Identifier: "x", Duration: 1000}} {
		f.Add(s.Append(nil, JSON), uint8(0))
		f.Add(s.Append(nil, Msgpack), uint8(1))
	}
	f.Add(DeleteRequest{Namespace: "api", Identifier: "*"}.Append(nil, Msgpack), uint8(3))
	f.Add([]byte(`{"namespace":"web"}`), uint8(4))
	f.Add(ResetRequest{Namespace: "api", Identifier: "a", Duration: 1000}.Append(nil, Msgpack), uint8(7))
	f.Add([]byte(`{"namespace":"api","identifier":"a","limit":1.5}`), uint8(0))
	cur := EncodeCursor(policy.Position{Namespace: "api", Pattern: "user_*"})
	f.Add(ListRequest{Namespace: "api", Cursor: cur, Limit: 10}.Append(nil, JSON), uint8(4))
	f.Add(ListRequest{Cursor: cur, Limit: 1000}.Append(nil, Msgpack), uint8(5))
	f.Add([]byte(`{"cursor":"AQNhcGkBYQ","limit":0}`), uint8(4))
	f.Add(GetRequest{Namespace: "api", Identifier: "user_*"}.Append(nil, JSON), uint8(8))
	f.Add(GetRequest{Namespace: "api", Identifier: "\xff"}.Append(nil, Msgpack), uint8(9))
	f.Fuzz(func(t *testing.T, body []byte, sel uint8) {
		enc := Encoding(sel & 1)
		check := func(err error) bool {
			if err != nil && !isBadRequest(err) {
				t.Fatalf("error %v is not a *wire.BadRequestError", err)
			}
			return err == nil
		}
		switch (sel >> 1) % 5 {
		case 0:
			r, err := DecodeSet(body, enc)
			if !check(err) {
				return
			}
			if err := (policy.Entry{Key: r.Key("ws"), Override: r.Override(), Version: policy.Version{At: 1, Origin: "us"}}).Validate(); err != nil {
				t.Fatalf("accepted an invalid override %+v: %v", r, err)
			}
			if got, err := DecodeSet(r.Append(nil, enc), enc); err != nil || got != r {
				t.Fatalf("%+v came back %+v, %v", r, got, err)
			}
		case 1:
			r, err := DecodeDelete(body, enc)
			if !check(err) {
				return
			}
			if err := r.Key("ws").Validate(); err != nil {
				t.Fatalf("accepted an invalid key %+v: %v", r, err)
			}
			if got, err := DecodeDelete(r.Append(nil, enc), enc); err != nil || got != r {
				t.Fatalf("%+v came back %+v, %v", r, got, err)
			}
		case 2:
			r, err := DecodeList(body, enc)
			if !check(err) {
				return
			}
			if r.Namespace != "" && !window.ValidToken(r.Namespace) {
				t.Fatalf("accepted namespace %q", r.Namespace)
			}
			if r.Limit < 0 || r.Limit > MaxListLimit || r.PageLimit() < 1 {
				t.Fatalf("accepted limit %d", r.Limit)
			}
			if r.Cursor != "" {
				p, err := DecodeCursor(r.Cursor)
				if err != nil || p != r.Start() || r.Namespace != "" && p.Namespace != r.Namespace {
					t.Fatalf("accepted cursor %q of %+v for namespace %q: %v", r.Cursor, p, r.Namespace, err)
				}
			}
			if got, err := DecodeList(r.Append(nil, enc), enc); err != nil || got != r {
				t.Fatalf("%+v came back %+v, %v", r, got, err)
			}
		case 3:
			r, err := DecodeReset(body, enc)
			if !check(err) {
				return
			}
			m := policy.Mark{Workspace: "ws", Namespace: r.Namespace, Identifier: r.Identifier, Duration: r.Duration, Epoch: 1}
			if err := m.Validate(); err != nil {
				t.Fatalf("accepted an invalid reset %+v: %v", r, err)
			}
			if got, err := DecodeReset(r.Append(nil, enc), enc); err != nil || got != r {
				t.Fatalf("%+v came back %+v, %v", r, got, err)
			}
		case 4:
			r, err := DecodeGet(body, enc)
			if !check(err) {
				return
			}
			if err := r.Key("ws").Validate(); err != nil {
				t.Fatalf("accepted an invalid key %+v: %v", r, err)
			}
			if got, err := DecodeGet(r.Append(nil, enc), enc); err != nil || got != r {
				t.Fatalf("%+v came back %+v, %v", r, got, err)
			}
		}
	})
}

// FuzzDecodeListResponse checks that a client's decoder of list replies
// never panics and that what it accepts comes back the same.
func FuzzDecodeListResponse(f *testing.F) {
	l := ListResponse{Overrides: []Override{{Namespace: "api", Identifier: "a*", Limit: 1, Duration: 1000, Shadow: true}}}
	f.Add(AppendList(nil, JSON, l), false)
	f.Add(AppendList(nil, Msgpack, l), true)
	l.Next = EncodeCursor(policy.Position{Namespace: "api", Pattern: "a*"})
	f.Add(AppendList(nil, JSON, l), false)
	f.Add(AppendList(nil, Msgpack, l), true)
	f.Fuzz(func(t *testing.T, body []byte, msgpack bool) {
		enc := JSON
		if msgpack {
			enc = Msgpack
		}
		got, err := DecodeListResponse(body, enc)
		if err != nil {
			if !isBadRequest(err) {
				t.Fatalf("error %v is not a *wire.BadRequestError", err)
			}
			return
		}
		again, err := DecodeListResponse(AppendList(nil, enc, got), enc)
		if err != nil || len(again.Overrides) != len(got.Overrides) || again.Next != got.Next {
			t.Fatalf("%+v came back %+v, %v", got, again, err)
		}
		for i := range got.Overrides {
			if again.Overrides[i] != got.Overrides[i] {
				t.Fatalf("override %d %+v came back %+v", i, got.Overrides[i], again.Overrides[i])
			}
		}
	})
}

// FuzzDecodeCursor checks that any string is either refused with
// a *wire.BadRequestError or is the one cursor EncodeCursor writes for a valid
// position.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(EncodeCursor(policy.Position{Namespace: "api", Pattern: "user_*"}))
	f.Add(EncodeCursor(policy.Position{Namespace: "a", Pattern: "\x00\xff"}))
	f.Add("AQNhcGkBYQ\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := DecodeCursor(s)
		if err != nil {
			if !isBadRequest(err) {
				t.Fatalf("error %v is not a *wire.BadRequestError", err)
			}
			return
		}
		if !window.ValidToken(p.Namespace) || policy.ValidatePattern(p.Pattern) != nil {
			t.Fatalf("accepted %q as the invalid position %+v", s, p)
		}
		if got := EncodeCursor(p); got != s {
			t.Fatalf("accepted %q for %+v, which encodes as %q", s, p, got)
		}
	})
}
