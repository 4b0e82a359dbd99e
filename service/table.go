package service

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/policy"
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
	// failedAt is the unix millisecond of the last failed origin call for
	// the identifier: for ReadRetry after it, its checks decide locally;
	// negated when the call was only late (stalled: for ReadRetry its
	// checks the lease does not cover are denied).
	failedAt atomic.Int64
	// rate is this process's recent admission rate in the identifier's
	// current cell (cost per millisecond, float64 bits), measured at each
	// sync: obsUsed, what it had admitted in cell obsSeq at obsAt (unix ms).
	// It sizes the leases this process asks for (lease.go).
	rate                   atomic.Uint64
	obsSeq, obsUsed, obsAt atomic.Int64
	// firm is what the origin last counted against a check it denied:
	// until it allows more, checks of the identifier that these counts deny
	// are denied here without asking it again (lease.go). A reversal at
	// the origin (a lease counted as used came back) drops it.
	// It also keeps the origin's reversal count of the cell as last seen
	// (region.SyncResult.Reversals): when it grows, the cell's count, which
	// a lease counted as used had raised, is set anew from the origin.
	firm atomic.Pointer[firmCounts]
	// policy caches the overrides' match for the bucket's key as checks
	// send it (policy.go).
	policy atomic.Pointer[policyCache]
	// epoch is the latest reset epoch of the bucket's key (0: never
	// reset; reset.go): its cells are those of policy.CellEpoch, and
	// cells of a lower epoch are forgotten. It only grows.
	epoch atomic.Int64
	// series counts the decisions of the identifier's workspace and
	// namespace (decisions.go), found once.
	series atomic.Pointer[seriesCount]
}

// firmCounts are the origin's counts of a current cell (seq) and of the
// cell before it, when it denied a check at unix ms at (0: none; they
// deny nothing), and the cell's reversal count rev as last seen. The counts
// only grow, unless a lease counted as used comes back (a reversal), which
// drops them.
type firmCounts struct{ seq, cur, prev, at, rev int64 }

// cell holds the counters of one window cell.
//
// With an origin, every admission of the region is charged at the origin
// before it is final (docs/architecture.md, "Exact in a region"): this
// process either spends its lease (avail, charged in advance) or has the
// origin decide. What the origin counts for this process is top: its
// admissions, its unused lease and the reservations batches hold. So its own
// admissions are top − avail − held.
//
// A cell fits the 128-byte size class, two cache lines. The first holds
// everything a warm decision reads (seq, count, imported, avail,
// leaseUntil, syncedAt), so such a decision touches one line of each of its
// two cells.
type cell struct {
	b   *bucket
	seq int64
	// epoch is the reset epoch in the cell's identity (window.Cell.Epoch),
	// fixed when the cell is made.
	epoch int64

	// count is a lower bound of the region's admissions in the cell: what
	// the origin last reported as admitted plus what this process admitted
	// since. It only grows, except when a local batch (no origin, or the
	// origin failing) releases a reservation it made. Local denials and
	// the replies' remaining use it.
	count atomic.Int64
	// imported is the sum of other regions' usage of the cell (max-merged).
	imported atomic.Int64
	// avail is the unused lease this process may spend without asking the
	// origin, until leaseUntil (unix ms, this process's clock).
	avail      atomic.Int64
	leaseUntil atomic.Int64
	// syncedAt is the unix millisecond of the last successful sync with the
	// origin (0: never).
	syncedAt atomic.Int64

	// top is what the origin counts for this process in the cell (its
	// claim): admissions, unused lease and reservations held. held is what
	// batches have reserved and not yet committed or given back. Both
	// change under mu, except that an admission the origin never saw
	// (decided while it failed) adds to top at once.
	top  atomic.Int64
	held atomic.Int64
	// limit is the limit of the last admission, for leases and the settle
	// cadence.
	limit atomic.Int64
	// published is the highest count sent to the bridge.
	published atomic.Int64

	// mu orders the short steps that move top, avail and held together:
	// building a sync, applying its result, batch reservations. It is
	// never held across a round trip (flagSyncing is); single checks never
	// take it.
	mu sync.Mutex
	// links thread the settle and global stacks (cellStack); each owned
	// by whoever pushed or popped the cell there.
	links [2]*cell
	// flags holds the cell's flag bits. One word instead of one atomic.Bool
	// each keeps the cell at 128 bytes, a size class below 144.
	flags atomic.Uint32
}

