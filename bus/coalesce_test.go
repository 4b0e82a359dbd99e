package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// startLimiterAt is startLimiter serving the subject prefix prefix.
func startLimiterAt(t *testing.T, url, prefix string, svc *service.Service) *transport.Limiter {
	t.Helper()
	nc := connect(t, url)
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "local", Subjects: wire.Subjects{Prefix: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lim.Shutdown(ctx)
		_ = svc.Close(ctx)
	})
	return lim
}

// relayed is one request that reached the relay.
type relayed struct {
	subject string // without the relay's prefix, e.g. "checks.acme"
	checks  int    // checks it carries
	forward chan string
}

// relay stands between clients and real limiters at the NATS level: it
// serves the subject prefix "gate", hands every request to the test, and
// forwards it to the limiters of the prefix the test names (or drops it,
// for ""), relaying their reply back.
type relay struct {
	arrived chan *relayed
}

func startRelay(t *testing.T, url string) *relay {
	t.Helper()
	nc := connect(t, url)
	r := &relay{arrived: make(chan *relayed, 1024)}
	sub, err := nc.Subscribe("gate.>", func(m *nats.Msg) {
		rest := strings.TrimPrefix(m.Subject, "gate.")
		n := 1
		if strings.HasPrefix(rest, "checks.") {
			items, err := wire.DecodeChecksRequestView(wire.Msgpack, m.Data, nil)
			if err != nil {
				t.Errorf("relay: %v", err)
			}
			n = len(items)
		}
		rd := &relayed{subject: rest, checks: n, forward: make(chan string, 1)}
		r.arrived <- rd
		go func() {
			prefix := <-rd.forward
			if prefix == "" {
				return // lost
			}
			fwd := &nats.Msg{Subject: prefix + "." + rest, Data: m.Data, Header: m.Header}
			resp, err := nc.RequestMsg(fwd, 5*time.Second)
			if err != nil {
				t.Errorf("relay: %v", err)
				return
			}
			_ = nc.PublishMsg(&nats.Msg{Subject: m.Reply, Data: resp.Data, Header: resp.Header})
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// next returns the next request to reach the relay.
func (r *relay) next(t *testing.T) *relayed {
	t.Helper()
	select {
	case rd := <-r.arrived:
		return rd
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the relay")
		return nil
	}
}

type outcome struct {
	resp bus.CheckResponse
	err  error
}

// goCheck runs c.Check in a goroutine and returns where its outcome lands.
func goCheck(ctx context.Context, c *bus.Client, id string) chan outcome {
	out := make(chan outcome, 1)
	go func() {
		r, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: id, Limit: 10, Duration: 3_600_000})
		out <- outcome{r, err}
	}()
	return out
}

func waitQueued(t *testing.T, c *bus.Client, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); bus.Queued(c, "acme") != n; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", bus.Queued(c, "acme"), n)
		}
	}
}

// used returns how much of id's limit of 10 the limiters at prefix have
// counted.
func used(t *testing.T, url, prefix, id string) int64 {
	t.Helper()
	c := bus.NewClient(connect(t, url), bus.WithSubjectPrefix(prefix), bus.WithCoalescing(false))
	r, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: id, Limit: 10, Duration: 3_600_000, Peek: true})
	if err != nil {
		t.Fatal(err)
	}
	return 10 - r.Remaining
}

