package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/global"
)

// SweepFunc reads the region's own count of every live cell from where the
// region keeps it (its Redis: region.Redis.ScanCounts) and passes them to
// yield, a batch at a time, as this region's components. It ends at yield's
// first error or ctx's end.
type SweepFunc func(ctx context.Context, yield func([]global.Component) error) error

// DefaultSweepInterval is how often a bridge with a SweepFunc sweeps when
// nothing else asks it to.
const DefaultSweepInterval = time.Minute

// storeHealth is what the bridge last heard from the store. A sweep is
// asked for when the store answers again after failures: whatever the
// bridge took in meanwhile is in the region's Redis, whether or not this
// process still holds it.
type storeHealth struct {
	mu        sync.Mutex
	writeErr  error // the last write's error; nil: it succeeded (or none yet)
	loadErr   error // the last load's error
	lastSweep time.Time
}

// noteStore records the outcome of a store write (write) or load. A call
// that succeeds after failures of its kind asks for a sweep; a load only
// while writes do not fail: loads and writes fail apart (the write
// breaker), and a store that takes loads but not writes would otherwise be
// swept every ReloadInterval.
func (b *Bridge) noteStore(write bool, err error) {
	b.health.mu.Lock()
	last := &b.health.loadErr
	if write {
		last = &b.health.writeErr
	}
	back := err == nil && *last != nil && (write || b.health.writeErr == nil)
	*last = err
	b.health.mu.Unlock()
	if back {
		b.askSweep()
	}
}

// askSweep asks the sweep loop for a sweep now (asks made while one is
// waiting merge into it).
func (b *Bridge) askSweep() {
	if b.cfg.Sweep == nil {
		return
	}
	select {
	case b.sweepNow <- struct{}{}:
	default:
	}
}

// storeErr returns the error of the store's last write, else of its last
// load: nil when the store answered the last of each.
func (b *Bridge) storeErr() error {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	if b.health.writeErr != nil {
		return b.health.writeErr
	}
	return b.health.loadErr
}

// Backlog returns how many of this region's components the bridge holds that the store does not have yet, and the store's last
// error (nil while it answers). With a SweepFunc nothing of it is lost if
// the process stops: the region's Redis holds the counts, and the region's
// next sweep writes them.
func (b *Bridge) Backlog() (rows int, err error) {
	return b.comps.pending(), b.storeErr()
}

// sweepLoop sweeps at start, every SweepInterval, and when asked (the
// store answers again). After a failed sweep (Redis unreachable) it tries
// again after 1s, doubling up to SweepInterval, so a bridge that started
// while Redis was down recovers soon after Redis answers.
func (b *Bridge) sweepLoop(ctx context.Context) {
	defer b.loops.Done()
	retry := time.Second
	next := func(err error) time.Duration {
		if err == nil {
			retry = time.Second
			return b.cfg.SweepInterval
		}
		d := min(retry, b.cfg.SweepInterval)
		retry *= 2
		return d
	}
	t := time.NewTimer(next(b.runSweep(ctx, "start")))
	defer t.Stop()
	for {
		var why string
		select {
		case <-b.stop:
			return
		case <-t.C:
			why = "interval"
		case <-b.sweepNow:
			why = "store answers again"
		}
		t.Reset(next(b.runSweep(ctx, why)))
	}
}

// runSweep sweeps, logs a failure and returns it.
func (b *Bridge) runSweep(ctx context.Context, why string) error {
	err := b.sweep(ctx, why)
	if err != nil && ctx.Err() == nil {
		b.log.Warn("sweep of the region's counts failed; retrying", "reason", why, "error", err)
	}
	return err
}

// sweep merges the region's own count of every live cell, as the SweepFunc
// reads it, into the counter as this region's components: those that raise
// a component are forwarded and stored like a limiter's. Components merge by
// max, so sweeping again changes nothing unless a count grew. Each entry
// passes global.Component.Check at the bridge's clock and must name this
// region.
func (b *Bridge) sweep(ctx context.Context, why string) error {
	start := time.Now()
	from := global.Refusal{Source: "redis", Region: b.cfg.Region}
	var seen, raised int
	err := b.cfg.Sweep(ctx, func(cs []global.Component) error {
		ok := make([]global.Component, 0, len(cs))
		takeCounts(b, from, b.cfg.Region, b.now(), cs, func(c global.Component) { ok = append(ok, c) })
		seen += len(ok)
		raised += b.counter.MergeAll(ok)
		return nil
	})
	took := time.Since(start)
	b.stats.sweeps.Add(1)
	b.stats.sweepCells.Add(int64(seen))
	b.stats.sweepRaised.Add(int64(raised))
	b.stats.sweepLastMs.Store(took.Milliseconds())
	b.health.mu.Lock()
	b.health.lastSweep = start
	b.health.mu.Unlock()
	if err != nil {
		b.stats.sweepErrs.Add(1)
		return fmt.Errorf("sweep (%s) after %d cells: %w", why, seen, err)
	}
	if raised > 0 {
		b.log.Info("sweep raised components from the region's counts", "reason", why, "cells", seen, "raised", raised, "took", took)
	} else {
		b.log.Debug("sweep found the components current", "reason", why, "cells", seen, "took", took)
	}
	return nil
}

