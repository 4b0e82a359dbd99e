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
const DefaultTrips = 2

// maxTripSyncs bounds the syncs one trip carries; the rest go in the next.
const maxTripSyncs = 256

// ErrNotSent is wrapped, with the context's error, by the error of a call
// whose context ended before it was sent: it waited for a round trip (or a
// connection) and the origin was never asked. A breaker counts it neither
// way: it says the caller's budget was short, not that the origin failed.
var ErrNotSent = errors.New("origin call not sent")

// trips carries concurrent syncs to the origin together, at most max round
// trips at a time. A sync that finds fewer in flight makes one itself, at
// once, with whatever is queued (no timer holds a lone sync back, and no
// other goroutine is woken for it); one that finds them all in flight is
// queued, and when a trip lands a flier (a goroutine that lives as long as
// the origin, up to max of them) takes every sync queued (up to
// maxTripSyncs) and sends them in one call (settle). So under load the
// syncs a round trip carries grow with the load. A sync whose caller gave
// up before it left is not sent.
type trips struct {
	settle func(ctx context.Context, reporter string, ss []Sync) ([]SyncResult, error)
	max    int

	mu     sync.Mutex
	queue  []*tripCall
	flying int  // round trips in flight
	fliers int  // fliers started
	closed bool // no more fliers start; those running end once idle
	wake   chan struct{}
	stop   chan struct{}

	sent, carried atomic.Int64 // round trips made, syncs they carried
}

func newTrips(max int, settle func(context.Context, string, []Sync) ([]SyncResult, error)) *trips {
	return &trips{settle: settle, max: max, wake: make(chan struct{}, max), stop: make(chan struct{})}
}

// errTripsClosed is the error of a sync made after the origin was closed.
var errTripsClosed = errors.New("origin closed")

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
	if t.closed {
		t.mu.Unlock()
		return SyncResult{}, fmt.Errorf("%w: %w", ErrNotSent, errTripsClosed)
	}
	t.queue = append(t.queue, c)
	batch := t.leave()
	t.mu.Unlock()
	if len(batch) > 0 {
		t.round(batch)
		t.landed()
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		t.mu.Lock()
		queued := t.remove(c)
		t.mu.Unlock()
		if queued {
			return SyncResult{}, fmt.Errorf("%w: %w", ErrNotSent, ctx.Err())
		}
		select {
		case <-c.done: // answered meanwhile
			return c.res, c.err
		default:
			return SyncResult{}, ctx.Err()
		}
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

// leave takes the next round trip's syncs if fewer than max trips are in
// flight, counting it in flight. The caller holds t.mu.
func (t *trips) leave() []*tripCall {
	if t.flying >= t.max {
		return nil
	}
	batch := t.take()
	if len(batch) > 0 {
		t.flying++
	}
	return batch
}

// landed ends a round trip made by a sync's own goroutine: if syncs queued
// meanwhile, a flier (started if fewer than max run) is woken to take them.
func (t *trips) landed() {
	t.mu.Lock()
	t.flying--
	more := len(t.queue) > 0 && !t.closed
	if more && t.fliers < t.max {
		t.fliers++
		go t.fly()
	}
	t.mu.Unlock()
	if more {
		select {
		case t.wake <- struct{}{}:
		default: // every flier has a wake-up waiting already
		}
	}
}

// fly is a flier: it makes round trips while syncs are queued and fewer
// than max are in flight, and waits to be woken otherwise, until the
// origin closes.
func (t *trips) fly() {
	for {
		t.mu.Lock()
		batch := t.leave()
		t.mu.Unlock()
		if len(batch) > 0 {
			t.round(batch)
			t.mu.Lock()
			t.flying--
			t.mu.Unlock()
			continue
		}
		select {
		case <-t.wake:
		case <-t.stop:
			return
		}
	}
}

// close ends the fliers once they are idle and answers what is queued as
// not sent.
func (t *trips) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	close(t.stop)
	for _, c := range t.queue {
		c.err = fmt.Errorf("%w: %w", ErrNotSent, errTripsClosed)
		close(c.done)
	}
	t.queue = nil
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
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("origin answered %d of %d syncs", len(res), len(batch))
	}
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
// syncs they carried (their ratio is the mean batch the load produced), and
// how many syncs of any kind a first touch decided without the script.
type TripStats struct {
	Trips, Syncs int64
	FirstTouches int64
}
