package link

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// Overrides between limiters and bridges (docs/architecture.md, "Carrying
// and storing policies"):
//
//	<p>.policy.<region>           limiter → its bridge (queue bridge-<region>), a request: acknowledged once merged
//	<p>.global.policy.<region>    bridge → every other region's bridges
//	<p>.policy.import.<region>    bridge → every limiter of its region
//	<p>.policy.snapshot.<region>  limiter → its bridge (micro endpoint "policies"): every entry, unless the digests agree
//	<p>.policy.seq.<region>       limiter → its bridge (micro endpoint "policy-seq"): the bridge's policy sequence
//
// Every body is an event.Policies, stamped Sluice-Sent-At. Reset marks travel
// with the overrides (the event's "r" list) and the digest compared is the
// override table's XOR the marks'.

// DefaultPolicySyncInterval is how often a limiter compares its overrides
// with its bridge's by digest, and sends again what its bridge has not
// acknowledged.
const DefaultPolicySyncInterval = 10 * time.Second

// policyAckTimeout bounds the wait for a bridge's acknowledgement.
const policyAckTimeout = time.Second

// Bounds of Policy.Barrier: the whole of it, and the wait for the
// bridge's broadcast before it takes a snapshot instead.
const (
	barrierTimeout       = time.Second
	barrierBroadcastWait = 250 * time.Millisecond
)

// Policy is a limiter's side of the overrides: it keeps the limiter's
// override table (the service's) in step with its region's bridge. It
// applies what the bridge broadcasts, asks the bridge for every override
// at Start and whenever their digests differ, and sends the bridge what the
// limiter's admin endpoints accepted, again until acknowledged. With no
// bridge (the embedded default) the table is the limiter's own.
type Policy struct {
	nc  *nats.Conn
	cfg PolicyConfig // its defaults set

	mu           sync.Mutex
	pending      map[policy.Key]policy.Entry // accepted here, not yet acknowledged
	pendingMarks map[policy.Mark]struct{}    // accepted here, not yet acknowledged

	// applied is the bridge's policy sequence this limiter holds every
	// change up to (bridge.Bridge.PolicySeq); advanced is closed, and replaced,
	// whenever it grows.
	applied    atomic.Uint64
	advanceMu  sync.Mutex
	advanced   chan struct{}
	barrierLog atomic.Int64 // unix ms of the last barrier failure logged

	subs     subscriptions
	bad      atomic.Int64
	syncedAt atomic.Int64 // unix ms of the last agreement with the bridge; 0: never
	stale    atomic.Bool  // the last sync failed
	noBridge atomic.Bool  // the last sync found no bridge
	stop     chan struct{}
	stopOnce sync.Once
	done     sync.WaitGroup
}

// ResetMarks is where a Policy applies reset marks: the limiter's
// service (*service.Service).
type ResetMarks interface {
	// Marks returns the marks held, whose digest and content the link
	// compares with the bridge's.
	Marks() *policy.Marks
	// ApplyMarks merges marks received and forgets the cells they reset.
	ApplyMarks(marks ...policy.Mark) (int, error)
	// PruneMarks forgets the marks that expired at now (policy.Marks.Prune
	// with graceMs) and returns the marks of single durations it turned
	// marks of every duration into, for the bridge to pass on.
	PruneMarks(now, graceMs int64) []policy.Mark
}

// PolicyConfig holds what NewPolicy needs.
type PolicyConfig struct {
	Subjects wire.Subjects
	// Region is the limiter's region. Required.
	Region string
	// Table is the override table to keep: the service's. Required.
	Table *policy.Table
	// Resets holds and applies the reset marks: the service. Nil: marks
	// are neither applied nor compared.
	Resets ResetMarks
	// Now is the clock entries are checked against; nil: time.Now.
	Now func() time.Time
	// MaxClockSkew bounds how far ahead of Now an entry's version may be.
	// Default global.DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// SyncInterval is how often the digests are compared. Default
	// DefaultPolicySyncInterval.
	SyncInterval time.Duration
	// Logger receives state changes; nil discards them.
	Logger *slog.Logger
}

