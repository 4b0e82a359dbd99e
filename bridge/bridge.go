// Package bridge is a region's bridge (docs/architecture.md, "Global
// convergence"): Bridge, which carries its region's components,
// overrides and reset marks to the other regions and into the durable store
// and tells its region's limiters, per cell, the sum of the other regions'
// components; the G-Counter of every region's components it keeps
// (Counter); the sweep of its region's counts; and the Store interface with
// an in-memory Store (the MySQL one, which makes them durable, is in
// bridge/mysql, linked only by the bridge's command). It builds on package
// global's entries and checks, never the reverse, and the limiter (package
// service) does not import it.
//
// Components merge by max, so applying one twice, late or out of order
// changes nothing, and a region's own component never comes back to it as
// foreign usage; what arrives from limiters, other regions' bridges and the
// store is checked at the bridge's clock before it touches any state; and
// nothing on the NATS path waits for the store.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Transport is how a bridge talks over NATS; package bus/link implements
// it (link.Bridge).
type Transport interface {
	// Forward sends this region's components to the other regions; with
	// none, it sends an empty message (a heartbeat).
	Forward(ctx context.Context, cs []global.Component) error
	// Broadcast sends imports to this region's limiters.
	Broadcast(ctx context.Context, is []global.Import) error
	// ForwardPolicies sends the override entries and reset marks this
	// region accepted to the other regions.
	ForwardPolicies(ctx context.Context, es []policy.Entry, ms []policy.Mark) error
	// BroadcastPolicies sends override entries and reset marks to this
	// region's limiters; seq is the bridge's policy sequence once they are merged
	// (Bridge.PolicySeq): a limiter that applied them has every change up
	// to it.
	BroadcastPolicies(ctx context.Context, es []policy.Entry, ms []policy.Mark, seq uint64) error
}

// BridgeConfig configures a Bridge; zero durations take the defaults.
type BridgeConfig struct {
	// Region is the bridge's region. Required.
	Region string
	// Regions lists the deployment's regions (this one may be among them).
	// The bridge reports a lag for each other one from its start, whether
	// or not that region's bridge ever sends, so a region that stays silent
	// shows a growing lag. Regions heard from over NATS or found in the
	// store's rows are added to it. Each must be a valid subject token.
	Regions []string
	// Store is the durable store. Required (NewMemoryStore for none).
	Store Store
	// Transport carries components and imports. Required.
	Transport Transport
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives state changes; nil discards them.
	Logger *slog.Logger
	// BatchInterval is how often components are forwarded and
	// imports broadcast. Default 10ms.
	BatchInterval time.Duration
	// HeartbeatInterval is the longest a bridge stays silent towards the
	// other regions: with nothing to forward for that long it forwards an
	// empty message, so their lag for this region (RegionLags) measures the
	// link, not the traffic. Default 1s.
	HeartbeatInterval time.Duration
	// StoreInterval is how often this region's components are written to the
	// store. Default 100ms.
	StoreInterval time.Duration
	// ReloadInterval is how often the store is read for what changed since
	// the last read, so regions converge through it while gateways are
	// down. The first read, at Start, loads every live row. Default 1s.
	ReloadInterval time.Duration
	// CleanupInterval is how often expired rows and cells are deleted.
	// Default 1m.
	CleanupInterval time.Duration
	// MaxClockSkew is how far another host's clock may be from this
	// bridge's: messages stamped further away, and entries for windows that
	// start later than the bridge's clock plus it, are refused and counted.
	// Default global.DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// StoreTimeout bounds one store call. Default 5s.
	StoreTimeout time.Duration
	// FullLoadTimeout bounds the bridge's first read of the store, until
	// one succeeds: every live row, which at a million overrides takes
	// longer than StoreTimeout. Start still waits no longer than
	// StoreTimeout; the reload loop then gives the read this long.
	// Default 2m.
	FullLoadTimeout time.Duration
	// ObserveStoreWrite, if set, receives each store write's duration, rows
	// and error.
	ObserveStoreWrite func(d time.Duration, rows int, err error)
	// ObserveBatch, if set, receives each batch's forwarded entries and
	// broadcast imports.
	ObserveBatch func(forwarded, imports int)
	// Sweep, if set, reads the region's own count of every live cell from
	// the region's Redis. The bridge sweeps when it starts, when the store
	// answers again after failures, every SweepInterval and once more at
	// Close, merging the counts as its region's components: so the store
	// converges to what Redis holds whatever stopped, and Close need not
	// wait for a store that fails (docs/architecture.md, "Durable store").
	Sweep SweepFunc
	// SweepInterval is how often the bridge sweeps when nothing else asks
	// it to. Default DefaultSweepInterval.
	SweepInterval time.Duration
}

