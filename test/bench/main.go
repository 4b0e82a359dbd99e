// Command bench measures Sluice end to end and prints each figure next to
// its baseline from the same run, with the ratio DESIGN.md targets:
//
//   - the warm in-process check (ns/op, allocs/op);
//   - checks per second and p50/p99 latency of one limiter over NATS next to
//     a bare NATS echo responder on the same embedded server, for a
//     synchronous client (64 goroutines calling Request) and an asynchronous
//     one (256 requests in flight on one connection).
//
// Run it with `make bench` or `go run ./test/bench [-d 3s] [-rounds 3]`.
// The machine's speed drifts between runs: compare only ratios.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	sluicenats "github.com/sluicehq/sluice/nats"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

func main() {
	dur := flag.Duration("d", 3*time.Second, "how long each load run lasts")
	rounds := flag.Int("rounds", 3, "runs of each load; the best is reported")
	flag.IntVar(&benchIDs, "ids", benchIDs, "distinct warm identifiers the load spreads over")
	flag.StringVar(&onlyTarget, "only", "", "run only the async load against this target (for profiling)")
	flag.IntVar(&instances, "instances", instances, "micro instances per limiter, as limiter --instances")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the load runs to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		profileOut = f
		if onlyTarget == "" {
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				os.Exit(1)
			}
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(*dur, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(dur time.Duration, rounds int) error {
	// The warm check runs three times, like the loads below, and the best
	// counts: this machine's speed drifts between runs.
	var nsOps []string
	best, allocs := math.Inf(1), int64(0)
	for range 3 {
		warm := testing.Benchmark(benchWarmCheck)
		ns := float64(warm.T.Nanoseconds()) / float64(warm.N)
		nsOps = append(nsOps, fmt.Sprintf("%.1f", ns))
		best, allocs = min(best, ns), max(allocs, warm.AllocsPerOp())
	}
	fmt.Printf("warm in-process check: %.1f ns/op (runs: %s), %d allocs/op (target <= 100 ns, 0 allocs)\n\n",
		best, strings.Join(nsOps, ", "), allocs)

	ctx := context.Background()
	srv, err := sluicenats.StartServer(ctx)
	if err != nil {
		return err
	}
	defer srv.Shutdown()

	echoConn, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer echoConn.Close()
	if _, err := echoConn.QueueSubscribe("echo.>", "echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return err
	}

	// The same echo behind a micro endpoint: the ceiling of any micro service.
	mechoConn, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer mechoConn.Close()
	mecho, err := micro.AddService(mechoConn, micro.Config{Name: "mecho", Version: "1.0.0"})
	if err != nil {
		return err
	}
	defer mecho.Stop()
	if err := mecho.AddEndpoint("echo", micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(r.Data()) }),
		micro.WithEndpointSubject("mecho.>")); err != nil {
		return err
	}

	// One limiter as cmd/limiter runs it: `instances` micro instances, each
	// on its own connection, sharing one service.
	svc := service.New(service.Config{})
	defer svc.Close(ctx)
	stop, err := serveInstances(srv.ClientURL(), bus.LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		return err
	}
	defer stop()

	// The same limiter with the region's Redis as origin, on its own subject
	// prefix so both serve the one server.
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: fmt.Sprintf("sluicebench:%d", time.Now().UnixNano())})
	if err != nil {
		return err
	}
	var redisCmds atomic.Int64
	rd.Client().AddHook(countingHook{&redisCmds})
	if err := rd.Ping(ctx); err != nil {
		return fmt.Errorf("redis at %s: %w (run make services)", redisURL(), err)
	}
	redisSvc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{})})
	defer redisSvc.Close(ctx)
	stopRedis, err := serveInstances(srv.ClientURL(), bus.LimiterConfig{Service: redisSvc, Region: "bench", Subjects: bus.Subjects{Prefix: "redislim"}})
	if err != nil {
		return err
	}
	defer stopRedis()

	client, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer client.Close()
	if err := client.Flush(); err != nil {
		return err
	}

	// Warm the identifiers so the limiter answers from fresh cells.
	bodies := make([][]byte, benchIDs)
	for i := range bodies {
		bodies[i] = bus.AppendCheckRequest(nil, bus.Msgpack, bus.CheckRequest{
			Identifier: "user_" + strconv.Itoa(100000+i), Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
		for _, subj := range []string{"ratelimit.check.bench.api", "redislim.check.bench.api"} {
			if _, err := client.Request(subj, bodies[i], time.Second); err != nil {
				return fmt.Errorf("warm-up check: %w", err)
			}
		}
	}

	targets := []struct{ name, subject string }{
		{"echo", "echo.bench.api"},
		{"micro echo", "mecho.bench.api"},
		{"limiter", "ratelimit.check.bench.api"},
		{"+redis", "redislim.check.bench.api"},
	}
	modes := []struct {
		name string
		load func(*nats.Conn, string, [][]byte, time.Duration) (result, error)
	}{
		{"sync, 64 goroutines", syncLoad},
		{"async, 256 in flight", asyncLoad},
	}
	if onlyTarget != "" {
		for _, tg := range targets {
			if tg.name == onlyTarget {
				if err := pprof.StartCPUProfile(profileOut); err != nil {
					return err
				}
				r, err := asyncLoad(client, tg.subject, bodies, dur)
				pprof.StopCPUProfile()
				fmt.Printf("%s: %.0f/s p99 %v\n", tg.name, r.rate, r.p99)
				return err
			}
		}
		return fmt.Errorf("no target %q", onlyTarget)
	}
	fmt.Printf("%-22s %-10s %12s %10s %10s\n", "client", "target", "req/s", "p50", "p99")
	for _, m := range modes {
		best := map[string]result{}
		for range rounds {
			for _, tg := range targets {
				r, err := m.load(client, tg.subject, bodies, dur)
				if err != nil {
					return fmt.Errorf("%s %s: %w", m.name, tg.name, err)
				}
				if b, ok := best[tg.name]; !ok || r.rate > b.rate {
					best[tg.name] = r
				}
			}
		}
		for _, tg := range targets {
			r := best[tg.name]
			fmt.Printf("%-22s %-10s %12.0f %10s %10s\n", m.name, tg.name, r.rate, r.p50, r.p99)
		}
		e, me, l := best["echo"], best["micro echo"], best["limiter"]
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   limiter / echo (targets: throughput >= 0.80x, p99 <= 1.25x)\n",
			m.name, "ratio", l.rate/e.rate, "", float64(l.p99)/float64(e.p99))
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   micro echo / echo: the micro framework's own share\n",
			m.name, "ratio", me.rate/e.rate, "", float64(me.p99)/float64(e.p99))
		rl := best["+redis"]
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   limiter with Redis origin / in-memory (target: throughput >= 0.90x)\n\n",
			m.name, "ratio", rl.rate/l.rate, "", float64(rl.p99)/float64(l.p99))
	}

	// One hot identifier: how many Redis commands per admitted check.
	hot := [][]byte{bus.AppendCheckRequest(nil, bus.Msgpack, bus.CheckRequest{
		Identifier: "hot_user", Limit: window.MaxLimit, Duration: 60_000, Cost: 1})}
	if _, err := client.Request("redislim.check.bench.api", hot[0], time.Second); err != nil {
		return err
	}
	before := redisCmds.Load()
	r, err := asyncLoad(client, "redislim.check.bench.api", hot, dur)
	if err != nil {
		return err
	}
	time.Sleep(50 * time.Millisecond) // the last replay
	cmds := redisCmds.Load() - before
	admitted := r.rate * dur.Seconds()
	fmt.Printf("one hot identifier, Redis origin: %.0f checks, %d Redis commands: %.5f commands per admitted check (target <= 0.01)\n",
		admitted, cmds, float64(cmds)/admitted)

	// Cold checks: every check names a new identifier, so the limiter reads
	// Redis before deciding.
	cold, err := coldLoad(client, "redislim.check.bench.api", 2000)
	if err != nil {
		return err
	}
	warmR, err := coldLoad(client, "redislim.check.bench.api", -2000)
	if err != nil {
		return err
	}
	fmt.Printf("cold check (Redis read first), one client: p50 %v, p99 %v; warm check on the same path: p50 %v, p99 %v\n",
		cold.p50, cold.p99, warmR.p50, warmR.p99)
	return globalBench(ctx, dur)
}

