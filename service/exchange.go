package service

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
)

// An exchange is one call to the origin carrying the syncs of one or more
// cells, and the one path every caller takes: a cold or stale cell's
// refresh, the checks waiting on a cell (and batch reservations), and the
// settle loop. It runs in four phases:
//
//   - hold: the caller holds each cell's sync mark (flagSyncing, trySync or
//     awaitSync), so that no two syncs of a cell overlap and the origin's
//     count of this process always matches top;
//   - add: under the cell's mutex, its state becomes a region.Sync (syncOf);
//   - send: one Sync when it carries one cell for the request path (its
//     checks ride on it), one Settle for the settle loop's batches;
//   - land: under each cell's mutex, the caller's land function applies the
//     result or the error, and the cell's sync mark is released.
//
// A stale answer (the origin applied a later sync of this process) cannot
// happen while a cell's syncs are serialized, and lands as errStale.
type exchange struct {
	cells []*cell
	prevs []*cell
	pss   []pendingSync
}

// add builds cur's sync into x (syncOf with limit, keep and want) under
// cur.mu. The caller holds cur's sync mark.
func (s *Service) add(x *exchange, cur, prev *cell, now, limit, keep, want int64) {
	cur.mu.Lock()
	ps := s.syncOf(cur, prev, now, limit, keep, want)
	cur.mu.Unlock()
	x.cells = append(x.cells, cur)
	x.prevs = append(x.prevs, prev)
	x.pss = append(x.pss, ps)
}

// sendOne sends x's only sync with reqs on the request path, within what
// is left of ReadTimeout since start (when the caller began to wait for the
// cell), on a context that keeps parent's values but not its
// cancellation, and counts it in calls: the result, or errStale for a
// stale answer.
func (s *Service) sendOne(parent context.Context, x *exchange, reqs []region.Request, start time.Time, calls *atomic.Int64) (region.SyncResult, error) {
	x.pss[0].sy.Requests = reqs
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), s.cfg.ReadTimeout-time.Since(start))
	res, err := s.origin.Sync(ctx, s.cfg.ID, x.pss[0].sy)
	cancel()
	calls.Add(1)
	s.counters.syncNanos.Add(int64(time.Since(start)))
	if err == nil && res.Stale {
		err = errStale
	}
	return res, err
}

// sendAll sends x's syncs in one Settle call bounded by ctx: one result a
// cell, in order, or the call's error. A stale result is the caller's to
// land (the settle loop sends the cell again).
func (s *Service) sendAll(ctx context.Context, x *exchange) ([]region.SyncResult, error) {
	syncs := make([]region.Sync, len(x.pss))
	for i := range x.pss {
		syncs[i] = x.pss[i].sy
	}
	res, err := s.origin.Settle(ctx, s.cfg.ID, syncs)
	s.counters.settles.Add(1)
	s.counters.settleCells.Add(int64(len(syncs)))
	if err == nil && len(res) != len(syncs) {
		err = fmt.Errorf("origin returned %d results for %d cells", len(res), len(syncs))
	}
	return res, err
}

// land runs f for cell i of x under its mutex, then releases the cell's
// sync mark.
func (x *exchange) land(i int, f func(cur, prev *cell, ps pendingSync)) {
	cur := x.cells[i]
	cur.mu.Lock()
	f(cur, x.prevs[i], x.pss[i])
	cur.mu.Unlock()
	cur.doneSync()
}
