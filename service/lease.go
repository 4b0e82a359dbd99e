package service

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// With an origin, an admission is final only once the origin counts its
// cost (docs/architecture.md, "Exact in a region"):
//
//   - far from the limit, a check spends this process's lease (avail):
//     cost the origin charged to it in advance, a share of what the limit
//     left, sized to what this process admits between two syncs;
//   - otherwise the check waits on the origin: the cell's syncer sends the
//     cell's waiting checks in one Sync, and the origin grants each whose
//     cost fits against everything charged, denies each that does not fit
//     against the admissions alone, and keeps the others pending until the
//     leases they wait on are used or returned.
//
// A denial by the local view is final too: count is a lower bound of the
// region's admissions, so what it denies one exact limiter denies.

// leaseGrace is how much longer than this process spends a lease the origin
// keeps it live: time to give it back before it counts as used.
const leaseGrace = 100 * time.Millisecond

// maxSyncRequests bounds the checks one Sync carries; the rest wait for the
// next.
const maxSyncRequests = 256

// waiter is a check (or a batch's reservation on one cell) waiting on the
// origin.
type waiter struct {
	q       Query
	reserve bool
	// state: waiting, then sent, then done; or abandoned by the caller.
	state atomic.Int32
	done  chan struct{}
	// Set before done is closed.
	outcome region.Outcome
	failed  bool // the origin failed, or the caller gave up
	// gaveUp is set when the caller gave up (its context ended) before the
	// origin answered, slow when the origin did not answer within
	// ReadTimeout (it may still apply the call): unless the origin is
	// failing, the check is denied either way.
	gaveUp, slow bool
	// pended is set once the origin said Pending: it answers, and the check
	// fits only if leases held elsewhere turn out unused.
	pended atomic.Bool
	d      window.Decision
	// firm and firmPrev are the origin's counts a denial was decided on.
	firm, firmPrev int64
}

const (
	waitWaiting int32 = iota
	waitSent
	waitDone
	waitAbandoned
)

// queue is the checks waiting on the origin for one cell, and whether a
// syncer runs for them.
type queue struct {
	mu      sync.Mutex
	waiters []*waiter
	running bool
}

// lease spends q's cost from the cell's lease if it is live and covers it.
// The caller has decided that the local view admits q.
func (c *cell) spend(now, cost int64) bool {
	if now >= c.leaseUntil.Load() {
		return false
	}
	for {
		a := c.avail.Load()
		if a < cost {
			return false
		}
		if c.avail.CompareAndSwap(a, a-cost) {
			return true
		}
	}
}

// await hands q (or a reservation of q's cost, with reserve) to the cell's
// syncer and waits for the origin's answer, or until ctx ends: then it
// returns failed and gaveUp (whether or not the check was sent), and what
// the origin grants later goes to the lease.
func (s *Service) await(ctx context.Context, cur, prev *cell, q Query, reserve bool) *waiter {
	w := &waiter{q: q, reserve: reserve, done: make(chan struct{})}
	s.enqueue(cur, prev, w)
	select {
	case <-w.done:
		return w
	case <-ctx.Done():
		if w.state.CompareAndSwap(waitWaiting, waitAbandoned) || w.state.CompareAndSwap(waitSent, waitAbandoned) {
			w.failed, w.gaveUp = true, true
			return w
		}
		<-w.done // answered just now
		return w
	}
}

// enqueue adds w to its cell's queue and starts the cell's syncer unless
// one runs.
func (s *Service) enqueue(cur, prev *cell, w *waiter) {
	qu, _ := s.queues.LoadOrCompute(cur, func() (*queue, bool) { return &queue{}, false })
	qu.mu.Lock()
	if got, _ := s.queues.Load(cur); !qu.running && len(qu.waiters) == 0 && got != qu {
		// The queue was finished and removed meanwhile: use a new one.
		qu.mu.Unlock()
		s.enqueue(cur, prev, w)
		return
	}
	qu.waiters = append(qu.waiters, w)
	start := !qu.running
	qu.running = true
	qu.mu.Unlock()
	if start {
		s.syncers.Add(1)
		s.goSync(syncJob{cur, prev, qu})
	}
}