// BridgeStats counts what a bridge did since it started.
type BridgeStats struct {
	Cells               int   `json:"cells"`
	ComponentsIn        int64 `json:"components_in"`
	ComponentsForwarded int64 `json:"components_forwarded"`
	ComponentsFromPeers int64 `json:"components_from_regions"`
	ImportsBroadcast    int64 `json:"imports_broadcast"`
	StoreWrites         int64 `json:"store_writes"`
	StoreWriteErrors    int64 `json:"store_write_errors"`
	StoreLoads          int64 `json:"store_loads"`
	StoreFullLoads      int64 `json:"store_full_loads"`
	StoreRowsLoaded     int64 `json:"store_rows_loaded"`
	StoreLoadErrors     int64 `json:"store_load_errors"`
	StorePending        int   `json:"store_pending"`
	ForwardErrors       int64 `json:"forward_errors"`
	Sweeps              int64 `json:"sweeps"`
	SweepErrors         int64 `json:"sweep_errors"`
	SweepCells          int64 `json:"sweep_cells"`
	SweepRaised         int64 `json:"sweep_raised"`
	SweepLastMs         int64 `json:"sweep_last_ms"`
}

// Bridge carries one region's components to the other regions
// and into the durable store, keeps every region's components, and tells its
// region's limiters, per cell, the sum of foreign components.
//
// Nothing on the NATS path waits for the store: writes are queued (merged
// by max, so the queue is bounded by live cells) and retried; loads run on
// their own schedule.
type Bridge struct {
	cfg     BridgeConfig
	log     *slog.Logger
	counter *Counter
	pol     bridgePolicies

	// comps is what the store lacks of this region's components.
	comps *storeQueue[storeKey, global.Component]

	stats struct {
		in, forwarded, fromPeers, broadcast         atomic.Int64
		writes, writeErrs, loads, loadErrs, fwdErrs atomic.Int64
		fullLoads, rowsLoaded                       atomic.Int64
		sweeps, sweepErrs, sweepCells, sweepRaised  atomic.Int64
		sweepLastMs                                 atomic.Int64
	}

	health   storeHealth
	sweepNow chan struct{} // asks the sweep loop for a sweep
	cancel   context.CancelFunc
	// cancelReads ends the reload loop's read under way (Close).
	cancelReads context.CancelFunc

	// reloadMu serializes reads of the store; mark is where the next one
	// starts (zero: read every live row).
	reloadMu sync.Mutex
	mark     Mark

	refused *global.Refusals

	seenMu   sync.Mutex
	started  time.Time            // the bridge's clock when it was made
	lastSeen map[string]time.Time // region → last message from its bridge
	expected map[string]bool      // other regions: configured, heard from, or in the store
	offsets  map[string]int64     // region → its last message's stamp minus the local clock (ms)
	named    map[string]bool      // unexpected regions whose refusals carry their name (≤ maxNamedRefusals)

	// lastForward is when the batch loop last forwarded (or sent a
	// heartbeat); batch loop only.
	lastForward time.Time

	stop    chan struct{}
	stopped sync.Once
	loops   sync.WaitGroup
}

