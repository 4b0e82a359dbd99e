package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
)

// replayStack is a lock-free stack of cells with pending cost. A cell is on
// it at most once (its queued flag), so its memory is bounded by the number
// of active cells, never by the number of requests.
type replayStack struct {
	head atomic.Pointer[cell]
	n    atomic.Int64 // cells on the stack
}

// push queues c unless it is queued already.
func (r *replayStack) push(c *cell) {
	if !c.set(flagQueued) {
		return
	}
	for {
		h := r.head.Load()
		c.next = h
		if r.head.CompareAndSwap(h, c) {
			r.n.Add(1)
			return
		}
	}
}

// takeAll empties the stack and appends its cells to out. The cells stay
// marked queued: whoever takes them clears the mark when it reports them.
func (r *replayStack) takeAll(out []*cell) []*cell {
	n := 0
	for c := r.head.Swap(nil); c != nil; {
		next := c.next
		c.next = nil
		out = append(out, c)
		c = next
		n++
	}
	r.n.Add(int64(-n))
	return out
}

// queueReplay records admitted cost for replay. The caller has an origin.
func (s *Service) queueReplay(c *cell, cost int64) {
	c.own.Add(cost)
	s.replay.push(c)
}

// replayTick runs one replay round, unless a failed round asked to back
// off: while the origin is down, rebuilding and re-sending every queued
// cell every FlushInterval only burns the CPU that checks need.
func (s *Service) replayTick() {
	now := s.nowMs()
	if now < s.replayBackoffUntil {
		return
	}
	if err := s.flushDue(context.Background(), false); err != nil {
		s.replayBackoff = min(max(2*s.replayBackoff, s.cfg.FlushInterval), maxReplayBackoff)
		s.replayBackoffUntil = now + s.replayBackoff.Milliseconds()
		return
	}
	s.replayBackoff = 0
}

// maxReplayBackoff bounds the pause between replay rounds after failures.
const maxReplayBackoff = time.Second

// flush reports every queued cell's own cost to the origin, FlushBatch cells
// per call and FlushWorkers calls at once, and returns when all calls ended.
// Cells whose call failed are queued again; their next report carries
// everything, so nothing is lost and, reports being idempotent, nothing is
// counted twice.
func (s *Service) flush(ctx context.Context) error { return s.flushDue(ctx, true) }

// flushDue is flush for the cells that are due: near their limit (every
// round) or last reported FarFlushInterval ago; with all, every queued cell.
// Cells not yet due stay queued.
func (s *Service) flushDue(ctx context.Context, all bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	cells := s.replay.takeAll(s.deferred)
	s.deferred = nil
	// Until the round ends its cells count as pending (a failed call queues
	// its cells again, which may count them twice for a moment).
	s.deferredN.Store(int64(len(cells)))
	defer func() { s.deferredN.Store(int64(len(s.deferred))) }()
	if len(cells) == 0 {
		return nil
	}
	now := s.nowMs()
	far := s.cfg.FarFlushInterval.Milliseconds()
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, s.cfg.FlushWorkers)
		errMu sync.Mutex
		errs  []error
	)
	batch := make([]*cell, 0, min(len(cells), s.cfg.FlushBatch))
	reports := make([]region.Report, 0, cap(batch))
	send := func() {
		if len(batch) == 0 {
			return
		}
		bc, br := batch, reports
		batch = make([]*cell, 0, cap(batch))
		reports = make([]region.Report, 0, cap(batch))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.apply(ctx, bc, br); err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		}()
	}
	grace := s.cfg.ExpiryGrace.Milliseconds()
	// A round carries at most roundCells cells (unless everything must go):
	// a backlog built while the origin was down is then replayed over
	// several rounds instead of in one burst that starves the origin's reads.
	roundCells := 2 * s.cfg.FlushWorkers * s.cfg.FlushBatch
	sent := 0
	for _, c := range cells {
		if !all && (sent >= roundCells || !c.replayDue(now, far)) {
			s.deferred = append(s.deferred, c) // stays queued
			continue
		}
		sent++
		c.lastReport.Store(now)
		c.clear(flagQueued) // admissions from here on queue it again
		c.mu.Lock()         // no batch holds an uncommitted reservation
		own := c.own.Load()
		if own > c.reported.Load() {
			c.reported.Store(own)
			c.set(flagUnacked)
		}
		c.mu.Unlock()
		if !c.has(flagUnacked) {
			continue // the origin acknowledged all of own already
		}
		id := c.identity()
		batch = append(batch, c)
		reports = append(reports, region.Report{Cell: id, Own: own, ExpireAt: id.Expiry(grace)})
		if len(batch) == s.cfg.FlushBatch {
			send()
		}
	}
	send()
	wg.Wait()
	return errors.Join(errs...)
}

