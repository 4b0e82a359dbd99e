package gcfloor

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentPutsTheGoalHeadroomAboveTheLiveHeap(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		base           int
		live, headroom uint64
		want           int
	}{
		{100, 1 * mib, 64 * mib, 1625},  // the runtime's minimum heap holds the goal at 65 MiB
		{100, 32 * mib, 64 * mib, 200},  // 96 MiB
		{100, 256 * mib, 64 * mib, 100}, // GOGC's own goal is higher
		{300, 32 * mib, 64 * mib, 300},  // never below the base
		{100, 0, 64 * mib, 1600},        // nothing live yet
		{100, 1, 1 << 62, 1 << 30},      // absurd headroom: bounded, no overflow
		{100, 64 * mib, 0, 100},         // no headroom: the base
	} {
		if got := Percent(c.base, c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.base, c.live, c.headroom, got, c.want)
		}
	}
}

// collections counts the garbage collections while 256 MiB of garbage is
// allocated in 4 KiB pieces, as NATS messages are, beside a small live heap.
func collections() uint32 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var keep []byte
	for range 256 << 8 {
		keep = make([]byte, 4<<10)
	}
	runtime.KeepAlive(keep)
	runtime.ReadMemStats(&after)
	return after.NumGC - before.NumGC
}

func gogc() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestAFloorCollectsAsOftenAsItsHeadroomAndStopRestoresGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	without := collections()
	f := Start(64 << 20)
	with := collections()
	if gogc() <= 100 {
		t.Errorf("GOGC %d with a floor, want it raised", gogc())
	}
	// Right after a collection (a forced one: nothing allocated while it
	// marks). A collection that marks what is allocated meanwhile (the 4
	// KiB pieces above) may find a larger live heap than the floor last
	// tuned for, and its goal overshoots until the floor's cleanup runs
	// right after it.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.NextGC > ms.HeapAlloc+72<<20 {
		t.Errorf("next collection at %d MiB with %d MiB in the heap, want at most the headroom (64 MiB) above it",
			ms.NextGC>>20, ms.HeapAlloc>>20)
	}
	// A live heap above the headroom: GOGC's own goal, after the next
	// collections (the floor follows every one).
	big := make([][]byte, 128)
	for i := range big {
		big[i] = make([]byte, 1<<20)
	}
	// The floor tunes from a cleanup that runs after the collection.
	for deadline := time.Now().Add(5 * time.Second); gogc() != 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d with 128 MiB live, want 100", gogc())
		}
		runtime.GC()
	}
	runtime.KeepAlive(big)
	f.Stop()
	if gogc() != 100 {
		t.Errorf("GOGC %d after Stop, want 100 back", gogc())
	}
	after := collections()
	t.Logf("collections for 256 MiB of garbage: %d at GOGC 100, %d with a 64 MiB floor, %d after Stop", without, with, after)
	if with > 8 || 4*with > min(without, after) {
		t.Fatalf("%d collections with a 64 MiB floor, want at most 8 (about 4) and a quarter of GOGC 100's (%d, %d after Stop)",
			with, without, after)
	}
}

func TestNoHeadroomOrGOGCOffChangesNothing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	f := Start(0)
	collections()
	if gogc() != 100 {
		t.Errorf("GOGC %d with no headroom, want 100", gogc())
	}
	f.Stop()
	debug.SetGCPercent(-1)
	f = Start(64 << 20)
	collections()
	if gogc() != -1 {
		t.Errorf("GOGC %d with GOGC off, want it left off", gogc())
	}
	f.Stop()
	if gogc() != -1 {
		t.Errorf("GOGC %d after Stop, want it left off", gogc())
	}
}

// At a low allocation rate the headroom is what a second allocates: a clock
// that moves 100 s between collections makes 256 MiB of garbage a trickle,
// and the floor keeps GOGC's own pacing (and memory).
func TestALightlyLoadedProcessKeepsGOGCsPacing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var seconds atomic.Int64
	f := start(64<<20, func() time.Time { return time.Unix(seconds.Add(100), 0) }, time.Hour)
	defer f.Stop()
	light := collections()
	if p := gogc(); p != 100 {
		t.Errorf("GOGC %d at a trickle of allocation, want 100", p)
	}
	if light <= 16 {
		t.Fatalf("%d collections for 256 MiB at a trickle, want GOGC 100's pacing (dozens; a 64 MiB floor runs about 4)", light)
	}
}

// After a burst the floor does not wait for a collection to lower its goal:
// a quiet spell (a clock that moves 100 s between looks, with nothing
// allocated) brings GOGC back to its own value, without a collection.
func TestAQuietSpellAfterABurstBringsGOGCBack(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var ms, step atomic.Int64 // step 0: the clock stands still, no rate to bound the headroom by
	f := start(64<<20, func() time.Time { return time.UnixMilli(ms.Add(step.Load())) }, time.Millisecond)
	defer f.Stop()
	collections()
	for deadline := time.Now().Add(5 * time.Second); gogc() <= 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d after a burst, want it raised", gogc())
		}
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	step.Store(100_000) // quiet
	for deadline := time.Now().Add(5 * time.Second); gogc() != 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d in a quiet spell, want 100 back", gogc())
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.NextGC >= before.NextGC {
		t.Errorf("next collection at %d MiB in the quiet spell, %d MiB before it: want it lower", after.NextGC>>20, before.NextGC>>20)
	}
}
