package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// clock is a settable clock shared by the limiter and the middleware.
type clock struct{ ms atomic.Int64 }

func (c *clock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// startNATS starts an embedded nats-server and returns a connection to it.
func startNATS(t testing.TB) *nats.Conn {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startLimiter serves a real limiter (in-memory counts) on its own
// connection to url, on clk when it is not nil.
func startLimiter(t testing.TB, url string, clk *clock) {
	t.Helper()
	lc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Close)
	cfg := service.Config{}
	if clk != nil {
		cfg.Now = clk.now
	}
	svc := service.New(cfg)
	lim, err := transport.Serve(lc, transport.LimiterConfig{Service: svc, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := errors.Join(lim.Shutdown(ctx), svc.Close(ctx)); err != nil {
			t.Errorf("limiter shutdown: %v", err)
		}
	})
}

// serve wraps a handler that answers 200 "ok" with m and serves it.
func serve(t *testing.T, m *httplimit.Middleware) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var reached atomic.Int64
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "ok")
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, &reached
}

func get(t *testing.T, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func newMiddleware(t *testing.T, c httplimit.Checker, rule httplimit.Rule, opts ...httplimit.Option) *httplimit.Middleware {
	t.Helper()
	m, err := httplimit.New(c, rule, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// expect checks a response's status and fields ("" : absent).
func expect(t *testing.T, resp *http.Response, status int, fields map[string]string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	for k, v := range fields {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
}

// On a clock 10.25 s into a one-minute window: three requests admitted
// with what remains counting down, the fourth denied 429 with the exact
// Retry-After (the previous window is empty, so the first instant that
// admits one more is 60/3 = 20 s into the next window: 69.75 s away, 70
// rounded up), and after that wait one more is admitted.
func TestAdmitsTheLimitThenDenies429WithRetryAfter(t *testing.T) {
	clk := &clock{}
	clk.ms.Store(time.Date(2026, 11, 27, 12, 0, 10, 250_000_000, time.UTC).UnixMilli())
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), clk)
	m := newMiddleware(t, bus.NewClient(nc), httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 3, Window: time.Minute})
	httplimit.SetNow(m, clk.now)
	srv, reached := serve(t, m)

	for i, r := range []string{"2", "1", "0"} {
		resp := get(t, srv.URL)
		expect(t, resp, 200, map[string]string{
			"RateLimit-Policy": `"api";q=3;w=60`, "RateLimit": `"api";r=` + r + `;t=50`, "Retry-After": ""})
		if t.Failed() {
			t.Fatalf("request %d", i+1)
		}
	}
	resp := get(t, srv.URL)
	expect(t, resp, 429, map[string]string{
		"RateLimit-Policy": `"api";q=3;w=60`, "RateLimit": `"api";r=0;t=70`, "Retry-After": "70"})
	if got := reached.Load(); got != 3 {
		t.Errorf("handler reached %d times, want 3", got)
	}
	clk.advance(69_750*time.Millisecond - time.Millisecond)
	expect(t, get(t, srv.URL), 429, map[string]string{"Retry-After": "1"})
	clk.advance(time.Millisecond)
	expect(t, get(t, srv.URL), 200, map[string]string{"RateLimit": `"api";r=0;t=40`})
}

// Each client address is its own key; a trusted proxy's X-Forwarded-For
// names the client, and an untrusted peer cannot choose its key by
// sending one.
func TestKeysAreClientAddressesThroughTrustedProxiesOnly(t *testing.T) {
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), nil)
	c := bus.NewClient(nc)
	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 1, Window: time.Hour}

	// Untrusted: the header is ignored, everything is 127.0.0.1.
	srv, _ := serve(t, newMiddleware(t, c, rule))
	expect(t, get(t, srv.URL, "X-Forwarded-For", "203.0.113.1"), 200, nil)
	expect(t, get(t, srv.URL, "X-Forwarded-For", "203.0.113.2"), 429, nil)

	// The loopback peer trusted: each forwarded address has its own limit.
	rule.Namespace = "proxied"
	srv, _ = serve(t, newMiddleware(t, c, rule, httplimit.WithKey(httplimit.ClientAddr(httplimit.Proxies{
		Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}))))
	expect(t, get(t, srv.URL, "X-Forwarded-For", "203.0.113.1"), 200, nil)
	expect(t, get(t, srv.URL, "X-Forwarded-For", "203.0.113.2"), 200, nil)
	expect(t, get(t, srv.URL, "X-Forwarded-For", "9.9.9.9, 203.0.113.1"), 429, nil)
}

