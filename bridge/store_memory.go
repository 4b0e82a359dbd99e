package bridge

import (
	"context"
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// MemoryStore is a Store in process memory, with the same semantics as the
// MySQL store: for a bridge run without MySQL, and for tests. What it holds
// is lost with the process. It never waits and has no breaker. Safe for
// concurrent use; the zero value is not usable, call NewMemoryStore.
type MemoryStore struct {
	mu         sync.Mutex
	closed     bool
	components map[storeKey]memRow[global.Component]
	overrides  map[policy.Key]memRow[policy.Entry]
	marks      map[policy.Mark]memRow[policy.Mark]
	// seq counts the changes: each row raised or written records the
	// value it took, and LoadChanged returns rows above a mark.
	seq Mark
}

// memRow is a stored row and the change that last raised it.
type memRow[T any] struct {
	row     T
	changed Mark
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		components: make(map[storeKey]memRow[global.Component]),
		overrides:  make(map[policy.Key]memRow[policy.Entry]),
		marks:      make(map[policy.Mark]memRow[policy.Mark]),
	}
}

// begin locks s for a call, failing if ctx is done or s is closed. On
// success the caller must unlock s.mu.
func (s *MemoryStore) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("global: memory store: %s: %w", op, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("global: memory store: %s: %w", op, errStoreClosed)
	}
	return nil
}

// upsert merges vs into *m by k's merge, all of them or, if one is invalid
// or ctx is done, none. Only a row the merge changes is a change (takes the
// next sequence).
func upsert[K comparable, V any](ctx context.Context, s *MemoryStore, op string, m *map[K]memRow[V], k rowKind[K, V], vs []V) error {
	vs, err := prepare(k, vs)
	if err != nil {
		return fmt.Errorf("global: memory store: %s: %w", op, err)
	}
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, v := range vs {
		if old, ok := (*m)[k.key(v)]; ok {
			if v, ok = k.merge(old.row, v); !ok {
				continue // raises nothing: not a change
			}
		}
		s.seq++
		(*m)[k.key(v)] = memRow[V]{v, s.seq}
	}
	return nil
}

// load returns the rows of *m that keep accepts, in no particular order.
func load[K comparable, V any](ctx context.Context, s *MemoryStore, op string, m *map[K]memRow[V], keep func(V) bool) ([]V, error) {
	if err := s.begin(ctx, op); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return rows(*m, 0, keep), nil
}

// UpsertComponents merges cs into the store by max of count and expiry.
// It writes all of cs or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertComponents(ctx context.Context, cs []global.Component) error {
	return upsert(ctx, s, "upsert components", &s.components, componentRows, cs)
}

// LoadChanged returns copies of the live rows raised after since, which is
// the number of changes the store had seen then; a since beyond that count
// (a mark of another store) reads every live row.
func (s *MemoryStore) LoadChanged(ctx context.Context, now int64, since Mark) (Changes, error) {
	if err := s.begin(ctx, "load changed"); err != nil {
		return Changes{}, err
	}
	defer s.mu.Unlock()
	full := since <= 0 || since > s.seq
	if full {
		since = 0
	}
	return Changes{
		Components: rows(s.components, since, liveAt(componentRows, now)),
		Overrides:  rows(s.overrides, since, liveAt(overrideRows, now)),
		Marks:      rows(s.marks, since, liveAt(markRows, now)),
		Next:       s.seq,
		Full:       full,
	}, nil
}

// liveAt returns k's live at now.
func liveAt[K comparable, V any](k rowKind[K, V], now int64) func(V) bool {
	return func(v V) bool { return k.live(v, now) }
}

// rows returns the rows of m that keep accepts and that changed after
// since (nil: none).
func rows[K comparable, V any](m map[K]memRow[V], since Mark, keep func(V) bool) []V {
	var out []V
	for _, r := range m {
		if r.changed > since && keep(r.row) {
			out = append(out, r.row)
		}
	}
	return out
}

// DeleteExpired deletes every row that no longer matters at now (its
// kind's live) at once (batch only has to be positive) and returns how
// many went.
func (s *MemoryStore) DeleteExpired(ctx context.Context, now int64, batch int) (int64, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("global: memory store: delete expired: batch %d is not positive", batch)
	}
	if err := s.begin(ctx, "delete expired"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return deleteDead(s.components, componentRows, now) +
		deleteDead(s.marks, markRows, now) + deleteDead(s.overrides, overrideRows, now), nil
}

// deleteDead deletes the rows of m that are not live at now and returns how
// many went.
func deleteDead[K comparable, V any](m map[K]memRow[V], k rowKind[K, V], now int64) int64 {
	var n int64
	for key, r := range m {
		if !k.live(r.row, now) {
			delete(m, key)
			n++
		}
	}
	return n
}

// Close drops what the store holds; later calls fail. Closing again does
// nothing.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.components = nil
	s.overrides = nil
	s.marks = nil
	return nil
}