// A lone caller's checks leave at once, one by one on the check subject;
// callers that find the lane's one slot taken wait and then leave together
// in one checks message; a caller whose context ends while its call waits
// in the queue is taken out (nothing sent, nothing counted), and one whose
// context ends while its message is in flight gets its error while the
// others of the message get their results; a message whose callers all
// gave up (its reply lost) frees its slot.
func TestCoalescingJoinsOnlyWhatWaitsAndContextsBoundEachCall(t *testing.T) {
	url := startNATS(t)
	startLimiterAt(t, url, "ratelimit", service.New(service.Config{}))
	r := startRelay(t, url)
	c := bus.NewClient(connect(t, url), bus.WithSubjectPrefix("gate"), bus.WithCoalesceLimits(100, 1))
	ctx := context.Background()

	// Alone: each check on its own, at once.
	for i := range 3 {
		out := goCheck(ctx, c, "alone")
		rd := r.next(t)
		if rd.subject != "check.acme.api" {
			t.Fatalf("lone call %d sent on %q, want the check subject", i, rd.subject)
		}
		rd.forward <- "ratelimit"
		if o := <-out; o.err != nil || !o.resp.Success || o.resp.Remaining != int64(9-i) {
			t.Fatalf("lone call %d: %+v", i, o)
		}
	}

	// A holds the slot; B, C, D wait; B gives up while queued.
	outA := goCheck(ctx, c, "a")
	rdA := r.next(t)
	ctxB, cancelB := context.WithCancel(ctx)
	outB := goCheck(ctxB, c, "b")
	waitQueued(t, c, 1)
	ctxC, cancelC := context.WithCancel(ctx)
	outC := goCheck(ctxC, c, "c")
	waitQueued(t, c, 2)
	outD := goCheck(ctx, c, "d")
	waitQueued(t, c, 3)
	cancelB()
	if o := <-outB; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("B gave up while queued: %+v, want context.Canceled", o)
	}
	waitQueued(t, c, 2)
	rdA.forward <- "ratelimit"
	if o := <-outA; o.err != nil || !o.resp.Success {
		t.Fatalf("A: %+v", o)
	}
	rdCD := r.next(t)
	if rdCD.subject != "checks.acme" || rdCD.checks != 2 {
		t.Fatalf("after A: %q with %d checks, want one checks message with C and D", rdCD.subject, rdCD.checks)
	}
	cancelC() // C gives up while its message is in flight
	if o := <-outC; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("C gave up in flight: %+v, want context.Canceled", o)
	}
	rdCD.forward <- "ratelimit"
	if o := <-outD; o.err != nil || !o.resp.Success || o.resp.Remaining != 9 {
		t.Fatalf("D: %+v", o)
	}
	for id, want := range map[string]int64{"a": 1, "b": 0, "c": 1, "d": 1} {
		if got := used(t, url, "ratelimit", id); got != want {
			t.Errorf("%s: %d counted, want %d", id, got, want)
		}
	}

	// E's message is lost; once E gives up, F leaves at once.
	ctxE, cancelE := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelE()
	outE := goCheck(ctxE, c, "e")
	r.next(t).forward <- ""
	if o := <-outE; !errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("E, reply lost: %+v, want context.DeadlineExceeded", o)
	}
	outF := goCheck(ctx, c, "f")
	rdF := r.next(t)
	rdF.forward <- "ratelimit"
	if o := <-outF; o.err != nil || !o.resp.Success || rdF.subject != "check.acme.api" {
		t.Fatalf("F after a lost reply: %+v on %q", o, rdF.subject)
	}
}

