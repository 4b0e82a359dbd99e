package service

import "testing"

// Keys whose hashes collide get buckets of their own, stay reachable when
// the other key's bucket is removed, and leave the overflow map empty once
// removed.
func TestTableKeepsKeysWhoseHashesCollide(t *testing.T) {
	tb := newTable()
	const h = 42
	k1 := bucketKey{workspace: "ws", namespace: "ns", identifier: "one", duration: 60_000}
	k2 := bucketKey{workspace: "ws", namespace: "ns", identifier: "two", duration: 60_000}
	b1 := tb.loadOrCreateHashed(h, k1)
	b2 := tb.loadOrCreateHashed(h, k2)
	if b1 == b2 || b1.key != k1 || b2.key != k2 {
		t.Fatalf("colliding keys share or mislabel buckets: %+v %+v", b1.key, b2.key)
	}
	if got := tb.loadHashed(h, &k2); got != b2 {
		t.Fatal("the second key is not found through the overflow map")
	}
	if again := tb.loadOrCreateHashed(h, k2); again != b2 || tb.overN.Load() != 1 {
		t.Fatalf("loading the second key again created a bucket (overflow size %d)", tb.overN.Load())
	}
	tb.remove(b1)
	if got := tb.loadHashed(h, &k1); got != nil {
		t.Fatal("a removed bucket is still found")
	}
	if got := tb.loadHashed(h, &k2); got != b2 {
		t.Fatal("removing the first key lost the second")
	}
	if b1b := tb.loadOrCreateHashed(h, k1); b1b == b1 || tb.loadHashed(h, &k1) != b1b {
		t.Fatal("the first key was not created anew")
	}
	tb.remove(b2)
	if tb.overN.Load() != 0 || tb.over.Size() != 0 {
		t.Fatalf("overflow holds %d entries after removal", tb.over.Size())
	}
	if tb.size() != 1 {
		t.Fatalf("table holds %d buckets, want 1", tb.size())
	}
}
