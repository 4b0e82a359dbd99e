package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// GlobalSink receives what a limiter shares with other regions: its
// region's components. Package bus/link implements it by sending them to
// the region's bridge.
type GlobalSink interface {
	// Publish delivers cs, and returns nil only once the receiver
	// has them. On error the service sends them again later (merges are
	// idempotent), until they go out or their cells expire. It runs on the
	// service's publish loop and should give up within about a second; an
	// error wrapping ErrNoReceiver says nobody is there to receive.
	Publish(cs []global.Component) error
}

// ErrNoReceiver is wrapped by a GlobalSink's error when nothing receives
// what it publishes (no bridge runs in the region).
var ErrNoReceiver = errors.New("nothing receives the published components")

// maxPublishBackoff bounds the pause between publish rounds after failures.
const maxPublishBackoff = time.Second

// publishStep is the growth, as a fraction of the limit, that makes a
// cell's regional count worth publishing: each region hides at most this
// much of a limit from the others (see docs/architecture.md).
const publishStep = 100 // 1/publishStep of the limit

// globalState is the service's side of the global layer.
type globalState struct {
	stack cellStack
	// backoff and backoffUntil (unix ms) pace publish rounds after a failed
	// one; only the publish loop touches them.
	backoff      time.Duration
	backoffUntil int64
}

// queueGlobal notes that the cell's regional count may have grown.
func (s *Service) queueGlobal(c *cell, limit int64) {
	if limit > 0 && c.limit.Load() != limit {
		c.limit.Store(limit)
	}
	if c.b.key.duration >= s.globalMin {
		s.gstate.stack.push(c)
	}
}

// publish sends the components worth publishing. A cell's regional count
// is published when it grew by at least 1% of the limit since it was last
// published, or when the cell is near its limit, was denied
// (publishDenial) or is already shared with another region (it has
// imports): so each
// region hides less than 1% of a limit from the others, and at most one
// component per cell leaves per PublishInterval. What fails to go out is
// sent again by later rounds (backing off to maxPublishBackoff) until it
// goes out or its cell expires. It returns the sink's error.
func (s *Service) publish() error {
	now := s.nowMs()
	g := &s.gstate
	if now < g.backoffUntil {
		return nil
	}
	cells := g.stack.takeAll(nil)
	for _, c := range cells {
		c.clear(flagGlobalQueued)
	}
	grace := s.cfg.ExpiryGrace.Milliseconds()
	var (
		cs    []global.Component
		sent  []*cell
		lasts []int64
	)
	for _, c := range cells {
		count := c.admitted()
		last := c.published.Load()
		if count <= last {
			continue
		}
		step := max(1, c.limit.Load()/publishStep)
		if count-last < step && !c.has(flagNear) && !c.has(flagDenialSent) && c.imported.Load() == 0 {
			continue
		}
		id := c.identity()
		if id.Expiry(grace) <= now {
			continue // no longer matters to anyone
		}
		c.published.Store(count)
		cs = append(cs, global.Component{Cell: id, Region: s.cfg.Region, Count: count, ExpireAt: id.Expiry(grace)})
		sent, lasts = append(sent, c), append(lasts, last)
	}
	if len(cs) == 0 {
		return nil
	}
	err := s.global.Publish(cs)
	if err == nil {
		s.counters.ComponentsPublished.Add(int64(len(cs)))
		g.backoff = 0
		return nil
	}
	s.counters.PublishErrors.Add(1)
	s.cfg.Logger.Debug("publish to the bridge failed; sending again later", "components", len(cs), "error", err)
	for i, c := range sent {
		// Unless a later round published more meanwhile (none runs
		// concurrently, but keep the rule local), forget this publication.
		c.published.CompareAndSwap(cs[i].Count, lasts[i])
		g.stack.push(c)
	}
	g.backoff = min(max(2*g.backoff, s.cfg.PublishInterval), maxPublishBackoff)
	g.backoffUntil = now + g.backoff.Milliseconds()
	return err
}

// publishTick is the publish loop's round.
func (s *Service) publishTick() { _ = s.publish() }

// publishLast is the publish loop's last round, at Close: what the last
// admissions changed goes out, retried for up to a second while the
// receiver fails (not when there is none).
func (s *Service) publishLast() {
	deadline := time.Now().Add(time.Second)
	for {
		s.gstate.backoffUntil = 0
		err := s.publish()
		if err == nil || errors.Is(err, ErrNoReceiver) || time.Now().After(deadline) {
			return
		}
		time.Sleep(s.cfg.PublishInterval)
	}
}

