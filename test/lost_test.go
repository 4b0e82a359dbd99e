package test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Redis loses a region's cells in the middle of a window (a restart without
// persistence, a failover to an empty replica, an eviction: here FLUSHALL
// on a Redis the test started) while a cell has 900 of 1000 used. From then
// on the region admits what the limit leaves, exactly: 100 of a burst of
// 3000, not the 1000 more a region counting from zero would admit.
//
//   - The limiters that admitted the 900 still run: the first to sync
//     sends, with its claim, what it knows the region admitted (900), which
//     Redis counts as lost until the others send their claims again.
//   - They were killed too, and new ones started: only the bridge knows the
//     region's count. Its next import carries it (the own count); the
//     limiters store it in Redis, and admissions add to it.
func TestARegionWhoseRedisLostItsCellsAdmitsOnlyWhatTheLimitLeaves(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "limiters alive"
		if restart {
			name = "limiters restarted, the bridge's count"
		}
		t.Run(name, func(t *testing.T) {
			addr := redistest.StartServer(t)
			url := "redis://" + addr
			r := startBurstRegion(t, url, 3, false)
			ctx := testContext(t)
			id := burstRound(t, 30*time.Second) + "-lost"
			const limit = 1000
			spread := func(int) *bus.Client { return r.spread }
			if got := r.send(ctx, id, limit, 900, 64, spread); got != 900 {
				t.Fatalf("admitted %d of the first 900", got)
			}
			client := redis.NewClient(&redis.Options{Addr: addr})
			defer client.Close()
			cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: burstWindow,
				Sequence: window.Sequence(time.Now().UnixMilli(), burstWindow)}
			direct, err := region.NewRedis(region.RedisConfig{URL: url, KeyPrefix: r.prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer direct.Close()
			// Redis is lost once the limiters hold no unused lease (near the
			// limit they give back what they leave unused for 100ms): a
			// lease a limiter still holds when Redis loses the cell is
			// spent without Redis, and is the documented error of this
			// case (towards admission, by those leases).
			for deadline := time.Now().Add(5 * time.Second); ; {
				v, _, err := direct.Cell(ctx, cell)
				if err == nil && v.Charged == 900 && v.Used == 900 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the limiters still hold leases 5s after the burst: t, u = %d, %d (%v)", v.Charged, v.Used, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := client.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if restart {
				for _, p := range r.procs {
					if code := p.stop(t, syscall.SIGKILL, 5*time.Second); code != -1 {
						t.Fatalf("a SIGKILLed limiter exited %d", code)
					}
				}
				r.restart(3)
				// The bridge's import for the cell, as it sends it: the other
				// regions' usage (none) and the region's own published count.
				m := nats.NewMsg("ratelimit.import.r1")
				m.Data = event.AppendImports(nil, []global.Import{{Cell: cell, Own: 900, ExpireAt: cell.Expiry(60_000)}})
				m.Header.Set(link.SentAtHeader, strconv.FormatInt(time.Now().UnixMilli(), 10))
				if err := connect(t, r.natsURL).PublishMsg(m); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(5 * time.Second); ; {
					cur, _, err := direct.Read(ctx, cell)
					if err == nil && cur.Count >= 900 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the import never reached Redis: %+v, %v", cur, err)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if got := r.send(ctx, id, limit, 3000, 64, spread); got != 100 {
				t.Fatalf("after Redis lost the cell, a burst of 3000 admitted %d, want the 100 the limit leaves", got)
			}
			for _, p := range r.procs {
				if code := p.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
					t.Fatalf("limiter exit %d", code)
				}
			}
			if cur, _, err := direct.Read(context.Background(), cell); err != nil || cur.Count != limit {
				t.Fatalf("Redis holds %+v (%v) after the limiters stopped, want %d", cur, err, limit)
			}
		})
	}
}
