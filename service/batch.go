package service

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Batch decides qs all or nothing: either every query is admitted and every
// cost is counted, or none is counted. It reports whether the batch was
// admitted and one decision per query, in order. When the batch is refused,
// every decision has Admitted false; those that would have fit on their own
// have RetryAfter 0 and Remaining as if nothing were counted, and the ones
// that did not fit carry their own RetryAfter.
//
// With an origin, the batch first reserves each cell's cost — from this
// process's lease, or granted by the origin into a reservation — and counts
// it only once every cell is reserved; a refused batch gives the
// reservations back to the lease. Reservations never enter the counts that
// are published or reported as admitted, so a refused batch leaves no trace
// beyond a lease given back later. A single check racing a batch may find
// the lease taken by a reservation that is then given back: the race errs
// towards the origin deciding, never towards admission.
//
// The overrides apply to each query (qs itself is left as it is); a query
// in shadow mode is decided as if enforced, so a batch that only shadow
// queries' denials refuse counts nothing, and its decisions say Shadow
// where the reply turns the refusal into a success.
func (s *Service) Batch(ctx context.Context, qs []Query) (bool, []Decision, error) {
	return s.batch(ctx, qs, true)
}

// BatchLocal is Batch deciding from local state at once, as CheckLocal
// does for a check.
func (s *Service) BatchLocal(qs []Query) (bool, []Decision, error) {
	return s.batch(context.Background(), qs, false)
}

// batchEntry is one query's cells.
type batchEntry struct {
	b         *bucket
	cur, prev *cell
	now       int64
}

// batchCell is one distinct current cell of a batch and what the batch
// reserves in it.
type batchCell struct {
	e        *batchEntry
	first    int // the first query on the cell
	cost     int64
	reserved bool
	denied   *waiter // the origin's answer when it denied the reservation
}

func (s *Service) batch(ctx context.Context, qs []Query, wait bool) (bool, []Decision, error) {
	qs = slices.Clone(qs)
	for i := range qs {
		if err := qs[i].Validate(); err != nil {
			return false, nil, err
		}
		if qs[i].Charge != window.ChargeAll {
			return false, nil, fmt.Errorf("%w: check %d charges %v: a batch is all or nothing, so its checks charge all", ErrInvalidQuery, i, qs[i].Charge)
		}
		s.police(&qs[i], nil)
	}
	ok, wds, err := s.batchPoliced(ctx, qs, wait)
	if err != nil {
		return false, nil, err
	}
	ds := make([]Decision, len(wds))
	for i := range wds {
		ds[i] = s.decided(&qs[i], nil, wds[i])
	}
	return ok, ds, nil
}

// batchPoliced is batch for valid queries with the overrides applied. It
// runs in phases: gather each query's cells; decide locally when the
// origin cannot be waited on; refresh the views a denial would read
// (refreshForDenial); refuse at once what the region's known admissions
// deny (batchByView); reserve every cell's cost, from its lease or at the
// origin (reserve); then refuse (refuse) or commit (commit) the batch.
func (s *Service) batchPoliced(ctx context.Context, qs []Query, wait bool) (bool, []window.Decision, error) {
	if !s.enter() {
		return false, nil, ErrClosed
	}
	defer s.leave()
	es := make([]batchEntry, len(qs))
	local := s.origin == nil || !wait
	stalled := -1
	for i, q := range qs {
		b, cur, prev, now := s.cellsFrom(q, nil)
		es[i] = batchEntry{b, cur, prev, now}
		local = local || s.failing(b, now)
		if stalled < 0 && q.Cost > 0 && s.stalled(b, now) {
			stalled = i
		}
	}
	if local {
		return s.batchLocal(qs, es)
	}
	if stalled >= 0 {
		// A late origin call for one of its identifiers: refused, as a
		// check of it would be (stalled).
		e := &es[stalled]
		return false, s.refusedDecisions(qs, es, stalled, s.retryDenial(e.cur, e.prev, e.now, qs[stalled])), nil
	}
	s.refreshForDenial(ctx, qs, es)
	if refused, ds := s.batchByView(qs, es); refused >= 0 {
		return false, ds, nil
	}
	r := s.reserve(ctx, qs, es)
	if r.refused() {
		return s.refuseBatch(qs, es, r)
	}
	return true, s.commit(qs, es, r), nil
}

