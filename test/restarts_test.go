package test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/crash"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// 100 limiter restarts against one hot cell on a Redis of its own, at the
// default configuration, every other one a SIGKILL (its lease left behind):
// the cell's value holds only the reporters of the last ForgetAfter (10s),
// so its size, which is what the sync script walks when it tidies, stays
// flat however many limiters ever synced the cell; once ForgetAfter has
// passed, only the live limiter's fields are left. Afterwards Redis's count
// of the cell lies within [admitted, admitted + the killed limiters'
// bounds].
func TestAHotCellStaysSmallOverAHundredRestarts(t *testing.T) {
	addr := redistest.StartServer(t)
	url := "redis://" + addr
	prefix := redistest.Prefix(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // the test takes over 30s
	defer cancel()
	const limit = 1_000_000
	q := service.Query{Workspace: "acme", Namespace: "api", Identifier: "hot", Limit: limit, Duration: 3_600_000, Cost: 1}
	// The limiters' clock runs at the system's pace but starts five minutes
	// into an hour, so the minute the test takes never crosses one; leases
	// and forgetting run on Redis's clock, which the shift leaves alone.
	wall := time.Now()
	shift := wall.Truncate(time.Hour).Add(5 * time.Minute).Sub(wall)
	now := func() time.Time { return time.Now().Add(shift) }
	start := func() (*service.Service, *crash.Origin) {
		rd, err := region.NewRedis(region.RedisConfig{URL: url, KeyPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		k := crash.Wrap(rd)
		return service.New(service.Config{Origin: k, Now: now}), k
	}
	var admitted, killed int64
	check := func(s *service.Service) {
		d, err := s.Check(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted++
		}
	}
	live, _ := start()
	defer live.Close(context.Background())
	check(live)
	cell := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration,
		Sequence: now().UnixMilli() / q.Duration}
	rd, err := region.NewRedis(region.RedisConfig{URL: url, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	reporters := func() int {
		v, _, err := rd.Cell(ctx, cell)
		if err != nil {
			t.Fatal(err)
		}
		return len(v.Reporters)
	}
	began := time.Now()
	most, perForget := 0, 0
	for i := range 100 {
		s, k := start()
		for range 20 {
			check(s)
			check(live)
		}
		time.Sleep(150 * time.Millisecond) // 100 restarts span two ForgetAfters
		if i%2 == 1 {
			k.Kill() // SIGKILL: nothing more reaches Redis
			killed++
			cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_ = s.Close(cctx)
			cancel()
		} else if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		most = max(most, reporters())
		// A reporter stays until ForgetAfter after its last sync, or after
		// its lease ended (LeaseFor + 100ms later) if it was killed.
		if time.Since(began) < region.ForgetAfter+1100*time.Millisecond {
			perForget = i + 1
		}
	}
	stats, _ := admin.Info(ctx, "commandstats").Result()
	t.Logf("100 restarts in %v: up to %d reporters in the cell's value (%d restarts a ForgetAfter); %s",
		time.Since(began).Round(time.Millisecond), most, perForget, evalshaStats(stats))
	// The restarts of that long and the live limiter's two generations.
	if bound := perForget + 2; most > bound {
		t.Fatalf("up to %d reporters in the cell's value, want at most the last ForgetAfter's %d", most, bound)
	}
	time.Sleep(region.ForgetAfter + 2*time.Second)
	check(live)
	if _, _, err := rd.Read(ctx, cell); err != nil { // a read tidies the cell, as a sync and a sweep do
		t.Fatal(err)
	}
	if n := reporters(); n > 2 { // the live limiter's generations
		v, _, _ := rd.Cell(ctx, cell)
		t.Fatalf("%d reporters left once ForgetAfter passed, want the live limiter's: %+v", n, v.Reporters)
	}
	if err := live.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cur, _, err := rd.Read(ctx, cell)
	if err != nil {
		t.Fatal(err)
	}
	// Each killed limiter held at most 1% of the limit, and at most a
	// second of its traffic (40 checks): its lease counts as used.
	if bound := admitted + killed*40; cur.Count < admitted || cur.Count > bound {
		t.Fatalf("Redis counts %d; the limiters admitted %d, %d kills allow up to %d", cur.Count, admitted, killed, bound)
	}
	t.Logf("admitted %d, Redis counts %d after %d kills", admitted, cur.Count, killed)
}

// evalshaStats returns the evalsha line of Redis's INFO commandstats.
func evalshaStats(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") {
			return strings.TrimSpace(line)
		}
	}
	return fmt.Sprintf("no evalsha in %q", info)
}
