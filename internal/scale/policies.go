package scale

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
)

// PoliciesConfig is one run of the policies scenario (RunPolicies): a fleet
// of workspaces' overrides and reset marks loaded into MySQL before the
// bridges start, then policy changes through the admin API at a steady
// rate. Zero fields take the defaults named.
type PoliciesConfig struct {
	// Workspaces and Overrides: Workspaces × Overrides override rows are
	// loaded (defaults 1000 and 1000), every TombstoneEvery-th of them a
	// tombstone, every fifth pattern a prefix ("p000005_*").
	Workspaces, Overrides int
	// Marks is how many reset marks are loaded per workspace (default 10).
	Marks int
	// Changes is how many policy changes a second go through the admin API
	// (default 100), spread over workspaces and regions: half sets, three
	// tenths deletes (a set where the override is a tombstone), a fifth
	// resets.
	Changes int
	// Duration is how long changes are sent (default 60s).
	Duration time.Duration
	// Samples is how many changed patterns are looked up in every region at
	// the end, and how many resets in the store (default 300).
	Samples int
	// GCWait bounds the wait for a process's next collection when its live
	// heap is read (default 150s: the runtime collects at least every two
	// minutes).
	GCWait time.Duration
	// RedisURL, BinDir, Log and ProcessLog are as in Config.
	RedisURL, BinDir string
	Log, ProcessLog  io.Writer
}

// The defaults of PoliciesConfig.
const (
	DefaultPolicyWorkspaces = 1000
	DefaultPolicyOverrides  = 1000
	DefaultPolicyMarks      = 10
	DefaultPolicyChanges    = 100
	// TombstoneEvery: every tenth loaded override is a tombstone.
	TombstoneEvery = 10
)

func (c *PoliciesConfig) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Workspaces, DefaultPolicyWorkspaces)
	def(&c.Overrides, DefaultPolicyOverrides)
	def(&c.Marks, DefaultPolicyMarks)
	def(&c.Changes, DefaultPolicyChanges)
	def(&c.Samples, 300)
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.GCWait == 0 {
		c.GCWait = 150 * time.Second
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
	if c.Workspaces < 0 || c.Overrides < 0 || c.Marks < 0 || c.Changes < 0 || c.Duration < 0 || c.Samples < 0 {
		return fmt.Errorf("scale: policies: sizes, rate and duration must be positive")
	}
	if c.Overrides > 10_000 {
		return fmt.Errorf("scale: policies: %d overrides a workspace: at most 10000 (policy.MaxOverridesPerWorkspace)", c.Overrides)
	}
	if c.Marks > c.Overrides {
		return fmt.Errorf("scale: policies: %d marks a workspace: at most one per override (%d)", c.Marks, c.Overrides)
	}
	return nil
}

// PoliciesResult is what one run of the policies scenario measured.
type PoliciesResult struct {
	Config PoliciesConfig
	// Loaded rows: overrides (Live of them live, the rest tombstones) and
	// marks, and how long inserting them took.
	Overrides, Live, Marks int
	Load                   time.Duration
	// Held is from starting the bridges to every bridge and limiter
	// holding every live override loaded.
	Held time.Duration
	// Settle is as in Result.
	Settle time.Duration
	// Window is the measured window: from just before the first change to
	// PolicyTail after the last one was answered, so that it holds every
	// read of every changed row. Sent is how long changes were sent.
	Window, Sent time.Duration
	// Changes answered: sets, deletes, resets; Failed got an error (or no
	// answer: whether they changed anything is unknown). Errors are the
	// first few errors.
	Sets, Deletes, Resets, Failed int64
	Errors                        []string
	// StoreRowsChanged is how many rows of sluice_overrides and
	// sluice_reset_marks the store shows changed in the window (changed_us
	// after its start): at most one per change, fewer if a row changed
	// twice.
	StoreRowsChanged int64
	// Server is the private MariaDB over the window.
	Server   ServerFigures
	Bridges  []PolicyBridgeFigures
	Limiters []PolicyLimiterFigures
	// Visible is the look-up at the end: Sampled patterns (each changed in
	// the window by a set or a delete) looked up in every region, Wrong
	// of the look-ups not answering the last change (the first few in
	// Mismatches); ResetsSampled resets looked up in the store, ResetsLost
	// of them holding a lower epoch than the reset answered.
	Sampled, Wrong            int
	Mismatches                []string
	ResetsSampled, ResetsLost int
	ExpectedLive              int64 // live overrides the driver expects at the end; -1: unknown (a change failed)
	Notes                     []string
}

