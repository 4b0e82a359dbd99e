// Package gcfloor keeps the garbage collector's heap goal a fixed headroom
// above the live heap.
//
// A limiter's live heap is its cell table, often a few megabytes, while
// its garbage is the traffic: every NATS message is copied into a fresh
// buffer by the client library (about 4 KB a checks message of 64 checks,
// a few hundred bytes a single check). With GOGC's default of 100, a 2 MB
// live heap is collected every 2 MB of garbage, dozens of times a second
// under load, and the collector's fixed cost a cycle becomes a tenth of
// the process's CPU. A floor of headroom bytes above the live heap runs it
// a few times a second instead, at the cost of at most headroom more
// memory; once the live heap is large enough that GOGC's own goal is
// higher, nothing changes. GOMEMLIMIT, where set, still bounds the heap.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Floor raises GOGC after every collection so that the next goal is at
// least the live heap plus its headroom. Only one Floor should run in a
// process: GOGC is the process's.
type Floor struct {
	headroom uint64
	base     int // GOGC when the floor started, restored by Stop

	mu      sync.Mutex
	stopped bool
	percent int
	sample  []metrics.Sample
}

// Start keeps the heap goal at least headroom bytes above the live heap
// until Stop. A headroom of 0, or GOGC set to off, starts nothing that
// changes the collector.
func Start(headroom uint64) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	f := &Floor{headroom: headroom, base: base, percent: base,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}}
	if headroom == 0 || base < 0 {
		f.stopped = true
		return f
	}
	f.tune()
	f.arm()
	return f
}

// sentinel is garbage whose cleanup marks the end of a collection: it is
// big enough not to share a tiny allocation, whose cleanups may never run.
type sentinel struct {
	_ [32]byte
	_ *byte
}

// arm registers a cleanup that runs after the next collection.
func (f *Floor) arm() {
	runtime.AddCleanup(new(sentinel), func(f *Floor) {
		if f.tune() {
			f.arm()
		}
	}, f)
}

// tune sets GOGC for the live heap just measured; it reports false once
// the floor has stopped.
func (f *Floor) tune() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	// The live heap of the last collection; before the first, the heap
	// as it is, garbage included (a lower percent: the safe side).
	metrics.Read(f.sample)
	var live uint64
	for _, s := range f.sample {
		if live == 0 && s.Value.Kind() == metrics.KindUint64 {
			live = s.Value.Uint64()
		}
	}
	p := Percent(f.base, live, f.headroom)
	// SetGCPercent stops the world: only when the goal moves by more
	// than an eighth.
	if p != f.percent && (p > f.percent+f.percent/8 || p < f.percent-f.percent/8 || p == f.base) {
		debug.SetGCPercent(p)
		f.percent = p
	}
	return true
}

// Percent is the GOGC that puts the heap goal of a live heap of live bytes
// at least headroom bytes above it, and never below base. The runtime's
// goal is the larger of live·(1+GOGC/100) and a minimum of 4 MiB·GOGC/100,
// so the percent is also held where that minimum stays at live+headroom.
func Percent(base int, live, headroom uint64) int {
	const minHeap = 4 << 20
	live = max(live, 1)
	if headroom > 1<<50 {
		headroom = 1 << 50
	}
	p := min(headroom*100/live, (live+headroom)*100/minHeap)
	return max(base, int(min(p, 1<<30)))
}

// Stop ends the floor and puts GOGC back as it was.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.base)
}
