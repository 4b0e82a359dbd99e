package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/service"
)

// A limiter with a decision stream publishes every denial, and one
// admission in SampleAdmissions, as a DecisionEvent on its namespace's
// subject, with the reply's figures.
func TestTheDecisionStreamCarriesDenialsAndSampledAdmissions(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	stream := NewDecisionStream(nc, DecisionStreamConfig{Region: "eu", Limiter: "lim-1", SampleAdmissions: 2,
		Now: func() time.Time { return time.UnixMilli(1_700_000_000_000) }})
	svc := service.New(service.Config{Decisions: stream})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	watch := natstest.Connect(t, srv)
	events := make(chan *nats.Msg, 64)
	if _, err := watch.ChanSubscribe(wire.Subjects{}.DecisionsWildcard(), events); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	client := natstest.Connect(t, srv)
	for range 6 { // limit 2: admitted twice, denied four times
		if _, err := client.Request(wire.Subjects{}.Check("acme", "api"), []byte(`{"identifier":"k1","limit":2,"duration":60000,"cost":1}`), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []wire.DecisionEvent
	for len(got) < 5 {
		select {
		case m := <-events:
			if m.Subject != "ratelimit.decisions.acme.api" {
				t.Errorf("an event on %q", m.Subject)
			}
			var e wire.DecisionEvent
			if err := json.Unmarshal(m.Data, &e); err != nil {
				t.Fatalf("event %q: %v", m.Data, err)
			}
			got = append(got, e)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d events arrived, want 5 (1 admission of 2 sampled, 4 denials): %+v", len(got), got)
		}
	}
	if got[0].Outcome != wire.OutcomeAdmitted || got[0].Remaining != 0 {
		t.Errorf("first event %+v, want the second admission (remaining 0)", got[0])
	}
	for _, e := range got[1:] {
		want := wire.DecisionEvent{Workspace: "acme", Namespace: "api", Identifier: "k1", Outcome: wire.OutcomeDenied,
			Cost: 1, Limit: 2, Duration: 60000, Reset: e.Reset, RetryAfter: e.RetryAfter, Region: "eu", Limiter: "lim-1", At: 1_700_000_000_000}
		if e != want || e.RetryAfter <= 0 || e.Reset <= 0 {
			t.Errorf("denial event %+v, want %+v with a retry_after and reset", e, want)
		}
	}
	if stream.Published() != 5 || stream.Dropped() != 0 || stream.Failed() != 0 {
		t.Errorf("published %d, dropped %d, failed %d; want 5, 0, 0", stream.Published(), stream.Dropped(), stream.Failed())
	}
}

// When the stream's connection stops taking bytes, decisions keep being
// handed over without waiting: what the queue cannot hold is dropped and
// counted, never waited for.
func TestADecisionStreamThatLagsDropsAndCounts(t *testing.T) {
	srv := natstest.Server(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(srv.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.NoReconnect(),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the reset at the end is expected
	if err != nil {
		t.Fatal(err)
	}
	const buffer, n = 64, 100_000
	stream := NewDecisionStream(nc, DecisionStreamConfig{Buffer: buffer})
	t.Cleanup(func() {
		_ = proxy.Close() // the stalled socket first, so nothing waits on it
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stream.Close(ctx)
	})
	proxy.SetDelay(time.Hour) // nothing reaches the server: its buffers fill, then the connection's

	q := service.Query{Workspace: "acme", Namespace: "api", Identifier: "a-long-identifier-to-fill-the-socket-sooner-0123456789",
		Limit: 1, Duration: 60_000, Cost: 1}
	var d service.Decision
	d.Limit, d.RetryAfter = 1, 1000
	handed := make(chan struct{})
	go func() {
		defer close(handed)
		for range n {
			stream.Decided(q, d)
		}
	}()
	select {
	case <-handed:
	case <-time.After(time.Minute): // a bound for a hang, not a measure of speed
		t.Fatal("handing decisions to a stalled stream waits")
	}
	published, dropped := stream.Published(), stream.Dropped()
	if dropped == 0 {
		t.Fatalf("none of %d decisions was dropped (published %d) behind a stalled connection", n, published)
	}
	if published+dropped > n || published+dropped+buffer+1 < n {
		t.Errorf("published %d + dropped %d of %d decisions with a queue of %d: some went missing or counted twice", published, dropped, n, buffer)
	}
}

// Under load from 64 callers, every denial the callers were answered is
// either seen by a consumer of the stream or counted as dropped: none is
// lost silently, and none is published twice. The lag from decision to
// consumer is logged.
func TestEveryDenialUnderLoadIsSeenOrCounted(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	stream := NewDecisionStream(nc, DecisionStreamConfig{})
	svc := service.New(service.Config{Decisions: stream})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	watch := natstest.Connect(t, srv)
	var seen, maxLag atomic.Int64
	if _, err := watch.Subscribe(wire.Subjects{}.DecisionsWildcard(), func(m *nats.Msg) {
		var e wire.DecisionEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Outcome == wire.OutcomeDenied {
			seen.Add(1)
			lag := time.Now().UnixMilli() - e.At
			for old := maxLag.Load(); lag > old && !maxLag.CompareAndSwap(old, lag); old = maxLag.Load() {
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(watch.Flush(), nc.Flush()); err != nil {
		t.Fatal(err)
	}
	const callers, each = 64, 100
	var denied atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			client := natstest.Connect(t, srv)
			body := []byte(fmt.Sprintf(`{"identifier":"id%d","limit":10,"duration":60000,"cost":1}`, c%8))
			for range each {
				m, err := client.Request(wire.Subjects{}.Check("acme", "api"), body, 5*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if strings.Contains(string(m.Data), `"success":false`) {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err := stream.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for seen.Load()+stream.Dropped() < denied.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if want := int64(callers*each - 8*10); denied.Load() != want {
		t.Fatalf("the callers were denied %d checks, want %d", denied.Load(), want)
	}
	if got := seen.Load() + stream.Dropped(); got != denied.Load() {
		t.Errorf("seen %d + dropped %d denials, but %d were answered", seen.Load(), stream.Dropped(), denied.Load())
	}
	t.Logf("%d denials: %d seen, %d dropped; lag at most %d ms", denied.Load(), seen.Load(), stream.Dropped(), maxLag.Load())
}

// BenchmarkChecksWithDecisionEvents is 64 callers' denied checks through
// a limiter without a decision stream, and with one whose consumer has
// stopped (subscribed, never reading: the server cuts it as a slow
// consumer): the checks' p99 and the events dropped.
func BenchmarkChecksWithDecisionEvents(b *testing.B) {
	for _, events := range []bool{false, true} {
		b.Run(fmt.Sprintf("events=%v", events), func(b *testing.B) {
			srv := natstest.Server(b)
			nc := natstest.Connect(b, srv)
			cfg := service.Config{}
			var stream *DecisionStream
			if events {
				stream = NewDecisionStream(nc, DecisionStreamConfig{})
				cfg.Decisions = stream
				stopped := natstest.Connect(b, srv, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
				block := make(chan struct{})
				b.Cleanup(func() { close(block) })
				if _, err := stopped.Subscribe(wire.Subjects{}.DecisionsWildcard(), func(*nats.Msg) { <-block }); err != nil {
					b.Fatal(err)
				}
				if err := stopped.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			svc := service.New(cfg)
			defer svc.Close(context.Background())
			l, err := Serve(nc, LimiterConfig{Service: svc, Region: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Shutdown(context.Background())
			if err := nc.Flush(); err != nil {
				b.Fatal(err)
			}
			client := natstest.Connect(b, srv)
			body := wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: "over", Limit: 0, Duration: 60_000, Cost: 1})
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(32) // 64 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					if _, err := client.Request("ratelimit.check.bench.api", body, 5*time.Second); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			if stream != nil {
				b.ReportMetric(float64(stream.Dropped()), "dropped")
			}
		})
	}
}
