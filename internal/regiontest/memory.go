// Package regiontest holds Memory, a region.Origin in process memory that
// decides by the same rules as the Redis origin's scripts, step for step:
// for tests of the limiter, its doors and the bridge that need an origin
// whose clock they drive. region's own tests hold both origins to one
// contract.
package regiontest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Memory is a region.Origin held in process memory. Services that share one
// Memory converge as limiters sharing a Redis would, by the same rules (the
// Redis scripts do what Memory.sync does); it serves tests. It is safe for
// concurrent use. The zero value is not usable; call NewMemory.
type Memory struct {
	now func() time.Time
	// ForgetAfter is how long after a reporter was last heard of, holding
	// nothing unused, it is forgotten (region.RedisConfig.ForgetAfter); set it
	// before first use. NewMemory sets ForgetAfter.
	ForgetAfter time.Duration

	mu        sync.Mutex
	cells     map[window.Cell]*memoryCell
	nextSweep int64
}

type memoryCell struct {
	charged   int64 // Σ max(claim, used) over reporters, forgotten ones included (Redis field t)
	used      int64 // the count: Σ used, ended leases counted as used (u)
	expireAt  int64
	reporters map[string]*memoryReporter
	foreign   int64 // Import's foreign usage (g)
	floor     int64 // Import's own lower bound (o)
	lost      int64 // admissions the cell lost (b): see Redis's importScript
	contended int64 // unix ms until which the cell is contended (x)
	tidyAt    int64 // unix ms when tidy is next due, 0: none (n)
	reversals int64 // leases counted as used that came back (r)
	// locals holds, per LocalID, the largest local count the cell was told
	// (Sync.Local, Imported.Locals: the Redis cell's locals); kept, as in
	// Redis, until the cell expires.
	locals map[string]int64
}

// raise raises the cell's local count of id to n (Sync.Local): what it
// adds is charged and counted as used once, and taken out of lost (it may
// hold it already). A count not above the one held changes nothing.
func (e *memoryCell) raise(id string, n int64) {
	n = min(n, window.MaxCount)
	old := e.locals[id]
	if n <= old {
		return
	}
	if e.locals == nil {
		e.locals = make(map[string]int64)
	}
	d := n - old
	e.locals[id] = n
	e.charged += d
	e.used += d
	e.lost = max(0, e.lost-d)
}

type memoryReporter struct {
	seq, used, claim int64
	// live is the unix ms until which its lease is live, or when it was
	// last heard of while it holds none (e).
	live int64
	// retired is the unix ms it retired at (its seq is then negative in
	// Redis), 0: not retired.
	retired int64
}

func (r *memoryReporter) charge() int64 { return max(r.claim, r.used) }

// memorySweepEvery is how often, at most, expired cells are dropped.
const memorySweepEvery = 10_000 // ms

// NewMemory returns an empty in-memory origin. now is its clock (nil means
// time.Now); it decides when cells have expired, leases stop being live and
// reporters are forgotten.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, ForgetAfter: region.ForgetAfter, cells: make(map[window.Cell]*memoryCell)}
}

func (m *Memory) forgetMs() int64 { return max(m.ForgetAfter.Milliseconds(), 1) }

// cell returns the live cell c, or nil.
func (m *Memory) cell(c window.Cell, now int64) *memoryCell {
	e, ok := m.cells[c]
	if !ok || e.expireAt <= now {
		return nil
	}
	return e
}

// Read returns what the memory holds of c and of the cell before it
// (region.Previous), as (*region.Redis).Read does: each cell's count
// (region.CellCounts.Used) and the other regions' usage Import recorded;
// expired cells count 0.
func (m *Memory) Read(_ context.Context, c window.Cell) (current, previous region.Totals, err error) {
	now := m.now().UnixMilli()
	p := region.Previous(c)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.totals(c, now), m.totals(p, now), nil
}

