package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/window"
)

const now0 = 1_800_000_000_000 // a unix millisecond in 2027

func mustSet(t testing.TB, tab *Table, ws, ns, pattern string, limit int64) Entry {
	t.Helper()
	e, err := tab.Set(Key{ws, ns, pattern}, Override{Limit: limit, Duration: 60_000}, now0, "us")
	if err != nil {
		t.Fatalf("set %s/%s %q: %v", ws, ns, pattern, err)
	}
	return e
}

func TestMatchTakesTheExactPatternThenTheLongestPrefix(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "alice", 1)
	mustSet(t, tab, "acme", "api", "al*", 2)
	mustSet(t, tab, "acme", "api", "a*", 3)
	mustSet(t, tab, "acme", "api", "bob*", 4)
	mustSet(t, tab, "acme", "api", "bob", 5)
	mustSet(t, tab, "acme", "web", "*", 6)
	mustSet(t, tab, "acme", "web", "carol*", 7)
	mustSet(t, tab, "other", "api", "alice", 8)
	mustSet(t, tab, "acme", "api", "x\x00y*", 9)

	for _, c := range []struct {
		ws, ns, id string
		limit      int64 // 0: no match
	}{
		{"acme", "api", "alice", 1},     // exact beats every prefix
		{"acme", "api", "alicia", 2},    // longest prefix
		{"acme", "api", "al", 2},        // a prefix matches itself
		{"acme", "api", "albert", 2},    // longest prefix
		{"acme", "api", "a", 3},         // shorter prefix
		{"acme", "api", "anna", 3},      // only the shorter prefix
		{"acme", "api", "bob", 5},       // exact beats an equal prefix
		{"acme", "api", "bobby", 4},     // prefix
		{"acme", "api", "b", 0},         // shorter than the prefix
		{"acme", "api", "carol", 0},     // another namespace's pattern
		{"acme", "api", "x\x00yz", 9},   // any bytes
		{"acme", "api", "x\x00", 0},     // a prefix of the prefix
		{"acme", "web", "anyone", 6},    // "*" covers the namespace
		{"acme", "web", "carolyn", 7},   // longer than "*"
		{"acme", "web", "carol", 7},     // a prefix matches itself
		{"other", "api", "alice", 8},    // each workspace its own
		{"other", "api", "alicia", 0},   // no prefix in that workspace
		{"nobody", "api", "alice", 0},   // unknown workspace
		{"acme", "nothing", "alice", 0}, // unknown namespace
		{"acme", "api", "ALICE", 0},     // bytes compare exactly
		{"acme", "api", strings.Repeat("a", 512), 3},
	} {
		o, _, ok := tab.Match(c.ws, c.ns, c.id)
		switch {
		case c.limit == 0 && ok:
			t.Errorf("Match(%s, %s, %q) = %+v, want none", c.ws, c.ns, c.id, o)
		case c.limit != 0 && (!ok || o.Limit != c.limit):
			t.Errorf("Match(%s, %s, %q) = %+v, %v, want limit %d", c.ws, c.ns, c.id, o, ok, c.limit)
		}
	}
}

func TestMatchOfAnEmptyTableFindsNothing(t *testing.T) {
	if o, _, ok := NewTable().Match("acme", "api", "alice"); ok {
		t.Fatalf("empty table matched %+v", o)
	}
}

func TestGenerationChangesWithEveryChangeThatMatchSees(t *testing.T) {
	tab := NewTable()
	g0 := tab.Generation()
	e := mustSet(t, tab, "acme", "api", "a*", 1)
	g1 := tab.Generation()
	if g1 == g0 {
		t.Fatal("a set left the generation")
	}
	if n, _ := tab.Merge(e); n != 0 || tab.Generation() != g1 {
		t.Fatal("a merge that changed nothing moved the generation")
	}
	if _, err := tab.Delete(e.Key, now0, "us"); err != nil {
		t.Fatal(err)
	}
	if tab.Generation() == g1 {
		t.Fatal("a delete left the generation")
	}
}