// NewPolicy returns a link for a limiter on nc; call Start before the
// limiter serves checks.
func NewPolicy(nc *nats.Conn, cfg PolicyConfig) (*Policy, error) {
	if cfg.Region == "" || cfg.Table == nil {
		return nil, errors.New("link: PolicyConfig needs Region and Table")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxClockSkew <= 0 {
		cfg.MaxClockSkew = global.DefaultMaxClockSkew
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = DefaultPolicySyncInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Policy{nc: nc, cfg: cfg, pending: make(map[policy.Key]policy.Entry), pendingMarks: make(map[policy.Mark]struct{}),
		stop: make(chan struct{})}, nil
}

// Start subscribes to the bridge's broadcasts, then takes every override
// the bridge holds (waiting until ctx ends at most; no bridge is not an
// error: the limiter starts with the overrides it has), and starts the
// sync loop.
func (p *Policy) Start(ctx context.Context) error {
	err := p.subs.add(p.nc, handler{p.cfg.Subjects.Internal("policy.import", p.cfg.Region), "", func(m *nats.Msg) {
		pm, err := event.DecodePolicies(m.Data)
		if dropped(&p.bad, p.cfg.Logger, err, "dropped a malformed policies message") {
			return
		}
		p.merge(pm)
		p.advance(pm.Seq)
	}})
	if err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	p.sync(ctx)
	p.done.Add(1)
	go p.loop()
	return nil
}

// merge applies the override entries and reset marks of pm, received
// from the bridge, each checked as input, and returns how many changed the
// table or raised an epoch.
func (p *Policy) merge(pm event.Policies) int {
	// One merge, one view published, for the whole message.
	n, _ := p.cfg.Table.Merge(checked(p, pm.Overrides, "refused an override from the bridge")...) // each entry was checked
	if p.cfg.Resets != nil && len(pm.Marks) > 0 {
		m, _ := p.cfg.Resets.ApplyMarks(checked(p, pm.Marks, "refused a reset mark from the bridge")...)
		n += m
	}
	return n
}

// checked returns the entries or marks of xs that pass their CheckAt at
// the link's clock and skew; each other one it counts as dropped and logs
// as refused.
func checked[T interface{ CheckAt(now, skewMs int64) error }](p *Policy, xs []T, refused string) []T {
	now := p.cfg.Now().UnixMilli()
	ok := make([]T, 0, len(xs))
	for _, x := range xs {
		if err := x.CheckAt(now, p.cfg.MaxClockSkew.Milliseconds()); err != nil {
			p.bad.Add(1)
			p.cfg.Logger.Debug(refused, "error", err)
			continue
		}
		ok = append(ok, x)
	}
	return ok
}

// digests is what the link compares with its bridge: the override
// table's digests XOR the marks', whole and in parts, once the tombstones
// before policy.TombstoneCutoff are pruned (as the bridge prunes them).
func (p *Policy) digests() policy.Digests {
	p.cfg.Table.Prune(policy.TombstoneCutoff(p.cfg.Now().UnixMilli()))
	d := p.cfg.Table.Digests()
	if p.cfg.Resets != nil {
		d = d.Xor(p.cfg.Resets.Marks().Digests())
	}
	return d
}

// prune forgets the marks that expired (the tombstones go before each
// digest exchange: digests). The marks of single durations that expiring
// marks of every duration left (for the durations whose cells the limiter
// holds) go to the bridge with the next resend, as accepted resets do: the
// other limiters may not hold those cells.
func (p *Policy) prune() {
	if p.cfg.Resets == nil {
		return
	}
	if kept := p.cfg.Resets.PruneMarks(p.cfg.Now().UnixMilli(), global.MarkGrace.Milliseconds()); len(kept) > 0 {
		p.mu.Lock()
		for _, m := range kept {
			p.pendingMarks[m] = struct{}{}
		}
		p.mu.Unlock()
	}
}

func (p *Policy) loop() {
	defer p.done.Done()
	t := time.NewTicker(p.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.SyncInterval/2)
			p.prune()
			p.resend(ctx)
			p.sync(ctx)
			cancel()
		}
	}
}

// advance records that the limiter holds every change up to the bridge's
// sequence s, and wakes the barriers waiting for it.
func (p *Policy) advance(s uint64) {
	p.advanceMu.Lock()
	defer p.advanceMu.Unlock()
	if s <= p.applied.Load() {
		return
	}
	p.applied.Store(s)
	if p.advanced != nil {
		close(p.advanced)
		p.advanced = nil
	}
}