// A cost function spends its cost; a cost of 0 counts 1, as in the
// client; a key function's error and a key the limiter refuses are 400s
// that reach neither the limiter's counts nor the handler.
func TestCostAndKeyFunctions(t *testing.T) {
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), nil)
	c := bus.NewClient(nc)
	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10, Window: time.Hour}
	cost := func(r *http.Request) int64 {
		var n int64
		fmt.Sscan(r.URL.Query().Get("cost"), &n)
		return n
	}
	key := func(r *http.Request) (string, error) {
		k := r.Header.Get("X-Api-Key")
		if k == "" {
			return "", errors.New("no API key")
		}
		return k, nil
	}
	srv, reached := serve(t, newMiddleware(t, c, rule, httplimit.WithCost(cost), httplimit.WithKey(key)))
	expectRemaining(t, get(t, srv.URL+"?cost=4", "X-Api-Key", "k1"), 200, 6)
	expectRemaining(t, get(t, srv.URL+"?cost=0", "X-Api-Key", "k1"), 200, 5)
	expectRemaining(t, get(t, srv.URL+"?cost=6", "X-Api-Key", "k1"), 429, 5)
	expect(t, get(t, srv.URL+"?cost=-1", "X-Api-Key", "k1"), 400, map[string]string{"RateLimit": ""})
	expect(t, get(t, srv.URL), 400, map[string]string{"RateLimit": ""})
	expect(t, get(t, srv.URL, "X-Api-Key", strings.Repeat("k", 513)), 400, map[string]string{"RateLimit": ""})
	expect(t, get(t, srv.URL+"?cost=11", "X-Api-Key", "k2"), 429, map[string]string{"Retry-After": ""})
	if got := reached.Load(); got != 2 {
		t.Errorf("handler reached %d times, want 2", got)
	}
}

// expectRemaining checks a response's status and the r of its RateLimit.
func expectRemaining(t *testing.T, resp *http.Response, status int, r int64) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	if f, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"api";r=%d;`, r); !strings.HasPrefix(f, want) {
		t.Errorf("RateLimit %q, want it to start %s", f, want)
	}
}

// With no limiter serving, the default lets requests through untouched and
// FailClosed answers 503; either way the check's error is logged.
func TestFailOpenByDefaultAndFailClosedOnRequest(t *testing.T) {
	nc := startNATS(t) // no limiter
	c := bus.NewClient(nc)
	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10, Window: time.Minute}
	var logged lockedBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))

	open, reachedOpen := serve(t, newMiddleware(t, c, rule, httplimit.WithLogger(log)))
	expect(t, get(t, open.URL), 200, map[string]string{"RateLimit": "", "RateLimit-Policy": "", "Retry-After": ""})
	if reachedOpen.Load() != 1 {
		t.Errorf("fail-open: handler reached %d times, want 1", reachedOpen.Load())
	}

	var handed error
	closed, reachedClosed := serve(t, newMiddleware(t, c, rule, httplimit.WithFailureMode(httplimit.FailClosed),
		httplimit.WithLogger(log)))
	expect(t, get(t, closed.URL), 503, map[string]string{"RateLimit": ""})
	hooked, _ := serve(t, newMiddleware(t, c, rule, httplimit.WithFailureMode(httplimit.FailClosed),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			handed = err
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
		})))
	expect(t, get(t, hooked.URL), 503, map[string]string{"Retry-After": "5"})
	if reachedClosed.Load() != 0 {
		t.Errorf("fail-closed: handler reached %d times, want 0", reachedClosed.Load())
	}
	if !errors.Is(handed, httplimit.ErrUnavailable) || !errors.Is(handed, bus.ErrNoResponders) {
		t.Errorf("error handed to the hook: %v, want ErrUnavailable wrapping bus.ErrNoResponders", handed)
	}
	for _, mode := range []string{"mode=fail-open", "mode=fail-closed"} {
		if !strings.Contains(logged.String(), mode) {
			t.Errorf("log lacks %s:\n%s", mode, logged.String())
		}
	}
}

// A check not answered within WithTimeout counts as no limiter answering:
// a real limiter whose link to NATS black-holes everything is still
// subscribed, as far as the server knows, but never answers.
func TestTimeoutCountsAsNoLimiterAnswering(t *testing.T) {
	nc := startNATS(t)
	link, err := tcpproxy.Start(strings.TrimPrefix(nc.ConnectedUrl(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	startLimiter(t, "nats://"+link.Addr(), nil)
	// Cleanups run last first: the link passes again before the limiter
	// shuts down.
	t.Cleanup(func() { link.SetMode(tcpproxy.Pass) })

	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10, Window: time.Minute}
	c := bus.NewClient(nc)
	srv, reached := serve(t, newMiddleware(t, c, rule, httplimit.WithTimeout(100*time.Millisecond),
		httplimit.WithFailureMode(httplimit.FailClosed)))
	expect(t, get(t, srv.URL), 200, nil) // the limiter answers through its link
	link.SetMode(tcpproxy.Blackhole)
	expect(t, get(t, srv.URL), 503, map[string]string{"RateLimit": ""})
	if reached.Load() != 1 {
		t.Errorf("handler reached %d times, want 1", reached.Load())
	}
}

// The Denied hook writes the denial; the fields are already set.
func TestDeniedHook(t *testing.T) {
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), nil)
	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 1, Window: time.Hour, Name: "hourly"}
	var got httplimit.Decision
	srv, _ := serve(t, newMiddleware(t, bus.NewClient(nc), rule, httplimit.WithLegacyHeaders(),
		httplimit.WithDenied(func(w http.ResponseWriter, r *http.Request, d httplimit.Decision) {
			got = d
			if w.Header().Get("Retry-After") == "" || w.Header().Get("RateLimit") == "" {
				t.Errorf("hook ran before the fields were set: %v", w.Header())
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":"slow down"}`)
		})))
	expect(t, get(t, srv.URL), 200, map[string]string{"X-RateLimit-Limit": "1", "X-RateLimit-Remaining": "0"})
	resp := get(t, srv.URL)
	expect(t, resp, 429, map[string]string{"Content-Type": "application/json", "RateLimit-Policy": `"hourly";q=1;w=3600`})
	if got.Key != "127.0.0.1" || got.Cost != 1 || got.Reply.Success || got.Reply.RetryAfter <= 0 {
		t.Errorf("decision %+v", got)
	}
}