// reference is Match by brute force over the live entries, written from
// the rule and not from the table's code: every pattern is tried with
// naiveMatch, and the winner is the one first by rank.
func reference(entries []Entry, ws, ns, id string) (matched, bool) {
	var best *Entry
	for i, e := range entries {
		if e.Deleted || e.Workspace != ws || e.Namespace != ns || !naiveMatch(e.Pattern, id) {
			continue
		}
		if best == nil || slices.Compare(rank(e.Pattern), rank(best.Pattern)) < 0 {
			best = &entries[i]
		}
	}
	if best == nil {
		return matched{}, false
	}
	return matched{Override: best.Override, Pattern: best.Pattern}, true
}

// matched is what Match answers, as one comparable value.
type matched struct {
	Override
	Pattern string
}

// match is tab.Match as one comparable value.
func match(tab *Table, ws, ns, id string) (matched, bool) {
	o, p, ok := tab.Match(ws, ns, id)
	return matched{o, p}, ok
}

// rank is the precedence of pattern p as a tuple, smallest first: more
// literal bytes; then fewer '*'; then a longer literal prefix; then the
// pattern's bytes, one by one (a prefix of another pattern before it, as
// byte order has it).
func rank(p string) []int {
	stars := strings.Count(p, "*")
	lead := strings.IndexByte(p, '*')
	if lead < 0 {
		lead = len(p)
	}
	out := []int{-(len(p) - stars), stars, -lead}
	for i := 0; i < len(p); i++ {
		out = append(out, int(p[i]))
	}
	return out
}

// naiveMatch reports whether p matches id, where '*' matches any run of
// bytes: dynamic programming over every split, nothing clever.
func naiveMatch(p, id string) bool {
	// m[j]: p[:i] matches id[:j], for the current i.
	m := make([]bool, len(id)+1)
	m[0] = true
	for i := 0; i < len(p); i++ {
		next := make([]bool, len(id)+1)
		for j := 0; j <= len(id); j++ {
			if p[i] == '*' {
				next[j] = m[j] || j > 0 && next[j-1]
			} else {
				next[j] = j > 0 && m[j-1] && id[j-1] == p[i]
			}
		}
		m = next
	}
	return m[len(id)]
}

// randomPattern draws patterns from a small alphabet, so that prefixes nest
// and share edges of the radix tree, with '*' anywhere but never two in a
// row (about half of them prefix patterns or exact).
func randomPattern(r *rand.Rand) string {
	var b strings.Builder
	for n := r.IntN(6); b.Len() < n; {
		c := "ab\x00\xff*"[r.IntN(5)]
		if c == '*' && (r.IntN(2) == 0 || strings.HasSuffix(b.String(), "*")) {
			continue
		}
		b.WriteByte(c)
	}
	if b.Len() == 0 || r.IntN(2) == 0 && !strings.HasSuffix(b.String(), "*") {
		b.WriteByte('*')
	}
	return b.String()
}

func TestMatchAgreesWithBruteForceOnRandomTables(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		tab := NewTable()
		now := int64(now0)
		for i := r.IntN(40); i >= 0; i-- {
			k := Key{"w" + fmt.Sprint(r.IntN(2)), "n" + fmt.Sprint(r.IntN(2)), randomPattern(r)}
			now++
			if _, ok := tab.Get(k); ok && r.IntN(3) == 0 {
				if _, err := tab.Delete(k, now, "us"); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if _, err := tab.Set(k, Override{Limit: int64(r.IntN(100)), Duration: 1000}, now, "us"); err != nil {
				t.Fatal(err)
			}
		}
		entries := tab.Entries()
		for q := 0; q < 50; q++ {
			ws, ns := "w"+fmt.Sprint(r.IntN(2)), "n"+fmt.Sprint(r.IntN(2))
			id := strings.TrimSuffix(randomPattern(r), "*") + strings.TrimSuffix(randomPattern(r), "*")
			if id == "" {
				id = "a"
			}
			got, gotOK := match(tab, ws, ns, id)
			want, wantOK := reference(entries, ws, ns, id)
			if got != want || gotOK != wantOK {
				t.Fatalf("round %d: Match(%s, %s, %q) = %+v, %v; brute force %+v, %v\nentries %v",
					round, ws, ns, id, got, gotOK, want, wantOK, entries)
			}
		}
	}
}

