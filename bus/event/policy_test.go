package event

import (
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/policy"
)

func samplePolicies() Policies {
	return Policies{Overrides: []policy.Entry{
		{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: "user_*"},
			Override: policy.Override{Limit: 5, Duration: 60_000, Shadow: true},
			Version:  policy.Version{At: 1_700_000_000_000, Origin: "us"}},
		{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: "\x00\xff bytes"},
			Override: policy.Override{Limit: 1_000_000_000_000_000, Duration: 31_622_400_000},
			Version:  policy.Version{At: 1, Origin: "eu-west_1"}},
		{Key: policy.Key{Workspace: "acme", Namespace: "web", Pattern: "gone"},
			Deleted: true, Version: policy.Version{At: 1_700_000_000_001, Origin: "ap"}},
	}, Marks: []policy.Mark{
		{Workspace: "acme", Namespace: "api", Identifier: "\x00*user", Epoch: 1_700_000_000_002},
		{Workspace: "acme", Namespace: "web", Identifier: "u", Duration: 60_000, Epoch: 1},
	}, More: true, Digest: 0xdeadbeef}
}

// An event without marks keeps the bytes it had before marks existed.
func TestPoliciesWithoutMarksKeepTheirBytes(t *testing.T) {
	p := samplePolicies()
	p.Marks = nil
	want := AppendPolicies(nil, Policies{Overrides: p.Overrides, More: true, Digest: 0xdeadbeef})
	b := msgp.AppendMapHeader(nil, 4)
	b = msgp.AppendString(b, "v")
	b = msgp.AppendUint64(b, 1)
	if got := AppendPolicies(nil, p); string(got) != string(want) || string(got[:len(b)]) != string(b) {
		t.Fatalf("an event without marks changed: %x", got)
	}
	if got := AppendPolicies(nil, Policies{Overrides: []policy.Entry{}}); string(got) != "\x82\xa1v\x01\xa1o\x90" {
		t.Fatalf("an empty event is %x", got)
	}
}

