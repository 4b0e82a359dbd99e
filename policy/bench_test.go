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
			if _, _, ok := tab.Match(c.ws, c.ns, c.id); ok != c.want {
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

// globTable returns a table of n overrides in one namespace: a third exact
// identifiers, a third prefixes, a third globs with an inner '*' under as
// many literal prefixes, and 100 globs with a leading '*' (all under the
// empty literal prefix, tried by every check of the namespace).
func globTable(b *testing.B, n int) *Table {
	tab := NewTable()
	var batch []Entry
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("user_%06d", i)
		switch i % 3 {
		case 1:
			p = fmt.Sprintf("org_%05d:*", i)
		case 2:
			p = fmt.Sprintf("org_%05d:*:admin", i)
		}
		batch = append(batch, Entry{Key: Key{"acme", "api", p}, Override: Override{Limit: int64(i), Duration: 60_000},
			Version: Version{At: now0, Origin: "us"}})
	}
	for i := 0; i < 100; i++ {
		batch = append(batch, Entry{Key: Key{"acme", "api", fmt.Sprintf("*:role_%03d", i)}, Override: Override{Limit: 1, Duration: 60_000},
			Version: Version{At: now0, Origin: "us"}})
	}
	if _, err := tab.Merge(batch...); err != nil {
		b.Fatal(err)
	}
	return tab
}

// BenchmarkMatchGlobs measures Match in a namespace that holds globs (10,000
// overrides, globTable): no match, an exact match, a prefix match, a glob
// under a literal prefix and a glob with a leading '*'.
func BenchmarkMatchGlobs(b *testing.B) {
	tab := globTable(b, 10_000)
	for _, c := range []struct{ name, id, want string }{
		{"none", "someone-else-entirely", ""},
		{"exact", "user_004242", "user_004242"},
		{"prefix", "org_04243:member-17", "org_04243:*"},
		{"glob", "org_04244:team-3:admin", "org_04244:*:admin"},
		{"leading-star", "team-3:role_042", "*:role_042"},
	} {
		b.Run(c.name, func(b *testing.B) {
			if _, p, _ := tab.Match("acme", "api", c.id); p != c.want {
				b.Fatalf("Match(%q) = %q, want %q", c.id, p, c.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				tab.Match("acme", "api", c.id)
			}
		})
	}
}

// BenchmarkSet measures a change at the bound: replacing one exact or
// prefix override of a namespace of 10,000 (benchTable), or a glob of one
// that holds globs (globTable).
func BenchmarkSet(b *testing.B) {
	plain, globs := benchTable(b, 10_000), globTable(b, 10_000)
	for _, c := range []struct {
		tab *Table
		p   string
	}{{plain, "user_004242"}, {plain, "org_04243:*"}, {globs, "org_04244:*:admin"}} {
		b.Run(c.p, func(b *testing.B) {
			b.ReportAllocs()
			now := int64(now0)
			for b.Loop() {
				now++
				if _, err := c.tab.Set(Key{"acme", "api", c.p}, Override{Limit: now, Duration: 60_000}, now, "us"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSetAmongWorkspaces measures a change in one workspace of a
// table holding 1,000 workspaces of 10 overrides each: what a change costs
// at a fleet's scale, whatever the other workspaces hold.
func BenchmarkSetAmongWorkspaces(b *testing.B) {
	tab := NewTable()
	for w := range 1000 {
		for i := range 10 {
			if _, err := tab.Set(Key{fmt.Sprintf("ws%04d", w), "api", fmt.Sprint("user_", i)}, Override{Limit: 5, Duration: 60_000}, now0, "us"); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	now := int64(now0)
	for b.Loop() {
		now++
		if _, err := tab.Set(Key{"ws0500", "api", "user_3"}, Override{Limit: now, Duration: 60_000}, now, "us"); err != nil {
			b.Fatal(err)
		}
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
