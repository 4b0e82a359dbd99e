package bridge

import (
	"context"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// overrideRows merge by last writer wins (policy.Compare); a tombstone
// stops mattering at policy.TombstoneCutoff.
var overrideRows = rowKind[policy.Key, policy.Entry]{
	name:    "override",
	key:     func(e policy.Entry) policy.Key { return e.Key },
	compare: policy.CompareKeys,
	merge: func(old, e policy.Entry) (policy.Entry, bool) {
		if policy.Compare(e, old) > 0 {
			return e, true
		}
		return old, false
	},
	validate: policy.Entry.Validate,
	live: func(e policy.Entry, now int64) bool {
		return !e.Deleted || e.Version.At >= policy.TombstoneCutoff(now)
	},
}

// markRows are keyed by the mark with a zero epoch (workspace, namespace,
// identifier, duration), merge by max of epoch and stop mattering at
// policy.Mark.ExpireAt with global.MarkGrace.
var markRows = rowKind[policy.Mark, policy.Mark]{
	name: "reset mark",
	key: func(m policy.Mark) policy.Mark {
		m.Epoch = 0
		return m
	},
	compare: policy.CompareMarks,
	merge: func(old, m policy.Mark) (policy.Mark, bool) {
		if m.Epoch > old.Epoch {
			return m, true
		}
		return old, false
	},
	validate: policy.Mark.Validate,
	live:     func(m policy.Mark, now int64) bool { return m.ExpireAt(global.MarkGrace.Milliseconds()) > now },
}

// PrepareOverrides validates es and returns them sorted by key with one
// entry per key, the one policy.Compare orders last (the merge's winner),
// for a store to write in key order. It returns an error, and nothing, if
// any entry is invalid.
func PrepareOverrides(es []policy.Entry) ([]policy.Entry, error) { return prepare(overrideRows, es) }

// PrepareMarks validates ms and returns them sorted by key with one mark
// per key, the largest epoch, for a store to write in key order. It
// returns an error, and nothing, if any mark is invalid.
func PrepareMarks(ms []policy.Mark) ([]policy.Mark, error) { return prepare(markRows, ms) }

// UpsertOverrides merges es into the store: per key, the entry
// policy.Compare orders last is kept (last writer wins), so writes are
// idempotent and commutative. It writes all of es or, if one is invalid or
// ctx is done, none.
func (s *MemoryStore) UpsertOverrides(ctx context.Context, es []policy.Entry) error {
	return upsert(ctx, s, "upsert overrides", &s.overrides, overrideRows, es)
}

// LoadOverrides returns every override entry held, tombstones included,
// in no particular order.
func (s *MemoryStore) LoadOverrides(ctx context.Context) ([]policy.Entry, error) {
	return load(ctx, s, "load overrides", &s.overrides, func(policy.Entry) bool { return true })
}

// UpsertMarks merges ms into the store by max of epoch. It writes all of
// ms or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertMarks(ctx context.Context, ms []policy.Mark) error {
	return upsert(ctx, s, "upsert reset marks", &s.marks, markRows, ms)
}

// LoadMarks returns every mark held that has not expired at now.
func (s *MemoryStore) LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error) {
	return load(ctx, s, "load reset marks", &s.marks, func(m policy.Mark) bool { return markRows.live(m, now) })
}
