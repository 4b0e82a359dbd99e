package main

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/crash"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

var leasesOnly = flag.Bool("leases", false, "run only the lease trade-off: over-count per SIGKILL and Redis commands per admission for several --lease-for and --lease-ahead")

// leaseFors and leaseAheads are the lease lives and lengths the trade-off
// is measured at.
var (
	leaseFors   = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
	leaseAheads = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, time.Second}
)

// leaseTradeOff prints, for each lease length, what a SIGKILL of one of
// three limiters sharing the real Redis over-counts a hot cell by (the
// unused lease it leaves, which the cell counts as used once no longer
// live), and how many Redis commands an admission costs, far from the limit
// and near it. Each limiter is a service.Service in this process with its
// own Redis client; the killed one's origin starts failing every call, so
// it neither gives its lease back nor reports again, as after a SIGKILL.
func leaseTradeOff(ctx context.Context) error {
	fmt.Println("lease trade-off: three limiters on one Redis, one identifier, 1,000 checks/s each for 2s, then one limiter killed;")
	fmt.Println("far: a limit of 600,000 a minute (1% = 6,000); near: 5,000 a minute (exhausted within the 2s)")
	fmt.Printf("%-10s %-11s %-5s %9s %11s %13s %12s\n", "lease-for", "lease-ahead", "cell", "admitted", "cmds/admit", "over by kill", "bound")
	for _, life := range leaseFors {
		for _, ahead := range leaseAheads {
			for _, near := range []bool{false, true} {
				if err := leaseRow(ctx, life, ahead, near); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// leaseRow measures one row of the trade-off.
func leaseRow(ctx context.Context, life, ahead time.Duration, near bool) error {
	const perLimiter, load = 1000, 2 * time.Second // checks/s each
	var cmds atomic.Int64
	prefix := fmt.Sprintf("sluicebench:lease:%d", time.Now().UnixNano())
	limit := int64(600_000)
	if near {
		// 3,000 checks/s against 5,000 a minute: near the limit within two
		// seconds, and exhausted before the window ends.
		limit = 5000
	}
	var killed *crash.Origin
	var svcs []*service.Service
	for i := range 3 {
		rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
		if err != nil {
			return err
		}
		rd.Client().AddHook(countingHook{&cmds})
		k := crash.Wrap(rd)
		if i == 0 {
			killed = k
		}
		svc := service.New(service.Config{Origin: k, LeaseFor: life, LeaseAhead: ahead})
		defer func() {
			// The killed one's origin fails every call: give up on it at once.
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_ = svc.Close(cctx)
		}()
		svcs = append(svcs, svc)
	}
	q := service.Query{Workspace: "bench", Namespace: "lease", Identifier: fmt.Sprint("hot-", life, ahead, near), Limit: limit,
		Duration: 60_000, Cost: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(load)
	for _, s := range svcs {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / perLimiter)
			defer tick.Stop()
			for time.Now().Before(stop) {
				<-tick.C
				d, err := s.Check(ctx, q)
				if err == nil && d.Admitted {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	killed.Kill()
	// Its lease stops being live LeaseFor + 100ms after its last renewal.
	time.Sleep(life + 500*time.Millisecond)
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
	if err != nil {
		return err
	}
	defer rd.Close()
	cell := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration,
		Sequence: time.Now().UnixMilli() / q.Duration}
	cellName := map[bool]string{false: "far", true: "near"}[near]
	if started := stop.Add(-load).UnixMilli() / q.Duration; started != cell.Sequence {
		fmt.Printf("%-10v %-11v %-5s (the load crossed a minute boundary: run again)\n", life, ahead, cellName)
		return nil
	}
	cur, _, err := rd.Read(ctx, cell)
	if err != nil {
		return err
	}
	n := admitted.Load()
	// The stated bound: LeaseAhead of the killed limiter's traffic, or for
	// a slower identifier up to 1% of the limit but at most LeaseFor of it.
	rate := float64(perLimiter)
	bound := max(int64(rate*ahead.Seconds()+0.999), min((limit+99)/100, int64(rate*life.Seconds()+0.999)))
	fmt.Printf("%-10v %-11v %-5s %9d %11.4f %13d %12d\n", life, ahead, cellName, n,
		float64(cmds.Load())/float64(max(n, 1)), cur.Count-n, bound)
	return nil
}
