package service

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// GlobalSink receives what a limiter shares with other regions: its
// region's components and the denials it publishes. Package bus implements
// it by publishing to the region's bridge. Publish must not block for long:
// it runs on the service's publish loop.
type GlobalSink interface {
	Publish(cs []global.Component, ds []global.Denial)
}

// publishStep is the growth, as a fraction of the limit, that makes a
// cell's regional count worth publishing: each region hides at most this
// much of a limit from the others (see docs/architecture.md).
const publishStep = 100 // 1/publishStep of the limit

// globalStack is a lock-free stack of cells whose regional count grew.
type globalStack struct {
	head atomic.Pointer[cell]
}

func (g *globalStack) push(c *cell) {
	if !c.set(flagGlobalQueued) {
		return
	}
	for {
		h := g.head.Load()
		c.gnext = h
		if g.head.CompareAndSwap(h, c) {
			return
		}
	}
}

func (g *globalStack) takeAll() []*cell {
	var out []*cell
	for c := g.head.Swap(nil); c != nil; {
		next := c.gnext
		c.gnext = nil
		out = append(out, c)
		c = next
	}
	for _, c := range out {
		c.clear(flagGlobalQueued)
	}
	return out
}

// globalState is the service's side of the global layer.
type globalState struct {
	stack   globalStack
	mu      sync.Mutex
	denials []global.Denial
}

// queueGlobal notes that the cell's regional count may have grown.
func (s *Service) queueGlobal(c *cell, limit int64) {
	if limit > 0 && c.limit.Load() != limit {
		c.limit.Store(limit)
	}
	if c.b.key.duration >= s.globalMin {
		s.gstate.stack.push(c)
	}
}

// publish sends the components worth publishing and the queued denials.
// A cell's regional count is published when it grew by at least 1% of the
// limit since it was last published, or when the cell is near its limit or
// already shared with another region (it has imports or a floor): so each
// region hides less than 1% of a limit from the others, and at most one
// component per cell leaves per PublishInterval.
func (s *Service) publish() {
	cells := s.gstate.stack.takeAll()
	grace := s.cfg.ExpiryGrace.Milliseconds()
	var cs []global.Component
	for _, c := range cells {
		count := c.count.Load()
		last := c.published.Load()
		if count <= last {
			continue
		}
		step := max(1, c.limit.Load()/publishStep)
		if count-last < step && !c.has(flagNear) && c.imported.Load() == 0 && c.floor.Load() == 0 {
			continue
		}
		c.published.Store(count)
		id := c.identity()
		cs = append(cs, global.Component{Cell: id, Region: s.cfg.Region, Count: count, ExpireAt: id.Expiry(grace)})
	}
	s.gstate.mu.Lock()
	ds := s.gstate.denials
	s.gstate.denials = nil
	s.gstate.mu.Unlock()
	if len(cs) > 0 || len(ds) > 0 {
		s.counters.componentsOut.Add(int64(len(cs)))
		s.counters.denialsOut.Add(int64(len(ds)))
		s.global.Publish(cs, ds)
	}
}

// publishDenial queues the cell's first denial for other regions when its
// window is long enough to matter globally and the denied cell itself
// already holds the limit (its own usage, before this cost, not counting the
// previous window's weight). Other regions raise that exact cell to the
// limit, which is only right when the cell reached it: a denial caused by the
// previous window's weight, or by one oversized request on a fresh
// identifier, says nothing of the cell. (Raising on those made every later
// window start at the limit in the other regions: traffic spread over three
// regions was admitted at a tenth of its allowance.) This implies the seeds'
// filter, usage at least half the limit.
func (s *Service) publishDenial(c *cell, q Query, d window.Decision) {
	if q.Duration < s.globalMin || q.Limit <= 0 || c.usage() < q.Limit {
		return
	}
	if !c.set(flagDenialSent) {
		return
	}
	id := c.identity()
	s.gstate.mu.Lock()
	s.gstate.denials = append(s.gstate.denials, global.Denial{Cell: id, Region: s.cfg.Region,
		Limit: q.Limit, ExpireAt: id.Expiry(s.cfg.ExpiryGrace.Milliseconds())})
	s.gstate.mu.Unlock()
}

// ApplyImports folds what the region's bridge reports into the cells: the
// foreign sum into imported (max), the region's own published count into the
// regional count as a lower bound (without making the cell fresh), and a
// remote denial's limit as the cell's floor (and the cell then never
// publishes a denial of its own). Imports for cells older than the previous
// window are ignored. Imported counts are never published.
func (s *Service) ApplyImports(is []global.Import) {
	now := s.nowMs()
	s.counters.importsIn.Add(int64(len(is)))
	for _, imp := range is {
		c := imp.Cell
		if c.Duration < window.MinDuration || c.Sequence < now/c.Duration-1 {
			continue
		}
		b := s.table.loadOrCreate(bucketKey{workspace: c.Workspace, namespace: c.Namespace,
			identifier: c.Identifier, duration: c.Duration})
		cl := b.cellFor(c.Sequence)
		if cl == nil {
			continue // the bucket already moved past this window
		}
		raiseTo(&cl.imported, imp.Foreign)
		if imp.Own > 0 {
			cl.raise(imp.Own)
		}
		if imp.Floor > 0 {
			if cl.floor.Load() < imp.Floor {
				s.counters.denialsIn.Add(1)
			}
			raiseTo(&cl.floor, imp.Floor)
			cl.set(flagDenialSent)
		}
	}
}

func raiseTo(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