// awaitApplied waits until the limiter holds every change up to s, for at
// most d (or until ctx ends), and reports whether it does.
func (p *Policy) awaitApplied(ctx context.Context, s uint64, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		p.advanceMu.Lock()
		if p.applied.Load() >= s {
			p.advanceMu.Unlock()
			return true
		}
		if p.advanced == nil {
			p.advanced = make(chan struct{})
		}
		ch := p.advanced
		p.advanceMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// Barrier waits until this limiter holds every override and reset mark its
// region's bridge had merged when Barrier was called, so that an admin
// request sees every change acknowledged before it, through whichever
// limiter of the region (docs/architecture.md, "Read your writes"). It asks
// the bridge for its policy sequence (one small request), then waits for
// the broadcast that carries it (the bridge broadcasts every BatchInterval)
// and, if none comes within barrierBroadcastWait (a broadcast lost, a
// bridge that restarted), takes the bridge's snapshot. No bridge: nothing
// to wait for. It never waits more than barrierTimeout: when the limiter
// could not tell, it logs so (at most once a minute) and the caller serves
// from what it holds.
func (p *Policy) Barrier(ctx context.Context) {
	if err := p.barrier(ctx); err != nil {
		p.logBarrier(err)
	}
}

// barrier is Barrier, saying why when the limiter could not tell.
func (p *Policy) barrier(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, barrierTimeout)
	defer cancel()
	m, err := p.request(ctx, "policy.seq", nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("policy barrier: ask the bridge: %w", err)
	}
	pm, err := event.DecodePolicies(m.Data)
	if err != nil {
		p.bad.Add(1)
		return fmt.Errorf("policy barrier: %w", err)
	}
	if p.awaitApplied(ctx, pm.Seq, barrierBroadcastWait) {
		return nil
	}
	if _, _, _, err := p.snapshot(ctx); err != nil {
		return fmt.Errorf("policy barrier: no broadcast of sequence %d: %w", pm.Seq, err)
	}
	if p.applied.Load() < pm.Seq {
		return fmt.Errorf("policy barrier: the bridge's snapshot is behind its sequence %d", pm.Seq)
	}
	return nil
}

// logBarrier logs a failed barrier, at most once a minute.
func (p *Policy) logBarrier(err error) {
	now := p.cfg.Now().UnixMilli()
	if last := p.barrierLog.Load(); now-last < time.Minute.Milliseconds() || !p.barrierLog.CompareAndSwap(last, now) {
		return
	}
	p.cfg.Logger.Warn("serving an admin request from the overrides held: the bridge's latest changes may be missing", "error", err)
}

// Accept sends e, which the limiter's admin endpoint has applied to the
// table, to the region's bridge and waits for its acknowledgement (at
// most a second). Unacknowledged, e stays pending and is sent again every
// sync; with no bridge, nothing is pending (the table is the limiter's
// own). It never fails the change: the change is accepted here.
func (p *Policy) Accept(ctx context.Context, e policy.Entry) {
	p.accept(ctx, []policy.Entry{e}, nil, "an override", func() { p.pending[e.Key] = e })
}

// AcceptMark sends m, which the limiter's reset endpoint has applied, to
// the region's bridge as Accept sends an override: unacknowledged, it stays
// pending and is sent again every sync.
func (p *Policy) AcceptMark(ctx context.Context, m policy.Mark) {
	p.accept(ctx, nil, []policy.Mark{m}, "a reset", func() { p.pendingMarks[m] = struct{}{} })
}

// accept sends es and ms to the bridge. When a bridge is there but did not
// acknowledge them, pend records them as pending (under mu), and the link
// logs that it sends what again every sync.
func (p *Policy) accept(ctx context.Context, es []policy.Entry, ms []policy.Mark, what string, pend func()) {
	err := p.send(ctx, es, ms)
	if err == nil || errors.Is(err, nats.ErrNoResponders) {
		return
	}
	p.mu.Lock()
	pend()
	p.mu.Unlock()
	p.cfg.Logger.Warn("the bridge did not acknowledge "+what+"; sending it again every sync", "error", err)
}

// policyChunks splits es and ms into events of at most eventChunkEntries
// entries each: the overrides first, then the marks.
func policyChunks(es []policy.Entry, ms []policy.Mark) []event.Policies {
	var out []event.Policies
	for part := range slices.Chunk(es, eventChunkEntries) {
		out = append(out, event.Policies{Overrides: part})
	}
	for part := range slices.Chunk(ms, eventChunkEntries) {
		out = append(out, event.Policies{Overrides: []policy.Entry{}, Marks: part})
	}
	return out
}

