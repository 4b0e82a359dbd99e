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
// higher, nothing changes. The headroom used is also at most what the
// process allocates in a second (its rate since the floor last looked,
// after every collection and every second), so a process that is idle or
// lightly loaded, or no longer busy, keeps GOGC's own pacing and memory.
// GOMEMLIMIT, where set, still bounds the heap.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Floor raises GOGC after every collection so that the next goal is at
// least the live heap plus its headroom. Only one Floor should run in a
// process: GOGC is the process's.
type Floor struct {
	headroom uint64
	base     int              // GOGC when the floor started, restored by Stop
	now      func() time.Time // the clock the allocation rate is read by

	stop chan struct{} // closed by Stop: ends the ticking
	done chan struct{} // closed when the ticking has ended

	mu      sync.Mutex
	stopped bool
	percent int
	allocs  uint64    // bytes allocated in all, at the last tune
	at      time.Time // when that was
	sample  []metrics.Sample
}

// rateWindow is how much of the allocation rate the headroom may hold: a
// second's worth, so a floor runs about one collection a second at most.
const rateWindow = time.Second

// Start keeps the heap goal at least headroom bytes above the live heap
// (and at most a second's allocation above it) until Stop. A headroom of 0,
// or GOGC set to off, starts nothing that changes the collector.
func Start(headroom uint64) *Floor { return start(headroom, time.Now, time.Second) }

// start is Start with the clock the rate is read by and how often the
// floor looks besides after collections.
func start(headroom uint64, now func() time.Time, every time.Duration) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	f := &Floor{headroom: headroom, base: base, now: now, percent: base,
		stop: make(chan struct{}), done: make(chan struct{}),
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}}
	if headroom == 0 || base < 0 {
		f.stopped = true
		close(f.done)
		return f
	}
	f.allocs, f.at = f.read(), now()
	f.arm()
	// Every second too: after a burst the goal stays high, and with little
	// allocated no collection would come to lower it.
	go func() {
		defer close(f.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f.tune()
			case <-f.stop:
				return
			}
		}
	}()
	return f
}

// read reads the live heap and the bytes allocated in all.
func (f *Floor) read() (allocs uint64) {
	metrics.Read(f.sample)
	if v := f.sample[1].Value; v.Kind() == metrics.KindUint64 {
		return v.Uint64()
	}
	return 0
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

// tune sets GOGC for the live heap the last collection found and the
// allocation rate since the last tune; it reports false once the floor
// has stopped. Until it has run after a collection, that collection's goal
// is the GOGC tuned for the one before applied to the live heap it found,
// which objects allocated while it marked may have made larger.
func (f *Floor) tune() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	allocs, now := f.read(), f.now()
	var live uint64
	if v := f.sample[0].Value; v.Kind() == metrics.KindUint64 {
		live = v.Uint64()
	}
	headroom := f.headroom
	if d := now.Sub(f.at); d > 0 && allocs >= f.allocs {
		headroom = min(headroom, uint64(float64(allocs-f.allocs)*float64(rateWindow)/float64(d)))
	}
	f.allocs, f.at = allocs, now
	p := Percent(f.base, live, headroom)
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
	live, headroom = max(live, 1), min(headroom, 1<<50)
	p := min(headroom*100/live, (live+headroom)*100/minHeap)
	return max(base, int(min(p, 1<<30)))
}

// Stop ends the floor and puts GOGC back as it was.
func (f *Floor) Stop() {
	f.mu.Lock()
	if !f.stopped {
		f.stopped = true
		close(f.stop)
		debug.SetGCPercent(f.base)
	}
	f.mu.Unlock()
	<-f.done
}
