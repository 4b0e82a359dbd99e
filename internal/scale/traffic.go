package scale

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
)

// target is one cell of the working set: checked in region, once per cycle.
type target struct {
	namespace, id string
	region        int
	// loaded is the loaded cell's index, -1 for a cell only traffic creates.
	loaded int
	// Guarded by tracker.mu.
	checks   int64
	admitted int64
	tainted  bool       // a check failed: its admission is unknown, so is what to expect
	pending  [][]sample // by receiving region: admissions not yet seen there
}

// sample is one admission waiting to show in another region's imports.
type sample struct {
	want int64 // the foreign sum that carries it
	sent time.Time
}

// latency is one admission's convergence: from sending its check to the
// import carrying it arriving in one other region.
type latency struct {
	sent time.Time
	took time.Duration
}

// tracker holds the working set and matches imports against admissions.
type tracker struct {
	regions []string
	targets []*target
	byKey   map[string]*target

	mu        sync.Mutex
	latencies []latency

	sent, admitted, denied, failed atomic.Int64
}

func cellKey(namespace, id string) string { return namespace + "\x00" + id }

// newTracker builds the working set of size n: even entries are loaded
// cells (while there are enough), checked in the region after their owner's
// so that the check adds a component beside the loaded one; the others are
// new cells, spread over the regions.
func newTracker(regions []string, n, loadedCells int) *tracker {
	t := &tracker{regions: regions, byKey: make(map[string]*target, n)}
	for e := range n {
		var tg *target
		if i := e / 2; e%2 == 0 && i < loadedCells {
			tg = &target{namespace: LoadedNamespace, id: loadedID(i), loaded: i,
				region: (loadedOwner(regions, i) + 1) % len(regions)}
		} else {
			tg = &target{namespace: NewNamespace, id: newID(e), loaded: -1, region: e % len(regions)}
		}
		tg.pending = make([][]sample, len(regions))
		t.targets = append(t.targets, tg)
		t.byKey[cellKey(tg.namespace, tg.id)] = tg
	}
	return t
}

// base is the foreign sum region r imports for tg before any admission.
func (t *tracker) base(tg *target, r int) int64 {
	if tg.loaded < 0 || r == loadedOwner(t.regions, tg.loaded) {
		return 0
	}
	return loadedCount(tg.loaded)
}

// check sends one check of tg and records what the other regions must
// import if it is admitted.
func (t *tracker) check(ctx context.Context, c *bus.Client, tg *target, limit int64) {
	t.mu.Lock()
	tg.checks++
	if !tg.tainted {
		k := tg.admitted + 1
		now := time.Now()
		for r := range t.regions {
			if r != tg.region {
				tg.pending[r] = append(tg.pending[r], sample{want: t.base(tg, r) + k, sent: now})
			}
		}
	}
	t.mu.Unlock()
	t.sent.Add(1)
	resp, err := c.Check(ctx, Workspace, tg.namespace, bus.CheckRequest{
		Identifier: tg.id, Limit: limit, Duration: WindowMs, Cost: 1})
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.failed.Add(1)
	case !resp.Success:
		t.denied.Add(1)
	default:
		t.admitted.Add(1)
		tg.admitted++
		return
	}
	tg.tainted = true
	clear(tg.pending)
}

// imported matches one import that region r received against the
// admissions it carries.
func (t *tracker) imported(r int, namespace, id string, foreign int64, at time.Time) {
	tg := t.byKey[cellKey(namespace, id)]
	if tg == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := tg.pending[r]
	kept := ps[:0]
	for _, s := range ps {
		if s.want <= foreign {
			t.latencies = append(t.latencies, latency{sent: s.sent, took: at.Sub(s.sent)})
		} else {
			kept = append(kept, s)
		}
	}
	tg.pending[r] = kept
}

// subscribeImports listens to region r's imports on nc.
func (t *tracker) subscribeImports(nc *nats.Conn, subjects wire.Subjects, r int) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(subjects.Internal("import", t.regions[r]), func(m *nats.Msg) {
		at := time.Now()
		is, err := event.DecodeImports(m.Data)
		if err != nil {
			return
		}
		for _, imp := range is {
			if imp.Cell.Workspace == Workspace {
				t.imported(r, imp.Cell.Namespace, imp.Cell.Identifier, imp.Foreign, at)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	// Imports arrive in bursts of up to 1000 a message: let them queue
	// rather than drop.
	return sub, sub.SetPendingLimits(-1, -1)
}

// Convergence is the time from sending a check that was admitted in one
// region to the import carrying it arriving on another region's import
// subject, over every such pair sent in the measured window.
type Convergence struct {
	Samples int // pairs that converged
	// Missing are pairs whose import had not arrived when the run ended
	// (at least Grace after the last check); they count as infinitely
	// late in the percentiles.
	Missing       int
	P50, P99, Max time.Duration
}

// convergence summarises the pairs sent in [from, to).
func (t *tracker) convergence(from, to time.Time) Convergence {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ds []time.Duration
	for _, l := range t.latencies {
		if !l.sent.Before(from) && l.sent.Before(to) {
			ds = append(ds, l.took)
		}
	}
	missing := 0
	for _, tg := range t.targets {
		for _, ps := range tg.pending {
			for _, s := range ps {
				if !s.sent.Before(from) && s.sent.Before(to) {
					missing++
				}
			}
		}
	}
	slices.Sort(ds)
	c := Convergence{Samples: len(ds), Missing: missing}
	n := len(ds) + missing
	at := func(q float64) time.Duration {
		i := int(q * float64(n-1))
		if i >= len(ds) {
			return Infinite
		}
		return ds[i]
	}
	if n > 0 {
		c.P50, c.P99 = at(0.50), at(0.99)
		c.Max = at(1)
	}
	return c
}

// Infinite stands for a convergence that did not happen.
const Infinite = time.Duration(1<<63 - 1)

// served counts, per region, the cells of the working set checked there.
func (t *tracker) served() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]int, len(t.regions))
	for _, tg := range t.targets {
		if tg.checks > 0 {
			out[tg.region]++
		}
	}
	return out
}

// drive sends rate checks a second until ctx ends, cycling through the
// working set in order (so each cell is checked once per cycle), each
// region's checks by workers on that region's client.
func (t *tracker) drive(ctx context.Context, clients []*bus.Client, rate int, limit int64) {
	const workersPerRegion = 32
	queues := make([]chan *target, len(t.regions))
	var wg sync.WaitGroup
	for r := range t.regions {
		queues[r] = make(chan *target, 4*workersPerRegion)
		for range workersPerRegion {
			wg.Go(func() {
				for tg := range queues[r] {
					cctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
					t.check(cctx, clients[r], tg, limit)
					cancel()
				}
			})
		}
	}
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer func() {
		tick.Stop()
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due := int(float64(rate) * now.Sub(start).Seconds())
			for ; next < due; next++ {
				tg := t.targets[next%len(t.targets)]
				select {
				case queues[tg.region] <- tg:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// checkTimeout bounds one check of the traffic.
const checkTimeout = time.Second
