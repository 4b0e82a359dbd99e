package test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
)

// durableRegion is one region as a new user runs it: nats-server,
// limiter processes on the shared Redis, bridge processes on a MariaDB
// database of the test's own that they reach through a proxy the test
// controls, and direct views of Redis and MySQL to compare.
type durableRegion struct {
	t        *testing.T
	url      string // NATS
	redisURL string
	prefix   string
	proxy    *tcpproxy.Proxy
	viaProxy string // the bridge's DSN
	db       *sql.DB
	redis    *region.Redis // the same keys, read directly
	nc       *nats.Conn
	client   *bus.Client
}

// durableLimit and durableWindow are the issue's: limit 1000, 10 minutes.
const (
	durableLimit  = 1000
	durableWindow = 600_000
)

func startDurableRegion(t *testing.T) *durableRegion {
	t.Helper()
	srv := startServer(t)
	dsn := mysqltest.Database(t)
	proxy, cfg := mysqltest.BehindProxy(t, dsn)
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	d := &durableRegion{t: t, url: srv.ClientURL(), redisURL: redistest.SharedURL(t), prefix: redistest.Prefix(t),
		proxy: proxy, viaProxy: cfg.FormatDSN(), db: db}
	d.redis, err = region.NewRedis(region.RedisConfig{URL: d.redisURL, KeyPrefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.redis.Close() })
	d.nc = connect(t, d.url)
	d.client = bus.NewClient(d.nc)
	return d
}

// bridgeProc is a bridge process and where its probes answer.
type bridgeProc struct {
	*process
	metrics string
}

// startBridge starts a bridge with the region's Redis and waits until it
// serves.
func (d *durableRegion) startBridge(extra ...string) *bridgeProc {
	d.t.Helper()
	addr := freeAddr(d.t)
	args := append([]string{"--nats-url", d.url, "--region", "r1", "--mysql-dsn", d.viaProxy,
		"--redis-url", d.redisURL, "--redis-prefix", d.prefix, "--metrics-addr", addr, "--log-level", "info"}, extra...)
	p := startProcess(d.t, "bridge", args...)
	waitService(d.t, d.nc, link.BridgeService, 1)
	return &bridgeProc{process: p, metrics: addr}
}

func (d *durableRegion) startLimiter() *process {
	d.t.Helper()
	p := startProcess(d.t, "limiter", "--nats-url", d.url, "--region", "r1",
		"--redis-url", d.redisURL, "--redis-prefix", d.prefix, "--log-level", "warn")
	waitService(d.t, d.nc, "ratelimit", instancesPerLimiter)
	return p
}

// checks sends n checks of cost 1 on id and fails unless all are admitted.
func (d *durableRegion) checks(id string, n int) {
	d.t.Helper()
	ctx := testContext(d.t)
	for range n {
		resp := checkUntil(ctx, d.t, d.client, "acme", "api", bus.CheckRequest{Identifier: id, Limit: durableLimit, Duration: durableWindow})
		if !resp.Success {
			d.t.Fatalf("check of %s denied: %+v", id, resp)
		}
	}
}

