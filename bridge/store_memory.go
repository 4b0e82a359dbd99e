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
	denials    map[storeKey]memRow[global.Denial]
	overrides  map[policy.Key]memRow[policy.Entry]
	marks      map[markKey]memRow[policy.Mark]
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
		denials:    make(map[storeKey]memRow[global.Denial]),
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

// UpsertComponents merges cs into the store by max of count and expiry.
// It writes all of cs or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertComponents(ctx context.Context, cs []global.Component) error {
	cs, err := PrepareComponents(cs)
	if err != nil {
		return fmt.Errorf("global: memory store: upsert components: %w", err)
	}
	if err := s.begin(ctx, "upsert components"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, c := range cs {
		k := storeKey{c.Cell, c.Region}
		old, ok := s.components[k]
		if ok && c.Count <= old.row.Count && c.ExpireAt <= old.row.ExpireAt {
			continue // raises nothing: not a change
		}
		if ok {
			c.Count = max(c.Count, old.row.Count)
			c.ExpireAt = max(c.ExpireAt, old.row.ExpireAt)
		}
		s.seq++
		s.components[k] = memRow[global.Component]{c, s.seq}
	}
	return nil
}

// UpsertDenials merges ds into the store by max of limit and expiry. It
// writes all of ds or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertDenials(ctx context.Context, ds []global.Denial) error {
	ds, err := PrepareDenials(ds)
	if err != nil {
		return fmt.Errorf("global: memory store: upsert denials: %w", err)
	}
	if err := s.begin(ctx, "upsert denials"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, d := range ds {
		k := storeKey{d.Cell, d.Region}
		old, ok := s.denials[k]
		if ok && d.Usage <= old.row.Usage && d.ExpireAt <= old.row.ExpireAt {
			continue
		}
		if ok {
			d.Usage = max(d.Usage, old.row.Usage)
			d.ExpireAt = max(d.ExpireAt, old.row.ExpireAt)
		}
		s.seq++
		s.denials[k] = memRow[global.Denial]{d, s.seq}
	}
	return nil
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
	ch := Changes{
		Components: liveRows(s.components, now, since, componentExpiry),
		Denials:    liveRows(s.denials, now, since, denialExpiry),
		Next:       s.seq,
		Full:       full,
	}
	tombs := policy.TombstoneCutoff(now)
	for _, r := range s.overrides {
		if r.changed > since && (!r.row.Deleted || r.row.Version.At >= tombs) {
			ch.Overrides = append(ch.Overrides, r.row)
		}
	}
	grace := global.MarkGrace.Milliseconds()
	for _, r := range s.marks {
		if r.changed > since && r.row.ExpireAt(grace) > now {
			ch.Marks = append(ch.Marks, r.row)
		}
	}
	return ch, nil
}

// componentExpiry and denialExpiry are the expiries liveRows reads.
func componentExpiry(c global.Component) int64 { return c.ExpireAt }

func denialExpiry(d global.Denial) int64 { return d.ExpireAt }

// liveRows returns the rows of m that expire (by expiry) after now and
// changed after since.
func liveRows[T any](m map[storeKey]memRow[T], now int64, since Mark, expiry func(T) int64) []T {
	var out []T
	for _, r := range m {
		if r.changed > since && expiry(r.row) > now {
			out = append(out, r.row)
		}
	}
	return out
}

// DeleteExpired deletes every component and denial with ExpireAt <= now at
// once (batch only has to be positive) and returns how many went.
func (s *MemoryStore) DeleteExpired(ctx context.Context, now int64, batch int) (int64, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("global: memory store: delete expired: batch %d is not positive", batch)
	}
	if err := s.begin(ctx, "delete expired"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var n int64
	for k, c := range s.components {
		if c.row.ExpireAt <= now {
			delete(s.components, k)
			n++
		}
	}
	for k, d := range s.denials {
		if d.row.ExpireAt <= now {
			delete(s.denials, k)
			n++
		}
	}
	for k, m := range s.marks {
		if m.row.ExpireAt(global.MarkGrace.Milliseconds()) <= now {
			delete(s.marks, k)
			n++
		}
	}
	tombs := policy.TombstoneCutoff(now)
	for k, e := range s.overrides {
		if e.row.Deleted && e.row.Version.At < tombs {
			delete(s.overrides, k)
			n++
		}
	}
	return n, nil
}

// Close drops what the store holds; later calls fail. Closing again does
// nothing.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.components = nil
	s.denials = nil
	s.overrides = nil
	s.marks = nil
	return nil
}
