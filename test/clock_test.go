package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

// virtualTime is the true time of a test whose clocks run speed times as
// fast as the wall clock from base (unix ms) on. Every host's clock is the
// true time plus its offset: the test injects them into limiters and
// bridges, so it can give regions clocks that disagree.
type virtualTime struct {
	start time.Time // wall clock at base
	base  int64
	speed int64
}

func newVirtualTime(base, speed int64) *virtualTime {
	return &virtualTime{start: time.Now(), base: base, speed: speed}
}

// now returns the true time in unix ms.
func (v *virtualTime) now() int64 { return v.base + v.speed*time.Since(v.start).Milliseconds() }

// clock returns a host clock offset from the true time.
func (v *virtualTime) clock(offset time.Duration) func() time.Time {
	return func() time.Time { return time.UnixMilli(v.now() + offset.Milliseconds()) }
}

// sleepUntil waits until the true time reaches at.
func (v *virtualTime) sleepUntil(at int64) {
	if d := at - v.now(); d > 0 {
		time.Sleep(time.Duration(d/v.speed) * time.Millisecond)
	}
}

// skewedRegion is one region of an in-process world whose hosts share one
// clock: a bridge and a limiter, each with their metrics.
type skewedRegion struct {
	name       string
	clock      func() time.Time
	bridge     *bridge.Bridge
	bridgeReg  *prometheus.Registry
	limiter    *limiter
	limiterReg *prometheus.Registry
	client     *bus.Client
}

// startSkewedWorld starts regions on a supercluster, each with its own
// clock offset from vt's true time, a bridge on the one MySQL and a limiter
// on its own Redis prefix, all with default settings.
func startSkewedWorld(t *testing.T, vt *virtualTime, offsets map[string]time.Duration) map[string]*skewedRegion {
	t.Helper()
	names := make([]string, 0, len(offsets))
	for r := range offsets {
		names = append(names, r)
	}
	sc := startSupercluster(t, names...)
	dsn := mysqltest.Database(t)
	redisURL := redistest.SharedURL(t)
	world := map[string]*skewedRegion{}
	for _, r := range names {
		sr := &skewedRegion{name: r, clock: vt.clock(offsets[r])}
		// The bridge.
		bnc := connect(t, sc.ClientURL(r))
		store, err := mysql.OpenLazy(dsn, mysql.Config{})
		if err != nil {
			t.Fatal(err)
		}
		bt := link.NewBridge(bnc, wire.Subjects{}, r, nil)
		sr.bridge, err = bridge.NewBridge(bridge.BridgeConfig{Region: r, Store: store, Transport: bt, Now: sr.clock})
		if err != nil {
			t.Fatal(err)
		}
		sr.bridge.Start(context.Background())
		if err := bt.Serve(sr.bridge); err != nil {
			t.Fatal(err)
		}
		sr.bridgeReg = telemetry.NewRegistry()
		telemetry.RegisterBridge(sr.bridgeReg, sr.bridge, bt)
		t.Cleanup(func() {
			_ = bt.Close()
			_ = sr.bridge.Close(context.Background())
			_ = store.Close()
		})
		world[r] = sr
	}
	for _, r := range names {
		sr := world[r]
		rd, err := region.NewRedis(region.RedisConfig{URL: redisURL, KeyPrefix: redistest.Prefix(t)})
		if err != nil {
			t.Fatal(err)
		}
		lnc := connect(t, sc.ClientURL(r))
		glink := link.NewGlobal(lnc, wire.Subjects{}, r, nil)
		svc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{}), Now: sr.clock,
			Region: r, Global: glink})
		if err := glink.Attach(testContext(t), svc); err != nil {
			t.Fatal(err)
		}
		lim, err := transport.Serve(lnc, transport.LimiterConfig{Service: svc, Region: r})
		if err != nil {
			t.Fatal(err)
		}
		sr.limiter = &limiter{nc: lnc, svc: svc, lim: lim}
		t.Cleanup(func() { sr.limiter.stop(t); _ = glink.Close() })
		if err := lnc.Flush(); err != nil {
			t.Fatal(err)
		}
		sr.limiterReg = telemetry.NewRegistry()
		telemetry.RegisterLimiter(sr.limiterReg, []*transport.Limiter{lim}, svc, glink, nil)
		cnc := connect(t, sc.ClientURL(r))
		sr.client = bus.NewClient(cnc)
	}
	for _, r := range names {
		waitService(t, world[r].limiter.nc, "ratelimit", len(names))
		waitService(t, world[r].limiter.nc, link.BridgeService, len(names))
	}
	return world
}

