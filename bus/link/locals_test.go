package link

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// localLimiter is a limiter of region "r" wired as cmd/limiter wires one
// with a shared Redis: its Global shares the origin and carries its
// local counts. Its checks come on a subject prefix of its own (name),
// so that the test knows which limiter decides them.
type localLimiter struct {
	svc  *service.Service
	link *Global
	nc   *nats.Conn
}

func startLocalLimiter(t *testing.T, srv *embedded.Server, name, redisURL, prefix string) *localLimiter {
	t.Helper()
	o, err := region.NewRedis(region.RedisConfig{URL: redisURL, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	nc := natstest.Connect(t, srv)
	link := NewGlobal(nc, wire.Subjects{}, "r", nil)
	link.ShareOrigin()
	svc := service.New(service.Config{Origin: region.NewBreaker(o, region.BreakerConfig{}), Global: link, Locals: link, Region: "r"})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = svc.Close(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := link.Attach(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	l, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "r", Subjects: wire.Subjects{Prefix: name}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Shutdown(context.Background()) })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &localLimiter{svc: svc, link: link, nc: nc}
}

// A limiter whose Redis refuses decides locally; it dies (its NATS
// connection gone, nothing more reported) before Redis is back. Its
// region's other limiter heard each local count before the decision went
// out, and raises the real Redis to it: Redis holds every admission. A
// malformed local count, and one stamped beyond the clock-skew tolerance,
// are dropped and counted, and change nothing.
func TestLocalCountsOfADeadLimiterReachRedisThroughAnother(t *testing.T) {
	srv := natstest.Server(t)
	shared := redistest.SharedURL(t)
	prefix := redistest.Prefix(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(shared, "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.SetMode(tcpproxy.Refuse)
	dying := startLocalLimiter(t, srv, "dying", "redis://"+proxy.Addr(), prefix)
	survivor := startLocalLimiter(t, srv, "survivor", shared, prefix)

	// Bad input first: neither changes anything, both are counted.
	pub := natstest.Connect(t, srv)
	if err := pub.Publish("ratelimit.local.r", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	id := "local-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	now := time.Now().UnixMilli()
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 3_600_000, Sequence: now / 3_600_000}
	skewed := nats.NewMsg("ratelimit.local.r")
	skewed.Data = event.AppendComponents(nil, []global.Component{{Cell: cell, Region: "f00d", Count: 1000, ExpireAt: cell.Expiry(60_000)}})
	skewed.Header.Set(SentAtHeader, strconv.FormatInt(now-time.Hour.Milliseconds(), 10))
	if err := pub.PublishMsg(skewed); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}

	c := bus.NewClient(pub, bus.WithSubjectPrefix("dying"))
	const n = 40
	ctx := context.Background()
	for range n {
		resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 1000, Duration: 3_600_000, Cost: 1})
		if err != nil || !resp.Success {
			t.Fatalf("a check while Redis refuses: %+v, %v", resp, err)
		}
	}
	if got := dying.svc.Stats().AdmittedLocally; got != n {
		t.Fatalf("the dying limiter admitted %d locally, want %d", got, n)
	}
	// It dies: nothing it holds reaches Redis from it any more.
	dying.nc.Close()

	direct, err := region.NewRedis(region.RedisConfig{URL: shared, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		cur, _, err := direct.Read(ctx, cell)
		if err != nil {
			t.Fatal(err)
		}
		if cur.Count == n {
			break
		}
		if cur.Count > n || time.Now().After(deadline) {
			t.Fatalf("Redis counts %d; the dead limiter admitted %d (the survivor raised %d local counts, holds %d)",
				cur.Count, n, survivor.svc.Stats().LocalsRaised, survivor.svc.Stats().LocalsWaiting)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := survivor.link.Dropped(); got != 1 {
		t.Errorf("the survivor dropped %d malformed messages, want 1", got)
	}
	refused := int64(0)
	for r, k := range survivor.svc.Refused() {
		if r.Source == "limiters" && r.Reason == global.Reason(global.ErrClockSkew) {
			refused += k
		}
	}
	if refused != 1 {
		t.Errorf("the survivor refused %d skewed local counts, want 1 (%v)", refused, survivor.svc.Refused())
	}
	// The survivor still serves, and counts from Redis's view.
	resp, err := bus.NewClient(pub, bus.WithSubjectPrefix("survivor")).Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 1000, Duration: 3_600_000, Cost: 1})
	if err != nil || !resp.Success || resp.Remaining != 1000-n-1 {
		t.Fatalf("a check through the survivor: %+v, %v; want admitted with %d left", resp, err, 1000-n-1)
	}
}

// What a local admission adds on the NATS side: one local count encoded
// and queued on the connection (the limiter's subscribers, none here, are
// the server's work).
func BenchmarkPublishLocal(b *testing.B) {
	srv := natstest.Server(b)
	link := NewGlobal(natstest.Connect(b, srv), wire.Subjects{}, "r", nil)
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "user_1234567890abcdef", Duration: 60_000,
		Sequence: time.Now().UnixMilli() / 60_000}
	exp := cell.Expiry(60_000)
	b.ReportAllocs()
	n := int64(0)
	for b.Loop() {
		n++
		link.PublishLocal(cell, "0123456789abcdef", n, exp)
	}
}
