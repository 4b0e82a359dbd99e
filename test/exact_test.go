package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// sparseCase is one stream of checks at a steady rate against one cap.
type sparseCase struct {
	limit, duration int64
	every           time.Duration
	checks          int
}

func (c sparseCase) String() string {
	return fmt.Sprintf("cap %d per %v at %.0f/s", c.limit, time.Duration(c.duration)*time.Millisecond, float64(time.Second)/float64(c.every))
}

// sparseCases are the streams the exactness tests run side by side, each on
// its own identifier: 1, 4 and 50 checks a second against caps of 1, 10, 30
// and 1000, with windows of a minute and a day.
var sparseCases = []sparseCase{
	{1, 86_400_000, time.Second, 4},
	{1, 60_000, time.Second, 4},
	{10, 86_400_000, 250 * time.Millisecond, 16},
	{10, 60_000, 250 * time.Millisecond, 16},
	{30, 86_400_000, 250 * time.Millisecond, 40},
	{30, 60_000, 20 * time.Millisecond, 40},
	{1000, 86_400_000, 20 * time.Millisecond, 1100},
	{1000, 60_000, 20 * time.Millisecond, 1100},
}

// runSparse runs cases side by side through c, each on its own identifier,
// and fails unless each admits exactly what one exact limiter admits for
// the same request times. The minute-window streams must not cross a
// minute boundary (the allowance is reckoned at the client's send times,
// the limiters decide a millisecond later, and across a boundary the
// previous window's weight makes that millisecond matter): it waits for a
// minute that has room for them.
func runSparse(t *testing.T, c *bus.Client, tag string, cases []sparseCase) {
	t.Helper()
	longest := time.Duration(0)
	for _, sc := range cases {
		longest = max(longest, sc.every*time.Duration(sc.checks))
	}
	if left := time.Minute - time.Duration(time.Now().UnixMilli()%60_000)*time.Millisecond; left < longest+5*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	var wg sync.WaitGroup
	for i, sc := range cases {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%d", tag, i)
			reqs := pace(t, c, id, sc.limit, sc.duration, sc.every, sc.checks)
			got, want := admittedCost(reqs), allowance(reqs, sc.limit, sc.duration)
			t.Logf("%v: admitted %d of %d, one exact limiter %d", sc, got, len(reqs), want)
			if got != want {
				t.Errorf("%v: the region admitted %d, one exact limiter %d", sc, got, want)
			}
		})
	}
	wg.Wait()
}

// startRegion starts n limiter processes of one region on srv sharing the
// Redis at redisURL (default flags), and returns a client.
func startRegion(t *testing.T, srvURL, redisURL string, n int) *bus.Client {
	t.Helper()
	prefix := redistest.Prefix(t)
	for range n {
		startProcess(t, "limiter", "--nats-url", srvURL, "--region", "r1",
			"--redis-url", redisURL, "--redis-prefix", prefix, "--log-level", "warn")
	}
	nc := connect(t, srvURL)
	waitService(t, nc, "ratelimit", n*instancesPerLimiter)
	return bus.NewClient(nc)
}

// Three limiter processes of one region share the real Redis, at default
// flags; sparse traffic spread over them (the queue group picks a limiter
// for each check) is admitted exactly as one exact limiter would admit it.
func TestSparseTrafficOverThreeLimitersIsExact(t *testing.T) {
	srv := startServer(t)
	c := startRegion(t, srv.ClientURL(), redistest.SharedURL(t), 3)
	runSparse(t, c, "sparse", sparseCases)
}

// The same on a real three-node Redis Cluster, one case of each kind:
// sparse traffic exact, and twice the limit within 1%.
func TestRedisClusterIsExactNearTheLimit(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	srv := startServer(t)
	c := startRegion(t, srv.ClientURL(), url, 3)
	runSparse(t, c, "cluster", []sparseCase{{30, 86_400_000, 50 * time.Millisecond, 60}})
	twiceTheLimit(t, c, "cluster-spread", 100, 1000, 5)
}

