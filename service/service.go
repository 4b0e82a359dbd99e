// Package service is the limiter: a table of window cells answering checks
// from local atomic counters, converging with the region's origin by
// coalesced replay, cold and stale refresh and strict mode, and forgetting
// cells once they can no longer affect a decision.
//
// A Service is safe for simultaneous use by multiple goroutines. A single
// Service never admits beyond the rule of package window, however many
// checks race for one cell: admission is a compare-and-swap on the cell's
// count.
package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Config holds what a Service needs; zero fields take the documented
// defaults.
type Config struct {
	// ID names this process to the origin, which keeps one count per
	// reporter and cell. It must differ between processes sharing an
	// origin. Empty means a random ID.
	ID string
	// Origin is the region's shared store. Nil means the process's own
	// memory is the origin: the cells themselves are the only copy, always
	// fresh, and nothing is replayed or read (the embedded default).
	Origin region.Origin
	// Now is the clock. Nil means the system clock read through a
	// millisecond-resolution cache. Tests pass a clock they advance.
	Now func() time.Time
	// Logger receives state changes. Nil discards them.
	Logger *slog.Logger

	// FreshFor is how long an origin read or a successful replay lets a cell
	// decide without reading origin again. Default 1s.
	FreshFor time.Duration
	// StrictFreshFor is how old, at most, the current cell's origin view may
	// be in strict mode (after a denial) before a check refreshes it first.
	// Concurrent checks share one read. Default 25ms.
	StrictFreshFor time.Duration
	// ReadTimeout bounds how long a check waits on an origin read. Default 50ms.
	ReadTimeout time.Duration
	// ReadRetry is how long after a failed read a cell decides from local
	// state without waiting on origin again. Default 100ms.
	ReadRetry time.Duration

	// FlushInterval is how often admitted cost is replayed to origin when it
	// matters to the region's other limiters: the cell has less than half of
	// its limit left, or this process holds 1% of the limit or more not yet
	// reported. Default 10ms.
	FlushInterval time.Duration
	// FarFlushInterval is how often other admitted cost is replayed: cells
	// far from their limit whose unreported cost is below 1% of it, so that
	// N limiters hide at most N% of a limit from each other this way.
	// Replaying them less often saves origin load. It also bounds what a
	// killed process loses. Default 100ms.
	FarFlushInterval time.Duration
	// FlushWorkers is how many replay calls run at once. Default 8.
	FlushWorkers int
	// FlushBatch is the most cells one replay call carries. Default 512.
	FlushBatch int
	// FlushTimeout bounds one replay call. Default 1s.
	FlushTimeout time.Duration

	// Region names this limiter's region in the components and denials it
	// publishes.
	Region string
	// Global receives components and denials for other regions; nil keeps
	// the limiter regional.
	Global GlobalSink
	// PublishInterval is how often, at most, a cell's regional count is
	// published. Default 20ms.
	PublishInterval time.Duration
	// GlobalMinDuration is the shortest window whose cells are published to
	// other regions. Default 1s (every window the API accepts).
	GlobalMinDuration time.Duration
	// MaxClockSkew is how far the bridge's clock (and so its imports'
	// windows) may be ahead of or behind this process's clock; imports
	// beyond it are refused and counted. Default
	// global.DefaultMaxClockSkew (3s).
	MaxClockSkew time.Duration

	// JanitorInterval is how often cells that can no longer affect a
	// decision are dropped. Default 5s.
	JanitorInterval time.Duration
	// ExpiryGrace is added to a cell's expiry at the origin, for clocks that
	// disagree. Default 60s.
	ExpiryGrace time.Duration
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.FreshFor, time.Second)
	def(&c.StrictFreshFor, 25*time.Millisecond)
	def(&c.ReadTimeout, 50*time.Millisecond)
	def(&c.ReadRetry, 100*time.Millisecond)
	def(&c.FlushInterval, 10*time.Millisecond)
	def(&c.FarFlushInterval, 100*time.Millisecond)
	def(&c.FlushTimeout, time.Second)
	def(&c.JanitorInterval, 5*time.Second)
	def(&c.PublishInterval, 20*time.Millisecond)
	def(&c.GlobalMinDuration, time.Second)
	def(&c.ExpiryGrace, 60*time.Second)
	def(&c.MaxClockSkew, global.DefaultMaxClockSkew)
	if c.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.ID = hex.EncodeToString(b[:])
	}
	if c.FlushWorkers <= 0 {
		c.FlushWorkers = 8
	}
	if c.FlushBatch <= 0 {
		c.FlushBatch = 512
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Query is one check: may Identifier of Workspace/Namespace spend Cost
// against Limit per Duration milliseconds?
type Query struct {
	Workspace  string
	Namespace  string
	Identifier string
	Limit      int64
	Duration   int64 // milliseconds
	Cost       int64
}

// ErrInvalidQuery is wrapped by the error for a query outside the bounds of
// the client API; such a query counts nothing.
var ErrInvalidQuery = errors.New("invalid query")

// ErrClosed is returned by checks after Close has begun.
var ErrClosed = errors.New("service closed")

// Validate reports whether q is inside the bounds of the client API.
func (q *Query) Validate() error {
	switch {
	case q.Workspace == "" || q.Namespace == "":
		return fmt.Errorf("%w: workspace and namespace are required", ErrInvalidQuery)
	case len(q.Identifier) == 0 || len(q.Identifier) > window.MaxIdentifierLen:
		return fmt.Errorf("%w: identifier must be 1 to %d bytes, got %d", ErrInvalidQuery, window.MaxIdentifierLen, len(q.Identifier))
	case q.Limit < 0 || q.Limit > window.MaxLimit:
		return fmt.Errorf("%w: limit must be between 0 and %d, got %d", ErrInvalidQuery, int64(window.MaxLimit), q.Limit)
	case q.Duration < window.MinDuration || q.Duration > window.MaxDuration:
		return fmt.Errorf("%w: duration must be between %d and %d milliseconds, got %d", ErrInvalidQuery, window.MinDuration, window.MaxDuration, q.Duration)
	case q.Cost < 0 || q.Cost > window.MaxCost:
		return fmt.Errorf("%w: cost must be between 0 and %d, got %d", ErrInvalidQuery, int64(window.MaxCost), q.Cost)
	}
	return nil
}

func (q *Query) key() bucketKey {
	return bucketKey{workspace: q.Workspace, namespace: q.Namespace, identifier: q.Identifier, duration: q.Duration}
}

// Service is a limiter's table of cells. Create it with New and release it
// with Close, which replays what is pending.
type Service struct {
	cfg       Config
	clock     *coarseClock  // non-nil when cfg.Now was nil
	origin    region.Origin // nil: local only
	log       *slog.Logger
	table     *table
	flight    singleflight.Group
	replay    replayStack
	counters  counters
	global    GlobalSink
	gstate    globalState
	early     earlyImports
	refused   *global.Refusals
	globalMin int64 // milliseconds
	// flushMu serializes replay rounds; deferred holds queued cells not yet
	// due (far from their limit and reported recently).
	flushMu  sync.Mutex
	deferred []*cell
	// deferredN is len(deferred), for Stats, which must not wait on flushMu.
	deferredN atomic.Int64
	// replayBackoff and replayBackoffUntil (unix ms) pace replay rounds after
	// failures; only the replay loop touches them.
	replayBackoff      time.Duration
	replayBackoffUntil int64

	freshFor, strictFreshFor, readRetry, flushInterval int64 // milliseconds
	// originOpenUntil (unix ms) is set when the origin's breaker refused a
	// read: until then every cell, cold ones too, decides locally at once.
	originOpenUntil atomic.Int64

	closed atomic.Bool
	// track is set when Close has something to hand on (an origin or a
	// global sink), so checks in flight are counted.
	track bool
	// inflight counts the checks and batches running; Close waits until it
	// is zero. It sits on a cache line of its own: every check writes it.
	_        [64]byte
	inflight atomic.Int64
	_        [56]byte
	idle     chan struct{} // a token when inflight drops to 0 after Close began
	stop     chan struct{}
	stopOnce sync.Once
	loops    sync.WaitGroup
}

// New starts a Service with its replay and janitor loops.
func New(cfg Config) *Service {
	cfg.setDefaults()
	s := &Service{
		cfg:            cfg,
		origin:         cfg.Origin,
		log:            cfg.Logger,
		table:          newTable(),
		freshFor:       cfg.FreshFor.Milliseconds(),
		strictFreshFor: cfg.StrictFreshFor.Milliseconds(),
		readRetry:      cfg.ReadRetry.Milliseconds(),
		flushInterval:  cfg.FlushInterval.Milliseconds(),
		global:         cfg.Global,
		globalMin:      cfg.GlobalMinDuration.Milliseconds(),
		stop:           make(chan struct{}),
		idle:           make(chan struct{}, 1),
		track:          cfg.Origin != nil || cfg.Global != nil,
		refused:        global.NewRefusals(cfg.Logger, 10*time.Second),
	}
	s.early.m = make(map[earlyKey]global.Import)
	if cfg.Now == nil {
		s.loops.Add(1)
		s.clock = startCoarseClock(s.stop, s.loops.Done)
		s.cfg.Now = func() time.Time { return time.UnixMilli(s.clock.ms.Load()) }
	}
	s.loops.Add(1)
	go s.every(cfg.JanitorInterval, s.janitorTick, nil)
	if s.origin != nil {
		s.loops.Add(1)
		go s.every(cfg.FlushInterval, s.replayTick, nil)
	}
	if s.global != nil {
		s.loops.Add(1)
		// The last round publishes what the last admissions changed.
		go s.every(cfg.PublishInterval, s.publishTick, s.publishLast)
	}
	return s
}

// Now returns the service's clock: what its windows are reckoned by.
func (s *Service) Now() time.Time { return time.UnixMilli(s.nowMs()) }

func (s *Service) nowMs() int64 {
	if s.clock != nil {
		return s.clock.ms.Load()
	}
	return s.cfg.Now().UnixMilli()
}

// TryCheck decides q if it can do so from local state without waiting on the
// origin: the cells exist, are fresh, and strict mode needs no refresh. When
// ok is false nothing was counted and the caller must use Check. An invalid
// query returns ok true and an error wrapping ErrInvalidQuery.
func (s *Service) TryCheck(q Query) (d window.Decision, ok bool, err error) {
	if err := q.Validate(); err != nil {
		return window.Decision{}, true, err
	}
	if !s.enter() {
		return window.Decision{}, true, ErrClosed
	}
	// Local only, or the origin's breaker open: nothing to wait for.
	if s.origin == nil || s.nowMs() < s.originOpenUntil.Load() {
		_, cur, prev, now := s.cells(q)
		d, _ = s.admit(cur, prev, now, q, true, false)
		s.leave()
		return d, true, nil
	}
	d, ok = s.tryWarm(q)
	s.leave()
	return d, ok, nil
}

// tryWarm decides q at once if its cells are warm and fresh and it is far
// from its limit.
func (s *Service) tryWarm(q Query) (window.Decision, bool) {
	now := s.nowMs()
	b := s.table.load(q.key())
	if b == nil {
		return window.Decision{}, false
	}
	seq := now / q.Duration
	cur, prev := b.peek(seq), b.peek(seq-1)
	if cur == nil || prev == nil || !s.ready(b, cur, prev, now) {
		return window.Decision{}, false
	}
	d, toOrigin := s.admit(cur, prev, now, q, true, true)
	return d, !toOrigin // near the limit: the caller's Check asks the origin
}

// Check decides q, first reading the origin when the cells are cold, stale
// or in strict mode. It waits on the origin at most ReadTimeout (or until
// ctx ends) and then decides from local state: a slow or failed origin never
// fails a check.
func (s *Service) Check(ctx context.Context, q Query) (window.Decision, error) {
	return s.check(ctx, q, true)
}

// CheckLocal decides q from local state at once, as Check does while the
// origin is failing: it neither reads the origin nor waits, and the cells
// stay as cold or stale as they were, so a later Check reads them. For a
// caller that cannot afford to wait (too many checks waiting already).
func (s *Service) CheckLocal(q Query) (window.Decision, error) {
	return s.check(context.Background(), q, false)
}

func (s *Service) check(ctx context.Context, q Query, wait bool) (window.Decision, error) {
	if err := q.Validate(); err != nil {
		return window.Decision{}, err
	}
	if !s.enter() {
		return window.Decision{}, ErrClosed
	}
	defer s.leave()
	b, cur, prev, now := s.cells(q)
	if wait && !s.ready(b, cur, prev, now) {
		s.refresh(ctx, cur, prev)
	}
	d, toOrigin := s.admit(cur, prev, now, q, true, wait)
	if toOrigin {
		d = s.admitAtOrigin(ctx, cur, prev, now, q)
	}
	return d, nil
}

// cells returns the bucket and the current and previous cells of q at now,
// creating what is missing. If another check already moved the bucket to a
// later window, q is evaluated at the start of that window instead, so no
// check ever counts into a window older than one already seen. Only checks
// install cells ahead of the local clock, and only by their own clocks
// (imports for later windows wait in the early-import stash), so each turn
// of the loop moves now forward by whole windows to a sequence that exists,
// and every sequence stays below window.MaxSequence.
func (s *Service) cells(q Query) (b *bucket, cur, prev *cell, now int64) {
	now = s.nowMs()
	for {
		b = s.table.loadOrCreate(q.key())
		seq := now / q.Duration
		// The common case: both cells are there.
		if cur, prev = b.peek(seq), b.peek(seq-1); cur != nil && prev != nil && !b.dead.Load() {
			return b, cur, prev, now
		}
		var newCur, newPrev bool
		cur, newCur = b.cellFor(seq)
		prev, newPrev = b.cellFor(seq - 1)
		if cur == nil || prev == nil {
			newer := max(b.slotNewer(seq), b.slotNewer(seq-1))
			now = max(now, min(newer, window.MaxSequence(q.Duration))*q.Duration)
			continue
		}
		if b.dead.Load() {
			continue // the janitor is removing this bucket; take the new one
		}
		if newCur {
			s.applyEarly(cur)
		}
		if newPrev {
			s.applyEarly(prev)
		}
		return b, cur, prev, now
	}
}

// ready reports whether a decision may use the cells as they are.
func (s *Service) ready(b *bucket, cur, prev *cell, now int64) bool {
	if s.origin == nil {
		return true
	}
	if now < cur.failedAt.Load()+s.readRetry || now < s.originOpenUntil.Load() {
		return true // origin failing: decide locally, retry soon
	}
	if !cur.fresh(now, s.freshFor) || !prev.fresh(now, s.freshFor) {
		return false
	}
	return now >= b.strictUntil.Load() || now < cur.syncedAt.Load()+s.strictFreshFor
}

// refresh reads both cells from origin, sharing one read among concurrent
// callers, and waits for it at most until ctx ends.
func (s *Service) refresh(ctx context.Context, cur, prev *cell) {
	c := cur.identity()
	key := c.Workspace + "\x00" + c.Namespace + "\x00" + c.Identifier + "\x00" +
		strconv.FormatInt(c.Duration, 10) + ":" + strconv.FormatInt(c.Sequence, 10)
	ch := s.flight.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadTimeout)
		defer cancel()
		start := time.Now()
		tc, tp, err := s.origin.Read(rctx, c)
		s.counters.reads.Add(1)
		s.counters.readNanos.Add(int64(time.Since(start)))
		now := s.nowMs()
		if err != nil {
			s.counters.readErrs.Add(1)
			// While the breaker refuses every read, until a read may probe
			// again, no cell waits on one.
			s.originFailed(cur, now, err)
			s.log.Debug("origin read failed", "workspace", c.Workspace, "namespace", c.Namespace, "error", err)
			return nil, err
		}
		for _, m := range [...]struct {
			c      *cell
			totals region.Totals
		}{{cur, tc}, {prev, tp}} {
			m.c.mu.Lock()
			m.c.merge(m.totals.Count, now)
			m.c.mu.Unlock()
			// Other regions' usage, as the bridge last told the region:
			// a cell created since starts from the global view.
			raiseTo(&m.c.imported, m.totals.Foreign)
			if m.c == cur {
				s.observe(cur, tc.Count, now)
			}
			if s.global != nil {
				s.queueGlobal(m.c, 0)
			}
		}
		return nil, nil
	})
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// admit applies the rule and, when admitted, adds the cost to the cell's
// count by compare-and-swap; with commit it also queues the cell for replay
// and publishing. A denial is always local: counts only grow within a
// window, so what the local view denies the region denies too. With
// viaOrigin, an admission near the limit (near) counts nothing and returns
// toOrigin true: the caller must decide it at the origin.
func (s *Service) admit(cur, prev *cell, now int64, q Query, commit, viaOrigin bool) (d window.Decision, toOrigin bool) {
	in := window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Cost: q.Cost, Previous: prev.usage()}
	for {
		c := cur.count.Load()
		in.Current = cur.usageWith(c)
		d := window.Decide(in)
		if !d.Admitted {
			s.denied(cur, now, q, d)
			return d, false
		}
		if q.Cost == 0 {
			return d, false
		}
		if viaOrigin && s.near(cur, q, d, now) {
			return d, true
		}
		if cur.count.CompareAndSwap(c, c+q.Cost) {
			if commit {
				s.committed(cur, q, d)
			}
			return d, false
		}
	}
}

