package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// httpBenchClients is how many clients, each with its keep-alive
// connection, BenchmarkHTTPDoorCheck runs at once.
const httpBenchClients = 32

// BenchmarkHTTPDoorCheck is the HTTP door's check next to a bare Go HTTP
// echo handler (it reads the body and writes it back) on the same
// machine, with the same client: net/http with keep-alive, from
// httpBenchClients goroutines, JSON bodies, 1,000 warm identifiers decided
// from memory. Each op is one request to each; they alternate in slices of
// up to 2,000 requests (a slice to one, then one to the other, in a
// rotating order), so both see the same drift of a shared machine. It
// reports each one's throughput and latency and their ratios:
// door/echo-req/s is the door's throughput as a share of the echo's.
//
//	go test -run '^$' -bench HTTPDoorCheck -benchtime 40000x ./bus/transport
func BenchmarkHTTPDoorCheck(b *testing.B) {
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	const ids = 1000
	bodies := make([][]byte, ids)
	for i := range bodies {
		id := "user_" + strconv.Itoa(100000+i)
		bodies[i] = fmt.Appendf(nil, `{"identifier":%q,"limit":%d,"duration":60000}`, id, window.MaxLimit)
		if _, err := svc.Check(context.Background(), service.Query{Workspace: "bench", Namespace: "api", Identifier: id,
			Limit: window.MaxLimit, Duration: 60_000, Cost: 1}); err != nil {
			b.Fatal(err)
		}
	}
	door := httptest.NewServer(l.HTTPHandler(HTTPConfig{}))
	defer door.Close()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		_, _ = w.Write(body)
	}))
	defer echo.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: httpBenchClients, DisableCompression: true}}
	defer client.CloseIdleConnections()

	type target struct {
		name, url string
		took      time.Duration
		lat       []time.Duration
	}
	targets := []*target{{name: "door", url: door.URL + HTTPPathPrefix + "check/bench/api"}, {name: "echo", url: echo.URL + "/echo"}}
	// slice sends n requests to t from httpBenchClients goroutines.
	slice := func(t *target, n, first int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for c := range httpBenchClients {
			wg.Go(func() {
				lat := make([]time.Duration, 0, n/httpBenchClients+1)
				for i := c; i < n; i += httpBenchClients {
					req, err := http.NewRequest(http.MethodPost, t.url, bytes.NewReader(bodies[(first+i)%ids]))
					if err != nil {
						b.Error(err)
						return
					}
					req.Header.Set("Content-Type", "application/json")
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					lat = append(lat, time.Since(t0))
					if resp.StatusCode != 200 {
						b.Errorf("%s: status %d", t.name, resp.StatusCode)
						return
					}
				}
				mu.Lock()
				t.lat = append(t.lat, lat...)
				mu.Unlock()
			})
		}
		wg.Wait()
		t.took += time.Since(start)
	}
	for _, t := range targets { // warm the connections
		slice(t, 2*httpBenchClients, 0)
		t.took, t.lat = 0, t.lat[:0]
	}
	b.ResetTimer()
	for done, round := 0, 0; done < b.N && !b.Failed(); round++ {
		n := min(2000, b.N-done)
		for k := range targets {
			slice(targets[(round+k)%len(targets)], n, done)
		}
		done += n
	}
	b.StopTimer()
	if b.Failed() {
		return
	}
	rate := func(t *target) float64 { return float64(len(t.lat)) / t.took.Seconds() }
	pct := func(t *target, p float64) time.Duration {
		slices.Sort(t.lat)
		return t.lat[min(len(t.lat)-1, int(p*float64(len(t.lat))))]
	}
	d, e := targets[0], targets[1]
	b.ReportMetric(rate(d), "door-req/s")
	b.ReportMetric(rate(e), "echo-req/s")
	b.ReportMetric(rate(d)/rate(e), "door/echo-req/s")
	b.ReportMetric(float64(pct(d, 0.5).Microseconds()), "door-p50-us")
	b.ReportMetric(float64(pct(e, 0.5).Microseconds()), "echo-p50-us")
	b.ReportMetric(float64(pct(d, 0.99).Microseconds()), "door-p99-us")
	b.ReportMetric(float64(pct(e, 0.99).Microseconds()), "echo-p99-us")
	b.ReportMetric(float64(pct(d, 0.99))/float64(pct(e, 0.99)), "door/echo-p99")
	if st, _ := l.EndpointStats("check"); st.Admitted != int64(len(d.lat)+2*httpBenchClients) || st.Waited != 0 {
		b.Fatalf("check endpoint %+v after %d checks, want every one admitted inline", st, len(d.lat)+2*httpBenchClients)
	}
}
