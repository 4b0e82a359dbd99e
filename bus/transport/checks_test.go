package transport

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// redisService returns a Service whose origin is the real Redis under
// prefix, closed at the end of the test.
func redisService(t *testing.T, prefix string) *service.Service {
	t.Helper()
	o, err := region.NewRedis(region.RedisConfig{URL: redistest.SharedURL(t), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	// The default configuration: a check whose sync outlasts the read
	// timeout while Redis answers other calls (under the race detector,
	// with other packages' tests on the same two cores, one sometimes does)
	// is denied, never decided from this limiter's counts.
	svc := service.New(service.Config{Origin: o})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = svc.Close(ctx)
	})
	return svc
}

// serveLimiter serves svc on its own connection to srv; the limiter shuts
// down at the end of the test.
func serveLimiter(t *testing.T, srv *embedded.Server, svc *service.Service) *Limiter {
	t.Helper()
	nc := natstest.Connect(t, srv)
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Shutdown(context.Background()) })
	return l
}

// sendChecks sends a checks message and returns its results, failing on an
// error reply.
func sendChecks(t *testing.T, nc *nats.Conn, ws string, enc wire.Encoding, body []byte) []wire.ChecksResult {
	t.Helper()
	m, err := nc.Request("ratelimit.checks."+ws, body, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		t.Fatalf("checks message refused: %s %s", code, m.Header.Get(micro.ErrorHeader))
	}
	r, err := wire.DecodeChecksResponse(enc, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r.Results
}

// checkAlone sends one check on the check subject and returns its result as
// a checks result.
func checkAlone(t *testing.T, nc *nats.Conn, ws string, enc wire.Encoding, c wire.BatchCheck) wire.ChecksResult {
	t.Helper()
	m, err := nc.Request("ratelimit.check."+ws+"."+c.Namespace, wire.AppendCheckRequest(nil, enc, c.CheckRequest), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		msg, _ := wire.DecodeError(enc, m.Data)
		return wire.ChecksResult{Error: msg, Code: 400}
	}
	r, err := wire.DecodeCheckResponse(enc, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	return wire.ChecksResult{CheckResponse: r}
}

// A message of good and bad checks on the real Redis gets, check for check,
// the answer each would have got sent alone on the check subject: the same
// decisions, the same remaining and reset, the same error text for bad
// fields; bad checks count nothing. Cold identifiers wait on Redis, so the
// message mixes checks decided at once with checks decided by the origin.
func TestChecksAreDecidedAsIfSentAlone(t *testing.T) {
	srv := natstest.Server(t)
	serveLimiter(t, srv, redisService(t, redistest.Prefix(t)))
	nc := natstest.Connect(t, srv)
	const hour = 3_600_000
	chk := func(ns, id string, limit, cost int64) wire.BatchCheck {
		return wire.BatchCheck{Namespace: ns, CheckRequest: wire.CheckRequest{Identifier: id, Limit: limit, Duration: hour, Cost: cost}}
	}
	checks := []wire.BatchCheck{
		chk("api", "a", 2, 1),
		chk("api", "a", 2, 1),
		chk("api", "b", 0, 1),       // limit 0: denied, never
		chk("api", "a", 2, 1),       // over: denied
		chk("api", "c", 5, 6),       // above the limit: never
		chk("api", "a", 2, 0),       // a look
		chk("web", "a", 2, 2),       // another namespace: its own cell
		chk("a.b", "x", 1, 1),       // bad namespace
		chk("api", "", 1, 1),        // bad identifier
		chk("api", "d", 1, 1),       // admitted
		chk("api", "c", 5, 5),       // fits
		chk("api", "d", 1, -1),      // bad cost
		chk("api", "e", 10, 10_000), // above the limit
	}
	for _, enc := range []wire.Encoding{wire.Msgpack, wire.JSON} {
		t.Run(enc.String(), func(t *testing.T) {
			got := sendChecks(t, nc, "msg-"+enc.String(), enc, wire.AppendChecksRequest(nil, enc, checks))
			if len(got) != len(checks) {
				t.Fatalf("%d results for %d checks", len(got), len(checks))
			}
			for i, c := range checks {
				var want wire.ChecksResult
				if wire.ValidToken(c.Namespace) {
					want = checkAlone(t, nc, "alone-"+enc.String(), enc, c)
				} else { // no check subject names it: the subject's rule
					want = wire.ChecksResult{Error: "namespace must be 1 to 64 characters of [A-Za-z0-9_-]", Code: 400}
				}
				// A denial's retry_after counts down while the checks are
				// sent again one by one.
				if d := got[i].RetryAfter - want.RetryAfter; d > 0 && d < 1000 && want.RetryAfter > 0 {
					want.RetryAfter = got[i].RetryAfter
				}
				if !reflect.DeepEqual(got[i], want) {
					t.Errorf("check %d %+v: in a message %+v, alone %+v", i, c, got[i], want)
				}
			}
			// Afterwards both workspaces hold the same counts.
			for _, c := range []wire.BatchCheck{chk("api", "a", 2, 0), chk("web", "a", 2, 0), chk("api", "c", 5, 0), chk("api", "d", 1, 0)} {
				in, alone := checkAlone(t, nc, "msg-"+enc.String(), enc, c), checkAlone(t, nc, "alone-"+enc.String(), enc, c)
				if in != alone {
					t.Errorf("%s/%s afterwards: %+v, sent alone %+v", c.Namespace, c.Identifier, in, alone)
				}
			}
		})
	}
}

// A body that cannot be read as a whole gets the contract's 400 error in
// the request's encoding, and nothing of it is counted; the endpoint goes
// on serving.
func TestChecksBodyUnreadableAsAWholeIs400(t *testing.T) {
	srv := natstest.Server(t)
	l := serveLimiter(t, srv, service.New(service.Config{}))
	nc := natstest.Connect(t, srv)
	good := `{"namespace":"api","identifier":"u","limit":10,"duration":60000}`
	for _, tt := range []struct{ subject, body, want string }{
		{"ratelimit.checks.acme", `[` + good + `]`, "body must be a JSON object"},
		{"ratelimit.checks.acme", `{"checks":[` + good + `],"x":1}`, `unknown field "x"`},
		{"ratelimit.checks.acme", `{}`, "checks is required"},
		{"ratelimit.checks.acme", `{"checks":[` + good + `,`, "malformed JSON: "},
		{"ratelimit.checks.acme", `{"checks":[]}`, "checks must hold 1 to 1000 checks, got 0"},
		{"ratelimit.checks.a%b", `{"checks":[` + good + `]}`, "workspace must be 1 to 64 characters of [A-Za-z0-9_-]"},
	} {
		req := nats.NewMsg(tt.subject)
		req.Data = []byte(tt.body)
		req.Header.Set("Content-Type", "application/json")
		m, err := nc.RequestMsg(req, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "400" {
			t.Fatalf("%s: code %q, want 400", tt.body, code)
		}
		msg, err := wire.DecodeError(wire.JSON, m.Data)
		if err != nil || len(msg) < len(tt.want) || msg[:len(tt.want)] != tt.want || m.Header.Get(micro.ErrorHeader) != msg {
			t.Fatalf("%s: error %q (header %q), %v; want %q", tt.body, msg, m.Header.Get(micro.ErrorHeader), err, tt.want)
		}
	}
	if st, _ := l.EndpointStats("checks"); st.Admitted+st.Denied != 0 || st.BadRequests != 6 {
		t.Fatalf("stats %+v after six refused messages", st)
	}
	got := sendChecks(t, nc, "acme", wire.JSON, []byte(`{"checks":[`+good+`]}`))
	if len(got) != 1 || !got[0].Success || got[0].Remaining != 9 {
		t.Fatalf("after the refused messages: %+v", got)
	}
}

// Many goroutines send checks messages on a few identifiers to two
// limiters sharing the real Redis: each identifier admits exactly its
// limit, however the checks are spread over messages and limiters.
func TestConcurrentChecksMessagesAdmitExactlyTheLimit(t *testing.T) {
	srv := natstest.Server(t)
	prefix := redistest.Prefix(t)
	services := []*service.Service{redisService(t, prefix), redisService(t, prefix)}
	for _, svc := range services {
		serveLimiter(t, srv, svc)
	}
	const (
		ids      = 4
		limit    = 200
		callers  = 32
		messages = 10
		perMsg   = 8 // 32*10*8 = 2560 checks, 640 an identifier
	)
	var admitted [ids]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			for m := range messages {
				checks := make([]wire.BatchCheck, perMsg)
				for i := range checks {
					checks[i] = wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{
						Identifier: fmt.Sprintf("id-%d", (g+m+i)%ids), Limit: limit, Duration: 3_600_000, Cost: 1}}
				}
				reply, err := nc.Request("ratelimit.checks.race", wire.AppendChecksRequest(nil, wire.Msgpack, checks), 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				r, err := wire.DecodeChecksResponse(wire.Msgpack, reply.Data)
				if err != nil || len(r.Results) != perMsg {
					errs <- fmt.Errorf("reply %q: %v", reply.Data, err)
					return
				}
				for i, res := range r.Results {
					if res.Error != "" {
						errs <- fmt.Errorf("check failed: %s", res.Error)
						return
					}
					if res.Success {
						admitted[(g+m+i)%ids].Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Exactly the limit, unless a sync outlasted the read timeout: its
	// checks were denied, and the ones after them may not have made up
	// for it. Never more, either way.
	var denied, local int64
	for i, svc := range services {
		st := svc.Stats()
		denied += st.WaitsDenied
		local += st.AdmittedLocally
		if st.OriginSyncErrors != 0 {
			t.Logf("limiter %d: %d of %d syncs with Redis failed or outlasted the read timeout; %d checks denied for it",
				i, st.OriginSyncErrors, st.OriginSyncs, st.WaitsDenied)
		}
	}
	if local != 0 {
		t.Errorf("%d checks admitted without Redis while it answered", local)
	}
	for i := range admitted {
		if got := admitted[i].Load(); got > limit || got < limit-denied {
			t.Errorf("id-%d: %d admitted, want exactly %d (at least %d with %d denied for a slow sync)", i, got, limit, limit-denied, denied)
		}
	}
}

// A limiter that begins shutting down while it works through a message
// answers the checks it decided and 503 for the rest, in one reply; the
// 503 ones sent again to another limiter of the region are counted there,
// and nothing is counted twice.
func TestChecksOfAMessageAfterShutdownBeganAre503AndCountedOnce(t *testing.T) {
	srv := natstest.Server(t)
	prefix := redistest.Prefix(t)
	svc1 := redisService(t, prefix)
	l1 := serveLimiter(t, srv, svc1)
	nc := natstest.Connect(t, srv)
	const n, stopAt = 16, 10
	checks := make([]wire.BatchCheck, n)
	for i := range checks {
		checks[i] = wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{
			Identifier: fmt.Sprintf("id-%d", i), Limit: 100, Duration: 3_600_000, Cost: 1}}
	}
	// Warm: every identifier three times (a cell takes no lease until
	// two admissions came before the check at hand), so the next message
	// is decided from leases, on the endpoint's callback.
	for range 3 {
		for _, r := range sendChecks(t, nc, "stop", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, checks)) {
			if !r.Success {
				t.Fatalf("warm-up: %+v", r)
			}
		}
	}
	stopped := make(chan error, 1)
	l1.onBeforeCheck(func(_ string, i int) {
		if i != stopAt {
			return
		}
		go func() { stopped <- l1.Shutdown(context.Background()) }()
		for !l1.closing.Load() {
			time.Sleep(time.Millisecond)
		}
	})
	got := sendChecks(t, nc, "stop", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, checks))
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	var again []wire.BatchCheck
	for i, r := range got {
		switch {
		case i < stopAt && (r.Error != "" || !r.Success || r.Remaining != 96):
			t.Fatalf("check %d decided before shutdown: %+v", i, r)
		case i >= stopAt && (r.Code != 503 || r.Error != "limiter is shutting down"):
			t.Fatalf("check %d after shutdown began: %+v, want a 503 result", i, r)
		case i >= stopAt:
			again = append(again, checks[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	serveLimiter(t, srv, redisService(t, prefix))
	for _, r := range sendChecks(t, nc, "stop", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, again)) {
		if !r.Success || r.Remaining != 96 {
			t.Fatalf("sent again: %+v, want the fourth admission", r)
		}
	}
	// Every identifier holds exactly four admissions in Redis.
	looks := make([]wire.BatchCheck, n)
	for i, c := range checks {
		looks[i] = c
		looks[i].Cost = 0
	}
	for i, r := range sendChecks(t, nc, "stop", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, looks)) {
		if r.Remaining != 96 {
			t.Fatalf("id-%d: remaining %d, want 96 (four admissions)", i, r.Remaining)
		}
	}
}

// Checks that the service refuses because it is closing get 503 results of
// their own, not a decision.
func TestChecksRefusedByAClosingServiceAre503Results(t *testing.T) {
	srv := natstest.Server(t)
	svc := service.New(service.Config{})
	l := serveLimiter(t, srv, svc)
	if err := svc.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, srv)
	body := wire.AppendChecksRequest(nil, wire.JSON, []wire.BatchCheck{
		{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: "u", Limit: 1, Duration: 60_000, Cost: 1}},
		{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: "u", Limit: -1, Duration: 60_000, Cost: 1}},
	})
	got := sendChecks(t, nc, "acme", wire.JSON, body)
	want := []wire.ChecksResult{{Error: "limiter is shutting down", Code: 503}, {Error: "limit must be between 0 and 1000000000000000, got -1", Code: 400}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("results %+v, want %+v", got, want)
	}
	if st, _ := l.EndpointStats("checks"); st.Unavailable != 1 || st.BadRequests != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// With two workers, a checks message held up on one (here by the test,
// as by a long message) does not hold up the next message: an idle helper
// answers it.
func TestAChecksMessageDoesNotWaitBehindAnother(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r", Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	release, held := make(chan struct{}), make(chan struct{})
	l.onBeforeCheck(func(id string, _ int) {
		if id == "slow" {
			close(held)
			select { // never hang the test
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
	})
	// The helper is waiting (a message sent before would find it busy or
	// not yet started, and the callback would take it).
	for l.idleHelpers.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	client := natstest.Connect(t, srv)
	body := func(id string) []byte {
		return wire.AppendChecksRequest(nil, wire.Msgpack, []wire.BatchCheck{{Namespace: "api",
			CheckRequest: wire.CheckRequest{Identifier: id, Limit: 10, Duration: 60_000, Cost: 1}}})
	}
	slow := make(chan error, 1)
	go func() {
		_, err := client.Request("ratelimit.checks.acme", body("slow"), 5*time.Second)
		slow <- err
	}()
	<-held
	start := time.Now()
	got := sendChecks(t, client, "acme", wire.Msgpack, body("fast"))
	close(release)
	if len(got) != 1 || !got[0].Success || time.Since(start) > 5*time.Second {
		t.Fatalf("fast message while another is held: %+v after %v", got, time.Since(start))
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// blockingOrigin holds the request-path syncs of one identifier until
// released: a test seam to make one check slow.
type blockingOrigin struct {
	*regiontest.Memory
	slow    string
	release chan struct{}
}

func (o *blockingOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if s.Cell.Identifier == o.slow {
		select {
		case <-o.release:
		case <-ctx.Done():
			return region.SyncResult{}, ctx.Err()
		}
	}
	return o.Memory.Sync(ctx, reporter, s)
}

// A check that waits on the origin holds up neither the checks after it in
// its message (decided at once, in order) nor the endpoint: with one worker
// only, later messages are answered while it waits; its own message's reply
// leaves once it is decided, with every result.
func TestACheckWaitingOnTheOriginBlocksNeitherItsMessageNorTheEndpoint(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	o := &blockingOrigin{Memory: regiontest.NewMemory(nil), slow: "slow", release: make(chan struct{})}
	svc := service.New(service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r", Workers: 1, CheckTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	client := natstest.Connect(t, srv)
	chk := func(id string) wire.BatchCheck {
		return wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: id, Limit: 10, Duration: 60_000, Cost: 1}}
	}
	// Warm the fast identifiers: they are then decided from their leases.
	sendChecks(t, client, "acme", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, []wire.BatchCheck{chk("a"), chk("b")}))

	slow := make(chan []wire.ChecksResult, 1)
	go func() {
		slow <- sendChecks(t, client, "acme", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack,
			[]wire.BatchCheck{chk("a"), chk("slow"), chk("b"), chk("slow")}))
	}()
	for st, _ := l.EndpointStats("checks"); st.Waited < 2; st, _ = l.EndpointStats("checks") {
		time.Sleep(time.Millisecond) // the two slow checks wait in their group
	}
	for range 5 {
		got := sendChecks(t, client, "acme", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, []wire.BatchCheck{chk("a"), chk("b")}))
		if len(got) != 2 || !got[0].Success || !got[1].Success {
			t.Fatalf("while a check waits on the origin: %+v", got)
		}
	}
	select {
	case r := <-slow:
		t.Fatalf("the message with the waiting check was answered before its check was decided: %+v", r)
	default:
	}
	close(o.release)
	r := <-slow
	if len(r) != 4 {
		t.Fatalf("results %+v", r)
	}
	for i, res := range r {
		if !res.Success {
			t.Errorf("result %d: %+v, want admitted", i, res)
		}
	}
	// slow's two checks were decided in request order.
	if r[1].Remaining != 9 || r[3].Remaining != 8 {
		t.Errorf("slow's checks: remaining %d then %d, want 9 then 8", r[1].Remaining, r[3].Remaining)
	}
}

// BenchmarkHandleChecks measures the checks endpoint's work per message of
// 64 warm checks, as its callback does it (decode, 64 decisions, encode,
// the reply published to a real server), and reports it per check.
func BenchmarkHandleChecks(b *testing.B) {
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	const perMsg = 64
	var reqs []*benchRequest
	for i := 0; i < 1024; i += perMsg {
		checks := make([]wire.BatchCheck, perMsg)
		for j := range checks {
			id := "user_" + strconv.Itoa(100000+i+j)
			checks[j] = wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: id, Limit: window.MaxLimit, Duration: 60_000, Cost: 1}}
			if _, err := svc.Check(context.Background(), service.Query{Workspace: "bench", Namespace: "api", Identifier: id, Limit: window.MaxLimit, Duration: 60_000, Cost: 1}); err != nil {
				b.Fatal(err)
			}
		}
		reqs = append(reqs, &benchRequest{subject: "ratelimit.checks.bench", reply: "_INBOX.nobody." + strconv.Itoa(i), nc: nc,
			data: wire.AppendChecksRequest(nil, wire.Msgpack, checks)})
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.handleChecks(reqs[i%len(reqs)], true)
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perMsg), "ns/check")
	if st, _ := l.EndpointStats("checks"); st.Waited != 0 {
		b.Fatalf("%d checks waited", st.Waited)
	}
}

