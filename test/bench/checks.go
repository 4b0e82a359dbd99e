package main

// The checks scenario: many checks per NATS message. It
// measures, in one run and interleaved slice by slice:
//
//   - the Go client with 256 concurrent callers on one connection,
//     coalescing on and off, against the bare echo with 256 requests in
//     flight (checks/s against the echo's messages/s; p99 against p99);
//   - one caller alone through the Go client, coalescing on and off (p50);
//   - raw checks messages of 64 checks, 16 messages in flight: checks/s;
//   - the same raw load against a limiter process of its own, under
//     GOMAXPROCS=1 and 2: checks/s and the limiter's CPU time per check.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

var (
	checksOnly  = flag.Bool("checks-only", false, "run only the checks scenario (many checks per message), then stop")
	limiterOnly = flag.Bool("limiter-only", false, "run only the raw checks load against a limiter process (with -checks-only)")
)

// checksBench runs the checks scenario on a NATS server of its own.
func checksBench(dur, slice time.Duration) error {
	ctx := context.Background()
	srv, err := natstest.StartServer(ctx)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	url := srv.ClientURL()

	echoConn, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer echoConn.Close()
	if _, err := echoConn.QueueSubscribe("echo.>", "echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return err
	}
	svc := service.New(service.Config{})
	defer svc.Close(ctx)
	stop, err := serveInstances(url, transport.LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		return err
	}
	defer stop()

	raw, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer raw.Close()
	coalescing, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer coalescing.Close()
	plain, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer plain.Close()
	on := bus.NewClient(coalescing)
	off := bus.NewClient(plain, bus.WithCoalescing(false))

	const ids = 1000
	reqs := make([]bus.CheckRequest, ids)
	singles := make([][]byte, ids)
	checks := make([]wire.BatchCheck, ids)
	for i := range reqs {
		reqs[i] = bus.CheckRequest{Identifier: "user_" + strconv.Itoa(100000+i), Limit: window.MaxLimit, Duration: 60_000}
		singles[i] = wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: reqs[i].Identifier, Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
		checks[i] = wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: reqs[i].Identifier, Limit: window.MaxLimit, Duration: 60_000, Cost: 1}}
		if _, err := off.Check(ctx, "bench", "api", reqs[i]); err != nil {
			return fmt.Errorf("warm-up check: %w", err)
		}
	}
	const perMsg = 64
	var msgs64 [][]byte
	for i := 0; i+perMsg <= ids; i += perMsg {
		msgs64 = append(msgs64, wire.AppendChecksRequest(nil, bus.Msgpack, checks[i:i+perMsg]))
	}

	if *limiterOnly {
		return limiterProcessBench(url, msgs64, perMsg, dur/2)
	}

	type load struct {
		name string
		run  func(dur time.Duration, t *tally) error
	}
	nslices := max(1, int(dur/slice))
	interleave := func(loads ...load) ([]result, error) {
		tallies := make([]tally, len(loads))
		for i := range nslices {
			for j := range loads {
				k := (i + j) % len(loads)
				cpu := processCPU()
				if err := loads[k].run(slice, &tallies[k]); err != nil {
					return nil, fmt.Errorf("%s: %w", loads[k].name, err)
				}
				tallies[k].cpu += processCPU() - cpu
			}
		}
		res := make([]result, len(loads))
		for k := range loads {
			res[k] = tallies[k].result()
		}
		return res, nil
	}
	fmt.Printf("many checks per message (DESIGN 3.5): %d slices of %v per target, interleaved\n", nslices, slice)
	fmt.Printf("%-34s %12s %10s %10s %14s\n", "", "checks/s", "p50", "p99", "process CPU")

	echo := load{"echo, 256 in flight", func(d time.Duration, t *tally) error { return asyncLoad(raw, "echo.bench", singles, d, t) }}
	res, err := interleave(echo,
		load{"Go client, 256 callers, coalescing", func(d time.Duration, t *tally) error { return callersLoad(on, reqs, 256, d, t) }},
		load{"Go client, 256 callers, one each", func(d time.Duration, t *tally) error { return callersLoad(off, reqs, 256, d, t) }},
	)
	if err != nil {
		return err
	}
	e, co, un := res[0], res[1], res[2]
	crow := func(name string, r result) {
		fmt.Printf("%-34s %12.0f %10s %10s %12s/c\n", name, r.rate, r.p50, r.p99, r.cpu)
	}
	crow("echo, 256 in flight (messages)", e)
	crow("Go client, 256 callers, coalescing", co)
	crow("Go client, 256 callers, one each", un)
	fmt.Printf("%-34s %11.2fx %10s %9.2fx   coalescing / echo (targets: >= 3x, p99 <= 1x)\n", "ratio", co.rate/e.rate, "", float64(co.p99)/float64(e.p99))
	fmt.Printf("%-34s %11.2fx %10s %9.2fx   one each / echo\n", "ratio", un.rate/e.rate, "", float64(un.p99)/float64(e.p99))

	res, err = interleave(
		load{"one caller, coalescing", func(d time.Duration, t *tally) error { return callersLoad(on, reqs, 1, d, t) }},
		load{"one caller, one each", func(d time.Duration, t *tally) error { return callersLoad(off, reqs, 1, d, t) }},
	)
	if err != nil {
		return err
	}
	crow("one caller, coalescing", res[0])
	crow("one caller, not coalescing", res[1])
	fmt.Printf("%-34s %11.2fx %9.2fx %9.2fx   coalescing / not, one caller (target: p50 <= 1.1x)\n", "ratio",
		res[0].rate/res[1].rate, float64(res[0].p50)/float64(res[1].p50), float64(res[0].p99)/float64(res[1].p99))

	res, err = interleave(echo,
		load{"raw checks of 64, 16 in flight", func(d time.Duration, t *tally) error {
			return checksLoad(raw, "ratelimit.checks.bench", msgs64, perMsg, 16, d, t)
		}},
	)
	if err != nil {
		return err
	}
	crow("echo, 256 in flight (messages)", res[0])
	crow("raw checks of 64, 16 in flight", res[1])
	fmt.Printf("%-34s %11.2fx %10s %9.2fx   raw checks of 64 / echo\n", "ratio", res[1].rate/res[0].rate, "", float64(res[1].p99)/float64(res[0].p99))

	return limiterProcessBench(url, msgs64, perMsg, dur/2)
}