// PolicyBridgeFigures are one bridge's.
type PolicyBridgeFigures struct {
	Region string
	// StartupLoad is from starting the process to its first (full) read
	// completing; FullRead the rows it had read when that was seen (the
	// full read, and the reloads that followed before the scrape).
	StartupLoad time.Duration
	FullRead    float64
	// RowsRead is what the bridge read from MySQL over the window, by its
	// own count (sluice_store_rows_loaded_total: rows its loads returned).
	RowsRead float64
	// CPU is cores used over the window.
	CPU float64
	// HeapStart and HeapEnd are the live heap (bytes) in the quiet before
	// the changes and after them (r.quietHeaps).
	HeapStart, HeapEnd float64
	// Overrides is sluice_bridge_policy_overrides at the end.
	Overrides float64
	// Snapshots is how many policy snapshots the region's limiters asked
	// this bridge for over the window; SnapshotChunks and SnapshotBytes
	// what it answered (a chunk holds up to 1000 entries; one empty chunk
	// when the digests agree).
	Snapshots, SnapshotChunks, SnapshotBytes int64
}

// PolicyLimiterFigures are one limiter's.
type PolicyLimiterFigures struct {
	Region             string
	CPU                float64
	HeapStart, HeapEnd float64
	// Overrides is sluice_policy_overrides at the end.
	Overrides float64
}

// PolicyTail is how long after the last change the window goes on: a
// change is written by its bridge within a StoreInterval (100 ms) and by
// the others a BatchInterval later, and a row is read by the reloads (every
// ReloadInterval, 1 s) until ChangeLag (1 s) after the next read: 3.1 s at
// most, and 0.4 s to spare.
const PolicyTail = 3500 * time.Millisecond

// policyNamespace is the namespace of every override of the scenario.
const policyNamespace = "api"

// RunPolicies runs the policies scenario once. An error means it could
// not run (a service missing, a process failing to start); targets missed
// are in the result.
func RunPolicies(ctx context.Context, cfg PoliciesConfig) (*PoliciesResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &run{
		cfg: Config{RedisURL: cfg.RedisURL, BinDir: cfg.BinDir, Log: cfg.Log, ProcessLog: cfg.ProcessLog},
		res: &Result{}, plog: &lockedWriter{w: cfg.ProcessLog},
		// The live heap is read from the runtime's own report of each
		// collection (gcTrace).
		env: []string{"GODEBUG=gctrace=1"},
		// A bridge serves once it has loaded every override.
		startWait: 10 * time.Minute,
	}
	defer r.close()
	res := &PoliciesResult{Config: cfg, ExpectedLive: -1}
	if err := r.policies(ctx, cfg, res); err != nil {
		return nil, err
	}
	res.Notes = r.noted()
	return res, nil
}

