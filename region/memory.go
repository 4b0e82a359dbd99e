package region

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Memory is an Origin held in process memory. Services that share one Memory
// converge as limiters sharing a Redis would, by the same rules (the Redis
// scripts mirror this file); it serves tests and single-process setups. It
// is safe for concurrent use. The zero value is not usable; call NewMemory.
type Memory struct {
	now func() time.Time

	mu        sync.Mutex
	cells     map[window.Cell]*memoryCell
	nextSweep int64
}

type memoryCell struct {
	charged   int64 // Σ max(claim, used) over reporters (Redis field t)
	used      int64 // Σ used over reporters (u)
	expireAt  int64
	reporters map[string]*memoryReporter
	foreign   int64 // Import's foreign usage (g)
	floor     int64 // Import's own lower bound (o)
	lost      int64 // admissions the cell lost (b): see Redis's importScript
	contended int64 // unix ms until which the cell is contended (x)
}

type memoryReporter struct {
	seq, used, claim int64
	live             int64 // unix ms until which its lease is live (e)
}

func (r *memoryReporter) charge() int64 { return max(r.claim, r.used) }

// memorySweepEvery is how often, at most, expired cells are dropped.
const memorySweepEvery = 10_000 // ms

// NewMemory returns an empty in-memory origin. now is its clock (nil means
// time.Now); it decides when cells have expired and leases stop being live.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, cells: make(map[window.Cell]*memoryCell)}
}

// cell returns the live cell c, or nil.
func (m *Memory) cell(c window.Cell, now int64) *memoryCell {
	e, ok := m.cells[c]
	if !ok || e.expireAt <= now {
		return nil
	}
	return e
}

// Read returns what the memory holds of c and of the cell before it (see
// Origin.Read); expired cells count 0.
func (m *Memory) Read(_ context.Context, c window.Cell) (current, previous Totals, err error) {
	now := m.now().UnixMilli()
	p := Previous(c)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.totals(c, now), m.totals(p, now), nil
}

func (m *Memory) totals(c window.Cell, now int64) Totals {
	e := m.cell(c, now)
	if e == nil {
		return Totals{}
	}
	live, _ := liveLeases(e, now)
	return Totals{Count: max(e.charged+e.lost-live, e.floor), Foreign: e.foreign}
}

