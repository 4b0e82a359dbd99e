package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// The arrivals that break a distributed limiter: bursts faster than any
// background interval (replay, lease renewal, refresh), spread by the queue
// group over several limiter processes, on cold and on warm identifiers,
// with one limiter taking its share before the others start, for limits from
// 1 to 100,000. One exact limiter admits exactly the limit of such a burst
// (3× the limit, all in one window); so must the region, every time: no
// overshoot and no false denial. Afterwards Redis holds exactly what was
// admitted.

// burstWindow is the window of the burst tests: 10 minutes, as a user would
// set it; burstRound waits out its boundary so a burst never straddles two.
const burstWindow = 600_000

// burstCase is one kind of burst.
type burstCase struct {
	limit    int64
	inflight []int // callers sending as fast as replies come back, one burst each
	reps     int   // fresh identifiers per inflight, one burst each
}

// burstLimits are the limits every topology is tried at, at 64 and 256
// callers, with how many bursts on fresh identifiers each gets (small
// limits have short bursts, so more of them).
var burstLimits = []burstCase{
	{limit: 1, inflight: []int{64, 256}, reps: 20},
	{limit: 10, inflight: []int{64, 256}, reps: 10},
	{limit: 100, inflight: []int{64, 256}, reps: 5},
	{limit: 1000, inflight: []int{64, 256}, reps: 2},
	{limit: 100_000, inflight: []int{64, 256}, reps: 1},
}

// burstRegion is a region of limiter processes on the real Redis, and what
// it admitted per identifier.
type burstRegion struct {
	t        *testing.T
	procs    []*process
	spread   *bus.Client   // the queue group picks a limiter per message; the client coalesces
	single   *bus.Client   // the same, one check per message (coalescing off)
	each     []*bus.Client // one limiter each (own subject prefix)
	redisURL string
	prefix   string
	natsURL  string

	mu       sync.Mutex
	admitted map[string]int64
}

// startBurstRegion starts n limiter processes at default flags sharing the
// Redis at redisURL. With pinned, each serves its own subject prefix (so a
// test can choose which limiter answers); otherwise all serve the default
// prefix as one queue group.
func startBurstRegion(t *testing.T, redisURL string, n int, pinned bool) *burstRegion {
	t.Helper()
	srv := startServer(t)
	r := &burstRegion{t: t, redisURL: redisURL, prefix: redistest.Prefix(t), natsURL: srv.ClientURL(), admitted: map[string]int64{}}
	nc := connect(t, srv.ClientURL())
	for i := range n {
		if pinned {
			r.each = append(r.each, bus.NewClient(nc, bus.WithSubjectPrefix(fmt.Sprint("lim", i))))
		}
	}
	r.startLimiters(n, pinned)
	waitService(t, nc, "ratelimit", n*instancesPerLimiter)
	r.spread = bus.NewClient(nc)
	r.single = bus.NewClient(nc, bus.WithCoalescing(false))
	return r
}

// startLimiters starts n limiter processes (with pinned, each on its own
// subject prefix).
func (r *burstRegion) startLimiters(n int, pinned bool) {
	for i := range n {
		args := []string{"--nats-url", r.natsURL, "--region", "r1", "--redis-url", r.redisURL,
			"--redis-prefix", r.prefix, "--log-level", "warn"}
		if pinned {
			args = append(args, "--subject-prefix", fmt.Sprint("lim", i))
		}
		r.procs = append(r.procs, startProcess(r.t, "limiter", args...))
	}
}

// restart replaces the region's limiter processes (stopped already) with n
// new ones, on the default prefix.
func (r *burstRegion) restart(n int) {
	r.procs = nil
	r.startLimiters(n, false)
	waitService(r.t, connect(r.t, r.natsURL), "ratelimit", n*instancesPerLimiter)
}

// checkTimeout bounds each check of a burst: a burst of 300,000 checks
// under -race on two cores takes longer than any one deadline for all of
// them would fairly allow, but every single check must still be answered
// within this.
const checkTimeout = 10 * time.Second

