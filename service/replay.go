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
}

// push queues c unless it is queued already.
func (r *replayStack) push(c *cell) {
	if c.queued.Load() || !c.queued.CompareAndSwap(false, true) {
		return
	}
	for {
		h := r.head.Load()
		c.next = h
		if r.head.CompareAndSwap(h, c) {
			return
		}
	}
}

// popAll empties the stack and returns its cells, clearing their queued flag
// so that later admissions queue them again.
func (r *replayStack) popAll() []*cell {
	var out []*cell
	for c := r.head.Swap(nil); c != nil; {
		next := c.next
		c.next = nil
		out = append(out, c)
		c = next
	}
	for _, c := range out {
		c.queued.Store(false)
	}
	return out
}

// queueReplay records admitted cost for replay; a local-only service keeps
// no pending cost.
func (s *Service) queueReplay(c *cell, cost int64) {
	if s.origin == nil {
		return
	}
	c.pending.Add(cost)
	s.replay.push(c)
}

func (s *Service) replayLoop() {
	defer s.loops.Done()
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_ = s.flush(context.Background())
		}
	}
}

// flush replays every queued cell's pending cost to origin, FlushBatch cells
// per call and FlushWorkers calls at once, and returns when all calls ended.
// Cells whose call failed keep their cost and are queued again.
func (s *Service) flush(ctx context.Context) error {
	cells := s.replay.popAll()
	if len(cells) == 0 {
		return nil
	}
	var (
		wg     sync.WaitGroup
		sem    = make(chan struct{}, s.cfg.FlushWorkers)
		errMu  sync.Mutex
		errOut error
	)
	batch := make([]*cell, 0, min(len(cells), s.cfg.FlushBatch))
	deltas := make([]region.Delta, 0, cap(batch))
	send := func() {
		if len(batch) == 0 {
			return
		}
		bc, bd := batch, deltas
		batch = make([]*cell, 0, cap(batch))
		deltas = make([]region.Delta, 0, cap(batch))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.apply(ctx, bc, bd); err != nil {
				errMu.Lock()
				errOut = err
				errMu.Unlock()
			}
		}()
	}
	grace := s.cfg.ExpiryGrace.Milliseconds()
	for _, c := range cells {
		c.mu.Lock() // no batch holds an uncommitted reservation in pending
		d := c.pending.Swap(0)
		c.mu.Unlock()
		if d == 0 {
			continue
		}
		id := c.identity()
		batch = append(batch, c)
		deltas = append(deltas, region.Delta{Cell: id, Delta: d, ExpireAt: region.ExpireAt(id, grace)})
		if len(batch) == s.cfg.FlushBatch {
			send()
		}
	}
	send()
	wg.Wait()
	return errOut
}

// apply sends one replay call and merges the totals it returns, or gives the
// cost back to the cells when it fails.
func (s *Service) apply(ctx context.Context, cells []*cell, deltas []region.Delta) error {
	actx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
	totals, err := s.origin.Apply(actx, deltas)
	cancel()
	if err == nil && len(totals) != len(deltas) {
		err = fmt.Errorf("origin returned %d totals for %d deltas", len(totals), len(deltas))
	}
	if err != nil {
		for i, c := range cells {
			c.pending.Add(deltas[i].Delta)
			s.replay.push(c)
		}
		s.log.Debug("replay failed; cost kept for the next try", "cells", len(cells), "error", err)
		return fmt.Errorf("replay %d cells: %w", len(cells), err)
	}
	now := s.nowMs()
	for i, c := range cells {
		c.mu.Lock()
		c.merge(totals[i], now)
		c.mu.Unlock()
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
			n := len(s.replay.popAll())
			return fmt.Errorf("%w: %d cells: %w", errPending, n, errors.Join(err, ctx.Err()))
		case <-retry.C:
		}
	}
}