func (m *Memory) totals(c window.Cell, now int64) region.Totals {
	e := m.cell(c, now)
	if e == nil {
		return region.Totals{}
	}
	m.tidyIfDue(e, now, "")
	return region.Totals{Count: e.count(), Foreign: e.foreign}
}

// count is the cell's count (region.CellCounts.Used).
func (e *memoryCell) count() int64 { return max(e.used+e.lost, e.floor) }

// chargedAll is everything charged, at least the own lower bound.
func (e *memoryCell) chargedAll() int64 { return max(e.charged+e.lost, e.floor) }

// tidyIfDue runs tidy when it is due at now (Redis's tidy in the scripts):
// the unused part of an ended lease counts as used, reporters holding
// nothing unused and unheard of for ForgetAfter are forgotten (keep
// excepted), and tidyAt becomes when this is next due.
func (m *Memory) tidyIfDue(e *memoryCell, now int64, keep string) {
	if e.tidyAt == 0 || e.tidyAt > now {
		return
	}
	forget := m.forgetMs()
	e.tidyAt = 0
	for who, r := range e.reporters {
		var due int64
		if r.retired != 0 {
			due = r.retired + forget
		} else {
			if r.claim > r.used && r.live <= now {
				e.used += r.claim - r.used
				r.used = r.claim
			}
			due = r.live + forget
			if r.claim > r.used {
				due = r.live
			}
		}
		if due <= now && r.claim <= r.used && who != keep {
			delete(e.reporters, who)
			continue
		}
		if due > now && (e.tidyAt == 0 || due < e.tidyAt) {
			e.tidyAt = due
		}
	}
}

// Import records imports atomically with respect to other calls, as
// Redis's importScript does. It fails only on an invalid local count
// (region.ErrInvalidLocal), and then changes nothing.
func (m *Memory) Import(_ context.Context, imports []region.Imported) error {
	if err := region.CheckImports(imports); err != nil {
		return fmt.Errorf("memory import: %w", err)
	}
	now := m.now().UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	for _, im := range imports {
		own := min(im.Own, window.MaxCount)
		e := m.cell(im.Cell, now)
		if e == nil {
			if im.ExpireAt <= now || im.Foreign <= 0 && own <= 0 && !anyLocal(im.Locals) {
				// Redis creates no key (or one already expired).
				continue
			}
			e = &memoryCell{expireAt: im.ExpireAt}
			m.cells[im.Cell] = e
		}
		for _, l := range im.Locals {
			e.raise(l.ID, l.Count)
		}
		e.foreign = max(e.foreign, min(im.Foreign, window.MaxCount))
		e.floor = max(e.floor, own)
		// Every admission is charged before it is final: an own count
		// above what is charged means the cell lost admissions.
		if own > e.charged+e.lost {
			e.lost = own - e.charged
		}
	}
	return nil
}

// anyLocal reports whether a local count of ls raises anything.
func anyLocal(ls []region.LocalCount) bool {
	for _, l := range ls {
		if l.Count > 0 {
			return true
		}
	}
	return false
}

// sweep drops expired cells at most every memorySweepEvery. The caller
// holds m.mu.
func (m *Memory) sweep(now int64) {
	if now < m.nextSweep {
		return
	}
	for c, e := range m.cells {
		if e.expireAt <= now {
			delete(m.cells, c)
		}
	}
	m.nextSweep = now + memorySweepEvery
}

// Sync applies s atomically with respect to other calls. It fails only on
// an invalid local count (region.ErrInvalidLocal), and then changes nothing.
func (m *Memory) Sync(_ context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if err := region.CheckSync(&s); err != nil {
		return region.SyncResult{}, fmt.Errorf("memory sync: %w", err)
	}
	now := m.now().UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	return m.sync(reporter, s, now), nil
}

// Settle applies each sync atomically with respect to other calls. It
// fails only on an invalid local count (region.ErrInvalidLocal), and then applies
// none of ss.
func (m *Memory) Settle(_ context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	if err := checkSyncs(ss); err != nil {
		return nil, fmt.Errorf("memory settle: %w", err)
	}
	now := m.now().UnixMilli()
	out := make([]region.SyncResult, len(ss))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	for i, s := range ss {
		out[i] = m.sync(reporter, s, now)
	}
	return out, nil
}

