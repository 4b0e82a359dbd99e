package service

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/window"
)

// bucketKey identifies the cells of one identifier at one duration: the
// strict-mode key, which excludes the sequence.
type bucketKey struct {
	workspace, namespace, identifier string
	duration                         int64
}

// bucket holds the live cells of one identifier at one duration. Cells sit in
// a two-slot ring by sequence parity, so the current and the previous cell
// are found with two atomic loads and no lock.
type bucket struct {
	key bucketKey
	h   uint64 // the table's hash of key
	// cells[seq&1] holds the cell of seq, or an older or newer one, or nil.
	cells [2]atomic.Pointer[cell]
	// strictUntil is the unix millisecond until which checks refresh the
	// current cell from origin before deciding (0: not strict).
	strictUntil atomic.Int64
	// dead is set by the janitor once the bucket has left the table; a check
	// that installed a cell into a dead bucket starts over.
	dead atomic.Bool
	// rate is the region's recent admission rate in the identifier's
	// current cell (cost per millisecond, float64 bits), from the totals the
	// origin reported: obsTotal, the last one, of sequence obsSeq at obsAt
	// (unix ms). For the near-limit rule (near.go).
	rate                    atomic.Uint64
	obsSeq, obsTotal, obsAt atomic.Int64
}

// cell holds the counters of one window cell. Decisions read count and
// imported; admissions move count by compare-and-swap.
//
// A cell fits the 128-byte size class, two cache lines. The first holds everything a
// decision without an origin reads (seq, count, imported), so such
// a decision touches one line of each of its two cells.
type cell struct {
	b   *bucket
	seq int64

	// count is this process's view of the region's total for the cell: the
	// cost it admitted plus what origin reads and replays reported. It only
	// grows, except when a batch releases a reservation it made.
	count atomic.Int64
	// imported is the sum of other regions' usage of the cell (max-merged).
	imported atomic.Int64
	// own is the cost this process has admitted in the cell: what it reports
	// to the origin. It only grows.
	own atomic.Int64
	// reported is the highest own sent to the origin (acknowledged or not;
	// flagUnacked says which).
	reported atomic.Int64
	// syncedAt is the unix millisecond of the last successful origin read or
	// replay for this cell (0: never).
	syncedAt atomic.Int64
	// limit is the limit of the last admission, for the replay cadence.
	limit atomic.Int64
	// failedAt is the unix millisecond of the last failed origin read.
	failedAt atomic.Int64
	// published is the highest count sent to the bridge.
	published atomic.Int64
	// gnext links the global stack.
	gnext *cell
	// lastReport is the unix millisecond of the last replay sent.
	lastReport atomic.Int64

	// mu orders batch reservations against replay snapshots and merges; the
	// single-check path never takes it.
	mu sync.Mutex
	// next links the replay stack; owned by whoever pushed or popped it.
	next *cell
	// flags holds the cell's flag bits. One word instead of one atomic.Bool
	// each keeps the cell at 128 bytes, a size class below 144.
	flags atomic.Uint32
}

// The bits of cell.flags.
const (
	// flagQueued is set while the cell waits on the replay stack.
	flagQueued uint32 = 1 << iota
	// flagNear is set once an admission left less than half the limit.
	flagNear
	// flagUnacked is set while the origin has not acknowledged the report
	// of reported: the next round sends it again even if nothing was added.
	flagUnacked
	// flagDenialSent is set once a denial of the cell was published or
	// received.
	flagDenialSent
	// flagGlobalQueued is set while the cell waits on the global stack.
	flagGlobalQueued
)

// has reports whether bit is set.
func (c *cell) has(bit uint32) bool { return c.flags.Load()&bit != 0 }

// set sets bit and reports whether this call set it (it was clear).
func (c *cell) set(bit uint32) bool {
	if c.flags.Load()&bit != 0 {
		return false // the common case, without a write
	}
	return c.flags.Or(bit)&bit == 0
}

// clear clears bit.
func (c *cell) clear(bit uint32) { c.flags.And(^bit) }