// publishDenial queues the cell's component for the next publish round,
// however little it grew, at its first denial when its window is long
// enough to matter globally (GlobalMinDuration), the sliding usage before
// this request's cost (rounded up) was at least half the limit (a filter:
// a denial below it most often comes from one oversized request on a
// fresh identifier), and the region holds some of the cell; from then on
// every growth of it is published. Other regions add the component to
// their foreign sum, so their sliding-window math reproduces this region's
// decision for the same request, whatever caused the denial, and never
// counts anything twice (raising the cell to the limit instead would block
// the other regions for the rest of the window whenever the cell was not
// full; see docs/architecture.md).
func (s *Service) publishDenial(c *cell, q Query, d window.Decision) {
	if q.Duration < s.globalMin || q.Limit <= 0 || 2*d.Remaining > q.Limit {
		return
	}
	if c.admitted() > 0 && c.set(flagDenialSent) {
		s.gstate.stack.push(c)
	}
}

// ApplyImports folds an import message from the region's bridge into the
// cells this process holds: the foreign sum into imported (max) and the
// region's own published count into the regional count as a lower bound
// (without making the cell fresh). Imported counts are never published.
// An import for a cell this process does not hold is left to StoreImports:
// a limiter holds what it serves, and a cell it creates later reads the
// global view from the origin with its totals. Without an origin there is
// no such place, so imports then create their cells.
//
// What the bridge sends is input, not truth. sentAt is the bridge's clock
// when it sent the message (unix ms, 0: not stamped); a message stamped more
// than MaxClockSkew from this process's clock is refused whole. Each import
// must pass global.Import.Check at this process's clock. Refusals are
// counted (Refused) and logged at most every 10s. Imports for windows older
// than the previous one no longer matter and are ignored. An import for a
// window after the current one (the sender's clock is ahead, within the
// tolerance) waits until this process's clock reaches that window: it never
// moves a local window.
func (s *Service) ApplyImports(is []global.Import, sentAt int64) {
	now := s.nowMs()
	s.counters.ImportsApplied.Add(int64(len(is)))
	if err := global.CheckSentAt(sentAt, now, s.cfg.MaxClockSkew); err != nil {
		s.refuse("bridge", len(is), err)
		return
	}
	for _, imp := range is {
		if err := imp.Check(now, s.cfg.MaxClockSkew); err != nil {
			s.refuse("bridge", 1, err)
			continue
		}
		c := imp.Cell
		seq := window.Sequence(now, c.Duration)
		if c.Sequence < seq-1 {
			continue // no longer weighs in any decision
		}
		key := bucketKey{workspace: c.Workspace, namespace: c.Namespace, identifier: c.Identifier, duration: c.Duration}
		var b *bucket
		if s.origin != nil {
			if b = s.table.load(key); b == nil {
				continue // not held: the origin keeps it (StoreImports)
			}
		}
		if c.Sequence > seq {
			s.applyLater(key, imp)
			continue
		}
		if b != nil {
			if cl := b.peek(c.Sequence); cl != nil {
				s.applyImport(cl, imp)
			}
			continue
		}
		b = s.table.loadOrCreate(key)
		s.syncEpoch(b)
		cl, created := b.cellFor(c.Sequence)
		if cl == nil {
			continue // the bucket already moved past this window
		}
		if created {
			s.applyEarly(cl)
		}
		s.applyImport(cl, imp)
	}
}

// StoreImports records an import message in the origin, so that a cell
// created later, by this process or another of the region, reads the global
// view with its totals. Only imports that pass ApplyImports' checks and
// still weigh in a decision are stored; refusals are counted by
// ApplyImports, which every limiter runs on every message. Without an
// origin it does nothing. It waits on the origin at most until ctx ends.
func (s *Service) StoreImports(ctx context.Context, is []global.Import, sentAt int64) error {
	if s.origin == nil {
		return nil
	}
	now := s.nowMs()
	if global.CheckSentAt(sentAt, now, s.cfg.MaxClockSkew) != nil {
		return nil
	}
	out := make([]region.Imported, 0, len(is))
	for _, imp := range is {
		if imp.Check(now, s.cfg.MaxClockSkew) != nil || imp.Cell.Sequence < window.Sequence(now, imp.Cell.Duration)-1 {
			continue
		}
		if imp.Foreign > 0 || imp.Own > 0 {
			out = append(out, region.Imported{Cell: imp.Cell, Foreign: imp.Foreign, Own: imp.Own, ExpireAt: imp.ExpireAt})
		}
	}
	if len(out) == 0 {
		return nil
	}
	if err := s.origin.Import(ctx, out); err != nil {
		s.counters.ImportStoreErrors.Add(1)
		return fmt.Errorf("store %d imports in the origin: %w", len(out), err)
	}
	s.counters.ImportsStored.Add(int64(len(out)))
	return nil
}

