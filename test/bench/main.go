// Command bench measures Sluice end to end and prints each figure next to
// its baseline from the same run, with the ratio docs/performance.md targets:
//
//   - the warm in-process check (ns/op, allocs/op);
//   - checks per second and p50/p99 latency of one limiter over NATS next to
//     a bare NATS echo responder on the same embedded server, for a
//     synchronous client (64 goroutines calling Request) and an asynchronous
//     one (256 requests in flight on one connection).
//
// Each load gives every target the same time, cut into short slices that
// alternate between the targets (in a rotating order), and pools the
// slices: the machine's speed drifts by tens of percent over seconds, and
// fine interleaving lets each ratio compare targets under the same drift.
//
// Run it with `make bench` or `go run ./test/bench [-d 9s] [-slice 250ms]`.
// Compare only ratios from one run.
package main

import (
	"context"
	"errors"
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
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

func main() {
	dur := flag.Duration("d", 9*time.Second, "how long each load runs against each target, in all")
	slice := flag.Duration("slice", 250*time.Millisecond, "how long one slice of a load runs before the next target's")
	flag.IntVar(&benchIDs, "ids", benchIDs, "distinct warm identifiers the load spreads over")
	flag.StringVar(&onlyTarget, "only", "", "run only the async load against this target (for profiling)")
	flag.IntVar(&instances, "instances", instances, "micro instances per limiter, as limiter --instances")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the load runs to this file")
	durableOnly := flag.Bool("durable-only", false, "run only the publication and store path with and without sweeps")
	hotOnly := flag.Bool("hot-only", false, "run only the hot identifier on Redis: Redis commands per admitted check far from and at twice the limit")
	flag.Parse()
	if *hotOnly {
		if err := runHotOnly(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *leasesOnly {
		if err := leaseTradeOff(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *durableOnly {
		if err := runDurableOnly(*dur); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
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
	if err := run(*dur, *slice); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(dur, slice time.Duration) error {
	if *coldNATSOnly {
		return coldNATSBench(dur, slice)
	}
	if *rlsColdOnly {
		return rlsColdBench(dur)
	}
	if !*checksOnly {
		if only, err := rlsBench(context.Background(), dur, slice); only || err != nil {
			return err
		}
	}
	if err := checksBench(dur, slice); err != nil || *checksOnly {
		return err
	}
	// The warm check runs three times, like the loads below, and the best
	// counts: this machine's speed drifts between runs.
	bestOfThree("warm in-process check", benchWarmCheck)
	bestOfThree("warm in-process check, an override matching among 10,000", benchWarmCheckOverride)
	fmt.Println()

	ctx := context.Background()
	srv, err := natstest.StartServer(ctx)
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
	stop, err := serveInstances(srv.ClientURL(), transport.LimiterConfig{Service: svc, Region: "bench"})
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
	stopRedis, err := serveInstances(srv.ClientURL(), transport.LimiterConfig{Service: redisSvc, Region: "bench", Subjects: wire.Subjects{Prefix: "redislim"}})
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
		bodies[i] = wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{
			Identifier: "user_" + strconv.Itoa(100000+i), Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
		for _, subj := range []string{"ratelimit.check.bench.api", "redislim.check.bench.api"} {
			if _, err := client.Request(subj, bodies[i], time.Second); err != nil {
				return fmt.Errorf("warm-up check: %w", err)
			}
		}
	}

	targets := []target{
		{"echo", "echo.bench.api", 0},
		{"micro echo", "mecho.bench.api", 0},
		{"limiter", "ratelimit.check.bench.api", 0},
		{"+redis", "redislim.check.bench.api", 200 * time.Millisecond},
	}
	modes := []struct {
		name string
		load loadFunc
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
				var t tally
				err := asyncLoad(client, tg.subject, bodies, dur, &t)
				pprof.StopCPUProfile()
				r := t.result()
				fmt.Printf("%s: %.0f/s p99 %v\n", tg.name, r.rate, r.p99)
				return err
			}
		}
		return fmt.Errorf("no target %q", onlyTarget)
	}
	nslices := max(1, int(dur/slice))
	// interleave runs the load m against the named targets, alternating
	// slices, and returns each target's pooled result.
	interleave := func(load loadFunc, names ...string) (map[string]result, error) {
		tallies := make([]tally, len(names))
		for i := range nslices {
			for j := range names {
				k := (i + j) % len(names) // rotate which target goes first
				tg := targets[slices.IndexFunc(targets, func(t target) bool { return t.name == names[k] })]
				cpu := processCPU()
				if err := load(client, tg.subject, bodies, slice, &tallies[k]); err != nil {
					return nil, fmt.Errorf("%s: %w", tg.name, err)
				}
				tallies[k].cpu += processCPU() - cpu
				// The Redis limiter replays for up to 100 ms after its
				// load: let that finish before the next target's slice.
				time.Sleep(tg.settle)
			}
		}
		res := map[string]result{}
		for k, name := range names {
			res[name] = tallies[k].result()
		}
		return res, nil
	}
	fmt.Printf("each load: %d slices of %v per target, interleaved with the other targets of its group\n", nslices, slice)
	fmt.Printf("%-22s %-10s %12s %10s %10s %12s\n", "client", "target", "req/s", "p50", "p99", "CPU/req")
	row := func(mode, name string, r result) {
		fmt.Printf("%-22s %-10s %12.0f %10s %10s %12s\n", mode, name, r.rate, r.p50, r.p99, r.cpu)
	}
	for _, m := range modes {
		// The echoes and the limiter; then the limiter and the limiter with
		// Redis, apart, because a Redis limiter's cells go stale (and are
		// read again) when it idles for FreshFor, which three other
		// targets' slices would make it do.
		res, err := interleave(m.load, "echo", "micro echo", "limiter")
		if err != nil {
			return fmt.Errorf("%s %w", m.name, err)
		}
		for _, name := range []string{"echo", "micro echo", "limiter"} {
			row(m.name, name, res[name])
		}
		e, me, l := res["echo"], res["micro echo"], res["limiter"]
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   limiter / echo (targets: throughput >= 0.80x, p99 <= 1.25x)\n",
			m.name, "ratio", l.rate/e.rate, "", float64(l.p99)/float64(e.p99))
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   micro echo / echo: the micro framework's own share\n",
			m.name, "ratio", me.rate/e.rate, "", float64(me.p99)/float64(e.p99))
		res, err = interleave(m.load, "limiter", "+redis")
		if err != nil {
			return fmt.Errorf("%s %w", m.name, err)
		}
		l, rl := res["limiter"], res["+redis"]
		row(m.name, "limiter", l)
		row(m.name, "+redis", rl)
		fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   limiter with Redis origin / in-memory (target: throughput >= 0.90x)\n\n",
			m.name, "ratio", rl.rate/l.rate, "", float64(rl.p99)/float64(l.p99))
	}

	// One hot identifier: how many Redis commands per admitted check.
	hot := [][]byte{wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{
		Identifier: "hot_user", Limit: window.MaxLimit, Duration: 60_000, Cost: 1})}
	if _, err := client.Request("redislim.check.bench.api", hot[0], time.Second); err != nil {
		return err
	}
	before := redisCmds.Load()
	var hotTally tally
	if err := asyncLoad(client, "redislim.check.bench.api", hot, 3*time.Second, &hotTally); err != nil {
		return err
	}
	time.Sleep(50 * time.Millisecond) // the last settle round
	cmds := redisCmds.Load() - before
	admitted := float64(hotTally.n)
	fmt.Printf("one hot identifier, Redis origin: %.0f checks, %d Redis commands: %.5f commands per admitted check (target <= 0.01)\n",
		admitted, cmds, float64(cmds)/admitted)
	if err := hotRegionBench(ctx, srv.ClientURL(), client); err != nil {
		return err
	}
	if err := burstBench(ctx, srv.ClientURL(), client); err != nil {
		return err
	}

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
	if err := globalBench(ctx, dur); err != nil {
		return err
	}
	return durableBench(ctx, srv.ClientURL(), dur/3)
}

// runHotOnly runs hotRegionBench alone on a server of its own.
func runHotOnly() error {
	ctx := context.Background()
	srv, err := natstest.StartServer(ctx)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	client, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer client.Close()
	return hotRegionBench(ctx, srv.ClientURL(), client)
}

// runDurableOnly runs durableBench alone on a server of its own.
func runDurableOnly(dur time.Duration) error {
	ctx := context.Background()
	srv, err := natstest.StartServer(ctx)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	return durableBench(ctx, srv.ClientURL(), dur/3)
}

// hotRegionBench measures one hot identifier served by three limiters of a
// region sharing one Redis (a queue group of three services), far from its
// limit and at twice its limit (a limit of half the far rate per second):
// checks/s, p99, Redis commands per admitted check, and how many admissions
// the region decided in Redis (near the limit).
func hotRegionBench(ctx context.Context, url string, client *nats.Conn) error {
	var cmds atomic.Int64
	prefix := fmt.Sprintf("sluicebench:hot:%d", time.Now().UnixNano())
	var svcs []*service.Service
	for range 3 {
		rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
		if err != nil {
			return err
		}
		rd.Client().AddHook(countingHook{&cmds})
		svc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{})})
		defer svc.Close(ctx)
		stop, err := serveInstances(url, transport.LimiterConfig{Service: svc, Region: "bench", Subjects: wire.Subjects{Prefix: "hotregion"}})
		if err != nil {
			return err
		}
		defer stop()
		svcs = append(svcs, svc)
	}
	run := func(name, id string, limit int64) (result, error) {
		body := [][]byte{wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: limit, Duration: 1000, Cost: 1})}
		for range 3 { // warm the cell in each limiter (the queue group picks one each time)
			if _, err := client.Request("hotregion.check.bench.api", body[0], time.Second); err != nil {
				return result{}, err
			}
		}
		before, admitsBefore := cmds.Load(), int64(0)
		for _, s := range svcs {
			admitsBefore += s.Stats().OriginRequests
		}
		t := tally{countAdmitted: true}
		if err := asyncLoad(client, "hotregion.check.bench.api", body, 3*time.Second, &t); err != nil {
			return result{}, err
		}
		time.Sleep(150 * time.Millisecond) // the last replays
		admits := -admitsBefore
		for _, s := range svcs {
			admits += s.Stats().OriginRequests
		}
		r := t.result()
		admitted := float64(t.admitted)
		fmt.Printf("%-34s %10.0f %10s %10s %10.0f %12.4f %12d\n", name, r.rate, r.p50, r.p99, admitted,
			float64(cmds.Load()-before)/max(admitted, 1), admits)
		return r, nil
	}
	fmt.Printf("\none hot identifier, three limiters sharing Redis, 1s windows, async 256 in flight:\n")
	fmt.Printf("%-34s %10s %10s %10s %10s %12s %12s\n", "", "checks/s", "p50", "p99", "admitted", "cmds/admit", "Redis admits")
	far, err := run("far from its limit", "hot_far", window.MaxLimit)
	if err != nil {
		return err
	}
	_, err = run(fmt.Sprintf("at twice its limit (%d/s)", int64(far.rate/2)), "hot_twice", int64(far.rate/2))
	return err
}