// syncJob is a cell's syncer to run.
type syncJob struct {
	cur, prev *cell
	qu        *queue
}

// maxSyncWorkers bounds the idle sync workers kept.
const maxSyncWorkers = 1024

// goSync runs j on an idle sync worker, or on a new one. A worker lives
// until the service stops, so its stack, grown once through the deep call
// to the origin, serves the next cells; a goroutine per cold cell would
// grow its stack on every check.
func (s *Service) goSync(j syncJob) {
	select {
	case s.syncWork <- j:
		return
	default:
	}
	// Workers hold nothing: they end with the service, unwaited (the
	// syncers they run are waited for: s.syncers).
	keep := s.syncWorkers.Add(1) <= maxSyncWorkers
	if !keep {
		s.syncWorkers.Add(-1)
	}
	go func() {
		s.runSyncer(j.cur, j.prev, j.qu)
		if !keep {
			return
		}
		defer s.syncWorkers.Add(-1)
		for {
			select {
			case j := <-s.syncWork:
				s.runSyncer(j.cur, j.prev, j.qu)
			case <-s.stop:
				return
			}
		}
	}()
}

// runSyncer sends the cell's waiting checks to the origin, one Sync at a
// time, until none waits. Checks the origin keeps pending wait for the
// next Sync, after a pause that doubles from 1ms up to what the origin says
// the leases it waits on may take.
func (s *Service) runSyncer(cur, prev *cell, qu *queue) {
	defer s.syncers.Done()
	pause := time.Millisecond
	for {
		qu.mu.Lock()
		batch := take(qu)
		if len(batch) == 0 {
			qu.running = false
			s.queues.Delete(cur)
			qu.mu.Unlock()
			return
		}
		qu.mu.Unlock()
		if now := s.nowMs(); s.stalled(cur.b, now) || s.failing(cur.b, now) {
			// A call of the identifier just went unanswered (or failed):
			// the checks that queued behind it do not wait for another
			// call, so none waits more than ReadTimeout in all. They are
			// denied, or decided locally while the origin fails.
			failWaiters(batch, waitWaiting, s.stalled(cur.b, now))
			pause = time.Millisecond
			continue
		}
		pending, wait := s.syncWaiters(cur, prev, batch)
		if len(pending) == 0 {
			pause = time.Millisecond
			continue
		}
		qu.mu.Lock()
		qu.waiters = append(pending, qu.waiters...)
		qu.mu.Unlock()
		time.Sleep(min(pause, max(wait, time.Millisecond)))
		pause = min(2*pause, s.cfg.FlushInterval)
	}
}

// take removes from qu the waiters one Sync carries: up to maxSyncRequests
// of the first waiter's rule (limit and window kind), in order, skipping
// abandoned ones. The caller holds qu.mu.
func take(qu *queue) []*waiter {
	var out []*waiter
	rest := qu.waiters[:0]
	for _, w := range qu.waiters {
		switch {
		case w.state.Load() == waitAbandoned:
		case len(out) < maxSyncRequests && (len(out) == 0 || w.q.Limit == out[0].q.Limit && w.q.fixed() == out[0].q.fixed()):
			out = append(out, w)
		default:
			rest = append(rest, w)
		}
	}
	clear(qu.waiters[len(rest):])
	qu.waiters = rest
	return out
}

