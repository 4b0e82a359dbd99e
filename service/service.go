// Package service is the limiter: a table of window cells answering checks
// from local atomic counters. With an origin (the region's Redis), an
// admission is final only once the origin counts it: it is spent from a
// lease the origin granted, or the check waits on a sync that carries it.
// Every sync of a cell goes through one exchange (exchange.go): a cold or
// stale cell's refresh, the checks waiting on a cell, and the settle loop
// that reports admissions and renews or gives back leases in the
// background. Cells are forgotten once they can no longer affect a
// decision.
//
// A Service is safe for simultaneous use by multiple goroutines. A single
// Service never admits beyond the rule of package window, however many
// checks race for one cell: admission is a compare-and-swap on the cell's
// count.
//
// The quantities of a cell (one identifier's window), by the names the
// code uses:
//
//   - count: a lower bound of the region's admissions in the cell (what
//     the origin last reported, plus this process's admissions since);
//     local denials and replies' remaining read it.
//   - imported: the other regions' usage of the cell, as the bridge sent it.
//   - top: what the origin counts for this process (its claim):
//     admissions, unused lease, and reservations held.
//   - avail: the unused lease, spent without asking the origin until
//     leaseUntil.
//   - held: what batches reserved and have not committed or given back.
//   - used: this process's admissions, top − avail − held.
//   - local: what this process admitted without the origin (it failed),
//     under its local ID; not part of top.
//   - syncedAt: when the origin last answered a sync of the cell.
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

	"github.com/puzpuzpuz/xsync/v4"
	"golang.org/x/sync/singleflight"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
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
	// fresh, and nothing is synced or read (the embedded default).
	Origin region.Origin
	// Now is the clock. Nil means the system clock read through a
	// millisecond-resolution cache. Tests pass a clock they advance.
	Now func() time.Time
	// Logger receives state changes. Nil discards them.
	Logger *slog.Logger

	// FreshFor is how long an origin read or a successful sync lets a cell
	// decide without reading origin again. Default 1s.
	FreshFor time.Duration
	// StrictFreshFor is how old, at most, the current cell's origin view may
	// be in strict mode (after a denial) before a check refreshes it first.
	// Concurrent checks share one read. Default 25ms.
	StrictFreshFor time.Duration
	// ReadTimeout bounds an origin call on the request path, and so how
	// long a check waits on one: a call that has not answered by then
	// failed (towards the breaker), and its checks are denied. It is long
	// enough that a loaded but healthy origin answers within it, so only
	// a failing one opens the breaker. Default 250ms.
	ReadTimeout time.Duration
	// ReadRetry is how long after a failed read a cell decides from local
	// state without waiting on origin again. Default 100ms.
	ReadRetry time.Duration

	// FlushInterval is how often the settle loop runs, and how often it
	// syncs a cell near its limit (less than half of it left): reporting
	// what this process admitted, renewing or giving back its lease.
	// Default 10ms.
	FlushInterval time.Duration
	// FarFlushInterval is how often the settle loop syncs other cells, and
	// how long a lease may stay unused before it is given back. Default
	// 100ms.
	FarFlushInterval time.Duration
	// LeaseFor is how long this process spends a lease the origin granted,
	// from when it asked (renewals extend it while it admits); the origin
	// keeps the lease live leaseGrace longer. Near the limit an unused lease
	// goes back after FarFlushInterval, and at once when another limiter
	// waits on it; a lease of a limiter that died counts as used once no
	// longer live. Default 1s.
	LeaseFor time.Duration
	// LeaseAhead is how much of this process's recent traffic in an
	// identifier a lease covers: it asks the origin for what it admits in
	// LeaseAhead at its recent rate, and at least 1% of the limit, topped up
	// once half is spent. What is unused goes back before the lease ends,
	// so it bounds what a SIGKILL of this process over-counts a cell by
	// (the origin counts an ended lease's unused part as used). Default
	// 200ms.
	LeaseAhead time.Duration
	// ForgetAfter is the origin's ForgetAfter (region.ForgetAfter, the
	// default): a cell this process has not synced for half of it is
	// reported under a new generation. Tests that shorten the origin's
	// shorten this too.
	ForgetAfter time.Duration
	// FlushWorkers is how many settle calls run at once. Default 2: Redis
	// runs one script at a time, and each settle call in flight puts its
	// script calls ahead of the checks' round trips.
	FlushWorkers int
	// FlushBatch is the most cells one settle call carries. Default 512.
	FlushBatch int
	// FlushTimeout bounds one settle call. Default 1s.
	FlushTimeout time.Duration

	// Region names this limiter's region in the components and denials it
	// publishes.
	Region string
	// Global receives components and denials for other regions; nil keeps
	// the limiter regional.
	Global GlobalSink
	// Locals, if set, sends this process's local counts (what it admitted
	// without the origin) to the region's other limiters, which pass them
	// to the origin should this process die first (local.go). Set it only
	// with an origin the region's limiters share.
	Locals LocalPublisher
	// Decisions, if set, receives every check's decision as it is made
	// (DecisionSink): the stream of who is being limited. It runs on the
	// check's path and must never wait.
	Decisions DecisionSink
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

	// Policies holds the overrides checks are decided by (README,
	// "Overrides and shadow mode"). Nil gives the service a table of its own (Service.Policies),
	// empty until something sets an override in it.
	Policies *policy.Table
	// Marks holds the reset marks checks are decided by (README, "Reset
	// an identifier"): a check counts in the cells of its identifier's latest
	// reset epoch (policy.CellEpoch). Nil gives the service marks of its
	// own (Service.Marks), empty until Reset or ApplyMarks. Marks merged
	// into it directly reach cells made afterwards; ApplyMarks also
	// forgets the cells already held.
	Marks *policy.Marks
}