// refreshForDenial refreshes, in parallel, the cells whose view is not
// fresh enough for a denial, where a query only looks or the stale view
// would deny it.
func (s *Service) refreshForDenial(ctx context.Context, qs []Query, es []batchEntry) {
	var wg sync.WaitGroup
	for i, q := range qs {
		e := &es[i]
		if !s.ready(e.b, e.cur, e.prev, e.now, &q) && (q.Cost == 0 || !s.peekDecision(e.cur, e.prev, e.now, q).Admitted) {
			wg.Go(func() { s.refresh(ctx, e.cur, e.prev) })
		}
	}
	wg.Wait()
}

// reservation is what reserving a batch's cells came to.
type reservation struct {
	cells  []*batchCell
	byCell map[*cell]*batchCell
	// failed: the origin failed for some cell; denied: it denied some
	// cell's reservation; gaveUp: the first query whose reservation the
	// caller gave up on while the origin answers (-1: none).
	failed, denied bool
	gaveUp         int
}

// refused reports whether the batch cannot be admitted as reserved.
func (r *reservation) refused() bool { return r.failed || r.denied || r.gaveUp >= 0 }

// reserve reserves each cell's summed cost: from its lease, or at the
// origin (a Reserve request through the cell's queue), the cells in
// parallel.
func (s *Service) reserve(ctx context.Context, qs []Query, es []batchEntry) *reservation {
	r := &reservation{byCell: make(map[*cell]*batchCell, len(qs)), gaveUp: -1}
	for i, q := range qs {
		if q.Cost == 0 {
			continue
		}
		bc := r.byCell[es[i].cur]
		if bc == nil {
			bc = &batchCell{e: &es[i], first: i}
			r.byCell[es[i].cur] = bc
			r.cells = append(r.cells, bc)
		}
		bc.cost += q.Cost
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, bc := range r.cells {
		if s.reserveFromLease(bc) {
			continue
		}
		wg.Go(func() {
			q := Query{Workspace: bc.e.b.key.workspace, Namespace: bc.e.b.key.namespace, Identifier: bc.e.b.key.identifier,
				Duration: bc.e.b.key.duration, Limit: qs[bc.first].Limit, Cost: bc.cost}
			w := s.await(ctx, bc.e.cur, bc.e.prev, q, true)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case w.failed && (w.pended.Load() || (w.gaveUp || w.slow) && !s.failing(bc.e.b, s.nowMs())):
				if r.gaveUp < 0 || bc.first < r.gaveUp {
					r.gaveUp = bc.first
				}
			case w.failed:
				r.failed = true
			case w.outcome == region.Granted:
				bc.reserved = true
			default:
				bc.denied, r.denied = w, true
			}
		})
	}
	wg.Wait()
	return r
}

// refuseBatch gives back what r reserved and refuses the batch: with the
// decision of the query its caller gave up on (never decided from this
// process's counts, which miss what other limiters hold, as for a single
// check), locally if the origin failed (as it would decide while down), or
// with the origin's denial.
func (s *Service) refuseBatch(qs []Query, es []batchEntry, r *reservation) (bool, []window.Decision, error) {
	for _, bc := range r.cells {
		if bc.reserved {
			s.giveBack(bc)
		}
	}
	switch {
	case r.gaveUp >= 0:
		e := &es[r.gaveUp]
		return false, s.refusedDecisions(qs, es, r.gaveUp, s.retryDenial(e.cur, e.prev, e.now, qs[r.gaveUp])), nil
	case r.failed:
		return s.batchLocal(qs, es)
	}
	return false, s.refusedByOrigin(qs, es, r.byCell), nil
}

