package rls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

// heldRedis is the real Redis, except that the request-path syncs of
// identifiers starting with hold wait until release is closed, and every
// settle round fails while failSettle is set.
type heldRedis struct {
	*region.Redis
	hold       string
	release    chan struct{}
	held       atomic.Int64
	failSettle atomic.Bool
}

var errSettleRefused = errors.New("settle refused by the test")

func (o *heldRedis) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if strings.HasPrefix(s.Cell.Identifier, o.hold) && !s.ReportOnly {
		o.held.Add(1)
		select {
		case <-o.release:
		case <-ctx.Done():
			return region.SyncResult{}, ctx.Err()
		}
	}
	return o.Redis.Sync(ctx, reporter, s)
}

func (o *heldRedis) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	if o.failSettle.Load() {
		return nil, errSettleRefused
	}
	return o.Redis.Settle(ctx, reporter, ss)
}

const waitingConfig = `
domain: w
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
`

// The server counts against MaxWaiting only the calls
// that wait on the origin. With MaxWaiting calls waiting on Redis (cold
// identifiers whose syncs the test holds), 64 concurrent calls on a warm
// identifier far from its limit, whose lease covers them, are still
// decided from the lease, as TryCheck decides them: none is decided from
// local state (CheckLocal), which admits without Redis having charged the
// cost. The observable: what was admitted uncovered by a lease is what
// the service cannot hand on while Redis refuses its settle rounds, so
// Close then reports it as never sent (PendingError.Unsent).
func TestCallsDecidedWithoutWaitingDoNotCountAgainstMaxWaiting(t *testing.T) {
	const maxWaiting, calls = 4, 64
	o, err := region.NewRedis(region.RedisConfig{URL: redistest.SharedURL(t), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	origin := &heldRedis{Redis: o, hold: "user=cold-", release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(origin.release)
		}
	}
	defer release()
	// ReadTimeout and CheckTimeout 10s: the cold calls wait on Redis until
	// the test releases them, never decided by a timeout.
	svc := service.New(service.Config{Origin: origin, ReadTimeout: 10 * time.Second})
	closed := false
	defer func() {
		if !closed {
			_ = svc.Close(context.Background())
		}
	}()
	conf, err := Parse(File{Name: "w.yaml", Data: []byte(waitingConfig)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: svc, MaxWaiting: maxWaiting, CheckTimeout: 10 * time.Second}, conf)
	if err != nil {
		t.Fatal(err)
	}
	call := func(user string) (*rlsv3.RateLimitResponse, error) {
		return srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "w",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
	}

	// Warm: a steady rate for 300 ms, so the identifier holds a lease that
	// covers far more than 64 calls (twice its rate over a second).
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; time.Sleep(500 * time.Microsecond) {
		if r, err := call("warm"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("warming: %v %v", r, err)
		}
	}
	// A settle round tops the lease up: wait for it (a loaded machine may
	// take longer than the usual 10 ms), warming on.
	q := service.Query{Workspace: DefaultWorkspace, Namespace: "w", Identifier: "user=warm", Limit: 1_000_000, Duration: 60_000, Cost: 1}
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, ok, err := svc.TryCheck(q)
		if ok && err == nil && d.Admitted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after warming, the lease does not cover a call (TryCheck: %+v %v %v)", d, ok, err)
		}
		if r, err := call("warm"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("warming: %v %v", r, err)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The domain's share of MaxWaiting (three quarters, alone) waits on
	// Redis.
	waiters := int64(maxWaiting - maxWaiting/4)
	var cold sync.WaitGroup
	coldErrs := make(chan error, waiters)
	for i := range waiters {
		cold.Go(func() {
			if r, err := call(fmt.Sprint("cold-", i)); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				coldErrs <- fmt.Errorf("cold call %d: %v %v", i, r, err)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); origin.held.Load() < waiters; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d cold calls wait on Redis after 10s", origin.held.Load(), waiters)
		}
	}
	// From here on Redis takes no settle round: an admission the lease did
	// not cover stays unsent, and Close says how much.
	origin.failSettle.Store(true)

	var ok, over atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			<-start
			r, err := call("warm")
			switch {
			case err != nil:
				errs <- err
			case r.OverallCode == rlsv3.RateLimitResponse_OK:
				ok.Add(1)
			default:
				over.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ok.Load() != calls {
		t.Errorf("%d of %d warm calls admitted (%d over), want every one: the limit is far", ok.Load(), calls, over.Load())
	}

	// The cold calls are decided by Redis (granted), nothing uncovered.
	release()
	cold.Wait()
	close(coldErrs)
	for err := range coldErrs {
		t.Error(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = svc.Close(ctx)
	closed = true
	var pe *service.PendingError
	switch {
	case err == nil:
	case errors.As(err, &pe):
		t.Logf("Close with settle refused: %v", err)
		if pe.Unsent != 0 {
			t.Errorf("%d of %d warm calls were decided from local state (admitted without Redis charging them: "+
				"PendingError.Unsent %d), want every one decided from the lease: the %d calls waiting on Redis filled the domain's share of MaxWaiting %d",
				pe.Unsent, calls, pe.Unsent, waiters, maxWaiting)
		}
	default:
		t.Fatalf("Close: %v", err)
	}
}