func TestSetAndDeleteChangeWhatMatches(t *testing.T) {
	tab := NewTable()
	k := Key{"acme", "api", "al*"}
	e1 := mustSet(t, tab, "acme", "api", "al*", 10)
	if o, _, _ := tab.Match("acme", "api", "alice"); o.Limit != 10 {
		t.Fatalf("after set: %+v", o)
	}
	// Set again in the same millisecond: a later version, the new value.
	e2, err := tab.Set(k, Override{Limit: 20, Duration: 1000, Shadow: true}, now0, "us")
	if err != nil {
		t.Fatal(err)
	}
	if e2.Version.At != e1.Version.At+1 {
		t.Fatalf("second set in the same ms got version %+v after %+v", e2.Version, e1.Version)
	}
	if m, _ := match(tab, "acme", "api", "alice"); m != (matched{Override{Limit: 20, Duration: 1000, Shadow: true}, "al*"}) {
		t.Fatalf("after second set: %+v", m)
	}
	d, err := tab.Delete(k, now0, "us")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Deleted || d.Version.At != e2.Version.At+1 || d.Override != (Override{}) {
		t.Fatalf("tombstone %+v", d)
	}
	if o, _, ok := tab.Match("acme", "api", "alice"); ok {
		t.Fatalf("after delete matched %+v", o)
	}
	if got := tab.List("acme", ""); len(got) != 0 {
		t.Fatalf("list after delete: %v", got)
	}
	if _, err := tab.Delete(k, now0, "us"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, err := tab.Delete(Key{"acme", "api", "never"}, now0, "us"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of a pattern never set: %v, want ErrNotFound", err)
	}
	// The tombstone is kept (for merging) until pruned.
	if got := tab.Entries(); len(got) != 1 || !got[0].Deleted {
		t.Fatalf("entries after delete: %v", got)
	}
	if n := tab.Prune(d.Version.At); n != 0 {
		t.Fatalf("pruned %d tombstones not yet older than the mark", n)
	}
	if n := tab.Prune(d.Version.At + 1); n != 1 || len(tab.Entries()) != 0 {
		t.Fatalf("pruned %d, left %v", n, tab.Entries())
	}
}

func TestExactAndPrefixPartsChangeApart(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "alice", 1)
	mustSet(t, tab, "acme", "api", "a*", 2)
	// Deleting the exact pattern keeps the prefix, and the other way round.
	if _, err := tab.Delete(Key{"acme", "api", "alice"}, now0, "us"); err != nil {
		t.Fatal(err)
	}
	if o, _, _ := tab.Match("acme", "api", "alice"); o.Limit != 2 {
		t.Fatalf("exact deleted: %+v, want the prefix's", o)
	}
	mustSet(t, tab, "acme", "api", "alice", 3)
	if _, err := tab.Delete(Key{"acme", "api", "a*"}, now0, "us"); err != nil {
		t.Fatal(err)
	}
	if o, _, _ := tab.Match("acme", "api", "alice"); o.Limit != 3 {
		t.Fatalf("prefix deleted: %+v, want the exact one", o)
	}
	if o, _, ok := tab.Match("acme", "api", "anna"); ok {
		t.Fatalf("prefix deleted, still matched %+v", o)
	}
}

func TestListIsOrderedAndScoped(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "web", "z", 1)
	mustSet(t, tab, "acme", "api", "b*", 2)
	mustSet(t, tab, "acme", "api", "a", 3)
	mustSet(t, tab, "other", "api", "a", 4)
	var got []string
	for _, e := range tab.List("acme", "") {
		got = append(got, e.Namespace+"/"+e.Pattern)
	}
	if want := []string{"api/a", "api/b*", "web/z"}; !slices.Equal(got, want) {
		t.Fatalf("List(acme) = %v, want %v", got, want)
	}
	if got := tab.List("acme", "web"); len(got) != 1 || got[0].Pattern != "z" {
		t.Fatalf("List(acme, web) = %v", got)
	}
	if got := tab.List("nobody", ""); len(got) != 0 {
		t.Fatalf("List(nobody) = %v", got)
	}
}

