package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsColdOnly makes bench run only rlsColdBench; rlsColdRounds is how
// often each of its loads runs against each system.
var (
	rlsColdOnly = flag.Bool("rls-cold", false,
		"run only Envoy's most common load against a limiter process on a Redis of its own: a limit per client address of 1s windows "+
			"over 10,000 addresses at 16, 64 and 256 callers, and 10 keys near their limit at 64, each call with Envoy's 20ms deadline "+
			"over 4 gRPC connections; reports calls/s, p50/p99/p99.9, errors, CPU a call of the limiter and of Redis, and breaker openings "+
			"(with -upstream-ratelimit, side by side with envoyproxy/ratelimit)")
	rlsColdRounds = flag.Int("rounds", 1, "with -rls-cold: runs of each load against each system, in turn; the medians are reported")
)

// rlsColdYAML is the rate limit configuration every -rls-cold system serves.
const rlsColdYAML = "domain: bench\ndescriptors:\n" +
	"  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000}\n" +
	"  - key: near\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"

// coldSystem is a rate limit service under the -rls-cold loads: a process
// of its own and 4 gRPC connections to it, as a 4-worker Envoy holds.
type coldSystem struct {
	name    string
	pid     int
	clients []rlsv3.RateLimitServiceClient
	// opens returns the breaker openings so far; nil where the system has
	// no breaker.
	opens func() (int64, error)
	// metrics returns the limiter's counters named in coldMetrics, by
	// name; nil where the system is not a limiter.
	metrics func() (map[string]float64, error)
	stop    func()
}

// coldRun is what one run of a load against one system measured, its CPU
// times in µs a call.
type coldRun struct {
	rate, answered   float64 // calls a second, and those answered within the deadline
	p50, p99, p999   time.Duration
	errors           int
	srvCPU, redisCPU float64
	// genCPU is the load generator's (this process's) CPU a call: on a
	// machine of few cores it shares them with the system measured.
	genCPU    float64
	opens     int64
	redisCmds float64 // Redis commands a call (INFO commandstats)
	// For a limiter: the syncs a round trip to Redis carried (the batch
	// the load produced), the checks' syncs, the cells settle rounds
	// carried and the syncs first touches decided, a call.
	tripBatch, syncs, settled, touches float64
	okPerValue                         []int
	errPerValue                        []int
}