// inMySQL is the region's count of id in MySQL, summed over its cells (a
// run may cross a window's end); -1 while the table is missing.
func (d *durableRegion) inMySQL(id string) int64 {
	var n int64
	err := d.db.QueryRow(`SELECT COALESCE(SUM(count), 0) FROM sluice_components WHERE identifier = ? AND region = 'r1'`, id).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// inRedis is the region's count of id as its Redis holds it, summed over
// its cells.
func (d *durableRegion) inRedis(id string) int64 {
	d.t.Helper()
	var n int64
	_, err := d.redis.ScanCounts(testContext(d.t), func(cs []region.CellCount) error {
		for _, c := range cs {
			if c.Cell.Identifier == id {
				n += c.Count
			}
		}
		return nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return n
}

// converges waits until MySQL holds want for id, as Redis does, within
// within of start; it fails saying what each held.
func (d *durableRegion) converges(id string, want int64, start time.Time, within time.Duration, when string) {
	d.t.Helper()
	for {
		m, r := d.inMySQL(id), d.inRedis(id)
		if m == want && r == want {
			d.t.Logf("%s: MySQL = Redis = %d after %v", when, want, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > within {
			d.t.Fatalf("%s: after %v MySQL holds %d, Redis %d; want both %d", when, within, m, r, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAll stops the given limiters and bridge gracefully (each exits 0),
// then checks MySQL still equals Redis.
func (d *durableRegion) stopAll(id string, want int64, limiters []*process, bridge *bridgeProc) {
	d.t.Helper()
	for _, l := range limiters {
		if code := l.stop(d.t, syscall.SIGTERM, 15*time.Second); code != 0 {
			d.t.Fatalf("limiter exited %d after SIGTERM", code)
		}
	}
	if code := bridge.stop(d.t, syscall.SIGTERM, 15*time.Second); code != 0 {
		d.t.Fatalf("bridge exited %d after SIGTERM", code)
	}
	d.converges(id, want, time.Now(), 0, "after every process stopped gracefully")
}

// probe returns the status and body of the bridge's path.
func (b *bridgeProc) probe(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + b.metrics + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The table, each row ending with MySQL equal to Redis: 30 checks
// on one identifier (limit 1000, 10-minute window), then the bridge stops
// one way or another, a new bridge starts with MySQL reachable, and MySQL
// holds what Redis holds within 4 s, and still after every process stops
// gracefully.
func TestNothingAcknowledgedIsLostWhateverStopsTheBridge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mysqlDown bool // MySQL unreachable from before the first bridge starts until it stopped
		sig       syscall.Signal
	}{
		{"MySQL reachable, bridge SIGTERM", false, syscall.SIGTERM},
		{"MySQL reachable, bridge SIGKILL 1s after the last check", false, syscall.SIGKILL},
		{"bridge started while MySQL was unreachable, then SIGTERM", true, syscall.SIGTERM},
		{"bridge started while MySQL was unreachable, then SIGKILL", true, syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDurableRegion(t)
			if tc.mysqlDown {
				d.proxy.SetMode(tcpproxy.Refuse)
			}
			old := d.startBridge()
			lim := d.startLimiter()
			const id = "user-30"
			d.checks(id, 30)
			time.Sleep(time.Second) // the "1 s after the last check"
			if tc.mysqlDown {
				// The bridge holds the region's component and says so.
				code, body := old.probe(t, "/readyz")
				if code != http.StatusServiceUnavailable || !strings.Contains(body, "1 rows not yet durable in MySQL") {
					t.Fatalf("/readyz during the outage = %d %q, want 503 naming 1 row not yet durable", code, body)
				}
				if _, m := old.probe(t, "/metrics"); !strings.Contains(m, "sluice_store_pending_rows 1\n") {
					t.Fatalf("/metrics during the outage lacks sluice_store_pending_rows 1")
				}
			}
			start := time.Now()
			code := old.stop(t, tc.sig, 15*time.Second)
			took := time.Since(start)
			if tc.sig == syscall.SIGTERM {
				if code != 0 {
					t.Fatalf("bridge exited %d after SIGTERM, want 0", code)
				}
				if took > 5*time.Second {
					t.Fatalf("SIGTERM took %v, want a prompt stop, not the 10s shutdown timeout waited out", took)
				}
				out := old.stderr.String()
				if tc.mysqlDown && (strings.Count(out, "not yet durable") != 1 || !strings.Contains(out, "not_durable=1")) {
					t.Fatalf("want one line naming 1 row not yet durable; stderr:\n%s", out)
				}
				t.Logf("SIGTERM: exit %d after %v", code, took.Round(time.Millisecond))
			}
			if tc.mysqlDown {
				if n := d.inMySQL(id); n > 0 {
					t.Fatalf("MySQL holds %d while unreachable", n)
				}
				d.proxy.SetMode(tcpproxy.Pass)
			}
			fresh := d.startBridge()
			since := time.Now() // it serves: its start sweep is under way
			d.converges(id, 30, since, 4*time.Second, "a new bridge started")
			d.stopAll(id, 30, []*process{lim}, fresh)
		})
	}
}

// The same outage with the limiter also restarted during it (gracefully,
// then a new one admits more), and the bridge stopped either way: MySQL
// ends with everything Redis holds.
func TestLimiterRestartedDuringAMySQLOutageLosesNothing(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run("bridge "+sig.String(), func(t *testing.T) {
			d := startDurableRegion(t)
			d.proxy.SetMode(tcpproxy.Refuse)
			old := d.startBridge()
			lim := d.startLimiter()
			const id = "user-restarted"
			d.checks(id, 30)
			if code := lim.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
				t.Fatalf("limiter exited %d after SIGTERM", code)
			}
			lim = d.startLimiter()
			d.checks(id, 20)
			time.Sleep(time.Second)
			code := old.stop(t, sig, 15*time.Second)
			if sig == syscall.SIGTERM && code != 0 {
				t.Fatalf("bridge exited %d after SIGTERM, want 0", code)
			}
			d.proxy.SetMode(tcpproxy.Pass)
			fresh := d.startBridge()
			since := time.Now() // it serves: its start sweep is under way
			d.converges(id, 50, since, 4*time.Second, "a new bridge started")
			d.stopAll(id, 50, []*process{lim}, fresh)
		})
	}
}

// A bridge SIGKILLed after it acknowledged a limiter's publication and
// before it wrote it: the MySQL link is held (the proxy forwards nothing),
// so the window stays open until the kill. A new bridge writes the count.
func TestBridgeKilledBetweenAcknowledgingAndWritingLosesNothing(t *testing.T) {
	d := startDurableRegion(t)
	old := d.startBridge()
	if code, body := waitReady(t, old); code != http.StatusOK {
		t.Fatalf("/readyz = %d %q before the link is held", code, body)
	}
	lim := d.startLimiter()
	d.proxy.SetMode(tcpproxy.Blackhole)
	const id = "user-held"
	d.checks(id, 30)
	// The bridge acknowledged the limiter's publications and wrote nothing.
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, written := bridgeStatOf(t, d.nc, "components_in"), bridgeStatOf(t, d.nc, "store_writes")
		if in >= 1 {
			if written != 0 {
				t.Fatalf("the bridge wrote %v rows through a held link", written)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge never acknowledged the publication (components_in %v)", in)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := d.inMySQL(id); n > 0 {
		t.Fatalf("MySQL holds %d through a held link", n)
	}
	if code := old.stop(t, syscall.SIGKILL, 15*time.Second); code == 0 {
		t.Fatal("SIGKILL: exit 0")
	}
	d.proxy.SetMode(tcpproxy.Pass)
	fresh := d.startBridge()
	since := time.Now() // it serves: its start sweep is under way
	d.converges(id, 30, since, 4*time.Second, "a new bridge started")
	d.stopAll(id, 30, []*process{lim}, fresh)
}

// waitReady polls the bridge's /readyz until it answers 200 (10 s at most)
// and returns its last answer.
func waitReady(t *testing.T, b *bridgeProc) (int, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := b.probe(t, "/readyz")
		if code == http.StatusOK || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bridgeStatOf reads one counter of the region's bridge from its micro
// stats.
func bridgeStatOf(t *testing.T, nc *nats.Conn, name string) float64 {
	t.Helper()
	w := &world{t: t, conns: map[string]*nats.Conn{"r1": nc}}
	return w.bridgeStat("r1", name)
}

// Three regions on one MySQL, us's bridge reaching it through a proxy. us
// loses MySQL and every gateway is cut; us's bridge is SIGKILLed during
// both, and us's limiter keeps admitting with no bridge at all. After
// healing (MySQL back, gateways back, a new us bridge), every region's
// MySQL rows equal every region's Redis and what each admitted: the
// identifier all three use, one each only its region uses, whose last
// changes the limiters hold back under the 1% publish rule (the periodic
// sweep, at 2s here, recovers those), and one us used only during the
// outage, which the killed bridge had acknowledged and not stored.
func TestThreeRegionsRecoverEveryCountAfterACrashDuringAnOutageAndAPartition(t *testing.T) {
	sc, err := natstest.StartSuperclusterWith(testContext(t), natstest.SuperclusterOptions{Regions: regions, CuttableGateways: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	dsn := mysqltest.Database(t)
	proxy, cfg := mysqltest.BehindProxy(t, dsn)
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w := &world{t: t, sc: sc, dsn: dsn, redis: redistest.SharedURL(t), prefixes: map[string]string{},
		bridges: map[string]*process{}, limiters: map[string][]*process{}, clients: map[string]*bus.Client{}, conns: map[string]*nats.Conn{}}
	views := map[string]*region.Redis{}
	startBridge := func(r string) *process {
		d := dsn
		if r == "us" {
			d = cfg.FormatDSN()
		}
		return startProcess(t, "bridge", "--nats-url", sc.ClientURL(r), "--region", r, "--mysql-dsn", d,
			"--redis-url", w.redis, "--redis-prefix", w.prefixes[r], "--sweep-interval", "2s", "--log-level", "warn")
	}
	for _, r := range regions {
		w.prefixes[r] = redistest.Prefix(t)
		views[r], err = region.NewRedis(region.RedisConfig{URL: w.redis, KeyPrefix: w.prefixes[r]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { views[r].Close() })
		w.bridges[r] = startBridge(r)
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

	admitted := map[string]map[string]int64{} // region → identifier → cost admitted
	send := func(r, id string, n int) {
		t.Helper()
		for range n {
			resp, err := w.check(r, id, durableLimit, durableWindow, 1)
			if err != nil || !resp.Success {
				t.Fatalf("check of %s in %s: %+v, %v", id, r, resp, err)
			}
		}
		if admitted[r] == nil {
			admitted[r] = map[string]int64{}
		}
		admitted[r][id] += int64(n)
	}
	traffic := func(all, own int) {
		for _, r := range regions {
			send(r, "all", all)
			send(r, "only-"+r, own)
		}
	}
	traffic(20, 10)
	sc.CutGateways()
	if err := sc.WaitPartitioned(testContext(t)); err != nil {
		t.Fatal(err)
	}
	proxy.SetMode(tcpproxy.Refuse)
	traffic(15, 7)
	send("us", "outage-us", 30) // never checked again: no limiter publishes it after the crash
	// us's bridge takes in what us's limiter publishes, and cannot store it.
	deadline := time.Now().Add(10 * time.Second)
	for w.bridgeStat("us", "store_pending") < 1 || w.bridgeStat("us", "store_write_errors") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("us's bridge never held a row it could not store")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := w.bridges["us"].stop(t, syscall.SIGKILL, 15*time.Second); code == 0 {
		t.Fatal("SIGKILL: exit 0")
	}
	send("us", "all", 11)
	send("us", "only-us", 5)

	proxy.SetMode(tcpproxy.Pass)
	sc.HealGateways()
	if err := sc.WaitMesh(testContext(t)); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	w.bridges["us"] = startBridge("us")

	inMySQL := func(r, id string) int64 {
		var n int64
		if err := db.QueryRow(`SELECT COALESCE(SUM(count), 0) FROM sluice_components WHERE identifier = ? AND region = ?`, id, r).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	inRedis := func(r, id string) int64 {
		var n int64
		if _, err := views[r].ScanCounts(testContext(t), func(cs []region.CellCount) error {
			for _, c := range cs {
				if c.Cell.Identifier == id {
					n += c.Count
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for {
		var diffs []string
		for _, r := range regions {
			for id, want := range admitted[r] {
				if m, rd := inMySQL(r, id), inRedis(r, id); m != want || rd != want {
					diffs = append(diffs, fmt.Sprintf("%s %s: MySQL %d, Redis %d, admitted %d", r, id, m, rd, want))
				}
			}
		}
		if len(diffs) == 0 {
			t.Logf("every region's MySQL rows equal its Redis and its admissions %v after healing", time.Since(healed).Round(time.Millisecond))
			break
		}
		if time.Since(healed) > 10*time.Second {
			t.Fatalf("10s after healing:\n%s", strings.Join(diffs, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
