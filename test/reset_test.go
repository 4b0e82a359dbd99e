package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
)

// remainingEverywhere is lookEverywhere until every region answers a
// look at id (limit 10) with remaining in [lo, hi].
func (w *world) remainingEverywhere(id string, lo, hi int64, since time.Time, within time.Duration) time.Duration {
	w.t.Helper()
	return w.lookEverywhere(id, 10, fmt.Sprintf("remaining %d..%d", lo, hi),
		func(r bus.CheckResponse) bool { return r.Remaining >= lo && r.Remaining <= hi }, since, within)
}

// A reset end to end over three regions, each with two limiters on Redis
// and a bridge on MariaDB: an identifier exhausted in us (every region
// knows it), reset in eu, is admitted again in all three regions; what is
// admitted after the reset counts everywhere; and the usage before the
// reset never comes back, not through Redis, MySQL or imports, even once
// every process restarted.
func TestResetForgetsUsageInEveryRegionAndSurvivesRestarts(t *testing.T) {
	w := startWorld(t, false, 2)
	ctx := testContext(t)
	const id = "reset_1"

	w.burst("us", id, 10, 300_000)
	w.remainingEverywhere(id, 0, 0, time.Now(), 5*time.Second)

	start := time.Now()
	epoch, err := w.clients["eu"].Reset(ctx, "acme", "api", id, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := w.remainingEverywhere(id, 10, 10, start, 5*time.Second)
	t.Logf("reset in eu (epoch %d): every region admits from zero %v after the request was sent", epoch, d)
	if d > 250*time.Millisecond {
		t.Errorf("a reset took %v to reach every region, over the 250ms convergence target", d)
	}

	// Spent after the reset, in ap: counted in every region (components
	// of the reset's epoch).
	for range 3 {
		if resp, err := w.check("ap", id, 10, 300_000, 1); err != nil || !resp.Success {
			t.Fatalf("ap after the reset: %+v, %v", resp, err)
		}
	}
	w.remainingEverywhere(id, 7, 7, time.Now(), 5*time.Second)

	// Every process restarts: the reset comes back from MySQL, the usage
	// before it does not.
	w.restartEverything()
	w.remainingEverywhere(id, 7, 7, time.Now(), 5*time.Second)
	// And stays so once every bridge has loaded from MySQL twice more
	// (the components before the reset among what it holds and imports).
	loads := map[string]float64{}
	for _, r := range regions {
		loads[r] = w.bridgeStat(r, "store_loads")
	}
	for _, r := range regions {
		deadline := time.Now().Add(10 * time.Second)
		for w.bridgeStat(r, "store_loads") < loads[r]+2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s's bridge did not load from the store twice within 10s", r)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	w.remainingEverywhere(id, 7, 7, time.Now(), time.Second)
}
