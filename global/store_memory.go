package global

import (
	"context"
	"fmt"
	"sync"
)

// MemoryStore is a Store in process memory, with the same semantics as the
// MySQL store: for a bridge run without MySQL, and for tests. What it holds
// is lost with the process. It never waits and has no breaker. Safe for
// concurrent use; the zero value is not usable, call NewMemoryStore.
type MemoryStore struct {
	mu         sync.Mutex
	closed     bool
	components map[storeKey]Component
	denials    map[storeKey]Denial
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		components: make(map[storeKey]Component),
		denials:    make(map[storeKey]Denial),
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
func (s *MemoryStore) UpsertComponents(ctx context.Context, cs []Component) error {
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
		if old, ok := s.components[k]; ok {
			c.Count = max(c.Count, old.Count)
			c.ExpireAt = max(c.ExpireAt, old.ExpireAt)
		}
		s.components[k] = c
	}
	return nil
}

// UpsertDenials merges ds into the store by max of limit and expiry. It
// writes all of ds or, if one is invalid or ctx is done, none.
func (s *MemoryStore) UpsertDenials(ctx context.Context, ds []Denial) error {
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
		if old, ok := s.denials[k]; ok {
			d.Usage = max(d.Usage, old.Usage)
			d.ExpireAt = max(d.ExpireAt, old.ExpireAt)
		}
		s.denials[k] = d
	}
	return nil
}

// LoadComponents returns a copy of every component whose ExpireAt > now.
func (s *MemoryStore) LoadComponents(ctx context.Context, now int64) ([]Component, error) {
	if err := s.begin(ctx, "load components"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []Component
	for _, c := range s.components {
		if c.ExpireAt > now {
			out = append(out, c)
		}
	}
	return out, nil
}

// LoadDenials returns a copy of every denial whose ExpireAt > now.
func (s *MemoryStore) LoadDenials(ctx context.Context, now int64) ([]Denial, error) {
	if err := s.begin(ctx, "load denials"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []Denial
	for _, d := range s.denials {
		if d.ExpireAt > now {
			out = append(out, d)
		}
	}
	return out, nil
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
		if c.ExpireAt <= now {
			delete(s.components, k)
			n++
		}
	}
	for k, d := range s.denials {
		if d.ExpireAt <= now {
			delete(s.denials, k)
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
	return nil
}
