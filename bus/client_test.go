package bus_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// startNATS starts an embedded nats-server for the test and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv.ClientURL()
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// limiter is a real limiter (service plus micro endpoints) on its own
// connection, with default configuration.
type limiter struct {
	svc  *service.Service
	lim  *transport.Limiter
	once sync.Once
}

func startLimiter(t *testing.T, url string) *limiter {
	t.Helper()
	nc := connect(t, url)
	svc := service.New(service.Config{})
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	l := &limiter{svc: svc, lim: lim}
	t.Cleanup(func() { l.shutdown(t) })
	return l
}

// shutdown runs the limiter's shutdown path once: 503 to what still
// arrives, endpoints drained, service closed.
func (l *limiter) shutdown(t *testing.T) {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := errors.Join(l.lim.Shutdown(ctx), l.svc.Close(ctx)); err != nil {
			t.Errorf("limiter shutdown: %v", err)
		}
	})
}

func TestZeroCostCountsOneAndPeekCountsNothing(t *testing.T) {
	url := startNATS(t)
	startLimiter(t, url)
	for _, enc := range []bus.Encoding{bus.Msgpack, bus.JSON} {
		c := bus.NewClient(connect(t, url), bus.WithEncoding(enc))
		ctx := context.Background()
		id := "zero-" + enc.String()
		look, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 2, Duration: 60_000, Peek: true})
		if err != nil || !look.Success || look.Remaining != 2 {
			t.Fatalf("%v: peek on a fresh identifier = %+v, %v; want admitted with 2 remaining", enc, look, err)
		}
		for i, want := range []int64{1, 0} {
			resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 2, Duration: 60_000})
			if err != nil || !resp.Success || resp.Remaining != want {
				t.Fatalf("%v: check %d without a cost = %+v, %v; want admitted with %d remaining (cost 1)", enc, i, resp, err, want)
			}
		}
		resp, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 2, Duration: 60_000})
		if err != nil || resp.Success {
			t.Fatalf("%v: third check without a cost = %+v, %v; want denied", enc, resp, err)
		}
		br, err := c.Batch(ctx, "acme", []bus.BatchCheck{{Namespace: "web", CheckRequest: bus.CheckRequest{Identifier: id, Limit: 1, Duration: 60_000}}})
		if err != nil || !br.Success || br.Results[0].Remaining != 0 {
			t.Fatalf("%v: batch check without a cost = %+v, %v; want admitted with 0 of 1 remaining", enc, br, err)
		}
	}
}

func TestPeekWithACostIsRefusedBeforeSending(t *testing.T) {
	url := startNATS(t)
	c := bus.NewClient(connect(t, url)) // no limiter: a request sent would fail with no responders
	var bad *bus.BadRequestError
	_, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60_000, Cost: 2, Peek: true})
	if !errors.As(err, &bad) {
		t.Fatalf("peek with cost 2: %v, want a *BadRequestError", err)
	}
	_, err = c.Batch(context.Background(), "acme", []bus.BatchCheck{{Namespace: "api",
		CheckRequest: bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60_000, Cost: 2, Peek: true}}})
	if !errors.As(err, &bad) {
		t.Fatalf("batch with a peek of cost 2: %v, want a *BadRequestError", err)
	}
}

func TestCostAboveTheLimitIsDeniedForever(t *testing.T) {
	url := startNATS(t)
	startLimiter(t, url)
	for _, enc := range []bus.Encoding{bus.Msgpack, bus.JSON} {
		c := bus.NewClient(connect(t, url), bus.WithEncoding(enc))
		for _, r := range []bus.CheckRequest{
			{Identifier: "big-" + enc.String(), Limit: 5, Duration: 60_000, Cost: 6},
			{Identifier: "zero-" + enc.String(), Limit: 0, Duration: 60_000},
		} {
			resp, err := c.Check(context.Background(), "acme", "api", r)
			if err != nil || resp.Success || resp.RetryAfter != bus.RetryNever || !resp.Never() {
				t.Fatalf("%v: %+v = %+v, %v; want denied with retry_after %d", enc, r, resp, err, bus.RetryNever)
			}
		}
		resp, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "fits-" + enc.String(), Limit: 1, Duration: 60_000})
		if err != nil || resp.Never() {
			t.Fatalf("%v: an admitted check says never: %+v, %v", enc, resp, err)
		}
		resp, err = c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "fits-" + enc.String(), Limit: 1, Duration: 60_000})
		if err != nil || resp.Success || resp.RetryAfter <= 0 || resp.Never() {
			t.Fatalf("%v: a denial that a wait fixes = %+v, %v; want a positive retry_after", enc, resp, err)
		}
	}
}

// Two real limiters serve the queue group; one goes through its shutdown
// path while checks are in flight. Every check the shutting-down limiter
// answers 503 is sent again and decided by the other: callers see only
// decisions. The round repeats until the shutting-down limiter did answer
// some 503s, so the test always covers the retry.
func TestA503IsRetriedOnAnotherLimiter(t *testing.T) {
	url := startNATS(t)
	c := bus.NewClient(connect(t, url))
	for round := 1; ; round++ {
		if round > 20 {
			t.Fatal("in 20 rounds the shutting-down limiter never answered 503: the scenario did not happen")
		}
		stays := startLimiter(t, url)
		leaves := startLimiter(t, url)
		var (
			wg        sync.WaitGroup
			stop      atomic.Bool
			decisions atomic.Int64
			errs      = make(chan error, 64)
		)
		for range 8 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					_, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{
						Identifier: "retry", Limit: 1 << 40, Duration: 60_000})
					if err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
					decisions.Add(1)
				}
			})
		}
		for decisions.Load() < 200 {
			time.Sleep(time.Millisecond)
		}
		leaves.shutdown(t)
		for n := decisions.Load(); decisions.Load() < n+200; {
			time.Sleep(time.Millisecond)
			if len(errs) > 0 {
				break
			}
		}
		stop.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: a caller got an error while one of two limiters shut down: %v", round, err)
		}
		unavailable := leaves.lim.Stats().Unavailable
		stays.shutdown(t)
		if unavailable > 0 {
			t.Logf("round %d: %d checks answered 503 and retried; %d decisions", round, unavailable, decisions.Load())
			return
		}
	}
}