// commit counts a batch whose every cell is reserved and returns each
// query's decision, with the batch's earlier costs on its cell counted.
func (s *Service) commit(qs []Query, es []batchEntry, r *reservation) []window.Decision {
	// Per cell: the batch's earlier costs there, less all it counts there.
	added := make(map[*cell]int64, len(r.cells))
	for _, bc := range r.cells {
		c := bc.e.cur
		c.mu.Lock()
		c.held.Add(-bc.cost)
		c.count.Add(bc.cost)
		c.mu.Unlock()
		added[c] = -bc.cost
	}
	ds := make([]window.Decision, len(qs))
	for i, q := range qs {
		e := &es[i]
		before := e.cur.count.Load() + added[e.cur]
		d := window.Decide(q.input(e.now, e.cur.usageWith(max(before, 0)), e.prev.usage()))
		d.Admitted, d.RetryAfter = true, 0
		added[e.cur] += q.Cost
		ds[i] = d
		if q.Cost > 0 {
			s.committed(e.cur, q, d)
		}
	}
	return ds
}

// batchByView applies the rule to each query in order, with the batch's
// earlier costs on the same cell counted, against what the region is known
// to have admitted. It returns the first query it denies (-1: none) and, if
// one, the refused batch's decisions.
func (s *Service) batchByView(qs []Query, es []batchEntry) (int, []window.Decision) {
	added := make(map[*cell]int64, len(qs))
	for i, q := range qs {
		e := &es[i]
		d := window.Decide(q.input(e.now, window.AddCounts(e.cur.usage(), added[e.cur]), e.prev.usage()))
		if !d.Admitted {
			s.denied(e.cur, e.now, q, d)
			return i, s.refusedDecisions(qs, es, i, d)
		}
		added[e.cur] += q.Cost
	}
	return -1, nil
}

// refusedByOrigin returns the decisions of a batch whose reservation the
// origin denied: the query that caused it is the first one, on a denied
// cell, that the origin's counts (with the batch's earlier costs there) do
// not admit; or the last query on that cell.
func (s *Service) refusedByOrigin(qs []Query, es []batchEntry, byCell map[*cell]*batchCell) []window.Decision {
	added := make(map[*cell]int64, len(qs))
	cause, causeD := -1, window.Decision{}
	for i, q := range qs {
		e := &es[i]
		bc := byCell[e.cur]
		if q.Cost == 0 || bc == nil || bc.denied == nil {
			continue
		}
		d := window.Decide(q.input(e.now,
			window.AddCounts(e.cur.usageWith(max(bc.denied.firm, e.cur.count.Load())), added[e.cur]),
			e.prev.usageWith(max(bc.denied.firmPrev, e.prev.count.Load()))))
		added[e.cur] += q.Cost
		if !d.Admitted || added[e.cur] == bc.cost {
			cause, causeD = i, d
			if !d.Admitted {
				break
			}
		}
	}
	if causeD.Admitted { // together, not alone: the origin's answer says when
		causeD = byCell[es[cause].cur].denied.d
	}
	return s.refusedDecisions(qs, es, cause, causeD)
}

// refusedDecisions returns a refused batch's decisions: refused's own
// denial d, and for every other query whether it would fit on its own: if
// so, what remains with nothing of the batch counted and no wait; if not,
// its own wait.
func (s *Service) refusedDecisions(qs []Query, es []batchEntry, refused int, d window.Decision) []window.Decision {
	ds := make([]window.Decision, len(qs))
	d.Admitted = false
	ds[refused] = d
	for i, q := range qs {
		if i == refused {
			continue
		}
		e := &es[i]
		d := s.peekDecision(e.cur, e.prev, e.now, q)
		if d.Admitted {
			d = s.peekLook(e.cur, e.prev, e.now, q)
			d.RetryAfter = 0
		}
		d.Admitted = false
		ds[i] = d
	}
	return ds
}

