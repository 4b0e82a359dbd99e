package test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/window"
)

// envoyLoadConfig has a binding limit (user, 100 a minute) and a loose one
// (route, 1,000,000 a minute): a request naming both is two enforced
// limits, so the limiter decides it with service.Batch.
const envoyLoadConfig = `domain: envoyload
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 1000000}
`

const (
	envoyLoadLimit    = 100
	envoyLoadDeadline = 20 * time.Millisecond // Envoy's default timeout for a rate limit call
	envoyWorkers      = 4                     // connections per limiter, as a 4-worker Envoy holds
)

// waitOutMinuteBoundary sleeps into the next minute if less than 15 s of
// this one are left, so a round's calls stay in one minute window.
func waitOutMinuteBoundary(t *testing.T) {
	t.Helper()
	now := time.Now()
	next := now.Truncate(time.Minute).Add(time.Minute)
	if left := next.Sub(now); left < 15*time.Second {
		t.Logf("waiting %v for the next minute window", left.Round(time.Millisecond))
		time.Sleep(left + 200*time.Millisecond)
	}
}

// Tried as Envoy calls it: three limiter processes at default
// flags on one Redis, each called over a few HTTP/2 connections (a 4-worker
// Envoy), every call with Envoy's 20 ms deadline, three times the binding
// limit of 100 a minute per identifier, from 128 and from 1,200 concurrent
// callers, with requests of two descriptors (a batch) and of one. Whatever
// the deadlines and queues do, no round may admit more than the limit on a
// binding identifier: a call that ends on the client's deadline counts as
// not admitted, and after the round Redis (what the limiters reported
// admitted) must not hold more than the limit either.
func TestEnvoyLoadNeverAdmitsBeyondTheLimit(t *testing.T) {
	redisURL, prefix := redistest.SharedURL(t), redistest.Prefix(t)
	conf := filepath.Join(t.TempDir(), "envoyload.yaml")
	writeFile(t, conf, envoyLoadConfig)
	// One client connection per Envoy worker and limiter, each warmed by a
	// health check before any call.
	var conns [][]rlsv3.RateLimitServiceClient
	var limiters []*rlsLimiter
	for range 3 {
		l := startRLSLimiter(t, conf, "--redis-url", redisURL, "--redis-prefix", prefix, "--log-level", "warn")
		limiters = append(limiters, l)
		var cs []rlsv3.RateLimitServiceClient
		for range envoyWorkers {
			c, _ := dialRLS(t, l.addr, nil)
			cs = append(cs, c)
		}
		conns = append(conns, cs)
	}
	client := func(g int) rlsv3.RateLimitServiceClient { return conns[g%3][(g/3)%envoyWorkers] }
	// breakerOpenings counts the limiters' log lines saying Redis reads
	// failed often enough to open the read breaker (Redis slower than
	// --read-timeout under the machine's load: every check is then decided
	// locally, by design): a diagnostic for a failing round.
	breakerOpenings := func() int {
		n := 0
		for _, l := range limiters {
			n += strings.Count(l.stderr.String(), "reads failing: breaker open")
		}
		return n
	}

	origin, err := region.NewRedis(region.RedisConfig{URL: redisURL, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer origin.Close()

	type outcome struct{ ok, over, late, failed int64 }
	// burst sends, from callers goroutines started together, 3× the limit
	// of calls on each of ids binding identifiers (call i on identifier
	// i%len(ids)), each with Envoy's deadline, and returns per identifier
	// what the callers saw.
	burst := func(ids []string, route string, callers int) []outcome {
		calls := int64(3 * envoyLoadLimit * len(ids))
		var ok, over, late, failed = make([]atomic.Int64, len(ids)), make([]atomic.Int64, len(ids)),
			make([]atomic.Int64, len(ids)), make([]atomic.Int64, len(ids))
		var errOnce sync.Once
		var firstErr error
		var next atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range callers {
			c := client(g)
			wg.Go(func() {
				<-start
				for i := next.Add(1) - 1; i < calls; i = next.Add(1) - 1 {
					k := int(i % int64(len(ids)))
					descs := []*rlv3.RateLimitDescriptor{rlsDesc("user=" + ids[k])}
					if route != "" {
						descs = append(descs, rlsDesc("route="+route))
					}
					ctx, cancel := context.WithTimeout(context.Background(), envoyLoadDeadline)
					r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "envoyload", Descriptors: descs})
					cancel()
					switch {
					case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
						late[k].Add(1) // Envoy gave up waiting: not admitted by the limiter's word
					case err != nil:
						failed[k].Add(1)
						errOnce.Do(func() { firstErr = err })
					case r.OverallCode == rlsv3.RateLimitResponse_OK:
						ok[k].Add(1)
					default:
						over[k].Add(1)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if firstErr != nil {
			t.Errorf("a call failed: %v", firstErr)
		}
		out := make([]outcome, len(ids))
		for k := range ids {
			out[k] = outcome{ok[k].Load(), over[k].Load(), late[k].Load(), failed[k].Load()}
		}
		return out
	}

	// Envoy's steady state: warm connections, and each limiter's Redis pool
	// dialled. Distinct identifiers, one call each, nothing asserted.
	var warm atomic.Int64
	var wg sync.WaitGroup
	for g := range 48 {
		c := client(g)
		wg.Go(func() {
			for i := warm.Add(1); i <= 600; i = warm.Add(1) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "envoyload",
					Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc(fmt.Sprintf("user=warmup-%d", i))}})
				cancel()
			}
		})
	}
	wg.Wait()
	if n := breakerOpenings(); n > 0 {
		// The rounds are about Redis answering: let an open breaker
		// (--breaker-open-for 1s) probe Redis and close before they begin.
		t.Logf("warm-up: a limiter's Redis read breaker opened %d times; letting it close", n)
		time.Sleep(1200 * time.Millisecond)
		for g := range 3 * envoyWorkers {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = client(g).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "envoyload",
				Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc(fmt.Sprintf("user=probe-%d", g))}})
			cancel()
		}
	}

	type cellCheck struct {
		round, id string
		seq       int64
		ok        int64
	}
	var cells []cellCheck
	for _, callers := range []int{128, 1200} {
		for _, two := range []bool{true, false} {
			waitOutMinuteBoundary(t)
			round := fmt.Sprintf("%d-callers-%s", callers, map[bool]string{true: "two-descriptors", false: "one-descriptor"}[two])
			n := max(1, callers/(3*envoyLoadLimit)) // 1,200 callers: four identifiers, one call each
			ids := make([]string, n)
			for k := range ids {
				ids[k] = fmt.Sprintf("%s-%d-%d", round, time.Now().UnixNano(), k)
			}
			route := ""
			if two {
				route = "r-" + ids[0]
			}
			seq := time.Now().UnixMilli() / 60_000
			began, opened := time.Now(), breakerOpenings()
			outs := burst(ids, route, callers)
			took := time.Since(began)
			if n := breakerOpenings() - opened; n > 0 {
				t.Logf("%s: a limiter's Redis read breaker opened %d times during the round (reads slower than --read-timeout)", round, n)
			}
			if got := time.Now().UnixMilli() / 60_000; got != seq {
				t.Fatalf("%s: crossed a minute boundary (%v)", round, took)
			}
			for k, o := range outs {
				t.Logf("%s, user=%s: %d admitted, %d over, %d late (client deadline), %d failed of %d calls in %v",
					round, ids[k], o.ok, o.over, o.late, o.failed, 3*envoyLoadLimit, took.Round(time.Millisecond))
				if o.ok > envoyLoadLimit {
					t.Errorf("%s, user=%s: %d admitted, want at most %d (%d over, %d late, %d failed)",
						round, ids[k], o.ok, envoyLoadLimit, o.over, o.late, o.failed)
				}
				cells = append(cells, cellCheck{round, ids[k], seq, o.ok})
			}
		}
	}

	// What the limiters admitted, calls Envoy gave up on included: once
	// the leases near the limit went back (100 ms unused), Redis's count of
	// each binding cell is what the region admitted.
	time.Sleep(1500 * time.Millisecond)
	for i, l := range limiters {
		t.Logf("limiter %d: admitted without Redis %v, denied for a caller's deadline or a slow call %v, Redis calls failed %v of %v",
			i, metricValue(t, l.metrics, "sluice_admitted_locally_total"), metricValue(t, l.metrics, "sluice_origin_waits_denied_total"),
			metricValue(t, l.metrics, "sluice_origin_sync_errors_total"), metricValue(t, l.metrics, "sluice_origin_syncs_total"))
	}
	for _, c := range cells {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cur, _, err := origin.Read(ctx, window.Cell{Workspace: rls.DefaultWorkspace, Namespace: "envoyload",
			Identifier: "user=" + c.id, Duration: 60_000, Sequence: c.seq})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, user=%s: Redis counts %d admitted (callers saw %d)", c.round, c.id, cur.Count, c.ok)
		if cur.Count > envoyLoadLimit {
			t.Errorf("%s, user=%s: the limiters admitted %d (Redis's count), want at most %d", c.round, c.id, cur.Count, envoyLoadLimit)
		}
	}
}