// profileOut receives the CPU profile (-cpuprofile).
var profileOut io.Writer = io.Discard

// serveInstances serves cfg's service as `instances` micro instances on
// their own connections, as cmd/limiter does.
func serveInstances(url string, cfg bus.LimiterConfig) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
	for range instances {
		nc, err := nats.Connect(url)
		if err != nil {
			stop()
			return nil, err
		}
		lim, err := bus.Serve(nc, cfg)
		if err != nil {
			nc.Close()
			stop()
			return nil, err
		}
		stops = append(stops, func() { _ = lim.Shutdown(context.Background()); nc.Close() })
	}
	return stop, nil
}

func redisURL() string {
	if u := os.Getenv("SLUICE_TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379"
}

// countingHook counts the commands a go-redis client sends, pipelines
// included.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// coldLoad sends n checks one at a time, each for a new identifier (n > 0)
// or all for one warm identifier (n < 0), and reports their latency.
func coldLoad(nc *nats.Conn, subject string, n int) (result, error) {
	warm := n < 0
	if warm {
		n = -n
	}
	lat := make([]time.Duration, 0, n)
	base := time.Now().UnixNano()
	start := time.Now()
	for i := range n {
		id := fmt.Sprintf("cold_%d_%d", base, i)
		if warm {
			id = "warm_one"
		}
		body := bus.AppendCheckRequest(nil, bus.Msgpack, bus.CheckRequest{Identifier: id, Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
		t := time.Now()
		if _, err := nc.Request(subject, body, 5*time.Second); err != nil {
			return result{}, err
		}
		lat = append(lat, time.Since(t))
	}
	return summarize(lat, time.Since(start)), nil
}

var (
	benchIDs   = 1000
	onlyTarget string
	instances  = 1 // cmd/limiter's default --instances
)

func benchWarmCheck(b *testing.B) {
	s := service.New(service.Config{})
	defer s.Close(context.Background())
	q := service.Query{Workspace: "ws", Namespace: "ns", Identifier: "user_1234567890abcdef",
		Limit: window.MaxLimit, Duration: 60_000, Cost: 1}
	ctx := context.Background()
	if _, err := s.Check(ctx, q); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok, _ := s.TryCheck(q); !ok {
			_, _ = s.Check(ctx, q)
		}
	}
}

type result struct {
	rate     float64
	p50, p99 time.Duration
}

func summarize(lat []time.Duration, elapsed time.Duration) result {
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(float64(len(lat))*p))].Round(time.Microsecond)
	}
	return result{rate: float64(len(lat)) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99)}
}