// apply sends one replay call and merges the totals it returns, or queues
// the cells again when it fails.
func (s *Service) apply(ctx context.Context, cells []*cell, reports []region.Report) error {
	actx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
	totals, err := s.origin.Apply(actx, s.cfg.ID, reports)
	cancel()
	s.counters.replays.Add(1)
	s.counters.replayCells.Add(int64(len(reports)))
	if err == nil && len(totals) != len(reports) {
		err = fmt.Errorf("origin returned %d totals for %d reports", len(totals), len(reports))
	}
	if err != nil {
		s.counters.replayErrs.Add(1)
		for _, c := range cells {
			s.replay.push(c)
		}
		s.log.Debug("replay failed; cells stay queued", "cells", len(cells), "error", err)
		return fmt.Errorf("replay %d cells: %w", len(cells), err)
	}
	now := s.nowMs()
	for i, c := range cells {
		c.mu.Lock()
		// Rounds do not overlap, so reported is still what this call sent.
		if reports[i].Own == c.reported.Load() {
			c.clear(flagUnacked)
		}
		c.merge(totals[i], now)
		c.mu.Unlock()
		s.observe(c, totals[i], now)
		if s.global != nil {
			s.queueGlobal(c, 0)
		}
	}
	return nil
}

// ErrPending is wrapped by the error of Close when admitted cost could not be
// replayed to the origin; the error is a *PendingError saying how much.
var ErrPending = errors.New("pending cost not replayed")

// PendingError reports what Close could not replay: the origin may lack
// that cost. It wraps ErrPending and the cause.
type PendingError struct {
	// Cells is how many cells still held cost the origin had not
	// acknowledged.
	Cells int
	// Unsent is the cost admitted in those cells and never sent.
	Unsent int64
	// Unconfirmed is how many of those cells had a report in flight whose
	// reply never came: the origin may or may not have applied it.
	Unconfirmed int
	// Cause says why replaying stopped.
	Cause error
}

func (e *PendingError) Error() string {
	return fmt.Sprintf("%v: %d cells, %d cost never sent, %d reports unconfirmed: %v",
		ErrPending, e.Cells, e.Unsent, e.Unconfirmed, e.Cause)
}

// Unwrap returns ErrPending and the cause.
func (e *PendingError) Unwrap() []error { return []error{ErrPending, e.Cause} }

// errOriginDown says why drain stopped before its context ended.
var errOriginDown = errors.New("the origin is down: its breaker is open and a probe during shutdown failed")

// drain replays until nothing is pending, ctx ends, or the origin is known to
// be down: once its breaker refused a round (region.ErrOriginOpen), a call
// that then reached the origin (the breaker's probe) failed as well. So a
// shutdown while Redis is down takes about the breaker's open interval plus
// one replay call, not the whole shutdown timeout, and a shutdown while
// Redis is merely recovering still hands everything on.
func (s *Service) drain(ctx context.Context) error {
	retry := time.NewTicker(s.cfg.FlushInterval)
	defer retry.Stop()
	refused := false
	for {
		err := s.flush(ctx)
		if s.replay.head.Load() == nil {
			return nil
		}
		var cause error
		switch {
		case ctx.Err() != nil:
			cause = errors.Join(err, ctx.Err())
		case reachedAndFailed(err) && refused:
			cause = errors.Join(errOriginDown, err)
		case err != nil && errors.Is(err, region.ErrOriginOpen):
			refused = true
		}
		if cause == nil {
			select {
			case <-ctx.Done():
				cause = errors.Join(err, ctx.Err())
			case <-retry.C:
				continue
			}
		}
		return s.pendingError(cause)
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

// pendingError empties the replay stack and says what it held.
func (s *Service) pendingError(cause error) *PendingError {
	e := &PendingError{Cause: cause}
	for _, c := range s.replay.takeAll(nil) {
		e.Cells++
		e.Unsent += c.own.Load() - c.reported.Load()
		if c.has(flagUnacked) {
			e.Unconfirmed++
		}
	}
	return e
}
