package service

import (
	"cmp"
	"context"
	"slices"
	"sync"

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
	ok := true
	for i, q := range qs {
		ds[i] = s.reserve(es[i].cur, es[i].prev, es[i].now, q)
		ok = ok && ds[i].Admitted
	}
	if ok {
		for i, q := range qs {
			if q.Cost > 0 {
				s.committed(es[i].cur, q, ds[i])
			}
		}
		return true, ds, nil
	}
	for i, q := range qs {
		if ds[i].Admitted && q.Cost > 0 {
			es[i].cur.count.Add(-q.Cost)
		}
	}
	for i, q := range qs {
		if !ds[i].Admitted {
			continue
		}
		// Report what remains with nothing of the batch counted.
		look := q
		look.Cost = 0
		d := s.peekDecision(es[i].cur, es[i].prev, es[i].now, look)
		d.Admitted = false
		ds[i] = d
	}
	return false, ds, nil
}

// reserve decides q and, when admitted, adds its cost to the cell's count
// only: the caller commits (replay, publish) or releases it.
func (s *Service) reserve(cur, prev *cell, now int64, q Query) window.Decision {
	return s.admit(cur, prev, now, q, false)
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
