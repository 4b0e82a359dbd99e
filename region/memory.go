package region

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Memory is an Origin held in process memory: the embedded default when no
// Redis is configured. It converges nothing beyond its own process but keeps
// the totals a limiter has replayed, so cells the limiter forgot can be
// hydrated again. The zero value is not usable; call NewMemory.
type Memory struct {
	now func() time.Time

	mu        sync.Mutex
	cells     map[window.Cell]memoryCell
	nextSweep int64
}

type memoryCell struct {
	total    int64
	expireAt int64
}

// memorySweepEvery is how often, at most, Apply drops expired cells.
const memorySweepEvery = 10_000 // ms

// NewMemory returns an empty in-memory origin. now is its clock (nil means
// time.Now); it decides when cells have expired.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, cells: make(map[window.Cell]memoryCell)}
}

// Read returns the totals of c and of the cell before it; expired cells
// count 0.
func (m *Memory) Read(_ context.Context, c window.Cell) (current, previous int64, err error) {
	now := m.now().UnixMilli()
	p := c
	p.Sequence--
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.get(c, now), m.get(p, now), nil
}

func (m *Memory) get(c window.Cell, now int64) int64 {
	e, ok := m.cells[c]
	if !ok || e.expireAt <= now {
		return 0
	}
	return e.total
}

// Apply adds every delta atomically with respect to other calls and returns
// the new totals. It never fails.
func (m *Memory) Apply(_ context.Context, deltas []Delta) ([]int64, error) {
	now := m.now().UnixMilli()
	totals := make([]int64, len(deltas))
	m.mu.Lock()
	defer m.mu.Unlock()
	if now >= m.nextSweep {
		for c, e := range m.cells {
			if e.expireAt <= now {
				delete(m.cells, c)
			}
		}
		m.nextSweep = now + memorySweepEvery
	}
	for i, d := range deltas {
		e := m.cells[d.Cell]
		if e.expireAt <= now {
			e = memoryCell{}
		}
		e.total += d.Delta
		e.expireAt = d.ExpireAt
		m.cells[d.Cell] = e
		totals[i] = e.total
	}
	return totals, nil
}

// Len returns how many cells the origin holds, expired ones included until
// the next sweep.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cells)
}

// Close does nothing: the memory is released with the Memory.
func (m *Memory) Close() error { return nil }