// NewBridge returns a bridge; Start begins its work.
func NewBridge(cfg BridgeConfig) (*Bridge, error) {
	if cfg.Region == "" || cfg.Store == nil || cfg.Transport == nil {
		return nil, errors.New("global: BridgeConfig needs Region, Store and Transport")
	}
	expected := make(map[string]bool, len(cfg.Regions))
	for _, r := range cfg.Regions {
		if !window.ValidToken(r) {
			return nil, fmt.Errorf("global: BridgeConfig.Regions: region %q: want %s", r, window.TokenRule)
		}
		if r != cfg.Region {
			expected[r] = true
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.BatchInterval, 10*time.Millisecond)
	def(&cfg.HeartbeatInterval, time.Second)
	def(&cfg.StoreInterval, 100*time.Millisecond)
	def(&cfg.ReloadInterval, time.Second)
	def(&cfg.CleanupInterval, time.Minute)
	def(&cfg.StoreTimeout, 5*time.Second)
	def(&cfg.FullLoadTimeout, 2*time.Minute)
	def(&cfg.MaxClockSkew, global.DefaultMaxClockSkew)
	def(&cfg.SweepInterval, DefaultSweepInterval)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Bridge{
		cfg:         cfg,
		log:         log,
		counter:     NewCounter(cfg.Region),
		pol:         newBridgePolicies(cfg.Store),
		comps:       newStoreQueue(componentRows, cfg.Store.UpsertComponents, componentRows.live),
		started:     cfg.Now(),
		lastSeen:    make(map[string]time.Time),
		expected:    expected,
		offsets:     make(map[string]int64),
		named:       make(map[string]bool),
		refused:     global.NewRefusals(log, 10*time.Second),
		stop:        make(chan struct{}),
		sweepNow:    make(chan struct{}, 1),
		cancel:      func() {},
		cancelReads: func() {},
	}, nil
}

func (b *Bridge) now() int64 { return b.cfg.Now().UnixMilli() }

// Now returns the bridge's clock, which its transport stamps messages with.
func (b *Bridge) Now() time.Time { return b.cfg.Now() }

// Refused returns how many entries the bridge refused, by source, region
// and reason.
func (b *Bridge) Refused() map[global.Refusal]int64 { return b.refused.Counts() }

// Start loads every region's live components from the store (a failure is
// logged, not fatal: the bridge converges over NATS and loads again later)
// and starts the bridge's loops. It waits on the store no longer than
// StoreTimeout.
func (b *Bridge) Start(ctx context.Context) {
	lctx, lcancel := context.WithTimeout(ctx, b.cfg.StoreTimeout)
	err := b.reload(lctx)
	lcancel()
	if errors.Is(err, ErrStoreUnavailable) {
		// The store logs why, once; the reload loop loads when it is ready.
		b.log.Info("global store not ready at start; loading every region's components once it is")
	} else if err != nil {
		b.log.Warn("global store not loaded at start; retrying on schedule", "error", err)
	}
	b.loops.Add(4)
	if b.cfg.Sweep != nil {
		// The sweep's calls end when Close begins, not when ctx does: ctx
		// is the caller's run, which ends before Close.
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		b.cancel = cancel
		b.loops.Add(1)
		go b.sweepLoop(sctx)
	}
	go b.every(b.cfg.BatchInterval, b.batch)
	go b.every(b.cfg.StoreInterval, func() {
		_ = b.writeStore(context.Background())
		if err := b.writePolicies(context.Background()); err != nil {
			b.log.Debug("writing overrides failed; retrying", "error", err)
		}
	})
	// A read ends when Close begins: a full read may take FullLoadTimeout.
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	b.cancelReads = rcancel
	go b.every(b.cfg.ReloadInterval, func() {
		if err := b.reload(rctx); err != nil {
			b.log.Debug("global store reload failed", "error", err)
		}
		// Expired marks go within a reload, not a cleanup: the limiters
		// prune theirs before each digest exchange, and a mark only one
		// side still holds makes its part of the digests differ (a
		// snapshot of that part at every exchange until both forgot it).
		b.pruneMarks(b.now())
	})
	go b.every(b.cfg.CleanupInterval, b.cleanup)
}

// every runs f every d until Close. A tick that comes with Close does not
// run f: Close waits for the f under way, not for more.
func (b *Bridge) every(d time.Duration, f func()) {
	defer b.loops.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			select {
			case <-b.stop:
				return
			default:
				f()
			}
		}
	}
}

