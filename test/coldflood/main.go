// Command coldflood offers one limiter a flood of checks on identifiers it
// has never seen (every check is cold: it would read Redis first) while
// Redis answers slowly, and measures what the limiter holds and how fast it
// answers:
//
//   - an embedded NATS server and, in this process, a limiter whose Redis
//     (the shared one) sits behind a TCP proxy that delays every byte by
//     -delay each way, and behind the read and apply breakers;
//   - an open-loop sender (internal/flood): -rate checks a second for -d,
//     each on a new identifier, whatever the limiter answers, each with its
//     own reply subject so its latency is measured.
//
// Every 10ms it samples the process's goroutines and live heap. It prints
// the checks offered and answered, the latency percentiles and maximum, the
// largest goroutine count and heap, how many checks waited on Redis and how
// many were decided locally because -max-waiting were waiting already. It
// exits 1 if a check was not answered within 5s.
//
//	go run ./test/coldflood [-rate 50000] [-d 10s] [-delay 20ms] [-max-waiting 4096]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/internal/flood"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

func main() {
	rate := flag.Int("rate", 50_000, "checks offered per second")
	dur := flag.Duration("d", 10*time.Second, "how long the flood lasts")
	delay := flag.Duration("delay", 20*time.Millisecond, "delay of every byte to and from Redis, each way")
	maxWaiting := flag.Int("max-waiting", transport.DefaultMaxWaiting, "the limiter's --max-waiting-checks")
	redisURL := flag.String("redis-url", "redis://127.0.0.1:6379", "the Redis behind the proxy")
	flag.Parse()
	if err := run(*rate, *dur, *delay, *maxWaiting, *redisURL); err != nil {
		fmt.Fprintln(os.Stderr, "coldflood:", err)
		os.Exit(1)
	}
}

func run(rate int, dur, delay time.Duration, maxWaiting int, redisURL string) error {
	ctx := context.Background()
	srv, err := natstest.StartServer(ctx)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	proxy, err := tcpproxy.Start(strings.TrimPrefix(redisURL, "redis://"))
	if err != nil {
		return err
	}
	defer proxy.Close()
	proxy.SetDelay(delay)
	prefix := fmt.Sprintf("sluiceflood:%d", time.Now().UnixNano())
	rd, err := region.NewRedis(region.RedisConfig{URL: "redis://" + proxy.Addr(), KeyPrefix: prefix})
	if err != nil {
		return err
	}
	lnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer lnc.Close()
	svc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{Name: "redis"})})
	lim, err := transport.Serve(lnc, transport.LimiterConfig{Service: svc, MaxWaiting: maxWaiting})
	if err != nil {
		return err
	}
	if err := lnc.Flush(); err != nil {
		return err
	}
	cnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer cnc.Close()
	res, err := flood.Cold(cnc, "ratelimit.check.flood.api", rate, dur, 5*time.Second)
	if err != nil {
		return err
	}
	st, ss := lim.Stats(), svc.Stats()
	fmt.Printf("offered %d cold checks in %v (%.0f/s), Redis delayed %v each way, max waiting %d\n",
		res.Sent, res.SendTook.Round(time.Millisecond), float64(res.Sent)/res.SendTook.Seconds(), delay, maxWaiting)
	fmt.Printf("answered %d (%d admitted, %d denied, %d errors)\n", res.Answered, st.Admitted, st.Denied,
		st.BadRequests+st.InternalErrors+st.Unavailable)
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	fmt.Printf("latency p50 %v  p99 %v  p99.9 %v  max %v\n", round(res.P50), round(res.P99), round(res.P999), round(res.Max))
	fmt.Printf("waited on Redis %d, decided locally as %d were waiting %d; Redis syncs %d (%d failed)\n",
		st.AsyncChecks, maxWaiting, st.NotWaited, ss.OriginSyncs, ss.OriginSyncErrors)
	fmt.Printf("goroutines: %d before, %d at most; live heap at most %.1f MB\n",
		res.BaseGoroutines, res.MaxGoroutines, float64(res.MaxHeap)/(1<<20))

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = errors.Join(lim.Shutdown(sctx), svc.Close(sctx))
	if res.Answered < res.Sent {
		err = errors.Join(err, fmt.Errorf("%d of %d checks were not answered within 5s", res.Sent-res.Answered, res.Sent))
	}
	return err
}
