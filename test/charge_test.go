package test

import (
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// tokenCall is one request of a token-budget load: its look, and the debit
// that followed an admitted look.
type tokenCall struct {
	lookSent time.Time
	admitted bool
	reset    int64 // the look's window end: the window it was decided in
	tokens   int64 // debited, 0 when the look was denied
	over     bool  // the debit took the usage past the budget
	done     time.Time
	debitEnd int64 // the debit's window end
}

// A token budget on three limiter processes of one region sharing Redis,
// with three regions around them: 64 callers each look (cost 0) and, when
// the look is admitted, debit 500 to 5,000 tokens, over two fixed windows
// of 10 s. In every window:
//   - every debited token is in Redis's count of the cell (none refused or
//     lost);
//   - what was charged stays within the budget plus what the requests in
//     flight when it was spent could add (64 × 5,000): the bound of a look
//     before the work and a debit after it;
//   - no look sent once a debit had overdrawn the budget (plus twice the
//     25 ms a look's counts may be old) is admitted.
//
// And a budget a region spent is spent for the other regions' looks: a
// debit travels as any admission does. The time is logged; the G-Counter's
// bound is TestBurstInOneRegionIsDeniedElsewhereWithin250ms's to hold, so
// the wait here allows 10 s, for a loaded machine, and still fails a debit
// that never arrives.
func TestTokenBudgetDebitsAcrossLimitersAndRegions(t *testing.T) {
	w := startWorld(t, false, 3)
	const (
		budget   = 100_000
		duration = 10_000
		callers  = 64
		maxCost  = 5_000
	)
	id := "tenant-" + time.Now().Format("150405.000")
	c := w.clients["us"]
	look := bus.CheckRequest{Identifier: id, Limit: budget, Duration: duration, Peek: true, Fixed: true}
	ctx := testContext(t)
	// Start at the beginning of a window, and run for two.
	now := time.Now().UnixMilli()
	time.Sleep(time.Duration((now/duration+1)*duration-now+50) * time.Millisecond)
	end := time.Now().Add(2*duration*time.Millisecond - 200*time.Millisecond)
	var (
		mu    sync.Mutex
		calls []tokenCall
	)
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(end) {
				tc := tokenCall{lookSent: time.Now()}
				r, err := c.Check(ctx, "acme", "llm", look)
				if err != nil {
					t.Errorf("look: %v", err)
					return
				}
				tc.admitted, tc.reset = r.Success, r.Reset
				if r.Success {
					debit := look
					debit.Peek, debit.Cost, debit.Charge = false, 500+rnd.Int64N(maxCost-500+1), bus.ChargeDebit
					d, err := c.Check(ctx, "acme", "llm", debit)
					if err != nil {
						t.Errorf("debit of %d: %v (a debit is never refused)", debit.Cost, err)
						return
					}
					tc.tokens, tc.over, tc.done, tc.debitEnd = debit.Cost, !d.Success, time.Now(), d.Reset
				} else {
					time.Sleep(5 * time.Millisecond) // a refused client backs off a little
				}
				mu.Lock()
				calls = append(calls, tc)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Per window: the tokens charged, and when the budget was first
	// overdrawn.
	type win struct {
		charged   int64
		overAt    time.Time
		looks     int
		lateLooks int // admitted after overAt + 50 ms
	}
	wins := map[int64]*win{}
	at := func(reset int64) *win {
		if wins[reset] == nil {
			wins[reset] = &win{}
		}
		return wins[reset]
	}
	for _, tc := range calls {
		if tc.tokens > 0 {
			wn := at(tc.debitEnd)
			wn.charged += tc.tokens
			if tc.over && (wn.overAt.IsZero() || tc.done.Before(wn.overAt)) {
				wn.overAt = tc.done
			}
		}
	}
	for _, tc := range calls {
		wn := at(tc.reset)
		wn.looks++
		if tc.admitted && !wn.overAt.IsZero() && tc.lookSent.After(wn.overAt.Add(50*time.Millisecond)) {
			wn.lateLooks++
		}
	}
	rd, err := region.NewRedis(region.RedisConfig{URL: w.redis, KeyPrefix: w.prefixes["us"]})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	resets := make([]int64, 0, len(wins))
	for r := range wins {
		resets = append(resets, r)
	}
	sort.Slice(resets, func(i, j int) bool { return resets[i] < resets[j] })
	spent := 0
	for _, r := range resets {
		wn := wins[r]
		cell := window.Cell{Workspace: "acme", Namespace: "llm", Identifier: id, Duration: duration, Sequence: r/duration - 1}
		var cur region.Totals
		deadline := time.Now().Add(5 * time.Second) // what leases held is reported within a settle round or two
		for {
			if cur, _, err = rd.Read(ctx, cell); err != nil {
				t.Fatal(err)
			}
			if cur.Count >= wn.charged || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("window ending %d: %d looks, %d tokens charged (budget %d), Redis counts %d, overdrawn at %v, %d looks admitted after it",
			r, wn.looks, wn.charged, budget, cur.Count, !wn.overAt.IsZero(), wn.lateLooks)
		if cur.Count != wn.charged {
			t.Errorf("window ending %d: Redis counts %d tokens, %d were debited", r, cur.Count, wn.charged)
		}
		if wn.charged > budget+callers*maxCost {
			t.Errorf("window ending %d: %d tokens charged, over the budget %d plus the requests in flight (%d × %d)",
				r, wn.charged, budget, callers, maxCost)
		}
		if wn.lateLooks > 0 {
			t.Errorf("window ending %d: %d looks admitted after the budget was overdrawn", r, wn.lateLooks)
		}
		if !wn.overAt.IsZero() {
			spent++
		}
	}
	if spent == 0 {
		t.Fatalf("the budget was never spent in %d windows: the load did not test it", len(resets))
	}

	// Across regions: a budget us spends is spent for eu's and ap's looks.
	far := bus.CheckRequest{Identifier: id + "-global", Limit: budget, Duration: 60_000, Fixed: true}
	debit := far
	debit.Cost, debit.Charge = budget+1, bus.ChargeDebit
	if r, err := c.Check(ctx, "acme", "llm", debit); err != nil || r.Success {
		t.Fatalf("us: a debit past the budget: %+v, %v", r, err)
	}
	far.Peek = true
	for _, other := range []string{"eu", "ap"} {
		start := time.Now()
		for {
			r, err := w.clients[other].Check(ctx, "acme", "llm", far)
			if err == nil && !r.Success {
				t.Logf("%s: its looks denied %v after us spent the budget", other, time.Since(start).Round(time.Millisecond))
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: looks still admitted %v after us spent the budget (%+v, %v)", other, time.Since(start), r, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