func TestSetRefusesANewPatternBeyondTheWorkspaceBound(t *testing.T) {
	tab := NewTable()
	for i := 0; i < MaxOverridesPerWorkspace; i++ {
		mustSet(t, tab, "acme", "ns"+fmt.Sprint(i%3), fmt.Sprint("id", i), 1)
	}
	before := tab.Digest()
	_, err := tab.Set(Key{"acme", "api", "one-more"}, Override{Limit: 1, Duration: 1000}, now0, "us")
	if !errors.Is(err, ErrTooMany) || !strings.Contains(err.Error(), "10000 overrides") {
		t.Fatalf("set beyond the bound: %v, want ErrTooMany naming the bound", err)
	}
	if tab.Digest() != before || tab.Len("acme") != MaxOverridesPerWorkspace {
		t.Fatal("a refused set changed the table")
	}
	if _, _, ok := tab.Match("acme", "api", "one-more"); ok {
		t.Fatal("a refused set matches")
	}
	// Replacing an existing pattern is allowed, another workspace unaffected.
	if _, err := tab.Set(Key{"acme", "ns0", "id0"}, Override{Limit: 2, Duration: 1000}, now0, "us"); err != nil {
		t.Fatalf("replace at the bound: %v", err)
	}
	mustSet(t, tab, "other", "api", "x", 1)
	// A delete frees a place.
	if _, err := tab.Delete(Key{"acme", "ns1", "id1"}, now0, "us"); err != nil {
		t.Fatal(err)
	}
	mustSet(t, tab, "acme", "api", "one-more", 1)
}

func TestTombstonesPerWorkspaceAreBounded(t *testing.T) {
	tab := NewTable()
	for i := 0; i < MaxOverridesPerWorkspace+5; i++ {
		k := Key{"acme", "api", fmt.Sprint("id", i)}
		if _, err := tab.Set(k, Override{Limit: 1, Duration: 1000}, now0+int64(i), "us"); err != nil {
			t.Fatal(err)
		}
		if _, err := tab.Delete(k, now0+int64(i), "us"); err != nil {
			t.Fatal(err)
		}
	}
	es := tab.Entries()
	if len(es) > MaxOverridesPerWorkspace || len(es) < MaxOverridesPerWorkspace*9/10 {
		t.Fatalf("%d tombstones kept, want at most %d and at least %d", len(es), MaxOverridesPerWorkspace, MaxOverridesPerWorkspace*9/10)
	}
	// The ones kept are the newest.
	oldestKept := es[0].Version.At
	for _, e := range es {
		oldestKept = min(oldestKept, e.Version.At)
	}
	// Tombstone i is stamped now0+i+1 (one after its set).
	if want := now0 + int64(MaxOverridesPerWorkspace+5-len(es)) + 1; oldestKept != want {
		t.Fatalf("oldest tombstone kept is from %d, want %d", oldestKept, want)
	}
	if tab.Len("acme") != 0 {
		t.Fatalf("%d live overrides after deleting all", tab.Len("acme"))
	}
}

func TestSetAndDeleteRefuseBadInputAndChangeNothing(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "alice", 1)
	before := tab.Digest()
	for _, c := range []struct {
		k    Key
		o    Override
		want string
	}{
		{Key{"", "api", "a"}, Override{1, 1000, false}, "workspace"},
		{Key{"acme", "a.b", "a"}, Override{1, 1000, false}, "namespace"},
		{Key{"acme", "api", ""}, Override{1, 1000, false}, "pattern is empty"},
		{Key{"acme", "api", "a**b"}, Override{1, 1000, false}, `pattern "a**b" has two adjacent *; one * already matches any run of bytes`},
		{Key{"acme", "api", "**"}, Override{1, 1000, false}, "two adjacent *"},
		{Key{"acme", "api", "*a**"}, Override{1, 1000, false}, "two adjacent *"},
		{Key{"acme", "api", strings.Repeat("a", 513)}, Override{1, 1000, false}, "513 bytes"},
		{Key{"acme", "api", "a"}, Override{-1, 1000, false}, "limit -1"},
		{Key{"acme", "api", "a"}, Override{window.MaxLimit + 1, 1000, false}, "limit"},
		{Key{"acme", "api", "a"}, Override{1, 999, false}, "duration 999"},
		{Key{"acme", "api", "a"}, Override{1, window.MaxDuration + 1, false}, "duration"},
	} {
		_, err := tab.Set(c.k, c.o, now0, "us")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Set(%+v, %+v) = %v, want ErrInvalid with %q", c.k, c.o, err, c.want)
		}
	}
	if _, err := tab.Set(Key{"acme", "api", "a"}, Override{1, 1000, false}, now0, "bad region"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Set with a bad origin: %v", err)
	}
	if _, err := tab.Delete(Key{"acme", "api", "a**b"}, now0, "us"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Delete of a bad pattern: %v", err)
	}
	if tab.Digest() != before || len(tab.Entries()) != 1 {
		t.Fatal("refused input changed the table")
	}
}

