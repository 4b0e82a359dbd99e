package service

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
	"testing"
)

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

// The hash of a key depends only on its bytes: keys short enough to be
// gathered on the stack hash as the same bytes streamed would, so the two
// paths can never disagree, and keys around the threshold still find their
// bucket.
func TestTableHashIsTheSameOnBothPaths(t *testing.T) {
	tb := newTable()
	for n := 1; n <= hashKeyBuf+20; n++ {
		id := strings.Repeat("x", n)
		k := bucketKey{workspace: "acme", namespace: "api", identifier: id, duration: 60_000}
		var h maphash.Hash
		h.SetSeed(tb.seed)
		h.WriteString("acme\x00api\x00")
		var d [8]byte
		binary.LittleEndian.PutUint64(d[:], 60_000)
		h.Write(d[:])
		h.WriteString(id)
		if got, want := tb.hash(&k), h.Sum64(); got != want {
			t.Fatalf("identifier of %d bytes: hash %x, streamed %x", n, got, want)
		}
		if b := tb.loadOrCreate(k); tb.load(k) != b {
			t.Fatalf("identifier of %d bytes: bucket not found again", n)
		}
	}
}
