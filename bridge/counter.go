package bridge

import (
	"maps"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// Counter is a bridge's G-Counter state: every region's component of every
// live cell. It is safe for concurrent use.
//
// Components merge by max, so applying a component twice, late or out of
// order changes nothing. A region's import for a cell is the sum of the
// other regions' components: its own component is reported separately, as a
// lower bound, and never enters that sum, so a region's usage never comes
// back to it as foreign usage. An import is taken (TakeImports) only when
// the foreign sum rose: a change of the region's own component alone is not
// echoed back to it (its limiters read it from their regional origin).
//
// Its maps give back the memory a burst made them grow: the sets emptied on
// every take are made anew when they held many cells, and the cell map is
// copied once expiry has left it a quarter of its peak.
type Counter struct {
	region string

	mu    sync.Mutex
	cells map[window.Cell]*cellState
	// peak is the most cells held since cells was made.
	peak int
	// changed holds cells whose foreign sum rose since the last
	// TakeImports.
	changed map[window.Cell]struct{}
	// ownDirty holds own-region components not yet taken for forwarding
	// and storing.
	ownDirty map[window.Cell]struct{}
	// tokens interns workspaces, namespaces and regions, which repeat
	// across millions of cells; at most maxInterned are kept.
	tokens map[string]string
	// durs is every duration a cell was made for (until more than
	// maxDurations: manyDurs), so that a question about durations in use
	// can often be answered without walking the cells.
	durs     []int64
	manyDurs bool
}

// maxDurations bounds the durations a Counter lists (SeenDurations).
const maxDurations = 64

// maxInterned bounds the interned tokens: past it, new tokens are kept as
// they come.
const maxInterned = 4096

// intern returns the kept copy of tok. The caller holds c.mu.
func (c *Counter) intern(tok string) string {
	if kept, ok := c.tokens[tok]; ok {
		return kept
	}
	if len(c.tokens) < maxInterned {
		c.tokens[tok] = tok
	}
	return tok
}

// cellState is one cell's components, by region. A deployment
// has a handful of regions, so they are short lists searched in order,
// which take a fraction of the memory of a map per cell.
type cellState struct {
	comps    regionCounts // region → count
	expireAt int64
}

// regionCounts maps a few regions to counts.
type regionCounts []regionCount

type regionCount struct {
	region string
	n      int64
}

// get returns region's count and whether it has one.
func (rc regionCounts) get(region string) (int64, bool) {
	for _, e := range rc {
		if e.region == region {
			return e.n, true
		}
	}
	return 0, false
}

// set sets region's count.
func (rc *regionCounts) set(region string, n int64) {
	for i := range *rc {
		if (*rc)[i].region == region {
			(*rc)[i].n = n
			return
		}
	}
	*rc = append(*rc, regionCount{region, n})
}

// NewCounter returns an empty Counter for a bridge of region.
func NewCounter(region string) *Counter {
	return &Counter{
		region:   region,
		cells:    make(map[window.Cell]*cellState),
		changed:  make(map[window.Cell]struct{}),
		ownDirty: make(map[window.Cell]struct{}),
		tokens:   make(map[string]string),
	}
}

func (c *Counter) state(cell window.Cell, expireAt int64) *cellState {
	s := c.cells[cell]
	if s == nil {
		s = &cellState{}
		if !c.manyDurs && !slices.Contains(c.durs, cell.Duration) {
			if c.manyDurs = len(c.durs) >= maxDurations; !c.manyDurs {
				c.durs = append(c.durs, cell.Duration)
			}
		}
		cell.Workspace, cell.Namespace = c.intern(cell.Workspace), c.intern(cell.Namespace)
		c.cells[cell] = s
		c.peak = max(c.peak, len(c.cells))
	}
	s.expireAt = max(s.expireAt, expireAt)
	return s
}

// Merge folds a component of any region into the counter and reports
// whether it raised anything.
func (c *Counter) Merge(comp global.Component) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.merge(comp, false)
}

// MergeStored folds components read from the store. They are merged as
// Merge does, except that the region's own are not
// taken for forwarding and storing again (TakeOwn): the store holds them
// already, and the other regions read them from it.
// The lock is taken for mergeChunk entries at a time, so that a start-up
// load of millions of rows does not hold up the NATS side meanwhile.
func (c *Counter) MergeStored(cs []global.Component) {
	for part := range slices.Chunk(cs, mergeChunk) {
		c.mu.Lock()
		for _, comp := range part {
			c.merge(comp, true)
		}
		c.mu.Unlock()
	}
}

