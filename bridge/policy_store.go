package bridge

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// PrepareOverrides validates es and returns them sorted by key with one
// entry per key, the one policy.Compare orders last (the merge's winner),
// for a store to write in key order. It returns an error, and nothing, if
// any entry is invalid.
func PrepareOverrides(es []policy.Entry) ([]policy.Entry, error) {
	for i, e := range es {
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("override %d: %w", i, err)
		}
	}
	out := slices.Clone(es)
	slices.SortFunc(out, func(a, b policy.Entry) int {
		if c := compareKeys(a.Key, b.Key); c != 0 {
			return c
		}
		return policy.Compare(a, b)
	})
	// Keep the last (the winner) of each key.
	w := 0
	for i := range out {
		if i+1 < len(out) && out[i+1].Key == out[i].Key {
			continue
		}
		out[w] = out[i]
		w++
	}
	return out[:w], nil
}

func compareKeys(a, b policy.Key) int {
	return cmp.Or(strings.Compare(a.Workspace, b.Workspace), strings.Compare(a.Namespace, b.Namespace),
		strings.Compare(a.Pattern, b.Pattern))
}

// UpsertOverrides merges es into the store: per key, the entry
// policy.Compare orders last is kept (last writer wins), so writes are
// idempotent and commutative. It writes all of es or, if one is invalid or
// ctx is done, none.
func (s *MemoryStore) UpsertOverrides(ctx context.Context, es []policy.Entry) error {
	es, err := PrepareOverrides(es)
	if err != nil {
		return fmt.Errorf("global: memory store: upsert overrides: %w", err)
	}
	if err := s.begin(ctx, "upsert overrides"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.overrides == nil {
		s.overrides = make(map[policy.Key]memRow[policy.Entry])
	}
	for _, e := range es {
		if old, ok := s.overrides[e.Key]; !ok || policy.Compare(e, old.row) > 0 {
			s.seq++
			s.overrides[e.Key] = memRow[policy.Entry]{e, s.seq}
		}
	}
	return nil
}

// LoadOverrides returns every override entry held, tombstones included,
// in no particular order.
func (s *MemoryStore) LoadOverrides(ctx context.Context) ([]policy.Entry, error) {
	if err := s.begin(ctx, "load overrides"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make([]policy.Entry, 0, len(s.overrides))
	for _, e := range s.overrides {
		out = append(out, e.row)
	}
	return out, nil
}

// markKey names one mark: (workspace, namespace, identifier, duration).
type markKey struct {
	ws, ns, id string
	d          int64
}

func keyOfMark(m policy.Mark) markKey {
	return markKey{m.Workspace, m.Namespace, m.Identifier, m.Duration}
}

// PrepareMarks validates ms and returns them sorted by key with one mark
// per key, the largest epoch, for a store to write in key order. It
// returns an error, and nothing, if any mark is invalid.
func PrepareMarks(ms []policy.Mark) ([]policy.Mark, error) {
	for i, m := range ms {
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("reset mark %d: %w", i, err)
		}
	}
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b policy.Mark) int {
		return cmp.Or(strings.Compare(a.Workspace, b.Workspace), strings.Compare(a.Namespace, b.Namespace),
			strings.Compare(a.Identifier, b.Identifier), cmp.Compare(a.Duration, b.Duration), cmp.Compare(a.Epoch, b.Epoch))
	})
	w := 0
	for i := range out {
		if i+1 < len(out) && keyOfMark(out[i+1]) == keyOfMark(out[i]) {
			continue
		}
		out[w] = out[i]
		w++
	}
	return out[:w], nil
}

// UpsertMarks merges ms into the store by max of epoch. It writes all of
// ms or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertMarks(ctx context.Context, ms []policy.Mark) error {
	ms, err := PrepareMarks(ms)
	if err != nil {
		return fmt.Errorf("global: memory store: upsert reset marks: %w", err)
	}
	if err := s.begin(ctx, "upsert reset marks"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.marks == nil {
		s.marks = make(map[markKey]memRow[policy.Mark])
	}
	for _, m := range ms {
		if old, ok := s.marks[keyOfMark(m)]; !ok || m.Epoch > old.row.Epoch {
			s.seq++
			s.marks[keyOfMark(m)] = memRow[policy.Mark]{m, s.seq}
		}
	}
	return nil
}

// LoadMarks returns every mark held that has not expired at now.
func (s *MemoryStore) LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error) {
	if err := s.begin(ctx, "load reset marks"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	grace := global.MarkGrace.Milliseconds()
	out := make([]policy.Mark, 0, len(s.marks))
	for _, m := range s.marks {
		if m.row.ExpireAt(grace) > now {
			out = append(out, m.row)
		}
	}
	return out, nil
}
