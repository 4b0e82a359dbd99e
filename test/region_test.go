package test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// sent is one check a test sent and what came back.
type sent struct {
	at       int64 // unix ms when sent
	cost     int64
	admitted bool
}

// allowance is what one exact limiter admits for the same requests at the
// same instants: the window rule applied in order.
func allowance(reqs []sent, limit, duration int64) (admitted int64) {
	slices.SortStableFunc(reqs, func(a, b sent) int { return int(a.at - b.at) })
	counts := map[int64]int64{}
	for _, r := range reqs {
		seq := window.Sequence(r.at, duration)
		d := window.Decide(window.Input{Now: r.at, Duration: duration, Limit: limit, Cost: r.cost,
			Current: counts[seq], Previous: counts[seq-1]})
		if d.Admitted {
			counts[seq] += r.cost
			admitted += r.cost
		}
	}
	return admitted
}

func admittedCost(reqs []sent) (n int64) {
	for _, r := range reqs {
		if r.admitted {
			n += r.cost
		}
	}
	return n
}

// pace sends one check every interval for n checks and records them.
func pace(t *testing.T, c *bus.Client, id string, limit, duration int64, interval time.Duration, n int) []sent {
	t.Helper()
	out := make([]sent, 0, n)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		start := time.Now()
		resp, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: id, Limit: limit, Duration: duration, Cost: 1})
		if err != nil {
			// Errorf, not Fatalf: pace may run on its own goroutine.
			t.Errorf("check %d of %d at %s (after %v): %v", i, n, start.Format("15:04:05.000"), time.Since(start), err)
			return out
		}
		out = append(out, sent{at: start.UnixMilli(), cost: 1, admitted: resp.Success})
	}
	return out
}

// Three limiter processes of one region share Redis, at default flags;
// traffic at twice the limit for 10 windows is admitted within 1% of what one
// exact limiter would admit, and spread over all three.
func TestOneRegionOfThreeLimitersAdmitsTheAllowance(t *testing.T) {
	srv := startServer(t)
	c := startRegion(t, srv.ClientURL(), redistest.SharedURL(t), 3)
	twiceTheLimit(t, c, "spread", 100, 1000, 10)
	nc := connect(t, srv.ClientURL())
	st := checkStats(t, nc, serviceIDs(t, nc, 3*instancesPerLimiter)...)
	total := 0
	for _, n := range st {
		total += n
	}
	for id, n := range st {
		if n < total/(4*len(st)) {
			t.Fatalf("instance %s served only %d of %d checks: traffic was not spread", id, n, total)
		}
	}
}

// A daily cap of 30 with sparse traffic (about 4 checks a second) spread
// over three limiters, at default flags, admits exactly the cap: near it,
// admissions are decided by Redis.
func TestDailyCapWithSparseTrafficNeverExceedsTheCap(t *testing.T) {
	srv := startServer(t)
	c := startRegion(t, srv.ClientURL(), redistest.SharedURL(t), 3)
	const cap = 30
	reqs := pace(t, c, "daily", cap, 86_400_000, 250*time.Millisecond, 2*cap)
	if got := admittedCost(reqs); got != cap {
		t.Fatalf("admitted %d against a daily cap of %d, want exactly the cap", got, cap)
	}
}

// serviceIDs lists the IDs of the n running limiters.
func serviceIDs(t *testing.T, nc *nats.Conn, n int) []string {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING.ratelimit", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for len(ids) < n {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d limiters answered the ping: %v", len(ids), n, err)
		}
		var ping micro.Ping
		if err := json.Unmarshal(m.Data, &ping); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ping.ID)
	}
	return ids
}

// faultyLimiter is an in-process limiter whose Redis sits behind a proxy.
type faultyLimiter struct {
	*limiter
	proxy  *tcpproxy.Proxy
	direct *region.Redis // the same Redis, not through the proxy
	bk     *region.Breaker
}