// checkSyncs checks every sync of ss (region.CheckSync).
func checkSyncs(ss []region.Sync) error {
	for i := range ss {
		if err := region.CheckSync(&ss[i]); err != nil {
			return err
		}
	}
	return nil
}

// Local returns the local count the memory keeps for cell c under id
// (Redis: the cell's locals), and whether it keeps one.
func (m *Memory) Local(c window.Cell, id string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.cells[c]; e != nil {
		n, ok := e.locals[id]
		return n, ok
	}
	return 0, false
}

// ExpireAt returns the unix ms at which the memory drops cell c, 0 if it
// holds none.
func (m *Memory) ExpireAt(c window.Cell) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.cells[c]; e != nil {
		return e.expireAt
	}
	return 0
}

// Reporters returns how many reporters (retirement marks included) the
// origin holds for cell c: what a cell's state grows with.
func (m *Memory) Reporters(c window.Cell) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.cell(c, m.now().UnixMilli()); e != nil {
		return len(e.reporters)
	}
	return 0
}

// reporterID is the name under which a reporter's generation is kept.
func reporterID(reporter string, gen int64) string {
	if gen <= 0 {
		return reporter
	}
	return reporter + "/" + strconv.FormatInt(gen, 10)
}

// sync is one Sync at now; the caller holds m.mu. The Redis sync script
// does the same, step for step.
func (m *Memory) sync(reporter string, s region.Sync, now int64) region.SyncResult {
	cur := m.cell(s.Cell, now)
	if cur == nil {
		cur = &memoryCell{}
		m.cells[s.Cell] = cur
	}
	cur.expireAt = s.ExpireAt
	if cur.reporters == nil {
		cur.reporters = make(map[string]*memoryReporter)
	}
	id := reporterID(reporter, s.Generation)
	m.tidyIfDue(cur, now, id)
	r := cur.reporters[id]
	if r == nil {
		r = &memoryReporter{}
	}
	res := region.SyncResult{Outcomes: make([]region.Outcome, len(s.Requests))}

	// 0. The local count, even when the sync is overtaken or the reporter
	// retired: what it admitted without the origin counts once, whichever
	// path tells it first.
	if s.LocalID != "" {
		cur.raise(s.LocalID, s.Local)
		res.Local = cur.locals[s.LocalID]
	}

	// 1. The reporter's state, unless overtaken or retired.
	retired := r.retired != 0
	stale := retired || s.Seq <= r.seq
	if !stale {
		cur.reporters[id] = r
		if r.seq == 0 && cur.lost > 0 {
			// A reporter the cell does not know, with admissions: the
			// cell was lost and rebuilt, and lost holds them already.
			cur.lost = max(0, cur.lost-max(s.Claim, s.Used))
		}
		if s.Used < r.used {
			cur.reversals++ // it gave back a lease counted as used
		}
		known := r.seq > 0
		old := r.charge()
		cur.used += s.Used - r.used
		r.seq, r.used, r.claim = s.Seq, s.Used, max(s.Claim, s.Used)
		cur.charged += r.charge() - old
		// The lower bound of the region's admissions of a reporter the
		// cell does not know, above what is charged: the cell was lost, and
		// the other reporters' parts are missing until they sync again
		// (each then takes its part back out of lost, above). A reporter
		// the cell knows was not lost with it: its floor is not taken.
		if f := min(s.Floor, window.MaxCount); !known && f > cur.charged+cur.lost {
			cur.lost = f - cur.charged
		}
	}
	res.Stale = stale && !retired

	prev := m.cell(s.Previous(), now)
	if prev == nil || s.ReportOnly || s.Fixed {
		prev = &memoryCell{}
	} else {
		m.tidyIfDue(prev, now, "")
	}
	foreign := max(s.Foreign, cur.foreign)
	foreignPrev := max(s.ForeignPrevious, prev.foreign)
	if s.Fixed {
		foreignPrev = 0 // a fixed window weighs no previous cell
	}
	capacity := func(prevCount int64) int64 {
		if window.AddCounts(prevCount, foreignPrev) >= maxExact || foreign >= maxExact {
			return -1 // as in the Redis script, whose numbers are exact below 2^53
		}
		c := window.Room(window.Input{Now: window.Start(s.Cell.Sequence, s.Cell.Duration) + s.Elapsed, Duration: s.Cell.Duration,
			Limit: s.Limit, Previous: window.AddCounts(prevCount, foreignPrev)})
		if c < 0 {
			return -1
		}
		return c - foreign
	}

	// 2. The requests, in order, against everything charged.
	capUp := int64(region.RoomUnknown) // a report only: not computed
	if !s.ReportOnly {
		capUp = capacity(prev.chargedAll())
	}
	var pending bool
	for i, q := range s.Requests {
		if stale || !q.Debit && cur.chargedAll()+q.Cost > capUp {
			res.Outcomes[i] = region.Pending
			pending = pending || !stale
			continue
		}
		r.claim += q.Cost
		cur.charged += q.Cost
		if !q.Reserve {
			r.used += q.Cost
			cur.used += q.Cost
		}
	}

	// 3. What did not fit: denied if the count (admissions, ended leases
	// as used) leaves no room, else pending until live leases are used or
	// returned.
	if pending {
		capFirm := capacity(prev.count())
		for i, q := range s.Requests {
			if res.Outcomes[i] != region.Pending {
				continue
			}
			if cur.count()+q.Cost > capFirm {
				res.Outcomes[i] = region.Denied
				continue
			}
			cur.contended = now + region.ContendFor
			res.WaitMs = region.ContendFor
			if cur.tidyAt > now {
				res.WaitMs = min(res.WaitMs, cur.tidyAt-now)
			}
		}
	}

	// 4. A lease, while nothing waits and the cell is not contended: the
	// reporter's whole unused holding stays within 1/LeaseShare of the room.
	if !stale && s.Want > 0 && !pending && now >= cur.contended {
		h := r.claim - r.used
		if most := (capUp-cur.chargedAll()+h)/region.LeaseShare - h; most > 0 {
			res.Lease = min(s.Want, most)
			r.claim += res.Lease
			cur.charged += res.Lease
		}
	}
	if !stale {
		due := now + m.forgetMs()
		if r.claim > r.used {
			r.live = now + s.LiveFor
			due = r.live
		} else {
			r.live = now
		}
		if s.Retire && r.claim <= r.used {
			// Folded into the totals: only a mark stays, so a sync of it
			// sent again changes nothing.
			*r = memoryReporter{seq: r.seq, used: r.used, claim: r.used, retired: now}
			due = now + m.forgetMs()
		}
		if cur.tidyAt == 0 || due < cur.tidyAt {
			cur.tidyAt = due
		}
	}

	res.Charged = r.charge()
	if retired {
		res.Charged = 0 // forgotten: the origin holds nothing for it
	}
	res.PreviousRead = !s.ReportOnly && !s.Fixed
	res.Contended = now < cur.contended
	res.Room = capUp - cur.chargedAll()
	res.Reversals = cur.reversals
	res.Current = region.CellCounts{Used: cur.count(), Charged: cur.chargedAll(), Foreign: cur.foreign}
	res.Previous = region.CellCounts{Used: prev.count(), Charged: prev.chargedAll(), Foreign: prev.foreign}
	return res
}

// maxExact is 2^53: counts from there on leave no room (the Redis script's
// numbers are exact below it; the largest limit is about 2^50).
const maxExact = 1 << 53

// Close does nothing: the memory is released with the Memory.
func (m *Memory) Close() error { return nil }

var _ region.Origin = (*Memory)(nil)