// mergeChunk is how many stored entries MergeStored merges under one lock.
const mergeChunk = 4096

// MergeAll folds many components and reports how many raised something.
func (c *Counter) MergeAll(cs []global.Component) (raised int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, comp := range cs {
		if c.merge(comp, false) {
			raised++
		}
	}
	return raised
}

// merge folds comp; stored says it came from the store. The caller holds
// c.mu.
func (c *Counter) merge(comp global.Component, stored bool) bool {
	s := c.state(comp.Cell, comp.ExpireAt)
	if old, _ := s.comps.get(comp.Region); comp.Count <= old {
		return false
	}
	s.comps.set(c.intern(comp.Region), comp.Count)
	if comp.Region == c.region {
		if !stored {
			c.ownDirty[comp.Cell] = struct{}{}
		}
	} else {
		c.changed[comp.Cell] = struct{}{}
	}
	return true
}

// importOf computes the import of a cell. The caller holds c.mu.
func (c *Counter) importOf(cell window.Cell, s *cellState) global.Import {
	imp := global.Import{Cell: cell, ExpireAt: s.expireAt}
	for _, e := range s.comps {
		if e.region == c.region {
			imp.Own = e.n
		} else {
			imp.Foreign = window.AddCounts(imp.Foreign, e.n)
		}
	}
	return imp
}

// Import returns the current import of cell for this region.
func (c *Counter) Import(cell window.Cell) global.Import {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.cells[cell]
	if s == nil {
		return global.Import{Cell: cell}
	}
	return c.importOf(cell, s)
}

// TakeImports returns the imports of the cells that changed since the last
// call.
func (c *Counter) TakeImports() []global.Import {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]global.Import, 0, len(c.changed))
	for cell := range c.changed {
		if s := c.cells[cell]; s != nil {
			out = append(out, c.importOf(cell, s))
		}
	}
	c.changed = emptied(c.changed)
	return out
}

// Snapshot returns the import of every live cell: what a starting limiter
// needs.
func (c *Counter) Snapshot() []global.Import {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]global.Import, 0, len(c.cells))
	for cell, s := range c.cells {
		out = append(out, c.importOf(cell, s))
	}
	return out
}

// TakeOwn returns this region's components that changed since the last
// call: what the bridge forwards to the other regions and stores.
func (c *Counter) TakeOwn() []global.Component {
	c.mu.Lock()
	defer c.mu.Unlock()
	comps := make([]global.Component, 0, len(c.ownDirty))
	for cell := range c.ownDirty {
		if s := c.cells[cell]; s != nil {
			n, _ := s.comps.get(c.region)
			comps = append(comps, global.Component{Cell: cell, Region: c.region, Count: n, ExpireAt: s.expireAt})
		}
	}
	c.ownDirty = emptied(c.ownDirty)
	return comps
}

// Expire drops cells whose expiry is at or before now and returns how many.
func (c *Counter) Expire(now int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for cell, s := range c.cells {
		if s.expireAt <= now {
			delete(c.cells, cell)
			delete(c.changed, cell)
			delete(c.ownDirty, cell)
			n++
		}
	}
	if c.peak > shrinkMin && len(c.cells) < c.peak/4 {
		c.cells = maps.Collect(maps.All(c.cells)) // sized for what it holds, unlike maps.Clone
		c.peak = len(c.cells)
	}
	return n
}

// shrinkMin is the size below which maps are kept as they are: their
// memory is small, and making them anew would cost more than it frees.
const shrinkMin = 1024

// emptied returns m emptied: cleared when it holds few entries, else a new
// map, so that the buckets a burst grew are freed (Go maps never shrink).
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > shrinkMin {
		return make(map[K]V)
	}
	clear(m)
	return m
}

// SeenDurations returns every duration a cell of the counter was made for
// (some may hold no cell any more), and false when there were more than
// it lists.
func (c *Counter) SeenDurations() ([]int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.durs), !c.manyDurs
}

// Durations returns, for each identifier (workspace, namespace,
// identifier) in want, the durations of the cells the counter holds of it,
// each once. It walks every cell: callers ask for many identifiers at once.
func (c *Counter) Durations(want map[[3]string]bool) map[[3]string][]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[[3]string][]int64)
	for cell := range c.cells {
		if k := [3]string{cell.Workspace, cell.Namespace, cell.Identifier}; want[k] && !slices.Contains(out[k], cell.Duration) {
			out[k] = append(out[k], cell.Duration)
		}
	}
	return out
}

// Len returns the number of live cells.
func (c *Counter) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cells)
}