// send sends n checks of cost 1 on id (limit per burstWindow) from
// inflight callers as fast as replies come back, each through pick(i) for
// the i-th check, and returns how many were admitted. Every check must be
// answered.
func (r *burstRegion) send(ctx context.Context, id string, limit int64, n, inflight int, pick func(i int) *bus.Client) int64 {
	r.t.Helper()
	var next, admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, inflight)
	for range inflight {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, checkTimeout)
				resp, err := pick(int(i)).Check(cctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: limit, Duration: burstWindow})
				cancel()
				if err != nil {
					errs <- fmt.Errorf("check %d on %s: %w", i, id, err)
					return
				}
				if resp.Success {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.admitted[id] += admitted.Load()
	r.mu.Unlock()
	return admitted.Load()
}

// expectLimit fails unless id's admissions in all add up to limit.
func (r *burstRegion) expectLimit(what, id string, limit int64) {
	r.t.Helper()
	r.mu.Lock()
	got := r.admitted[id]
	r.mu.Unlock()
	if got != limit {
		r.t.Errorf("%s: the region admitted %d, one exact limiter %d", what, got, limit)
	}
}

// closeAndCompare stops every limiter gracefully and fails unless Redis
// holds, for every identifier, exactly what the region admitted.
func (r *burstRegion) closeAndCompare() {
	r.t.Helper()
	for _, p := range r.procs {
		if code := p.stop(r.t, syscall.SIGTERM, 15*time.Second); code != 0 {
			r.t.Fatalf("limiter exited %d after SIGTERM", code)
		}
	}
	direct, err := region.NewRedis(region.RedisConfig{URL: r.redisURL, KeyPrefix: r.prefix})
	if err != nil {
		r.t.Fatal(err)
	}
	defer direct.Close()
	seq := window.Sequence(time.Now().UnixMilli(), burstWindow)
	for id, want := range r.admitted {
		cur, prev, err := direct.Read(context.Background(), window.Cell{Workspace: "acme", Namespace: "api",
			Identifier: id, Duration: burstWindow, Sequence: seq})
		if err != nil {
			r.t.Fatal(err)
		}
		if got := cur.Count + prev.Count; got != want {
			r.t.Errorf("%s: Redis holds %d, the region admitted %d", id, got, want)
		}
	}
}