// syncWaiters sends one Sync for ws (all of one rule: take) and answers each
// waiter it decided. It returns the waiters still pending, and how long the
// origin said their wait may take.
func (s *Service) syncWaiters(cur, prev *cell, ws []*waiter) (pending []*waiter, wait time.Duration) {
	reqs := make([]region.Request, 0, len(ws))
	sent := ws[:0:0]
	for _, w := range ws {
		if w.state.CompareAndSwap(waitWaiting, waitSent) {
			reqs = append(reqs, region.Request{Cost: w.q.Cost, Reserve: w.reserve, Debit: w.q.Charge == window.ChargeDebit})
			sent = append(sent, w)
		}
	}
	if len(sent) == 0 {
		return nil, 0
	}
	start := time.Now()
	if !s.awaitSync(cur, s.cfg.ReadTimeout) {
		// A settle round holds the cell longer than a check waits: the
		// origin is slow, or down.
		slow := s.syncFailed(cur, s.nowMs(), errSyncBusy)
		failWaiters(sent, waitSent, slow)
		return nil, 0
	}
	// The lease is given back (what is left of it did not cover these) and
	// a new one asked for, as large as want says: none for a cell whose
	// rate would not spend two before the lease or the window ends (a
	// client address's, which sees a check or two a window), as it would
	// cost a settle to give back.
	st := s.step(cur, prev, s.nowMs(), rule{limit: sent[0].q.Limit, fixed: sent[0].q.fixed()}, 0, wantRate)
	res, err := s.sendOne(context.Background(), &st, reqs, start)
	st.land(func(cur, prev *cell, ps pendingSync) {
		if err != nil {
			failWaiters(sent, waitSent, s.syncFailed(cur, s.nowMs(), err))
			return
		}
		pending = s.answerWaiters(cur, prev, ps, sent, res)
	})
	return pending, time.Duration(res.WaitMs) * time.Millisecond
}

// failWaiters answers the waiters of ws still in state from (waiting, or
// sent) as failed: the origin failed, or a call of the cell went
// unanswered (slow: they are denied).
func failWaiters(ws []*waiter, from int32, slow bool) {
	for _, w := range ws {
		if w.state.CompareAndSwap(from, waitDone) {
			w.failed, w.slow = true, slow
			close(w.done)
		}
	}
}

// answerWaiters applies res, the origin's answer to ps carrying sent's
// checks, to cur and answers each waiter it decided; it returns those
// still pending. The caller holds cur.mu.
func (s *Service) answerWaiters(cur, prev *cell, ps pendingSync, sent []*waiter, res region.SyncResult) (pending []*waiter) {
	now, done := ps.at, s.nowMs()
	s.counters.OriginRequests.Add(int64(len(sent)))
	var grantedUsed int64 // the origin counts these as used at once
	for i, w := range sent {
		if res.Outcomes[i] == region.Granted && !w.reserve {
			grantedUsed += w.q.Cost
		}
	}
	s.applySync(cur, prev, ps, grantedUsed, res, now, done)
	at := clampToCell(cur, now)
	for i, w := range sent {
		out := res.Outcomes[i]
		if out == region.Pending {
			w.pended.Store(true)
			s.counters.OriginWaits.Add(1)
			if w.state.CompareAndSwap(waitSent, waitWaiting) {
				pending = append(pending, w)
			}
			continue
		}
		claimed := w.state.CompareAndSwap(waitSent, waitDone)
		w.outcome = out
		switch {
		case out == region.Denied:
			s.counters.OriginDenials.Add(1)
			if claimed {
				w.firm, w.firmPrev = res.Current.Used, res.Previous.Used
				w.d = s.denyFirm(cur, prev, at, w.q, res)
			}
		case !claimed:
			// Its caller gave up (and decided locally): what the origin
			// granted joins the lease, to be spent or given back.
			cur.top.Add(w.q.Cost)
			cur.avail.Add(w.q.Cost)
			cur.leaseUntil.Store(max(cur.leaseUntil.Load(), now+s.leaseFor))
			s.settle.push(cur)
		case w.reserve:
			cur.top.Add(w.q.Cost)
			cur.held.Add(w.q.Cost)
		default:
			cur.top.Add(w.q.Cost)
			cur.count.Add(w.q.Cost)
			if w.q.Charge == window.ChargeDebit {
				w.d = s.debitAfter(cur, prev, at, w.q)
				s.noteRule(cur, &w.q, w.d.Remaining)
			} else {
				w.d = s.lookAfter(cur, prev, at, w.q)
			}
			if s.global != nil {
				s.queueGlobal(cur, w.q.Limit)
			}
		}
		if claimed {
			close(w.done)
		}
	}
	return pending
}

// errStale says the origin had applied a later sync of this process: it
// cannot happen while syncs of a cell are serialized, and is treated as a
// failed call.
var errStale = errors.New("origin answered a stale sync")