// send asks the bridge to merge es and ms and waits for its
// acknowledgement.
func (p *Policy) send(ctx context.Context, es []policy.Entry, ms []policy.Mark) error {
	ctx, cancel := context.WithTimeout(ctx, policyAckTimeout)
	defer cancel()
	var errs []error
	for _, part := range policyChunks(es, ms) {
		if _, err := p.request(ctx, "policy", event.AppendPolicies(nil, part)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// request sends body, stamped, to the region's bridge on the subject of
// kind and returns its reply, or the error the reply carries.
func (p *Policy) request(ctx context.Context, kind string, body []byte) (*nats.Msg, error) {
	m, err := p.nc.RequestMsgWithContext(ctx, stamped(p.cfg.Subjects.Internal(kind, p.cfg.Region), body, p.cfg.Now().UnixMilli()))
	if err == nil {
		err = bus.ReplyError(m)
	}
	return m, err
}

// resend sends the pending entries again.
func (p *Policy) resend(ctx context.Context) {
	p.mu.Lock()
	es, ms := slices.Collect(maps.Values(p.pending)), slices.Collect(maps.Keys(p.pendingMarks))
	p.mu.Unlock()
	if len(es) == 0 && len(ms) == 0 {
		return
	}
	if err := p.send(ctx, es, ms); err != nil {
		return
	}
	p.mu.Lock()
	for _, e := range es {
		if cur, ok := p.pending[e.Key]; ok && cur == e {
			delete(p.pending, e.Key)
		}
	}
	for _, m := range ms {
		delete(p.pendingMarks, m)
	}
	p.mu.Unlock()
}

// sync compares digests with the bridge: when they differ it applies
// every override the bridge holds and, if they still differ, sends the
// bridge every override this region accepted that the limiter holds (a
// bridge that started after a loss learns them back).
func (p *Policy) sync(ctx context.Context) {
	n, theirs, parts, err := p.snapshot(ctx)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		p.noBridge.Store(true)
		p.stale.Store(false)
		return
	case err != nil:
		if !p.stale.Swap(true) {
			p.cfg.Logger.Warn("overrides not synced with the bridge: keeping the ones held", "error", err)
		}
		return
	}
	p.noBridge.Store(false)
	if p.stale.Swap(false) {
		p.cfg.Logger.Info("overrides synced with the bridge again")
	}
	if n > 0 {
		p.cfg.Logger.Info("applied the bridge's overrides", "changed", n)
	}
	if ours := p.digests(); theirs != ours.Total {
		// Only the parts in which the two still differ (all of them for a
		// bridge that sent no parts).
		mask := ours.Differ(parts)
		own := slices.DeleteFunc(p.cfg.Table.EntriesIn(mask), func(e policy.Entry) bool { return e.Version.Origin != p.cfg.Region })
		// Marks carry no origin: every mark held in those parts goes
		// (merging by max makes the ones the bridge has harmless).
		var marks []policy.Mark
		if p.cfg.Resets != nil {
			marks = p.cfg.Resets.Marks().AllIn(mask)
		}
		if len(own) > 0 || len(marks) > 0 {
			if err := p.send(ctx, own, marks); err != nil {
				p.cfg.Logger.Debug("sending held overrides to the bridge failed", "error", err)
				return
			}
		}
	}
	p.syncedAt.Store(p.cfg.Now().UnixMilli())
}

// snapshot asks the bridge for its overrides, sending the limiter's
// digest whole and in parts: the bridge answers one empty chunk when they
// agree, and otherwise the entries and marks of the parts that differ. It
// returns how many entries changed the table, and the bridge's digest and
// parts (nil from a bridge that sends none).
func (p *Policy) snapshot(ctx context.Context) (changed int, theirs uint64, parts []uint64, err error) {
	ours := p.digests()
	msg := stamped(p.cfg.Subjects.Internal("policy.snapshot", p.cfg.Region),
		event.AppendPolicies(nil, event.Policies{Overrides: []policy.Entry{}, Digest: ours.Total, Shards: ours.Shards[:]}), p.cfg.Now().UnixMilli())
	err = requestChunks(ctx, p.nc, msg, "policy snapshot", func(m *nats.Msg) (bool, error) {
		pm, err := event.DecodePolicies(m.Data)
		if err != nil {
			p.bad.Add(1)
			return false, err
		}
		changed += p.merge(pm)
		if !pm.More {
			p.advance(pm.Seq)
			theirs, parts = pm.Digest, pm.Shards
		}
		return pm.More, nil
	})
	return changed, theirs, parts, err // theirs and parts are set by the last chunk only
}

// PolicyStats is what a Policy reports.
type PolicyStats struct {
	// SyncedAt is when the limiter last agreed with its bridge (zero:
	// never, or no bridge).
	SyncedAt time.Time
	// Stale reports that the last sync with the bridge failed: the limiter
	// decides by the overrides it last had.
	Stale bool
	// NoBridge reports that the last sync found no bridge in the region.
	NoBridge bool
	// Pending counts overrides and reset marks accepted here that the
	// bridge has not acknowledged; Dropped the malformed or invalid ones
	// received.
	Pending int
	Dropped int64
}

// Stats returns the link's state.
func (p *Policy) Stats() PolicyStats {
	p.mu.Lock()
	pending := len(p.pending) + len(p.pendingMarks)
	p.mu.Unlock()
	st := PolicyStats{Stale: p.stale.Load(), NoBridge: p.noBridge.Load(), Pending: pending, Dropped: p.bad.Load()}
	if ms := p.syncedAt.Load(); ms > 0 {
		st.SyncedAt = time.UnixMilli(ms)
	}
	return st
}

// Close stops the sync loop and the subscription, after sending once more
// what the bridge has not acknowledged (until ctx ends).
func (p *Policy) Close(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.done.Wait()
	p.resend(ctx)
	return p.subs.close()
}
