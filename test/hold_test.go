package test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// One region's traffic over 300 identifiers, at the default settings: the
// other regions' limiters hold none of those cells (they get the imports,
// and their Redis keeps the foreign sums), the first check of one of them
// in another region starts from the global view all the same, and the
// region that used them gets no import of its own usage back.
func TestLimitersHoldOnlyWhatTheyServe(t *testing.T) {
	w := startWorld(t, false, 1)
	const ids, limit, duration, cost = 300, 1000, 300_000, 10 // cost 10 is 1% of the limit: every admission is published

	// An eu limiter that serves none of the identifiers, with its metrics.
	metricsAddr := freeAddr(t)
	eu := startProcess(t, "limiter", "--nats-url", w.sc.ClientURL("eu"), "--region", "eu",
		"--redis-url", w.redis, "--redis-prefix", w.prefixes["eu"], "--log-level", "warn", "--metrics-addr", metricsAddr)
	defer eu.stop(t, syscall.SIGTERM, 10*time.Second)
	waitService(t, w.conns["eu"], "ratelimit", 4*instancesPerLimiter)
	cellsBefore := scrapeMetric(t, metricsAddr, "sluice_cells")

	// Count the entries for these identifiers on us's and eu's import subjects.
	var mu sync.Mutex
	seen := map[string]int{}
	for _, r := range []string{"us", "eu"} {
		sub, err := w.conns[r].Subscribe(wire.Subjects{}.Internal("import", r), func(m *nats.Msg) {
			is, err := event.DecodeImports(m.Data)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, im := range is {
				if strings.HasPrefix(im.Cell.Identifier, "held-") {
					seen[r]++
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := w.conns[r].Flush(); err != nil {
			t.Fatal(err)
		}
	}

	for i := range ids {
		if resp, err := w.check("us", fmt.Sprint("held-", i), limit, duration, cost); err != nil || !resp.Success {
			t.Fatalf("check %d in us: %+v, %v", i, resp, err)
		}
	}
	// Every identifier's foreign sum reaches eu's Redis.
	direct, err := region.NewRedis(region.RedisConfig{URL: w.redis, KeyPrefix: w.prefixes["eu"]})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	seq := window.Sequence(time.Now().UnixMilli(), duration)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for i := range ids {
			cur, _, err := direct.Read(t.Context(), window.Cell{Workspace: "acme", Namespace: "api",
				Identifier: fmt.Sprint("held-", i), Duration: duration, Sequence: seq})
			if err == nil && cur.Foreign == cost {
				n++
			}
		}
		if n == ids {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu's Redis holds the foreign sum of %d of %d cells", n, ids)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if got := scrapeMetric(t, metricsAddr, "sluice_cells"); got != cellsBefore {
		t.Fatalf("an eu limiter that served none of them holds %v cells, it held %v before", got, cellsBefore)
	}
	if got := scrapeMetric(t, metricsAddr, "sluice_imports_applied_total"); got < ids {
		t.Fatalf("the eu limiter received %v imports, want at least %d", got, ids)
	}
	// A first check in eu starts from what us used.
	resp, err := w.clients["eu"].Check(t.Context(), "acme", "api",
		bus.CheckRequest{Identifier: "held-7", Limit: limit, Duration: duration, Peek: true})
	if err != nil || resp.Remaining != limit-cost {
		t.Fatalf("first look at held-7 in eu: %+v, %v; want %d remaining", resp, err, limit-cost)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["us"] != 0 {
		t.Fatalf("us got %d imports of its own usage back", seen["us"])
	}
	if seen["eu"] < ids {
		t.Fatalf("eu got %d imports, want at least %d", seen["eu"], ids)
	}
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// distinctFreeAddrs returns n loopback addresses free now, no two alike:
// each listener is held until all are found.
func distinctFreeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// scrapeMetric returns the value of the unlabelled metric name at addr's
// /metrics, retrying for a few seconds while the process starts.
func scrapeMetric(t *testing.T, addr, name string) float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
					resp.Body.Close()
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						t.Fatal(err)
					}
					return f
				}
			}
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s at %s: %v", name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
