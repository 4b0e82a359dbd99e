package policy

import (
	"fmt"
	"testing"
)

// Two tables (and mark sets) that differ in one entry differ in exactly the
// part of their digests that entry's key falls in; EntriesIn and AllIn
// return what those parts hold; the parts XOR to the whole digest.
func TestDigestPartsNameWhereTwoReplicasDiffer(t *testing.T) {
	a, b := NewTable(), NewTable()
	am, bm := NewMarks(), NewMarks()
	for i := range 500 {
		k := Key{"acme", "api", fmt.Sprint("user_", i)}
		for _, tab := range []*Table{a, b} {
			if _, err := tab.Set(k, Override{Limit: int64(i + 1), Duration: 60_000}, now0, "us"); err != nil {
				t.Fatal(err)
			}
		}
		m := Mark{"acme", "api", fmt.Sprint("user_", i), AllDurations, now0}
		if _, err := am.Merge(m); err != nil {
			t.Fatal(err)
		}
		if _, err := bm.Merge(m); err != nil {
			t.Fatal(err)
		}
	}
	changed := Key{"acme", "api", "user_42"}
	if _, err := b.Set(changed, Override{Limit: 1000, Duration: 60_000}, now0+1, "us"); err != nil {
		t.Fatal(err)
	}
	late := Mark{"acme", "api", "user_7", 60_000, now0 + 2}
	if _, err := bm.Merge(late); err != nil {
		t.Fatal(err)
	}
	da, db := a.Digests().Xor(am.Digests()), b.Digests().Xor(bm.Digests())
	for _, d := range []Digests{da, db} {
		var x uint64
		for _, h := range d.Shards {
			x ^= h
		}
		if x != d.Total {
			t.Fatalf("parts XOR to %x, whole %x", x, d.Total)
		}
	}
	var want Parts
	want.Add(KeyShard(changed))
	want.Add(MarkShard(late.Workspace, late.Namespace, late.Identifier))
	mask := da.Differ(db.Shards[:])
	if mask != want {
		t.Fatalf("differing parts %v, want %v", mask, want)
	}
	es := b.EntriesIn(mask)
	found := false
	for _, e := range es {
		if !mask.Has(KeyShard(e.Key)) {
			t.Fatalf("EntriesIn returned %v, outside the parts", e.Key)
		}
		found = found || e.Key == changed
	}
	if !found || len(es) >= 500/8 {
		t.Fatalf("EntriesIn returned %d entries (changed one found: %v); want the changed one among a small part", len(es), found)
	}
	ms := bm.AllIn(mask)
	if len(ms) == 0 || len(ms) >= 500/8 {
		t.Fatalf("AllIn returned %d marks, want the late one's part", len(ms))
	}
	// Part by part: a replica that receives only the first of them holds
	// whole parts.
	all := a.EntriesIn(AllParts())
	if len(all) != 500 {
		t.Fatalf("EntriesIn of every part: %d entries, want 500", len(all))
	}
	for i := 1; i < len(all); i++ {
		if KeyShard(all[i].Key) < KeyShard(all[i-1].Key) {
			t.Fatalf("entry %d of part %d follows one of part %d", i, KeyShard(all[i].Key), KeyShard(all[i-1].Key))
		}
	}
	marks := am.AllIn(AllParts())
	for i := 1; i < len(marks); i++ {
		if MarkShard(marks[i].Workspace, marks[i].Namespace, marks[i].Identifier) < MarkShard(marks[i-1].Workspace, marks[i-1].Namespace, marks[i-1].Identifier) {
			t.Fatalf("mark %d out of part order", i)
		}
	}
	if full := da.Differ(nil); full != AllParts() {
		t.Fatalf("a replica that sends no parts: %v, want every part", full)
	}
}