// reserveFromLease reserves bc's cost from the cell's lease if it is live
// and covers it.
func (s *Service) reserveFromLease(bc *batchCell) bool {
	c := bc.e.cur
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.spend(s.nowMs(), bc.cost) {
		return false
	}
	c.held.Add(bc.cost)
	bc.reserved = true
	return true
}

// giveBack returns a refused batch's reservation to the cell's lease; the
// settle loop spends or returns it.
func (s *Service) giveBack(bc *batchCell) {
	c := bc.e.cur
	c.mu.Lock()
	c.held.Add(-bc.cost)
	c.avail.Add(bc.cost)
	if c.leaseUntil.Load() <= s.nowMs() {
		c.leaseUntil.Store(s.nowMs() + s.leaseFor) // the origin holds it live from the grant on
	}
	c.mu.Unlock()
	s.settle.push(c)
}

// batchLocal decides a batch from local state: without an origin (the
// cells are the only copy), or while the origin fails. It locks each
// distinct current cell in a global order and reserves each query's cost
// on the cell's count by compare-and-swap, first in held so the reservation
// is never published; the first refusal releases every reservation.
func (s *Service) batchLocal(qs []Query, es []batchEntry) (bool, []window.Decision, error) {
	seen := make(map[*cell]bool, len(es))
	locked := make([]*cell, 0, len(es))
	for i := range es {
		if c := es[i].cur; !seen[c] {
			seen[c] = true
			locked = append(locked, c)
		}
	}
	slices.SortFunc(locked, compareCells)
	for _, c := range locked {
		c.mu.Lock()
	}
	defer func() {
		for _, c := range locked {
			c.mu.Unlock()
		}
	}()
	ds := make([]window.Decision, len(qs))
	refused := -1
walk:
	for i, q := range qs {
		e := &es[i]
		in := q.input(e.now, 0, e.prev.usage())
		for {
			c := e.cur.count.Load()
			in.Current = e.cur.usageWith(c)
			if ds[i] = window.Decide(in); !ds[i].Admitted {
				s.denied(e.cur, e.now, q, ds[i])
				refused = i
				break walk
			}
			if q.Cost == 0 {
				break
			}
			e.cur.held.Add(q.Cost)
			if e.cur.count.CompareAndSwap(c, c+q.Cost) {
				break
			}
			e.cur.held.Add(-q.Cost)
		}
	}
	if refused < 0 {
		for i, q := range qs {
			if q.Cost == 0 {
				continue
			}
			c := es[i].cur
			c.held.Add(-q.Cost)
			if s.origin != nil {
				s.admittedLocally(c, q.Cost)
			}
			s.committed(c, q, ds[i])
		}
		return true, ds, nil
	}
	for i, q := range qs[:refused] {
		if q.Cost > 0 {
			es[i].cur.count.Add(-q.Cost)
			es[i].cur.held.Add(-q.Cost)
		}
	}
	return false, s.refusedDecisions(qs, es, refused, ds[refused]), nil
}

// peekDecision applies the rule without counting or side effects.
func (s *Service) peekDecision(cur, prev *cell, now int64, q Query) window.Decision {
	return window.Decide(q.input(now, cur.usage(), prev.usage()))
}

// peekLook is peekDecision for a look at q's cells: what the limit has
// left, nothing charged.
func (s *Service) peekLook(cur, prev *cell, now int64, q Query) window.Decision {
	q.Cost = 0
	return s.peekDecision(cur, prev, now, q)
}

func compareCells(a, b *cell) int {
	ka, kb := &a.b.key, &b.b.key
	return cmp.Or(
		cmp.Compare(ka.workspace, kb.workspace),
		cmp.Compare(ka.namespace, kb.namespace),
		cmp.Compare(ka.identifier, kb.identifier),
		cmp.Compare(ka.duration, kb.duration),
		cmp.Compare(a.seq, b.seq),
	)
}