// errSyncBusy says a check could not sync its cell within ReadTimeout
// because another sync of it (a settle round) was on its way.
var errSyncBusy = errors.New("another sync of the cell outlasted the read timeout")

// awaitSync marks a sync of c on its way, waiting up to wait for one
// already on its way to end. It reports whether it did.
func (s *Service) awaitSync(c *cell, wait time.Duration) bool {
	if c.trySync() {
		return true
	}
	deadline := time.Now().Add(wait)
	for pause := 50 * time.Microsecond; time.Now().Before(deadline); pause = min(2*pause, time.Millisecond) {
		time.Sleep(pause)
		if c.trySync() {
			return true
		}
	}
	return false
}

// lookAfter is the decision for q admitted at the origin: what remains
// with its cost counted.
func (s *Service) lookAfter(cur, prev *cell, now int64, q Query) window.Decision {
	d := s.peekLook(cur, prev, now, q) // its cost is counted already
	d.Admitted, d.RetryAfter = true, 0
	if s.origin != nil {
		s.noteRule(cur, &q, d.Remaining)
	}
	return d
}

// denyFirm is the decision for q denied by the origin: the rule applied to
// the cell's count the origin decided on (admissions, and leases no longer
// live counted as used). Those counts are kept for firmDenies.
func (s *Service) denyFirm(cur, prev *cell, now int64, q Query, res region.SyncResult) window.Decision {
	b := cur.b
	for {
		old := b.firm.Load()
		if old != nil && old.seq == cur.seq && old.cur >= res.Current.Used && old.prev >= res.Previous.Used && old.at >= now {
			break
		}
		n := &firmCounts{seq: cur.seq, cur: res.Current.Used, prev: res.Previous.Used, at: now}
		if old != nil && old.seq == cur.seq {
			n.cur, n.prev, n.rev = max(n.cur, old.cur), max(n.prev, old.prev), old.rev
		}
		if b.firm.CompareAndSwap(old, n) {
			break
		}
	}
	d := window.Decide(q.input(now, cur.usageWith(max(res.Current.Used, cur.count.Load())),
		prev.usageWith(max(res.Previous.Used, prev.count.Load()))))
	if d.Admitted { // the local clock or imports moved since the origin decided
		d.Admitted, d.RetryAfter = false, max(d.RetryAfter, 1)
	}
	s.denied(cur, now, q, d)
	return d
}

// pendingSync is a sync on its way and what applying its result needs.
type pendingSync struct {
	sy   region.Sync
	used int64 // this process's admissions it reports as Used (none decided without the origin)
	at   int64 // when it was built (unix ms): its Elapsed, and its lease's start
}

// firmDenies reports whether the origin's counts from its last denial of
// the identifier in this window deny q, and the decision if so. Those
// counts only grow (unless a lease the origin counted as used comes back),
// and the rule's room only grows by the previous window's decay, which the
// decision's RetryAfter accounts for: a check they deny, the origin would
// deny too. They answer for StrictFreshFor after the denial, as strict
// mode's counts do: so a flood on an exhausted identifier costs one origin
// call per StrictFreshFor, not one per check, and a lease that comes back
// is seen by the next one.
func (s *Service) firmDenies(cur, prev *cell, now int64, q Query) (window.Decision, bool) {
	f := cur.b.firm.Load()
	if f == nil || f.seq != cur.seq || now >= f.at+s.strictFreshFor {
		return window.Decision{}, false
	}
	d := window.Decide(q.input(now, cur.usageWith(max(cur.count.Load(), f.cur)),
		prev.usageWith(max(prev.count.Load(), f.prev))))
	return d, !d.Admitted
}

// wantRate asks syncOf for the lease the cell's rate wants (want).
const wantRate int64 = -1

