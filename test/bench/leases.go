package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

var leasesOnly = flag.Bool("leases", false, "run only the lease trade-off: over-count per SIGKILL and Redis commands per admission for several --lease-ahead")

// leaseAheads are the lease lengths the trade-off is measured at.
var leaseAheads = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
	500 * time.Millisecond, 2 * time.Second}

// leaseTradeOff prints, for each lease length, what a SIGKILL of one of
// three limiters sharing the real Redis over-counts a hot cell by (the
// unused lease it leaves, which the cell counts as used once no longer
// live), and how many Redis commands an admission costs, far from the limit
// and near it. Each limiter is a service.Service in this process with its
// own Redis client; the killed one's origin starts failing every call, so
// it neither gives its lease back nor reports again, as after a SIGKILL.
func leaseTradeOff(ctx context.Context) error {
	fmt.Println("lease trade-off: three limiters on one Redis, one hot identifier, 1,000 checks/s each for 2s, then one limiter killed")
	fmt.Printf("%-12s %-6s %10s %12s %14s %12s\n", "lease-ahead", "cell", "admitted", "cmds/admit", "over by kill", "bound")
	for _, ahead := range leaseAheads {
		for _, near := range []bool{false, true} {
			if err := leaseRow(ctx, ahead, near); err != nil {
				return err
			}
		}
	}
	return nil
}

// killable is an origin that fails every call once killed.
type killable struct {
	region.Origin
	dead atomic.Bool
}

var errKilled = errors.New("killed")

func (k *killable) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if k.dead.Load() {
		return region.SyncResult{}, errKilled
	}
	return k.Origin.Sync(ctx, reporter, s)
}

func (k *killable) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Origin.Settle(ctx, reporter, ss)
}

func (k *killable) Read(ctx context.Context, c window.Cell) (region.Totals, region.Totals, error) {
	if k.dead.Load() {
		return region.Totals{}, region.Totals{}, errKilled
	}
	return k.Origin.Read(ctx, c)
}

// leaseRow measures one row of the trade-off.
func leaseRow(ctx context.Context, ahead time.Duration, near bool) error {
	const perLimiter, load = 1000, 2 * time.Second // checks/s each
	var cmds atomic.Int64
	prefix := fmt.Sprintf("sluicebench:lease:%d", time.Now().UnixNano())
	limit := int64(window.MaxLimit)
	if near {
		// 3,000 checks/s against 5,000 a minute: near the limit within two
		// seconds, and exhausted before the window ends.
		limit = 5000
	}
	var killed *killable
	var svcs []*service.Service
	for i := range 3 {
		rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
		if err != nil {
			return err
		}
		rd.Client().AddHook(countingHook{&cmds})
		k := &killable{Origin: rd}
		if i == 0 {
			killed = k
		}
		svc := service.New(service.Config{Origin: k, LeaseAhead: ahead})
		defer svc.Close(ctx)
		svcs = append(svcs, svc)
	}
	q := service.Query{Workspace: "bench", Namespace: "lease", Identifier: fmt.Sprint("hot-", ahead, near), Limit: limit,
		Duration: 60_000, Cost: 1}
	var admitted, victim atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(load)
	for i, s := range svcs {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / perLimiter)
			defer tick.Stop()
			for time.Now().Before(stop) {
				<-tick.C
				d, err := s.Check(ctx, q)
				if err == nil && d.Admitted {
					admitted.Add(1)
					if i == 0 {
						victim.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	killed.dead.Store(true)
	// Its lease stops being live LeaseFor + 100ms after its last renewal.
	time.Sleep(1500 * time.Millisecond)
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
	if err != nil {
		return err
	}
	defer rd.Close()
	cell := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration,
		Sequence: time.Now().UnixMilli() / q.Duration}
	if started := stop.Add(-load).UnixMilli() / q.Duration; started != cell.Sequence {
		fmt.Printf("%-12v %-6s (the load crossed a minute boundary: run again)\n", ahead, map[bool]string{false: "far", true: "near"}[near])
		return nil
	}
	cur, _, err := rd.Read(ctx, cell)
	if err != nil {
		return err
	}
	n := admitted.Load()
	bound := max((limit+99)/100, int64(float64(perLimiter)*ahead.Seconds()+0.999))
	if !near {
		bound = int64(float64(perLimiter)*ahead.Seconds() + 0.999)
	}
	fmt.Printf("%-12v %-6s %10d %12.4f %14d %12d\n", ahead, map[bool]string{false: "far", true: "near"}[near], n,
		float64(cmds.Load())/float64(max(n, 1)), cur.Count-n, bound)
	return nil
}