// rlsColdBench runs the -rls-cold loads, each for dur, -rounds times
// against a limiter process of its own (cmd/limiter with --rls-listen,
// default flags otherwise) and, with -upstream-ratelimit, as often against
// envoyproxy/ratelimit, the two in turn, both on the same YAML and on a
// redis-server of the bench's own, so that Redis's CPU time is the load's
// alone. Every run has descriptor values of its own, so it starts from zero
// counts.
func rlsColdBench(dur time.Duration) error {
	if *rlsColdRounds < 1 {
		return fmt.Errorf("-rounds %d: at least 1", *rlsColdRounds)
	}
	dir, err := os.MkdirTemp("", "sluice-bench-rls-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	conf := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(conf, []byte(rlsColdYAML), 0o600); err != nil {
		return fmt.Errorf("write the rate limit configuration: %w", err)
	}
	rURL, stopRedis, err := startColdRedis(dir)
	if err != nil {
		return err
	}
	defer stopRedis()
	bin, err := buildLimiter(dir)
	if err != nil {
		return err
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	sluice, err := startColdSluice(bin, conf, rURL, run)
	if err != nil {
		return err
	}
	defer sluice.stop()
	systems := []*coldSystem{sluice}
	if *upstreamRatelimit != "" {
		up, err := startUpstream(*upstreamRatelimit, dir, rURL)
		if err != nil {
			return err
		}
		defer up.stop()
		systems = append(systems, up)
	}
	opt, err := redis.ParseURL(rURL)
	if err != nil {
		return fmt.Errorf("redis URL %s: %w", rURL, err)
	}
	rc := redis.NewClient(opt)
	defer rc.Close()

	names := make([]string, len(systems))
	for i, s := range systems {
		names[i] = s.name
	}
	turns := ""
	if len(systems) > 1 {
		turns = ", the systems in turn"
	}
	fmt.Printf("\nEnvoy's most common load against %s on a dedicated Redis "+
		"(4 gRPC connections, 20ms deadline, %v a run, median of %d run(s) a system%s)\n",
		strings.Join(names, " and "), dur, *rlsColdRounds, turns)
	fmt.Printf("%-44s %-9s %10s %11s %8s %8s %8s %8s %12s %12s %6s\n", "load", "system", "calls/s", "answered/s", "p50", "p99", "p99.9",
		"errors", "server/call", "Redis/call", "opens")
	loads := []struct {
		name    string
		callers int
		key     string
		values  int
	}{
		{"10,000 addresses, 1 s windows, 16 callers", 16, "remote_address", 10_000},
		{"10,000 addresses, 1 s windows, 64 callers", 64, "remote_address", 10_000},
		{"10,000 addresses, 1 s windows, 256 callers", 256, "remote_address", 10_000},
		{"near the limit, 10 keys, 64 callers", 64, "near", 10},
	}
	for li, ld := range loads {
		runs := make([][]coldRun, len(systems))
		for round := range *rlsColdRounds {
			for si, sys := range systems {
				reqs := make([]*rlsv3.RateLimitRequest, ld.values)
				for i := range reqs {
					reqs[i] = coldRequest(ld.key, fmt.Sprintf("%s-%d-%d-%s-%d", run, li, round, sys.name, i))
				}
				r, err := coldMeasure(sys, rc, reqs, ld.callers, dur)
				if err != nil {
					return fmt.Errorf("%s, %s, round %d: %w", ld.name, sys.name, round+1, err)
				}
				runs[si] = append(runs[si], r)
			}
		}
		meds := make([]coldRun, len(systems))
		for si, sys := range systems {
			meds[si] = coldMedian(runs[si])
			m, label := meds[si], ""
			if si == 0 {
				label = ld.name
			}
			opens := "-"
			if sys.opens != nil {
				opens = strconv.FormatInt(m.opens, 10)
			}
			fmt.Printf("%-44s %-9s %10.0f %11.0f %8s %8s %8s %8d %12s %12s %6s\n", label, sys.name, m.rate, m.answered,
				m.p50, m.p99, m.p999, m.errors, fmt.Sprintf("%.1fµs", m.srvCPU), fmt.Sprintf("%.1fµs", m.redisCPU), opens)
			detail := fmt.Sprintf("Redis commands a call %.2f; the load generator's CPU a call %.1fµs", m.redisCmds, m.genCPU)
			if sys.metrics != nil {
				detail += fmt.Sprintf("; a call: %.2f check syncs, %.2f first touches, %.2f cells settled; a round trip to Redis carried %.1f syncs",
					m.syncs, m.touches, m.settled, m.tripBatch)
			}
			fmt.Printf("%-44s %-9s %s\n", "", sys.name, detail)
		}
		if ld.key == "near" {
			for si, sys := range systems {
				// A call admitted but answered after its deadline counts as
				// an error: short of 100 by at most the key's errors is
				// consistent with exactly 100 admitted.
				verdict := "100 a key in every run"
				for _, r := range runs[si] {
					for k, n := range r.okPerValue {
						switch {
						case n > 100 || n+r.errPerValue[k] < 100:
							verdict = "NOT 100 a key"
						case n < 100 && verdict != "NOT 100 a key":
							verdict = "100 a key, or short by calls answered after their deadline"
						}
					}
				}
				var per []string
				for _, r := range runs[si] {
					keys := make([]string, len(r.okPerValue))
					for k, n := range r.okPerValue {
						keys[k] = strconv.Itoa(n)
						if n < 100 {
							keys[k] += fmt.Sprintf("(+%d late)", r.errPerValue[k])
						}
					}
					per = append(per, "["+strings.Join(keys, " ")+"]")
				}
				fmt.Printf("%-44s %-9s answered OK per key (limit 100), a run each: %s: %s\n", "", sys.name, strings.Join(per, " "), verdict)
			}
		}
		if len(systems) == 2 {
			s, u := meds[0], meds[1]
			// Where the cores are the bound (both systems, Redis and the
			// load generator share them), calls/s go inversely as the CPU
			// of a call, the generator's included.
			fmt.Printf("%-44s %-9s calls/s %.2fx, answered/s %.2fx, p99 %.2fx, CPU a call (server+Redis) %.2fx; calls/s the cores allow %.2fx\n", "",
				systems[0].name+"/"+systems[1].name, s.rate/u.rate, s.answered/u.answered, float64(s.p99)/float64(u.p99),
				(s.srvCPU+s.redisCPU)/(u.srvCPU+u.redisCPU), (u.genCPU+u.srvCPU+u.redisCPU)/(s.genCPU+s.srvCPU+s.redisCPU))
		}
	}
	return nil
}

// coldRequest is a ShouldRateLimit request of domain bench with one
// descriptor of one entry.
func coldRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}

