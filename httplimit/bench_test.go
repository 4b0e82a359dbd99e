package httplimit_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/httplimit"
)

// parallelism is the goroutines per GOMAXPROCS of the parallel runs.
const parallelism = 32

// discard is a ResponseWriter that keeps nothing but its header map,
// cleared for each request.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddleware measures a request through the middleware, whose
// check goes over NATS (an embedded server on loopback) to a real limiter
// in this process (in-memory counts, one key far from its limit), against
// the same handler bare, in the same run: called directly (the middleware's
// whole cost, mostly the check's round trip) and behind a real HTTP server
// with keep-alive clients (what it adds to serving a request). Parallel
// callers are parallelism × GOMAXPROCS goroutines, as on a busy server (the
// client coalesces their checks); serial is one caller, one request at a
// time. check is the bare handler after the same check made with the client
// directly, so limited less check is the middleware's own cost. Compare
// ns/op within one run.
func BenchmarkMiddleware(b *testing.B) {
	nc := startNATS(b)
	startLimiter(b, nc.ConnectedUrl(), nil)
	c := bus.NewClient(nc)
	rule := httplimit.Rule{Workspace: "bench", Namespace: "api", Limit: 1_000_000_000_000_000, Window: time.Hour}
	m, err := httplimit.New(c, rule)
	if err != nil {
		b.Fatal(err)
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	// check is the bare handler after the same check made directly with
	// the client: limited less check is what the middleware itself costs.
	check := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := c.Check(r.Context(), rule.Workspace, rule.Namespace, bus.CheckRequest{
			Identifier: "192.0.2.1", Limit: rule.Limit, Duration: rule.Window.Milliseconds()})
		if err != nil || !resp.Success {
			b.Errorf("check: %+v, %v", resp, err)
		}
		bare(w, r)
	})
	handlers := []struct {
		name string
		h    http.Handler
	}{{"bare", bare}, {"check", check}, {"limited", m.Handler(bare)}}

	for _, h := range handlers {
		b.Run("direct/serial/"+h.name, func(b *testing.B) {
			b.ReportAllocs()
			req := httptest.NewRequest("GET", "/", nil)
			w := &discard{h: http.Header{}}
			for b.Loop() {
				clear(w.h)
				h.h.ServeHTTP(w, req)
			}
		})
	}
	for _, h := range handlers {
		b.Run("direct/parallel/"+h.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest("GET", "/", nil)
				w := &discard{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.h.ServeHTTP(w, req)
				}
			})
		})
	}
	for _, h := range handlers {
		b.Run("http/parallel/"+h.name, func(b *testing.B) {
			srv := httptest.NewServer(h.h)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(srv.URL)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}
