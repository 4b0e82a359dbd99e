// Package scale runs the global layer's scale scenario: three regions, each
// with one limiter and one bridge as processes of their own (so each one's
// CPU and heap are its own), a NATS supercluster joined by gateways, the
// regions' Redis, and a private MariaDB holding a given number of live cells
// before the bridges start. Steady traffic then changes a known number of
// cells per second, and one run measures what the global layer's targets are
// about: MySQL rows read per second per bridge (from the server's own status
// counters, so the server is started for the scenario alone), bridge CPU and
// heap, limiter heap and cells held against the cells each one serves,
// convergence between regions, and whether a restarted bridge recovers
// every region's components.
//
// `go run ./test/scale` runs it at full size; test.TestScaleShort runs a
// small one in `make test`.
//
// RunPolicies runs the policies scenario on the same harness: workspaces'
// overrides and reset marks loaded into MySQL, policy changes through the
// admin API, and what they cost each bridge in rows read, what they do to
// each process's live heap, and whether they reach every region (`make
// scale-policies`; test.TestScalePoliciesShort in `make test`).
package scale

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/natstest"
)

// Config is one run of the scenario. Zero fields take the defaults named.
type Config struct {
	// Cells is how many live cells are loaded into MySQL before the
	// bridges start, spread evenly over the regions (default 1,000,000).
	Cells int
	// Changes is how many cells the steady traffic changes per second
	// (default 2000): as many checks a second, each on a different cell,
	// each admitted, so each changes one component row.
	Changes int
	// Duration is the measured part of the steady traffic (default 60s),
	// after a warm-up of Warmup (default 2s).
	Duration, Warmup time.Duration
	// Cycle is how often each cell of the working set is checked (default
	// 10s): the working set is Changes × Cycle cells, half of them loaded
	// cells (checked in a region other than the one that owns their row),
	// half new ones. At least 2s, so one cell's checks never overlap.
	Cycle time.Duration
	// Limit of every check (default 100): small, so that each admission
	// (1% of it) is worth publishing.
	Limit int64
	// Grace is how long convergence may still arrive after the last check
	// (default 2s).
	Grace time.Duration
	// HeapSample is how long a live heap is sampled (default 3s).
	HeapSample time.Duration
	// RedisURL is the regions' Redis (default redis://127.0.0.1:6379);
	// each region gets a key prefix of its own, deleted at the end.
	RedisURL string
	// BinDir holds built limiter and bridge commands; empty: they are
	// built into a temporary directory.
	BinDir string
	// NoBridgeRedis starts the bridges without their region's Redis (no
	// sweeps into MySQL), to measure what
	// the sweeps cost.
	NoBridgeRedis bool
	// SweepInterval is the bridges' --sweep-interval (0: their default).
	SweepInterval time.Duration
	// Log receives progress lines, ProcessLog the output of every
	// process started (nil: discarded).
	Log, ProcessLog io.Writer
}

// The defaults of Config.
const (
	DefaultCells    = 1_000_000
	DefaultChanges  = 2000
	DefaultDuration = 60 * time.Second
	DefaultCycle    = 10 * time.Second
)

