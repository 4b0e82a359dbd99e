package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// pageAll lists (ws, ns) through pages of limit, each also ended by take
// when not nil, and returns the entries and the number of pages.
func pageAll(t *testing.T, tab *Table, ws, ns string, limit int, take func() func(Entry) bool) ([]Entry, int) {
	t.Helper()
	var all []Entry
	var after Position
	for pages := 1; ; pages++ {
		var f func(Entry) bool
		if take != nil {
			f = take()
		}
		page, more := tab.Page(ws, ns, after, limit, f)
		if len(page) == 0 && more {
			t.Fatalf("page %d after %+v: empty, but more follow", pages, after)
		}
		all = append(all, page...)
		if !more {
			return all, pages
		}
		after = PositionOf(page[len(page)-1])
	}
}

func keysOf(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Namespace + "/" + e.Pattern
	}
	return out
}

// Pages of any size, also ended early by take, list exactly what List
// lists, in its order: live overrides of the workspace (and namespace), no
// tombstone, nothing of another workspace.
func TestPagesListWhatListListsInOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tab := NewTable()
	for i := range 600 {
		ws := []string{"acme", "acme", "acme", "globex"}[r.IntN(4)]
		ns := []string{"api", "web", "b", "api-2"}[r.IntN(4)]
		p := randomPattern(r)
		if _, err := tab.Set(Key{ws, ns, p}, Override{Limit: int64(i), Duration: 1000}, now0+int64(i), "us"); err != nil && !strings.Contains(err.Error(), "pattern") {
			t.Fatal(err)
		}
		if r.IntN(4) == 0 {
			_, _ = tab.Delete(Key{ws, ns, p}, now0+int64(i)+1, "us")
		}
	}
	for _, ns := range []string{"", "api", "web", "b", "nothing"} {
		want := keysOf(tab.List("acme", ns))
		for _, limit := range []int{1, 2, 7, 1000} {
			got, _ := pageAll(t, tab, "acme", ns, limit, nil)
			if g, w := strings.Join(keysOf(got), "|"), strings.Join(want, "|"); g != w {
				t.Fatalf("namespace %q, pages of %d:\n got %s\nwant %s", ns, limit, g, w)
			}
			for _, e := range got {
				if e.Deleted || e.Workspace != "acme" {
					t.Fatalf("listed %v", e)
				}
			}
		}
		// A take that holds 3 entries a page: pages of 3 however large
		// the limit.
		got, pages := pageAll(t, tab, "acme", ns, 1000, func() func(Entry) bool {
			n := 0
			return func(Entry) bool { n++; return n <= 3 }
		})
		if strings.Join(keysOf(got), "|") != strings.Join(want, "|") || pages != max(1, (len(want)+2)/3) {
			t.Fatalf("namespace %q through take: %d entries in %d pages, want %d in %d", ns, len(got), pages, len(want), (len(want)+2)/3)
		}
	}
}

// more is false when only tombstones follow; a limit below 1 returns
// nothing; a take that refuses the first entry returns an empty page with
// more; a position in a namespace other than the one asked returns from
// that namespace's start or nothing, by order.
func TestPageEdges(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "a", 1)
	mustSet(t, tab, "acme", "api", "b", 2)
	mustSet(t, tab, "acme", "api", "c", 3)
	if _, err := tab.Delete(Key{"acme", "api", "c"}, now0+1, "us"); err != nil {
		t.Fatal(err)
	}
	mustSet(t, tab, "acme", "zz", "z", 1)
	if _, err := tab.Delete(Key{"acme", "zz", "z"}, now0+1, "us"); err != nil {
		t.Fatal(err)
	}
	if page, more := tab.Page("acme", "", Position{}, 2, nil); len(page) != 2 || more {
		t.Fatalf("two live, then tombstones: %v, more %v; want 2 and no more", page, more)
	}
	if page, more := tab.Page("acme", "api", Position{"api", "a"}, 1, nil); len(page) != 1 || page[0].Pattern != "b" || more {
		t.Fatalf("after a: %v, more %v", page, more)
	}
	if page, more := tab.Page("acme", "api", Position{"api", "aa"}, 5, nil); len(page) != 1 || page[0].Pattern != "b" {
		t.Fatalf("after a position between patterns: %v, more %v", page, more)
	}
	if page, more := tab.Page("acme", "api", Position{}, 0, nil); len(page) != 0 || !more {
		t.Fatalf("limit 0: %v, more %v", page, more)
	}
	if page, more := tab.Page("acme", "api", Position{}, 5, func(Entry) bool { return false }); len(page) != 0 || !more {
		t.Fatalf("take refusing all: %v, more %v", page, more)
	}
	if page, _ := tab.Page("acme", "api", Position{"ab", "x"}, 5, nil); len(page) != 2 {
		t.Fatalf("namespace api after a position in ab: %v", page)
	}
	if page, more := tab.Page("acme", "api", Position{"b", ""}, 5, nil); len(page) != 0 || more {
		t.Fatalf("namespace api after a position in b: %v, more %v", page, more)
	}
	if page, more := tab.Page("nobody", "", Position{}, 5, nil); len(page) != 0 || more {
		t.Fatalf("unknown workspace: %v, more %v", page, more)
	}
	if page, more := NewTable().Page("acme", "", Position{}, 5, nil); len(page) != 0 || more {
		t.Fatalf("empty table: %v, more %v", page, more)
	}
}

