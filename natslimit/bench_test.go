package natslimit_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/natslimit"
)

// BenchmarkServiceLatency measures the service's own latency as a tenant
// sees it through its import, with the middleware and without, in one
// run: the example's accounts, a limiter in this process, the greeter's
// micro endpoints greet.bare (no middleware) and greet.limited (keyed by
// account, a limit never reached), each caller sending to both in turn so
// that both see the same machine; with one caller and with 16 at once.
// Reported: each endpoint's p50 and p99 in microseconds, and the ratio of
// the p99s (limited / bare). A micro endpoint handles one request at a
// time and the check holds it for a round trip to the limiter, so with
// many callers the limited endpoint's requests queue behind each other's
// checks.
//
//	go test -run XXX -bench BenchmarkServiceLatency ./natslimit
func BenchmarkServiceLatency(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			w := startWorld(b)
			w.startLimiter(b, nil)
			g := w.startGreeter(b)
			g.endpoint(b, "bare", "greet.bare", nil)
			g.endpoint(b, "limited", "greet.limited", g.middleware(b, natslimit.Config{Namespace: "bench",
				Limit: 1_000_000_000_000_000, Window: time.Minute, Key: natslimit.Account()}))
			acme := w.connect(b, "acme")
			for _, s := range []string{"greet.bare", "greet.limited"} {
				request(b, acme, s) // warm: the cell exists, the paths are known
			}

			per := b.N/callers + 1
			bare := make([][]time.Duration, callers)
			limited := make([][]time.Duration, callers)
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for c := range callers {
				bare[c] = make([]time.Duration, 0, per)
				limited[c] = make([]time.Duration, 0, per)
				wg.Go(func() {
					for i := range per {
						order := []string{"greet.bare", "greet.limited"}
						if (i+c)%2 == 1 {
							order[0], order[1] = order[1], order[0]
						}
						for _, s := range order {
							start := time.Now()
							reply, err := acme.Request(s, nil, 5*time.Second)
							d := time.Since(start)
							if err != nil || reply.Header.Get("Nats-Service-Error-Code") != "" {
								b.Errorf("%s: %v %v", s, err, headerOf(reply))
								return
							}
							if s == "greet.bare" {
								bare[c] = append(bare[c], d)
							} else {
								limited[c] = append(limited[c], d)
							}
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			bp50, bp99 := percentiles(slices.Concat(bare...))
			lp50, lp99 := percentiles(slices.Concat(limited...))
			b.ReportMetric(float64(bp50.Microseconds()), "bare-p50-µs")
			b.ReportMetric(float64(bp99.Microseconds()), "bare-p99-µs")
			b.ReportMetric(float64(lp50.Microseconds()), "limited-p50-µs")
			b.ReportMetric(float64(lp99.Microseconds()), "limited-p99-µs")
			b.ReportMetric(float64(lp99)/float64(bp99), "p99-ratio")
		})
	}
}

func headerOf(m *nats.Msg) nats.Header {
	if m == nil {
		return nil
	}
	return m.Header
}

// percentiles returns the p50 and p99 of ds, which it sorts.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100]
}