func startFaultyLimiter(t *testing.T, url string) *faultyLimiter {
	t.Helper()
	pr := startProxiedRedis(t)
	// Not the defaults (1s each): the fault tests go through several breaker
	// cycles and stale refreshes in a few seconds. Defaults are covered by
	// TestSIGTERMWhileRedisIsDownExitsEarlySayingWhatIsLost and
	// TestScrapesAnswerWhileRedisBlackholes.
	bk := region.NewBreaker(pr.via, region.BreakerConfig{Failures: 5, OpenFor: 300 * time.Millisecond})
	l := startLimiter(t, url, "r1", service.Config{Origin: bk, FreshFor: 300 * time.Millisecond})
	return &faultyLimiter{limiter: l, proxy: pr.proxy, direct: pr.direct, bk: bk}
}

// Redis refusing, black-holing or slow: checks keep answering within the
// read deadline, and after recovery Redis holds exactly what was admitted.
func TestRedisFaultsNeitherStallChecksNorLoseCounts(t *testing.T) {
	srv := startServer(t)
	fl := startFaultyLimiter(t, srv.ClientURL())
	c := bus.NewClient(connect(t, srv.ClientURL()))
	ctx := testContext(t)

	const limit = 1_000_000
	admitted := map[string]int64{}
	run := func(t *testing.T, phase string, n int) (worst time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range n {
					// Half warm identifiers, half new (cold) ones.
					id := fmt.Sprintf("warm-%d", i%4)
					if i%2 == 1 {
						id = fmt.Sprintf("%s-cold-%d-%d", phase, g, i)
					}
					start := time.Now()
					resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: limit, Duration: 3_600_000, Cost: 1})
					took := time.Since(start)
					if err != nil {
						t.Errorf("%s: check failed: %v", phase, err)
						return
					}
					mu.Lock()
					worst = max(worst, took)
					if resp.Success {
						admitted[id]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return worst
	}
	run(t, "warmup", 20)
	for _, fault := range []struct {
		name  string
		apply func()
	}{
		{"refusing", func() { fl.proxy.SetMode(tcpproxy.Refuse) }},
		{"black-holing", func() { fl.proxy.SetMode(tcpproxy.Blackhole) }},
		{"slow", func() { fl.proxy.SetDelay(300 * time.Millisecond) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			fault.apply()
			// Long enough for cells to go stale and the breaker to open and probe.
			deadline := time.Now().Add(time.Second)
			var worst time.Duration
			for time.Now().Before(deadline) {
				worst = max(worst, run(t, fault.name, 10))
			}
			// The default read deadline (250ms) and scheduling slack: a
			// check waits on one Redis call at most, never on two in a row.
			if worst > 250*time.Millisecond+150*time.Millisecond {
				t.Errorf("slowest check took %v while Redis was %s", worst, fault.name)
			}
			fl.proxy.SetDelay(0)
			fl.proxy.SetMode(tcpproxy.Pass)
		})
	}
	// Recovery: everything admitted reaches Redis, once.
	fl.stop(t)
	for id, n := range admitted {
		// The test may straddle an hour boundary: count both cells.
		cur, prev, err := fl.direct.Read(ctx, window.Cell{Workspace: "acme", Namespace: "api", Identifier: id,
			Duration: 3_600_000, Sequence: window.Sequence(time.Now().UnixMilli(), 3_600_000)})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Count+prev.Count != n {
			t.Fatalf("Redis holds %d for %s, the limiter admitted %d", cur.Count+prev.Count, id, n)
		}
	}
}