// check sends one check in region and asserts that the reply's window is
// the region's own: its reset is the end of the window holding the region's
// clock at some instant of the request.
func (sr *skewedRegion) check(t *testing.T, id string, limit, duration, cost int64) bus.CheckResponse {
	t.Helper()
	before := sr.clock().UnixMilli()
	resp, err := sr.client.Check(context.Background(), "acme", "api",
		bus.CheckRequest{Identifier: id, Limit: limit, Duration: duration, Cost: cost, Peek: cost == 0})
	if err != nil {
		t.Fatalf("%s: %v", sr.name, err)
	}
	after := sr.clock().UnixMilli()
	if lo, hi := (before/duration+1)*duration, (after/duration+1)*duration; resp.Reset < lo || resp.Reset > hi {
		t.Errorf("%s: reset %d outside the region's own window (clock %d..%d: reset %d..%d)",
			sr.name, resp.Reset, before, after, lo, hi)
	}
	return resp
}

// metric returns the sum of the samples of a metric family whose labels
// include every pair of want.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue samples
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Three regions whose clocks are 1s behind, right and 1s ahead, all at
// default settings (the tolerance is 3s): traffic spread evenly at twice the
// limit over 10 windows of 10s stays within 10% of what one exact limiter
// admits on the true clock, a burst in any region is denied in the others
// within 250ms, and no reply ever comes from a window other than the
// answering region's own. The clocks run 4 times as fast as the wall clock,
// so the 10 windows take 25s.
func TestRegionsWithClocksOffByASecondStayAccurate(t *testing.T) {
	const limit, duration, windows = 300, 10_000, 10
	const speed = 4
	vt := newVirtualTime((time.Now().UnixMilli()/duration+2)*duration, speed)
	offsets := map[string]time.Duration{"behind": -time.Second, "right": 0, "ahead": time.Second}
	world := startSkewedWorld(t, vt, offsets)
	names := []string{"behind", "right", "ahead"}

	// Warm up every path between the regions (first messages on new
	// subjects across gateways wait for interest to settle).
	for _, src := range names {
		id := "warmup-" + src
		burstIn(t, world[src], id, 50, 60_000)
		for _, dst := range names {
			if dst != src {
				if _, ok := deniedWithin(t, world[dst], id, 50, 60_000, 10*time.Second); !ok {
					t.Fatalf("warm-up: %s never denied what %s exhausted", dst, src)
				}
			}
		}
	}

	// Spread: each region sends a third of twice the limit, interleaved.
	vt.sleepUntil((vt.now()/duration + 1) * duration)
	interval := time.Duration(duration) * time.Millisecond / (2 * limit) * 3 / speed // wall time, per region
	var (
		mu  sync.Mutex
		all []sent
		wg  sync.WaitGroup
	)
	perRegion := map[string]int64{}
	for i, r := range names {
		wg.Go(func() {
			time.Sleep(interval * time.Duration(i) / 3)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			var reqs []sent
			for range 2 * limit * windows / 3 {
				<-tick.C
				at := vt.now()
				resp := world[r].check(t, "spread", limit, duration, 1)
				reqs = append(reqs, sent{at: at, cost: 1, admitted: resp.Success})
			}
			mu.Lock()
			all = append(all, reqs...)
			perRegion[r] = admittedCost(reqs)
			mu.Unlock()
		})
	}
	wg.Wait()
	got, want := admittedCost(all), allowance(all, limit, duration)
	ratio := float64(got) / float64(want)
	t.Logf("admitted %d of %d (per region %v); one exact limiter on the true clock: %d; ratio %.3f",
		got, len(all), perRegion, want, ratio)
	if ratio < 0.90 || ratio > 1.10 {
		t.Fatalf("admitted %d, want within 10%% of the allowance %d (ratio %.3f)", got, want, ratio)
	}

	// Bursts, in the middle of a minute window for every clock.
	const burstLimit, burstWindow = 50, 60_000
	for round, src := range names {
		if at := vt.now() % burstWindow; at < 5_000 || at > 50_000 {
			vt.sleepUntil((vt.now()/burstWindow+1)*burstWindow + 5_000)
		}
		id := fmt.Sprint("burst-", round)
		burstIn(t, world[src], id, burstLimit, burstWindow)
		for _, dst := range names {
			if dst == src {
				continue
			}
			took, ok := deniedWithin(t, world[dst], id, burstLimit, burstWindow, 2*time.Second)
			t.Logf("burst in %s (clock %v), denied in %s (clock %v) after %v", src, offsets[src], dst, offsets[dst], took)
			if !ok || took > 250*time.Millisecond {
				t.Fatalf("burst in %s: %s denied after %v (ok %v), want within 250ms", src, dst, took, ok)
			}
		}
	}
	for _, r := range names {
		refused := metric(t, world[r].bridgeReg, "sluice_bridge_refused_total", nil) +
			metric(t, world[r].limiterReg, "sluice_imports_refused_total", nil)
		if refused != 0 {
			t.Errorf("%s refused %v entries from clocks within the tolerance", r, refused)
		}
	}
}