func (c *Config) setDefaults() {
	def(&c.FreshFor, time.Second)
	def(&c.StrictFreshFor, 25*time.Millisecond)
	def(&c.ReadTimeout, 250*time.Millisecond)
	def(&c.ReadRetry, 100*time.Millisecond)
	def(&c.FlushInterval, 10*time.Millisecond)
	def(&c.FarFlushInterval, 100*time.Millisecond)
	def(&c.LeaseFor, time.Second)
	def(&c.LeaseAhead, 200*time.Millisecond)
	def(&c.ForgetAfter, region.ForgetAfter)
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
	def(&c.FlushWorkers, 2)
	def(&c.FlushBatch, 512)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// def sets *d to v unless it is positive.
func def[T int | time.Duration](d *T, v T) {
	if *d <= 0 {
		*d = v
	}
}

// Query is one check: may Identifier of Workspace/Namespace spend Cost
// against Limit per Duration milliseconds?
type Query struct {
	Workspace  string
	Namespace  string
	Identifier string
	Limit      int64
	Duration   int64 // milliseconds, or a calendar period (window.Calendar)
	Cost       int64
	// Shadow asks for shadow mode: q is counted exactly as if enforced and
	// its Decision says Shadow, which the reply turns into a success where
	// enforcement denies. An override in shadow mode sets it too.
	Shadow bool
	// Fixed asks for a fixed window (window.Input.Fixed): the cell's own
	// count alone is weighed, and the whole limit comes back when the
	// window ends. Checks of both kinds on one identifier and duration
	// share its cells and counts; each is decided by its own rule.
	Fixed bool
	// Charge is how Cost is charged (window.Charge): all or nothing (the
	// default), drained to what the limit has left, or debited whatever
	// the room. A debit is never refused: with the origin failing or slow
	// it is counted here and reported later, as a local admission is.
	Charge window.Charge
	// override is the pattern of the override police applied ("" none),
	// for the Decision.
	override string
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
	case window.ValidDuration(q.Duration) != nil:
		return fmt.Errorf("%w: %w", ErrInvalidQuery, window.ValidDuration(q.Duration))
	case q.Cost < 0 || q.Cost > window.MaxCost:
		return fmt.Errorf("%w: cost must be between 0 and %d, got %d", ErrInvalidQuery, int64(window.MaxCost), q.Cost)
	case q.Charge > window.ChargeDebit:
		return fmt.Errorf("%w: %v is not a charge (all, drain or debit)", ErrInvalidQuery, q.Charge)
	}
	return nil
}