// syncOf builds cur's Sync at now for checks of rule r (the zero rule: the
// cell's last, cell.rule): this process's admissions and its claim, keeping at most keep of
// its unused lease (negative: all of it; what goes back it stops spending:
// out of avail and top), and want as lease beyond the requests (wantRate:
// what its rate, as this sync observes it, wants). A cell this process
// has not synced for half of ForgetAfter starts a new generation first
// (newGeneration). From here on, admissions mark the cell unsettled again.
// The caller holds cur.mu.
func (s *Service) syncOf(cur, prev *cell, now int64, r rule, keep, want int64) pendingSync {
	if at := cur.syncedAt.Load(); at > 0 && now-at >= s.forgetMs/2 && cur.held.Load() == 0 {
		s.newGeneration(cur)
	}
	for keep >= 0 {
		a := cur.avail.Load()
		if a <= keep {
			break
		}
		if cur.avail.CompareAndSwap(a, keep) {
			cur.top.Add(keep - a)
			break
		}
	}
	if r.limit <= 0 {
		r = cur.rule()
	}
	limit := r.limit
	cur.clear(flagUnsettled)
	local, _ := s.locals.get(cur)
	localID := ""
	if local > 0 {
		localID = s.localID
	}
	id := cur.identity()
	used := cur.used()
	s.observe(cur, used, now)
	if want == wantRate {
		want = s.want(cur, prev, limit, now)
	}
	return pendingSync{sy: region.Sync{
		Cell:            id,
		Seq:             s.seq.Add(1),
		Used:            used,
		Claim:           cur.top.Load(),
		Want:            want,
		Limit:           limit,
		Elapsed:         clampToCell(cur, now) - window.Start(cur.seq, id.Duration),
		Foreign:         cur.imported.Load(),
		ForeignPrevious: prev.imported.Load(),
		LiveFor:         s.leaseFor + leaseGrace.Milliseconds(),
		ExpireAt:        id.Expiry(s.cfg.ExpiryGrace.Milliseconds()),
		Floor:           cur.admitted(),
		Local:           local,
		LocalID:         localID,
		Generation:      cur.gen(),
		PreviousEpoch:   prev.epoch,
		Fixed:           r.fixed,
	}, used: used, at: now}
}

// newGeneration starts cur's next generation at the origin, which forgets
// a reporter it has not heard of for ForgetAfter: this process has not
// synced cur for half of that, so the origin may forget its state any time
// now. What the origin counts for the old generation stays counted there
// (a lease not given back counts as used once it ended, so it is spent
// here too); the new generation claims from zero. What this process
// admitted without the origin is in no generation's claim: it is the
// cell's local count (region.Sync.Local), which the origin keeps per
// process, not per generation. The caller holds cur.mu, no sync of cur is
// on its way, and nothing is held for a batch.
func (s *Service) newGeneration(cur *cell) {
	cur.avail.Store(0)
	cur.top.Store(0)
	if b := cur.b; b.obsSeq.Load() == cur.seq {
		b.obsUsed.Store(0)
	}
	cur.nextGen()
	s.counters.Generations.Add(1)
}

// clampToCell returns now, or the last millisecond of cur's window if now
// is past it (a check that waited across the boundary is decided in the
// window it arrived in).
func clampToCell(cur *cell, now int64) int64 {
	return min(now, window.End(cur.seq, cur.b.key.duration)-1)
}

