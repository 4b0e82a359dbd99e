package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// tokenCall is one request of a token-budget load: its look, and the debit
// that followed an admitted look.
type tokenCall struct {
	lookSent  time.Time
	admitted  bool
	reset     int64 // the look's window end: the window it was decided in
	tokens    int64 // debited, 0 when the look was denied
	over      bool  // the debit took the usage past the budget
	debitSent time.Time
	done      time.Time
	debitEnd  int64 // the debit's window end
}

// budgetDoor is how a token-budget load reaches the limiters: a look
// before the work and a debit of its tokens after it. Each says whether
// the usage is within the budget and the end (unix ms) of the window it
// was decided in.
type budgetDoor struct {
	look  func(ctx context.Context) (within bool, end int64, err error)
	debit func(ctx context.Context, tokens int64) (within bool, end int64, err error)
}

const (
	budget      = 100_000
	budgetUsers = 64
	maxTokens   = 5_000
)

// The load's fixed windows: budgetWindow ms each, budgetWindows of them.
// make test runs two of 10 s; SLUICE_BUDGET_WINDOW (a Go duration, whole
// seconds) and SLUICE_BUDGET_WINDOWS run it at another scale, such as
// three windows of a minute: the budget per minute, for minutes.
var budgetWindow, budgetWindows = func() (int64, int) {
	w, n := int64(10_000), 2
	if d, err := time.ParseDuration(os.Getenv("SLUICE_BUDGET_WINDOW")); err == nil && d >= time.Second && d%time.Second == 0 {
		w = d.Milliseconds()
	}
	if v, err := strconv.Atoi(os.Getenv("SLUICE_BUDGET_WINDOWS")); err == nil && v > 0 {
		n = v
	}
	return w, n
}()