// closeRecoverable is Close for a bridge with a SweepFunc: nothing it holds
// can be lost, so it does not wait for a store that fails. While the store
// answers it sweeps once more (bounded by half of what ctx leaves), so
// that what limiters hold back on purpose reaches the store too, then
// forwards and writes once. If the store failed last (before Close, or in
// that write) it tries once more over fresh connections, within
// closeRetryMax or half of what ctx leaves, whichever is less (lastTry):
// the link may have come back with the pooled connections dead.
// What the store still lacks is logged in one line with its count, and
// Close returns nil.
func (b *Bridge) closeRecoverable(ctx context.Context) error {
	if b.storeErr() == nil {
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok {
			sctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		}
		err := b.sweep(sctx, "shutdown")
		cancel()
		if err != nil {
			b.log.Warn("last sweep at shutdown failed; the region's next bridge sweeps", "error", err)
		}
	}
	b.batch()
	var err, perr error
	if b.storeErr() == nil {
		err, perr = b.writeStore(ctx), b.writePolicies(ctx)
	}
	// The store failed last, before Close or in these writes: its pooled
	// connections may have died with the link though MySQL answers again.
	var last lastTry
	if b.storeErr() != nil || perr != nil {
		last = b.lastTry(ctx, func(ctx context.Context) error {
			err, perr = b.writeStore(ctx), b.writePolicies(ctx)
			return errors.Join(err, perr)
		})
		if !last.wrote {
			err, perr = last.err, last.err
		}
	}
	b.logPoliciesNotDurable(perr, last)
	rows, serr := b.Backlog()
	if err == nil {
		err = serr
	}
	b.logNotDurable("rows", rows, err, last, "the region's Redis holds their counts and the region's next bridge writes them")
	return nil
}

// closeRetryMax bounds a bridge's last try at Close (lastTry), reconnection
// and writes together; the try takes at most half of what the shutdown
// context leaves, too.
const closeRetryMax = 2 * time.Second

// lastTry is what a bridge's last try at Close did.
type lastTry struct {
	made   bool          // the try was made
	fresh  bool          // over fresh connections: the store is a Reconnecter
	wrote  bool          // the writes were made: the store reconnected, or cannot
	within time.Duration // its bound
	err    error         // why it failed (the reconnection's error or the writes'); nil: it succeeded
}

// lastTry tries write once more, for a store that failed, within
// closeRetryMax or half of what ctx leaves, whichever is less. A store that
// is a Reconnecter first drops its pooled connections, which may have died
// with the link while the server answers again, and reconnects (past a
// circuit breaker the failures opened); if the server does not answer on a
// fresh connection either, write is not run.
func (b *Bridge) lastTry(ctx context.Context, write func(context.Context) error) lastTry {
	t := lastTry{made: true, within: closeRetryMax}
	if dl, ok := ctx.Deadline(); ok {
		t.within = max(min(t.within, time.Until(dl)/2), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, t.within)
	defer cancel()
	if rc, ok := b.cfg.Store.(Reconnecter); ok {
		t.fresh = true
		if err := rc.Reconnect(ctx); err != nil {
			t.err = fmt.Errorf("store reconnect: %w", err)
			return t
		}
	}
	t.wrote = true
	t.err = write(ctx)
	return t
}

// how is what a line about what the store lacks says of the last try.
func (t lastTry) how() string {
	switch {
	case t.fresh:
		return " after retrying on a fresh connection"
	case t.made:
		return " after retrying"
	}
	return ""
}

// attrs are the log attributes of the last try.
func (t lastTry) attrs() []any {
	if !t.made {
		return nil
	}
	return []any{"retried_within", t.within}
}
