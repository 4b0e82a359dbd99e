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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsColdOnly makes bench run only rlsColdBench.
var rlsColdOnly = flag.Bool("rls-cold", false,
	"run only Envoy's most common load against a limiter process on Redis: a limit per client address of 1s windows "+
		"over 10,000 addresses at 16, 64 and 256 callers, and 10 keys near their limit at 64, each call with Envoy's 20ms deadline "+
		"over 4 gRPC connections; reports calls/s, p50/p99/p99.9, errors, CPU a call of the limiter and of Redis, and breaker openings")

// rlsColdBench runs the -rls-cold loads, each for dur, against a limiter
// process of its own (cmd/limiter with --rls-listen and the region's
// Redis, default flags otherwise).
func rlsColdBench(dur time.Duration) error {
	dir, err := os.MkdirTemp("", "sluice-bench-rls-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := buildLimiter(dir)
	if err != nil {
		return err
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	conf := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(conf, []byte("domain: bench\ndescriptors:\n"+
		"  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"+
		"  - key: near\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"), 0o600); err != nil {
		return err
	}
	rlsAddr, metricsAddr := freeAddr(), freeAddr()
	cmd := exec.Command(bin, "--nats-listen", "127.0.0.1:0", "--redis-url", redisURL(), "--redis-prefix", "sluicebench:rlscold:"+run,
		"--rls-listen", rlsAddr, "--rls-config", conf, "--metrics-addr", metricsAddr, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()

	var clients []rlsv3.RateLimitServiceClient
	for range 4 { // as a 4-worker Envoy holds
		cc, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		clients = append(clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	req := func(key, value string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := clients[0].ShouldRateLimit(ctx, req("remote_address", "warmup"))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the limiter's rate limit service never answered: %w", err)
		}
	}
	opt, err := redis.ParseURL(redisURL())
	if err != nil {
		return err
	}
	rc := redis.NewClient(opt)
	defer rc.Close()

	fmt.Printf("\nEnvoy's most common load, against a limiter process on Redis (4 gRPC connections, 20ms deadline, %v a load)\n", dur)
	fmt.Printf("%-44s %10s %8s %8s %8s %8s %12s %12s %8s\n", "load", "calls/s", "p50", "p99", "p99.9", "errors",
		"limiter/call", "Redis/call", "opens")
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
	for _, ld := range loads {
		reqs := make([]*rlsv3.RateLimitRequest, ld.values)
		for i := range reqs {
			reqs[i] = req(ld.key, run+"-"+strconv.Itoa(i))
		}
		// What the load costs: the limiter's breaker openings and CPU time,
		// and Redis's CPU time, read before and after it.
		snap := func() (opens int64, cpu, rcpu time.Duration, err error) {
			opens, err1 := breakerOpens(metricsAddr)
			cpu, err2 := pidCPU(cmd.Process.Pid)
			rcpu, err3 := redisCPU(rc)
			return opens, cpu, rcpu, errors.Join(err1, err2, err3)
		}
		opens0, cpu0, rcpu0, err := snap()
		if err != nil {
			return err
		}
		r := rlsColdLoad(clients, reqs, ld.callers, dur)
		opens1, cpu1, rcpu1, err := snap()
		if err != nil {
			return err
		}
		perCall := func(d time.Duration) string {
			return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1000/float64(max(1, r.calls)))
		}
		fmt.Printf("%-44s %10.0f %8s %8s %8s %8d %12s %12s %8d\n", ld.name, float64(r.calls)/dur.Seconds(),
			r.q(0.50), r.q(0.99), r.q(0.999), r.errors, perCall(cpu1-cpu0), perCall(rcpu1-rcpu0), opens1-opens0)
		if ld.key == "near" {
			fmt.Printf("%-44s admitted per key (limit 100): %v\n", "", r.okPerValue)
		}
	}
	return nil
}

// coldResult is what one -rls-cold load measured.
type coldResult struct {
	calls, errors int
	lat           []time.Duration
	okPerValue    []int // for a handful of values: calls answered OK, per value
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
	ok := make([]int, len(reqs))
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
		res.okPerValue = ok
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

// breakerOpens reads sluice_origin_breaker_opens_total{call="read"} from
// the limiter's metrics.
func breakerOpens(addr string) (int64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape the limiter: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `sluice_origin_breaker_opens_total{call="read"} `); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f), err
		}
	}
	return 0, errors.Join(errors.New("the limiter's metrics lack sluice_origin_breaker_opens_total"), sc.Err())
}

// redisCPU returns Redis's CPU time (user and system) from INFO cpu.
func redisCPU(rc *redis.Client) (time.Duration, error) {
	info, err := rc.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}