// budgetContext is a test's context, long enough for the load.
func budgetContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(int64(budgetWindows+2)*budgetWindow)*time.Millisecond+30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A token budget on three limiter processes of one region sharing Redis,
// with three regions around them: 64 callers each look (cost 0) and, when
// the look is admitted, debit 500 to 5,000 tokens, over two fixed windows
// of 10 s (budgetWindows of budgetWindow); through NATS (a peek, then a debit) and through Envoy's rate
// limit service (hits_addend 0 on arrival, then the tokens when the stream
// is done, on a rate_limit with charge: debit), as Envoy AI Gateway's
// token limits send them. In every window (checkTokenBudget):
//   - every debited token is in Redis's count of the cell (none refused or
//     lost);
//   - no look sent once a debit had overdrawn the budget (plus twice the
//     25 ms a look's counts may be old) is admitted;
//   - what was charged stays within the bound of a look before the work and
//     a debit after it: the budget, plus the debit that overdrew it and one
//     request in flight a caller (65 × 5,000), plus the debits of the looks
//     sent after the first overdrawing debit was sent, which the point
//     above holds to the looks answered from counts up to 25 ms old.
//
// And a budget a region spent is spent for the other regions' looks: a
// debit travels as any admission does. The time is logged; the G-Counter's
// bound is TestBurstInOneRegionIsDeniedElsewhereWithin250ms's to hold, so
// the wait here allows 10 s, for a loaded machine, and still fails a debit
// that never arrives.
func TestTokenBudgetDebitsAcrossLimitersAndRegions(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "llm.yaml")
	writeFile(t, conf, fmt.Sprintf(`domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: second, unit_multiplier: %d, requests_per_unit: %d, window: fixed, charge: debit}
`, budgetWindow/1000, budget))
	w := startWorldWith(t, false, 3, conf)
	rd, err := region.NewRedis(region.RedisConfig{URL: w.redis, KeyPrefix: w.prefixes["us"]})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	t.Run("NATS", func(t *testing.T) {
		ctx := budgetContext(t)
		id := "tenant-" + time.Now().Format("150405.000")
		c := w.clients["us"]
		look := bus.CheckRequest{Identifier: id, Limit: budget, Duration: budgetWindow, Peek: true, Fixed: true}
		door := budgetDoor{
			look: func(ctx context.Context) (bool, int64, error) {
				r, err := c.Check(ctx, "acme", "llm", look)
				return r.Success, r.Reset, err
			},
			debit: func(ctx context.Context, tokens int64) (bool, int64, error) {
				debit := look
				debit.Peek, debit.Cost, debit.Charge = false, tokens, bus.ChargeDebit
				r, err := c.Check(ctx, "acme", "llm", debit)
				return r.Success, r.Reset, err
			},
		}
		cell := window.Cell{Workspace: "acme", Namespace: "llm", Identifier: id, Duration: budgetWindow}
		checkTokenBudget(t, runTokenBudget(t, ctx, door), rd, cell)

		// Across regions: a budget us spends is spent for eu's and ap's looks.
		far := bus.CheckRequest{Identifier: id + "-global", Limit: budget, Duration: 60_000, Fixed: true}
		debit := far
		debit.Cost, debit.Charge = budget+1, bus.ChargeDebit
		if r, err := c.Check(ctx, "acme", "llm", debit); err != nil || r.Success {
			t.Fatalf("us: a debit past the budget: %+v, %v", r, err)
		}
		far.Peek = true
		for _, other := range []string{"eu", "ap"} {
			waitSpent(t, other, func() bool {
				r, err := w.clients[other].Check(ctx, "acme", "llm", far)
				return err == nil && !r.Success
			})
		}
	})

	t.Run("Envoy", func(t *testing.T) {
		ctx := budgetContext(t)
		id := "tenant-" + time.Now().Format("150405.000")
		door := budgetDoor{
			look: func(ctx context.Context) (bool, int64, error) {
				return envoyHits(ctx, w.rls["us"][rand.IntN(len(w.rls["us"]))], id, 0)
			},
			debit: func(ctx context.Context, tokens int64) (bool, int64, error) {
				return envoyHits(ctx, w.rls["us"][rand.IntN(len(w.rls["us"]))], id, tokens)
			},
		}
		cell := window.Cell{Workspace: "envoy", Namespace: "llm", Identifier: "tenant=" + id, Duration: budgetWindow}
		checkTokenBudget(t, runTokenBudget(t, ctx, door), rd, cell)

		// Across regions: tokens us's Envoy charged past the budget are
		// spent for eu's and ap's.
		if within, _, err := envoyHits(ctx, w.rls["us"][0], id+"-global", budget+1); err != nil || within {
			t.Fatalf("us: hits past the budget: within %v, %v", within, err)
		}
		for _, other := range []string{"eu", "ap"} {
			waitSpent(t, other, func() bool {
				within, _, err := envoyHits(ctx, w.rls[other][0], id+"-global", 0)
				return err == nil && !within
			})
		}
	})
}

// envoyHits sends Envoy's request for tenant id with hits_addend hits (0:
// a look, on arrival; the tokens: the charge when the stream is done) and
// returns whether the response is OK and the end of the window (unix ms),
// from duration_until_reset.
func envoyHits(ctx context.Context, c rlsv3.RateLimitServiceClient, id string, hits int64) (bool, int64, error) {
	d := rlsDesc("tenant=" + id)
	d.HitsAddend = wrapperspb.UInt64(uint64(hits))
	sent := time.Now().UnixMilli()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		return false, 0, err
	}
	until := r.Statuses[0].GetDurationUntilReset().AsDuration().Milliseconds()
	// The window's end, which both clocks put within milliseconds of
	// sent+until: the nearest boundary.
	end := (sent + until + budgetWindow/2) / budgetWindow * budgetWindow
	return r.OverallCode == rlsv3.RateLimitResponse_OK, end, nil
}

// waitSpent waits up to 10 s for spent to say region denies a budget
// another region spent, and logs how long it took.
func waitSpent(t *testing.T, region string, spent func() bool) {
	t.Helper()
	start := time.Now()
	for !spent() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%s: looks still admitted %v after us spent the budget", region, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: its looks denied %v after us spent the budget", region, time.Since(start).Round(time.Millisecond))
}

