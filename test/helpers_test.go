// Package test holds Sluice's end-to-end tests: limiters, clients and NATS
// servers (single servers and a three-region supercluster) in one process,
// talking over real TCP connections.
package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/service"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startServer(t *testing.T) *embedded.Server {
	t.Helper()
	e, err := natstest.StartServer(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

func startSupercluster(t *testing.T, regions ...string) *natstest.Supercluster {
	t.Helper()
	sc, err := natstest.StartSupercluster(testContext(t), regions...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	return sc
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// limiter is one limiter process's parts, in this test process.
type limiter struct {
	nc       *nats.Conn
	svc      *service.Service
	lim      *transport.Limiter
	stopOnce sync.Once
}

// startLimiter serves a limiter on its own connection to url. Shutdown runs
// at cleanup unless the test did it.
func startLimiter(t *testing.T, url, region string, cfg service.Config) *limiter {
	t.Helper()
	nc := connect(t, url)
	svc := service.New(cfg)
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: region})
	if err != nil {
		t.Fatal(err)
	}
	l := &limiter{nc: nc, svc: svc, lim: lim}
	t.Cleanup(func() { l.stop(t) })
	// Queue interest must reach the server before the first request.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// stop shuts the limiter down (once) and replays what is pending.
func (l *limiter) stop(t *testing.T) {
	l.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.lim.Shutdown(ctx); err != nil {
			t.Errorf("limiter shutdown: %v", err)
		}
		if err := l.svc.Close(ctx); err != nil {
			t.Errorf("service close: %v", err)
		}
	})
}

// checkUntil sends checks until one is answered or ctx ends: cross-region
// interest takes a moment to propagate after a limiter subscribes.
func checkUntil(ctx context.Context, t *testing.T, c *bus.Client, ws, ns string, r bus.CheckRequest) bus.CheckResponse {
	t.Helper()
	for {
		resp, err := c.Check(ctx, ws, ns, r)
		if err == nil {
			return resp
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no answer: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
