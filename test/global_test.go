package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	_ "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/window"
)

var regions = []string{"us", "eu", "ap"}

// world is three regions on a supercluster, each with limiters, one bridge,
// its own Redis key prefix, and one MariaDB database for all.
type world struct {
	t        *testing.T
	sc       *natstest.Supercluster
	dsn      string
	redis    string
	prefixes map[string]string
	bridges  map[string]*process
	limiters map[string][]*process
	clients  map[string]*bus.Client
	conns    map[string]*nats.Conn
	// rlsConfig, when set, makes every limiter serve Envoy's rate limit
	// service from it too; rls holds a client of each, by region.
	rlsConfig string
	rls       map[string][]rlsv3.RateLimitServiceClient
}

func startWorld(t *testing.T, cuttable bool, limitersPerRegion int) *world {
	t.Helper()
	return startWorldWith(t, cuttable, limitersPerRegion, "")
}

// startWorldWith is startWorld whose limiters also serve Envoy's rate
// limit service from rlsConfig, when it is not "".
func startWorldWith(t *testing.T, cuttable bool, limitersPerRegion int, rlsConfig string) *world {
	t.Helper()
	sc, err := natstest.StartSuperclusterWith(testContext(t), natstest.SuperclusterOptions{Regions: regions, CuttableGateways: cuttable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	w := &world{t: t, sc: sc, dsn: mysqltest.Database(t), redis: redistest.SharedURL(t),
		prefixes: map[string]string{}, bridges: map[string]*process{}, limiters: map[string][]*process{},
		clients: map[string]*bus.Client{}, conns: map[string]*nats.Conn{},
		rlsConfig: rlsConfig, rls: map[string][]rlsv3.RateLimitServiceClient{}}
	for _, r := range regions {
		w.prefixes[r] = redistest.Prefix(t)
		w.bridges[r] = w.startBridge(r, w.dsn)
	}
	for _, r := range regions {
		w.conns[r] = connect(t, sc.ClientURL(r))
		waitService(t, w.conns[r], link.BridgeService, 1)
		for range limitersPerRegion {
			w.limiters[r] = append(w.limiters[r], w.startLimiter(r))
		}
		w.clients[r] = bus.NewClient(w.conns[r])
	}
	for _, r := range regions {
		waitService(t, w.conns[r], "ratelimit", len(regions)*limitersPerRegion*instancesPerLimiter)
	}
	w.warmUp()
	return w
}

// warmUp carries one denial from every region to every other before a test
// measures anything: the first messages on new subjects across gateways wait
// for interest to settle, which is start-up, not convergence.
func (w *world) warmUp() {
	w.t.Helper()
	for _, src := range regions {
		id := "warmup-" + src
		w.burst(src, id, 200, 60_000)
		for _, dst := range regions {
			if dst != src {
				if _, ok := w.deniedWithin(dst, id, 200, 60_000, 10*time.Second); !ok {
					w.t.Fatalf("warm-up: %s never denied what %s exhausted", dst, src)
				}
			}
		}
	}
}

func (w *world) startBridge(region, dsn string) *process {
	return startProcess(w.t, "bridge", "--nats-url", w.sc.ClientURL(region), "--region", region,
		"--mysql-dsn", dsn, "--log-level", "warn")
}

func (w *world) startLimiter(region string) *process {
	args := []string{"--nats-url", w.sc.ClientURL(region), "--region", region,
		"--redis-url", w.redis, "--redis-prefix", w.prefixes[region], "--log-level", "warn"}
	if w.rlsConfig == "" {
		return startProcess(w.t, "limiter", args...)
	}
	addr := freeAddr(w.t)
	p := startProcess(w.t, "limiter", append(args, "--rls-listen", addr, "--rls-config", w.rlsConfig)...)
	c, _ := dialRLS(w.t, addr, nil)
	w.rls[region] = append(w.rls[region], c)
	return p
}

func (w *world) check(region, id string, limit, duration, cost int64) (bus.CheckResponse, error) {
	return w.clients[region].Check(context.Background(), "acme", "api",
		bus.CheckRequest{Identifier: id, Limit: limit, Duration: duration, Cost: cost, Peek: cost == 0})
}

// deniedWithin checks id in region every 10ms until it is denied or max
// passes, and returns how long that took. A denial counts only if the region
// admitted less than half the limit on its own meanwhile: it must come from
// what the region imported, not from the probing checks themselves.
func (w *world) deniedWithin(region, id string, limit, duration int64, max time.Duration) (time.Duration, bool) {
	w.t.Helper()
	start := time.Now()
	admitted := int64(0)
	for time.Since(start) < max {
		resp, err := w.check(region, id, limit, duration, 1)
		if err == nil && !resp.Success {
			if 2*admitted >= limit {
				w.t.Fatalf("%s denied %s only after admitting %d of %d itself", region, id, admitted, limit)
			}
			return time.Since(start), true
		}
		if err == nil {
			admitted++
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}

// burst exhausts id in region and returns when the region denies it.
func (w *world) burst(region, id string, limit, duration int64) {
	w.t.Helper()
	for i := int64(0); i <= 2*limit; i++ {
		resp, err := w.check(region, id, limit, duration, 1)
		if err != nil {
			w.t.Fatal(err)
		}
		if !resp.Success {
			return
		}
	}
	w.t.Fatalf("%s never denied %s", region, id)
}

// Traffic spread evenly over three regions at twice the limit, 10 s windows,
// 10 windows: admitted within 10% of what one exact limiter would admit.
func TestSpreadEvenlyTrafficStaysWithinTheGlobalAllowance(t *testing.T) {
	w := startWorld(t, false, 1)
	const limit, duration = 300, 10_000
	const windows = 10
	interval := time.Duration(duration) * time.Millisecond / (2 * limit) * 3 // per region
	time.Sleep(time.Duration(duration-time.Now().UnixMilli()%duration) * time.Millisecond)
	var mu sync.Mutex
	var all []sent
	perRegion := map[string]int64{}
	var wg sync.WaitGroup
	for i, r := range regions {
		wg.Go(func() {
			// Offset the regions so their requests interleave.
			time.Sleep(interval * time.Duration(i) / 3)
			reqs := pace(t, w.clients[r], "spread", limit, duration, interval, 2*limit*windows/3)
			mu.Lock()
			all = append(all, reqs...)
			perRegion[r] = admittedCost(reqs)
			mu.Unlock()
		})
	}
	wg.Wait()
	got, want := admittedCost(all), allowance(all, limit, duration)
	ratio := float64(got) / float64(want)
	t.Logf("admitted %d of %d (per region %v); one exact limiter: %d; ratio %.3f", got, len(all), perRegion, want, ratio)
	if ratio < 0.90 || ratio > 1.10 {
		t.Fatalf("admitted %d, want within 10%% of the allowance %d (ratio %.3f)", got, want, ratio)
	}
	w.checkNoDoubleCounting("spread", duration, true)
}

// checkNoDoubleCounting reads the stored components of id and every region's
// import: a region's import is exactly the others' components, never its own.
// Its own count comes back only as a lower bound, exactly the stored one
// when each region has one bridge (with two, each bridge sees the share of
// its region's publications the queue group gave it, until its next reload).
func (w *world) checkNoDoubleCounting(id string, duration int64, oneBridgePerRegion bool) {
	w.t.Helper()
	db, err := sql.Open("mysql", w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	defer db.Close()
	time.Sleep(500 * time.Millisecond) // the last store writes
	rows, err := db.Query(`SELECT sequence, region, count FROM sluice_components WHERE identifier = ? AND duration_ms = ?`, id, duration)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	stored := map[int64]map[string]int64{}
	for rows.Next() {
		var seq, n int64
		var region string
		if err := rows.Scan(&seq, &region, &n); err != nil {
			w.t.Fatal(err)
		}
		if stored[seq] == nil {
			stored[seq] = map[string]int64{}
		}
		stored[seq][region] = n
	}
	if len(stored) == 0 {
		w.t.Fatal("no components stored")
	}
	for _, r := range regions {
		imports := map[int64]global.Import{}
		if _, err := link.RequestSnapshot(context.Background(), w.conns[r], wire.Subjects{}, r, func(is []global.Import, _ int64) {
			for _, imp := range is {
				if imp.Cell.Identifier == id {
					imports[imp.Cell.Sequence] = imp
				}
			}
		}); err != nil {
			w.t.Fatal(err)
		}
		for seq, comps := range stored {
			imp, ok := imports[seq]
			if !ok {
				continue // expired from the bridge already
			}
			var foreign int64
			for reg, n := range comps {
				if reg != r {
					foreign += n
				}
			}
			ownOK := imp.Own == comps[r] || !oneBridgePerRegion && imp.Own <= comps[r]
			if imp.Foreign != foreign || !ownOK {
				w.t.Fatalf("%s, sequence %d: import foreign %d own %d; stored components %v", r, seq, imp.Foreign, imp.Own, comps)
			}
		}
	}
}

// bridgeStat reads one counter of region's bridge from its micro stats.
func (w *world) bridgeStat(region, name string) float64 {
	w.t.Helper()
	inbox := nats.NewInbox()
	sub, err := w.conns[region].SubscribeSync(inbox)
	if err != nil {
		w.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := w.conns[region].PublishRequest("$SRV.STATS."+link.BridgeService, inbox, nil); err != nil {
		w.t.Fatal(err)
	}
	for {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			w.t.Fatalf("no stats from %s's bridge: %v", region, err)
		}
		var st micro.Stats
		if err := json.Unmarshal(m.Data, &st); err != nil {
			w.t.Fatal(err)
		}
		if st.Metadata["region"] != region || len(st.Endpoints) == 0 {
			continue
		}
		var data map[string]float64
		if err := json.Unmarshal(st.Endpoints[0].Data, &data); err != nil {
			w.t.Fatal(err)
		}
		return data[name]
	}
}

// A burst exhausts an identifier in one region; the others deny it within
// 250 ms.
func TestBurstInOneRegionIsDeniedElsewhereWithin250ms(t *testing.T) {
	w := startWorld(t, false, 1)
	const limit, duration = 50, 60_000
	for round, src := range regions {
		id := fmt.Sprint("burst-", round)
		w.burst(src, id, limit, duration)
		for _, dst := range regions {
			if dst == src {
				continue
			}
			took, ok := w.deniedWithin(dst, id, limit, duration, 2*time.Second)
			t.Logf("burst in %s, denied in %s after %v", src, dst, took)
			if !ok || took > 250*time.Millisecond {
				t.Fatalf("burst in %s: %s denied after %v (ok %v), want within 250ms", src, dst, took, ok)
			}
		}
	}
	// A calendar period travels as any window: a monthly quota spent in
	// one region, in a zone 14 hours ahead of UTC, is denied in the others.
	month, _, err := window.ParseCalendar("month@Pacific/Kiritimati")
	if err != nil {
		t.Fatal(err)
	}
	w.burst("eu", "burst-monthly", limit, month)
	for _, dst := range []string{"us", "ap"} {
		took, ok := w.deniedWithin(dst, "burst-monthly", limit, month, 2*time.Second)
		t.Logf("a monthly quota spent in eu, denied in %s after %v", dst, took)
		if !ok || took > 250*time.Millisecond {
			t.Fatalf("a monthly quota spent in eu: %s denied after %v (ok %v), want within 250ms", dst, took, ok)
		}
	}
}

// With every gateway cut, each region keeps enforcing its limits and the
// regions still converge through MySQL; once healed, they converge fast again.
func TestPartitionedRegionsConvergeThroughMySQLThenFastAgain(t *testing.T) {
	w := startWorld(t, true, 1)
	const limit, duration = 400, 120_000
	w.sc.CutGateways()
	if err := w.sc.WaitPartitioned(testContext(t)); err != nil {
		t.Fatal(err)
	}
	fromPeers := w.bridgeStat("eu", "components_from_regions")
	// Each region enforces on its own.
	w.burst("us", "cut", limit, duration)
	// eu learns of it through MySQL: the us bridge stores it, eu's reloads it.
	took, ok := w.deniedWithin("eu", "cut", limit, duration, 5*time.Second)
	t.Logf("during the partition eu denied after %v", took)
	if !ok {
		t.Fatal("eu never denied an identifier us exhausted while the gateways were down")
	}
	// A calendar period's cells go through MySQL as well: its rows carry
	// the period.
	day, _, err := window.ParseCalendar("day@America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	w.burst("us", "cut-daily", limit, day)
	took, ok = w.deniedWithin("eu", "cut-daily", limit, day, 5*time.Second)
	t.Logf("during the partition eu denied a daily quota after %v", took)
	if !ok {
		t.Fatal("eu never denied a daily quota us spent while the gateways were down")
	}
	if after := w.bridgeStat("eu", "components_from_regions"); after != fromPeers {
		t.Fatalf("eu's bridge received %v components over NATS during the partition: the gateways were not cut", after-fromPeers)
	}
	w.sc.HealGateways()
	if err := w.sc.WaitMesh(testContext(t)); err != nil {
		t.Fatal(err)
	}
	w.burst("ap", "healed", limit, duration)
	took, ok = w.deniedWithin("us", "healed", limit, duration, 2*time.Second)
	t.Logf("after healing us denied after %v", took)
	if !ok || took > 250*time.Millisecond {
		t.Fatalf("after healing us denied after %v (ok %v), want within 250ms", took, ok)
	}
}

// A restarted bridge recovers the global state from MySQL, and a limiter
// that starts afterwards gets the current imports from it.
func TestBridgeRestartRecoversAndNewLimiterStartsWithImports(t *testing.T) {
	w := startWorld(t, false, 1)
	const limit, duration = 30, 300_000
	w.burst("us", "remembered", limit, duration)
	if _, ok := w.deniedWithin("eu", "remembered", limit, duration, 2*time.Second); !ok {
		t.Fatal("eu never denied")
	}
	time.Sleep(300 * time.Millisecond) // us's bridge stores its component
	// Replace eu's bridge and limiter: nothing of the old state survives in eu.
	if code := w.bridges["eu"].stop(t, syscall.SIGKILL, 5*time.Second); code == 0 {
		t.Log("bridge exited 0 on SIGKILL")
	}
	for _, l := range w.limiters["eu"] {
		l.stop(t, syscall.SIGTERM, 10*time.Second)
	}
	w.bridges["eu"] = w.startBridge("eu", w.dsn)
	waitService(t, w.conns["eu"], link.BridgeService, 1)
	w.limiters["eu"] = []*process{w.startLimiter("eu")}
	waitService(t, w.conns["eu"], "ratelimit", 3*instancesPerLimiter)
	// The very first check in eu is denied: the new limiter's snapshot came
	// from the new bridge, which loaded MySQL.
	resp, err := w.check("eu", "remembered", limit, duration, 1)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Success {
		t.Fatalf("first check in eu after the restarts admitted: %+v", resp)
	}
}

// MySQL goes away and comes back: decisions and NATS convergence never
// stall, and durable writes resume.
func TestMySQLOutageNeitherStallsNorLosesDurableWrites(t *testing.T) {
	sc, err := natstest.StartSuperclusterWith(testContext(t), natstest.SuperclusterOptions{Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	dsn := mysqltest.Database(t)
	cfg, addr := splitDSN(t, dsn)
	proxy, err := tcpproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := strings.Replace(dsn, addr, proxy.Addr(), 1) + cfg
	w := &world{t: t, sc: sc, dsn: dsn, redis: redistest.SharedURL(t), prefixes: map[string]string{},
		bridges: map[string]*process{}, limiters: map[string][]*process{}, clients: map[string]*bus.Client{}, conns: map[string]*nats.Conn{}}
	for _, r := range regions {
		w.prefixes[r] = redistest.Prefix(t)
		d := dsn
		if r == "us" {
			d = viaProxy
		}
		w.bridges[r] = w.startBridge(r, d)
	}
	for _, r := range regions {
		w.conns[r] = connect(t, sc.ClientURL(r))
		waitService(t, w.conns[r], link.BridgeService, 1)
		w.limiters[r] = []*process{w.startLimiter(r)}
		w.clients[r] = bus.NewClient(w.conns[r])
	}
	for _, r := range regions {
		waitService(t, w.conns[r], "ratelimit", 3*instancesPerLimiter)
	}
	w.warmUp()
	proxy.SetMode(tcpproxy.Blackhole)
	const limit, duration = 30, 300_000
	start := time.Now()
	w.burst("us", "mysql-down", limit, duration)
	if time.Since(start) > 2*time.Second {
		t.Fatalf("a burst of %d checks took %v while MySQL was down", limit, time.Since(start))
	}
	took, ok := w.deniedWithin("ap", "mysql-down", limit, duration, 2*time.Second)
	if !ok || took > 250*time.Millisecond {
		t.Fatalf("with us's MySQL down, ap denied after %v (ok %v), want NATS convergence within 250ms", took, ok)
	}
	proxy.SetMode(tcpproxy.Pass)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int64
		err := db.QueryRow(`SELECT COALESCE(MAX(count), 0) FROM sluice_components WHERE identifier = ? AND region = 'us'`, "mysql-down").Scan(&n)
		if err == nil && n >= limit-1 {
			t.Logf("us's component reached MySQL after it came back: %d", n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("us's component never reached MySQL after it came back (last %d, %v)", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// splitDSN returns the address of a tcp DSN, and the parameters to add for
// short timeouts through a proxy.
func splitDSN(t *testing.T, dsn string) (params, addr string) {
	t.Helper()
	i := strings.Index(dsn, "tcp(")
	j := strings.Index(dsn[i:], ")")
	if i < 0 || j < 0 {
		t.Fatalf("DSN %q has no tcp address", dsn)
	}
	addr = dsn[i+4 : i+j]
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return sep + "timeout=1s&readTimeout=1s&writeTimeout=1s", addr
}

// Two bridges in one region share its limiters' counts and both receive the
// other regions': convergence works both ways and nothing is counted twice.
func TestTwoBridgesInARegionBreakNothing(t *testing.T) {
	w := startWorld(t, false, 1)
	w.startBridge("us", w.dsn)
	waitService(t, w.conns["us"], link.BridgeService, 4)
	const limit, duration = 40, 60_000
	for round, src := range []string{"us", "eu", "us", "ap"} {
		id := fmt.Sprint("two-bridges-", round)
		w.burst(src, id, limit, duration)
		for _, dst := range regions {
			if dst == src {
				continue
			}
			if took, ok := w.deniedWithin(dst, id, limit, duration, 2*time.Second); !ok || took > 250*time.Millisecond {
				t.Fatalf("burst in %s: %s denied after %v (ok %v)", src, dst, took, ok)
			}
		}
	}
	w.checkNoDoubleCounting("two-bridges-0", duration, false)
}