// applySync folds a sync's result into cur and prev: the counts (a lower
// bound: what the origin reports admitted, less what it counts for this
// process (its Used as sent and its local count), plus what this process
// admitted, both ways; grantedUsed is this reply's grants of checks, which
// their waiters add themselves), the foreign usage, the
// lease granted beyond the requests (spendable until sentAt + LeaseFor),
// and whether the cell is near its limit or contended. The caller holds
// cur.mu.
func (s *Service) applySync(cur, prev *cell, ps pendingSync, grantedUsed int64, res region.SyncResult, sentAt, now int64) {
	sy := &ps.sy
	s.locals.confirm(cur, res.Local)
	local, _ := s.locals.get(cur)
	count := window.AddCounts(max(res.Current.Used-ps.used-res.Local-grantedUsed, 0), window.AddCounts(cur.used(), local))
	if s.reversed(cur, res.Reversals) {
		// A lease the origin counted as used came back: the count went
		// down, and the one this process held (raised by it) goes with it,
		// as its cached denial did (reversed).
		cur.count.Store(count)
	} else {
		cur.raise(count)
	}
	raiseTo(&cur.imported, res.Current.Foreign)
	if res.PreviousRead {
		prev.raise(res.Previous.Used)
		raiseTo(&prev.imported, res.Previous.Foreign)
		prev.syncedAt.Store(now)
	}
	if res.Lease > 0 {
		cur.top.Add(res.Lease)
		cur.avail.Add(res.Lease)
		cur.leaseUntil.Store(max(cur.leaseUntil.Load(), sentAt+s.leaseFor))
		s.counters.Leased.Add(res.Lease)
	} else if cur.avail.Load() > 0 && !res.Contended && sy.Claim > sy.Used {
		// A renewal that kept the lease: the origin extended its life too.
		cur.leaseUntil.Store(max(cur.leaseUntil.Load(), sentAt+s.leaseFor))
	}
	// Near: less than half of the limit left, less than nearRoom left, or
	// a lease the room's share capped (what this process holds then matters
	// to the others: it goes back soon when unused).
	if limit := sy.Limit; limit > 0 && (2*res.Room < limit || res.Room < nearRoom) || res.Lease < sy.Want && !sy.ReportOnly {
		cur.set(flagNear)
	}
	if res.Contended {
		cur.set(flagContended)
	} else {
		cur.clear(flagContended)
	}
	// flagUnsettled is not cleared here: syncOf did, before it read what it
	// sent, so an admission made while the sync was on its way set it again.
	cur.syncedAt.Store(now)
	if s.global != nil {
		s.queueGlobal(cur, 0)
		if res.PreviousRead && cur.b.peek(prev.seq) == prev {
			s.queueGlobal(prev, 0)
		}
	}
	if cur.avail.Load() > 0 || cur.has(flagUnsettled) {
		s.settle.push(cur) // a lease to renew or give back, or admissions to report
	}
}

// syncFailed records a failed sync of cur at now: the cell's state is sent
// again by the next round. It reports whether the call was only late
// (lateCall): then the identifier is stalled for ReadRetry and the checks
// the call carried are to be denied, not decided from this process's
// counts, which miss what the other limiters hold. Otherwise the origin is
// failing: the identifier decides locally for ReadRetry, and every
// identifier does while the breaker refuses calls.
func (s *Service) syncFailed(cur *cell, now int64, err error) (late bool) {
	s.counters.OriginSyncErrors.Add(1)
	cur.set(flagUnsettled)
	s.settle.push(cur)
	if !errors.Is(err, region.ErrOriginOpen) && lateCall(err) {
		s.counters.LateCalls.Add(1)
		cur.b.failedAt.Store(-now)
		s.cfg.Logger.Debug("origin sync later than the read timeout; the identifier's checks are denied", "workspace", cur.b.key.workspace,
			"namespace", cur.b.key.namespace, "error", err)
		return true
	}
	s.originFailed(cur, now, err)
	s.cfg.Logger.Debug("origin sync failed; deciding locally", "workspace", cur.b.key.workspace, "namespace", cur.b.key.namespace, "error", err)
	return false
}

