package service

import (
	"fmt"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Marks returns the reset marks the service decides by: the ones
// Config.Marks named, else its own.
func (s *Service) Marks() *policy.Marks { return s.marks }

// Reset forgets the usage of (workspace, namespace, identifier) for
// duration (policy.AllDurations: every duration), current and previous
// window alike (README, "Reset an identifier"; docs/architecture.md, "Reset"): it records a
// mark at the service's clock (policy.Marks.Reset) and applies it to the
// identifier's cells, and returns the mark to carry to the other replicas.
// The checks that follow count in cells of the mark's epoch, which start
// from zero; the cells it forgot keep what they hold (at the origin too)
// and are never read again. The error wraps policy.ErrInvalid or
// policy.ErrTooMany; a refused reset changes nothing.
func (s *Service) Reset(workspace, namespace, identifier string, duration int64) (policy.Mark, error) {
	m, err := s.marks.Reset(workspace, namespace, identifier, duration, s.nowMs())
	if err != nil {
		return policy.Mark{}, err
	}
	s.forget(m)
	return m, nil
}

// ApplyMarks merges marks received from the other replicas (the bridge, the
// store) into the service's marks, by max, and applies those that raised an
// epoch to the cells they reset. The caller checks them first
// (policy.Mark.CheckAt); an invalid mark merges nothing and is named by the
// error, which wraps policy.ErrInvalid. It returns how many marks raised an
// epoch.
func (s *Service) ApplyMarks(marks ...policy.Mark) (int, error) {
	n, err := s.marks.Merge(marks...)
	if err != nil {
		return 0, fmt.Errorf("apply reset marks: %w", err)
	}
	if n > 0 {
		for _, m := range marks {
			s.forget(m)
		}
	}
	return n, nil
}

// PruneMarks forgets the reset marks that expired at now (policy.Marks.Prune
// with graceMs). A mark of every duration that expires stays as a mark of
// each duration the table holds buckets of for its identifier whose cells
// the reset still concerns; those marks are returned, for the other
// replicas. A table of more than maxDurations durations is walked once
// for all the marks that expire.
func (s *Service) PruneMarks(now, graceMs int64) []policy.Mark {
	var walked map[bucketKey][]int64 // identifier (duration 0) → durations, from one walk
	inUse := func(workspace, namespace, identifier string) []int64 {
		k := bucketKey{workspace: workspace, namespace: namespace, identifier: identifier}
		if ds, ok := s.table.durations(); ok {
			var out []int64
			for _, d := range ds {
				k.duration = d
				if s.table.load(k) != nil {
					out = append(out, d)
				}
			}
			return out
		}
		if walked == nil {
			walked = make(map[bucketKey][]int64)
			for b := range s.table.all {
				id := b.key
				id.duration = 0
				walked[id] = append(walked[id], b.key.duration)
			}
		}
		return walked[k]
	}
	_, kept := s.marks.Prune(now, graceMs, inUse)
	return kept
}

// forget brings the buckets a mark resets up to the epoch the marks now
// give them. A mark of one duration names one bucket; a mark of every
// duration names one bucket for each duration the table has made buckets
// of (a handful in practice), so a mark costs the buckets it touches,
// however many buckets the table holds; only past maxDurations distinct
// durations does it walk the table. A check of a bucket made meanwhile
// reads the marks when it makes its cells (syncEpoch).
func (s *Service) forget(m policy.Mark) {
	k := bucketKey{workspace: m.Workspace, namespace: m.Namespace, identifier: m.Identifier}
	ds, ok := []int64{m.Duration}, true
	if m.Duration == policy.AllDurations {
		ds, ok = s.table.durations()
	}
	if ok {
		for _, d := range ds {
			k.duration = d
			if b := s.table.load(k); b != nil {
				s.raiseEpoch(b, s.marks.Epoch(m.Workspace, m.Namespace, m.Identifier, d))
			}
		}
		return
	}
	for b := range s.table.all {
		if k := &b.key; k.identifier == m.Identifier && k.namespace == m.Namespace && k.workspace == m.Workspace {
			s.raiseEpoch(b, s.marks.Epoch(k.workspace, k.namespace, k.identifier, k.duration))
		}
	}
}

// syncEpoch brings b up to the epoch its key's marks give, before a check
// makes a cell in it: a bucket made after a reset (or one the reset's walk
// of the table missed, being made meanwhile) learns it there.
func (s *Service) syncEpoch(b *bucket) {
	k := &b.key
	if e := s.marks.Epoch(k.workspace, k.namespace, k.identifier, k.duration); e > b.epoch.Load() {
		s.raiseEpoch(b, e)
	}
}

// raiseEpoch raises b's reset epoch to e and takes the cells the reset
// forgot out of their slots: what one holds for the origin (a lease,
// admissions not reported) stays on the settle stack, which gives it back
// (settleAction), as for the janitor's dropped cells. The strict deadline,
// the firm denial counts and the rate estimate describe forgotten usage:
// they go too.
func (s *Service) raiseEpoch(b *bucket, e int64) {
	if !raiseTo(&b.epoch, e) {
		return
	}
	d := b.key.duration
	for i := range b.cells {
		if c := b.cells[i].Load(); c != nil && c.forgotten() {
			b.cells[i].CompareAndSwap(c, nil)
		}
	}
	b.strictUntil.Store(0)
	b.firm.Store(nil)
	b.rate.Store(0)
	b.obsSeq.Store(0)
	b.obsUsed.Store(0)
	b.obsAt.Store(0)
	s.cfg.Logger.Debug("reset applied", "workspace", b.key.workspace, "namespace", b.key.namespace,
		"duration", d, "epoch", e)
}

// forgottenImport reports whether the marks forgot the cell c an import is
// for: its epoch is below the one they name for its window
// (policy.Forgotten, the rule cellFor makes cells by). No cell of its epoch
// will be made for that window, so the import can be dropped before any
// cell of its window exists (an import for a later window).
func (s *Service) forgottenImport(c window.Cell) bool {
	return policy.Forgotten(s.marks.Epoch(c.Workspace, c.Namespace, c.Identifier, c.Duration), c.Duration, c.Sequence, c.Epoch)
}