// FromLimiters takes this region's components from its limiters, sent at sentAt by the sender's clock (unix ms, 0: unknown). A
// message stamped beyond the clock-skew tolerance is refused whole; so is
// each entry that fails its Check at the bridge's clock or names another
// region (limiters never publish imports). Refusals are counted and logged.
func (b *Bridge) FromLimiters(cs []global.Component, sentAt int64) {
	now := b.now()
	from := global.Refusal{Source: "limiters", Region: b.cfg.Region}
	if b.stamped(from, sentAt, now, len(cs)) == nil {
		b.mergeCounts(from, b.cfg.Region, now, cs, &b.stats.in)
	}
}

// mergeCounts merges the components of a message from `from` (whose stamp
// passed), each of which must be region want's, counting them in n.
func (b *Bridge) mergeCounts(from global.Refusal, want string, now int64, cs []global.Component, n *atomic.Int64) {
	takeCounts(b, from, want, now, cs, func(c global.Component) {
		n.Add(1)
		b.counter.Merge(c)
	})
}

// maxNamedRefusals is how many regions the bridge does not expect may have
// their refused messages counted under their own name; the rest are counted
// as region "unknown", so names cannot grow the refusal series without
// bound.
const maxNamedRefusals = 16

// FromRegions takes the components the bridge of region
// forwarded, sent at sentAt by its clock (unix ms, 0: unknown), by the rules
// of FromLimiters: every entry must be region's own. This region's own
// forwards, which come back on the same subjects, are ignored: it is their
// source.
func (b *Bridge) FromRegions(region string, cs []global.Component, sentAt int64) {
	if region == b.cfg.Region {
		return
	}
	now := b.now()
	if !window.ValidToken(region) {
		// Refused before anything about it is kept: a name that is no
		// region must not become a lag or clock-offset series.
		b.refuse(global.Refusal{Source: "regions", Region: "invalid"}, len(cs),
			fmt.Errorf("%w: region %q is not a valid token", global.ErrInvalid, region))
		return
	}
	from := global.Refusal{Source: "regions", Region: region}
	err := global.CheckSentAt(sentAt, now, b.cfg.MaxClockSkew)
	b.seenMu.Lock()
	known := b.expected[region]
	if err == nil {
		b.lastSeen[region] = b.cfg.Now()
		b.expected[region] = true
	}
	if err != nil && !known {
		// Named so an operator sees which region's clock is off, up to
		// maxNamedRefusals names; hostile names beyond that share one.
		if !b.named[region] && len(b.named) >= maxNamedRefusals {
			from.Region = "unknown"
		} else {
			b.named[region] = true
		}
	}
	if sentAt != 0 && from.Region == region {
		// A skewed clock is what the offset is for; a name beyond the
		// bound adds no series.
		b.offsets[region] = sentAt - now
	}
	b.seenMu.Unlock()
	if err != nil {
		b.refuse(from, len(cs), err)
		return
	}
	b.mergeCounts(from, region, now, cs, &b.stats.fromPeers)
}

// check adds to err (an entry's Check) that the entry names the region
// that must have sent it.
func (b *Bridge) check(got, want string, err error) error {
	if got != want {
		err = errors.Join(err, fmt.Errorf("%w: an entry of region %q from %q", global.ErrInvalid, got, want))
	}
	return err
}

func (b *Bridge) refuse(r global.Refusal, n int, err error) {
	r.Reason = global.Reason(err)
	b.refused.Add(r, n, err)
}

// ClockOffsets returns, per other region, how far ahead of this bridge's
// clock its last message was stamped (negative: behind, or delayed).
func (b *Bridge) ClockOffsets() map[string]time.Duration {
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	out := make(map[string]time.Duration, len(b.offsets))
	for r, ms := range b.offsets {
		out[r] = time.Duration(ms) * time.Millisecond
	}
	return out
}

