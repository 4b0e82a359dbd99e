package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/flood"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// telemetryLimiter is an in-process limiter on a proxied Redis, with its
// metrics served over HTTP as the limiter command serves them.
type telemetryLimiter struct {
	*limiter
	redis   *proxiedRedis
	metrics string // base URL
}

func startTelemetryLimiter(t *testing.T, url string) *telemetryLimiter {
	t.Helper()
	pr := startProxiedRedis(t)
	bk := region.NewBreaker(pr.via, region.BreakerConfig{Name: "redis"})
	l := startLimiter(t, url, "r1", service.Config{Origin: bk})
	reg := telemetry.NewRegistry()
	telemetry.RegisterLimiter(reg, []*transport.Limiter{l.lim}, l.svc, nil, bk)
	srv, addr, err := telemetry.Serve("127.0.0.1:0", reg, func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = telemetry.Shutdown(context.Background(), srv) })
	return &telemetryLimiter{limiter: l, redis: pr, metrics: "http://" + addr}
}

// While Redis black-holes every settle call (each waits out its 1s
// timeout), a scrape of /metrics and a $SRV.STATS request still answer
// within 100ms.
func TestScrapesAnswerWhileRedisBlackholes(t *testing.T) {
	srv := startServer(t)
	tl := startTelemetryLimiter(t, srv.ClientURL())
	nc := connect(t, srv.ClientURL())
	c := bus.NewClient(nc)
	ctx := testContext(t)
	tl.redis.proxy.SetMode(tcpproxy.Blackhole)
	deadline := time.Now().Add(2500 * time.Millisecond)
	var slowest time.Duration
	for i := 0; time.Now().Before(deadline); i++ {
		// Keep cells queued for settling, so that settle rounds keep waiting.
		if _, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: fmt.Sprintf("scrape-%d", i%50),
			Limit: 1_000_000, Duration: 60_000, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, timeScrape(t, tl.metrics+"/metrics"), timeStats(t, nc))
	}
	tl.redis.proxy.SetMode(tcpproxy.Pass) // so that Close settles everything
	t.Logf("slowest scrape or stats request: %v", slowest)
	if slowest > 100*time.Millisecond {
		t.Fatalf("a scrape took %v while Redis black-holed; want at most 100ms", slowest)
	}
}

func timeScrape(t *testing.T, url string) time.Duration {
	t.Helper()
	start := time.Now()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(body), "sluice_settle_pending_cells") {
		t.Fatalf("scrape: %v\n%s", err, body)
	}
	return time.Since(start)
}

func timeStats(t *testing.T, nc *nats.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := nc.Request("$SRV.STATS.ratelimit", nil, 2*time.Second); err != nil {
		t.Fatalf("$SRV.STATS: %v", err)
	}
	return time.Since(start)
}

