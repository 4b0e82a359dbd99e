package natslimit_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/natslimit"
)

// fixedClock is the limiter's clock in tests that count a window: it does
// not move, so the window stays where the test filled it.
func fixedClock() time.Time { return time.UnixMilli(1_800_000_000_000) }

// admitted fails the test unless reply is the handler's "ok", without an
// error header.
func admitted(t *testing.T, who string, reply *nats.Msg) {
	t.Helper()
	if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" || string(reply.Data) != "ok" {
		t.Fatalf("%s: want the handler's ok, got code %q (%q), body %q", who, code,
			reply.Header.Get(micro.ErrorHeader), reply.Data)
	}
}

// refused fails the test unless reply carries code and desc, and returns
// its Retry-After values.
func refused(t *testing.T, who string, reply *nats.Msg, code int, desc string) []string {
	t.Helper()
	if got := reply.Header.Get(micro.ErrorCodeHeader); got != strconv.Itoa(code) {
		t.Fatalf("%s: want code %d, got %q (body %q)", who, code, got, reply.Data)
	}
	if got := reply.Header.Get(micro.ErrorHeader); got != desc {
		t.Fatalf("%s: want description %q, got %q", who, desc, got)
	}
	if len(reply.Data) != 0 {
		t.Fatalf("%s: a refusal has no body, got %q", who, reply.Data)
	}
	return reply.Header.Values(natslimit.RetryAfterHeader)
}