func (c *Config) setDefaults() error {
	if c.Cells == 0 {
		c.Cells = DefaultCells
	}
	if c.Changes == 0 {
		c.Changes = DefaultChanges
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Warmup == 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Cycle == 0 {
		c.Cycle = DefaultCycle
	}
	if c.Limit == 0 {
		c.Limit = 100
	}
	if c.Grace == 0 {
		c.Grace = 2 * time.Second
	}
	if c.HeapSample == 0 {
		c.HeapSample = 3 * time.Second
	}
	if c.RedisURL == "" {
		c.RedisURL = "redis://127.0.0.1:6379"
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.ProcessLog == nil {
		c.ProcessLog = io.Discard
	}
	if c.Cells < 0 || c.Changes < 0 || c.Duration < 0 || c.Cycle < 2*checkTimeout {
		return fmt.Errorf("scale: cells and changes must be positive and the cycle at least %v", 2*checkTimeout)
	}
	checks := int64((c.Warmup + c.Duration + c.Cycle - 1) / c.Cycle)
	if checks+3 > c.Limit {
		return fmt.Errorf("scale: each cell is checked up to %d times, which a limit of %d cannot admit: raise the limit or the cycle", checks, c.Limit)
	}
	return nil
}

// Regions are the scenario's regions.
var Regions = []string{"us", "eu", "ap"}

// Result is what one run measured.
type Result struct {
	Config Config
	// Load is how long inserting Config.Cells rows took.
	Load time.Duration
	// Settle is how long the bridges took, after their start-up loads, to
	// become idle (each under SettledCPU), or MaxSettle if they did not:
	// the steady traffic starts then.
	Settle time.Duration
	// Window is the measured steady window (Config.Duration, unless the
	// run was cut short).
	Window time.Duration
	// Checks in the window: sent, admitted (each changed one cell),
	// denied, failed (no answer within a second).
	Sent, Admitted, Denied, Failed int64
	// ChangedPerSecond is Admitted over Window: cells changed a second.
	ChangedPerSecond float64
	// Server is the private MariaDB over the window.
	Server      ServerFigures
	Bridges     []BridgeFigures
	Limiters    []LimiterFigures
	Convergence Convergence
	Restart     Restart
	// Notes say what went wrong without stopping the run: a process that
	// did not answer a scrape or a SIGTERM in time.
	Notes []string
}

// ServerFigures are MariaDB's own counters over the steady window.
type ServerFigures struct {
	// RowsReadPerSecond is the server's Rows_read (MySQL:
	// Innodb_rows_read) a second, all bridges together.
	RowsReadPerSecond float64
	// LoadRowsReadPerSecond is what of it the bridges' loads read: the
	// server's Rows_sent a second, since loads are the only statements
	// that return rows (but for the harness's few status rows), while an
	// upsert that finds its row reads it without returning it. It
	// matches the sum of the bridges' own sluice_store_rows_loaded_total.
	LoadRowsReadPerSecond float64
	// RowsWrittenPerSecond is Handler_write a second: rows the bridges'
	// upserts inserted or tried to (an upsert of an existing row counts
	// here and in RowsUpdatedPerSecond).
	RowsWrittenPerSecond, RowsUpdatedPerSecond float64
	// CPU is mariadbd's CPU time over the window, in cores.
	CPU float64
}

// BridgeFigures are one bridge's.
type BridgeFigures struct {
	Region string
	// StartupLoad is from starting the process to its first load from
	// MySQL completing.
	StartupLoad time.Duration
	// CPU is cores used over the window; Heap the live heap after it
	// (lowest allocated heap sampled), HeapInuse the heap in use then.
	CPU             float64
	Heap, HeapInuse float64
	// RowsLoadedPerSecond is the bridge's own count of rows it loaded
	// (sluice_store_rows_loaded_total) a second over the window;
	// -1 when the bridge does not export it.
	RowsLoadedPerSecond float64
	// Cells is sluice_bridge_cells after the window.
	Cells float64
}

// LimiterFigures are one limiter's.
type LimiterFigures struct {
	Region string
	// HeapIdle is the live heap before anything was loaded; Heap after
	// the steady traffic.
	HeapIdle, Heap float64
	// CellsHeld is sluice_cells after the traffic; CellsServed how many
	// cells the traffic checked in this region.
	CellsHeld   float64
	CellsServed int
}

// Restart is the bridge restart check: one region's bridge stopped
// (SIGTERM) and started again once the traffic had been stored.
type Restart struct {
	Region string
	// Took is from the SIGTERM to a snapshot holding every live foreign
	// component (or to giving up).
	Took time.Duration
	// What the store holds of the other regions (cells with a live
	// component of another region, and their sum) and what the restarted
	// bridge's snapshot held: at least as much (more when the other
	// bridges forwarded what they had not stored yet) is recovered.
	StoreCells, StoreSum, SnapshotCells, SnapshotSum int64
	Recovered                                        bool
	// StoredAll is the sum of every live component in the store before
	// the restart; AdmittedAll what it must be: the loaded counts plus
	// every admission of the traffic (each adds one to its region's
	// component).
	StoredAll, AdmittedAll int64
}

// Run runs the scenario once. An error means it could not run (a service
// missing, a process failing to start); targets missed are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, res: &Result{Config: cfg}, plog: &lockedWriter{w: cfg.ProcessLog}}
	defer r.close()
	if err := r.run(ctx); err != nil {
		return nil, err
	}
	r.res.Notes = r.noted()
	return r.res, nil
}

// run is one run's state.
type run struct {
	mu    sync.Mutex // guards notes
	notes []string
	cfg   Config
	res   *Result
	plog  *lockedWriter
	// env is added to the environment of every process started;
	// startWait bounds the wait for one to serve its metrics (0: 30s; a
	// bridge does once its start-up load is done).
	env       []string
	startWait time.Duration

	binDir   string
	sc       *natstest.Supercluster
	db       *mariaDB
	store    *sql.DB
	redis    *redis.Client
	prefixes []string
	conns    []*nats.Conn
	limiters []*process
	bridges  []*process
	cleanups []func()
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (r *run) run(ctx context.Context) error {
	if err := r.startServices(ctx); err != nil {
		return err
	}
	if err := r.startLimiters(ctx); err != nil {
		return err
	}
	idle := make([]float64, len(Regions))
	if err := eachRegion(func(i int) error {
		h, _, err := liveHeap(ctx, r.limiters[i], r.cfg.HeapSample)
		idle[i] = h
		return err
	}); err != nil {
		return err
	}

	r.logf("loading %d live cells into MySQL", r.cfg.Cells)
	start := time.Now()
	if err := loadRows(ctx, r.store, Regions, r.cfg.Cells, time.Now().UnixMilli()); err != nil {
		return err
	}
	r.res.Load = time.Since(start)
	r.logf("loaded in %v", r.res.Load.Round(time.Millisecond))

	r.res.Bridges = make([]BridgeFigures, len(Regions))
	r.bridges = make([]*process, len(Regions))
	if err := eachRegion(func(i int) error {
		p, took, err := r.startBridge(ctx, i)
		r.bridges[i] = p
		r.res.Bridges[i] = BridgeFigures{Region: Regions[i], StartupLoad: took}
		return err
	}); err != nil {
		return err
	}

	if err := r.settle(ctx); err != nil {
		return err
	}

	tr := newTracker(Regions, r.cfg.Changes*int(r.cfg.Cycle/time.Second), r.cfg.Cells)
	for i, nc := range r.conns {
		sub, err := tr.subscribeImports(nc, wire.Subjects{}, i)
		if err != nil {
			return err
		}
		r.cleanups = append(r.cleanups, func() { _ = sub.Unsubscribe() })
		if err := nc.Flush(); err != nil {
			return err
		}
	}
	if err := r.steady(ctx, tr); err != nil {
		return err
	}

	r.res.Limiters = make([]LimiterFigures, len(Regions))
	served := tr.served()
	_ = eachRegion(func(i int) error {
		l := LimiterFigures{Region: Regions[i], HeapIdle: idle[i], CellsServed: served[i]}
		l.Heap, _ = r.heap(ctx, r.limiters[i])
		l.CellsHeld = r.metric(ctx, r.limiters[i], "sluice_cells")
		r.res.Limiters[i] = l
		b := &r.res.Bridges[i]
		b.Heap, b.HeapInuse = r.heap(ctx, r.bridges[i])
		b.Cells = r.metric(ctx, r.bridges[i], "sluice_bridge_cells")
		return nil
	})
	return r.restartBridge(ctx, tr, 0)
}

// SettledCPU is the CPU (in cores) under which an idle bridge is taken to
// be done with its start-up; MaxSettle bounds the wait.
const (
	SettledCPU = 0.15
	MaxSettle  = time.Minute
)

// settle waits until every bridge has used less than SettledCPU over the
// last two seconds, so the steady window measures the steady state and not
// the tail of the start-up load (forwards, broadcasts, collections).
func (r *run) settle(ctx context.Context) error {
	const step = 2 * time.Second
	start := time.Now()
	last := make([]float64, len(r.bridges))
	for {
		busy := false
		for i, b := range r.bridges {
			cpu, err := procCPUSeconds(b.cmd.Process.Pid)
			if err != nil {
				return err
			}
			if time.Since(start) < step || (cpu-last[i])/step.Seconds() >= SettledCPU {
				busy = true
			}
			last[i] = cpu
		}
		r.res.Settle = time.Since(start)
		if !busy {
			r.logf("bridges idle %v after their start-up loads", r.res.Settle.Round(time.Millisecond))
			return nil
		}
		if r.res.Settle >= MaxSettle {
			r.note("bridges still busy %v after their start-up loads; traffic starts anyway", MaxSettle)
			return nil
		}
		if err := sleep(ctx, step); err != nil {
			return err
		}
	}
}

// heap is liveHeap, NaN (and a note) when p does not answer.
func (r *run) heap(ctx context.Context, p *process) (alloc, inuse float64) {
	alloc, inuse, err := liveHeap(ctx, p, r.cfg.HeapSample)
	if err != nil {
		r.note("%s: heap unknown: %v", p.name, err)
		return math.NaN(), math.NaN()
	}
	return alloc, inuse
}

// metric is one metric of p, NaN (and a note) when p does not answer.
func (r *run) metric(ctx context.Context, p *process, name string) float64 {
	m, err := p.scrape(ctx)
	if err != nil {
		r.note("%s: %s unknown: %v", p.name, name, err)
		return math.NaN()
	}
	return m.value(name)
}

// note records something that went wrong without stopping the run.
func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, n)
	r.logf("%s", n)
}

