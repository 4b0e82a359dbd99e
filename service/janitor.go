package service

import "time"

// every runs f every d until the service stops, then runs last (if any).
func (s *Service) every(d time.Duration, f, last func()) {
	defer s.loops.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			if last != nil {
				last()
			}
			return
		case <-t.C:
			f()
		}
	}
}

func (s *Service) janitorTick() {
	s.sweep()
	s.sweepEarly(s.nowMs())
}

// sweep drops cells older than the previous window (they can no longer
// affect a decision) and buckets left with no cells and no strict mode, so
// memory follows active cells, not history. A dropped cell with pending cost
// stays on the settle stack until it is settled.
func (s *Service) sweep() (cells, buckets int) {
	for b := range s.table.all {
		now := s.nowMs()
		seq := now / b.key.duration
		for i := range b.cells {
			if c := b.cells[i].Load(); c != nil && c.seq < seq-1 && b.cells[i].CompareAndSwap(c, nil) {
				cells++
			}
		}
		if !b.empty() || b.strictUntil.Load() > now {
			continue
		}
		// A check installs its cell, then reads dead; the janitor sets dead,
		// then reads the cells. One of the two always sees the other.
		b.dead.Store(true)
		if b.empty() {
			s.table.remove(b)
			buckets++
		} else {
			b.dead.Store(false)
		}
	}
	return cells, buckets
}

func (b *bucket) empty() bool {
	return b.cells[0].Load() == nil && b.cells[1].Load() == nil
}