// The bits of cell.flags.
const (
	// flagQueued is set while the cell waits on the settle stack.
	flagQueued uint32 = 1 << iota
	// flagNear is set once less than half the limit was left.
	flagNear
	// flagContended is set when the origin said a request waited on
	// leases: the next round gives back this process's unused lease.
	flagContended
	// flagDenialSent is set once a denial made the cell's component go to
	// other regions at once (publishDenial).
	flagDenialSent
	// flagGlobalQueued is set while the cell waits on the global stack.
	flagGlobalQueued
	// flagUnsettled is set while the origin may not hold top (a sync
	// failed, or top grew by an admission it never saw).
	flagUnsettled
	// flagSyncing is set while a sync of the cell is on its way: syncs of
	// one cell never overlap, so what the origin counts for this process
	// and top move together.
	flagSyncing
	// flagFixed is set while the cell's last admission was of a fixed
	// window (Query.Fixed): its background syncs weigh the room so.
	flagFixed
)

// rule is the limit and window kind a sync weighs a cell's room by: a
// check's, or the zero rule for the cell's last (cell.rule).
type rule struct {
	limit int64
	fixed bool
}

// rule returns the rule of the cell's last admission.
func (c *cell) rule() rule { return rule{limit: c.limit.Load(), fixed: c.has(flagFixed)} }

// genShift is where the cell's generation at the origin starts in flags
// (region.Sync.Generation): the bits above the flags, 24 of them.
const genShift = 8

// gen returns the generation this process reports the cell under.
func (c *cell) gen() int64 { return int64(c.flags.Load() >> genShift) }

// nextGen moves the cell to its next generation.
func (c *cell) nextGen() { c.flags.Add(1 << genShift) }

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

// identity returns the cell's window.Cell.
func (c *cell) identity() window.Cell {
	k := &c.b.key
	return window.Cell{Workspace: k.workspace, Namespace: k.namespace, Identifier: k.identifier,
		Duration: k.duration, Sequence: c.seq, Epoch: c.epoch}
}

// forgotten reports whether a reset forgot c: its epoch is below the one
// its bucket's latest reset names for its window. Such a cell is neither
// read nor counted into; what it holds for the origin goes back.
func (c *cell) forgotten() bool {
	return policy.Forgotten(c.b.epoch.Load(), c.b.key.duration, c.seq, c.epoch)
}