// noted returns what note recorded.
func (r *run) noted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.notes)
}

// startServices builds the commands and starts NATS, MariaDB and the
// Redis connection.
func (r *run) startServices(ctx context.Context) error {
	r.binDir = r.cfg.BinDir
	if r.binDir == "" {
		dir, remove, err := tempDir("sluice-scale-bin-")
		if err != nil {
			return err
		}
		r.cleanups = append(r.cleanups, remove)
		r.logf("building limiter and bridge")
		if err := buildCommands(ctx, dir); err != nil {
			return err
		}
		r.binDir = dir
	}

	opts, err := redis.ParseURL(r.cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("redis url: %w", err)
	}
	r.redis = redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = r.redis.Ping(pctx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis at %s does not answer (run make services): %w", r.cfg.RedisURL, err)
	}
	run := make([]byte, 6)
	_, _ = rand.Read(run)
	for _, reg := range Regions {
		r.prefixes = append(r.prefixes, "sluice-scale-"+hex.EncodeToString(run)+"-"+reg+":")
	}

	r.logf("starting a three-region NATS supercluster")
	sc, err := natstest.StartSupercluster(ctx, Regions...)
	if err != nil {
		return err
	}
	r.sc = sc
	for _, reg := range Regions {
		nc, err := nats.Connect(sc.ClientURL(reg), nats.Name("scale harness "+reg))
		if err != nil {
			return err
		}
		r.conns = append(r.conns, nc)
	}

	r.logf("starting a private mariadbd")
	db, err := startMariaDB(ctx, r.logf)
	if err != nil {
		return err
	}
	r.db = db
	if err := r.command(ctx, "bridge", "migrate", "--mysql-dsn", db.DSN("sluice")); err != nil {
		return err
	}
	store, err := sql.Open("mysql", db.DSN("sluice"))
	if err != nil {
		return err
	}
	store.SetMaxOpenConns(4)
	r.store = store
	return nil
}

