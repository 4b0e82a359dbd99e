package service

import (
	"context"
	"fmt"
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
//   - step: under the cell's mutex, its state becomes a region.Sync
//     (syncOf), the cell's step of the exchange;
//   - send: one Sync for one step on the request path (its checks ride on
//     it: sendOne), one Settle for the settle loop's batches (sendAll);
//   - land: under each cell's mutex, the caller's function applies the
//     result or the error, and the cell's sync mark is released.
//
// A stale answer (the origin applied a later sync of this process) cannot
// happen while a cell's syncs are serialized, and lands as errStale.
type syncStep struct {
	cur, prev *cell
	ps        pendingSync
}

// step builds cur's step of an exchange (syncOf with r, keep and want)
// under cur.mu. The caller holds cur's sync mark.
func (s *Service) step(cur, prev *cell, now int64, r rule, keep, want int64) syncStep {
	cur.mu.Lock()
	defer cur.mu.Unlock()
	return syncStep{cur: cur, prev: prev, ps: s.syncOf(cur, prev, now, r, keep, want)}
}

// sendOne sends st with reqs on the request path, within what is left of
// ReadTimeout since start (when the caller began to wait for the cell),
// under parent (which its callers do not cancel: the call's result is the
// cell's, whoever waits on it): the result, or errStale for a stale
// answer.
func (s *Service) sendOne(parent context.Context, st *syncStep, reqs []region.Request, start time.Time) (region.SyncResult, error) {
	st.ps.sy.Requests = reqs
	ctx, cancel := context.WithTimeout(parent, s.cfg.ReadTimeout-time.Since(start))
	res, err := s.origin.Sync(ctx, s.cfg.ID, st.ps.sy)
	cancel()
	s.counters.OriginSyncs.Add(1)
	s.counters.OriginSyncTime.Add(int64(time.Since(start)))
	if err == nil && res.Stale {
		err = errStale
	}
	return res, err
}

// sendAll sends steps in one Settle call bounded by ctx: one result a
// step, in order, or the call's error. A stale result is the caller's to
// land (the settle loop sends the cell again).
func (s *Service) sendAll(ctx context.Context, steps []syncStep) ([]region.SyncResult, error) {
	syncs := make([]region.Sync, len(steps))
	for i := range steps {
		syncs[i] = steps[i].ps.sy
	}
	res, err := s.origin.Settle(ctx, s.cfg.ID, syncs)
	s.counters.Settles.Add(1)
	s.counters.SettleCells.Add(int64(len(syncs)))
	if err == nil && len(res) != len(syncs) {
		err = fmt.Errorf("origin returned %d results for %d cells", len(res), len(syncs))
	}
	return res, err
}

// land runs f for st's cell under its mutex, then releases the cell's sync
// mark.
func (st *syncStep) land(f func(cur, prev *cell, ps pendingSync)) {
	st.cur.mu.Lock()
	f(st.cur, st.prev, st.ps)
	st.cur.mu.Unlock()
	st.cur.doneSync()
}