// lateCall reports whether err says an origin call did not answer within
// its time (a timeout, or a settle round that held the cell that long),
// rather than that the origin refused it: such a call may still be applied.
func lateCall(err error) bool {
	if errors.Is(err, errSyncBusy) || errors.Is(err, region.ErrNotSent) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// originFailed records a failed origin call for cur at now: the identifier
// decides locally for ReadRetry, and every identifier does while the
// breaker refuses calls.
func (s *Service) originFailed(cur *cell, now int64, err error) {
	cur.b.failedAt.Store(now)
	if errors.Is(err, region.ErrOriginOpen) {
		s.originOpenUntil.Store(now + s.readRetry)
	}
}

// observe updates the identifier's admission rate from what this process
// has admitted in cell c (used) at now. The rate is measured over at least
// minObserveMs since the last measurement in the window (a burst within a
// few milliseconds says little about the next second); a measurement that
// finds less keeps at most the earlier rate halved for every minObserveMs
// since it: so the rate follows sustained traffic up at once and a burst's
// rate is gone within a second whatever the number of syncs, which keeps
// the lease it sizes (want) to LeaseAhead of the traffic that really
// follows. Until an interval that long has passed, a rate of 0 is replaced
// by what the interval so far shows.
func (s *Service) observe(c *cell, used, now int64) {
	b := c.b
	seq := b.obsSeq.Load()
	if c.seq < seq {
		return // an older cell: its window no longer grows
	}
	base, at := int64(0), window.Start(c.seq, b.key.duration)
	if c.seq == seq {
		base, at = b.obsUsed.Load(), b.obsAt.Load()
	}
	dt := now - at
	inst := float64(max(used-base, 0)) / float64(max(dt, minObserveMs))
	old := math.Float64frombits(b.rate.Load())
	if c.seq == seq && dt < minObserveMs {
		if old == 0 && inst > 0 {
			b.rate.Store(math.Float64bits(inst))
		}
		return
	}
	b.rate.Store(math.Float64bits(max(inst, old*math.Exp2(-float64(dt)/minObserveMs))))
	b.obsSeq.Store(c.seq)
	b.obsUsed.Store(used)
	b.obsAt.Store(now)
}

// minObserveMs is the shortest interval a rate is measured over.
const minObserveMs = 100

// want is the lease cur should hold, checked against limit: what this
// process admits in LeaseAhead at its recent rate in the identifier; for a
// slow identifier up to 1% of the limit, but never more than it admits in
// LeaseFor (a lease ends then: more would only go back unused), so that it
// does not ask the origin every few checks. Renewals top it up while it
// admits, once less than half is left; what is left unused goes back
// before the lease ends. It bounds what a SIGKILL of this process
// over-counts: the unused part of its lease, which the origin counts as
// used once it is no longer live, is at most max(1% of the limit,
// LeaseAhead of its traffic).
//
// At now, a lease is spent until it ends or cur's window does, whichever
// is first. A cell whose rate would not spend minLeaseUses by then wants
// none (its checks go to the origin one by one, as a counter's would),
// and a slow identifier's lease is no larger than that rate would spend.
// Nor does a cell in which, with the cell before it (prev), this process
// has admitted fewer than minLeaseUses before the checks at hand: the
// rate between two checks says little (a client address's second check
// may follow its first closely).
func (s *Service) want(cur, prev *cell, limit, now int64) int64 {
	if max(cur.used(), 0)+max(prev.used(), 0) < minLeaseUses {
		return 0
	}
	rate := math.Float64frombits(cur.b.rate.Load())
	span := float64(max(min(s.leaseFor, window.End(cur.seq, cur.b.key.duration)-now), 0))
	spend := math.Ceil(rate * span)
	if spend < minLeaseUses {
		return 0
	}
	ahead := min(math.Ceil(rate*float64(s.leaseAhead)), float64(window.MaxCount))
	slow := min(float64((limit+99)/100), spend)
	return int64(max(ahead, slow))
}

// minLeaseUses is the fewest checks a lease must be expected to cover: it
// saves the origin a sync for each, and costs one (a settle's report or
// return) once spent or unused.
const minLeaseUses = 2

// nearRoom is the room below which a cell counts as near its limit
// whatever the limit: a lease there is a good part of what is left to the
// other limiters, so it goes back after FarFlushInterval unused rather
// than when it ends.
const nearRoom = region.LeaseShare * 16

// reversed records the origin's reversal count rev of cur (a current
// cell) and reports whether it grew since this process last saw one of
// cur's window: a lease the origin had counted as used came back. The
// cached denial of the identifier goes with it.
func (s *Service) reversed(cur *cell, rev int64) bool {
	if rev <= 0 {
		return false
	}
	b := cur.b
	for {
		old := b.firm.Load()
		if old != nil && (old.seq > cur.seq || old.seq == cur.seq && old.rev >= rev) {
			return false // seen already, or a later window's
		}
		if b.firm.CompareAndSwap(old, &firmCounts{seq: cur.seq, rev: rev}) {
			s.counters.Reversals.Add(1)
			return true
		}
	}
}