// burstRound waits, if need be, until the current burstWindow has room for
// a round of bursts (so none straddles two windows), and returns a tag for
// its identifiers.
func burstRound(t *testing.T, room time.Duration) string {
	t.Helper()
	if left := time.Duration(burstWindow-time.Now().UnixMilli()%burstWindow) * time.Millisecond; left < room {
		time.Sleep(left + 100*time.Millisecond)
	}
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// runBursts runs, on a region of limiters, bursts of 3× the limit on fresh
// identifiers at every limit and number of callers (spread by the queue
// group), and on warm ones (half the limit used first, by 8 callers, then
// a pause longer than a replay round so the limiters hold the cells), and
// fails unless each admits exactly the limit.
func runBursts(t *testing.T, r *burstRegion, limits []burstCase) {
	ctx := t.Context()
	tag := burstRound(t, 60*time.Second)
	spread := func(int) *bus.Client { return r.spread }
	single := func(int) *bus.Client { return r.single }
	for _, bc := range limits {
		for i, inflight := range bc.inflight {
			for rep := range bc.reps {
				id := fmt.Sprintf("%s-fresh-%d-%d-%d", tag, bc.limit, inflight, rep)
				// The first number of callers sends one check per
				// message (the check endpoint), the second lets the
				// client coalesce them (the checks endpoint).
				pick := spread
				if i == 0 {
					pick = single
				}
				r.send(ctx, id, bc.limit, 3*int(bc.limit), inflight, pick)
				r.expectLimit(fmt.Sprintf("fresh, limit %d, %d in flight, burst %d", bc.limit, inflight, rep), id, bc.limit)
			}
		}
		if bc.limit >= 10 {
			inflight := bc.inflight[len(bc.inflight)-1]
			id := fmt.Sprintf("%s-warm-%d", tag, bc.limit)
			r.send(ctx, id, bc.limit, int(bc.limit/2), 8, spread)
			time.Sleep(50 * time.Millisecond)
			r.send(ctx, id, bc.limit, 3*int(bc.limit), inflight, spread)
			r.expectLimit(fmt.Sprintf("warm, limit %d, %d in flight", bc.limit, inflight), id, bc.limit)
		}
	}
}

// runUneven runs bursts where one limiter takes its share (a third of the
// burst) before the others begin, then the rest goes round robin over all
// of them, for every limit; and bursts whose shares are uneven throughout
// (the first limiter gets half, the rest share the other half).
func runUneven(t *testing.T, r *burstRegion, limits []burstCase) {
	ctx := t.Context()
	tag := burstRound(t, 45*time.Second)
	n := len(r.each)
	for _, bc := range limits {
		id := fmt.Sprintf("%s-first-%d", tag, bc.limit)
		total := 3 * int(bc.limit)
		inflight := bc.inflight[0]
		r.send(ctx, id, bc.limit, total/3, inflight, func(int) *bus.Client { return r.each[0] })
		r.send(ctx, id, bc.limit, total-total/3, inflight, func(i int) *bus.Client { return r.each[i%n] })
		r.expectLimit(fmt.Sprintf("one limiter first, limit %d", bc.limit), id, bc.limit)

		id = fmt.Sprintf("%s-uneven-%d", tag, bc.limit)
		r.send(ctx, id, bc.limit, total, inflight, func(i int) *bus.Client {
			if i%2 == 0 {
				return r.each[0]
			}
			return r.each[1+(i/2)%(n-1)]
		})
		r.expectLimit(fmt.Sprintf("uneven shares, limit %d", bc.limit), id, bc.limit)
	}
}

func TestBurstsOverThreeLimitersAdmitExactlyTheLimit(t *testing.T) {
	r := startBurstRegion(t, redistest.SharedURL(t), 3, false)
	runBursts(t, r, burstLimits)
	r.closeAndCompare()
}

func TestBurstsOverFiveLimitersAdmitExactlyTheLimit(t *testing.T) {
	r := startBurstRegion(t, redistest.SharedURL(t), 5, false)
	limits := slices.Clone(burstLimits)
	limits[len(limits)-1].inflight = []int{256} // 64 callers at 100,000: the three-limiter test
	runBursts(t, r, limits)
	r.closeAndCompare()
}

func TestUnevenBurstsOverThreeLimitersAdmitExactlyTheLimit(t *testing.T) {
	r := startBurstRegion(t, redistest.SharedURL(t), 3, true)
	runUneven(t, r, burstLimits)
	r.closeAndCompare()
}

func TestUnevenBurstsOverFiveLimitersAdmitExactlyTheLimit(t *testing.T) {
	r := startBurstRegion(t, redistest.SharedURL(t), 5, true)
	runUneven(t, r, burstLimits[:4])
	r.closeAndCompare()
}

// The same on a real three-node Redis Cluster, one case of each kind.
func TestBurstsOnARedisClusterAdmitExactlyTheLimit(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	r := startBurstRegion(t, url, 3, true)
	ctx := t.Context()
	tag := burstRound(t, 30*time.Second)
	spread := func(i int) *bus.Client { return r.each[i%3] }
	id := tag + "-fresh"
	r.send(ctx, id, 100, 300, 64, spread)
	r.expectLimit("fresh, limit 100", id, 100)
	id = tag + "-warm"
	r.send(ctx, id, 100, 50, 8, spread)
	time.Sleep(50 * time.Millisecond)
	r.send(ctx, id, 100, 300, 64, spread)
	r.expectLimit("warm, limit 100", id, 100)
	id = tag + "-first"
	r.send(ctx, id, 100, 100, 64, func(int) *bus.Client { return r.each[0] })
	r.send(ctx, id, 100, 200, 64, spread)
	r.expectLimit("one limiter first, limit 100", id, 100)
	r.closeAndCompare()
}

// As a user would hit it: one or two limiter processes on Redis at
// default flags, bursts of 12 and of 40 concurrent checks on fresh
// identifiers at a limit of 10: exactly 10 admitted every time. Afterwards
// a look (cost 0) and a check (cost 1) answer by the rule, from whichever
// limiter the queue group picks: in the burst's window 0 remaining and the
// rule's retry_after; in the next window what the previous window's weight
// leaves. Windows of 10s, so the test sees the next one without waiting a
// minute; the rule is checked at the instants the request was sent and
// answered, between which the limiter decided.
func TestSmallBurstsOnOneAndTwoLimitersAdmitTenAndAnswerByTheRule(t *testing.T) {
	const limit, window10s = 10, 10_000
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprint(n, " limiters"), func(t *testing.T) {
			t.Parallel() // most of the time is waiting for windows
			r := startBurstRegion(t, redistest.SharedURL(t), n, false)
			ctx := testContext(t)
			// Start at a window boundary: 80 bursts take well under a window.
			time.Sleep(time.Duration(window10s-time.Now().UnixMilli()%window10s+50) * time.Millisecond)
			start := time.Now().UnixMilli()
			var ids []string
			for i := range 80 {
				callers := 12
				if i >= 30 {
					callers = 40
				}
				id := fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), start, i)
				got := r.sendWindow(ctx, id, limit, window10s, callers, callers)
				if got != limit {
					t.Errorf("burst %d of %d concurrent checks: admitted %d, one exact limiter %d", i, callers, got, limit)
				}
				ids = append(ids, id)
			}
			if time.Now().UnixMilli()/window10s != start/window10s {
				t.Fatal("the bursts took longer than a window")
			}
			for _, id := range ids {
				r.expectRule(ctx, id, limit, window10s, 0, limit, false) // a look
				r.expectRule(ctx, id, limit, window10s, 1, limit, false) // a check: denied
			}
			// The next window, 3s in: the previous window weighs 7/10.
			next := (start/window10s + 1) * window10s
			time.Sleep(time.Duration(next+3000-time.Now().UnixMilli()) * time.Millisecond)
			for _, id := range ids {
				r.expectRule(ctx, id, limit, window10s, 0, limit, true)
			}
		})
	}
}

