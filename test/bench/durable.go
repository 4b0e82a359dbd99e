package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// durableCells is the scale scenario's working set (2000 changes a second,
// each cell checked every 10 s): the live cells a region's Redis holds and
// a sweep reads.
const durableCells = 20_000

// durableBench measures the publication and store path of a bridge
// (limiters' publications over NATS, acknowledged, merged, written to the
// store) with and without sweeps of the region's Redis, in one run: the
// same load against a bridge without a sweep, then against one sweeping a
// Redis of durableCells live cells every second (sixty times the default
// --sweep-interval, so the cost shows). Each side publishes from four
// limiters' links at once for d; the figures are components acknowledged
// and written a second.
func durableBench(ctx context.Context, url string, d time.Duration) error {
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: fmt.Sprintf("sluicebench-durable:%d", time.Now().UnixNano())})
	if err != nil {
		return err
	}
	defer rd.Close()
	now := time.Now().UnixMilli()
	cells := make([]window.Cell, durableCells)
	ss := make([]region.Sync, 0, 512)
	for i := range cells {
		cells[i] = window.Cell{Workspace: "bench", Namespace: "api", Identifier: fmt.Sprint("durable-", i),
			Duration: 600_000, Sequence: window.Sequence(now, 600_000)}
		ss = append(ss, region.Sync{Cell: cells[i], Seq: 1, Used: 5, Claim: 5, Limit: window.MaxLimit, LiveFor: 1000,
			ExpireAt: cells[i].Expiry(60_000), ReportOnly: true})
		if len(ss) == cap(ss) || i == len(cells)-1 {
			if _, err := rd.Settle(ctx, "bench", ss); err != nil {
				return fmt.Errorf("fill Redis: %w", err)
			}
			ss = ss[:0]
		}
	}
	sweep := func(ctx context.Context, yield func([]global.Component) error) error {
		_, err := rd.ScanCounts(ctx, func(cs []region.CellCount) error {
			out := make([]global.Component, len(cs))
			for i, c := range cs {
				out[i] = global.Component{Cell: c.Cell, Region: "bench", Count: c.Count, ExpireAt: c.ExpireAt}
			}
			return yield(out)
		})
		return err
	}
	type result struct{ acked, written, sweeps float64 }
	measure := func(run int, withSweep bool) (result, error) {
		subjects := wire.Subjects{Prefix: fmt.Sprintf("durbench%d", run)}
		nc, err := nats.Connect(url)
		if err != nil {
			return result{}, err
		}
		defer nc.Close()
		tr := link.NewBridge(nc, subjects, "bench", nil)
		cfg := bridge.BridgeConfig{Region: "bench", Store: bridge.NewMemoryStore(), Transport: tr}
		if withSweep {
			cfg.Sweep, cfg.SweepInterval = sweep, time.Second
		}
		b, err := bridge.NewBridge(cfg)
		if err != nil {
			return result{}, err
		}
		b.Start(ctx)
		if err := tr.Serve(b); err != nil {
			return result{}, err
		}
		pub, err := nats.Connect(url)
		if err != nil {
			return result{}, err
		}
		defer pub.Close()
		var acked atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range 4 {
			glink := link.NewGlobal(pub, subjects, "bench", nil)
			wg.Go(func() {
				for round := int64(1); time.Since(start) < d; round++ {
					// Each link publishes a quarter of the cells, 1000 at a
					// time, every count higher than the last.
					part := cells[w*durableCells/4 : (w+1)*durableCells/4]
					for at := 0; at < len(part) && time.Since(start) < d; at += 1000 {
						cs := make([]global.Component, 0, 1000)
						for _, c := range part[at:min(at+1000, len(part))] {
							cs = append(cs, global.Component{Cell: c, Region: "bench", Count: 5 + round, ExpireAt: c.Expiry(60_000)})
						}
						if glink.Publish(cs) == nil {
							acked.Add(int64(len(cs)))
						}
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		written := b.Stats().StoreWrites
		sweeps := b.Stats().Sweeps
		_ = tr.Close()
		_ = b.Close(ctx)
		return result{float64(acked.Load()) / elapsed.Seconds(), float64(written) / elapsed.Seconds(), float64(sweeps)}, nil
	}
	off, err := measure(0, false)
	if err != nil {
		return err
	}
	on, err := measure(1, true)
	if err != nil {
		return err
	}
	fmt.Printf("\npublication and store path, one bridge, 4 publishing links for %v each side:\n", d)
	fmt.Printf("  no sweep:                                     %.0f components/s acknowledged, %.0f/s written\n", off.acked, off.written)
	fmt.Printf("  sweeping %d live cells every 1s (%.0f sweeps): %.0f components/s acknowledged, %.0f/s written\n",
		durableCells, on.sweeps, on.acked, on.written)
	fmt.Printf("  ratio with/without sweeps: acknowledged %.2f, written %.2f (the scale scenario's load is 2000 changes/s)\n",
		on.acked/off.acked, on.written/off.written)
	return nil
}