// command runs a command of ours to its end.
func (r *run) command(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, binPath(r.binDir, name), args...)
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(r.plog, "%s %s: %s", name, args[0], out)
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func (r *run) startLimiters(ctx context.Context) error {
	r.limiters = make([]*process, len(Regions))
	return eachRegion(func(i int) error {
		reg := Regions[i]
		p, err := startProcess(ctx, "limiter "+reg, binPath(r.binDir, "limiter"), r.plog, r.env, r.startWait, "serve",
			"--nats-url", r.sc.ClientURL(reg), "--region", reg,
			"--redis-url", r.cfg.RedisURL, "--redis-prefix", r.prefixes[i])
		r.limiters[i] = p
		if err != nil {
			return err
		}
		return waitReady(ctx, p, 30*time.Second)
	})
}

// startBridge starts region i's bridge and waits for its first load from
// MySQL, returning how long after its start that completed.
func (r *run) startBridge(ctx context.Context, i int) (*process, time.Duration, error) {
	reg := Regions[i]
	args := []string{"serve", "--nats-url", r.sc.ClientURL(reg), "--region", reg, "--mysql-dsn", r.db.DSN("sluice")}
	if !r.cfg.NoBridgeRedis {
		args = append(args, "--redis-url", r.cfg.RedisURL, "--redis-prefix", r.prefixes[i])
		if r.cfg.SweepInterval > 0 {
			args = append(args, "--sweep-interval", r.cfg.SweepInterval.String())
		}
	}
	p, err := startProcess(ctx, "bridge "+reg, binPath(r.binDir, "bridge"), r.plog, r.env, r.startWait, args...)
	if err != nil {
		return nil, 0, err
	}
	took, err := waitMetric(ctx, p, "sluice_store_loads_total", 1, 10*time.Minute)
	if err != nil {
		return p, 0, err
	}
	r.logf("bridge %s: first load from MySQL done %v after its start", reg, took.Round(time.Millisecond))
	return p, took, nil
}