// replayDue reports whether the cell must be replayed in this round: it is
// near its limit, or what this process has not reported yet is 1% of the
// limit or more, or it was last reported far ago (unix ms).
func (c *cell) replayDue(now, far int64) bool {
	return c.has(flagNear) || 100*(c.own.Load()-c.reported.Load()) >= c.limit.Load() ||
		now >= c.lastReport.Load()+far
}

// identity returns the cell's window.Cell.
func (c *cell) identity() window.Cell {
	k := &c.b.key
	return window.Cell{Workspace: k.workspace, Namespace: k.namespace, Identifier: k.identifier,
		Duration: k.duration, Sequence: c.seq}
}

// usage is what a decision counts for the cell: regional plus imported.
func (c *cell) usage() int64 {
	return c.usageWith(c.count.Load())
}

// usageWith is usage for a given count: count plus imported, saturated at
// window.MaxCount (never wrapping).
func (c *cell) usageWith(count int64) int64 {
	return window.AddCounts(count, c.imported.Load())
}

// raise lifts count to at least v.
func (c *cell) raise(v int64) {
	for {
		old := c.count.Load()
		if v <= old || c.count.CompareAndSwap(old, v) {
			return
		}
	}
}

// merge folds a regional total read from the origin into the cell and marks
// it synced at now. The total holds this process's cost up to what it last
// reported at most, so what it admitted since is added back. A report still
// in flight is assumed applied: that can undercount until its reply merges,
// never overcount for good (merges only raise count). The caller holds c.mu.
func (c *cell) merge(total, now int64) {
	c.raise(window.AddCounts(total, c.own.Load()-c.reported.Load()))
	c.syncedAt.Store(now)
}

// fresh reports whether the cell's regional view can be used at now without
// reading origin: it was synced within freshFor, or synced after its window
// (plus freshFor for late replays) had ended, when it no longer changes.
func (c *cell) fresh(now, freshFor int64) bool {
	s := c.syncedAt.Load()
	if s == 0 {
		return false
	}
	return now < s+freshFor || s >= (c.seq+1)*c.b.key.duration+freshFor
}

// table is the concurrent map of buckets. Lookups of existing buckets take no
// lock and allocate nothing.
//
// Buckets are found by a 64-bit hash of their key, computed in one pass,
// and the key is then compared. A key whose hash is already held by another key lives
// in the overflow map, which is consulted only while it is non-empty.
type table struct {
	seed  maphash.Seed
	m     *xsync.Map[uint64, *bucket]
	over  *xsync.Map[bucketKey, *bucket]
	overN atomic.Int64
}

func newTable() *table {
	return &table{
		seed: maphash.MakeSeed(),
		m:    xsync.NewMap[uint64, *bucket](),
		over: xsync.NewMap[bucketKey, *bucket](),
	}
}

