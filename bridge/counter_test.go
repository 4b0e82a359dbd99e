package bridge

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

func cell(id string) window.Cell {
	return window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 10_000, Sequence: 7}
}

// Property: whatever order, repetition or staleness components arrive in,
// the counter ends with each region's maximum, the import of a region sums
// exactly the other regions' maxima, and never its own.
func TestCounterMergesAnyOrderIntoPerRegionMaxima(t *testing.T) {
	regions := []string{"us", "eu", "ap"}
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var comps []global.Component
		maxima := map[string]map[string]int64{} // id → region → max
		for range 60 {
			id := fmt.Sprint("id-", r.IntN(4))
			reg := regions[r.IntN(3)]
			n := r.Int64N(1000)
			comps = append(comps, global.Component{Cell: cell(id), Region: reg, Count: n, ExpireAt: 1 << 40})
			if maxima[id] == nil {
				maxima[id] = map[string]int64{}
			}
			maxima[id][reg] = max(maxima[id][reg], n)
		}
		for _, own := range regions {
			c := NewCounter(own)
			// Apply twice, in two different random orders.
			for range 2 {
				r.Shuffle(len(comps), func(i, j int) { comps[i], comps[j] = comps[j], comps[i] })
				c.MergeAll(comps)
			}
			for id, m := range maxima {
				imp := c.Import(cell(id))
				var foreign int64
				for reg, n := range m {
					if reg != own {
						foreign += n
					}
				}
				if imp.Foreign != foreign || imp.Own != m[own] {
					t.Fatalf("round %d, %s importing %s: foreign %d own %d, want %d and %d (maxima %v)",
						round, own, id, imp.Foreign, imp.Own, foreign, m[own], m)
				}
			}
		}
	}
}

// A region's imports never feed back into what it forwards as its own: only
// components of its own region are taken for forwarding.
func TestCounterForwardsOnlyItsOwnRegion(t *testing.T) {
	c := NewCounter("us")
	c.Merge(global.Component{Cell: cell("a"), Region: "eu", Count: 50, ExpireAt: 1 << 40})
	c.Merge(global.Component{Cell: cell("a"), Region: "us", Count: 7, ExpireAt: 1 << 40})
	cs := c.TakeOwn()
	if len(cs) != 1 || cs[0].Region != "us" || cs[0].Count != 7 {
		t.Fatalf("taken components %+v, want only us's 7", cs)
	}
	if cs := c.TakeOwn(); len(cs) != 0 {
		t.Fatalf("taken again: %+v", cs)
	}
	imps := map[string]global.Import{}
	for _, imp := range c.TakeImports() {
		imps[imp.Cell.Identifier] = imp
	}
	if imps["a"].Foreign != 50 || imps["a"].Own != 7 {
		t.Fatalf("imports %+v", imps)
	}
	// A stale component changes nothing and is not broadcast again.
	c.Merge(global.Component{Cell: cell("a"), Region: "eu", Count: 40, ExpireAt: 1 << 40})
	if is := c.TakeImports(); len(is) != 0 {
		t.Fatalf("a stale component produced imports %+v", is)
	}
}

func TestCounterExpiresCells(t *testing.T) {
	c := NewCounter("us")
	c.Merge(global.Component{Cell: cell("old"), Region: "eu", Count: 1, ExpireAt: 100})
	c.Merge(global.Component{Cell: cell("new"), Region: "eu", Count: 1, ExpireAt: 300})
	if n := c.Expire(200); n != 1 || c.Len() != 1 {
		t.Fatalf("expired %d, %d left; want 1 and 1", n, c.Len())
	}
}