// processCPU returns the CPU time, user and system, this process has used:
// every target, the NATS server and the client share it, so its growth per
// request compares what each target costs the machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// target is a responder the loads measure.
type target struct {
	name, subject string
	settle        time.Duration // idle time after each of its slices
}

// profileOut receives the CPU profile (-cpuprofile).
var profileOut io.Writer = io.Discard

// serveInstances serves cfg's service as `instances` micro instances on
// their own connections, as cmd/limiter does.
func serveInstances(url string, cfg transport.LimiterConfig) (stop func(), err error) {
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
		lim, err := transport.Serve(nc, cfg)
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
		body := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
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

// bestOfThree runs bench three times and prints the best time an
// operation, every run's, and the most allocations an operation of any.
func bestOfThree(name string, bench func(*testing.B)) {
	var nsOps []string
	best, allocs := math.Inf(1), int64(0)
	for range 3 {
		r := testing.Benchmark(bench)
		ns := float64(r.T.Nanoseconds()) / float64(r.N)
		nsOps = append(nsOps, fmt.Sprintf("%.1f", ns))
		best, allocs = min(best, ns), max(allocs, r.AllocsPerOp())
	}
	fmt.Printf("%s: %.1f ns/op (runs: %s), %d allocs/op (target <= 100 ns, 0 allocs)\n",
		name, best, strings.Join(nsOps, ", "), allocs)
}

func benchWarmCheck(b *testing.B) { warmCheck(b, nil) }

// benchWarmCheckOverride is benchWarmCheck with 10,000 overrides in the
// identifier's namespace, one of them (a prefix) matching it.
func benchWarmCheckOverride(b *testing.B) {
	tbl := policy.NewTable()
	set := func(pattern string) {
		if _, err := tbl.Set(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: pattern},
			policy.Override{Limit: window.MaxLimit, Duration: 60_000}, time.Now().UnixMilli(), "bench"); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 4999 {
		set("id_" + strconv.Itoa(i))
		set("p" + strconv.Itoa(i) + "_*")
	}
	set("user_*")
	warmCheck(b, tbl)
}

func warmCheck(b *testing.B, policies *policy.Table) {
	s := service.New(service.Config{Policies: policies})
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
	cpu      time.Duration // process CPU time per request
}

// loadFunc runs one slice of a load against subject for dur and adds what
// it measured to t.
type loadFunc func(nc *nats.Conn, subject string, bodies [][]byte, dur time.Duration, t *tally) error

// tally pools the slices of one load against one target: requests answered,
// time spent, and their latencies in a histogram of 1 µs buckets (longer
// latencies than the histogram holds are kept as they are).
type tally struct {
	n int
	// countAdmitted makes the loads decode each reply and count the
	// admitted ones in admitted.
	countAdmitted bool
	admitted      int
	elapsed       time.Duration
	cpu           time.Duration // the process's CPU time (user and system) over the slices
	buckets       []uint32
	over          []time.Duration
}

const histBuckets = 100_000 // 1 µs each: up to 100 ms

func (t *tally) add(d time.Duration) {
	if t.buckets == nil {
		t.buckets = make([]uint32, histBuckets)
	}
	t.n++
	if us := d / time.Microsecond; us < histBuckets {
		t.buckets[us]++
	} else {
		t.over = append(t.over, d)
	}
}

// quantile returns the latency below which a fraction p of requests fell,
// to the microsecond.
func (t *tally) quantile(p float64) time.Duration {
	if t.n == 0 {
		return 0
	}
	rank := min(t.n-1, int(float64(t.n)*p))
	seen := 0
	for us, c := range t.buckets {
		if seen += int(c); seen > rank {
			return time.Duration(us) * time.Microsecond
		}
	}
	slices.Sort(t.over)
	return t.over[rank-seen].Round(time.Microsecond)
}

func (t *tally) result() result {
	if t.elapsed == 0 {
		return result{}
	}
	return result{rate: float64(t.n) / t.elapsed.Seconds(), p50: t.quantile(0.50), p99: t.quantile(0.99),
		cpu: t.cpu / time.Duration(max(1, t.n))}
}

func summarize(lat []time.Duration, elapsed time.Duration) result {
	var t tally
	for _, d := range lat {
		t.add(d)
	}
	t.elapsed = elapsed
	return t.result()
}

// syncLoad runs 64 goroutines, each sending one request at a time.
func syncLoad(nc *nats.Conn, subject string, bodies [][]byte, dur time.Duration, t *tally) error {
	return callers(64, dur, t, func(i int) error {
		_, err := nc.Request(subject, bodies[i%len(bodies)], 5*time.Second)
		return err
	})
}

// callers runs n goroutines for dur, each calling call with its own
// sequence of i (w, w+n, w+2n, ...) one call at a time, and adds every
// call's latency and the elapsed time to t. It stops a goroutine at its
// first error and returns one of them.
func callers(n int, dur time.Duration, t *tally, call func(i int) error) error {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		failure atomic.Value
	)
	start := time.Now()
	deadline := start.Add(dur)
	for w := range n {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<12)
			for i := w; time.Now().Before(deadline); i += n {
				t0 := time.Now()
				if err := call(i); err != nil {
					failure.Store(err)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			for _, d := range lat {
				t.add(d)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	t.elapsed += time.Since(start)
	if err, ok := failure.Load().(error); ok {
		return err
	}
	return nil
}

// asyncLoad keeps 256 requests in flight on one connection: each reply
// sends the next request of its slot.
func asyncLoad(nc *nats.Conn, subject string, bodies [][]byte, dur time.Duration, t *tally) error {
	n := 0
	next := func(int) []byte { n++; return bodies[n%len(bodies)] }
	return slotLoad(nc, subject, 256, dur, next, func(m *nats.Msg, d time.Duration) error {
		t.add(d)
		if t.countAdmitted {
			if r, err := wire.DecodeCheckResponse(bus.Msgpack, m.Data); err == nil && r.Success {
				t.admitted++
			}
		}
		return nil
	}, t)
}

// slotLoad keeps inflight requests in flight on nc for dur, in slots: each
// reply is handed to reply with its latency, and, until dur has passed,
// sends the slot's next request, next(slot). It adds the elapsed time to t
// and returns the first error of reply or of a publish. Replies are
// handled on one goroutine (the subscription's), so next and reply need no
// locks.
func slotLoad(nc *nats.Conn, subject string, inflight int, dur time.Duration, next func(slot int) []byte,
	reply func(m *nats.Msg, d time.Duration) error, t *tally) error {
	inbox := nats.NewInbox()
	sent := make([]time.Time, inflight)
	done := make(chan struct{})
	var (
		stopping    bool
		failure     error
		outstanding = inflight
	)
	start := time.Now()
	deadline := start.Add(dur)
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		now := time.Now()
		slot, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil || slot < 0 || slot >= inflight {
			return
		}
		if err := reply(m, now.Sub(sent[slot])); err != nil && failure == nil {
			failure = err
		}
		if stopping || now.After(deadline) {
			stopping = true
			if outstanding--; outstanding == 0 {
				close(done)
			}
			return
		}
		body := next(slot)
		sent[slot] = time.Now()
		if err := nc.PublishRequest(subject, m.Subject, body); err != nil && failure == nil {
			failure = err
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", inbox, err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return fmt.Errorf("pending limits: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("flush the subscription: %w", err)
	}
	for slot := range inflight {
		body := next(slot)
		sent[slot] = time.Now()
		if err := nc.PublishRequest(subject, inbox+"."+strconv.Itoa(slot), body); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-done:
	case <-time.After(dur + 10*time.Second):
		return errors.New("replies stopped arriving")
	}
	t.elapsed += time.Since(start)
	return failure
}
