package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/global"
)

// The way every kind a bridge carries (components, override entries, reset
// marks) takes: a message is refused whole when its stamp is
// beyond the clock-skew tolerance (stamped); each entry is checked at the
// bridge's clock, refused and counted if it fails, else merged by its
// kind's rule (takeEach, takeCounts); what the merge changed is queued to
// go out and for the store (mergeQueue, storeQueue, queuePolicies); and
// what the store lacks is written, and put back when the write fails
// (flush, Bridge.writeStore). What differs per kind is its rowKind (key,
// merge rule, validation), the state it merges into (the Counter, the
// policy.Table, the policy.Marks) and the Store method that writes it.

// stamped refuses, and counts under from, a whole message of n entries
// whose stamp sentAt (unix ms by the sender's clock; 0: not stamped) is
// beyond the clock-skew tolerance at now, and returns why.
func (b *Bridge) stamped(from global.Refusal, sentAt, now int64, n int) error {
	err := global.CheckSentAt(sentAt, now, b.cfg.MaxClockSkew)
	if err != nil {
		b.refuse(from, n, err)
	}
	return err
}

// takeEach passes each entry of xs to take; each one take refuses (returns
// an error for) is counted under from, and the errors are returned.
func takeEach[T any](b *Bridge, from global.Refusal, xs []T, take func(T) error) []error {
	var errs []error
	for _, x := range xs {
		if err := take(x); err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
		}
	}
	return errs
}

// takeCounts passes to merge each component of cs that passes its Check
// at now and is region want's (any region's when want is empty); the
// others are refused under from, or under their own region when from names
// none.
func takeCounts(b *Bridge, from global.Refusal, want string, now int64, cs []global.Component, merge func(global.Component)) {
	for _, c := range cs {
		err := c.Check(now, b.cfg.MaxClockSkew)
		if want != "" {
			err = b.check(c.Region, want, err)
		}
		if err != nil {
			r := from
			if r.Region == "" {
				r.Region = c.Region
			}
			b.refuse(r, 1, err)
			continue
		}
		merge(c)
	}
}

// mergeQueue holds, per key, what the kind's merge keeps of the values put
// until they are taken: what is still to go out, or what the store still
// lacks. Its owner's mutex guards it.
type mergeQueue[K comparable, V any] struct {
	m     map[K]V
	key   func(V) K
	merge func(old, v V) (V, bool)
}

func newMergeQueue[K comparable, V any](key func(V) K, merge func(old, v V) (V, bool)) mergeQueue[K, V] {
	return mergeQueue[K, V]{m: make(map[K]V), key: key, merge: merge}
}

// len returns how many values q holds.
func (q *mergeQueue[K, V]) len() int { return len(q.m) }

// put queues v merged with what is queued for its key, unless that merge
// changes nothing.
func (q *mergeQueue[K, V]) put(v V) {
	k := q.key(v)
	if old, ok := q.m[k]; ok {
		if v, ok = q.merge(old, v); !ok {
			return
		}
	}
	q.m[k] = v
}

// take empties the queue and returns what it held. After a burst (a first
// load queues every override) the map is replaced, not cleared: Go maps
// never shrink, and every later take would walk the burst's buckets.
func (q *mergeQueue[K, V]) take() []V {
	vs := make([]V, 0, len(q.m))
	for _, v := range q.m {
		vs = append(vs, v)
	}
	q.m = emptied(q.m)
	return vs
}

// storeQueue is what the store still lacks of one kind, merged by the
// kind's rule (so it is bounded by live keys), and how many rows writes
// have taken from it and not yet seen durable. Safe for concurrent use.
type storeQueue[K comparable, V any] struct {
	mu      sync.Mutex
	q       mergeQueue[K, V]
	writing int
	// write is the Store's upsert of the kind.
	write func(context.Context, []V) error
	// live, if set, is what a failed write's rows must be at the bridge's
	// clock to go back in the queue.
	live func(v V, now int64) bool
}

func newStoreQueue[K comparable, V any](k rowKind[K, V], write func(context.Context, []V) error, live func(V, int64) bool) *storeQueue[K, V] {
	return &storeQueue[K, V]{q: newMergeQueue(k.key, k.merge), write: write, live: live}
}

// put queues vs.
func (s *storeQueue[K, V]) put(vs ...V) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		s.q.put(v)
	}
}

// take takes what s holds for a write, which settle must end.
func (s *storeQueue[K, V]) take() []V {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := s.q.take()
	s.writing += len(vs)
	return vs
}

// settle ends the write of vs, which err ended: unless it succeeded or
// the store refused the rows as invalid (retrying cannot help), they go
// back in the queue (those live at now, if s has live). They count as
// pending until they are back.
func (s *storeQueue[K, V]) settle(vs []V, err error, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writing -= len(vs)
	if err == nil || errors.Is(err, ErrInvalidRow) {
		return
	}
	for _, v := range vs {
		if s.live == nil || s.live(v, now) {
			s.q.put(v)
		}
	}
}

// queued returns how many rows wait in s.
func (s *storeQueue[K, V]) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.len()
}

// pending returns how many rows the store lacks: those queued and those a
// write has under way.
func (s *storeQueue[K, V]) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.len() + s.writing
}

// flush writes what s holds to the store within StoreTimeout; what fails
// goes back (settle). It returns how many rows it took (0: nothing to
// write) and its error, wrapped with what.
func flush[K comparable, V any](ctx context.Context, b *Bridge, s *storeQueue[K, V], what string) (int, error) {
	vs := s.take()
	if len(vs) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StoreTimeout)
	defer cancel()
	err := s.write(ctx, vs)
	s.settle(vs, err, b.now())
	if err != nil {
		return len(vs), fmt.Errorf("%s: %w", what, err)
	}
	return len(vs), nil
}

// writeOrRetry runs write and, if it fails, tries once more over fresh
// connections (lastTry); what it returns says whether that try was made
// and how the write ended.
func (b *Bridge) writeOrRetry(ctx context.Context, write func(context.Context) error) lastTry {
	if err := write(ctx); err != nil {
		return b.lastTry(ctx, write)
	}
	return lastTry{}
}

// logNotDurable says, in one line, that a stopping bridge holds n rows of
// what the store lacks (none: it says nothing), why (err), what its last
// try was and who holds them meanwhile (held).
func (b *Bridge) logNotDurable(what string, n int, err error, last lastTry, held string) {
	if n == 0 {
		return
	}
	b.log.Warn("stopping with "+what+" not yet durable in MySQL"+last.how()+": "+held,
		append(last.attrs(), "not_durable", n, "error", err)...)
}
