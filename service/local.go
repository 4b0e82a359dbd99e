package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// What a limiter admits without the origin (it failed, its breaker is
// open, too many checks wait) exists, until the origin answers again, only
// in this process: a SIGKILL would lose it, and the region would go on
// below what it admitted. So every such admission raises the cell's local
// count (localCounts), which is published to the region's other limiters
// before the decision is returned (LocalPublisher); each of them keeps what
// it receives (localRecords) and raises the origin to it as soon as the
// origin answers (flushLocals), while this process's own syncs carry the
// same count (region.Sync.Local). The origin keeps the largest count per
// process, so two paths telling the same admissions count them once
// (docs/architecture.md, "Local counts").

// LocalPublisher sends a limiter's local count of a cell to the region's
// other limiters.
type LocalPublisher interface {
	// PublishLocal sends that the process named id has admitted count in
	// cell c without the origin (a total, never less than it sent
	// before); the cell stops mattering at expireAt (unix ms). It is
	// called on the check's path before its decision is returned, so it
	// must not wait: it hands the record to the connection the decision
	// is answered on, which then sends it first.
	PublishLocal(c window.Cell, id string, count, expireAt int64)
}

// localCounts tracks, per cell, the cost this process admitted without the
// origin (total, for as long as the cell lives here: region.Sync.Local)
// and how much of it the origin is known to count (confirmed). A cell's
// entry stays until its window no longer weighs in a decision (drop): a
// total that restarted from zero would hide admissions behind what the
// origin already holds for this process.
type localCounts struct {
	mu sync.Mutex
	m  map[*cell]*localCount
	n  atomic.Int64 // cells whose total is not all confirmed, read without the lock
	// size is len(m), read without the lock.
	size atomic.Int64
}

type localCount struct{ total, confirmed int64 }

// add adds cost to c's total and returns the new total.
func (l *localCounts) add(c *cell, cost int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[c]
	if e == nil {
		e = &localCount{}
		l.m[c] = e
		l.size.Store(int64(len(l.m)))
	}
	if e.total == e.confirmed {
		l.n.Add(1)
	}
	e.total = window.AddCounts(e.total, cost)
	return e.total
}

// get returns c's total and the part of it the origin is not known to
// count.
func (l *localCounts) get(c *cell) (total, unconfirmed int64) {
	if l.size.Load() == 0 {
		return 0, 0 // the common case: the origin never failed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[c]; e != nil {
		return e.total, e.total - e.confirmed
	}
	return 0, 0
}

// pending returns the part of c's total the origin is not known to count.
func (l *localCounts) pending(c *cell) int64 {
	if l.n.Load() == 0 {
		return 0
	}
	_, u := l.get(c)
	return u
}

// confirm records that the origin counts v of c's total (region.SyncResult.Local).
func (l *localCounts) confirm(c *cell, v int64) {
	if l.n.Load() == 0 {
		return // nothing unconfirmed: the common case
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[c]
	if e == nil || v <= e.confirmed {
		return
	}
	was := e.total > e.confirmed
	e.confirmed = min(v, e.total)
	if was && e.total == e.confirmed {
		l.n.Add(-1)
	}
}

// drop forgets the cells whose window no longer weighs in a decision at
// now (their origin keys expire: nothing more can be told of them).
func (l *localCounts) drop(now, grace int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, e := range l.m {
		if window.Following(c.seq, c.b.key.duration)+grace <= now {
			if e.total > e.confirmed {
				l.n.Add(-1)
			}
			delete(l.m, c)
		}
	}
	l.size.Store(int64(len(l.m)))
}

// localRecords holds the local counts the region's other limiters
// published, merged by max, until the origin holds them (flushLocals).
type localRecords struct {
	mu sync.Mutex
	m  map[localKey]localRecord
	n  atomic.Int64 // len(m), read without the lock
}

type localKey struct {
	cell window.Cell
	id   string
}

type localRecord struct{ count, expireAt int64 }

// maxLocalRecords bounds localRecords: a record is kept per cell and
// process that decided without the origin, for as long as the origin
// fails; past it new records are refused and counted.
const maxLocalRecords = 1 << 16

// ApplyLocals keeps the local counts the region's other limiters published
// (each a global.Component whose Region is the publishing process's
// region.Sync.LocalID, and Count its total), until the origin holds them:
// the next settle round raises the origin to them, and rounds after a
// failure try again until the origin takes them or their cells expire.
// This process's own records are skipped (its syncs carry them); records
// stamped further than MaxClockSkew from this host's clock, or that fail
// global.Component.Check, are refused and counted (Refused). Without an
// origin it does nothing.
func (s *Service) ApplyLocals(ls []global.Component, sentAt int64) {
	if s.origin == nil {
		return
	}
	now := s.nowMs()
	if err := global.CheckSentAt(sentAt, now, s.cfg.MaxClockSkew); err != nil {
		s.refuse("limiters", len(ls), err)
		return
	}
	r := &s.others
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range ls {
		if c.Region == s.localID {
			continue
		}
		if err := errors.Join(c.Check(now, s.cfg.MaxClockSkew), region.CheckLocalID(c.Region)); err != nil {
			s.refuse("limiters", 1, err)
			continue
		}
		if c.Cell.Sequence < window.Sequence(now, c.Cell.Duration)-1 || c.Count == 0 {
			continue // no longer weighs in any decision
		}
		k := localKey{c.Cell, c.Region}
		old, ok := r.m[k]
		if !ok && len(r.m) >= maxLocalRecords {
			s.refuse("limiters", 1, fmt.Errorf("%w: %d local counts wait for the origin already", global.ErrInvalid, maxLocalRecords))
			continue
		}
		r.m[k] = localRecord{count: max(c.Count, old.count), expireAt: max(c.ExpireAt, old.expireAt)}
	}
	r.n.Store(int64(len(r.m)))
}

// flushLocals raises the origin to the local counts other limiters
// published (ApplyLocals) and forgets those it took; on error they wait
// for the next round. It drops the records whose cells no longer weigh in
// a decision at now.
func (s *Service) flushLocals(ctx context.Context, now int64) error {
	r := &s.others
	if r.n.Load() == 0 {
		return nil
	}
	r.mu.Lock()
	byCell := make(map[window.Cell]int, len(r.m))
	var out []region.Imported
	sent := make(map[localKey]int64, len(r.m))
	for k, v := range r.m {
		if k.cell.Sequence < window.Sequence(now, k.cell.Duration)-1 || v.expireAt <= now {
			delete(r.m, k)
			continue
		}
		i, ok := byCell[k.cell]
		if !ok {
			i = len(out)
			byCell[k.cell] = i
			out = append(out, region.Imported{Cell: k.cell, ExpireAt: v.expireAt})
		}
		out[i].Locals = append(out[i].Locals, region.LocalCount{ID: k.id, Count: v.count})
		out[i].ExpireAt = max(out[i].ExpireAt, v.expireAt)
		sent[k] = v.count
	}
	r.n.Store(int64(len(r.m)))
	r.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
	err := s.origin.Import(actx, out)
	cancel()
	if err != nil {
		s.counters.LocalRaiseErrors.Add(1)
		return fmt.Errorf("raise the origin to %d cells' local counts of other limiters: %w", len(out), err)
	}
	s.counters.LocalsRaised.Add(int64(len(sent)))
	r.mu.Lock()
	for k, c := range sent {
		if v, ok := r.m[k]; ok && v.count <= c {
			delete(r.m, k)
		}
	}
	r.n.Store(int64(len(r.m)))
	r.mu.Unlock()
	return nil
}