// twiceTheLimit sends checks at twice the limit for windows windows, from a
// window boundary on, and fails unless the region admits within 1% of what
// one exact limiter admits.
func twiceTheLimit(t *testing.T, c *bus.Client, id string, limit, duration int64, windows int) {
	t.Helper()
	time.Sleep(time.Duration(duration-time.Now().UnixMilli()%duration) * time.Millisecond)
	reqs := pace(t, c, id, limit, duration, time.Duration(duration)*time.Millisecond/time.Duration(2*limit), 2*int(limit)*windows)
	got, want := admittedCost(reqs), allowance(reqs, limit, duration)
	ratio := float64(got) / float64(want)
	t.Logf("twice the limit: admitted %d of %d; one exact limiter %d; ratio %.4f", got, len(reqs), want, ratio)
	if ratio < 0.99 || ratio > 1.01 {
		t.Fatalf("admitted %d, want within 1%% of the allowance %d (ratio %.4f)", got, want, ratio)
	}
}

// Redis cut while a cell is near its limit: no check fails (each limiter
// decides from what it knows, within the read timeout), the region admits
// at most the documented bound (each limiter up to the limit less the
// region's total it last saw), and once Redis is back it holds exactly what
// was admitted. Each limiter serves its own subject prefix here, so the
// test can make each see the region's total before the cut and then spread
// checks over them in turn.
func TestRedisCutNearTheLimitFailsNoCheckAndLosesNoCount(t *testing.T) {
	srv := startServer(t)
	shared := redistest.SharedURL(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(shared, "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	prefix := redistest.Prefix(t)
	nc := connect(t, srv.ClientURL())
	var (
		lims    []*process
		clients []*bus.Client
	)
	for i := range 3 {
		subjects := fmt.Sprint("lim", i)
		lims = append(lims, startProcess(t, "limiter", "--nats-url", srv.ClientURL(), "--region", "r1",
			"--redis-url", "redis://"+proxy.Addr(), "--redis-prefix", prefix, "--subject-prefix", subjects,
			"--log-level", "warn"))
		clients = append(clients, bus.NewClient(nc, bus.WithSubjectPrefix(subjects)))
	}
	waitService(t, nc, "ratelimit", 3*instancesPerLimiter)
	const limit, duration = 100, 86_400_000
	ctx := testContext(t)
	admitted := int64(0)
	check := func(i int, cost int64) bus.CheckResponse {
		t.Helper()
		resp, err := clients[i%3].Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "cut", Limit: limit, Duration: duration, Cost: cost, Peek: cost == 0})
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if resp.Success {
			admitted += cost
		}
		return resp
	}
	// Bring the cell near its limit, 80 of 100, then let every limiter see it
	// (a look, cost 0, once its view is stale).
	for i := range 80 {
		check(i, 1)
	}
	time.Sleep(1100 * time.Millisecond) // --fresh-for: each limiter's next check reads Redis
	for i := range 3 {
		if resp := check(i, 0); resp.Remaining != limit-80 {
			t.Fatalf("limiter %d sees %d remaining before the cut, want %d", i, resp.Remaining, limit-80)
		}
	}
	before := admitted
	proxy.SetMode(tcpproxy.Refuse)
	for i := range 150 {
		check(i, 1)
	}
	during := admitted - before
	if bound := int64(3 * (limit - 80)); during > bound {
		t.Fatalf("admitted %d while Redis was down, want at most %d", during, bound)
	}
	proxy.SetMode(tcpproxy.Pass)
	for i := range 30 {
		check(i, 1)
	}
	t.Logf("admitted %d before the cut, %d during it (bound %d), %d in all", before, during, 3*(limit-80), admitted)
	for _, l := range lims {
		if code := l.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
			t.Fatalf("limiter exit %d", code)
		}
	}
	direct, err := region.NewRedis(region.RedisConfig{URL: shared, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "cut", Duration: duration,
		Sequence: window.Sequence(time.Now().UnixMilli(), duration)}
	inRedis, _, err := direct.Read(context.Background(), cell)
	if err != nil {
		t.Fatal(err)
	}
	if inRedis.Count != admitted {
		t.Fatalf("Redis holds %d, the region admitted %d", inRedis.Count, admitted)
	}
}