// An override on the rule's workspace and namespace (a named policy)
// replaces the rule's limit: q is the override's, w is left out.
func TestOverrideIsANamedPolicy(t *testing.T) {
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), nil)
	c := bus.NewClient(nc)
	if _, err := c.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "*", Limit: 2, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	srv, _ := serve(t, newMiddleware(t, c, httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 0, Window: time.Hour}))
	expect(t, get(t, srv.URL), 200, map[string]string{"RateLimit-Policy": `"api";q=2`})
	expect(t, get(t, srv.URL), 200, nil)
	expect(t, get(t, srv.URL), 429, map[string]string{"RateLimit-Policy": `"api";q=2`})

	// No override in this namespace: limit 0 refuses, and no wait helps.
	srv, _ = serve(t, newMiddleware(t, c, httplimit.Rule{Workspace: "acme", Namespace: "other", Limit: 0, Window: time.Hour}))
	expect(t, get(t, srv.URL), 429, map[string]string{"RateLimit-Policy": `"other";q=0;w=3600`, "RateLimit": `"other";r=0`, "Retry-After": ""})
}

// A monthly quota per API key in Berlin, on a clock in March 2026: a
// key's three requests pass and the fourth is refused until the period's
// end, midnight of 1 April in Berlin, which is also t, Retry-After and
// X-RateLimit-Reset; w is the length of March there (31 days less the hour
// the clocks skip). Another key has a quota of its own. At the period's
// end the whole quota is back and w is April's length.
func TestMonthlyQuotaPerKeyInAZone(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 15, 12, 0, 0, 250_000_000, berlin)
	clk := &clock{}
	clk.ms.Store(now.UnixMilli())
	nc := startNATS(t)
	startLimiter(t, nc.ConnectedUrl(), clk)
	key := func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil }
	m := newMiddleware(t, bus.NewClient(nc),
		httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 3, Period: "month@Europe/Berlin", Name: "monthly"},
		httplimit.WithKey(key), httplimit.WithLegacyHeaders())
	httplimit.SetNow(m, clk.now)
	srv, reached := serve(t, m)

	march, april, may := time.Date(2026, 3, 1, 0, 0, 0, 0, berlin), time.Date(2026, 4, 1, 0, 0, 0, 0, berlin), time.Date(2026, 5, 1, 0, 0, 0, 0, berlin)
	secs := func(d time.Duration) string { return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) }
	policy := `"monthly";q=3;w=` + secs(april.Sub(march))
	toEnd := secs(april.Sub(now))
	for i, r := range []string{"2", "1", "0"} {
		expect(t, get(t, srv.URL, "X-Api-Key", "k1"), 200, map[string]string{"RateLimit-Policy": policy,
			"RateLimit": `"monthly";r=` + r + `;t=` + toEnd, "Retry-After": "", "X-RateLimit-Reset": strconv.FormatInt(april.Unix(), 10)})
		if t.Failed() {
			t.Fatalf("request %d", i+1)
		}
	}
	expect(t, get(t, srv.URL, "X-Api-Key", "k1"), 429, map[string]string{"RateLimit-Policy": policy,
		"RateLimit": `"monthly";r=0;t=` + toEnd, "Retry-After": toEnd, "X-RateLimit-Reset": strconv.FormatInt(april.Unix(), 10)})
	expect(t, get(t, srv.URL, "X-Api-Key", "k2"), 200, map[string]string{"RateLimit": `"monthly";r=2;t=` + toEnd})
	if got := reached.Load(); got != 4 {
		t.Errorf("handler reached %d times, want 4", got)
	}

	clk.advance(april.Sub(now) - time.Millisecond)
	expect(t, get(t, srv.URL, "X-Api-Key", "k1"), 429, map[string]string{"RateLimit-Policy": policy, "Retry-After": "1"})
	clk.advance(time.Millisecond)
	expect(t, get(t, srv.URL, "X-Api-Key", "k1"), 200, map[string]string{"RateLimit-Policy": `"monthly";q=3;w=` + secs(may.Sub(april)),
		"RateLimit": `"monthly";r=2;t=` + secs(may.Sub(april)), "X-RateLimit-Reset": strconv.FormatInt(may.Unix(), 10)})
}