// counters is one reading of everything measured as a rate.
type counters struct {
	at        time.Time
	server    map[string]float64
	serverCPU float64
	bridgeCPU []float64
	// limiterCPU is each limiter's CPU time.
	limiterCPU []float64
	// rowsLoaded is each bridge's sluice_store_rows_loaded_total
	// and when it was read (a busy bridge answers late); ok when every
	// bridge exported it.
	rowsLoaded       []float64
	rowsLoadedAt     []time.Time
	rowsLoadedOK     bool
	admitted, denied int64
	failed, sent     int64
}

// The server's counters read: MariaDB's Rows_read, MySQL's Innodb_rows_read
// (whichever the server has), the rows sent to clients, and the handler's
// writes and updates.
var serverCounters = []string{"Rows_read", "Innodb_rows_read", "Rows_sent", "Handler_write", "Handler_update"}

// rowsRead names the server's count of rows read: MariaDB's Rows_read, or
// MySQL's Innodb_rows_read.
func rowsRead(status map[string]float64) string {
	if _, ok := status["Rows_read"]; ok {
		return "Rows_read"
	}
	return "Innodb_rows_read"
}

// read takes the readings that cost nothing first (the server's counters,
// CPU times from /proc, the traffic's counts unless tr is nil), all at
// c.at, then scrapes the bridges, which may answer late.
func (r *run) read(ctx context.Context, tr *tracker) (counters, error) {
	c := counters{at: time.Now()}
	if tr != nil {
		c.admitted, c.denied, c.failed, c.sent = tr.admitted.Load(), tr.denied.Load(), tr.failed.Load(), tr.sent.Load()
	}
	var err error
	if c.server, err = r.db.status(ctx, serverCounters...); err != nil {
		return c, err
	}
	if c.serverCPU, err = r.db.cpuSeconds(); err != nil {
		return c, err
	}
	for _, b := range r.bridges {
		cpu, err := procCPUSeconds(b.cmd.Process.Pid)
		if err != nil {
			return c, err
		}
		c.bridgeCPU = append(c.bridgeCPU, cpu)
	}
	for _, l := range r.limiters {
		cpu, err := procCPUSeconds(l.cmd.Process.Pid)
		if err != nil {
			return c, err
		}
		c.limiterCPU = append(c.limiterCPU, cpu)
	}
	n := len(r.bridges)
	c.rowsLoaded, c.rowsLoadedAt = make([]float64, n), make([]time.Time, n)
	found := make([]bool, n)
	_ = eachRegion(func(i int) error {
		m, err := r.bridges[i].scrape(ctx)
		c.rowsLoadedAt[i] = time.Now()
		if err != nil {
			r.note("%s: rows loaded unknown: %v", r.bridges[i].name, err)
		}
		c.rowsLoaded[i], found[i] = m.get("sluice_store_rows_loaded_total")
		return nil
	})
	c.rowsLoadedOK = !slices.Contains(found, false)
	return c, nil
}