// callersLoad runs n goroutines calling c.Check one after another
// for dur, each on identifiers of its own stride.
func callersLoad(c *bus.Client, reqs []bus.CheckRequest, n int, dur time.Duration, t *tally) error {
	return callers(n, dur, t, func(i int) error {
		_, err := c.Check(context.Background(), "bench", "api", reqs[i%len(reqs)])
		return err
	})
}

// checksLoad keeps inflight checks messages in flight on nc, each reply
// sending the next of its slot; every check of a message counts, with the
// message's latency.
func checksLoad(nc *nats.Conn, subject string, bodies [][]byte, perMsg, inflight int, dur time.Duration, t *tally) error {
	n := 0
	next := func(int) []byte { n++; return bodies[n%len(bodies)] }
	return slotLoad(nc, subject, inflight, dur, next, func(m *nats.Msg, d time.Duration) error {
		if len(m.Data) == 0 || m.Header.Get("Nats-Service-Error-Code") != "" {
			return fmt.Errorf("error reply: %v", m.Header)
		}
		for range perMsg {
			t.add(d)
		}
		return nil
	}, t)
}

// buildLimiter builds cmd/limiter into dir and returns the binary's path.
func buildLimiter(dir string) (string, error) {
	bin := filepath.Join(dir, "limiter")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/limiter").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build limiter: %v: %s", err, out)
	}
	return bin, nil
}

// limiterProcessBench runs the raw checks load against a limiter process
// of its own (cmd/limiter, in-memory origin) under GOMAXPROCS=1 and 2, and
// reports checks/s and the process's CPU time per check.
func limiterProcessBench(url string, bodies [][]byte, perMsg int, dur time.Duration) error {
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := buildLimiter(dir)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	fmt.Printf("\nraw checks of 64, 16 in flight, against a limiter process (in-memory origin):\n")
	fmt.Printf("%-34s %12s %10s %10s %14s\n", "", "checks/s", "p50", "p99", "limiter CPU")
	for _, procs := range []int{1, 2} {
		prefix := "proc" + strconv.Itoa(procs)
		cmd := exec.Command(bin, "--nats-url", url, "--subject-prefix", prefix, "--log-level", "warn")
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		err := func() error {
			defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
			subject := prefix + ".checks.bench"
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if _, err := nc.Request(subject, bodies[0], time.Second); err == nil {
					break
				} else if time.Now().After(deadline) {
					return fmt.Errorf("limiter process never answered: %w", err)
				}
			}
			for _, b := range bodies { // warm every identifier
				if _, err := nc.Request(subject, b, time.Second); err != nil {
					return err
				}
			}
			var t tally
			cpu0, err := pidCPU(cmd.Process.Pid)
			if err != nil {
				return err
			}
			if err := checksLoad(nc, subject, bodies, perMsg, 16, dur, &t); err != nil {
				return err
			}
			cpu1, err := pidCPU(cmd.Process.Pid)
			if err != nil {
				return err
			}
			r := t.result()
			fmt.Printf("%-34s %12.0f %10s %10s %12.3fµs/c\n", fmt.Sprintf("GOMAXPROCS=%d", procs), r.rate, r.p50, r.p99,
				float64((cpu1-cpu0).Nanoseconds())/1000/float64(t.n))
			return nil
		}()
		if err != nil {
			return err
		}
	}
	fmt.Println("(target: limiter CPU <= 0.3 µs a check)")
	return nil
}

// pidCPU returns the user and system CPU time of process pid, from
// /proc/<pid>/stat (clock ticks of 10 ms).
func pidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command name (field 2) may hold spaces: fields count from its ')'.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