// wantRetryAfter returns the Retry-After a denial of id must carry: the
// limiter's own retry_after for the full window, asked directly (a denied
// check counts nothing), in seconds rounded up.
func wantRetryAfter(t *testing.T, g *greeter, ns, id string, limit int64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := g.client.Check(ctx, "greeter", ns, bus.CheckRequest{Identifier: id, Limit: limit, Duration: time.Minute.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Success || resp.RetryAfter <= 0 {
		t.Fatalf("check of %s: want a denial of a full window, got %+v", id, resp)
	}
	return strconv.FormatInt((resp.RetryAfter+999)/1000, 10)
}

// The example's accounts, a micro service in the account greeter behind
// the middleware keyed by the requesting account: acme, over its limit,
// gets 429s with Retry-After, and cannot spend globex's budget even by
// writing globex into its own Nats-Request-Info header (the server
// replaces it); globex is admitted its whole limit.
func TestATenantOverItsLimitGets429sAndAnotherIsUntouched(t *testing.T) {
	w := startWorld(t)
	w.startLimiter(t, fixedClock)
	g := w.startGreeter(t)
	const limit = 5
	m := g.middleware(t, natslimit.Config{Namespace: "hello", Limit: limit, Window: time.Minute, Key: natslimit.Account()})
	g.endpoint(t, "hello", "greet.hello", m)
	acme, globex := w.connect(t, "acme"), w.connect(t, "globex")

	for i := range limit {
		admitted(t, "acme "+strconv.Itoa(i), request(t, acme, "greet.hello"))
	}
	retry := wantRetryAfter(t, g, "hello", "acme", limit)
	for i := range 3 {
		ra := refused(t, "acme over its limit", request(t, acme, "greet.hello"), natslimit.CodeTooMany, natslimit.DescTooMany)
		if len(ra) != 1 || ra[0] != retry {
			t.Fatalf("acme denial %d: Retry-After %q, want [%s]", i, ra, retry)
		}
	}
	// The sliding window weighs the last window's count: a full one
	// frees room within two windows.
	if n, _ := strconv.Atoi(retry); n < 1 || n > 120 {
		t.Fatalf("Retry-After %s is not within two one-minute windows", retry)
	}
	forged := nats.NewMsg("greet.hello")
	forged.Header.Set(natslimit.RequestInfoHeader, `{"acc":"globex","user":"globex"}`)
	for range 2 {
		reply, err := acme.RequestMsg(forged, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		refused(t, "acme posing as globex", reply, natslimit.CodeTooMany, natslimit.DescTooMany)
	}

	for i := range limit {
		admitted(t, "globex "+strconv.Itoa(i), request(t, globex, "greet.hello"))
	}
	refused(t, "globex over its limit", request(t, globex, "greet.hello"), natslimit.CodeTooMany, natslimit.DescTooMany)

	// micro counts each refusal as an error of the endpoint.
	st := g.svc.Stats().Endpoints[0]
	if st.NumRequests != 2*limit+6 || st.NumErrors != 6 {
		t.Fatalf("endpoint stats: %d requests, %d errors; want %d, 6", st.NumRequests, st.NumErrors, 2*limit+6)
	}
}

// A plain subscription behind the middleware keyed by the user: acme's
// import shares its user, globex's does not, so globex's requests have no
// key and are limited under the one identifier of unidentified requests,
// with those whose Nats-Request-Info is malformed; none of them crashes
// the handler. A denied message without a reply subject is dropped.
func TestAPlainHandlerLimitsByUserAndFallsBackToUnidentified(t *testing.T) {
	w := startWorld(t)
	w.startLimiter(t, fixedClock)
	g := w.startGreeter(t)
	const limit = 2
	m := g.middleware(t, natslimit.Config{Namespace: "plain", Limit: limit, Window: time.Minute, Key: natslimit.User()})
	var handled atomic.Int64
	sub, err := g.nc.QueueSubscribe("greet.plain", "plain", m.MsgHandler(func(msg *nats.Msg) {
		handled.Add(1)
		_ = msg.Respond([]byte("ok"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	acme, globex := w.connect(t, "acme"), w.connect(t, "globex")

	for range limit {
		admitted(t, "acme", request(t, acme, "greet.plain"))
	}
	retry := wantRetryAfter(t, g, "plain", "acme/acme", limit)
	if ra := refused(t, "acme", request(t, acme, "greet.plain"), natslimit.CodeTooMany, natslimit.DescTooMany); len(ra) != 1 || ra[0] != retry {
		t.Fatalf("acme denial: Retry-After %q, want [%s]", ra, retry)
	}

	// A malformed header, sent inside the service's account where no
	// import replaces it, spends one of the unidentified budget; globex,
	// unidentified too, gets the other one.
	bad := func(values ...string) *nats.Msg {
		msg := nats.NewMsg("greet.plain")
		msg.Header[natslimit.RequestInfoHeader] = values
		reply, err := g.nc.RequestMsg(msg, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	admitted(t, "bad JSON", bad(`{"acc":`))
	admitted(t, "globex", request(t, globex, "greet.plain"))
	refused(t, "globex", request(t, globex, "greet.plain"), natslimit.CodeTooMany, natslimit.DescTooMany)
	for _, values := range [][]string{
		{`not json`}, {`[1,2]`}, {`null`}, {`{}`}, {`{"acc":""}`}, {`{"acc":7}`}, {`{"acc":"x"}`, `{"acc":"y"}`},
		{`{"acc":"` + strings.Repeat("a", 600) + `"}`}, {strings.Repeat("{", natslimit.MaxRequestInfo)},
	} {
		refused(t, "malformed "+values[0][:min(len(values[0]), 12)], bad(values...), natslimit.CodeTooMany, natslimit.DescTooMany)
	}
	if got := wantRetryAfter(t, g, "plain", natslimit.DefaultUnidentified, limit); got == "" {
		t.Fatal("the unidentified budget is not spent")
	}

	before := handled.Load()
	if err := acme.Publish("greet.plain", nil); err != nil {
		t.Fatal(err)
	}
	// The subscription handles messages in order: once this reply is
	// back, the message without a reply subject has been through it.
	refused(t, "acme", request(t, acme, "greet.plain"), natslimit.CodeTooMany, natslimit.DescTooMany)
	if got := handled.Load(); got != before {
		t.Fatalf("the handler saw %d denied messages", got-before)
	}
}

// With the limiter gone, checks find no responders: a fail-open endpoint
// answers as if admitted, a fail-closed one answers 503 without
// Retry-After, on micro and plain handlers alike.
func TestWhenNoLimiterAnswersFailOpenAdmitsAndFailClosedRefuses(t *testing.T) {
	w := startWorld(t)
	lim := w.startLimiter(t, nil)
	g := w.startGreeter(t)
	cfg := natslimit.Config{Namespace: "hello", Limit: 1000, Window: time.Minute, Key: natslimit.Account(), Timeout: time.Second}
	g.endpoint(t, "open", "greet.open", g.middleware(t, cfg))
	cfg.FailClosed = true
	closed := g.middleware(t, cfg)
	g.endpoint(t, "closed", "greet.closed", closed)
	sub, err := g.nc.Subscribe("greet.plain", closed.MsgHandler(func(msg *nats.Msg) { _ = msg.Respond([]byte("ok")) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	acme := w.connect(t, "acme")
	for _, subject := range []string{"greet.open", "greet.closed", "greet.plain"} {
		admitted(t, subject+" with a limiter", request(t, acme, subject))
	}

	lim.stop(t)
	for range 3 {
		admitted(t, "fail open", request(t, acme, "greet.open"))
		for _, subject := range []string{"greet.closed", "greet.plain"} {
			if ra := refused(t, subject+" fail closed", request(t, acme, subject), natslimit.CodeUnavailable, natslimit.DescUnavailable); ra != nil {
				t.Fatalf("%s: a 503 has no Retry-After, got %q", subject, ra)
			}
		}
	}
}

// With a cost function, a request spends what it says (here its body's
// length): a limit of 10 admits a request of 6 bytes, refuses the next one
// of 6, admits one of 3, and an empty body counts 1.
func TestACostFunctionSpendsWhatEachRequestSays(t *testing.T) {
	w := startWorld(t)
	w.startLimiter(t, fixedClock)
	g := w.startGreeter(t)
	m := g.middleware(t, natslimit.Config{Namespace: "costly", Limit: 10, Window: time.Minute, Key: natslimit.Account(),
		Cost: func(_ string, _ nats.Header, data []byte) int64 { return int64(len(data)) }})
	sub, err := g.nc.QueueSubscribe("greet.costly", "costly", m.MsgHandler(func(msg *nats.Msg) { _ = msg.Respond([]byte("ok")) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	acme := w.connect(t, "acme")
	send := func(body string) *nats.Msg {
		reply, err := acme.Request("greet.costly", []byte(body), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	admitted(t, "6 bytes", send("abcdef"))
	refused(t, "6 more bytes", send("abcdef"), natslimit.CodeTooMany, natslimit.DescTooMany)
	admitted(t, "3 bytes", send("abc"))
	admitted(t, "an empty body, counted 1", send(""))
	refused(t, "an empty body past the limit", send(""), natslimit.CodeTooMany, natslimit.DescTooMany)
}

// A daily quota per calling account in New York, on a clock at 00:30 of 1
// November 2026, a day of 25 hours (the clocks go back at 2:00): acme's
// three requests pass and the fourth is refused with a Retry-After that
// runs to midnight of 2 November in New York, 24.5 hours away; globex has
// its own quota. At that midnight acme's whole quota is back, and its
// next denial runs to the end of a day of 24 hours.
func TestADailyQuotaInAZoneRunsToTheZonesMidnight(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 1, 0, 30, 0, 300_000_000, ny)
	var clock atomic.Int64
	clock.Store(now.UnixMilli())
	w := startWorld(t)
	w.startLimiter(t, func() time.Time { return time.UnixMilli(clock.Load()) })
	g := w.startGreeter(t)
	const limit = 3
	g.endpoint(t, "daily", "greet.daily", g.middleware(t, natslimit.Config{Namespace: "daily", Limit: limit,
		Period: "day@America/New_York", Key: natslimit.Account()}))
	acme, globex := w.connect(t, "acme"), w.connect(t, "globex")
	secs := func(d time.Duration) string { return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) }
	expectRetry := func(who, want string) {
		t.Helper()
		if ra := refused(t, who, request(t, acme, "greet.daily"), natslimit.CodeTooMany, natslimit.DescTooMany); len(ra) != 1 || ra[0] != want {
			t.Fatalf("%s: Retry-After %q, want [%s]", who, ra, want)
		}
	}

	for i := range limit {
		admitted(t, "acme "+strconv.Itoa(i), request(t, acme, "greet.daily"))
	}
	midnight := time.Date(2026, 11, 2, 0, 0, 0, 0, ny)
	expectRetry("acme over its daily quota", secs(midnight.Sub(now)))
	admitted(t, "globex", request(t, globex, "greet.daily"))

	clock.Store(midnight.UnixMilli() - 1)
	expectRetry("acme a millisecond before midnight", "1")
	clock.Store(midnight.UnixMilli())
	for i := range limit {
		admitted(t, "acme the next day "+strconv.Itoa(i), request(t, acme, "greet.daily"))
	}
	expectRetry("acme over the next day's quota", secs(time.Date(2026, 11, 3, 0, 0, 0, 0, ny).Sub(midnight)))
}
