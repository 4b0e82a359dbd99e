package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Endurance: limiters dying or stopping under load, and a whole region
// restarting. Everything runs as real processes on real Redis and MariaDB.

const (
	// midLoadWorkers each send one check at a time, every midLoadInterval:
	// a steady load of about 16 × 200 = 3200 checks/s, shared by two
	// limiters.
	midLoadWorkers  = 16
	midLoadInterval = 5 * time.Millisecond
	// midLoadIDs identifiers, with a limit none of them reaches: every
	// check is admitted, no cell is near its limit and none holds 1% of it
	// unreported, so every cell reports at the slow cadence and spends a
	// lease (the worst case for what a killed limiter could lose).
	midLoadIDs      = 200
	midLoadLimit    = 1_000_000_000
	midLoadDuration = 3_600_000
)

// pair is two limiter processes of one region on one NATS server sharing
// Redis, the victim started first so its micro ID is known.
type pair struct {
	nc               *nats.Conn
	victim, survivor *process
	victimIDs        []string // the victim's micro instances
	redis            *region.Redis
	client           *bus.Client
	clientTimeout    time.Duration
}

func startPair(t *testing.T) *pair {
	t.Helper()
	srv := startServer(t)
	redisURL, prefix := redistest.SharedURL(t), redistest.Prefix(t)
	p := &pair{clientTimeout: time.Second}
	args := []string{"--nats-url", srv.ClientURL(), "--region", "r1", "--redis-url", redisURL, "--redis-prefix", prefix,
		"--log-level", "warn"}
	p.nc = connect(t, srv.ClientURL())
	p.victim = startProcess(t, "limiter", args...)
	waitService(t, p.nc, "ratelimit", instancesPerLimiter)
	p.victimIDs = serviceIDs(t, p.nc, instancesPerLimiter)
	p.survivor = startProcess(t, "limiter", args...)
	waitService(t, p.nc, "ratelimit", 2*instancesPerLimiter)
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	p.redis = rd
	// One check per message: these tests bound what a kill costs per
	// check in flight and spread the load by messages over the queue group
	// (a coalescing client sends a few large messages instead).
	p.client = bus.NewClient(p.nc, bus.WithTimeout(p.clientTimeout), bus.WithCoalescing(false))
	return p
}

// failedCheck is a check that got neither a decision nor a 503.
type failedCheck struct {
	sent time.Time
	err  error
}

// midLoad is steady check traffic over midLoadIDs identifiers.
type midLoad struct {
	ok, unavailable atomic.Int64
	stopCh          chan struct{}
	wg              sync.WaitGroup
	mu              sync.Mutex
	admitted        map[string]int64
	failed          []failedCheck
	denied          []string // never expected: the limit cannot be reached
}

func midLoadID(i int) string { return fmt.Sprintf("mid-%03d", i) }

func startMidLoad(c *bus.Client) *midLoad {
	l := &midLoad{stopCh: make(chan struct{}), admitted: map[string]int64{}}
	for g := range midLoadWorkers {
		l.wg.Go(func() {
			mine := map[string]int64{}
			var failed []failedCheck
			var denied []string
			defer func() {
				l.mu.Lock()
				for id, n := range mine {
					l.admitted[id] += n
				}
				l.failed = append(l.failed, failed...)
				l.denied = append(l.denied, denied...)
				l.mu.Unlock()
			}()
			tick := time.NewTicker(midLoadInterval)
			defer tick.Stop()
			for i := g; ; i += midLoadWorkers {
				select {
				case <-l.stopCh:
					return
				case <-tick.C:
				}
				id := midLoadID(i % midLoadIDs)
				sent := time.Now()
				resp, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{
					Identifier: id, Limit: midLoadLimit, Duration: midLoadDuration, Cost: 1})
				var se *bus.ServiceError
				switch {
				case err == nil && resp.Success:
					mine[id]++
					l.ok.Add(1)
				case err == nil:
					denied = append(denied, fmt.Sprintf("%s: %+v", id, resp))
				case errors.As(err, &se) && se.Code == 503:
					l.unavailable.Add(1) // a stopping limiter: nothing counted
				default:
					failed = append(failed, failedCheck{sent, err})
				}
			}
		})
	}
	return l
}