// RegionLags returns, for every other region the bridge expects (those of
// BridgeConfig.Regions, those it heard from over NATS and those whose rows
// it loaded from the store), how long ago by the bridge's clock that
// region's bridge last sent to it, or how long ago this bridge started if
// it never did: how stale this region's view of each other region may be.
// The bridge's own region is never among them.
func (b *Bridge) RegionLags() map[string]time.Duration {
	now := b.cfg.Now()
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	out := make(map[string]time.Duration, len(b.expected))
	for r := range b.expected {
		since, ok := b.lastSeen[r]
		if !ok {
			since = b.started
		}
		out[r] = now.Sub(since)
	}
	return out
}

// expect adds regions other than the bridge's own to those it reports a
// lag for.
func (b *Bridge) expect(regions map[string]bool) {
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	for r := range regions {
		if r != b.cfg.Region {
			b.expected[r] = true
		}
	}
}

// Snapshot returns every live cell's import: the answer to a starting
// limiter.
func (b *Bridge) Snapshot() []global.Import { return b.counter.Snapshot() }

// batch forwards this region's changes and broadcasts changed imports.
func (b *Bridge) batch() {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.StoreTimeout)
	defer cancel()
	cs := b.counter.TakeOwn()
	now := b.cfg.Now()
	if len(cs) > 0 || now.Sub(b.lastForward) >= b.cfg.HeartbeatInterval || now.Before(b.lastForward) {
		// With no components, what goes is a heartbeat.
		b.lastForward = now
		if err := b.cfg.Transport.Forward(ctx, cs); err != nil {
			b.stats.fwdErrs.Add(1)
			b.log.Debug("forward to other regions failed; the store carries what it held", "error", err, "components", len(cs))
		} else {
			b.stats.forwarded.Add(int64(len(cs)))
		}
		b.comps.put(cs...)
	}
	is := b.counter.TakeImports()
	if len(is) > 0 {
		if err := b.cfg.Transport.Broadcast(ctx, is); err != nil {
			b.log.Debug("broadcast to limiters failed", "error", err)
		} else {
			b.stats.broadcast.Add(int64(len(is)))
		}
	}
	b.batchPolicies(ctx)
	if b.cfg.ObserveBatch != nil && len(cs)+len(is) > 0 {
		b.cfg.ObserveBatch(len(cs), len(is))
	}
}

// writeStore writes the queued components within one StoreTimeout; what fails stays queued (unless it expired meanwhile)
// and is retried next time.
func (b *Bridge) writeStore(ctx context.Context) error {
	start := time.Now()
	n, err := flush(ctx, b, b.comps, "store write")
	if n == 0 {
		return nil
	}
	if b.cfg.ObserveStoreWrite != nil {
		b.cfg.ObserveStoreWrite(time.Since(start), n, err)
	}
	if errors.Is(err, ErrInvalidRow) {
		// Retrying cannot help; limiters and decoders validate, so this is a bug.
		b.stats.writeErrs.Add(1)
		b.log.Error("store refused a batch as invalid; dropped", "components", n, "error", err)
		return err
	}
	// While the store fails for long (down, or not yet created), expired
	// entries leave the queue (settle): it stays bounded by live cells.
	b.noteStore(true, err)
	if err != nil {
		b.stats.writeErrs.Add(1)
		return err
	}
	b.stats.writes.Add(int64(n))
	return nil
}