// input is the rule's input for q at now, given the counts of its cell
// and of the cell before it.
func (q *Query) input(now, current, previous int64) window.Input {
	return window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Cost: q.Cost,
		Current: current, Previous: previous, Fixed: q.fixed()}
}

// fixed reports whether q's window is fixed: asked for, or a calendar
// period's.
func (q *Query) fixed() bool { return q.Fixed || window.IsCalendar(q.Duration) }

func (q *Query) key() bucketKey {
	return bucketKey{workspace: q.Workspace, namespace: q.Namespace, identifier: q.Identifier, duration: q.Duration}
}

// Service is a limiter's table of cells. Create it with New and release it
// with Close, which settles what is pending.
type Service struct {
	cfg      Config
	policies *policy.Table
	marks    *policy.Marks
	series   seriesCounts
	sink     DecisionSink
	clock    *coarseClock  // non-nil when cfg.Now was nil
	origin   region.Origin // nil: local only
	table    *table
	flight   singleflight.Group
	settle   cellStack
	counters counters
	// queues holds, per cell, the checks waiting on the origin (lease.go);
	// syncers counts the syncers serving them, which run on syncWorkers
	// (syncWork hands a syncer to an idle one).
	queues      *xsync.Map[*cell, *queue]
	syncers     sync.WaitGroup
	syncWork    chan syncJob
	syncWorkers atomic.Int64
	seq         atomic.Int64 // the Seq of this process's syncs
	// locals is what this process admitted without the origin, per cell;
	// others what the region's other limiters did, until the origin holds
	// it (local.go). localID names this process's local counts at the
	// origin: random per start.
	locals    localCounts
	others    localRecords
	localID   string
	global    GlobalSink
	gstate    globalState
	early     earlyImports
	refused   *global.Refusals
	globalMin int64 // milliseconds
	// flushMu serializes settle rounds; deferred holds queued cells not yet
	// due.
	flushMu  sync.Mutex
	deferred []*cell
	// deferredN is len(deferred), for Stats, which must not wait on flushMu.
	deferredN atomic.Int64
	// settleBackoff and settleBackoffUntil (unix ms) pace settle rounds
	// after failures; only the settle loop touches them.
	settleBackoff      time.Duration
	settleBackoffUntil int64

	freshFor, strictFreshFor, readRetry, flushInterval, leaseFor int64 // milliseconds
	leaseAhead, forgetMs                                         int64 // milliseconds
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

// New starts a Service with its settle, publish and janitor loops.
func New(cfg Config) *Service { return start(cfg, true) }

// start is New; without settleLoop the settle loop does not run (tests
// that move a manual clock run its rounds themselves, settleTick).
func start(cfg Config, settleLoop bool) *Service {
	cfg.setDefaults()
	s := &Service{
		cfg:            cfg,
		sink:           cfg.Decisions,
		policies:       cfg.Policies,
		marks:          cfg.Marks,
		origin:         cfg.Origin,
		table:          newTable(),
		freshFor:       cfg.FreshFor.Milliseconds(),
		strictFreshFor: cfg.StrictFreshFor.Milliseconds(),
		readRetry:      cfg.ReadRetry.Milliseconds(),
		flushInterval:  cfg.FlushInterval.Milliseconds(),
		leaseFor:       cfg.LeaseFor.Milliseconds(),
		leaseAhead:     cfg.LeaseAhead.Milliseconds(),
		forgetMs:       cfg.ForgetAfter.Milliseconds(),
		queues:         xsync.NewMap[*cell, *queue](),
		syncWork:       make(chan syncJob),
		global:         cfg.Global,
		globalMin:      cfg.GlobalMinDuration.Milliseconds(),
		stop:           make(chan struct{}),
		idle:           make(chan struct{}, 1),
		track:          cfg.Origin != nil || cfg.Global != nil,
		refused:        global.NewRefusals(cfg.Logger, 10*time.Second),
	}
	if s.policies == nil {
		s.policies = policy.NewTable()
	}
	if s.marks == nil {
		s.marks = policy.NewMarks()
	}
	s.early.m = make(map[earlyKey]global.Import)
	s.locals.m = make(map[*cell]*localCount)
	s.others.m = make(map[localKey]localRecord)
	s.settle.flag, s.settle.link = flagQueued, linkSettle
	s.gstate.stack.flag, s.gstate.stack.link = flagGlobalQueued, linkGlobal
	var lid [8]byte
	_, _ = rand.Read(lid[:])
	s.localID = hex.EncodeToString(lid[:])
	if cfg.Now == nil {
		s.clock = &coarseClock{}
		s.clock.tick()
		s.loops.Add(1)
		go s.every(coarseResolution, s.clock.tick, nil)
		s.cfg.Now = func() time.Time { return time.UnixMilli(s.clock.ms.Load()) }
	}
	s.loops.Add(1)
	go s.every(cfg.JanitorInterval, s.janitorTick, nil)
	if s.origin != nil && settleLoop {
		s.loops.Add(1)
		go s.every(cfg.FlushInterval, s.settleTick, nil)
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
// origin: the cells exist and are fresh (or q spends this process's lease),
// and q is denied by what the region is known to have admitted, or spends
// the lease. When ok is false nothing was counted and the caller must use
// Check. An invalid query returns ok true and an error wrapping
// ErrInvalidQuery. The overrides apply (Decision.Limit, Decision.Shadow).
func (s *Service) TryCheck(q Query) (d Decision, ok bool, err error) {
	if err := q.Validate(); err != nil {
		return Decision{}, true, err
	}
	if !s.enter() {
		return Decision{}, true, ErrClosed
	}
	// Local only, or the origin's breaker open: nothing to wait for.
	if s.origin == nil || s.nowMs() < s.originOpenUntil.Load() {
		b := s.table.load(q.key())
		if s.policies.Generation() != 0 {
			s.police(&q, b)
			if b != nil && b.key.duration != q.Duration {
				b = nil // the override's duration: another bucket
			}
		}
		b, cur, prev, now := s.cellsFrom(q, b)
		wd, _ := s.admit(cur, prev, now, q, true)
		s.leave()
		if drainsRest(&q, wd) {
			return Decision{}, false, nil
		}
		return s.decided(&q, b, wd), true, nil
	}
	wd, b, ok := s.tryWarm(&q)
	s.leave()
	if !ok || drainsRest(&q, wd) {
		return Decision{}, false, nil
	}
	return s.decided(&q, b, wd), true, nil
}

// drainsRest reports whether q, decided d, is a drain denied with room
// left: what is left is charged by a second check (drainRest), Check's.
func drainsRest(q *Query, d window.Decision) bool {
	return q.Charge == window.ChargeDrain && !d.Admitted && d.Remaining > 0 && q.Cost > 0
}

// tryWarm decides q at once if its cells are warm and the decision needs
// no origin: a denial by fresh counts, a look at them, or an admission the
// lease covers (fresh or not: the origin charged it in advance). It
// applies the overrides to q.
func (s *Service) tryWarm(qp *Query) (window.Decision, *bucket, bool) {
	now := s.nowMs()
	b := s.table.load(qp.key())
	if b == nil && s.policies.Generation() == 0 {
		return window.Decision{}, nil, false
	}
	// With no bucket of the query's own duration, an override of another
	// duration may still apply: its cells are in the bucket of that one.
	s.police(qp, b)
	q := *qp
	if b == nil || b.key.duration != q.Duration {
		if b = s.table.load(q.key()); b == nil {
			return window.Decision{}, nil, false
		}
	}
	seq := window.Sequence(now, q.Duration)
	cur, prev := b.peek(seq), b.peek(seq-1)
	if cur == nil || prev == nil {
		return window.Decision{}, nil, false
	}
	local := s.failing(b, now)
	if q.Charge == window.ChargeDebit && !local && !s.leaseCovers(cur, prev, now, q) {
		return window.Decision{}, nil, false // charged at the origin, or here when it cannot be waited on: Check's
	}
	if !local && s.stalled(b, now) && !s.leaseCovers(cur, prev, now, q) {
		return s.retryDenial(cur, prev, now, q), b, true
	}
	if !local && !s.ready(b, cur, prev, now, &q) && !s.leaseCovers(cur, prev, now, q) {
		if d, denied := s.firmDenies(cur, prev, now, q); denied && q.Cost > 0 {
			s.denied(cur, now, q, d)
			return d, b, true
		}
		return window.Decision{}, nil, false // a look or a denial wants fresh counts
	}
	d, ok := s.admit(cur, prev, now, q, local)
	return d, b, ok
}

// Check decides q: from the lease or the known counts when they suffice,
// else at the origin, first refreshing cold, stale or strict cells when
// that may turn into a denial or q only looks. It waits on the origin at
// most until ctx ends (a call that does not answer within ReadTimeout
// fails) and then decides from local state: a slow or failed origin never
// fails a check. The overrides apply (Decision.Limit, Decision.Shadow).
func (s *Service) Check(ctx context.Context, q Query) (Decision, error) {
	return s.check(ctx, q, true)
}

// CheckLocal decides q from local state at once, as Check does while the
// origin is failing: it neither asks the origin nor waits (an admission the
// lease does not cover is counted uncovered and reported later), and the
// cells stay as cold or stale as they were, so a later Check reads them.
// For a caller that cannot afford to wait (too many checks waiting already).
func (s *Service) CheckLocal(q Query) (Decision, error) {
	return s.check(context.Background(), q, false)
}

func (s *Service) check(ctx context.Context, q Query, wait bool) (Decision, error) {
	if err := q.Validate(); err != nil {
		return Decision{}, err
	}
	if !s.enter() {
		return Decision{}, ErrClosed
	}
	defer s.leave()
	hint := s.table.load(q.key())
	s.police(&q, hint)
	if hint != nil && hint.key.duration != q.Duration {
		hint = nil
	}
	d, err := s.checkPoliced(ctx, q, wait, hint)
	if err == nil && drainsRest(&q, d) {
		d = s.drainRest(ctx, q, wait, hint, d)
	}
	return s.decided(&q, hint, d), err
}

// drainRest charges what the limit has left of q's cost after q, a drain, was
// denied with d: a check of min(d.Remaining, cost) by the same rule. What
// it admits is charged; q stays denied (d's RetryAfter: when its whole cost
// would fit), with what the limit has left after the charge. Room others
// took meanwhile leaves less, or nothing, to drain.
func (s *Service) drainRest(ctx context.Context, q Query, wait bool, hint *bucket, d window.Decision) window.Decision {
	rest := q
	rest.Cost, rest.Charge = min(d.Remaining, q.Cost), window.ChargeAll
	if rd, err := s.checkPoliced(ctx, rest, wait, hint); err == nil && rd.Admitted {
		d.Remaining = rd.Remaining
		s.counters.Drains.Add(1)
		s.counters.DrainedCost.Add(rest.Cost)
	}
	return d
}

// checkPoliced is check for q with the overrides applied; hint, when not
// nil, is q's bucket.
func (s *Service) checkPoliced(ctx context.Context, q Query, wait bool, hint *bucket) (window.Decision, error) {
	b, cur, prev, now := s.cellsFrom(q, hint)
	local := s.origin == nil || s.failing(b, now)
	if !local && wait && !s.stalled(b, now) && !s.ready(b, cur, prev, now, &q) &&
		(q.Cost == 0 || !s.peekDecision(cur, prev, now, q).Admitted) {
		// A look, or a check the stale view would deny: refresh first. A
		// check it admits goes to the origin (or spends the lease) anyway.
		s.refresh(ctx, cur, prev)
		local = s.failing(b, now)
	}
	stalled := !local && wait && s.stalled(b, now) && !s.leaseCovers(cur, prev, now, q)
	if stalled && q.Charge != window.ChargeDebit {
		return s.retryDenial(cur, prev, now, q), nil
	}
	// A debit is never refused: while stalled, it is counted here and
	// reported later.
	if d, ok := s.admit(cur, prev, now, q, local || !wait || stalled); ok {
		return d, nil
	}
	w := s.await(ctx, cur, prev, q, false)
	switch {
	case w.failed && q.Charge != window.ChargeDebit &&
		(w.pended.Load() || (w.gaveUp || w.slow) && !s.failing(b, s.nowMs())):
		// The caller gave up while the origin answers (the check was
		// pending on leases held elsewhere, queued behind another check's
		// sync, or on its way), the origin's answer was late (stalled), or
		// it failed after it said the check fits only if leases held
		// elsewhere are unused: it is denied, never admitted from this
		// process's counts, which miss what other limiters hold.
		return s.retryDenial(cur, prev, now, q), nil
	case w.failed:
		// Decided locally. A debit is never refused: counted here and
		// reported later. Should the origin have charged it too, its grant
		// joins the lease, which goes back (answerWaiters), so it counts
		// once from the next sync on; until then, twice, towards denial.
		d, _ := s.admit(cur, prev, now, q, true)
		return d, nil
	}
	return w.d, nil
}

// failing reports whether the origin is failing for the identifier of b at
// now: a call to it failed (refused, reset: not merely late) within
// ReadRetry, or the breaker refuses calls. Checks are then decided locally.
func (s *Service) failing(b *bucket, now int64) bool {
	f := b.failedAt.Load()
	return f > 0 && now < f+s.readRetry || now < s.originOpenUntil.Load()
}

// stalled reports whether a call for the identifier of b outlasted
// ReadTimeout within ReadRetry before now, while the origin is not known to
// fail: its checks the lease does not cover are denied at once
// (retryDenial), however far from its limit the cell is. A late call says
// the origin, or this process, is slow, not that the origin is down: it
// may still apply the call and answer the other limiters, whose leases
// and grants this process's counts miss, and in a burst they spend any
// share of the limit within a view's age. Once late calls make the
// breaker open, checks are decided locally (failing).
func (s *Service) stalled(b *bucket, now int64) bool {
	f := b.failedAt.Load()
	return f < 0 && now < -f+s.readRetry && now >= s.originOpenUntil.Load()
}

// retryDenial is the decision for q when the origin cannot decide it in
// time and this process's counts must not (its identifier is stalled, or
// the caller gave up while the origin answers): a look answers from the
// known counts, a check is denied and asked to retry.
func (s *Service) retryDenial(cur, prev *cell, now int64, q Query) window.Decision {
	d := s.peekDecision(cur, prev, now, q)
	if q.Cost > 0 {
		d.Admitted, d.RetryAfter = false, max(d.RetryAfter, 1)
		s.counters.WaitsDenied.Add(1)
	}
	return d
}

// leaseCovers reports whether the view admits q (a debit: whatever the
// room) and the lease covers it.
func (s *Service) leaseCovers(cur, prev *cell, now int64, q Query) bool {
	return q.Cost > 0 && now < cur.leaseUntil.Load() && cur.avail.Load() >= q.Cost &&
		(q.Charge == window.ChargeDebit || s.peekDecision(cur, prev, now, q).Admitted)
}

// cellsFrom returns the bucket and the current and previous cells of q at
// now, starting from hint (q's bucket when not nil), creating what is
// missing. If another check already moved the bucket to a
// later window, q is evaluated at the start of that window instead, so no
// check ever counts into a window older than one already seen. Only checks
// install cells ahead of the local clock, and only by their own clocks
// (imports for later windows wait in the early-import stash), so each turn
// of the loop moves now forward by whole windows to a sequence that exists,
// and every sequence stays below window.MaxSequence.
func (s *Service) cellsFrom(q Query, hint *bucket) (b *bucket, cur, prev *cell, now int64) {
	now = s.nowMs()
	for {
		if b = hint; b == nil {
			b = s.table.loadOrCreate(q.key())
		}
		hint = nil
		seq := window.Sequence(now, q.Duration)
		// The common case: both cells are there.
		if cur, prev = b.peek(seq), b.peek(seq-1); cur != nil && prev != nil && !b.dead.Load() {
			return b, cur, prev, now
		}
		var newCur, newPrev bool
		s.syncEpoch(b)
		cur, newCur = b.cellFor(seq)
		prev, newPrev = b.cellFor(seq - 1)
		if cur == nil || prev == nil {
			newer := max(b.slotNewer(seq), b.slotNewer(seq-1))
			now = max(now, window.Start(min(newer, window.MaxSequence(q.Duration)), q.Duration))
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

// ready reports whether the cells' counts are fresh enough to answer q
// from them when it is denied or only looks: synced within FreshFor (or
// final), and within StrictFreshFor for a look (its remaining is all it
// asks, and other limiters' admissions change it within a settle round), in
// strict mode, or near the limit (less than half of it left). A fixed
// window's check weighs no previous cell, so it needs none fresh.
func (s *Service) ready(b *bucket, cur, prev *cell, now int64, q *Query) bool {
	if s.origin == nil || s.failing(b, now) {
		return true
	}
	if !cur.fresh(now, s.freshFor) || !q.fixed() && !prev.fresh(now, s.freshFor) {
		return false
	}
	strict := q.Cost == 0 || now < b.strictUntil.Load() || cur.has(flagNear)
	return !strict || now < cur.syncedAt.Load()+s.strictFreshFor
}

// refresh syncs both cells with the origin (reporting this process's state,
// keeping its lease), sharing one call among concurrent callers, and waits
// for it at most until ctx ends.
func (s *Service) refresh(ctx context.Context, cur, prev *cell) {
	c := cur.identity()
	key := c.Workspace + "\x00" + c.Namespace + "\x00" + c.Identifier + "\x00" +
		strconv.FormatInt(c.Duration, 10) + ":" + strconv.FormatInt(c.Sequence, 10)
	ch := s.flight.DoChan(key, func() (any, error) {
		start := time.Now()
		if !s.awaitSync(cur, s.cfg.ReadTimeout) {
			s.syncFailed(cur, s.nowMs(), errSyncBusy)
			return nil, errSyncBusy
		}
		// The cell's limit, not fixed: a refresh reads both cells, for
		// checks of either kind.
		st := s.step(cur, prev, s.nowMs(), rule{limit: cur.limit.Load()}, -1, 0)
		res, err := s.sendOne(context.WithoutCancel(ctx), &st, nil, start)
		st.land(func(cur, prev *cell, ps pendingSync) {
			if err != nil {
				s.syncFailed(cur, s.nowMs(), err)
				return
			}
			s.applySync(cur, prev, ps, 0, res, ps.at, s.nowMs())
		})
		return nil, err
	})
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// admit decides q on its cells at now, if it can without the origin. The
// rule is applied to what the region is known to have admitted (count, a
// lower bound): a denial there is final. A look is final. An admission is
// final when the lease covers it, or when local: without an origin (the
// cells are the only copy), or while the origin fails or must not be waited
// on (the cost is then counted by compare-and-swap, reported later). A
// single Service never admits beyond the rule however many checks race.
// decided is false when the origin must decide; nothing was counted then.
func (s *Service) admit(cur, prev *cell, now int64, q Query, local bool) (d window.Decision, decided bool) {
	if q.Charge == window.ChargeDebit {
		return s.debit(cur, prev, now, q, local)
	}
	// Built field by field: q.input would copy q on the warm path.
	in := window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Cost: q.Cost, Previous: prev.usage(), Fixed: q.fixed()}
	for {
		c := cur.count.Load()
		in.Current = cur.usageWith(c)
		d := window.Decide(in)
		if !d.Admitted {
			s.denied(cur, now, q, d)
			return d, true
		}
		if q.Cost == 0 {
			return d, true
		}
		if s.origin != nil && !local {
			if !cur.spend(now, q.Cost) {
				if d, denied := s.firmDenies(cur, prev, now, q); denied {
					s.denied(cur, now, q, d)
					return d, true
				}
				return d, false
			}
			cur.count.Add(q.Cost)
			s.committed(cur, q, d)
			return d, true
		}
		if cur.count.CompareAndSwap(c, c+q.Cost) {
			if s.origin != nil {
				s.admittedLocally(cur, q.Cost)
			}
			s.committed(cur, q, d)
			return d, true
		}
	}
}

// debit charges q, a debit, on its cells at now, as admit does an admission
// but whatever the room: from the lease when it covers the cost, or here
// when local; decided is false when the origin must charge it. The decision
// is the rule's look at the counts with the cost charged (debitAfter).
func (s *Service) debit(cur, prev *cell, now int64, q Query, local bool) (d window.Decision, decided bool) {
	if q.Cost == 0 {
		return window.Decide(q.input(now, cur.usage(), prev.usage())), true
	}
	if s.origin != nil && !local {
		if !cur.spend(now, q.Cost) {
			return window.Decision{}, false
		}
		cur.count.Add(q.Cost)
	} else {
		for c := cur.count.Load(); !cur.count.CompareAndSwap(c, window.AddCounts(c, q.Cost)); c = cur.count.Load() {
		}
		if s.origin != nil {
			s.admittedLocally(cur, q.Cost)
		}
	}
	d = s.debitAfter(cur, prev, now, q)
	s.committed(cur, q, d)
	return d, true
}

// debitAfter is the decision for q, a debit charged: the rule's look at the
// counts with its cost in them, admitted when they are within the limit.
// Past it, the identifier is strict as after a denial, and RetryAfter says
// when the window will have paid the excess off.
func (s *Service) debitAfter(cur, prev *cell, now int64, q Query) window.Decision {
	d := s.peekLook(cur, prev, now, q)
	s.counters.Debits.Add(1)
	s.counters.DebitedCost.Add(q.Cost)
	if !d.Admitted {
		s.counters.DebitsOver.Add(1)
		s.denied(cur, now, q, d)
	}
	return d
}

// committed notes an admission of q: the settle loop reports it, and the
// global layer may publish the cell's grown count.
func (s *Service) committed(c *cell, q Query, d window.Decision) {
	if s.origin != nil {
		s.noteRule(c, &q, d.Remaining)
		c.set(flagUnsettled)
		s.settle.push(c)
	}
	if s.global != nil {
		s.queueGlobal(c, q.Limit)
	}
}

// noteRule records what the settle cadence needs after an admission of q:
// its rule (the limit and the window kind the cell's background syncs
// weigh the room by), and whether less than half of the limit is left.
func (s *Service) noteRule(c *cell, q *Query, remaining int64) {
	if c.limit.Load() != q.Limit {
		c.limit.Store(q.Limit)
	}
	if q.fixed() != c.has(flagFixed) {
		if q.fixed() {
			c.set(flagFixed)
		} else {
			c.clear(flagFixed)
		}
	}
	if 2*remaining < q.Limit {
		c.set(flagNear)
	}
}

// denied puts the cell's identifier into strict mode until the end of the
// window after the denial: the denied window still weighs in the next one
// (until the end of its own for a fixed window's check). It also publishes the cell's first denial to other regions when the
// rules of package global allow.
func (s *Service) denied(cur *cell, now int64, q Query, d window.Decision) {
	until := window.Following(cur.seq, cur.b.key.duration)
	if q.fixed() {
		until = window.End(cur.seq, cur.b.key.duration) // a fixed window weighs in no other
	}
	raiseTo(&cur.b.strictUntil, until)
	if s.global != nil {
		s.publishDenial(cur, q, d)
	}
}

// enter registers a check in flight, unless Close has begun: then it
// returns false and the check must not run. A check that entered runs to
// its end before Close settles and publishes for the last time. A service
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
// running (a check waits on the origin at most its context), settles
// everything with the origin, giving every lease back (retrying until ctx
// ends or the origin is known to be down; see drain) and closes the origin.
// It returns an error if checks were still running or the origin may lack
// something when it gave up; the error says how much.
func (s *Service) Close(ctx context.Context) error {
	s.closed.Store(true)
	err := s.waitIdle(ctx)
	s.waitSyncers(ctx)
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

// waitSyncers waits until the syncers of waiting checks ended (each ends
// after its current call once nobody waits), or ctx ends.
func (s *Service) waitSyncers(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.syncers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
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
