package policy

import (
	"fmt"
	"testing"
)

// benchTable returns a table of n overrides in one namespace of one
// workspace (the worst case for a namespace's maps), half exact identifiers
// and half prefixes, beside a few other namespaces and workspaces.
func benchTable(b *testing.B, n int) *Table {
	tab := NewTable()
	var batch []Entry
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("user_%06d", i)
		if i%2 == 1 {
			p = fmt.Sprintf("org_%05d:*", i)
		}
		batch = append(batch, Entry{Key: Key{"acme", "api", p}, Override: Override{Limit: int64(i), Duration: 60_000},
			Version: Version{At: now0, Origin: "us"}})
	}
	for i := 0; i < 10; i++ {
		batch = append(batch, Entry{Key: Key{fmt.Sprint("ws", i), "api", "x*"}, Override: Override{Limit: 1, Duration: 60_000},
			Version: Version{At: now0, Origin: "us"}})
	}
	if _, err := tab.Merge(batch...); err != nil {
		b.Fatal(err)
	}
	return tab
}

// BenchmarkMatch measures Match on the check path: a table of 10,000
// overrides, with no match in an overridden namespace, in a namespace with
// none, an exact match and a prefix match; and an empty table.
func BenchmarkMatch(b *testing.B) {
	tab := benchTable(b, 10_000)
	for _, c := range []struct {
		name, ws, ns, id string
		want             bool
	}{
		{"none", "acme", "api", "someone-else-entirely", false},
		{"none-namespace", "acme", "web", "user_000042", false},
		{"exact", "acme", "api", "user_004242", true},
		{"prefix", "acme", "api", "org_04243:member-17", true},
	} {
		b.Run(c.name, func(b *testing.B) {
			if _, ok := tab.Match(c.ws, c.ns, c.id); ok != c.want {
				b.Fatalf("Match(%q) = %v, want %v", c.id, ok, c.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				tab.Match(c.ws, c.ns, c.id)
			}
		})
	}
	b.Run("empty-table", func(b *testing.B) {
		empty := NewTable()
		b.ReportAllocs()
		for b.Loop() {
			empty.Match("acme", "api", "user_004242")
		}
	})
}

// BenchmarkSet measures a change at the bound: replacing one exact or
// prefix override of a namespace of 10,000.
func BenchmarkSet(b *testing.B) {
	tab := benchTable(b, 10_000)
	for _, p := range []string{"user_004242", "org_04243:*"} {
		b.Run(p, func(b *testing.B) {
			b.ReportAllocs()
			now := int64(now0)
			for b.Loop() {
				now++
				if _, err := tab.Set(Key{"acme", "api", p}, Override{Limit: now, Duration: 60_000}, now, "us"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEpoch measures the reset-mark lookup a decision makes, with
// 10,000 marks held, for an identifier with none and one with a mark.
func BenchmarkEpoch(b *testing.B) {
	ms := NewMarks()
	for i := 0; i < 10_000; i++ {
		if _, err := ms.Reset("acme", "api", fmt.Sprintf("user_%06d", i), 60_000, now0); err != nil {
			b.Fatal(err)
		}
	}
	for _, id := range []string{"someone-else", "user_004242"} {
		b.Run(id, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ms.Epoch("acme", "api", id, 60_000)
			}
		})
	}
	b.Run("no-marks", func(b *testing.B) {
		empty := NewMarks()
		b.ReportAllocs()
		for b.Loop() {
			empty.Epoch("acme", "api", "user_004242", 60_000)
		}
	})
}