func TestMergeRefusesABatchWithAnInvalidEntryWhole(t *testing.T) {
	tab := NewTable()
	good := Entry{Key: Key{"acme", "api", "a"}, Override: Override{1, 1000, false}, Version: Version{now0, "eu"}}
	bad := []Entry{
		{Key: Key{"acme", "api", "b"}, Override: Override{1, 1000, false}, Version: Version{0, "eu"}},
		{Key: Key{"acme", "api", "b"}, Override: Override{1, 1000, false}, Version: Version{now0, ""}},
		{Key: Key{"acme", "api", "b"}, Override: Override{1, 1000, false}, Deleted: true, Version: Version{now0, "eu"}},
		{Key: Key{"acme", "api", "b"}, Override: Override{1, 10, false}, Version: Version{now0, "eu"}},
		{Key: Key{"acme", "api", "b"}, Override: Override{1, 1000, false}, Version: Version{window.MaxTime + 1, "eu"}},
	}
	for i, b := range bad {
		if n, err := tab.Merge(good, b); !errors.Is(err, ErrInvalid) || n != 0 {
			t.Errorf("bad entry %d: merged %d, %v", i, n, err)
		}
	}
	if len(tab.Entries()) != 0 {
		t.Fatalf("a refused merge changed the table: %v", tab.Entries())
	}
	if n, err := tab.Merge(good); n != 1 || err != nil {
		t.Fatalf("merge good: %d, %v", n, err)
	}
}

// randomEntries draws updates of a few keys with colliding versions, so
// that every tie-break of Compare is exercised.
func randomEntries(r *rand.Rand, n int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		e := Entry{
			Key:     Key{"w", "n" + fmt.Sprint(r.IntN(2)), []string{"a", "a*", "ab*", "*", "b", "a*b", "*b", "*a*"}[r.IntN(8)]},
			Version: Version{At: now0 + int64(r.IntN(3)), Origin: []string{"ap", "eu", "us"}[r.IntN(3)]},
		}
		if r.IntN(4) == 0 {
			e.Deleted = true
		} else {
			e.Override = Override{Limit: int64(r.IntN(3)), Duration: 1000 * int64(1+r.IntN(2)), Shadow: r.IntN(2) == 0}
		}
		out[i] = e
	}
	return out
}

func TestOverrideMergeConvergesInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 300; round++ {
		updates := randomEntries(r, 1+r.IntN(30))
		want := NewTable()
		if _, err := want.Merge(updates...); err != nil {
			t.Fatal(err)
		}
		for replica := 0; replica < 4; replica++ {
			got := NewTable()
			order := slices.Clone(updates)
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			// One at a time, in batches, and each some number of times.
			for i := 0; i < len(order); {
				n := 1 + r.IntN(3)
				batch := order[i:min(i+n, len(order))]
				for k := 1 + r.IntN(2); k > 0; k-- {
					if _, err := got.Merge(batch...); err != nil {
						t.Fatal(err)
					}
				}
				i += n
			}
			if !slices.Equal(got.Entries(), want.Entries()) || got.Digest() != want.Digest() {
				t.Fatalf("round %d replica %d: entries differ\n got %v\nwant %v", round, replica, got.Entries(), want.Entries())
			}
			for _, q := range []string{"a", "ab", "abc", "b", "c", "bab", "cb"} {
				for _, ns := range []string{"n0", "n1"} {
					g, gok := match(got, "w", ns, q)
					w, wok := match(want, "w", ns, q)
					if g != w || gok != wok {
						t.Fatalf("round %d: Match(%s, %q) %+v %v, want %+v %v", round, ns, q, g, gok, w, wok)
					}
				}
			}
		}
		// Idempotence: merging everything again changes nothing.
		if n, _ := want.Merge(updates...); n != 0 {
			t.Fatalf("round %d: merging the same updates again changed %d entries", round, n)
		}
	}
}