// waitOK waits until n more checks than now have been admitted.
func (l *midLoad) waitOK(t *testing.T, n int64) {
	t.Helper()
	want := l.ok.Load() + n
	deadline := time.Now().Add(15 * time.Second)
	for l.ok.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("load stalled: %d of %d checks admitted", l.ok.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop ends the load; any denial fails the test.
func (l *midLoad) stop(t *testing.T) {
	t.Helper()
	close(l.stopCh)
	l.wg.Wait()
	if len(l.denied) > 0 {
		t.Fatalf("%d checks denied at a limit they cannot reach, first: %s", len(l.denied), l.denied[0])
	}
}

// redisTotals reads the region's total of every load identifier: its
// current and previous window (the test may straddle an hour boundary).
func (p *pair) redisTotals(t *testing.T) map[string]int64 {
	t.Helper()
	ctx := testContext(t)
	seq := window.Sequence(time.Now().UnixMilli(), midLoadDuration)
	out := map[string]int64{}
	for i := range midLoadIDs {
		id := midLoadID(i)
		cur, prev, err := p.redis.Read(ctx, window.Cell{Workspace: "acme", Namespace: "api", Identifier: id,
			Duration: midLoadDuration, Sequence: seq})
		if err != nil {
			t.Fatal(err)
		}
		out[id] = cur.Count + prev.Count
	}
	return out
}

// victimServed sums the checks the victim's instances served.
func (p *pair) victimServed(t *testing.T) int {
	t.Helper()
	n := 0
	for _, v := range checkStats(t, p.nc, p.victimIDs...) {
		n += v
	}
	return n
}

// victimRate measures the victim's checks per second over about a second of
// steady load, from its micro stats.
func (p *pair) victimRate(t *testing.T) float64 {
	t.Helper()
	t0, n0 := time.Now(), p.victimServed(t)
	time.Sleep(time.Second) // the measuring interval itself
	t1, n1 := time.Now(), p.victimServed(t)
	return float64(n1-n0) / t1.Sub(t0).Seconds()
}

// A limiter killed with SIGKILL mid-load: its queue peer keeps answering.
// Only the checks in flight to the killed process at that instant fail (no
// reply, so the client times out), and every check sent a moment later is
// answered. Redis loses nothing the killed process admitted: every
// admission was charged there before it was final (under a lease or by
// Redis's grant), and once the killed process's leases are no longer live
// (--lease-for 1s + 100ms) Redis counts them as used. So Redis holds at
// least what clients saw admitted, and more by at most the killed process's
// unused leases (towards denial: each at most what its rate wants for 2 ×
// --lease-for, or 16 cost on an identifier it had just started) and the
// checks it admitted and never answered:
//
//	admitted ≤ Redis ≤ admitted + failed + ⌈2 × (its check rate) × 1s⌉ + 16 × identifiers
func TestKillMidLoadLosesNothingItAdmitted(t *testing.T) {
	p := startPair(t)
	load := startMidLoad(p.client)
	load.waitOK(t, 2000) // every identifier warm on both limiters
	rate := p.victimRate(t)
	leases := int64(math.Ceil(2*rate)) + 16*midLoadIDs
	if rate < 300 {
		t.Fatalf("the victim served only %.0f checks/s: the load is not spread over both limiters", rate)
	}
	killedAt := time.Now()
	p.victim.stop(t, syscall.SIGKILL, 5*time.Second)
	// The peer keeps answering: well past the failed checks' timeout.
	load.waitOK(t, 3000)
	for time.Since(killedAt) < p.clientTimeout+500*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
	}
	load.stop(t)
	if code := p.survivor.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("surviving limiter exited %d after SIGTERM, want 0", code)
	}

	var lateFailures []failedCheck
	for _, f := range load.failed {
		// A request sent before the server saw the connection close may still
		// be routed to the dead process; allow a short moment for that.
		if f.sent.After(killedAt.Add(250 * time.Millisecond)) {
			lateFailures = append(lateFailures, f)
		}
	}
	if len(lateFailures) > 0 {
		t.Fatalf("%d checks sent more than 250ms after the kill failed, first (sent %v after the kill): %v",
			len(lateFailures), lateFailures[0].sent.Sub(killedAt), lateFailures[0].err)
	}
	if len(load.failed) > midLoadWorkers {
		t.Fatalf("%d checks failed around the kill, want at most the %d in flight: first: %v",
			len(load.failed), midLoadWorkers, load.failed[0].err)
	}

	totals := p.redisTotals(t)
	var admitted, stored int64
	for i := range midLoadIDs {
		id := midLoadID(i)
		admitted += load.admitted[id]
		stored += totals[id]
	}
	over := stored - admitted
	t.Logf("victim served %.0f checks/s before the kill; %d checks failed (in flight to it), %d admitted in all; "+
		"Redis holds %d: %d more (its unused leases; bound %d + the %d failed)", rate, len(load.failed), admitted, stored, over, leases, len(load.failed))
	if over < 0 {
		t.Fatalf("Redis lacks %d of the %d admitted checks: a killed limiter lost what it admitted", -over, admitted)
	}
	if over > leases+int64(len(load.failed)) {
		t.Fatalf("Redis holds %d more than was admitted, more than the killed limiter's leases (%d) and the %d checks left unanswered",
			over, leases, len(load.failed))
	}
}

