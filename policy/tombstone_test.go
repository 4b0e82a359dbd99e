package policy

import "testing"

// TombstoneCutoff is the retention before now, rounded down to a minute,
// for clocks before and after the epoch alike.
func TestTombstoneCutoffIsAWholeMinuteOfRetentionAgo(t *testing.T) {
	ret := TombstoneRetention.Milliseconds()
	for _, now := range []int64{1_700_000_000_000, 1_700_000_040_000, 1_700_000_039_999, ret, ret - 1, 0} {
		c := TombstoneCutoff(now)
		if c%60_000 != 0 || c > now-ret || c <= now-ret-60_000 {
			t.Errorf("TombstoneCutoff(%d) = %d: want the whole minute at or before %d", now, c, now-ret)
		}
	}
}

// Prune forgets exactly the tombstones before its cutoff, including one
// merged after an earlier Prune with an older version than those left, and
// leaves live overrides alone.
func TestPruneForgetsExactlyTheTombstonesBeforeTheCutoff(t *testing.T) {
	tab := NewTable()
	entry := func(p string, at int64, deleted bool) Entry {
		e := Entry{Key: Key{Workspace: "ws", Namespace: "api", Pattern: p}, Version: Version{At: at, Origin: "us"}, Deleted: deleted}
		if !deleted {
			e.Override = Override{Limit: 1, Duration: 60_000}
		}
		return e
	}
	merge := func(es ...Entry) {
		for _, e := range es {
			if _, err := tab.Merge(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	patterns := func() map[string]bool {
		out := map[string]bool{}
		for _, e := range tab.Entries() {
			out[e.Pattern] = true
		}
		return out
	}
	merge(entry("a", 100, true), entry("b", 200, true), entry("live", 50, false))
	if n := tab.Prune(150); n != 1 || patterns()["a"] || !patterns()["b"] || !patterns()["live"] {
		t.Fatalf("Prune(150) forgot %d, left %v; want only a gone", n, patterns())
	}
	if n := tab.Prune(150); n != 0 {
		t.Fatalf("Prune(150) again forgot %d", n)
	}
	merge(entry("c", 120, true)) // older than b, merged after the prune
	if n := tab.Prune(160); n != 1 || patterns()["c"] || !patterns()["b"] {
		t.Fatalf("Prune(160) forgot %d, left %v; want c gone", n, patterns())
	}
	if n := tab.Prune(1000); n != 1 || len(patterns()) != 1 || !patterns()["live"] {
		t.Fatalf("Prune(1000) forgot %d, left %v; want only the live override", n, patterns())
	}
	want := NewTable()
	if _, err := want.Merge(entry("live", 50, false)); err != nil {
		t.Fatal(err)
	}
	if tab.Digest() != want.Digest() {
		t.Fatal("after the prunes the digest differs from a table that never held the tombstones")
	}
}