func TestMergeKeepsTheWinnerOfEachKey(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	updates := randomEntries(r, 200)
	tab := NewTable()
	if _, err := tab.Merge(updates...); err != nil {
		t.Fatal(err)
	}
	winners := map[Key]Entry{}
	for _, u := range updates {
		if w, ok := winners[u.Key]; !ok || Compare(u, w) > 0 {
			winners[u.Key] = u
		}
	}
	for _, e := range tab.Entries() {
		if winners[e.Key] != e {
			t.Fatalf("kept %v, the winner is %v", e, winners[e.Key])
		}
		delete(winners, e.Key)
	}
	if len(winners) != 0 {
		t.Fatalf("keys lost: %v", winners)
	}
}

func TestADeleteArrivingBeforeItsSetStillWins(t *testing.T) {
	k := Key{"acme", "api", "alice"}
	set := Entry{Key: k, Override: Override{5, 1000, false}, Version: Version{now0, "us"}}
	del := Entry{Key: k, Deleted: true, Version: Version{now0 + 1, "eu"}}
	tab := NewTable()
	if _, err := tab.Merge(del); err != nil {
		t.Fatal(err)
	}
	if n, _ := tab.Merge(set); n != 0 {
		t.Fatal("an older set replaced a later delete")
	}
	if _, _, ok := tab.Match("acme", "api", "alice"); ok {
		t.Fatal("an older set came back after its delete")
	}
}

