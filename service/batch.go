package service

import (
	"cmp"
	"context"
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
// The batch reserves its costs on the cells' counts while it holds the
// cells' locks and releases the reservations if any query is refused, so a
// single check racing a refused batch may be denied by a reservation that is
// then released: the race errs towards denial, never towards admission.
func (s *Service) Batch(ctx context.Context, qs []Query) (bool, []window.Decision, error) {
	return s.batch(ctx, qs, true)
}

// BatchLocal is Batch deciding from local state at once, as CheckLocal
// does for a check.
func (s *Service) BatchLocal(qs []Query) (bool, []window.Decision, error) {
	return s.batch(context.Background(), qs, false)
}

func (s *Service) batch(ctx context.Context, qs []Query, wait bool) (bool, []window.Decision, error) {
	for i := range qs {
		if err := qs[i].Validate(); err != nil {
			return false, nil, err
		}
	}
	if !s.enter() {
		return false, nil, ErrClosed
	}
	defer s.leave()
	type entry struct {
		cur, prev *cell
		now       int64
	}
	es := make([]entry, len(qs))
	var wg sync.WaitGroup
	for i, q := range qs {
		b, cur, prev, now := s.cells(q)
		es[i] = entry{cur, prev, now}
		if wait && !s.ready(b, cur, prev, now) {
			wg.Go(func() { s.refresh(ctx, cur, prev) })
		}
	}
	wg.Wait()

	// Lock each distinct current cell once, in a global order.
	seen := make(map[*cell]bool, len(es))
	locked := make([]*cell, 0, len(es))
	for _, e := range es {
		if !seen[e.cur] {
			seen[e.cur] = true
			locked = append(locked, e.cur)
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
	// atOrigin[i] holds what the origin said when it reserved q's cost.
	atOrigin := make([]*region.AdmitResult, len(qs))
	refused := -1
	for i, q := range qs {
		e := &es[i]
		d, toOrigin := s.admit(e.cur, e.prev, e.now, q, false, wait)
		if toOrigin {
			d, atOrigin[i] = s.reserveAtOrigin(ctx, e.cur, e.prev, e.now, q)
		}
		ds[i] = d
		if !d.Admitted {
			refused = i // one refusal refuses the batch: reserve nothing more
			break
		}
	}
	if refused < 0 {
		for i, q := range qs {
			switch {
			case atOrigin[i] != nil:
				s.commitAtOrigin(es[i].cur, q, ds[i], *atOrigin[i])
			case q.Cost > 0:
				s.committed(es[i].cur, q, ds[i])
			}
		}
		return true, ds, nil
	}
	for i, q := range qs[:refused] {
		if q.Cost > 0 {
			es[i].cur.count.Add(-q.Cost)
		}
		if atOrigin[i] != nil {
			s.releaseAtOrigin(ctx, es[i].cur, q.Cost)
		}
	}
	// Every other query says whether it would fit on its own: if so, what
	// remains with nothing of the batch counted and no wait; if not, its
	// own wait.
	for i, q := range qs {
		if i == refused {
			continue
		}
		d := s.peekDecision(es[i].cur, es[i].prev, es[i].now, q)
		if d.Admitted {
			look := q
			look.Cost = 0
			d = s.peekDecision(es[i].cur, es[i].prev, es[i].now, look)
			d.RetryAfter = 0
		}
		d.Admitted = false
		ds[i] = d
	}
	return false, ds, nil
}

// reserveAtOrigin reserves q's cost at the origin for a batch (the caller
// holds cur's lock) and, if the origin admitted it, on cur's count too, so
// that the batch's later queries on the cell see it. It returns what the
// origin said, or nil when q was decided locally (the origin failed) or
// refused.
func (s *Service) reserveAtOrigin(ctx context.Context, cur, prev *cell, now int64, q Query) (window.Decision, *region.AdmitResult) {
	most := room(cur, prev, now, q)
	id := cur.identity()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	var (
		res region.AdmitResult
		err error
	)
	if most >= 0 {
		res, err = s.origin.Admit(rctx, s.cfg.ID, region.Admission{Cell: id, Own: cur.own.Load(), Cost: q.Cost,
			Max: most, ExpireAt: id.Expiry(s.cfg.ExpiryGrace.Milliseconds())})
		s.counters.admits.Add(1)
	}
	cancel()
	done := s.nowMs()
	if most < 0 || err != nil {
		if err != nil {
			s.counters.admitErrs.Add(1)
			s.originFailed(cur, done, err)
		}
		d, _ := s.admit(cur, prev, now, q, false, false)
		return d, nil
	}
	in := window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Previous: prev.usage()}
	if !res.Admitted {
		s.counters.admitsRefused.Add(1)
		s.mergeAdmissionLocked(cur, res, done)
		in.Cost, in.Current = q.Cost, cur.usage()
		d := window.Decide(in)
		if d.Admitted {
			d.Admitted, d.RetryAfter = false, max(d.RetryAfter, 1)
		}
		s.denied(cur, now, q, d)
		return d, nil
	}
	cur.count.Add(q.Cost)
	in.Current = cur.usage()
	d := window.Decide(in)
	d.Admitted, d.RetryAfter = true, 0
	return d, &res
}

// commitAtOrigin commits a batch's reservation the origin made: the cost
// becomes this process's own, acknowledged as far as the origin reported.
// The caller holds cur's lock.
func (s *Service) commitAtOrigin(cur *cell, q Query, d window.Decision, res region.AdmitResult) {
	cur.own.Add(q.Cost)
	s.mergeAdmissionLocked(cur, res, s.nowMs())
	s.noteLimit(cur, q.Limit, d.Remaining)
	if s.global != nil {
		s.queueGlobal(cur, q.Limit)
	}
}

// releaseAtOrigin takes back a reservation of a refused batch. If that
// fails, the origin keeps counting it (errs towards denial) until the cell
// expires; it is logged.
func (s *Service) releaseAtOrigin(ctx context.Context, cur *cell, cost int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FlushTimeout)
	defer cancel()
	if err := s.origin.Release(rctx, s.cfg.ID, cur.identity(), cost); err != nil {
		s.counters.releaseErrs.Add(1)
		s.log.Warn("a refused batch's reservation was not taken back from the origin; it counts there until the cell expires",
			"cost", cost, "error", err)
	}
}

// peekDecision applies the rule without counting or side effects.
func (s *Service) peekDecision(cur, prev *cell, now int64, q Query) window.Decision {
	return window.Decide(window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Cost: q.Cost,
		Current: cur.usage(), Previous: prev.usage()})
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