// At the default limits: calls behind a message in flight leave beside it
// once it is late, which before any reply is after the 250µs floor, up to
// four messages in flight, past which they wait for a reply; a lane that
// has learned a slow round trip (a reply after 250ms: late after a second)
// keeps the calls behind a message until its reply, and they leave
// together; a queue that fills a message leaves at once.
func TestCallsWaitForAReplyUnlessTheMessageInFlightIsLate(t *testing.T) {
	url := startNATS(t)
	startLimiterAt(t, url, "ratelimit", service.New(service.Config{}))
	r := startRelay(t, url)
	ctx := context.Background()

	// Late: held messages are passed, up to four in flight.
	late := bus.NewClient(connect(t, url), bus.WithSubjectPrefix("gate"))
	var held []*relayed
	var outs []chan outcome
	for i := range 4 {
		outs = append(outs, goCheck(ctx, late, fmt.Sprint("held-", i)))
		held = append(held, r.next(t)) // the ones before it are still held
	}
	outE := goCheck(ctx, late, "e")
	waitQueued(t, late, 1)
	if n := bus.InFlight(late, "acme"); n != 4 {
		t.Fatalf("%d messages in flight, want the limit of 4", n)
	}
	held[2].forward <- "ratelimit"
	rdE := r.next(t)
	if rdE.subject != "check.acme.api" {
		t.Fatalf("after a reply: %q with %d checks, want E alone", rdE.subject, rdE.checks)
	}
	rdE.forward <- "ratelimit"
	for i, rd := range held {
		if i != 2 {
			rd.forward <- "ratelimit"
		}
	}
	for i, out := range append(outs, outE) {
		if o := <-out; o.err != nil || !o.resp.Success || o.resp.Remaining != 9 {
			t.Fatalf("call %d: %+v", i, o)
		}
	}

	// learnSlow makes c's lane see a reply take 250ms.
	learnSlow := func(c *bus.Client, id string) {
		out := goCheck(ctx, c, id)
		rd := r.next(t)
		time.Sleep(250 * time.Millisecond) // a slow path, not a window
		rd.forward <- "ratelimit"
		if o := <-out; o.err != nil || !o.resp.Success {
			t.Fatalf("%s: %+v", id, o)
		}
	}

	// Not late: B and C wait for A's reply and leave together.
	c := bus.NewClient(connect(t, url), bus.WithSubjectPrefix("gate"))
	learnSlow(c, "slow-1")
	outA := goCheck(ctx, c, "a")
	rdA := r.next(t)
	outB := goCheck(ctx, c, "b")
	waitQueued(t, c, 1)
	outC := goCheck(ctx, c, "c")
	waitQueued(t, c, 2)
	if n := bus.InFlight(c, "acme"); n != 1 {
		t.Fatalf("%d messages in flight behind a message that is not late, want 1", n)
	}
	rdA.forward <- "ratelimit"
	rdBC := r.next(t)
	if rdBC.subject != "checks.acme" || rdBC.checks != 2 {
		t.Fatalf("after A's reply: %q with %d checks, want B and C together", rdBC.subject, rdBC.checks)
	}
	rdBC.forward <- "ratelimit"
	for name, out := range map[string]chan outcome{"a": outA, "b": outB, "c": outC} {
		if o := <-out; o.err != nil || !o.resp.Success || o.resp.Remaining != 9 {
			t.Fatalf("%s: %+v", name, o)
		}
	}

	// A full message leaves at once, beside the one in flight.
	full := bus.NewClient(connect(t, url), bus.WithSubjectPrefix("gate"), bus.WithCoalesceLimits(2, 4))
	learnSlow(full, "slow-2")
	outD := goCheck(ctx, full, "d")
	rdD := r.next(t)
	outF := goCheck(ctx, full, "f")
	waitQueued(t, full, 1)
	outG := goCheck(ctx, full, "g")
	rdFG := r.next(t)
	if rdFG.subject != "checks.acme" || rdFG.checks != 2 {
		t.Fatalf("a full queue: %q with %d checks, want F and G at once", rdFG.subject, rdFG.checks)
	}
	rdFG.forward <- "ratelimit"
	rdD.forward <- "ratelimit"
	for name, out := range map[string]chan outcome{"d": outD, "f": outF, "g": outG} {
		if o := <-out; o.err != nil || !o.resp.Success {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "held-0", "held-3"} {
		if got := used(t, url, "ratelimit", id); got != 1 {
			t.Errorf("%s: %d counted, want 1", id, got)
		}
	}
}

// A checks message whose limiter answers 503 for some of its checks (its
// service closed) and 400 for a bad one: only the 503 ones are sent again,
// to a healthy limiter, and each caller gets its own result; nothing is
// counted twice.
func TestA503ResultRetriesOnlyTheChecksItConcerns(t *testing.T) {
	url := startNATS(t)
	closing := service.New(service.Config{})
	startLimiterAt(t, url, "one", closing)
	if err := closing.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	startLimiterAt(t, url, "two", service.New(service.Config{}))
	r := startRelay(t, url)
	c := bus.NewClient(connect(t, url), bus.WithSubjectPrefix("gate"), bus.WithCoalesceLimits(100, 1))
	ctx := context.Background()

	outA := goCheck(ctx, c, "a") // holds the slot
	rdA := r.next(t)
	outs := map[string]chan outcome{}
	for i, id := range []string{"x", "y", "z"} {
		outs[id] = goCheck(ctx, c, id)
		waitQueued(t, c, i+1)
	}
	bad := make(chan outcome, 1)
	go func() {
		r, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: strings.Repeat("i", 513), Limit: 10, Duration: 3_600_000})
		bad <- outcome{r, err}
	}()
	waitQueued(t, c, 4)
	rdA.forward <- "two"
	if o := <-outA; o.err != nil || !o.resp.Success {
		t.Fatalf("A: %+v", o)
	}
	rd := r.next(t)
	if rd.subject != "checks.acme" || rd.checks != 4 {
		t.Fatalf("%q with %d checks, want x, y, z and the bad one together", rd.subject, rd.checks)
	}
	rd.forward <- "one" // 503 for x, y, z; 400 for the bad one
	var se *bus.ServiceError
	if o := <-bad; !errors.As(o.err, &se) || se.Code != 400 || se.Description != "identifier must be 1 to 512 bytes, got 513" {
		t.Fatalf("bad check: %+v", o)
	}
	again := r.next(t)
	if again.subject != "checks.acme" || again.checks != 3 {
		t.Fatalf("sent again: %q with %d checks, want x, y and z only", again.subject, again.checks)
	}
	again.forward <- "two"
	for id, out := range outs {
		if o := <-out; o.err != nil || !o.resp.Success || o.resp.Remaining != 9 {
			t.Fatalf("%s: %+v", id, o)
		}
		if got := used(t, url, "two", id); got != 1 {
			t.Fatalf("%s counted %d times", id, got)
		}
	}
}