func TestExactMapsShardAndUnshardAsANamespaceGrowsAndShrinks(t *testing.T) {
	tab := NewTable()
	const n = shardFrom + 100
	for i := 0; i < n; i++ {
		mustSet(t, tab, "acme", "api", fmt.Sprint("id", i), int64(i+1))
	}
	view := func() *nsView { return (*tab.view.Load().ws["acme"].nss.Load())["api"] }
	if got := len(view().exact); got != exactShards {
		t.Fatalf("%d exact overrides in %d maps, want %d", n, got, exactShards)
	}
	check := func(live func(int) bool) {
		t.Helper()
		for i := 0; i < n; i++ {
			o, _, ok := tab.Match("acme", "api", fmt.Sprint("id", i))
			if ok != live(i) || ok && o.Limit != int64(i+1) {
				t.Fatalf("id%d: %+v, %v, want live %v", i, o, ok, live(i))
			}
		}
	}
	check(func(int) bool { return true })
	// Shrink below the threshold: one map again, the same answers.
	for i := 0; i < 300; i++ {
		if _, err := tab.Delete(Key{"acme", "api", fmt.Sprint("id", i)}, now0, "us"); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(view().exact); got != 1 {
		t.Fatalf("%d exact overrides in %d maps, want 1", n-300, got)
	}
	check(func(i int) bool { return i >= 300 })
	for i := 300; i < n; i++ {
		if _, err := tab.Delete(Key{"acme", "api", fmt.Sprint("id", i)}, now0, "us"); err != nil {
			t.Fatal(err)
		}
	}
	if v := tab.view.Load(); len(v.ws) != 0 {
		t.Fatalf("a table with only tombstones still has views: %v", v.ws)
	}
	check(func(int) bool { return false })
}

// TestMatchNeverSeesAHalfMadeChange runs checks while a writer sets and
// deletes: every answer is one the table held at some point (run it with
// -race: readers and the writer share no unsynchronized memory).
func TestMatchNeverSeesAHalfMadeChange(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "stable", 1)
	mustSet(t, tab, "acme", "api", "st*", 2)
	mustSet(t, tab, "acme", "api", "s*:x", 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			p := fmt.Sprint("churn", i%50)
			switch i % 7 {
			case 0:
				p += "*"
			case 3:
				p = "s*" + p + "*:x" // beside s*:x, in its suffix tree
			}
			if _, err := tab.Set(Key{"acme", "api", p}, Override{Limit: 3, Duration: 1000}, now0, "us"); err != nil {
				t.Error(err)
				return
			}
			if i%2 == 0 {
				if _, err := tab.Delete(Key{"acme", "api", p}, now0, "us"); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if o, _, ok := tab.Match("acme", "api", "stable"); !ok || o.Limit != 1 {
			t.Fatalf("exact override lost during churn: %+v, %v", o, ok)
		}
		if o, _, ok := tab.Match("acme", "api", "stx"); !ok || o.Limit != 2 {
			t.Fatalf("prefix override lost during churn: %+v, %v", o, ok)
		}
		if o, p, ok := tab.Match("acme", "api", "sq:x"); !ok || p != "s*:x" {
			t.Fatalf("glob override lost during churn: %+v, %v", o, ok)
		}
		if o, _, ok := tab.Match("acme", "api", "churn7x"); ok && o.Limit != 3 {
			t.Fatalf("churned override answered %+v", o)
		}
	}
}

func TestMatchFindsPrefixesAmongManySiblings(t *testing.T) {
	tab := NewTable()
	r := rand.New(rand.NewPCG(11, 12))
	for _, i := range r.Perm(256) {
		if i%5 == 0 || i == '*' {
			continue
		}
		mustSet(t, tab, "acme", "api", "x"+string([]byte{byte(i)})+"*", int64(i+1))
		if i%3 == 0 {
			mustSet(t, tab, "acme", "api", "x"+string([]byte{byte(i), 'y'})+"*", int64(1000+i))
		}
	}
	entries := tab.Entries()
	for i := 0; i < 256; i++ {
		for _, id := range []string{"x" + string([]byte{byte(i)}), "x" + string([]byte{byte(i), 'y', 'z'}), "x" + string([]byte{byte(i), 'q'})} {
			got, gotOK := match(tab, "acme", "api", id)
			want, wantOK := reference(entries, "acme", "api", id)
			if got != want || gotOK != wantOK {
				t.Fatalf("Match(%q) = %+v, %v; brute force %+v, %v", id, got, gotOK, want, wantOK)
			}
		}
	}
}

func TestEntryStringNamesWhatItHolds(t *testing.T) {
	e := Entry{Key: Key{"acme", "api", "al*"}, Override: Override{5, 60_000, true}, Version: Version{now0, "us"}}
	if got, want := e.String(), `acme/api "al*" limit 5 per 60000ms shadow @1800000000000 us`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	d := Entry{Key: Key{"acme", "api", strings.Repeat("a", 100)}, Deleted: true, Version: Version{now0, "eu"}}
	if got := d.String(); !strings.Contains(got, " deleted @") || !strings.Contains(got, "…") {
		t.Errorf("String() of a long tombstone = %s", got)
	}
}

// A change in a workspace that keeps overrides costs that workspace's
// namespaces: the view's map of workspaces is shared with the view before
// (copied only when a workspace comes or goes), and so are the other
// workspaces' namespace maps; a reader of the older view sees the change.
func TestAChangeCopiesOnlyItsWorkspace(t *testing.T) {
	tab := NewTable()
	for _, ws := range []string{"acme", "globex", "initech"} {
		if _, err := tab.Set(Key{ws, "api", "user_1"}, Override{Limit: 5, Duration: 60_000}, now0, "us"); err != nil {
			t.Fatal(err)
		}
	}
	before := tab.view.Load()
	globex := before.ws["globex"].nss.Load()
	if _, err := tab.Set(Key{"acme", "api", "user_2"}, Override{Limit: 7, Duration: 60_000}, now0+1, "us"); err != nil {
		t.Fatal(err)
	}
	after := tab.view.Load()
	if after.gen == before.gen || reflect.ValueOf(after.ws).UnsafePointer() != reflect.ValueOf(before.ws).UnsafePointer() {
		t.Fatal("a change in a held workspace copied the map of workspaces, or kept the generation")
	}
	if after.ws["globex"].nss.Load() != globex {
		t.Fatal("a change in acme copied globex's namespaces")
	}
	if o, _, ok := tab.Match("acme", "api", "user_2"); !ok || o.Limit != 7 {
		t.Fatalf("match after the change: %+v, %v", o, ok)
	}
	// A workspace that comes, and one that goes, copy the map once.
	if _, err := tab.Set(Key{"hooli", "api", "x"}, Override{Limit: 1, Duration: 60_000}, now0+2, "us"); err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.view.Load().ws["hooli"]; !ok || reflect.ValueOf(tab.view.Load().ws).UnsafePointer() == reflect.ValueOf(after.ws).UnsafePointer() {
		t.Fatal("a new workspace is not in a new map of workspaces")
	}
	if _, ok := after.ws["hooli"]; ok {
		t.Fatal("the older view's map of workspaces changed")
	}
	if _, err := tab.Delete(Key{"initech", "api", "user_1"}, now0+3, "us"); err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.view.Load().ws["initech"]; ok {
		t.Fatal("a workspace without live overrides stays in the view")
	}
	if _, _, ok := tab.Match("initech", "api", "user_1"); ok {
		t.Fatal("a deleted override still matches")
	}
}