// steady runs the traffic: a warm-up, then the measured window.
func (r *run) steady(ctx context.Context, tr *tracker) error {
	clients := make([]*bus.Client, len(r.conns))
	for i, nc := range r.conns {
		clients[i] = bus.NewClient(nc, bus.WithTimeout(checkTimeout))
	}
	tctx, stop := context.WithCancel(ctx)
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		tr.drive(tctx, clients, r.cfg.Changes, r.cfg.Limit)
	}()
	defer func() { stop(); <-driven }()
	r.logf("steady traffic: %d checks/s over a working set of %d cells; measuring %v after %v",
		r.cfg.Changes, len(tr.targets), r.cfg.Duration, r.cfg.Warmup)
	if err := sleep(ctx, r.cfg.Warmup); err != nil {
		return err
	}
	c0, err := r.read(ctx, tr)
	if err != nil {
		return err
	}
	if err := sleep(ctx, time.Until(c0.at.Add(r.cfg.Duration))); err != nil {
		return err
	}
	c1, err := r.read(ctx, tr)
	if err != nil {
		return err
	}
	stop()
	<-driven
	r.logf("traffic stopped; waiting %v for the last imports", r.cfg.Grace)
	if err := sleep(ctx, r.cfg.Grace); err != nil {
		return err
	}

	res := r.res
	w := c1.at.Sub(c0.at)
	sec := w.Seconds()
	res.Window = w
	res.Sent, res.Admitted = c1.sent-c0.sent, c1.admitted-c0.admitted
	res.Denied, res.Failed = c1.denied-c0.denied, c1.failed-c0.failed
	res.ChangedPerSecond = float64(res.Admitted) / sec
	res.Server = serverFigures(c0, c1)
	for i := range r.bridges {
		b := &res.Bridges[i]
		b.CPU = (c1.bridgeCPU[i] - c0.bridgeCPU[i]) / sec
		b.RowsLoadedPerSecond = -1
		if c0.rowsLoadedOK && c1.rowsLoadedOK {
			b.RowsLoadedPerSecond = (c1.rowsLoaded[i] - c0.rowsLoaded[i]) / c1.rowsLoadedAt[i].Sub(c0.rowsLoadedAt[i]).Seconds()
		}
	}
	res.Convergence = tr.convergence(c0.at, c1.at)
	return nil
}

// serverFigures are the server's rates between two readings.
func serverFigures(c0, c1 counters) ServerFigures {
	sec := c1.at.Sub(c0.at).Seconds()
	rate := func(name string) float64 { return (c1.server[name] - c0.server[name]) / sec }
	return ServerFigures{
		RowsReadPerSecond:     rate(rowsRead(c1.server)),
		LoadRowsReadPerSecond: rate("Rows_sent"),
		RowsWrittenPerSecond:  rate("Handler_write"),
		RowsUpdatedPerSecond:  rate("Handler_update"),
		CPU:                   (c1.serverCPU - c0.serverCPU) / sec,
	}
}