// coldMeasure runs one load against sys and returns what it cost: sys's
// breaker openings and CPU time, and Redis's CPU time, read before and
// after it.
func coldMeasure(sys *coldSystem, rc *redis.Client, reqs []*rlsv3.RateLimitRequest, callers int, dur time.Duration) (coldRun, error) {
	type snapshot struct {
		cpu, rcpu, gen time.Duration
		cmds           float64
		m              map[string]float64
	}
	snap := func() (snapshot, error) {
		var sn snapshot
		var err1, err2, err3, err4 error
		if sys.metrics != nil {
			sn.m, err1 = sys.metrics()
		}
		if sn.cpu, err2 = pidCPU(sys.pid); err2 != nil {
			err2 = fmt.Errorf("%s's CPU time: %w", sys.name, err2)
		}
		sn.rcpu, err3 = redisCPU(rc)
		sn.cmds, err4 = redisCommands(rc)
		gen, err5 := pidCPU(os.Getpid())
		sn.gen = gen
		return sn, errors.Join(err1, err2, err3, err4, err5)
	}
	s0, err := snap()
	if err != nil {
		return coldRun{}, err
	}
	r := rlsColdLoad(sys.clients, reqs, callers, dur)
	s1, err := snap()
	if err != nil {
		return coldRun{}, err
	}
	calls := float64(max(1, r.calls))
	perCall := func(d time.Duration) float64 {
		return float64(d.Nanoseconds()) / 1000 / calls
	}
	run := coldRun{rate: float64(r.calls) / dur.Seconds(), answered: float64(r.calls-r.errors) / dur.Seconds(), p50: r.q(0.50), p99: r.q(0.99), p999: r.q(0.999), errors: r.errors,
		srvCPU: perCall(s1.cpu - s0.cpu), redisCPU: perCall(s1.rcpu - s0.rcpu), genCPU: perCall(s1.gen - s0.gen), redisCmds: (s1.cmds - s0.cmds) / calls,
		okPerValue: r.okPerValue, errPerValue: r.errPerValue}
	if s1.m != nil {
		d := func(name string) float64 { return s1.m[name] - s0.m[name] }
		run.opens = int64(d(coldMetrics[0]))
		run.tripBatch = d("sluice_origin_trip_syncs_total") / max(1, d("sluice_origin_trips_total"))
		run.syncs = d("sluice_origin_syncs_total") / calls
		run.settled = d("sluice_settle_cells_total") / calls
		run.touches = d("sluice_origin_first_touches_total") / calls
	}
	return run, nil
}

