package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// The settle loop keeps the origin's view of this process current in the
// background: every FlushInterval it takes the queued cells and, for those
// that are due, sends their state in pipelined Settle calls — reporting
// what this process admitted (so the region's lower bounds catch up),
// renewing the leases of cells it keeps admitting in, and giving back the
// leases of cells that went idle, expired, left the current window or were
// contended. Admissions are charged before they are final, so nothing a
// killed process admitted under a lease is lost; only what it admitted
// while the origin failed waits here to be sent.

// cellStack is a lock-free stack of cells: the settle loop's (cells with
// something for the origin) and the publisher's (cells whose regional
// count grew). A cell is on a stack at most once (its flag bit is set while
// it is), so a stack's memory is bounded by the number of active cells,
// never by the number of requests. Each stack threads its cells through
// its own link of the cell.
type cellStack struct {
	head atomic.Pointer[cell]
	n    atomic.Int64 // cells on the stack
	flag uint32       // the cell's flag bit marking it on this stack
	link int          // the index of the cell's links this stack uses
}

// The links of cell.links: one per stack, so a cell can wait on both.
const (
	linkSettle = iota
	linkGlobal
)

// push adds c unless it is on the stack already.
func (r *cellStack) push(c *cell) {
	if !c.set(r.flag) {
		return
	}
	for {
		h := r.head.Load()
		c.links[r.link] = h
		if r.head.CompareAndSwap(h, c) {
			r.n.Add(1)
			return
		}
	}
}

// takeAll empties the stack and appends its cells to out. The cells keep
// their flag bit: whoever takes them clears it when it is done.
func (r *cellStack) takeAll(out []*cell) []*cell {
	n := 0
	for c := r.head.Swap(nil); c != nil; {
		next := c.links[r.link]
		c.links[r.link] = nil
		out = append(out, c)
		c = next
		n++
	}
	r.n.Add(int64(-n))
	return out
}

// admittedLocally records an admission this process made without the
// origin (it failed, or there were too many waiting checks): it joins the
// cell's local count, which is published to the region's other limiters
// before the decision is returned (Config.Locals) and carried by the next
// sync of the cell (region.Sync.Local).
func (s *Service) admittedLocally(c *cell, cost int64) {
	s.counters.AdmittedLocally.Add(1)
	total := s.locals.add(c, cost)
	if s.cfg.Locals != nil {
		id := c.identity()
		s.cfg.Locals.PublishLocal(id, s.localID, total, id.Expiry(s.cfg.ExpiryGrace.Milliseconds()))
	}
	c.set(flagUnsettled)
	s.settle.push(c)
}

// settleTick runs one settle round, unless a failed round asked to back
// off: while the origin is down, rebuilding and re-sending every queued
// cell every FlushInterval only burns the CPU that checks need.
func (s *Service) settleTick() {
	now := s.nowMs()
	if now < s.settleBackoffUntil {
		return
	}
	if err := s.settleDue(context.Background(), false); err != nil {
		s.settleBackoff = min(max(2*s.settleBackoff, s.cfg.FlushInterval), maxSettleBackoff)
		s.settleBackoffUntil = now + s.settleBackoff.Milliseconds()
		return
	}
	s.settleBackoff = 0
}

// maxSettleBackoff bounds the pause between settle rounds after failures.
const maxSettleBackoff = time.Second

// settle action for a queued cell.
const (
	settleLater    = iota // not due yet: stays queued
	settleDrop            // nothing for the origin
	settleReport          // send its state, keeping its lease (and asking for more)
	settleGiveBack        // send its state, giving its lease back
)

// settleAction says what a round at now does with queued cell c; with all
// (shutdown), every cell with something for the origin gives its lease back.
func (s *Service) settleAction(c *cell, now int64, all bool) int {
	avail, unsettled := c.avail.Load(), c.has(flagUnsettled)
	if avail == 0 && !unsettled {
		return settleDrop
	}
	if all || c.seq < now/c.b.key.duration || c.forgotten() {
		return settleGiveBack // (a reset forgot it: it lends nothing more)
	}
	since := now - c.syncedAt.Load()
	if avail > 0 {
		switch {
		case c.has(flagContended), now >= c.leaseUntil.Load():
			return settleGiveBack
		case !unsettled:
			// Idle: near the limit others may need it; far from it, it goes
			// back before it ends, so that the origin never counts the
			// unused part of a live process's lease as used.
			if c.has(flagNear) && since >= s.cfg.FarFlushInterval.Milliseconds() ||
				c.leaseUntil.Load()-now <= 2*s.flushInterval {
				return settleGiveBack
			}
			return settleLater
		case c.leaseUntil.Load()-now <= 2*s.flushInterval, avail < s.want(c, s.prevOf(c), c.limit.Load(), now)/2:
			return settleReport // in use and running out: renew
		}
	}
	if s.reportDue(c, now, since) {
		return settleReport
	}
	return settleLater
}