// A limiter stopped with SIGTERM mid-load exits 0 after replaying
// everything: Redis then holds, identifier by identifier, exactly what
// clients saw admitted. Checks reaching it while it stops are answered 503
// (nothing counted); no check fails otherwise.
func TestSIGTERMMidLoadLosesNothing(t *testing.T) {
	p := startPair(t)
	load := startMidLoad(p.client)
	load.waitOK(t, 2000)
	if served := p.victimServed(t); served < 300 {
		t.Fatalf("the victim served only %d checks: the load is not spread over both limiters", served)
	}
	if code := p.victim.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("limiter exited %d after SIGTERM, want 0", code)
	}
	load.waitOK(t, 2000)
	load.stop(t)
	if code := p.survivor.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("surviving limiter exited %d after SIGTERM, want 0", code)
	}
	if len(load.failed) > 0 {
		t.Fatalf("%d checks failed during a graceful stop, first: %v", len(load.failed), load.failed[0].err)
	}
	totals := p.redisTotals(t)
	var admitted int64
	for i := range midLoadIDs {
		id := midLoadID(i)
		admitted += load.admitted[id]
		if totals[id] != load.admitted[id] {
			t.Errorf("%s: Redis holds %d, clients saw %d admitted", id, totals[id], load.admitted[id])
		}
	}
	t.Logf("%d checks admitted and all in Redis; %d answered 503 while the limiter stopped", admitted, load.unavailable.Load())
}

