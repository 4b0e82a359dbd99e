// Command coldflood offers one limiter a flood of checks on identifiers it
// has never seen (every check is cold: it would read Redis first) while
// Redis answers slowly, and measures what the limiter holds and how fast it
// answers:
//
//   - an embedded NATS server and, in this process, a limiter whose Redis
//     (the shared one) sits behind a TCP proxy that delays every byte by
//     -delay each way, and behind the read and replay breakers;
//   - an open-loop sender: -rate checks a second for -d, each on a new
//     identifier, whatever the limiter answers, each with its own reply
//     subject so its latency is measured.
//
// Every 100ms it samples the process's goroutines and live heap. It prints
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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	sluicenats "github.com/sluicehq/sluice/nats"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

func main() {
	rate := flag.Int("rate", 50_000, "checks offered per second")
	dur := flag.Duration("d", 10*time.Second, "how long the flood lasts")
	delay := flag.Duration("delay", 20*time.Millisecond, "delay of every byte to and from Redis, each way")
	maxWaiting := flag.Int("max-waiting", bus.DefaultMaxWaiting, "the limiter's --max-waiting-checks")
	redisURL := flag.String("redis-url", "redis://127.0.0.1:6379", "the Redis behind the proxy")
	flag.Parse()
	if err := run(*rate, *dur, *delay, *maxWaiting, *redisURL); err != nil {
		fmt.Fprintln(os.Stderr, "coldflood:", err)
		os.Exit(1)
	}
}

func run(rate int, dur, delay time.Duration, maxWaiting int, redisURL string) error {
	ctx := context.Background()
	srv, err := sluicenats.StartServer(ctx)
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
	lim, err := bus.Serve(lnc, bus.LimiterConfig{Service: svc, MaxWaiting: maxWaiting})
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

	n := int(int64(rate) * int64(dur) / int64(time.Second))
	sentAt := make([]int64, n) // unix ns
	took := make([]int64, n)   // ns; 0: no answer yet
	var answered atomic.Int64
	inbox := cnc.NewRespInbox()
	sub, err := cnc.Subscribe(inbox+".*", func(m *nats.Msg) {
		i, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil || i < 0 || i >= n || took[i] != 0 {
			return
		}
		took[i] = time.Now().UnixNano() - sentAt[i]
		answered.Add(1)
	})
	if err != nil {
		return err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}

	var (
		maxGoroutines, maxHeap atomic.Int64
		stopSampling           = make(chan struct{})
		sampled                sync.WaitGroup
	)
	base := runtime.NumGoroutine()
	sampled.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
			maxGoroutines.Store(max(maxGoroutines.Load(), int64(runtime.NumGoroutine())))
			runtime.ReadMemStats(&ms)
			maxHeap.Store(max(maxHeap.Load(), int64(ms.HeapAlloc)))
		}
	})

	// The sender: batches of checks every millisecond, on schedule.
	body := make([]byte, 0, 64)
	start := time.Now()
	for i := 0; i < n; {
		due := int(time.Since(start) * time.Duration(rate) / time.Second)
		for ; i < n && i <= due; i++ {
			body = bus.AppendCheckRequest(body[:0], bus.Msgpack, bus.CheckRequest{
				Identifier: "flood-" + strconv.Itoa(i), Limit: 1_000_000, Duration: 60_000, Cost: 1})
			m := &nats.Msg{Subject: "ratelimit.check.flood.api", Reply: inbox + "." + strconv.Itoa(i), Data: body}
			sentAt[i] = time.Now().UnixNano()
			if err := cnc.PublishMsg(m); err != nil {
				return err
			}
		}
		time.Sleep(time.Millisecond)
	}
	sendTook := time.Since(start)
	deadline := time.Now().Add(5 * time.Second)
	for answered.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stopSampling)
	sampled.Wait()
	_ = sub.Unsubscribe()

	lat := make([]time.Duration, 0, n)
	for i := range n {
		if took[i] > 0 {
			lat = append(lat, time.Duration(took[i]))
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(10 * time.Microsecond)
	}
	st, ss := lim.Stats(), svc.Stats()
	fmt.Printf("offered %d cold checks in %v (%.0f/s), Redis delayed %v each way, max waiting %d\n",
		n, sendTook.Round(time.Millisecond), float64(n)/sendTook.Seconds(), delay, maxWaiting)
	fmt.Printf("answered %d (%d admitted, %d denied, %d errors)\n", len(lat), st.Admitted, st.Denied,
		st.BadRequests+st.InternalErrors+st.Unavailable)
	fmt.Printf("latency p50 %v  p99 %v  p99.9 %v  max %v\n", pct(0.5), pct(0.99), pct(0.999), pct(1))
	fmt.Printf("waited on Redis %d, decided locally as %d were waiting %d; Redis reads %d (%d failed)\n",
		st.AsyncChecks, maxWaiting, st.NotWaited, ss.OriginReads, ss.OriginReadErrors)
	fmt.Printf("goroutines: %d before, %d at most; live heap at most %.1f MB\n",
		base, maxGoroutines.Load(), float64(maxHeap.Load())/(1<<20))

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = errors.Join(lim.Shutdown(sctx), svc.Close(sctx))
	if len(lat) < n {
		err = errors.Join(err, fmt.Errorf("%d of %d checks were not answered within 5s", n-len(lat), n))
	}
	return err
}
