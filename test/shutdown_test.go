package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// proxiedRedis is the shared Redis seen through a proxy the test controls,
// and directly.
type proxiedRedis struct {
	proxy  *tcpproxy.Proxy
	via    *region.Redis // through the proxy
	direct *region.Redis // the same keys, not through the proxy
}

func startProxiedRedis(t *testing.T) *proxiedRedis {
	t.Helper()
	shared := redistest.SharedURL(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(shared, "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	prefix := redistest.Prefix(t)
	via, err := region.NewRedis(region.RedisConfig{URL: "redis://" + proxy.Addr(), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := region.NewRedis(region.RedisConfig{URL: shared, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return &proxiedRedis{proxy: proxy, via: via, direct: direct}
}

// total reads, directly, the region's total of q's cell at since plus the
// cell after it (a test may cross a window boundary).
func (p *proxiedRedis) total(t *testing.T, q service.Query, since int64) int64 {
	t.Helper()
	c := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier,
		Duration: q.Duration, Sequence: window.Sequence(since, q.Duration) + 1}
	next, cur, err := p.direct.Read(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return cur.Count + next.Count
}

// Close waits for the checks already running, here each waiting on a slow
// Redis read, before it replays: Redis ends with exactly what was admitted.
// Default settings (a 50ms read timeout); the proxy delays every byte 3ms
// so every check is still waiting on its read when Close begins, and is
// answered within the read timeout.
func TestCloseWaitsForChecksInFlightThenReplaysThem(t *testing.T) {
	pr := startProxiedRedis(t)
	pr.proxy.SetDelay(3 * time.Millisecond)
	svc := service.New(service.Config{Origin: pr.via})
	const checks = 64
	var (
		admitted atomic.Int64
		started  sync.WaitGroup
		done     sync.WaitGroup
	)
	qs := make([]service.Query, checks)
	for i := range qs {
		qs[i] = service.Query{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprintf("inflight-%d", i%8),
			Limit: 1_000_000, Duration: 60_000, Cost: 1}
	}
	now := time.Now().UnixMilli()
	for _, q := range qs {
		started.Add(1)
		done.Go(func() {
			started.Done()
			d, err := svc.Check(context.Background(), q)
			if err == nil && d.Admitted {
				admitted.Add(1)
			}
		})
	}
	started.Wait()
	time.Sleep(5 * time.Millisecond) // each goroutine is inside Check, waiting on its read
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := svc.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	done.Wait()
	if admitted.Load() == 0 {
		t.Fatal("no check was admitted: none was in flight at Close")
	}
	var inRedis int64
	for i := range 8 {
		inRedis += pr.total(t, qs[i], now)
	}
	if inRedis != admitted.Load() {
		t.Fatalf("Redis holds %d, the service admitted %d", inRedis, admitted.Load())
	}
}

// SIGTERM while Redis is down: the limiter does not wait out its shutdown
// timeout (default 10s). Once its replay breaker is open and a probe during
// shutdown fails, it logs one line saying how much cost Redis lacks and in
// how many cells, and exits 1. Default flags.
func TestSIGTERMWhileRedisIsDownExitsEarlySayingWhatIsLost(t *testing.T) {
	srv := startServer(t)
	pr := startProxiedRedis(t)
	lim := startProcess(t, "limiter", "--nats-url", srv.ClientURL(), "--region", "r1",
		"--redis-url", "redis://"+pr.proxy.Addr(), "--redis-prefix", redistest.Prefix(t), "--log-level", "warn")
	nc := connect(t, srv.ClientURL())
	waitService(t, nc, "ratelimit", instancesPerLimiter)
	c := bus.NewClient(nc)
	ctx := testContext(t)
	pr.proxy.SetMode(tcpproxy.Refuse)
	admitted := 0
	for i := range 200 {
		resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: fmt.Sprintf("down-%d", i%20),
			Limit: 1_000_000, Duration: 60_000, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Success {
			admitted++
		}
	}
	if admitted != 200 {
		t.Fatalf("admitted %d of 200 while Redis was down, want every check decided locally", admitted)
	}
	start := time.Now()
	code := lim.stop(t, syscall.SIGTERM, 8*time.Second)
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("exit %d, want 1: cost was not replayed", code)
	}
	out := lim.stderr.String()
	lines := strings.Count(out, "shutdown incomplete")
	if lines != 1 || !strings.Contains(out, "cells_not_settled=20") || !strings.Contains(out, "cost_never_sent=200") {
		t.Fatalf("want one 'shutdown incomplete' line naming 20 cells and 200 cost; stderr:\n%s", out)
	}
	t.Logf("exited %d after %v", code, took)
	if took > 4*time.Second {
		t.Fatalf("shutdown took %v with Redis down; want about the breaker's 1s open interval", took)
	}
}
