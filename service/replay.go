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
	if len(cells) == 0 {
		return nil
	}
	now := s.nowMs()
	far := s.cfg.FarFlushInterval.Milliseconds()
	var (
		wg     sync.WaitGroup
		sem    = make(chan struct{}, s.cfg.FlushWorkers)
		errMu  sync.Mutex
		errOut error
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
				errOut = err
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
	return errOut
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
		if s.global != nil {
			s.queueGlobal(c, 0)
		}
	}
	return nil
}

// errPending is returned by Close when cost could not be replayed in time.
var errPending = errors.New("pending cost not replayed")

// drain replays until nothing is pending or ctx ends.
func (s *Service) drain(ctx context.Context) error {
	retry := time.NewTicker(s.cfg.FlushInterval)
	defer retry.Stop()
	for {
		err := s.flush(ctx)
		if s.replay.head.Load() == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			n := len(s.replay.takeAll(nil))
			return fmt.Errorf("%w: %d cells: %w", errPending, n, errors.Join(err, ctx.Err()))
		case <-retry.C:
		}
	}
}