// Import records imports atomically with respect to other calls. It never
// fails.
func (m *Memory) Import(_ context.Context, imports []Imported) error {
	now := m.now().UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	for _, im := range imports {
		if im.ExpireAt <= now || im.Foreign <= 0 && im.Own <= 0 {
			continue
		}
		e := m.cell(im.Cell, now)
		if e == nil {
			e = &memoryCell{expireAt: im.ExpireAt}
			m.cells[im.Cell] = e
		}
		e.foreign = max(e.foreign, min(im.Foreign, window.MaxCount))
		e.floor = max(e.floor, min(im.Own, window.MaxCount))
		// Every admission is charged before it is final: an own count
		// above what is charged means the cell lost admissions.
		if e.floor > e.charged+e.lost {
			e.lost = e.floor - e.charged
		}
	}
	return nil
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

// Sync applies s atomically with respect to other calls. It never fails.
func (m *Memory) Sync(_ context.Context, reporter string, s Sync) (SyncResult, error) {
	now := m.now().UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	return m.sync(reporter, s, now), nil
}

// Settle applies each sync atomically with respect to other calls. It never
// fails.
func (m *Memory) Settle(_ context.Context, reporter string, ss []Sync) ([]SyncResult, error) {
	now := m.now().UnixMilli()
	out := make([]SyncResult, len(ss))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	for i, s := range ss {
		out[i] = m.sync(reporter, s, now)
	}
	return out, nil
}

// sync is one Sync at now; the caller holds m.mu. The Redis sync script
// does the same, step for step.
func (m *Memory) sync(reporter string, s Sync, now int64) SyncResult {
	cur := m.cell(s.Cell, now)
	if cur == nil {
		cur = &memoryCell{}
		m.cells[s.Cell] = cur
	}
	cur.expireAt = s.ExpireAt
	if cur.reporters == nil {
		cur.reporters = make(map[string]*memoryReporter)
	}
	r := cur.reporters[reporter]
	if r == nil {
		r = &memoryReporter{}
		cur.reporters[reporter] = r
	}
	res := SyncResult{Outcomes: make([]Outcome, len(s.Requests))}

	// 1. The reporter's state, unless overtaken. A reporter the cell does
	// not know, with admissions: the cell was lost and rebuilt, and lost
	// holds them already.
	if s.Seq > r.seq && r.seq == 0 && cur.lost > 0 {
		cur.lost = max(0, cur.lost-max(s.Claim, s.Used))
	}
	if s.Seq <= r.seq {
		res.Stale = true
		for i := range res.Outcomes {
			res.Outcomes[i] = Pending
		}
	} else {
		old := r.charge()
		cur.used += s.Used - r.used
		r.seq, r.used, r.claim = s.Seq, s.Used, max(s.Claim, s.Used)
		cur.charged += r.charge() - old
		// The reporter's lower bound of the region's admissions, above
		// what is charged: the cell was lost, and the other reporters'
		// parts are missing until they sync again (each then takes its
		// part back out of lost, above).
		if f := min(s.Floor, window.MaxCount); f > cur.charged+cur.lost {
			cur.lost = f - cur.charged
		}
	}

	prev := m.cell(s.Previous(), now)
	if prev == nil || s.ReportOnly {
		prev = &memoryCell{}
	}
	foreign := max(s.Foreign, cur.foreign)
	foreignPrev := max(s.ForeignPrevious, prev.foreign)
	capacity := func(prevCount int64) int64 {
		if window.AddCounts(prevCount, foreignPrev) >= maxExact || foreign >= maxExact {
			return -1 // as in the Redis script, whose numbers are exact below 2^53
		}
		c := window.Room(window.Input{Now: s.Cell.Sequence*s.Cell.Duration + s.Elapsed, Duration: s.Cell.Duration,
			Limit: s.Limit, Previous: window.AddCounts(prevCount, foreignPrev)})
		if c < 0 {
			return -1
		}
		return c - foreign
	}
	charged := func(e *memoryCell) int64 { return max(e.charged+e.lost, e.floor) }
	used := func(e *memoryCell) int64 { return max(e.used+e.lost, e.floor) }

	// 2. The requests, in order, against everything charged.
	capUp := int64(RoomUnknown) // a report only: not computed
	if !s.ReportOnly {
		capUp = capacity(charged(prev))
	}
	var pending bool
	if !res.Stale {
		for i, q := range s.Requests {
			if charged(cur)+q.Cost > capUp {
				res.Outcomes[i] = Pending
				pending = true
				continue
			}
			r.claim += q.Cost
			cur.charged += q.Cost
			if !q.Reserve {
				r.used += q.Cost
				cur.used += q.Cost
			}
		}
	}

	// 3. What did not fit: denied if the admissions alone (live leases
	// counted unused) leave no room, else pending until the leases are
	// used or returned.
	firm, firmPrev := used(cur), used(prev)
	if pending {
		liveCur, waitCur := liveLeases(cur, now)
		livePrev, waitPrev := liveLeases(prev, now)
		firm = max(cur.charged+cur.lost-liveCur, cur.floor)
		firmPrev = max(prev.charged+prev.lost-livePrev, prev.floor)
		capFirm := capacity(firmPrev)
		for i, q := range s.Requests {
			if res.Outcomes[i] != Pending {
				continue
			}
			if firm+q.Cost > capFirm {
				res.Outcomes[i] = Denied
				continue
			}
			cur.contended = now + ContendFor
			res.WaitMs = max(res.WaitMs, min(waitFor(waitCur, now), waitFor(waitPrev, now), ContendFor))
		}
	}

	// 4. A lease beyond the requests, while the cell is not contended and
	// every request fitted.
	if !res.Stale && s.Want > 0 && !pending && now >= cur.contended {
		if left := capUp - charged(cur); left >= LeaseShare {
			res.Lease = min(s.Want, left/LeaseShare)
			r.claim += res.Lease
			cur.charged += res.Lease
		}
	}
	if r.claim > r.used {
		r.live = now + s.LiveFor
	}

	res.Charged = r.charge()
	res.PreviousRead = !s.ReportOnly
	res.Contended = now < cur.contended
	res.Room = capUp - charged(cur)
	res.Current = CellCounts{Used: used(cur), Charged: charged(cur), Firm: firm, Foreign: cur.foreign}
	res.Previous = CellCounts{Used: used(prev), Charged: charged(prev), Firm: firmPrev, Foreign: prev.foreign}
	return res
}

// maxExact is 2^53: counts from there on leave no room (the Redis script's
// numbers are exact below it; the largest limit is about 2^50).
const maxExact = 1 << 53

// liveLeases returns the unused lease of e's reporters whose leases are
// still live at now, and the earliest end of those leases (0: none).
func liveLeases(e *memoryCell, now int64) (sum, until int64) {
	for _, r := range e.reporters {
		if r.live > now && r.claim > r.used {
			sum += r.claim - r.used
			if until == 0 || r.live < until {
				until = r.live
			}
		}
	}
	return sum, until
}

// waitFor returns how long from now until unix ms until, or a large wait
// when until is 0 (no lease to wait on).
func waitFor(until, now int64) int64 {
	if until == 0 {
		return 1 << 62
	}
	return until - now
}

// Close does nothing: the memory is released with the Memory.
func (m *Memory) Close() error { return nil }