// reportDue reports whether the admissions c holds unreported are due at
// the origin: near the limit every FlushInterval, since the region's other
// limiters deny and answer looks from what is reported; far from it once
// they reach 1% of the limit (so N limiters hide at most N% of a limit from
// each other, and from the regional count they publish), or FreshFor after
// the last sync. Nothing depends on reports for exactness: admissions are
// charged before they are final.
func (s *Service) reportDue(c *cell, now, since int64) bool {
	if c.has(flagNear) || s.locals.pending(c) > 0 {
		// Near the limit, or holding what it admitted without the origin
		// (the origin failed or its breaker is open, or too many checks
		// waited):
		// every round.
		return since >= s.flushInterval
	}
	if since >= s.freshFor {
		return true
	}
	b := c.b
	if b.obsSeq.Load() != c.seq {
		return since >= s.cfg.FarFlushInterval.Milliseconds()
	}
	unreported := c.top.Load() - c.avail.Load() - c.held.Load() - b.obsUsed.Load()
	return 100*unreported >= c.limit.Load() && since >= s.flushInterval
}

// settleDue runs one round: the queued cells that are due are synced,
// FlushBatch cells per Settle call and FlushWorkers calls at once; cells
// not yet due stay queued. A cell with a sync on its way (a check waits on
// the origin) is left to it: that sync carries its state.
func (s *Service) settleDue(ctx context.Context, all bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	now := s.nowMs()
	s.locals.drop(now, s.cfg.ExpiryGrace.Milliseconds())
	lerr := s.flushLocals(ctx, now)
	cells := s.settle.takeAll(s.deferred)
	s.deferred = nil
	s.deferredN.Store(int64(len(cells)))
	defer func() { s.deferredN.Store(int64(len(s.deferred))) }()
	if len(cells) == 0 {
		return lerr
	}
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, s.cfg.FlushWorkers)
		errMu sync.Mutex
		errs  []error
	)
	var steps []syncStep
	send := func() {
		if len(steps) == 0 {
			return
		}
		bs := steps
		steps = nil
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
			res, err := s.sendAll(actx, bs)
			cancel()
			for i := range bs {
				bs[i].land(func(c, _ *cell, ps pendingSync) {
					if err != nil || res[i].Stale {
						c.set(flagUnsettled)
						s.settle.push(c)
						return
					}
					// The cell before it as it is now: a check may have
					// installed it while the call was on its way.
					s.applySync(c, s.prevOf(c), ps, 0, res[i], ps.at, s.nowMs())
				})
			}
			if err != nil {
				s.counters.SettleErrors.Add(1)
				s.cfg.Logger.Debug("settle round failed; cells stay queued", "cells", len(bs), "error", err)
				errMu.Lock()
				errs = append(errs, fmt.Errorf("settle %d cells: %w", len(bs), err))
				errMu.Unlock()
			}
		})
	}
	// A round carries at most roundCells cells (unless everything must go):
	// a backlog built while the origin was down then goes out over several
	// rounds instead of in one burst that starves the origin's reads.
	roundCells := 2 * s.cfg.FlushWorkers * s.cfg.FlushBatch
	sent := 0
	grace := s.cfg.ExpiryGrace.Milliseconds()
	for _, c := range cells {
		if window.Following(c.seq, c.b.key.duration)+grace <= now {
			// The origin has forgotten the cell: it no longer weighs in any
			// decision, and a sync would only create it again.
			c.clear(flagQueued)
			s.counters.ExpiredDropped.Add(1)
			continue
		}
		act := s.settleAction(c, now, all)
		if act == settleLater || !all && sent >= roundCells && act != settleDrop {
			s.deferred = append(s.deferred, c) // stays queued
			continue
		}
		c.clear(flagQueued) // from here on, whatever needs the origin queues it again
		if act == settleDrop {
			if c.avail.Load() > 0 || c.has(flagUnsettled) {
				s.settle.push(c) // changed meanwhile
			}
			continue
		}
		if !c.trySync() {
			s.settle.push(c) // a check's sync is on its way and reports its state; look again next round
			continue
		}
		sent++
		want, keep := int64(0), int64(-1)
		switch {
		case act == settleGiveBack:
			keep = 0
		case c.seq == now/c.b.key.duration:
			// A top-up once less than half the lease it wants is left; what
			// it holds beyond that (its rate fell, a burst is over) goes
			// back, so what it holds unused follows its traffic.
			w, a := s.want(c, s.prevOf(c), c.limit.Load(), now), c.avail.Load()
			if a < w/2 {
				want = w - a
			} else if a > w {
				keep = w
			}
		}
		steps = append(steps, s.step(c, s.prevOf(c), now, rule{}, keep, want))
		ps := &steps[len(steps)-1].ps
		ps.sy.ReportOnly = want == 0 // nothing asked: the cheap call
		ps.sy.Retire = all           // shutting down: the origin folds this process's part and forgets it
		if len(steps) == s.cfg.FlushBatch {
			send()
		}
	}
	send()
	wg.Wait()
	return errors.Join(append(errs, lerr)...)
}