// policies is RunPolicies' run.
func (r *run) policies(ctx context.Context, cfg PoliciesConfig, res *PoliciesResult) error {
	if err := r.startServices(ctx); err != nil {
		return err
	}
	set := newPolicySet(cfg)
	r.logf("loading %d overrides (%d workspaces × %d) and %d reset marks into MySQL",
		cfg.Workspaces*cfg.Overrides, cfg.Workspaces, cfg.Overrides, cfg.Workspaces*cfg.Marks)
	start := time.Now()
	if err := set.load(ctx, r.store, time.Now().UnixMilli()); err != nil {
		return err
	}
	res.Load = time.Since(start)
	res.Overrides, res.Live, res.Marks = set.total, set.loadedLive(), cfg.Workspaces*cfg.Marks
	r.logf("loaded in %v", res.Load.Round(time.Millisecond))

	// Bridges first: a limiter takes its bridge's policies as it starts.
	start = time.Now()
	res.Bridges = make([]PolicyBridgeFigures, len(Regions))
	r.bridges = make([]*process, len(Regions))
	if err := eachRegion(func(i int) error {
		p, took, err := r.startBridge(ctx, i)
		r.bridges[i] = p
		res.Bridges[i] = PolicyBridgeFigures{Region: Regions[i], StartupLoad: took}
		if err == nil {
			res.Bridges[i].FullRead = r.metric(ctx, p, "sluice_store_rows_loaded_total")
		}
		return err
	}); err != nil {
		return err
	}
	if err := r.startLimiters(ctx); err != nil {
		return err
	}
	if err := r.waitPolicies(ctx, float64(res.Live), 10*time.Minute); err != nil {
		return err
	}
	res.Held = time.Since(start)
	r.logf("every bridge and limiter holds the %d live overrides, %v after the bridges' start", res.Live, res.Held.Round(time.Millisecond))
	if err := r.settle(ctx); err != nil {
		return err
	}
	res.Settle = r.res.Settle

	heapStart := r.quietHeaps(ctx, set.total <= pokeBelow, cfg.GCWait)

	clients := make([]*bus.Client, len(r.conns))
	for i, nc := range r.conns {
		clients[i] = bus.NewClient(nc, bus.WithTimeout(adminTimeout))
	}
	watch, err := watchSnapshots(r.conns)
	if err != nil {
		return err
	}
	defer watch.close()
	var since int64
	if err := r.store.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").Scan(&since); err != nil {
		return fmt.Errorf("read the server's clock: %w", err)
	}
	c0, err := r.read(ctx, nil)
	if err != nil {
		return err
	}
	s0 := watch.read()
	r.logf("sending %d policy changes a second for %v", cfg.Changes, cfg.Duration)
	dctx, stop := context.WithTimeout(ctx, cfg.Duration)
	set.drive(dctx, clients, cfg.Changes)
	stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	res.Sent = time.Since(c0.at)
	r.logf("changes stopped; the window ends %v later", PolicyTail)
	if err := sleep(ctx, PolicyTail); err != nil {
		return err
	}
	c1, err := r.read(ctx, nil)
	if err != nil {
		return err
	}
	s1 := watch.read()

	res.Window = c1.at.Sub(c0.at)
	sec := res.Window.Seconds()
	res.Sets, res.Deletes, res.Resets, res.Failed = set.sets.Load(), set.deletes.Load(), set.resets.Load(), set.failed.Load()
	res.Errors = set.errors()
	res.Server = serverFigures(c0, c1)
	for i := range r.bridges {
		b := &res.Bridges[i]
		b.CPU = (c1.bridgeCPU[i] - c0.bridgeCPU[i]) / sec
		b.RowsRead = c1.rowsLoaded[i] - c0.rowsLoaded[i]
		if !c0.rowsLoadedOK || !c1.rowsLoadedOK {
			b.RowsRead = -1
		}
		b.Snapshots = s1.requests[i] - s0.requests[i]
		b.SnapshotChunks = s1.chunks[i] - s0.chunks[i]
		b.SnapshotBytes = s1.bytes[i] - s0.bytes[i]
	}
	res.Limiters = make([]PolicyLimiterFigures, len(Regions))
	for i := range r.limiters {
		res.Limiters[i] = PolicyLimiterFigures{Region: Regions[i], CPU: (c1.limiterCPU[i] - c0.limiterCPU[i]) / sec,
			HeapStart: heapStart[i]}
		res.Bridges[i].HeapStart = heapStart[len(r.limiters)+i]
	}

	res.StoreRowsChanged, err = storeRowsChanged(ctx, r.store, since)
	if err != nil {
		return err
	}
	if res.Failed == 0 {
		res.ExpectedLive = set.live()
	}
	_ = eachRegion(func(i int) error {
		res.Limiters[i].Overrides = r.metric(ctx, r.limiters[i], "sluice_policy_overrides")
		res.Bridges[i].Overrides = r.metric(ctx, r.bridges[i], "sluice_bridge_policy_overrides")
		return nil
	})
	r.logf("looking up %d changed patterns in every region", min(cfg.Samples, len(set.changed)))
	res.Sampled, res.Wrong, res.Mismatches = set.lookUp(ctx, clients, cfg.Samples)
	res.ResetsSampled, res.ResetsLost, err = set.resetsStored(ctx, r.store, cfg.Samples)
	if err != nil {
		return err
	}
	heapEnd := r.quietHeaps(ctx, set.total <= pokeBelow, cfg.GCWait)
	for i := range r.limiters {
		res.Limiters[i].HeapEnd = heapEnd[i]
		res.Bridges[i].HeapEnd = heapEnd[len(r.limiters)+i]
	}
	return nil
}

// adminTimeout bounds one admin request of the scenario: its barrier (at
// most a second) and the bridge's acknowledgement (at most a second).
const adminTimeout = 5 * time.Second