// A limiter's publication that does not reach its bridge (here the link
// black-holes at the moment of publish, so the message is written and lost)
// is sent again until the bridge has it: a cell that stops growing still
// reaches the bridge with its final count.
func TestPublishLostInTransitIsSentAgain(t *testing.T) {
	srv := startServer(t)
	// The bridge, on a direct connection.
	bnc := connect(t, srv.ClientURL())
	bt := link.NewBridge(bnc, wire.Subjects{}, "r1", nil)
	br, err := bridge.NewBridge(bridge.BridgeConfig{Region: "r1", Store: bridge.NewMemoryStore(), Transport: bt})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background())
	if err := bt.Serve(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bt.Close(); _ = br.Close(context.Background()) })

	// The limiter's connection goes through a proxy the test controls.
	proxy, err := tcpproxy.Start(strings.TrimPrefix(srv.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	lnc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lnc.Close)
	glink := link.NewGlobal(lnc, wire.Subjects{}, "r1", nil)
	svc := service.New(service.Config{Region: "r1", Global: glink})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	if err := glink.Attach(testContext(t), svc); err != nil {
		t.Fatal(err)
	}

	proxy.SetMode(tcpproxy.Blackhole)
	q := service.Query{Workspace: "acme", Namespace: "api", Identifier: "lost", Limit: 10, Duration: 60_000, Cost: 1}
	for range 11 { // 10 admitted, then a denial of a full cell
		if _, err := svc.Check(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "lost", Duration: 60_000,
		Sequence: window.Sequence(svc.Now().UnixMilli(), 60_000)}
	// The publication goes out within a publish interval into a link that
	// carries nothing; its acknowledgement times out. Then the connection
	// dies with it (as TCP gives up), and comes back.
	time.Sleep(1500 * time.Millisecond)
	if got := importOf(br, cell).Own; got != 0 {
		t.Fatalf("the bridge has %d through a black-holed link", got)
	}
	proxy.SetMode(tcpproxy.Refuse)
	time.Sleep(100 * time.Millisecond)
	proxy.SetMode(tcpproxy.Pass)
	deadline := time.Now().Add(10 * time.Second)
	for importOf(br, cell).Own != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("the bridge has count %d; want the final 10, sent again (limiter: %+v)",
				importOf(br, cell).Own, svc.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if svc.Stats().PublishErrors == 0 {
		t.Fatal("no publish failed: the link was not cut at the moment of publish")
	}
}

// A flood of checks on identifiers the limiter has never seen, each of
// which would read Redis first, while Redis answers slowly: goroutines stay
// bounded by the cap on waiting checks, and every check is answered, none
// much later than the read timeout. Run at the default cap, and at a cap of
// 64, which the flood this test can offer on a loaded machine under the
// race detector reaches for sure. (test/coldflood measures 50k checks/s.)
func TestColdFloodAgainstSlowRedisStaysBounded(t *testing.T) {
	for _, maxWaiting := range []int{0, 64} {
		t.Run(fmt.Sprint("max-waiting-", maxWaiting), func(t *testing.T) {
			srv := startServer(t)
			pr := startProxiedRedis(t)
			pr.proxy.SetDelay(20 * time.Millisecond) // a 40ms round trip: more calls than go-redis's pool carries
			nc := connect(t, srv.ClientURL())
			svc := service.New(service.Config{Origin: region.NewBreaker(pr.via, region.BreakerConfig{Name: "redis"})})
			lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, MaxWaiting: maxWaiting})
			if err != nil {
				t.Fatal(err)
			}
			l := &limiter{nc: nc, svc: svc, lim: lim}
			t.Cleanup(func() { l.stop(t) })
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			cap := maxWaiting
			if cap == 0 {
				cap = transport.DefaultMaxWaiting
			}
			res, err := flood.Cold(connect(t, srv.ClientURL()), "ratelimit.check.acme.api", 5000, 2*time.Second, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			st := lim.Stats()
			t.Logf("%d checks: p99 %v, max %v; goroutines %d before, %d at most; waited %d, decided at once %d",
				res.Sent, res.P99, res.Max, res.BaseGoroutines, res.MaxGoroutines, st.AsyncChecks, st.NotWaited)
			if res.Answered != res.Sent {
				t.Fatalf("%d of %d checks answered", res.Answered, res.Sent)
			}
			// Each waiting check holds its goroutine and at most one read's;
			// besides them, go-redis's pool (20 connections at most) and the
			// test's proxy hold a few goroutines per connection.
			if bound := res.BaseGoroutines + 2*cap + 160; res.MaxGoroutines > bound {
				t.Fatalf("%d goroutines at most, want at most %d", res.MaxGoroutines, bound)
			}
			if maxWaiting > 0 && st.NotWaited == 0 {
				t.Fatalf("the flood never reached the cap of %d waiting checks", maxWaiting)
			}
			// Within the clients' check timeout (1s): the read timeout
			// (250ms) plus the queueing of a 2-core machine under the race
			// detector with up to the cap of checks waiting at once. A
			// check left waiting on go-redis's own timeouts (seconds)
			// exceeds it.
			if res.P99 > time.Second {
				t.Fatalf("p99 %v, want within the 1s check timeout (the 250ms read timeout plus queueing)", res.P99)
			}
		})
	}
}

// importOf returns the bridge's import of c as its snapshot (what a
// starting limiter loads) holds it: zero counts for a cell it does not hold.
func importOf(b *bridge.Bridge, c window.Cell) global.Import {
	for _, im := range b.Snapshot() {
		if im.Cell == c {
			return im
		}
	}
	return global.Import{Cell: c}
}