// prevEpoch returns the epoch of the cell before c that the rule weighs
// with c: c's own epoch, except that the cell of epoch 0 in the window after
// a reset's follows the reset window's cell of the reset's epoch. For a
// forgotten cell of epoch 0, epoch 0.
func (c *cell) prevEpoch() int64 {
	if c.epoch != 0 {
		return c.epoch
	}
	e, d := c.b.epoch.Load(), c.b.key.duration
	if policy.Forgotten(e, d, c.seq, 0) {
		return 0
	}
	return policy.CellEpoch(e, d, c.seq-1)
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
func (c *cell) raise(v int64) { raiseTo(&c.count, v) }

// raiseTo lifts a to at least v and reports whether it changed it: the one
// atomic maximum of the package (counts, deadlines and epochs that only
// grow).
func raiseTo(a *atomic.Int64, v int64) bool {
	for {
		old := a.Load()
		if v <= old {
			return false
		}
		if a.CompareAndSwap(old, v) {
			return true
		}
	}
}

// trySync marks a sync of c on its way, unless one is already.
func (c *cell) trySync() bool { return c.set(flagSyncing) }

// doneSync ends what trySync began.
func (c *cell) doneSync() { c.clear(flagSyncing) }

// admitted returns count less what local batches hold reserved in it:
// what the region is known to have admitted, without reservations that may
// still be released (the count published to other regions). count is read
// before held, and a batch raises held before count and lowers it after,
// so a reservation is never included.
func (c *cell) admitted() int64 {
	return max(c.count.Load()-c.held.Load(), 0)
}

// used returns what this process has admitted in the cell, as far as it
// knows: top − avail − held. The caller holds c.mu (an admission the origin
// never saw may add to top meanwhile; it is then missed, never invented).
func (c *cell) used() int64 {
	return c.top.Load() - c.avail.Load() - c.held.Load()
}

// fresh reports whether the cell's regional view can be used at now without
// reading origin: it was synced within freshFor, or synced after its window
// (plus freshFor for late syncs) had ended, when it no longer changes.
func (c *cell) fresh(now, freshFor int64) bool {
	s := c.syncedAt.Load()
	if s == 0 {
		return false
	}
	return now < s+freshFor || s >= window.End(c.seq, c.b.key.duration)+freshFor
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
	// durs is every duration a bucket was made for (copy on write; nil
	// once there were more than maxDurations), so that a reset of every
	// duration finds an identifier's buckets by key rather than by a walk
	// of the table.
	durs   atomic.Pointer[[]int64]
	dursMu sync.Mutex
}

// maxDurations is how many distinct durations the table indexes; past it a
// reset of every duration walks the table.
const maxDurations = 64

// noteDuration records that a bucket of duration d was made.
func (t *table) noteDuration(d int64) {
	if p := t.durs.Load(); p == nil || slices.Contains(*p, d) {
		return
	}
	t.dursMu.Lock()
	defer t.dursMu.Unlock()
	p := t.durs.Load()
	switch {
	case p == nil || slices.Contains(*p, d):
	case len(*p) >= maxDurations:
		t.durs.Store(nil)
	default:
		next := append(slices.Clone(*p), d)
		t.durs.Store(&next)
	}
}

// durations returns every duration a bucket was made for, and false when
// there were more than maxDurations (the caller walks the table instead).
func (t *table) durations() ([]int64, bool) {
	if p := t.durs.Load(); p != nil {
		return *p, true
	}
	return nil, false
}

func newTable() *table {
	t := &table{
		seed: maphash.MakeSeed(),
		m:    xsync.NewMap[uint64, *bucket](),
		over: xsync.NewMap[bucketKey, *bucket](),
	}
	t.durs.Store(&[]int64{})
	return t
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
	t.noteDuration(k.duration)
	create := func() (*bucket, bool) { return &bucket{key: k, h: h}, false }
	if b, _ := t.m.LoadOrCompute(h, create); b.key == k {
		return b
	}
	b, loaded := t.over.LoadOrCompute(k, create)
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

// peek returns the cell of seq if the bucket holds it, else nil. Right
// after a reset reached the bucket it may return a cell the reset forgot,
// until raiseEpoch took it out of its slot: a check racing the reset.
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
// holds an older one, none, one a reset forgot, or one beyond
// window.MaxSequence (created reports that it did). A new cell's epoch is
// the one policy.CellEpoch names for seq by the bucket's latest reset. It
// returns nil when the slot already holds a newer sequence: the caller's
// clock is behind another caller's. A forgotten cell it replaces stays on
// the settle stack if it holds anything for the origin (as the janitor's
// dropped cells do), and settleAction gives it back.
func (b *bucket) cellFor(seq int64) (c *cell, created bool) {
	slot := &b.cells[seq&1]
	d := b.key.duration
	for {
		c := slot.Load()
		e := b.epoch.Load()
		switch {
		case c != nil && c.seq == seq && !policy.Forgotten(e, d, seq, c.epoch):
			return c, false
		case c != nil && c.seq > seq && c.seq <= window.MaxSequence(d):
			return nil, false
		}
		n := &cell{b: b, seq: seq, epoch: policy.CellEpoch(e, d, seq)}
		if slot.CompareAndSwap(c, n) {
			// A reset that raised the epoch after it was read stores
			// the epoch, then looks at the slots; this stored the cell,
			// then looks at the epoch: one of the two sees the other.
			if policy.Forgotten(b.epoch.Load(), d, seq, n.epoch) {
				continue
			}
			return n, true
		}
	}
}