// committed queues admitted cost for replay and the cell for publishing.
func (s *Service) committed(c *cell, q Query, d window.Decision) {
	if s.origin != nil {
		s.noteLimit(c, q.Limit, d.Remaining)
		s.queueReplay(c, q.Cost)
	}
	if s.global != nil {
		s.queueGlobal(c, q.Limit)
	}
}

// noteLimit records what the replay cadence needs after an admission: the
// limit, and whether less than half of it is left.
func (s *Service) noteLimit(c *cell, limit, remaining int64) {
	if c.limit.Load() != limit {
		c.limit.Store(limit)
	}
	if 2*remaining < limit {
		c.set(flagNear)
	}
}

// denied puts the cell's identifier into strict mode until the end of the
// window after the denial: the denied window still weighs in the next one.
// It also publishes the cell's first denial to other regions when the
// rules of package global allow.
func (s *Service) denied(cur *cell, now int64, q Query, d window.Decision) {
	until := (cur.seq + 2) * cur.b.key.duration
	for {
		old := cur.b.strictUntil.Load()
		if old >= until || cur.b.strictUntil.CompareAndSwap(old, until) {
			break
		}
	}
	if s.global != nil {
		s.publishDenial(cur, q, d)
	}
}

// enter registers a check in flight, unless Close has begun: then it
// returns false and the check must not run. A check that entered runs to
// its end before Close replays and publishes for the last time. A service
// with neither origin nor global sink has nothing to hand on at Close, so
// its checks are not counted.
func (s *Service) enter() bool {
	if !s.track {
		return !s.closed.Load()
	}
	s.inflight.Add(1)
	if s.closed.Load() {
		s.leave()
		return false
	}
	return true
}