// hash hashes the byte sequence workspace, 0, namespace, 0, duration (8
// bytes, little endian), identifier. A key that fits hashKeyBuf is gathered
// on the stack and hashed in one call; a longer key is streamed, which
// hashes the same bytes to the same value.
func (t *table) hash(k *bucketKey) uint64 {
	if len(k.workspace)+len(k.namespace)+len(k.identifier)+10 <= hashKeyBuf {
		var buf [hashKeyBuf]byte
		b := append(buf[:0], k.workspace...)
		b = append(b, 0)
		b = append(b, k.namespace...)
		b = append(b, 0)
		b = binary.LittleEndian.AppendUint64(b, uint64(k.duration))
		b = append(b, k.identifier...)
		return maphash.Bytes(t.seed, b)
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(k.workspace)
	h.WriteByte(0)
	h.WriteString(k.namespace)
	h.WriteByte(0)
	var d [8]byte
	binary.LittleEndian.PutUint64(d[:], uint64(k.duration))
	h.Write(d[:])
	h.WriteString(k.identifier)
	return h.Sum64()
}

// hashKeyBuf is the longest key hash gathers on the stack.
const hashKeyBuf = 128

// load returns the bucket for k, or nil.
func (t *table) load(k bucketKey) *bucket {
	return t.loadHashed(t.hash(&k), &k)
}

func (t *table) loadHashed(h uint64, k *bucketKey) *bucket {
	if b, ok := t.m.Load(h); ok && b.key == *k {
		return b
	}
	if t.overN.Load() > 0 {
		if b, ok := t.over.Load(*k); ok {
			return b
		}
	}
	return nil
}

// loadOrCreate returns the bucket for k, creating it when absent. A new key
// gets its own copy of the strings, in one allocation, so it pins no request
// buffer and a lookup's comparison reads one place in memory.
func (t *table) loadOrCreate(k bucketKey) *bucket {
	return t.loadOrCreateHashed(t.hash(&k), k)
}

func (t *table) loadOrCreateHashed(h uint64, k bucketKey) *bucket {
	if b := t.loadHashed(h, &k); b != nil {
		return b
	}
	all := strings.Clone(k.workspace + k.namespace + k.identifier)
	nw, nn := len(k.workspace), len(k.workspace)+len(k.namespace)
	k = bucketKey{
		workspace:  all[:nw],
		namespace:  all[nw:nn],
		identifier: all[nn:],
		duration:   k.duration,
	}
	b, _ := t.m.LoadOrCompute(h, func() (*bucket, bool) {
		return &bucket{key: k, h: h}, false
	})
	if b.key == k {
		return b
	}
	b, loaded := t.over.LoadOrCompute(k, func() (*bucket, bool) {
		return &bucket{key: k, h: h}, false
	})
	if !loaded {
		t.overN.Add(1)
	}
	return b
}

// remove deletes b from the table if it is still the bucket for its key.
func (t *table) remove(b *bucket) {
	deleted := false
	t.m.Compute(b.h, func(old *bucket, loaded bool) (*bucket, xsync.ComputeOp) {
		if loaded && old == b {
			deleted = true
			return nil, xsync.DeleteOp
		}
		return old, xsync.CancelOp
	})
	if deleted {
		return
	}
	t.over.Compute(b.key, func(old *bucket, loaded bool) (*bucket, xsync.ComputeOp) {
		if loaded && old == b {
			t.overN.Add(-1)
			return nil, xsync.DeleteOp
		}
		return old, xsync.CancelOp
	})
}

// all yields every bucket.
func (t *table) all(yield func(*bucket) bool) {
	for _, b := range t.m.All() {
		if !yield(b) {
			return
		}
	}
	if t.overN.Load() > 0 {
		for _, b := range t.over.All() {
			if !yield(b) {
				return
			}
		}
	}
}

// size returns the number of buckets.
func (t *table) size() int { return t.m.Size() + t.over.Size() }

// peek returns the cell of seq if the bucket holds it, else nil.
func (b *bucket) peek(seq int64) *cell {
	c := b.cells[seq&1].Load()
	if c != nil && c.seq == seq {
		return c
	}
	return nil
}

// slotNewer reports a sequence newer than seq held in seq's slot, or 0.
func (b *bucket) slotNewer(seq int64) int64 {
	if c := b.cells[seq&1].Load(); c != nil && c.seq > seq {
		return c.seq
	}
	return 0
}

// cellFor returns the cell of seq, installing a new cold cell when the slot
// holds an older one, none, or one beyond window.MaxSequence (created
// reports that it did). It returns nil
// when the slot already holds a newer sequence: the caller's clock is behind
// another caller's.
func (b *bucket) cellFor(seq int64) (c *cell, created bool) {
	slot := &b.cells[seq&1]
	for {
		c := slot.Load()
		switch {
		case c != nil && c.seq == seq:
			return c, false
		case c != nil && c.seq > seq && c.seq <= window.MaxSequence(b.key.duration):
			return nil, false
		}
		n := &cell{b: b, seq: seq}
		if slot.CompareAndSwap(c, n) {
			return n, true
		}
	}
}
