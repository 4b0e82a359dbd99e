package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

// holdingOrigin is the real Redis, but for the syncs of workspace hold,
// which it holds until release is closed (or their context ends): a test
// seam that keeps a tenant's checks waiting on the origin for as long as
// the test needs, while every other tenant's syncs reach Redis at once.
type holdingOrigin struct {
	*region.Redis
	hold    string
	release chan struct{}
	held    atomic.Int64 // syncs held so far
}

func (o *holdingOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if s.Cell.Workspace == o.hold && !s.ReportOnly {
		o.held.Add(1)
		select {
		case <-o.release:
		case <-ctx.Done():
			return region.SyncResult{}, ctx.Err()
		}
	}
	return o.Redis.Sync(ctx, reporter, s)
}

// sharedRedis returns an origin on the shared Redis under prefix, closed
// at the end of the test.
func sharedRedis(t *testing.T, prefix string) *region.Redis {
	t.Helper()
	o, err := region.NewRedis(region.RedisConfig{URL: redistest.SharedURL(t), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// startService starts a Service, closed at the end of the test.
func startService(t *testing.T, cfg service.Config) *service.Service {
	t.Helper()
	svc := service.New(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = svc.Close(ctx)
	})
	return svc
}

// One checks message of 1,000 cold identifiers from
// tenant "bulk" must not leave another tenant's waiting checks to be
// decided from local counts. A limiter at default LimiterConfig
// (MaxWaiting 1024) on the real Redis receives bulk's message, whose 1,000
// checks all wait on Redis (the test holds bulk's syncs until the end), and
// then 50 single checks of tenant "acme", each on a cold identifier of
// limit 1 that another limiter of the region already spent in Redis. Each
// acme check must be decided by Redis: denied. Decided locally, from this
// limiter's count of 0, it would be admitted.
func TestABulkChecksMessageLeavesOtherTenantsWaitingOnRedis(t *testing.T) {
	const (
		bulkChecks = 1000
		acmeChecks = 50
		hour       = 3_600_000
	)
	prefix := redistest.Prefix(t)
	srv := natstest.Server(t)
	o := &holdingOrigin{Redis: sharedRedis(t, prefix), hold: "bulk", release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(o.release)
		}
	}
	defer release()
	// ReadTimeout 10s (as redisService): what is decided while Redis
	// answers, not a sync timing out, is what the test is about.
	svc := startService(t, service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	l := serveLimiter(t, srv, svc) // LimiterConfig's defaults: MaxWaiting 1024, CheckTimeout 1s

	// Another limiter of the region spends each acme identifier's limit.
	other := startService(t, service.Config{Origin: sharedRedis(t, prefix)})
	acmeID := func(i int) string { return fmt.Sprintf("acme-%d", i) }
	for i := range acmeChecks {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := other.Check(ctx, service.Query{Workspace: "acme", Namespace: "api", Identifier: acmeID(i), Limit: 1, Duration: hour, Cost: 1})
		cancel()
		if err != nil || !d.Admitted {
			t.Fatalf("pre-charging %s through another limiter: %+v %v", acmeID(i), d, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := other.Close(ctx); err != nil {
		t.Fatalf("the other limiter settling with Redis: %v", err)
	}
	cancel()

	client := natstest.Connect(t, srv)
	checks := make([]wire.BatchCheck, bulkChecks)
	for i := range checks {
		checks[i] = wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{
			Identifier: fmt.Sprintf("bulk-%d", i), Limit: 10, Duration: hour, Cost: 1}}
	}
	bulk := make(chan *nats.Msg, 1)
	bulkErr := make(chan error, 1)
	go func() {
		m, err := client.Request("ratelimit.checks.bulk", wire.AppendChecksRequest(nil, wire.Msgpack, checks), 60*time.Second)
		if err != nil {
			bulkErr <- err
			return
		}
		bulk <- m
	}()
	// bulk's checks wait on Redis: as many as the limiter lets wait, once
	// that number has stopped growing.
	deadline := time.Now().Add(20 * time.Second)
	for last, since := int64(0), time.Now(); ; time.Sleep(time.Millisecond) {
		n := o.held.Load()
		if n != last {
			last, since = n, time.Now()
		}
		if n > 0 && time.Since(since) >= 50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bulk's message: %d checks waiting on Redis after 20s", n)
		}
	}
	bulkEP, _ := l.EndpointStats("checks")
	waitingBefore, heldBefore := l.gate.Len(), o.held.Load()

	type result struct {
		r   wire.CheckResponse
		err error
	}
	results := make([]result, acmeChecks)
	var wg sync.WaitGroup
	for i := range acmeChecks {
		wg.Go(func() {
			body := wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: acmeID(i), Limit: 1, Duration: hour, Cost: 1})
			m, err := client.Request("ratelimit.check.acme.api", body, 30*time.Second)
			if err != nil {
				results[i].err = err
				return
			}
			if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
				results[i].err = fmt.Errorf("error reply %s: %s", code, m.Header.Get(micro.ErrorHeader))
				return
			}
			results[i].r, results[i].err = wire.DecodeCheckResponse(wire.Msgpack, m.Data)
		})
	}
	wg.Wait()
	checkEP, _ := l.EndpointStats("check")
	admitted := 0
	for i, res := range results {
		switch {
		case res.err != nil:
			t.Errorf("acme check %d: %v", i, res.err)
		case res.r.Success:
			admitted++
		}
	}
	t.Logf("acme: %d checks sent while %d of bulk's checks waited on Redis (limiter: %d waiting, bulk's endpoint %+v): %d admitted, check endpoint %+v; origin %+v",
		acmeChecks, heldBefore, waitingBefore, bulkEP, admitted, checkEP, svc.Stats())
	if admitted != 0 {
		t.Errorf("acme: %d of %d checks admitted on identifiers whose limit of 1 another limiter spent: decided from this limiter's count of 0, not by Redis",
			admitted, acmeChecks)
	}
	if checkEP.NotWaited != 0 {
		t.Errorf("acme: %d checks decided locally without waiting on Redis (NotWaited) while bulk's message waited", checkEP.NotWaited)
	}

	release()
	select {
	case err := <-bulkErr:
		t.Fatalf("bulk's message: %v", err)
	case m := <-bulk:
		r, err := wire.DecodeChecksResponse(wire.Msgpack, m.Data)
		if err != nil || len(r.Results) != bulkChecks {
			t.Fatalf("bulk's reply: %d results, %v", len(r.Results), err)
		}
		ok := 0
		for _, res := range r.Results {
			if res.Success {
				ok++
			}
		}
		checksEP, _ := l.EndpointStats("checks")
		t.Logf("bulk: %d of %d admitted, checks endpoint %+v", ok, bulkChecks, checksEP)
	}
}