// waitPolicies waits until every bridge and limiter holds live overrides,
// polling each once a second: a scrape of the policy gauges costs in
// proportion to the overrides held.
func (r *run) waitPolicies(ctx context.Context, live float64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		held := true
		var last string
		for _, p := range append(append([]*process{}, r.bridges...), r.limiters...) {
			name := "sluice_policy_overrides"
			if strings.HasPrefix(p.name, "bridge") {
				name = "sluice_bridge_policy_overrides"
			}
			m, err := p.scrape(ctx)
			if err != nil || m.value(name) != live {
				held = false
				last = fmt.Sprintf("%s holds %v of %v (%v)", p.name, m.value(name), live, err)
				break
			}
		}
		if held {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every process holds the loaded overrides within %v: %s", timeout, last)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// quietHeaps returns the live heap of every limiter, then every bridge
// (NaN, and a note, for one that did not collect within wait), read while
// nothing changes: what the runtime reports its next collections marked
// live (the least of heapCollections of them). What a collection marks
// includes what was allocated while it ran, so one that ran while a bridge
// built a snapshot for a limiter (a copy of the whole table, at every
// change of digest) counts the snapshot: reading the heaps while policies
// change measures the snapshots, not what is kept.
//
// An idle process may not collect for two minutes. With poke, each is
// scraped every heapPoke meanwhile, which brings the collection sooner;
// but the policy gauges copy and sort the whole table at each scrape, and
// the collection a scrape brings runs while the copy is made and counts it
// (tens of MiB at 100,000 overrides), so only small tables are poked (at
// most pokeBelow overrides; there the copy is below the reports' 1 MiB
// resolution), and large ones wait for the runtime's own collection.
func (r *run) quietHeaps(ctx context.Context, poke bool, wait time.Duration) []float64 {
	ps := r.processes()
	out := make([]float64, len(ps))
	since := time.Now()
	n := 1
	if poke {
		n = heapCollections
	}
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			pctx, stop := context.WithCancel(ctx)
			poked := make(chan struct{})
			go func() {
				defer close(poked)
				for poke && sleep(pctx, heapPoke) == nil {
					_, _ = p.scrape(pctx)
				}
			}()
			err := p.collections(ctx, since, n, wait)
			stop()
			<-poked
			if err != nil {
				r.note("%s: live heap unknown: %v", p.name, err)
			}
			out[i], _ = p.gcs.least(since, time.Now())
		})
	}
	wg.Wait()
	return out
}

// processes returns every limiter, then every bridge.
func (r *run) processes() []*process {
	return append(append([]*process{}, r.limiters...), r.bridges...)
}

// quietHeaps' constants: how often it scrapes a process while it waits for
// heapCollections collections, and up to how many overrides it does.
const (
	heapPoke        = 250 * time.Millisecond
	heapCollections = 3
	pokeBelow       = 50_000
)

// snapshotWatch counts, per region, the policy snapshots the limiters ask
// their bridge for (every PolicySyncInterval, and when a barrier waited too
// long for a broadcast) and what the bridge answers: one empty chunk when
// the digests agree, every entry (in chunks of up to 1000) when they
// differ, which a change in flight is enough for.
type snapshotWatch struct {
	mu        sync.Mutex
	inbox     map[string]int        // reply subject → region
	unmatched []map[string][2]int64 // per region: replies read before their request
	requests  []int64
	chunks    []int64
	bytes     []int64
	subs      []*nats.Subscription
}

// snapshotCounts is one reading of a snapshotWatch, per region.
type snapshotCounts struct{ requests, chunks, bytes []int64 }

// watchSnapshots subscribes, in each region, to the snapshot requests and to
// the replies to every inbox.
func watchSnapshots(conns []*nats.Conn) (*snapshotWatch, error) {
	n := len(conns)
	w := &snapshotWatch{inbox: map[string]int{}, unmatched: make([]map[string][2]int64, n),
		requests: make([]int64, n), chunks: make([]int64, n), bytes: make([]int64, n)}
	for r, nc := range conns {
		w.unmatched[r] = map[string][2]int64{}
		req, err := nc.Subscribe(wire.Subjects{}.Internal("policy.snapshot", Regions[r]), func(m *nats.Msg) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.requests[r]++
			w.inbox[m.Reply] = r
			// A reply read before its request.
			if u, ok := w.unmatched[r][m.Reply]; ok {
				w.chunks[r] += u[0]
				w.bytes[r] += u[1]
				delete(w.unmatched[r], m.Reply)
			}
		})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("watch policy snapshots: %w", err)
		}
		w.subs = append(w.subs, req)
		// Gateways carry every region's replies to each of these
		// subscriptions: each counts only its own region's.
		rep, err := nc.Subscribe("_INBOX.>", func(m *nats.Msg) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if to, ok := w.inbox[m.Subject]; ok {
				if to == r {
					w.chunks[r]++
					w.bytes[r] += int64(len(m.Data))
				}
				return
			}
			u := w.unmatched[r][m.Subject]
			w.unmatched[r][m.Subject] = [2]int64{u[0] + 1, u[1] + int64(len(m.Data))}
		})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("watch policy snapshots: %w", err)
		}
		w.subs = append(w.subs, rep)
		for _, s := range []*nats.Subscription{req, rep} {
			if err := s.SetPendingLimits(-1, -1); err != nil {
				w.close()
				return nil, fmt.Errorf("watch policy snapshots: %w", err)
			}
		}
		if err := nc.Flush(); err != nil {
			w.close()
			return nil, fmt.Errorf("watch policy snapshots: %w", err)
		}
	}
	return w, nil
}

func (w *snapshotWatch) read() snapshotCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return snapshotCounts{slices.Clone(w.requests), slices.Clone(w.chunks), slices.Clone(w.bytes)}
}

func (w *snapshotWatch) close() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
}