// A region whose clock is 10s ahead, beyond the default 3s tolerance: the
// other region refuses what it sends and says so in its metrics, and its
// burst moves nothing there (no denial, no window moved).
func TestARegionBeyondTheClockToleranceIsRefusedAndVisible(t *testing.T) {
	vt := newVirtualTime(time.Now().UnixMilli(), 1)
	world := startSkewedWorld(t, vt, map[string]time.Duration{"home": 0, "fast": 10 * time.Second})
	home, fast := world["home"], world["fast"]
	burstIn(t, fast, "skewed", 50, 60_000)
	deadline := time.Now().Add(5 * time.Second)
	for metric(t, home.bridgeReg, "sluice_bridge_refused_total",
		map[string]string{"source": "regions", "region": "fast", "reason": "clock_skew"}) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("home's bridge never counted fast's components as refused for clock skew")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 10 {
		if resp := home.check(t, "skewed", 50, 60_000, 1); !resp.Success {
			t.Fatalf("home denied what only the skewed region used: %+v", resp)
		}
	}
	// And the other way: fast's bridge refuses what home sends.
	burstIn(t, home, "home-burst", 50, 60_000)
	deadline = time.Now().Add(5 * time.Second)
	for metric(t, fast.bridgeReg, "sluice_bridge_refused_total",
		map[string]string{"source": "regions", "region": "home", "reason": "clock_skew"}) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("fast's bridge never counted home's components as refused for clock skew")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("home refused %v entries from fast; fast refused %v from home",
		metric(t, home.bridgeReg, "sluice_bridge_refused_total", map[string]string{"region": "fast"}),
		metric(t, fast.bridgeReg, "sluice_bridge_refused_total", map[string]string{"region": "home"}))
}

// burstIn exhausts id in sr and returns when sr denies it.
func burstIn(t *testing.T, sr *skewedRegion, id string, limit, duration int64) {
	t.Helper()
	for range 2*limit + 1 {
		if resp := sr.check(t, id, limit, duration, 1); !resp.Success {
			return
		}
	}
	t.Fatalf("%s never denied %s", sr.name, id)
}

// deniedWithin checks id in sr every 10ms (wall time) until it is denied or
// max passes; a denial counts only if sr admitted less than half the limit
// itself meanwhile.
func deniedWithin(t *testing.T, sr *skewedRegion, id string, limit, duration int64, max time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	admitted := int64(0)
	for time.Since(start) < max {
		if resp := sr.check(t, id, limit, duration, 1); !resp.Success {
			if 2*admitted >= limit {
				t.Fatalf("%s denied %s only after admitting %d of %d itself", sr.name, id, admitted, limit)
			}
			return time.Since(start), true
		}
		admitted++
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}