// A change of the region's own component alone is not taken as an import
// (it would echo the region's usage back to it); a foreign rise is, and
// carries the own count as the lower bound.
func TestCounterTakesImportsOnlyWhenTheForeignSumRose(t *testing.T) {
	c := NewCounter("us")
	c.Merge(global.Component{Cell: cell("a"), Region: "us", Count: 5, ExpireAt: 1 << 40})
	c.Merge(global.Component{Cell: cell("b"), Region: "us", Count: 9, ExpireAt: 1 << 40})
	if is := c.TakeImports(); len(is) != 0 {
		t.Fatalf("own changes taken as imports: %+v", is)
	}
	if cs := c.TakeOwn(); len(cs) != 2 {
		t.Fatalf("own changes not taken for forwarding: %+v", cs)
	}
	c.Merge(global.Component{Cell: cell("a"), Region: "eu", Count: 3, ExpireAt: 1 << 40})
	c.Merge(global.Component{Cell: cell("c"), Region: "ap", Count: 4, ExpireAt: 1 << 40})
	is := c.TakeImports()
	want := map[string]global.Import{
		"a": {Cell: cell("a"), Foreign: 3, Own: 5, ExpireAt: 1 << 40},
		"c": {Cell: cell("c"), Foreign: 4, ExpireAt: 1 << 40},
	}
	if len(is) != len(want) {
		t.Fatalf("imports %+v, want %+v", is, want)
	}
	for _, im := range is {
		if im != want[im.Cell.Identifier] {
			t.Fatalf("import %+v, want %+v", im, want[im.Cell.Identifier])
		}
	}
	// The same foreign count again raises nothing.
	c.Merge(global.Component{Cell: cell("a"), Region: "eu", Count: 3, ExpireAt: 1 << 40})
	if is := c.TakeImports(); len(is) != 0 {
		t.Fatalf("an unchanged foreign count taken again: %+v", is)
	}
}

// After a burst of cells has been taken and has expired, the counter's maps
// give their memory back.
func TestCounterGivesMemoryBackAfterABurstExpires(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	c := NewCounter("us")
	c.Merge(global.Component{Cell: cell("steady"), Region: "eu", Count: 1, ExpireAt: 1 << 40})
	before := heap()
	const burst = 200_000
	for i := range burst {
		id := cell(fmt.Sprint("burst-", i))
		c.Merge(global.Component{Cell: id, Region: "eu", Count: 1, ExpireAt: 1000})
		c.Merge(global.Component{Cell: id, Region: "us", Count: 1, ExpireAt: 1000})
	}
	c.TakeImports()
	c.TakeOwn()
	peak := heap()
	if n := c.Expire(1000); n != burst {
		t.Fatalf("expired %d cells, want %d", n, burst)
	}
	after := heap()
	t.Logf("heap: %d KiB before, %d KiB at the peak, %d KiB after expiry", before>>10, peak>>10, after>>10)
	if grown := int64(after) - int64(before); grown > int64(peak-before)/10 {
		t.Fatalf("after expiry the heap is %d KiB above where it started, %d%% of the burst's %d KiB",
			grown>>10, 100*grown/int64(peak-before), (peak-before)>>10)
	}
	if c.Len() != 1 {
		t.Fatalf("%d cells left, want the steady one", c.Len())
	}
}

// What a live cell costs a bridge: three regions' components of 200,000
// cells, 20-byte identifiers, tokens shared. docs/operations.md's capacity
// model quotes it (289 B when written); a map per cell took 409.
func TestCounterMemoryPerCell(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	c := NewCounter("us")
	before := heap()
	const cells = 200_000
	for i := range cells {
		id := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprintf("user-%015d", i), Duration: 60_000, Sequence: 7}
		for _, r := range []string{"us", "eu", "ap"} {
			c.Merge(global.Component{Cell: id, Region: r, Count: 1, ExpireAt: 1 << 40})
		}
	}
	c.TakeImports()
	c.TakeOwn()
	per := float64(heap()-before) / cells
	runtime.KeepAlive(c)
	t.Logf("%.0f bytes per live cell with three regions' components", per)
	if per > 350 {
		t.Fatalf("%.0f bytes per live cell, want at most 350", per)
	}
}

// BenchmarkMergeQueueTakeAfterBurst is a take of the few entries a second
// of changes queues, after the queue once held a first load's 900,000
// (the map a burst grew is not walked again).
func BenchmarkMergeQueueTakeAfterBurst(b *testing.B) {
	q := newMergeQueue(func(v int) int { return v }, func(old, v int) (int, bool) { return max(old, v), v > old })
	for i := range 900_000 {
		q.put(i)
	}
	q.take()
	b.ResetTimer()
	for b.Loop() {
		for i := range 100 {
			q.put(i)
		}
		if len(q.take()) != 100 {
			b.Fatal("lost entries")
		}
	}
}