// leave ends what enter began.
func (s *Service) leave() {
	if !s.track {
		return
	}
	if s.inflight.Add(-1) == 0 && s.closed.Load() {
		select {
		case s.idle <- struct{}{}:
		default: // a token is already waiting
		}
	}
}

// Closed reports whether Close has begun.
func (s *Service) Closed() bool { return s.closed.Load() }

// Close stops taking checks, waits for the checks and batches already
// running (a check waits on the origin at most ReadTimeout), replays
// everything pending (retrying until ctx ends or the origin is known to be
// down; see drain) and closes the origin. It returns an error if checks were
// still running or cost was still pending when it gave up; the error says
// how much.
func (s *Service) Close(ctx context.Context) error {
	s.closed.Store(true)
	err := s.waitIdle(ctx)
	s.stopOnce.Do(func() { close(s.stop) })
	s.loops.Wait()
	if s.origin == nil {
		return err
	}
	err = errors.Join(err, s.drain(ctx))
	if cerr := s.origin.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close origin: %w", cerr))
	}
	return err
}

// waitIdle waits until no check is running or ctx ends.
func (s *Service) waitIdle(ctx context.Context) error {
	for s.inflight.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			return fmt.Errorf("%d checks still running: %w", s.inflight.Load(), ctx.Err())
		}
	}
	return nil
}