// A listing interleaved with sets and deletes of other patterns (new ones,
// replaced ones, deleted and set again, pruned tombstones) returns no
// override twice, in strictly increasing order, and every override that
// was live from its first page to its last.
func TestPagesUnderChangeMissNoSurvivorAndRepeatNothing(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 9))
		tab := NewTable()
		at := int64(now0)
		key := func(i int) Key { return Key{"acme", fmt.Sprintf("ns%d", i%3), fmt.Sprintf("p%04d", i)} }
		stable := map[Key]bool{}
		for i := range 300 {
			at++
			if _, err := tab.Set(key(i), Override{Limit: 1, Duration: 1000}, at, "us"); err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				stable[key(i)] = true // never touched again
			}
		}
		churn := func() {
			for range 1 + r.IntN(20) {
				at++
				i := 2*r.IntN(400) + 1 // odd: not stable; beyond 300: new
				if r.IntN(3) == 0 {
					_, _ = tab.Delete(key(i), at, "us")
				} else if _, err := tab.Set(key(i), Override{Limit: at, Duration: 1000}, at, "us"); err != nil {
					t.Fatal(err)
				}
				if r.IntN(10) == 0 {
					tab.Prune(at - int64(r.IntN(50)))
				}
			}
		}
		seen := map[Key]bool{}
		var after Position
		limit := 1 + r.IntN(40)
		for {
			churn()
			page, more := tab.Page("acme", "", after, limit, nil)
			for _, e := range page {
				p := PositionOf(e)
				if p.Namespace < after.Namespace || p.Namespace == after.Namespace && p.Pattern <= after.Pattern {
					t.Fatalf("seed %d: %+v listed after %+v", seed, p, after)
				}
				if seen[e.Key] {
					t.Fatalf("seed %d: %v listed twice", seed, e.Key)
				}
				seen[e.Key] = true
				after = p
			}
			if !more {
				break
			}
		}
		for k := range stable {
			if !seen[k] {
				t.Fatalf("seed %d: %v, live throughout, missed", seed, k)
			}
		}
	}
}

// Lookup finds a live override and refuses, as Delete does, a pattern
// never set or deleted.
func TestLookupFindsOnlyLiveOverrides(t *testing.T) {
	tab := NewTable()
	set := mustSet(t, tab, "acme", "api", "user_*", 4)
	if e, err := tab.Lookup(Key{"acme", "api", "user_*"}); err != nil || e != set {
		t.Fatalf("lookup: %v, %v; want %v", e, err, set)
	}
	if _, err := tab.Delete(Key{"acme", "api", "user_*"}, now0+1, "us"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []Key{{"acme", "api", "user_*"}, {"acme", "api", "user_1"}, {"globex", "api", "user_*"}} {
		_, err := tab.Lookup(k)
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no such override: "+k.Workspace+"/api pattern") {
			t.Fatalf("lookup of %v: %v, want ErrNotFound", k, err)
		}
	}
}

// BenchmarkPage reads a page of 1000 from the middle of a namespace of
// 10,000 overrides: warm (the sorted patterns kept) and after a new
// pattern (sorted again).
func BenchmarkPage(b *testing.B) {
	tab := NewTable()
	for i := range MaxOverridesPerWorkspace - 1 {
		if _, err := tab.Set(Key{"acme", "api", fmt.Sprintf("%08x", uint32(i)*2654435761)}, Override{Limit: 1, Duration: 1000}, now0, "us"); err != nil {
			b.Fatal(err)
		}
	}
	after := Position{"api", "80000000"}
	b.Run("warm", func(b *testing.B) {
		for range b.N {
			if page, _ := tab.Page("acme", "api", after, 1000, nil); len(page) != 1000 {
				b.Fatal(len(page))
			}
		}
	})
	b.Run("after-a-new-pattern", func(b *testing.B) {
		for range b.N {
			mustSet(b, tab, "acme", "api", "new", 1) // pruned below: a new pattern each time
			if page, _ := tab.Page("acme", "api", after, 1000, nil); len(page) != 1000 {
				b.Fatal(len(page))
			}
			b.StopTimer()
			if _, err := tab.Delete(Key{"acme", "api", "new"}, now0+1, "us"); err != nil {
				b.Fatal(err)
			}
			tab.Prune(now0 + 2)
			b.StartTimer()
		}
	})
}