// sendWindow sends n checks of cost 1 on id (limit per duration) from
// callers at once and returns how many were admitted.
func (r *burstRegion) sendWindow(ctx context.Context, id string, limit, duration int64, n, callers int) int64 {
	r.t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			c := r.spread // coalesced into checks messages
			if callers <= 12 {
				c = r.single // one check per message, as the 12 processes sent them
			}
			resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: limit, Duration: duration})
			if err != nil {
				r.t.Error(err)
				return
			}
			if resp.Success {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	return admitted.Load()
}

// expectRule sends one check of cost (0: a look) on id, whose window held
// used (in the current window, or with next in the previous one), and fails
// unless the reply is what the rule says at some instant between sending
// and receiving it.
func (r *burstRegion) expectRule(ctx context.Context, id string, limit, duration, cost, used int64, next bool) {
	r.t.Helper()
	// The limiter's clock is a millisecond cache refreshed by a ticker,
	// which a loaded machine (-race on two cores) delays by a few
	// milliseconds: allow it 25ms behind. The errors this test exists for
	// are a window (10s) off.
	sent := time.Now().UnixMilli() - 25
	resp, err := r.spread.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: limit, Duration: duration,
		Cost: cost, Peek: cost == 0})
	got := time.Now().UnixMilli()
	if err != nil {
		r.t.Fatal(err)
	}
	rule := func(now int64) window.Decision {
		in := window.Input{Now: now, Duration: duration, Limit: limit, Cost: cost, Current: used}
		if next {
			in.Current, in.Previous = 0, used
		}
		return window.Decide(in)
	}
	a, b := rule(sent), rule(got)
	ok := resp.Success == a.Admitted && resp.Success == b.Admitted &&
		resp.Remaining >= min(a.Remaining, b.Remaining) && resp.Remaining <= max(a.Remaining, b.Remaining) &&
		resp.RetryAfter >= min(a.RetryAfter, b.RetryAfter) && resp.RetryAfter <= max(a.RetryAfter, b.RetryAfter)
	if !ok {
		r.t.Errorf("%s, cost %d: answered %+v; the rule says %+v then %+v", id, cost, resp, a, b)
	}
}