// delayOrigin answers the syncs of one identifier that decide checks after
// a delay: a test seam to make a check's wait on the origin take time.
type delayOrigin struct {
	*regiontest.Memory
	slow  string
	delay time.Duration
}

func (o *delayOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if s.Cell.Identifier == o.slow && !s.ReportOnly {
		t := time.NewTimer(o.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return region.SyncResult{}, ctx.Err()
		}
	}
	return o.Memory.Sync(ctx, reporter, s)
}

// Each waiting check of a checks message has a CheckTimeout of its own,
// from when its turn comes, as if it had been sent alone: a deadline shared
// by an identifier's group would leave the later checks the time the first
// ones did not use, and decide them as while Redis fails, from local counts
// (five limiters admitted 1010 of 1000 in a coalesced burst before this
// was so).
func TestEachWaitingCheckOfAMessageHasItsOwnDeadline(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	const delay = 100 * time.Millisecond
	o := &delayOrigin{Memory: regiontest.NewMemory(nil), slow: "slow", delay: delay}
	svc := service.New(service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r", CheckTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	var mu sync.Mutex
	var deadlines []time.Time
	l.onWaitDeadline(func(id string, dl time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if id == "slow" {
			deadlines = append(deadlines, dl)
		}
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	chk := wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: "slow", Limit: 10, Duration: 60_000, Cost: 1}}
	got := sendChecks(t, natstest.Connect(t, srv), "acme", wire.Msgpack, wire.AppendChecksRequest(nil, wire.Msgpack, []wire.BatchCheck{chk, chk, chk}))
	for i, r := range got {
		if !r.Success {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deadlines) != 3 {
		t.Fatalf("%d checks waited in the group, want 3", len(deadlines))
	}
	// The first check waited on the origin for delay: the second's
	// deadline starts after it.
	if gap := deadlines[1].Sub(deadlines[0]); gap < delay*9/10 {
		t.Fatalf("the second check's deadline is %v after the first's; want at least the first's wait on the origin (%v): a deadline of its own", gap, delay)
	}
}