// refuse counts n refused imports from source: "bridge" (ApplyImports) or
// "limiters" (ApplyLocals).
func (s *Service) refuse(source string, n int, err error) {
	s.refused.Add(global.Refusal{Source: source, Region: s.cfg.Region, Reason: global.Reason(err)}, n, err)
}

// Refused returns how many imports were refused, by kind.
func (s *Service) Refused() map[global.Refusal]int64 { return s.refused.Counts() }

// applyImport folds one import into its cell, if it is an import of that
// cell: of its epoch. An import of another epoch is of a cell a reset forgot
// (or of one this process has not learnt of yet) and is dropped: usage
// before a reset never comes back through imports.
func (s *Service) applyImport(cl *cell, imp global.Import) {
	if imp.Cell.Epoch != cl.epoch {
		return
	}
	raiseTo(&cl.imported, imp.Foreign)
	if imp.Own > 0 {
		cl.raise(imp.Own)
	}
}

// earlyImports holds imports for windows this process's clock has not
// reached yet, until a check installs their cell. At most maxEarlyImports
// wait; the janitor drops those whose window passed unused.
type earlyImports struct {
	n  atomic.Int64 // len(m), read without the lock
	mu sync.Mutex
	m  map[earlyKey]global.Import
}

// earlyKey names the cell an early import is for: its bucket, sequence
// and reset epoch.
type earlyKey struct {
	bucketKey
	seq, epoch int64
}

// maxEarlyImports bounds the stash: with the clock-skew tolerance of
// seconds, it holds the imports of a few seconds of traffic.
const maxEarlyImports = 1 << 16

// applyLater keeps imp until its cell exists, merged by max with what
// already waits for the same cell: of the same sequence and epoch (an
// import of another epoch is of another cell). An import of a cell the
// marks forgot is dropped, not kept: no cell of its epoch will be made for
// its window. If a check installed the cell meanwhile, it is applied at
// once.
func (s *Service) applyLater(key bucketKey, imp global.Import) {
	if s.forgottenImport(imp.Cell) {
		return
	}
	k := earlyKey{key, imp.Cell.Sequence, imp.Cell.Epoch}
	e := &s.early
	e.mu.Lock()
	old, ok := e.m[k]
	if !ok && len(e.m) >= maxEarlyImports {
		e.mu.Unlock()
		s.refuse("bridge", 1, fmt.Errorf("%w: %d imports for later windows wait already", global.ErrFutureWindow, maxEarlyImports))
		return
	}
	if ok {
		imp.Foreign, imp.Own = max(imp.Foreign, old.Foreign), max(imp.Own, old.Own)
	}
	e.m[k] = imp
	e.n.Store(int64(len(e.m)))
	e.mu.Unlock()
	// A check that installed the cell before the entry was stored did not
	// see it (it takes the lock after installing): apply it here.
	if b := s.table.load(key); b != nil {
		if cl := b.peek(k.seq); cl != nil {
			s.applyEarly(cl)
		}
	}
}

// applyEarly applies what waits for a cell just installed: the imports of
// its sequence and its epoch. Those of another epoch keep waiting (a mark
// not learnt yet may make their cell) until the janitor drops them.
func (s *Service) applyEarly(cl *cell) {
	e := &s.early
	if e.n.Load() == 0 {
		return
	}
	k := earlyKey{cl.b.key, cl.seq, cl.epoch}
	e.mu.Lock()
	imp, ok := e.m[k]
	if ok {
		delete(e.m, k)
		e.n.Store(int64(len(e.m)))
	}
	e.mu.Unlock()
	if ok {
		s.applyImport(cl, imp)
	}
}

// sweepEarly drops waiting imports whose window is older than the previous
// one at now.
func (s *Service) sweepEarly(now int64) {
	e := &s.early
	if e.n.Load() == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.m {
		if k.seq < now/k.duration-1 {
			delete(e.m, k)
		}
	}
	e.n.Store(int64(len(e.m)))
}
