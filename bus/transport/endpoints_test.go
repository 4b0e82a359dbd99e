package transport

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// heldRequest is a micro.Request that records its answer: the endpoints'
// callbacks are called with it directly, as micro calls them with a message
// still buffered in a draining subscription after Shutdown began.
type heldRequest struct {
	subject string
	data    []byte
	mu      sync.Mutex
	code    string
}

func (r *heldRequest) Respond([]byte, ...micro.RespondOpt) error  { return nil }
func (r *heldRequest) RespondJSON(any, ...micro.RespondOpt) error { return nil }
func (r *heldRequest) Error(code, _ string, _ []byte, _ ...micro.RespondOpt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.code = code
	return nil
}
func (r *heldRequest) Data() []byte           { return r.data }
func (r *heldRequest) Headers() micro.Headers { return nil }
func (r *heldRequest) Subject() string        { return r.subject }
func (r *heldRequest) Reply() string          { return "" }

// A check or batch delivered to a limiter after Shutdown began (a message
// its draining subscription still held) is answered 503, not decided.
func TestChecksAfterShutdownBeganAre503(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for subject, handle := range map[string]micro.HandlerFunc{
		"ratelimit.check.acme.api": l.handleCheck, "ratelimit.batch.acme": l.handleBatch,
		"ratelimit.checks.acme": l.handleChecksMsg} {
		body := `{"identifier":"u","limit":1,"duration":60000}`
		if strings.Contains(subject, "batch") || strings.Contains(subject, "checks") {
			body = `{"checks":[{"namespace":"api","identifier":"u","limit":1,"duration":60000}]}`
		}
		req := &heldRequest{subject: subject, data: []byte(body)}
		handle(req)
		if req.code != "503" {
			t.Fatalf("%s after shutdown began: code %q, want 503", subject, req.code)
		}
	}
	if st := l.Stats(); st.Admitted+st.Denied != 0 {
		t.Fatalf("decided %+v after shutdown began", st)
	}
}

// Every check that reached the limiter before Shutdown is answered, with a
// decision or a 503, once the caller drains the connection as cmd/limiter
// does: replies waiting in the replier's batch are not lost, and every
// admitted check got its reply.
func TestShutdownAnswersEveryCheckItReceived(t *testing.T) {
	srv := natstest.Server(t)
	closed := make(chan struct{})
	nc := natstest.Connect(t, srv, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	client := natstest.Connect(t, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	// Once the flush returns, the server holds the endpoints' subscriptions:
	// no request below meets "no responders".
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const n = 5000
	var decided, unavailable, other atomic.Int64
	replies := make(chan struct{}, n)
	inbox := nats.NewInbox()
	sub, err := client.Subscribe(inbox+".*", func(m *nats.Msg) {
		switch code := m.Header.Get(micro.ErrorCodeHeader); code {
		case "":
			if r, err := wire.DecodeCheckResponse(wire.Msgpack, m.Data); err == nil && r.Success {
				decided.Add(1)
			} else if other.Add(1) == 1 {
				t.Logf("first unexpected reply: header %v, body %q", m.Header, m.Data)
			}
		case "503":
			unavailable.Add(1)
		default:
			if other.Add(1) == 1 {
				t.Logf("first unexpected reply: header %v, body %q", m.Header, m.Data)
			}
		}
		replies <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		body := wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: fmt.Sprintf("u%d", i%100), Limit: 1 << 40, Duration: 60_000, Cost: 1})
		if err := client.PublishRequest("ratelimit.check.acme.api", fmt.Sprintf("%s.%d", inbox, i), body); err != nil {
			t.Fatal(err)
		}
	}
	// Once the flush returns, the server has routed every request to the
	// limiter's subscription, which Shutdown drains.
	if err := client.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := nc.Drain(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the limiter's connection did not finish draining")
	}
	for got := 0; got < n; got++ {
		select {
		case <-replies:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d checks answered (%d decided, %d 503)", got, n, decided.Load(), unavailable.Load())
		}
	}
	if other.Load() != 0 {
		t.Fatalf("%d replies were neither an admission nor a 503", other.Load())
	}
	if s := l.Stats(); s.Admitted != decided.Load() {
		t.Fatalf("limiter admitted %d checks but %d admissions were answered", s.Admitted, decided.Load())
	}
	t.Logf("%d decided, %d answered 503", decided.Load(), unavailable.Load())
}

// A reply added after the replier closed is published at once, and closing
// twice is harmless.
func TestReplierPublishesAfterClose(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	sub, err := nc.SubscribeSync("late.reply")
	if err != nil {
		t.Fatal(err)
	}
	r := startReplier(nc.Publish, slog.New(slog.DiscardHandler))
	r.add("late.reply", wire.JSON, wire.CheckResponse{Success: true, Limit: 5, Remaining: 4, Reset: 60_000})
	for range 2 {
		if err := r.close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	r.add("late.reply", wire.JSON, wire.CheckResponse{Success: false, Limit: 5, Reset: 60_000, RetryAfter: 10})
	for _, want := range []bool{true, false} {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			t.Fatalf("reply (success %v) not published: %v", want, err)
		}
		got, err := wire.DecodeCheckResponse(wire.JSON, m.Data)
		if err != nil || got.Success != want {
			t.Fatalf("reply %s: %+v, %v; want success %v", m.Data, got, err, want)
		}
	}
}

// Closing the replier while its goroutine is busy publishing and the
// pending batch is full (maxPendingReplies) still stops the replier:
// every reply added before or after close is published and close returns.
// The replier's goroutine is held in its first publish, as a connection
// whose flusher holds its lock would hold it.
func TestReplierCloseWithAFullBatchPublishesEverythingAndReturns(t *testing.T) {
	var (
		mu        sync.Mutex
		published = map[string]int{}
		calls     atomic.Int64
		entered   = make(chan struct{})
		gate      = make(chan struct{})
	)
	pub := func(subject string, _ []byte) error {
		if calls.Add(1) == 1 { // the goroutine's first flush
			close(entered)
			<-gate
		}
		mu.Lock()
		published[subject]++
		mu.Unlock()
		return nil
	}
	r := startReplier(pub, slog.New(slog.DiscardHandler))
	resp := wire.CheckResponse{Success: true, Limit: 10, Remaining: 9}
	r.add("first", wire.Msgpack, resp)
	<-entered
	const over = 10
	for i := range maxPendingReplies + over { // the batch fills; the rest go at once
		r.add(fmt.Sprintf("pending.%d", i), wire.Msgpack, resp)
	}
	// While the goroutine is held, close gives up when its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.close(ctx); err == nil {
		t.Fatal("close returned nil while a batch was still being published")
	}
	close(gate)
	closed := make(chan error, 1)
	go func() { closed <- r.close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not return: the replier's goroutine never stopped")
	}
	r.add("late", wire.Msgpack, resp)
	mu.Lock()
	defer mu.Unlock()
	want := maxPendingReplies + over + 2
	if len(published) != want {
		t.Fatalf("%d distinct replies published, want %d", len(published), want)
	}
	for s, n := range published {
		if n != 1 {
			t.Fatalf("reply %s published %d times", s, n)
		}
	}
}