// coldMedian returns the median of each figure of runs, on its own; the
// admitted per key is not one of them.
func coldMedian(runs []coldRun) coldRun {
	pick := func(f func(coldRun) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		n := len(xs)
		if n%2 == 1 {
			return xs[n/2]
		}
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	dur := func(f func(coldRun) time.Duration) time.Duration {
		return time.Duration(pick(func(r coldRun) float64 { return float64(f(r)) })).Round(10 * time.Microsecond)
	}
	return coldRun{
		rate:      pick(func(r coldRun) float64 { return r.rate }),
		answered:  pick(func(r coldRun) float64 { return r.answered }),
		p50:       dur(func(r coldRun) time.Duration { return r.p50 }),
		p99:       dur(func(r coldRun) time.Duration { return r.p99 }),
		p999:      dur(func(r coldRun) time.Duration { return r.p999 }),
		errors:    int(pick(func(r coldRun) float64 { return float64(r.errors) })),
		srvCPU:    pick(func(r coldRun) float64 { return r.srvCPU }),
		redisCPU:  pick(func(r coldRun) float64 { return r.redisCPU }),
		genCPU:    pick(func(r coldRun) float64 { return r.genCPU }),
		opens:     int64(pick(func(r coldRun) float64 { return float64(r.opens) })),
		redisCmds: pick(func(r coldRun) float64 { return r.redisCmds }),
		tripBatch: pick(func(r coldRun) float64 { return r.tripBatch }),
		syncs:     pick(func(r coldRun) float64 { return r.syncs }),
		settled:   pick(func(r coldRun) float64 { return r.settled }),
		touches:   pick(func(r coldRun) float64 { return r.touches }),
	}
}

// startColdRedis starts a redis-server of the bench's own on a free
// loopback port, without persistence, and returns its URL and how to stop
// it. Where redis-server is not installed and no upstream runs beside the
// limiter, it falls back to the region's Redis (redisURL), whose CPU time
// then counts other clients too.
func startColdRedis(dir string) (url string, stop func(), err error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if *upstreamRatelimit != "" {
			return "", nil, fmt.Errorf("-upstream-ratelimit needs a redis-server of the bench's own: %w", err)
		}
		fmt.Fprintf(os.Stderr, "bench: no redis-server (%v): on the region's Redis %s instead\n", err, redisURL())
		return redisURL(), func() {}, nil
	}
	_, port, _ := net.SplitHostPort(freeAddr())
	cmd := exec.Command(path, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	url = "redis://127.0.0.1:" + port
	stop = func() { stopProcess(cmd) }
	opt, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("redis URL %s: %w", url, err)
	}
	rc := redis.NewClient(opt)
	defer rc.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := rc.Ping(context.Background()).Err()
		if err == nil {
			return url, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on port %s never answered: %w", port, err)
		}
	}
}

// startColdSluice starts the limiter bin with --rls-listen on the YAML conf
// and the Redis at redisURL, its keys under a prefix of run's own.
func startColdSluice(bin, conf, redisURL, run string) (*coldSystem, error) {
	rlsAddr, metricsAddr := freeAddr(), freeAddr()
	cmd := exec.Command(bin, "--nats-listen", "127.0.0.1:0", "--redis-url", redisURL, "--redis-prefix", "sluicebench:rlscold:"+run,
		"--rls-listen", rlsAddr, "--rls-config", conf, "--metrics-addr", metricsAddr, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the limiter: %w", err)
	}
	sys := &coldSystem{name: "sluice", pid: cmd.Process.Pid,
		opens: func() (int64, error) {
			m, err := scrapeLimiter(metricsAddr)
			return int64(m[`sluice_origin_breaker_opens_total{call="read"}`]), err
		},
		metrics: func() (map[string]float64, error) { return scrapeLimiter(metricsAddr) }}
	stopCmd := func() { stopProcess(cmd) }
	closeConns, err := dialColdSystem(sys, rlsAddr)
	if err != nil {
		stopCmd()
		return nil, fmt.Errorf("the limiter's rate limit service: %w", err)
	}
	sys.stop = func() { closeConns(); stopCmd() }
	return sys, nil
}