// reload merges every region's components, the override
// entries and the reset marks that changed in the store since the last
// reload (every live one the first time, or when the store cannot tell). The mark advances only when a read succeeds, so a
// read after a failure covers the gap. Rows are input too: a row that fails
// its Check at the bridge's clock (a bridge whose clock ran ahead wrote it,
// or the table was edited) is refused and counted.
func (b *Bridge) reload(ctx context.Context) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	budget := b.cfg.StoreTimeout
	if b.mark == 0 {
		budget = b.cfg.FullLoadTimeout // every live row
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	now := b.now()
	ch, err := b.cfg.Store.LoadChanged(ctx, now, b.mark)
	b.noteStore(false, err)
	if err != nil {
		b.stats.loadErrs.Add(1)
		return fmt.Errorf("store load: %w", err)
	}
	// Each row is refused under its own region.
	regions := make(map[string]bool)
	cs := ch.Components[:0]
	takeCounts(b, global.Refusal{Source: "store"}, "", now, ch.Components, func(c global.Component) {
		regions[c.Region] = true
		cs = append(cs, c)
	})
	b.counter.MergeStored(cs)
	b.expect(regions)
	// Rows are input too; every origin may be there.
	_ = b.mergePolicies(global.Refusal{Source: "store", Region: "store"}, "", ch.Overrides, ch.Marks, 0)
	b.mark = ch.Next
	b.stats.loads.Add(1)
	b.stats.rowsLoaded.Add(int64(len(ch.Components) + len(ch.Overrides) + len(ch.Marks)))
	if ch.Full {
		b.stats.fullLoads.Add(1)
	}
	return nil
}

func (b *Bridge) cleanup() {
	now := b.now()
	b.counter.Expire(now)
	b.pol.table.Prune(policy.TombstoneCutoff(now))
	b.pruneMarks(now)
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.StoreTimeout)
	defer cancel()
	if n, err := b.cfg.Store.DeleteExpired(ctx, now, 1000); err != nil {
		b.log.Debug("deleting expired rows failed", "error", err)
	} else if n > 0 {
		b.log.Debug("deleted expired rows", "rows", n)
	}
}

// Stats returns the bridge's counters.
func (b *Bridge) Stats() BridgeStats {
	pending, _ := b.Backlog()
	return BridgeStats{
		Cells:               b.counter.Len(),
		ComponentsIn:        b.stats.in.Load(),
		ComponentsForwarded: b.stats.forwarded.Load(),
		ComponentsFromPeers: b.stats.fromPeers.Load(),
		ImportsBroadcast:    b.stats.broadcast.Load(),
		StoreWrites:         b.stats.writes.Load(),
		StoreWriteErrors:    b.stats.writeErrs.Load(),
		StoreLoads:          b.stats.loads.Load(),
		StoreFullLoads:      b.stats.fullLoads.Load(),
		StoreRowsLoaded:     b.stats.rowsLoaded.Load(),
		StoreLoadErrors:     b.stats.loadErrs.Load(),
		StorePending:        pending,
		ForwardErrors:       b.stats.fwdErrs.Load(),
		Sweeps:              b.stats.sweeps.Load(),
		SweepErrors:         b.stats.sweepErrs.Load(),
		SweepCells:          b.stats.sweepCells.Load(),
		SweepRaised:         b.stats.sweepRaised.Load(),
		SweepLastMs:         b.stats.sweepLastMs.Load(),
	}
}

// Close stops the loops, forwards what is left and writes everything queued
// to the store, retrying until ctx ends. With a Sweep, nothing queued can be
// lost, so Close does not wait for a store that fails: it sweeps and writes
// once while the store answers, logs what the store still lacks with its
// count, and returns nil (closeRecoverable). Either way, when the store
// failed last, Close tries once more over fresh connections (a store that
// is a Reconnecter drops its pooled ones and reconnects, past an open
// breaker) before it gives up on what it holds: that try takes at most 2s
// (closeRetryMax) and at most half of what ctx leaves.
func (b *Bridge) Close(ctx context.Context) error {
	b.stopped.Do(func() {
		close(b.stop)
		b.cancel()
		b.cancelReads()
	})
	b.loops.Wait()
	if b.cfg.Sweep != nil {
		return b.closeRecoverable(ctx)
	}
	b.batch()
	// Overrides and marks the store lacks are not lost: the region's
	// limiters hold every one they accepted and give them to the region's
	// next bridge (their digest differs from its, and they send what they
	// hold).
	last := b.writeOrRetry(ctx, b.writePolicies)
	b.logPoliciesNotDurable(last.err, last)
	for err := b.writeOrRetry(ctx, b.writeStore).err; err != nil; err = b.writeStore(ctx) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bridge close: %w", errors.Join(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