// syncLoad runs 64 goroutines, each sending one request at a time.
func syncLoad(nc *nats.Conn, subject string, bodies [][]byte, dur time.Duration) (result, error) {
	const workers = 64
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		all     []time.Duration
		failure atomic.Value
	)
	start := time.Now()
	deadline := start.Add(dur)
	for w := range workers {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<16)
			for i := w; time.Now().Before(deadline); i += workers {
				t := time.Now()
				if _, err := nc.Request(subject, bodies[i%len(bodies)], 5*time.Second); err != nil {
					failure.Store(err)
					return
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err, ok := failure.Load().(error); ok {
		return result{}, err
	}
	return summarize(all, time.Since(start)), nil
}

// asyncLoad keeps 256 requests in flight on one connection: each reply
// sends the next request of its slot.
func asyncLoad(nc *nats.Conn, subject string, bodies [][]byte, dur time.Duration) (result, error) {
	const inflight = 256
	inbox := nats.NewInbox()
	sent := make([]time.Time, inflight)
	lat := make([]time.Duration, 0, 1<<20)
	done := make(chan struct{})
	var stopping bool
	start := time.Now()
	deadline := start.Add(dur)
	outstanding := inflight
	var n int
	var failure error
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		now := time.Now()
		slot, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil {
			return
		}
		lat = append(lat, now.Sub(sent[slot]))
		if stopping || now.After(deadline) {
			stopping = true
			if outstanding--; outstanding == 0 {
				close(done)
			}
			return
		}
		n++
		sent[slot] = time.Now()
		if err := nc.PublishRequest(subject, m.Subject, bodies[n%len(bodies)]); err != nil && failure == nil {
			failure = err
		}
	})
	if err != nil {
		return result{}, err
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return result{}, err
	}
	if err := nc.Flush(); err != nil {
		return result{}, err
	}
	for slot := range inflight {
		sent[slot] = time.Now()
		if err := nc.PublishRequest(subject, inbox+"."+strconv.Itoa(slot), bodies[slot%len(bodies)]); err != nil {
			return result{}, err
		}
	}
	select {
	case <-done:
	case <-time.After(dur + 10*time.Second):
		return result{}, fmt.Errorf("replies stopped arriving")
	}
	if failure != nil {
		return result{}, failure
	}
	return summarize(lat, time.Since(start)), nil
}