// A slow Redis (round trips of about 60ms, within the 250ms read
// deadline) that answers and takes writes: checks wait for it and it
// decides them, so nothing is decided from the limiter's counts while
// Redis answers, and the read breaker, which counts calls that fail or go
// unanswered for the read deadline, stays closed; replays keep landing, so
// Redis holds what was admitted while it is still slow.
func TestSlowRedisDecidesChecksKeepsTheBreakerClosedAndReplaysLanding(t *testing.T) {
	srv := startServer(t)
	fl := startFaultyLimiter(t, srv.ClientURL())
	c := bus.NewClient(connect(t, srv.ClientURL()))
	ctx := testContext(t)

	// Round trips of about 60ms (a new connection takes about three).
	fl.proxy.SetDelay(30 * time.Millisecond)
	var applyOpened, readOpened atomic.Bool
	watchDone := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-watchDone:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if fl.bk.State(region.CallApply) != gobreaker.StateClosed {
				applyOpened.Store(true)
			}
			if fl.bk.State(region.CallRead) != gobreaker.StateClosed {
				readOpened.Store(true)
			}
		}
	})
	var mu sync.Mutex
	admitted := map[string]int64{}
	var wg sync.WaitGroup
	// Load for long enough that many calls are late while replay rounds
	// run.
	loadUntil := time.Now().Add(1500 * time.Millisecond)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(loadUntil); i++ {
				id := fmt.Sprintf("slow-%d-%d", g, i%200)
				resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 1_000_000, Duration: 3_600_000, Cost: 1})
				if err != nil {
					t.Errorf("check failed while Redis was slow: %v", err)
					return
				}
				if resp.Success {
					mu.Lock()
					admitted[id]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if readOpened.Load() {
		t.Fatal("late reads of a Redis that answers opened the read breaker")
	}
	if st := fl.svc.Stats(); st.AdmittedLocally != 0 || st.OriginRequests == 0 {
		t.Fatalf("%d admitted locally, %d decided by Redis: want none locally (late calls %d)", st.AdmittedLocally, st.OriginRequests, st.LateCalls)
	}
	if st := fl.svc.Stats(); st.SettleErrors != 0 || st.Settles == 0 {
		t.Fatalf("during the load: settle calls %d, failed %d: want settle calls, none failed", st.Settles, st.SettleErrors)
	}
	// While Redis is still slow, every admitted unit lands there, and only
	// those: a late call's grant, which its checks were denied, may land
	// after the limiter gave up on it; the next settle round of the cell
	// claims without it, which gives it back.
	deadline := time.Now().Add(5 * time.Second)
	for id, n := range admitted {
		for {
			cur, prev, err := fl.direct.Read(ctx, window.Cell{Workspace: "acme", Namespace: "api", Identifier: id,
				Duration: 3_600_000, Sequence: window.Sequence(time.Now().UnixMilli(), 3_600_000)})
			if err != nil {
				t.Fatal(err)
			}
			if cur.Count+prev.Count == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Redis holds %d for %s while slow, the limiter admitted %d", cur.Count+prev.Count, id, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	close(watchDone)
	watch.Wait()
	if applyOpened.Load() {
		t.Fatal("the apply breaker left closed although every replay could land")
	}
	if st := fl.svc.Stats(); st.SettleErrors != 0 || st.Settles == 0 {
		t.Fatalf("settle calls %d, failed %d: want settle calls, none failed", st.Settles, st.SettleErrors)
	}
}

// Two limiters on a three-node Redis Cluster act as one limiter: with
// freshness shorter than the gap between rounds, each round's checks read
// the cluster's totals and see the other limiter's replayed counts.
func TestLimitersConvergeThroughARedisCluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	prefix := redistest.Prefix(t)
	srv := startServer(t)
	var lims []*limiter
	for range 2 {
		rd, err := region.NewRedis(region.RedisConfig{URL: url, KeyPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		// FreshFor 20ms, not the default 1s: the test reads the cluster's
		// totals on every round without waiting a second between rounds.
		lims = append(lims, startLimiter(t, srv.ClientURL(), "r1", service.Config{Origin: rd, FreshFor: 20 * time.Millisecond}))
	}
	c := bus.NewClient(connect(t, srv.ClientURL()))
	ctx := testContext(t)
	// 40 identifiers over many slots, 3 units each at a limit of 5: whichever
	// limiter answers, the second and third unit are only admitted if the
	// limiters share counts.
	for round := range 3 {
		for i := range 40 {
			resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: fmt.Sprint("id-", i), Limit: 5, Duration: 3_600_000, Cost: 2})
			if err != nil {
				t.Fatal(err)
			}
			if want := round < 2; resp.Success != want {
				t.Fatalf("round %d, id-%d: success %v, want %v", round, i, resp.Success, want)
			}
		}
		// Let replay carry each round's counts (cells near their limit replay every 10ms).
		time.Sleep(50 * time.Millisecond)
	}
	served := checkStats(t, lims[0].nc, lims[0].lim.Info().ID, lims[1].lim.Info().ID)
	for id, n := range served {
		if n == 0 {
			t.Fatalf("limiter %s served no check: the test did not exercise convergence (%v)", id, served)
		}
	}
}