// Many goroutines share one client and a few identifiers of two
// workspaces: coalesced into checks messages, the checks admit exactly each
// identifier's limit in each workspace, as the same checks sent one by one
// would (a lane of one workspace carrying another's checks fails it).
func TestCoalescedChecksAdmitExactlyTheLimit(t *testing.T) {
	url := startNATS(t)
	lim := startLimiter(t, url)
	c := bus.NewClient(connect(t, url))
	const (
		ids     = 3
		limit   = 500
		callers = 64
		each    = 120 // 7680 checks, 1280 an identifier of each workspace
	)
	// Two workspaces, each caller alternating between them: each has its
	// own lane and cells, so each admits exactly the limit an identifier.
	workspaces := [2]string{"acme", "globex"}
	var admitted [2][ids]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range each {
				ws, id := (g+i)%2, (g+i/2)%ids
				r, err := c.Check(context.Background(), workspaces[ws], "api", bus.CheckRequest{
					Identifier: fmt.Sprintf("race-%d", id), Limit: limit, Duration: 3_600_000})
				if err != nil {
					errs <- err
					return
				}
				if r.Success {
					admitted[ws][id].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for ws := range admitted {
		for i := range admitted[ws] {
			if got := admitted[ws][i].Load(); got != limit {
				t.Errorf("%s race-%d: %d admitted, want exactly %d", workspaces[ws], i, got, limit)
			}
		}
	}
	st, _ := lim.lim.EndpointStats("checks")
	if st.Admitted+st.Denied == 0 {
		t.Fatal("no check was coalesced into a checks message")
	}
	t.Logf("%d checks decided in checks messages", st.Admitted+st.Denied)
}

// A server whose max_payload is small gets coalesced messages that fit it,
// however long the checks: every call is answered.
func TestCoalescedMessagesFitTheServersMaxPayload(t *testing.T) {
	srv := natstest.StartSecuredServer(t, &server.Options{MaxPayload: 16 << 10})
	url := srv.ClientURL()
	lim := startLimiter(t, url)
	c := bus.NewClient(connect(t, url), bus.WithCoalesceLimits(1000, 1))
	var wg sync.WaitGroup
	errs := make(chan error, 128)
	for g := range 128 {
		wg.Go(func() {
			for i := range 5 {
				id := fmt.Sprintf("%0500d", g*5+i) // 500-byte identifiers
				if _, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: id, Limit: 10, Duration: 60_000}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st, _ := lim.lim.EndpointStats("checks"); st.Admitted == 0 {
		t.Fatal("nothing was coalesced")
	}
}