// A responder that always answers 503 (every limiter shutting down): the
// client sends a call at most its attempts, then returns the 503, and never
// past the caller's context.
func TestA503IsRetriedBoundedAndWithinTheContext(t *testing.T) {
	url := startNATS(t)
	calls := answer503(t, url, "ratelimit.check.acme.api")
	req := bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60_000}

	_, err := bus.NewClient(connect(t, url)).Check(context.Background(), "acme", "api", req)
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 503 || calls.Load() != bus.DefaultAttempts {
		t.Fatalf("always 503: %v after %d calls; want the 503 after %d calls", err, calls.Load(), bus.DefaultAttempts)
	}

	calls.Store(0)
	_, err = bus.NewClient(connect(t, url), bus.WithAttempts(1)).Check(context.Background(), "acme", "api", req)
	if !errors.As(err, &se) || se.Code != 503 || calls.Load() != 1 {
		t.Fatalf("one attempt: %v after %d calls; want the 503 after 1 call", err, calls.Load())
	}

	// The first pause (5ms) outlasts a 2ms context: one call, then the 503.
	calls.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = bus.NewClient(connect(t, url), bus.WithAttempts(100)).Check(ctx, "acme", "api", req)
	if err == nil || time.Since(start) > time.Second || calls.Load() > 1 {
		t.Fatalf("short context: %v after %v and %d calls; want an error within the context", err, time.Since(start), calls.Load())
	}
}

// A batch, and a check sent without coalescing, go through the same 503
// retry as a coalesced check: at most the client's attempts, never past
// the caller's deadline.
func TestA503IsRetriedAlikeOnEveryPath(t *testing.T) {
	url := startNATS(t)
	calls := answer503(t, url, "ratelimit.>")
	req := bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60_000, Cost: 1}
	nc := connect(t, url)
	c := bus.NewClient(nc, bus.WithCoalescing(false), bus.WithAttempts(3))
	// settle waits until the responder has counted every call sent so far:
	// its one subscription answers in order, so once a marker sent after
	// them is answered, they were counted (the last case's call, whose
	// caller gave up, may still be on its way otherwise).
	settle := func() { _, _ = nc.Request("ratelimit.settle", nil, 5*time.Second) }
	for name, call := range map[string]func(context.Context) error{
		"batch": func(ctx context.Context) error {
			_, err := c.Batch(ctx, "acme", []bus.BatchCheck{{Namespace: "api", CheckRequest: req}})
			return err
		},
		"check": func(ctx context.Context) error {
			_, err := c.Check(ctx, "acme", "api", req)
			return err
		},
	} {
		settle()
		calls.Store(0)
		var se *bus.ServiceError
		if err := call(context.Background()); !errors.As(err, &se) || se.Code != 503 || calls.Load() != 3 {
			t.Errorf("%s, always 503: %v after %d calls; want the 503 after 3", name, err, calls.Load())
		}
		// The first pause (5ms) outlasts a 2ms deadline: one call at most,
		// then an error within the deadline.
		calls.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		if err == nil || time.Since(start) > time.Second || calls.Load() > 1 {
			t.Errorf("%s, short deadline: %v after %v and %d calls; want an error within the deadline", name, err, time.Since(start), calls.Load())
		}
	}
}

// answer503 answers every request on subject with a 503 (a limiter shutting
// down) and returns how many it answered.
func answer503(t *testing.T, url, subject string) *atomic.Int64 {
	t.Helper()
	nc := connect(t, url)
	calls := new(atomic.Int64)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		calls.Add(1)
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set(micro.ErrorCodeHeader, "503")
		reply.Header.Set(micro.ErrorHeader, "limiter is shutting down")
		reply.Data = []byte(`{"error":"limiter is shutting down"}`)
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// A limiter's reply that does not decode is an error of the call, never a
// *BadRequestError: that type means arguments the client refused, which a
// caller may fix; a malformed reply is the limiter's fault. Checked for a
// check, a batch and an admin call, in both encodings.
func TestAMalformedReplyIsNoBadRequest(t *testing.T) {
	url := startNATS(t)
	nc := connect(t, url)
	sub, err := nc.Subscribe("ratelimit.>", func(m *nats.Msg) { _ = m.Respond([]byte{0xc1, '{', 0xff}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, enc := range []bus.Encoding{bus.Msgpack, bus.JSON} {
		c := bus.NewClient(connect(t, url), bus.WithEncoding(enc))
		ctx := t.Context()
		_, checkErr := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "u", Limit: 10, Duration: 60_000})
		_, batchErr := c.Batch(ctx, "acme", []bus.BatchCheck{{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "u", Limit: 10, Duration: 60_000}}})
		_, adminErr := c.GetOverride(ctx, "acme", "api", "u")
		for name, err := range map[string]error{"check": checkErr, "batch": batchErr, "admin": adminErr} {
			var bad *bus.BadRequestError
			if err == nil || errors.As(err, &bad) {
				t.Errorf("%v %s of a malformed reply: %v, want an error that is no *BadRequestError", enc, name, err)
			}
		}
	}
}