// runTokenBudget runs the load through door from budgetUsers callers over
// budgetWindows windows, from the start of the next, and returns every call.
func runTokenBudget(t *testing.T, ctx context.Context, door budgetDoor) []tokenCall {
	t.Helper()
	now := time.Now().UnixMilli()
	time.Sleep(time.Duration((now/budgetWindow+1)*budgetWindow-now+50) * time.Millisecond)
	end := time.Now().Add(time.Duration(int64(budgetWindows)*budgetWindow)*time.Millisecond - 200*time.Millisecond)
	var (
		mu    sync.Mutex
		calls []tokenCall
	)
	var wg sync.WaitGroup
	for g := range budgetUsers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(end) {
				tc := tokenCall{lookSent: time.Now()}
				within, reset, err := door.look(ctx)
				if err != nil {
					t.Errorf("look: %v", err)
					return
				}
				tc.admitted, tc.reset = within, reset
				if within {
					tokens := 500 + rnd.Int64N(maxTokens-500+1)
					tc.debitSent = time.Now()
					within, reset, err := door.debit(ctx, tokens)
					if err != nil {
						t.Errorf("debit of %d: %v (a debit is never refused)", tokens, err)
						return
					}
					tc.tokens, tc.over, tc.done, tc.debitEnd = tokens, !within, time.Now(), reset
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
	return calls
}

// checkTokenBudget holds the calls of a load to the bounds of a token
// budget, window by window, against Redis's count of cell (its Sequence
// set from each window).
func checkTokenBudget(t *testing.T, calls []tokenCall, rd *region.Redis, cell window.Cell) {
	t.Helper()
	if t.Failed() {
		return
	}
	// Per window: the tokens charged, and when the budget was first
	// overdrawn.
	type win struct {
		charged   int64
		overAt    time.Time // the first overdrawing debit's answer
		overSent  time.Time // the first overdrawing debit's sending
		looks     int
		lateLooks int   // admitted after overAt + 50 ms
		staleLook int   // admitted and sent after overSent
		staleCost int64 // what staleLook's debits charged
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
			if tc.over && (wn.overSent.IsZero() || tc.debitSent.Before(wn.overSent)) {
				wn.overSent = tc.debitSent
			}
		}
	}
	for _, tc := range calls {
		wn := at(tc.reset)
		wn.looks++
		if tc.admitted && !wn.overAt.IsZero() && tc.lookSent.After(wn.overAt.Add(50*time.Millisecond)) {
			wn.lateLooks++
		}
		if tc.admitted && !wn.overSent.IsZero() && tc.lookSent.After(wn.overSent) && tc.debitEnd == tc.reset {
			wn.staleLook++
			wn.staleCost += tc.tokens
		}
	}
	resets := make([]int64, 0, len(wins))
	for r := range wins {
		resets = append(resets, r)
	}
	sort.Slice(resets, func(i, j int) bool { return resets[i] < resets[j] })
	spent := 0
	ctx := testContext(t)
	for _, r := range resets {
		wn := wins[r]
		cell.Sequence = r/cell.Duration - 1
		var cur region.Totals
		var err error
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
		t.Logf("window ending %d: %d looks, %d tokens charged (budget %d), Redis counts %d, overdrawn %v, %d looks (%d tokens) admitted after the overdrawing debit was sent, %d more than 50 ms after its answer",
			r, wn.looks, wn.charged, budget, cur.Count, !wn.overAt.IsZero(), wn.staleLook, wn.staleCost, wn.lateLooks)
		if cur.Count != wn.charged {
			t.Errorf("window ending %d: Redis counts %d tokens, %d were debited", r, cur.Count, wn.charged)
		}
		if wn.charged-wn.staleCost > budget+(budgetUsers+1)*maxTokens {
			t.Errorf("window ending %d: %d tokens charged, %d of them by looks sent after the overdrawing debit: over the budget %d plus the requests in flight ((%d + 1) × %d)",
				r, wn.charged, wn.staleCost, budget, budgetUsers, maxTokens)
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
}
