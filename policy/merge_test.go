package policy

import (
	"fmt"
	"testing"
)

// MergeChanged merges a batch in one view (the generation moves once) and
// returns exactly the entries that changed the table; Live counts the live
// overrides without copying them.
func TestMergeChangedPublishesOnceAndNamesWhatChanged(t *testing.T) {
	tab := NewTable()
	entry := func(ws, p string, at int64, deleted bool) Entry {
		e := Entry{Key: Key{Workspace: ws, Namespace: "api", Pattern: p}, Version: Version{At: at, Origin: "us"}, Deleted: deleted}
		if !deleted {
			e.Override = Override{Limit: at, Duration: 60_000}
		}
		return e
	}
	var batch []Entry
	for i := range 1000 {
		batch = append(batch, entry(fmt.Sprint("ws", i%10), fmt.Sprint("p", i), 10, i%4 == 0))
	}
	gen := tab.Generation()
	changed, err := tab.MergeChanged(batch...)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != len(batch) || tab.Generation() != gen+1 {
		t.Fatalf("%d changed, generation %d → %d; want all 1000 in one view", len(changed), gen, tab.Generation())
	}
	if got := tab.Live(); got != 750 {
		t.Fatalf("Live() = %d, want the 750 that are not tombstones", got)
	}
	// Again, with one newer and one older entry: only the newer changes.
	newer, older := entry("ws1", "p1", 11, false), entry("ws2", "p2", 9, false)
	changed, err = tab.MergeChanged(batch[0], newer, older)
	if err != nil || len(changed) != 1 || changed[0] != newer {
		t.Fatalf("changed %+v, %v; want only the newer entry", changed, err)
	}
	if _, err := tab.MergeChanged(newer, Entry{}); err == nil {
		t.Fatal("an invalid entry was merged")
	}
}