// Every process of region eu (its bridge and its limiter) stopped with
// SIGTERM and started again. The first check in eu afterwards:
//
//   - is denied for an identifier us exhausted: eu's Redis never saw it, so
//     the new limiter knows it only from the new bridge's snapshot, which the
//     bridge loaded from MySQL;
//   - is denied for an identifier eu itself exhausted;
//   - sees usage eu's own limiter counted but never published (below 1% of
//     the limit, so no component reached the bridge or MySQL — asserted):
//     recovered from eu's Redis, and from nowhere else.
func TestRegionRestartRecoversItsStateFromRedisAndMySQL(t *testing.T) {
	w := startWorld(t, false, 1)
	const limit, duration = 20, 300_000
	ctx := testContext(t)
	db, err := sql.Open("mysql", w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	// us exhausts one identifier; wait until us's component is in MySQL
	// and eu's bridge counts it, without checking it in eu (which would put
	// it in eu's Redis).
	w.burst("us", "restart-us", limit, duration)
	waitStored(t, db, "restart-us", "us", limit)
	waitImport(t, w, "eu", "restart-us", func(imp global.Import) bool { return imp.Foreign >= limit })

	// eu exhausts one identifier, and counts a little of another: 9 of a
	// limit of 1000, below the 1% that would publish it.
	w.burst("eu", "restart-eu", limit, duration)
	const bigLimit, small = 1000, 9
	for range small {
		resp, err := w.check("eu", "restart-eu-small", bigLimit, duration, 1)
		if err != nil || !resp.Success {
			t.Fatalf("eu check of restart-eu-small: %+v, %v", resp, err)
		}
	}

	// Stop every eu process: the limiter first (it replays to Redis and
	// publishes), then the bridge (it forwards and stores what is pending).
	for _, l := range w.limiters["eu"] {
		if code := l.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
			t.Fatalf("eu limiter exited %d after SIGTERM", code)
		}
	}
	if code := w.bridges["eu"].stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("eu bridge exited %d after SIGTERM", code)
	}
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sluice_components WHERE identifier = ?`, "restart-eu-small").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("restart-eu-small has %d rows in MySQL: it was published, so this test cannot tell Redis recovery apart", rows)
	}

	// Start eu again: the bridge first, and the limiter only once that
	// bridge answers snapshots (it loaded MySQL before subscribing).
	w.bridges["eu"] = w.startBridge("eu", w.dsn)
	waitImport(t, w, "eu", "restart-us", func(imp global.Import) bool { return imp.Foreign >= limit })
	w.limiters["eu"] = []*process{w.startLimiter("eu")}
	waitLimiterIn(t, w, "eu")

	// The very first check of each identifier in eu.
	for _, c := range []struct {
		id          string
		limit, cost int64
		why         string
	}{
		{"restart-us", limit, 1, "us exhausted it (known to eu only through its bridge and MySQL)"},
		{"restart-eu", limit, 1, "eu exhausted it before the restart"},
		{"restart-eu-small", bigLimit, bigLimit - small + 1, "eu counted 9 of 1000 before the restart (only in Redis)"},
	} {
		resp, err := w.check("eu", c.id, c.limit, duration, c.cost)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Success {
			t.Fatalf("first check of %s in eu after the restart admitted (%+v): %s", c.id, resp, c.why)
		}
	}
	// And eu still has the rest of that small identifier's limit.
	resp, err := w.check("eu", "restart-eu-small", bigLimit, duration, bigLimit-small)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Success || resp.Remaining != 0 {
		t.Fatalf("restart-eu-small, the remaining %d of %d: %+v, want admitted with nothing left", bigLimit-small, bigLimit, resp)
	}
}

// waitStored waits until region's component of id in MySQL reaches count.
func waitStored(t *testing.T, db *sql.DB, id, region string, count int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		err := db.QueryRow(`SELECT COALESCE(MAX(count), 0) FROM sluice_components WHERE identifier = ? AND region = ?`, id, region).Scan(&n)
		if err == nil && n >= count {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's component of %s never reached %d in MySQL (last %d, %v)", region, id, count, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitImport waits until region's bridge answers a snapshot in which id's
// current import satisfies ok. A snapshot counts nothing.
func waitImport(t *testing.T, w *world, region, id string, ok func(global.Import) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		found := false
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := link.RequestSnapshot(ctx, w.conns[region], wire.Subjects{}, region, func(is []global.Import, _ int64) {
			for _, imp := range is {
				if imp.Cell.Identifier == id && ok(imp) {
					found = true
				}
			}
		})
		cancel()
		if err == nil && found {
			return
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s's bridge never reported the expected import of %s (last error %v)", region, id, last)
}

// waitLimiterIn waits until a limiter of region answers $SRV.PING with that
// region in its metadata: it applied its bridge's snapshot before serving.
func waitLimiterIn(t *testing.T, w *world, region string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, ping := range pingAll(t, w.conns[region], "ratelimit") {
			if ping.Metadata["region"] == region {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no limiter of %s answers", region)
}

// pingAll returns the answers to $SRV.PING.<name> that arrive within 100ms.
func pingAll(t *testing.T, nc *nats.Conn, name string) []micro.Ping {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING."+name, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out []micro.Ping
	for {
		m, err := sub.NextMsg(100 * time.Millisecond)
		if err != nil {
			return out
		}
		var p micro.Ping
		if err := json.Unmarshal(m.Data, &p); err == nil {
			out = append(out, p)
		}
	}
}