func TestPoliciesRoundTrip(t *testing.T) {
	onlyMarks := Policies{Overrides: []policy.Entry{}, Marks: samplePolicies().Marks}
	withSeq := samplePolicies()
	withSeq.Seq = 1_795_000_000_000_123
	withShards := Policies{Overrides: []policy.Entry{}, Digest: 7, Shards: make([]uint64, policy.DigestShards)}
	for i := range withShards.Shards {
		withShards.Shards[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for _, p := range []Policies{samplePolicies(), {Overrides: []policy.Entry{}}, onlyMarks, withSeq,
		{Overrides: []policy.Entry{}, Seq: 1}, withShards} {
		got, err := DecodePolicies(AppendPolicies(nil, p))
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("%+v -> %+v, %v", p, got, err)
		}
	}
}

// Every malformed or invalid event is refused with an error saying what is
// wrong, and nothing of it is returned.
func TestPoliciesRefusesWhatBreaksTheRules(t *testing.T) {
	good := AppendPolicies(nil, samplePolicies())
	entry := func(fields ...any) []byte {
		b := msgp.AppendMapHeader(nil, 2)
		b = msgp.AppendString(b, "v")
		b = msgp.AppendUint64(b, 1)
		b = msgp.AppendString(b, "o")
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, uint32(len(fields)))
		for _, f := range fields {
			b, _ = msgp.AppendIntf(b, f)
		}
		return b
	}
	ok := []any{"acme", "api", "x", 1, 60000, 0, 1700000000000, "us"}
	with := func(i int, v any) []byte {
		f := append([]any(nil), ok...)
		f[i] = v
		return entry(f...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "empty"},
		{"not a map", msgp.AppendArrayHeader(nil, 0), "map"},
		{"truncated", good[:len(good)-3], ""},
		{"trailing", append(append([]byte(nil), good...), 0xc0), "trailing"},
		{"no version", msgp.AppendArrayHeader(msgp.AppendString(msgp.AppendMapHeader(nil, 1), "o"), 0), "version"},
		{"version 2", msgp.AppendUint64(msgp.AppendString(msgp.AppendMapHeader(nil, 1), "v"), 2), "version"},
		{"no list", msgp.AppendUint64(msgp.AppendString(msgp.AppendMapHeader(nil, 1), "v"), 1), `"o"`},
		{"seven fields", entry(ok[:7]...), "7 fields"},
		{"bad workspace", with(0, "a.b"), "workspace"},
		{"pattern with two adjacent stars", with(2, "a**b"), "two adjacent *"},
		{"limit too big", with(3, uint64(1_000_000_000_000_001)), "limit"},
		{"duration too short", with(4, 999), "duration"},
		{"unknown flags", with(5, 4), "flags"},
		{"tombstone with a limit", with(5, flagDeleted), "deleted"},
		{"version 0", with(6, 0), "version"},
		{"bad origin", with(7, ""), "origin"},
		{"negative limit", with(3, -1), "limit"},
	} {
		p, err := DecodePolicies(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) || p.Overrides != nil {
			t.Errorf("%s: %+v, %v; want an error mentioning %q", tc.name, p, err, tc.want)
		}
		if _, ok := err.(*wire.BadRequestError); err != nil && !ok {
			t.Errorf("%s: error is a %T, not a *wire.BadRequestError", tc.name, err)
		}
	}
	// Digest parts: exactly policy.DigestShards integers, once.
	shards := func(n int) []byte {
		b := msgp.AppendMapHeader(nil, 3)
		b = msgp.AppendString(b, "v")
		b = msgp.AppendUint64(b, 1)
		b = msgp.AppendString(b, "o")
		b = msgp.AppendArrayHeader(b, 0)
		b = msgp.AppendString(b, "d")
		b = msgp.AppendArrayHeader(b, uint32(n))
		for range n {
			b = msgp.AppendUint64(b, 1)
		}
		return b
	}
	for _, n := range []int{0, 1, policy.DigestShards - 1, policy.DigestShards + 1} {
		if p, err := DecodePolicies(shards(n)); err == nil || !strings.Contains(err.Error(), `"d" must hold`) || p.Shards != nil {
			t.Errorf("%d digest parts: %+v, %v; want refused", n, p, err)
		}
	}
	if _, err := DecodePolicies(shards(policy.DigestShards)); err != nil {
		t.Errorf("%d digest parts refused: %v", policy.DigestShards, err)
	}
	mark := func(fields ...any) []byte {
		b := msgp.AppendMapHeader(nil, 3)
		b = msgp.AppendString(b, "v")
		b = msgp.AppendUint64(b, 1)
		b = msgp.AppendString(b, "o")
		b = msgp.AppendArrayHeader(b, 0)
		b = msgp.AppendString(b, "r")
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, uint32(len(fields)))
		for _, f := range fields {
			b, _ = msgp.AppendIntf(b, f)
		}
		return b
	}
	okMark := []any{"acme", "api", "x", 0, 1700000000000}
	withMark := func(i int, v any) []byte {
		f := append([]any(nil), okMark...)
		f[i] = v
		return mark(f...)
	}
	if p, err := DecodePolicies(mark(okMark...)); err != nil || len(p.Marks) != 1 {
		t.Fatalf("a good mark: %+v, %v", p, err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"four fields", mark(okMark[:4]...), "4 fields"},
		{"bad namespace", withMark(1, "a.b"), "namespace"},
		{"empty identifier", withMark(2, ""), "identifier"},
		{"duration too short", withMark(3, 999), "duration"},
		{"negative duration", withMark(3, -1), "duration"},
		{"epoch 0", withMark(4, 0), "epoch"},
		{"epoch too far", withMark(4, uint64(1)<<53), "epoch"},
		{"marks not a list", append(msgp.AppendMapHeader(nil, 3), "\xa1v\x01\xa1o\x90\xa1r\x01"...), `"r"`},
	} {
		p, err := DecodePolicies(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) || p.Marks != nil {
			t.Errorf("%s: %+v, %v; want an error mentioning %q", tc.name, p, err, tc.want)
		}
	}
	// Unknown keys are skipped.
	b := msgp.AppendMapHeader(nil, 3)
	b = msgp.AppendString(b, "future")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendString(b, "x")
	b = append(b, good[1:]...) // the good map's two... four entries
	b[0] = 0x80 | byte(1+5)
	if p, err := DecodePolicies(b); err != nil || len(p.Overrides) != 3 {
		t.Fatalf("an unknown key: %+v, %v", p, err)
	}
}

// Whatever the decoder accepts is valid and encodes back to the same event.
func FuzzDecodePolicies(f *testing.F) {
	f.Add(AppendPolicies(nil, samplePolicies()))
	f.Add(AppendPolicies(nil, Policies{Overrides: []policy.Entry{}}))
	f.Add([]byte{0x82, 0xa1, 'v', 0x01, 0xa1, 'o', 0x90})
	f.Add(AppendPolicies(nil, Policies{Overrides: []policy.Entry{}, Digest: 3, Shards: make([]uint64, policy.DigestShards)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePolicies(b)
		if err != nil {
			return
		}
		for _, e := range p.Overrides {
			if err := e.Validate(); err != nil {
				t.Fatalf("accepted an invalid entry %+v: %v", e, err)
			}
		}
		for _, m := range p.Marks {
			if err := m.Validate(); err != nil {
				t.Fatalf("accepted an invalid mark %+v: %v", m, err)
			}
		}
		again, err := DecodePolicies(AppendPolicies(nil, p))
		if err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("%+v re-encoded -> %+v, %v", p, again, err)
		}
	})
}
