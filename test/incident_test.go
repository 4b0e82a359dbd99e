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

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
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
	telemetry.RegisterLimiter(reg, []*bus.Limiter{l.lim}, l.svc, nil, bk)
	srv, addr, err := telemetry.Serve("127.0.0.1:0", reg, func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = telemetry.Shutdown(context.Background(), srv) })
	return &telemetryLimiter{limiter: l, redis: pr, metrics: "http://" + addr}
}

// While Redis black-holes every replay (each waits out its 1s timeout), a
// scrape of /metrics and a $SRV.STATS request still answer within 100ms.
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
		// Keep cells queued for replay, so that replay rounds keep waiting.
		if _, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: fmt.Sprintf("scrape-%d", i%50),
			Limit: 1_000_000, Duration: 60_000, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, timeScrape(t, tl.metrics+"/metrics"), timeStats(t, nc))
	}
	tl.redis.proxy.SetMode(tcpproxy.Pass) // so that Close replays everything
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
	if err != nil || !strings.Contains(string(body), "sluice_replay_pending_cells") {
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