// restartBridge stops region i's bridge once everything is stored, starts
// it again and compares its snapshot with what the store holds of the
// other regions.
func (r *run) restartBridge(ctx context.Context, tr *tracker, i int) error {
	reg := Regions[i]
	for _, b := range r.bridges {
		if _, err := waitMetricZero(ctx, b, "sluice_store_pending_rows", 30*time.Second); err != nil {
			r.note("restart: %v", err)
		}
	}
	cells, sum, err := foreignTruth(ctx, r.store, reg, time.Now().UnixMilli())
	if err != nil {
		return err
	}
	stored, err := storedSum(ctx, r.store)
	if err != nil {
		return err
	}
	rs := &r.res.Restart
	*rs = Restart{Region: reg, StoreCells: cells, StoreSum: sum,
		StoredAll: stored, AdmittedAll: loadedSum(r.cfg.Cells) + tr.admitted.Load()}
	r.logf("restarting bridge %s (the store holds %d cells of the other regions)", reg, cells)
	start := time.Now()
	if err := r.bridges[i].stop(20 * time.Second); err != nil {
		r.note("restart: %v", err)
	}
	p, _, err := r.startBridge(ctx, i)
	if p != nil {
		r.bridges[i] = p
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var n, s int64
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := link.RequestSnapshot(sctx, r.conns[i], wire.Subjects{}, reg, func(is []global.Import, _ int64) {
			for _, imp := range is {
				if imp.Foreign > 0 {
					n++
					s += imp.Foreign
				}
			}
		})
		cancel()
		rs.Took, rs.SnapshotCells, rs.SnapshotSum = time.Since(start), n, s
		// More than the store holds is fine: components the other
		// bridges forwarded over NATS and have not stored yet.
		if err == nil && n >= cells && s >= sum {
			rs.Recovered = true
			r.logf("bridge %s recovered every foreign component %v after its SIGTERM", reg, rs.Took.Round(time.Millisecond))
			return nil
		}
		if time.Now().After(deadline) {
			r.logf("bridge %s: snapshot holds %d cells (sum %d), the store %d (sum %d): %v", reg, n, s, cells, sum, err)
			return nil
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// close stops everything the run started and deletes its Redis keys.
func (r *run) close() {
	var wg sync.WaitGroup
	for _, p := range append(r.limiters, r.bridges...) {
		if p != nil {
			wg.Go(func() {
				if err := p.stop(20 * time.Second); err != nil {
					r.logf("%v", err)
				}
			})
		}
	}
	wg.Wait()
	for _, nc := range r.conns {
		nc.Close()
	}
	if r.sc != nil {
		r.sc.Shutdown()
	}
	if r.store != nil {
		r.store.Close()
	}
	if r.db != nil {
		r.db.Close()
	}
	if r.redis != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for _, p := range r.prefixes {
			if err := deleteKeys(ctx, r.redis, p); err != nil {
				r.logf("redis: deleting keys %s*: %v", p, err)
			}
		}
		cancel()
		r.redis.Close()
	}
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// deleteKeys deletes every key starting with prefix.
func deleteKeys(ctx context.Context, c *redis.Client, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return flush()
}

// eachRegion runs f for every region at once and joins the errors.
func eachRegion(f func(i int) error) error {
	errs := make([]error, len(Regions))
	var wg sync.WaitGroup
	for i := range Regions {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// waitReady polls p's /readyz until it answers 200.
func waitReady(ctx context.Context, p *process, timeout time.Duration) error {
	url := strings.TrimSuffix(p.metrics, "/metrics") + "/readyz"
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() {
			return fmt.Errorf("%s exited: %v", p.name, p.exitErr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v", p.name, timeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitMetricZero polls p until its metric name is 0.
func waitMetricZero(ctx context.Context, p *process, name string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		m, err := p.scrape(ctx)
		if err == nil && m.value(name) == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("%s: %s not 0 within %v (%v)", p.name, name, timeout, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// lockedWriter serialises writes from the processes' output copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