// dialColdSystem opens sys's 4 gRPC connections to addr and waits, 15 s at
// most, until the service there answers with bench's limit for a
// remote_address. It returns how to close the connections.
func dialColdSystem(sys *coldSystem, addr string) (closeConns func(), err error) {
	var conns []*grpc.ClientConn
	closeConns = func() {
		for _, cc := range conns {
			_ = cc.Close()
		}
	}
	for range 4 {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeConns()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		conns = append(conns, cc)
		sys.clients = append(sys.clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := sys.clients[0].ShouldRateLimit(ctx, coldRequest("remote_address", "warmup"))
		cancel()
		if err == nil && (len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1000) {
			err = fmt.Errorf("answered without the configured limit: %v", resp)
		}
		if err == nil {
			return closeConns, nil
		}
		if time.Now().After(deadline) {
			closeConns()
			return nil, fmt.Errorf("never answered at %s: %w", addr, err)
		}
	}
}

// stopProcess interrupts cmd's process and waits for it, killing it after
// 10 s.
func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// coldResult is what one -rls-cold load measured.
type coldResult struct {
	calls, errors int
	lat           []time.Duration
	okPerValue    []int // for a handful of values: calls answered OK, per value
	errPerValue   []int // and calls not answered in time (or failed), per value
}

func (r *coldResult) q(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(p*float64(len(r.lat))))].Round(10 * time.Microsecond)
}

// rlsColdLoad runs callers goroutines for dur, each making one call at a time
// with a 20ms deadline, on a request picked at random, over the clients in
// turn. An error (the deadline included) counts as an error.
func rlsColdLoad(clients []rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, callers int, dur time.Duration) coldResult {
	var (
		mu  sync.Mutex
		res coldResult
		wg  sync.WaitGroup
	)
	ok, failed := make([]int, len(reqs)), make([]int, len(reqs))
	end := time.Now().Add(dur)
	for g := range callers {
		wg.Go(func() {
			c := clients[g%len(clients)]
			var lat []time.Duration
			errs := 0
			for time.Now().Before(end) {
				i := rand.IntN(len(reqs))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				start := time.Now()
				resp, err := c.ShouldRateLimit(ctx, reqs[i])
				lat = append(lat, time.Since(start))
				cancel()
				if err != nil {
					errs++
					if len(reqs) <= 100 {
						mu.Lock()
						failed[i]++
						mu.Unlock()
					}
					continue
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK && len(reqs) <= 100 {
					mu.Lock()
					ok[i]++
					mu.Unlock()
				}
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.errors += errs
			mu.Unlock()
		})
	}
	wg.Wait()
	res.calls = len(res.lat)
	slices.Sort(res.lat)
	if len(reqs) <= 100 {
		res.okPerValue, res.errPerValue = ok, failed
	}
	return res
}

// freeAddr returns a loopback address with a port free now.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}

// coldMetrics are the limiter counters a -rls-cold run reports: breaker
// openings, the round trips checks' syncs made and the syncs they carried,
// the checks' syncs, the cells settle rounds carried, and the syncs first
// touches decided.
var coldMetrics = []string{`sluice_origin_breaker_opens_total{call="read"}`, "sluice_origin_trips_total",
	"sluice_origin_trip_syncs_total", "sluice_origin_syncs_total", "sluice_settle_cells_total", "sluice_origin_first_touches_total"}

// scrapeLimiter reads coldMetrics from the limiter's metrics at addr.
func scrapeLimiter(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape the limiter: %w", err)
	}
	defer resp.Body.Close()
	m := make(map[string]float64, len(coldMetrics))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(coldMetrics, name) {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("scrape the limiter: %s: %w", name, err)
		}
		m[name] = f
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape the limiter: %w", err)
	}
	for _, name := range coldMetrics {
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("the limiter's metrics lack %s", name)
		}
	}
	return m, nil
}

// breakerOpens reads sluice_origin_breaker_opens_total{call="read"} from
// the limiter's metrics.
func breakerOpens(addr string) (int64, error) {
	m, err := scrapeLimiter(addr)
	return int64(m[coldMetrics[0]]), err
}

// redisCommands returns how many commands Redis has run (INFO
// commandstats, every command's calls summed).
func redisCommands(rc *redis.Client) (float64, error) {
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	var n float64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseFloat(calls, 64)
		if err != nil {
			return 0, fmt.Errorf("redis INFO commandstats %q: %w", line, err)
		}
		n += c
	}
	return n, nil
}

// redisCPU returns Redis's CPU time (user and system) from INFO cpu.
func redisCPU(rc *redis.Client) (time.Duration, error) {
	return redistest.ServerCPU(context.Background(), rc)
}
