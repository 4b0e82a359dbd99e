package region

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Memory is an Origin held in process memory. Services that share one Memory
// converge as limiters sharing a Redis would; it serves tests and
// single-process setups that want replay semantics without a server. It is
// safe for concurrent use. The zero value is not usable; call NewMemory.
type Memory struct {
	now func() time.Time

	mu        sync.Mutex
	cells     map[window.Cell]*memoryCell
	nextSweep int64
}

type memoryCell struct {
	total    int64
	expireAt int64
	own      map[string]int64 // reporter → highest Own reported
	foreign  int64            // Import's foreign usage
	floor    int64            // Import's own lower bound
}

// memorySweepEvery is how often, at most, Apply drops expired cells.
const memorySweepEvery = 10_000 // ms

// NewMemory returns an empty in-memory origin. now is its clock (nil means
// time.Now); it decides when cells have expired.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, cells: make(map[window.Cell]*memoryCell)}
}

// Read returns what the memory holds of c and of the cell before it;
// expired cells count 0.
func (m *Memory) Read(_ context.Context, c window.Cell) (current, previous Totals, err error) {
	now := m.now().UnixMilli()
	p := c
	p.Sequence--
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.totals(c, now), m.totals(p, now), nil
}

func (m *Memory) totals(c window.Cell, now int64) Totals {
	e, ok := m.cells[c]
	if !ok || e.expireAt <= now {
		return Totals{}
	}
	return Totals{Count: max(e.total, e.floor), Foreign: e.foreign}
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
		e := m.cells[im.Cell]
		if e == nil || e.expireAt <= now {
			e = &memoryCell{expireAt: im.ExpireAt} // own is made by the first report
			m.cells[im.Cell] = e
		}
		e.foreign = max(e.foreign, min(im.Foreign, window.MaxCount))
		e.floor = max(e.floor, min(im.Own, window.MaxCount))
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

// Apply records every report atomically with respect to other calls and
// returns the cells' totals. It never fails.
func (m *Memory) Apply(_ context.Context, reporter string, reports []Report) ([]int64, error) {
	now := m.now().UnixMilli()
	totals := make([]int64, len(reports))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	for i, r := range reports {
		e := m.cells[r.Cell]
		if e == nil || e.expireAt <= now {
			e = &memoryCell{own: make(map[string]int64)}
			m.cells[r.Cell] = e
		}
		if e.own == nil {
			e.own = make(map[string]int64)
		}
		if old := e.own[reporter]; r.Own > old {
			e.own[reporter] = r.Own
			e.total += r.Own - old
		}
		e.expireAt = r.ExpireAt
		totals[i] = e.total
	}
	return totals, nil
}

// Admit decides a's admission atomically with respect to other calls. It
// never fails.
func (m *Memory) Admit(_ context.Context, reporter string, a Admission) (AdmitResult, error) {
	now := m.now().UnixMilli()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.cells[a.Cell]
	if e == nil || e.expireAt <= now {
		e = &memoryCell{own: make(map[string]int64)}
		m.cells[a.Cell] = e
	}
	if e.own == nil {
		e.own = make(map[string]int64)
	}
	if old := e.own[reporter]; a.Own > old {
		e.own[reporter] = a.Own
		e.total += a.Own - old
	}
	res := AdmitResult{}
	if e.total <= a.Max {
		e.total += a.Cost
		e.own[reporter] += a.Cost
		res.Admitted = true
	}
	e.expireAt = a.ExpireAt
	res.Total, res.Reported = e.total, e.own[reporter]
	return res, nil
}

// Release takes back cost from the cell's total and the reporter's count.
func (m *Memory) Release(_ context.Context, reporter string, c window.Cell, cost int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.cells[c]; e != nil && e.own != nil {
		e.total -= cost
		e.own[reporter] -= cost
	}
	return nil
}

// Close does nothing: the memory is released with the Memory.
func (m *Memory) Close() error { return nil }