// A rule has exactly one of Window and Period, and a Period that
// window.ParseCalendar reads; the errors say what a period is, or which
// zone is unknown.
func TestNewTakesWindowOrPeriod(t *testing.T) {
	c := bus.NewClient(startNATS(t))
	rule := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10}
	for _, p := range []string{"month@Europe/Berlin", "day", "week@America/New_York", "minute@Asia/Kolkata"} {
		r := rule
		r.Period = p
		if _, err := httplimit.New(c, r); err != nil {
			t.Errorf("period %q refused: %v", p, err)
		}
	}
	for _, tc := range []struct {
		name   string
		window time.Duration
		period string
		want   string // in the error
	}{
		{"both", time.Minute, "day", "both"},
		{"neither", 0, "", window.CalendarRule},
		{"bad unit", 0, "fortnight", window.CalendarRule},
		{"unit in capitals", 0, "Month", window.CalendarRule},
		{"bad zone", 0, "month@Mars/Olympus_Mons", "Mars/Olympus_Mons"},
		{"@ without a zone", 0, "day@", "no time zone"},
	} {
		r := rule
		r.Window, r.Period = tc.window, tc.period
		_, err := httplimit.New(c, r)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "httplimit: rule: ") {
			t.Errorf("%s: error %v, want one of the rule containing %q", tc.name, err, tc.want)
		}
	}
}

func TestNewRefusesRulesOutOfBounds(t *testing.T) {
	nc := startNATS(t)
	c := bus.NewClient(nc)
	ok := httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10, Window: time.Minute}
	if _, err := httplimit.New(c, ok); err != nil {
		t.Fatalf("valid rule refused: %v", err)
	}
	if _, err := httplimit.New(nil, ok); err == nil {
		t.Error("nil client accepted")
	}
	for name, edit := range map[string]func(*httplimit.Rule){
		"no workspace":      func(r *httplimit.Rule) { r.Workspace = "" },
		"bad namespace":     func(r *httplimit.Rule) { r.Namespace = "a.b" },
		"negative limit":    func(r *httplimit.Rule) { r.Limit = -1 },
		"limit above 10^15": func(r *httplimit.Rule) { r.Limit = 1_000_000_000_000_001 },
		"window under 1s":   func(r *httplimit.Rule) { r.Window = 999 * time.Millisecond },
		"window over 366d":  func(r *httplimit.Rule) { r.Window = 367 * 24 * time.Hour },
		"sub-ms window":     func(r *httplimit.Rule) { r.Window = time.Second + time.Microsecond },
		"unprintable name":  func(r *httplimit.Rule) { r.Name = "a\nb" },
	} {
		r := ok
		edit(&r)
		if _, err := httplimit.New(c, r); err == nil {
			t.Errorf("%s: accepted %+v", name, r)
		}
	}
}

// lockedBuffer is a strings.Builder safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