// prevOf returns the cell before c if the bucket holds it, else an empty
// cell standing for it (its counts are what the origin says).
func (s *Service) prevOf(c *cell) *cell {
	e := c.prevEpoch()
	if p := c.b.peek(c.seq - 1); p != nil && p.epoch == e {
		return p
	}
	return &cell{b: c.b, seq: c.seq - 1, epoch: e}
}

// ErrPending is wrapped by the error of Close when the origin may lack some
// of what this process admitted; the error is a *PendingError saying how
// much.
var ErrPending = errors.New("pending state not settled with the origin")

// PendingError reports what Close could not settle with the origin. It
// wraps ErrPending and the cause.
type PendingError struct {
	// Cells is how many cells the origin may hold an old state of.
	Cells int
	// Unsent is the cost admitted in those cells while the origin failed
	// that no sync carried: the origin lacks it.
	Unsent int64
	// Cause says why settling stopped.
	Cause error
}

func (e *PendingError) Error() string {
	return fmt.Sprintf("%v: %d cells, %d cost never sent: %v", ErrPending, e.Cells, e.Unsent, e.Cause)
}

// Unwrap returns ErrPending and the cause.
func (e *PendingError) Unwrap() []error { return []error{ErrPending, e.Cause} }

// errOriginDown says why drain stopped before its context ended.
var errOriginDown = errors.New("the origin is down: its breaker is open and a probe during shutdown failed")

// drain settles until nothing is queued, ctx ends, or the origin is known
// to be down: once its breaker refused a round (region.ErrOriginOpen), a
// call that then reached the origin (the breaker's probe) failed as well.
// So a shutdown while Redis is down takes about the breaker's open interval
// plus one call, not the whole shutdown timeout, and a shutdown while Redis
// is merely recovering still hands everything on.
func (s *Service) drain(ctx context.Context) error {
	retry := time.NewTicker(s.cfg.FlushInterval)
	defer retry.Stop()
	refused := false
	for {
		err := s.settleDue(ctx, true) // every lease back
		switch {
		case s.settle.head.Load() == nil:
			return nil
		case ctx.Err() != nil: // out of time: what is queued is pending
		case reachedAndFailed(err) && refused:
			return s.pendingError(errors.Join(errOriginDown, err))
		default:
			refused = refused || errors.Is(err, region.ErrOriginOpen)
			select {
			case <-ctx.Done():
			case <-retry.C:
				continue
			}
		}
		return s.pendingError(errors.Join(err, ctx.Err()))
	}
}

// reachedAndFailed reports whether err holds a failure of a call that the
// breaker let through.
func reachedAndFailed(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if reachedAndFailed(e) {
				return true
			}
		}
		return false
	}
	return !errors.Is(err, region.ErrOriginOpen)
}

// pendingError empties the settle stack and says what it held.
func (s *Service) pendingError(cause error) *PendingError {
	e := &PendingError{Cause: cause}
	for _, c := range s.settle.takeAll(nil) {
		e.Cells++
		e.Unsent += s.locals.pending(c)
	}
	return e
}
