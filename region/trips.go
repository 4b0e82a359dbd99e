package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTrips is how many round trips of checks' syncs one Redis origin
// keeps in flight at most (RedisConfig.Trips).
const DefaultTrips = 4

// maxTripSyncs bounds the syncs one trip carries; the rest go in the next.
const maxTripSyncs = 256

// ErrNotSent is wrapped, with the context's error, by the error of a call
// whose context ended before it was sent: it waited for a round trip (or a
// connection) and the origin was never asked. A breaker counts it neither
// way: it says the caller's budget was short, not that the origin failed.
var ErrNotSent = errors.New("origin call not sent")

// trips carries concurrent syncs to the origin together: a sync that finds
// fewer than max round trips in flight leaves at once, with whatever
// waits; one that finds them all taken waits for the next to land, and
// leaves with every sync queued meanwhile, in one call (settle). No timer
// holds a lone sync back, and under load the syncs a round trip carries
// grow with the load. A sync whose caller gave up before it left is not
// sent.
type trips struct {
	settle func(ctx context.Context, reporter string, ss []Sync) ([]SyncResult, error)
	max    int

	mu     sync.Mutex
	queue  []*tripCall
	flying int

	sent, carried atomic.Int64 // round trips made, syncs they carried
}

// tripCall is one sync waiting for its round trip.
type tripCall struct {
	ctx      context.Context
	reporter string
	s        Sync
	res      SyncResult
	err      error
	done     chan struct{}
}

// do sends s with the next round trip and returns its result, or the
// context's error (wrapping ErrNotSent if s never left) once ctx ends.
func (t *trips) do(ctx context.Context, reporter string, s Sync) (SyncResult, error) {
	c := &tripCall{ctx: ctx, reporter: reporter, s: s, done: make(chan struct{})}
	t.mu.Lock()
	t.queue = append(t.queue, c)
	var batch []*tripCall
	if t.flying < t.max {
		if batch = t.take(); len(batch) > 0 {
			t.flying++
		}
	}
	t.mu.Unlock()
	if len(batch) > 0 {
		t.fly(batch)
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		select {
		case <-c.done:
			return c.res, c.err
		default:
		}
		t.mu.Lock()
		queued := c.err == nil && t.remove(c)
		t.mu.Unlock()
		if queued {
			return SyncResult{}, fmt.Errorf("%w: %w", ErrNotSent, ctx.Err())
		}
		return SyncResult{}, ctx.Err()
	}
}

// take removes from the queue the syncs of the next round trip: up to
// maxTripSyncs of the first live call's reporter, in order. Calls whose
// context ended are answered as not sent. The caller holds t.mu.
func (t *trips) take() []*tripCall {
	var out []*tripCall
	rest := t.queue[:0]
	for _, c := range t.queue {
		switch {
		case c.ctx.Err() != nil:
			c.err = fmt.Errorf("%w: %w", ErrNotSent, c.ctx.Err())
			close(c.done)
		case len(out) < maxTripSyncs && (len(out) == 0 || c.reporter == out[0].reporter):
			out = append(out, c)
		default:
			rest = append(rest, c)
		}
	}
	clear(t.queue[len(rest):])
	t.queue = rest
	return out
}

// remove takes c out of the queue and reports whether it was there. The
// caller holds t.mu.
func (t *trips) remove(c *tripCall) bool {
	i := slices.Index(t.queue, c)
	if i < 0 {
		return false
	}
	t.queue = slices.Delete(t.queue, i, i+1)
	return true
}

// fly makes the round trip of batch and answers its calls; then, if syncs
// queued meanwhile, it hands them to a goroutine that carries on, so the
// caller that started the trip returns as soon as its own answer is in.
func (t *trips) fly(batch []*tripCall) {
	t.round(batch)
	t.mu.Lock()
	next := t.take()
	if len(next) == 0 {
		t.flying--
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	go func() {
		for len(next) > 0 {
			t.round(next)
			t.mu.Lock()
			if next = t.take(); len(next) == 0 {
				t.flying--
			}
			t.mu.Unlock()
		}
	}()
}

// round sends batch in one call, bounded by the latest of its callers'
// deadlines (none if one has none), and answers each call.
func (t *trips) round(batch []*tripCall) {
	ss := make([]Sync, len(batch))
	var latest time.Time
	bounded := true
	for i, c := range batch {
		ss[i] = c.s
		d, ok := c.ctx.Deadline()
		bounded = bounded && ok
		if d.After(latest) {
			latest = d
		}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if bounded {
		ctx, cancel = context.WithDeadline(ctx, latest)
	}
	res, err := t.settle(ctx, batch[0].reporter, ss)
	cancel()
	t.sent.Add(1)
	t.carried.Add(int64(len(batch)))
	t.mu.Lock() // orders the answers with remove
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = res[i]
		}
		close(c.done)
	}
	t.mu.Unlock()
}

// TripStats says how many round trips the checks' syncs made and how many
// syncs they carried: their ratio is the mean batch the load produced.
type TripStats struct {
	Trips, Syncs int64
}
