package service

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Near the limit, a limiter's view of the region is not enough: the other
// limiters of the region may have admitted, since the view was last synced,
// more than the view says is left. There an admission is decided by the
// origin, atomically (region.Origin.Admit); far from the limit it stays
// local. See docs/architecture.md, "Exact near the limit".

// nearFactor is the safety factor of the near-limit rule: twice what the
// region admitted per unit of time recently may arrive unseen, and in a
// burst two other limiters may each have admitted as much as this one.
const nearFactor = 2

// minObserveMs is the shortest interval a rate is measured over: shorter
// ones would turn one burst into a rate far above the real one.
const minObserveMs = 10

// rateHalfLife is how fast the remembered rate decays when traffic slows.
const rateHalfLifeMs = 2000

// near reports whether an admission of q that the local view admits, with
// d.Remaining left after it, must be decided by the origin: what the view
// leaves could be consumed by the region's other limiters before this
// limiter's view catches up. That is when
//
//	remaining after q < q.Cost + nearFactor × (rate × (age + FlushInterval) + unreported + q.Cost)
//
// where rate is the region's recent admission rate in the identifier
// (observed from the totals the origin reports), age how old this view of
// the cell is, FlushInterval how long until a replay reply refreshes it, and
// unreported what this limiter admitted that the origin has not been told:
// in a burst that outpaces the observed rate, each other limiter of a
// region whose traffic is spread over its limiters has likely admitted as
// much unseen, and one more request. The cost term makes a limit of 1 always near: one other
// limiter's request of the same size could take what is left. A limit of
// 10^15 far above rate × seconds stays local. With no view of the origin
// yet (a read that did not finish), every admission is near. While the
// origin is failing, nothing is: the origin would not answer.
func (s *Service) near(cur *cell, q Query, d window.Decision, now int64) bool {
	if s.origin == nil || now < cur.failedAt.Load()+s.readRetry || now < s.originOpenUntil.Load() {
		return false
	}
	synced := cur.syncedAt.Load()
	if synced == 0 {
		return true
	}
	horizon := float64(max(0, now-synced) + s.flushInterval)
	rate := math.Float64frombits(cur.b.rate.Load()) // cost per ms
	unreported := float64(max(0, cur.own.Load()-cur.reported.Load()))
	cost := float64(q.Cost)
	return float64(d.Remaining) < cost+nearFactor*(rate*horizon+unreported+cost)
}

// observe updates the identifier's rate from a total the origin reported
// for cell c at now: the growth since the last total observed in the same
// window (or since the window began) over the time between, or the earlier
// rate decayed by its half-life, whichever is higher.
func (s *Service) observe(c *cell, total, now int64) {
	b := c.b
	seq := b.obsSeq.Load()
	if c.seq < seq {
		return // an older cell: its window no longer grows
	}
	base, at := int64(0), window.Start(c.seq, b.key.duration)
	if c.seq == seq {
		base, at = b.obsTotal.Load(), b.obsAt.Load()
	}
	dt := max(now-at, minObserveMs)
	inst := float64(total-base) / float64(dt)
	old := math.Float64frombits(b.rate.Load())
	if since := now - b.obsAt.Load(); since > 0 {
		old *= math.Exp2(-float64(since) / rateHalfLifeMs)
	}
	b.rate.Store(math.Float64bits(max(inst, old, 0)))
	b.obsSeq.Store(c.seq)
	b.obsTotal.Store(total)
	b.obsAt.Store(now)
}

// room returns the largest regional total of cur at which q fits: what the
// rule leaves for the current cell once the previous cell's weighted share,
// the imported foreign usage and q's cost are taken out (exact, in 128-bit
// arithmetic; see window.Room).
func room(cur, prev *cell, now int64, q Query) int64 {
	r := window.Room(window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Cost: q.Cost, Previous: prev.usage()})
	if r < 0 {
		return -1
	}
	return r - cur.imported.Load()
}

// admitAtOrigin decides q, which the local view admits near its limit, at
// the origin in one round trip bounded by ReadTimeout (and ctx). If the
// origin fails, q is decided from the local view as before, so no check
// fails because of this.
func (s *Service) admitAtOrigin(ctx context.Context, cur, prev *cell, now int64, q Query) window.Decision {
	most := room(cur, prev, now, q)
	if most < 0 {
		d, _ := s.admit(cur, prev, now, q, true, false)
		return d
	}
	id := cur.identity()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	start := time.Now()
	res, err := s.origin.Admit(rctx, s.cfg.ID, region.Admission{Cell: id, Own: cur.own.Load(), Cost: q.Cost,
		Max: most, ExpireAt: id.Expiry(s.cfg.ExpiryGrace.Milliseconds())})
	cancel()
	s.counters.admits.Add(1)
	s.counters.readNanos.Add(int64(time.Since(start)))
	done := s.nowMs()
	if err != nil {
		s.counters.admitErrs.Add(1)
		s.originFailed(cur, done, err)
		d, _ := s.admit(cur, prev, now, q, true, false)
		return d
	}
	if res.Admitted {
		cur.own.Add(q.Cost)
	}
	s.mergeAdmission(cur, res, done)
	in := window.Input{Now: now, Duration: q.Duration, Limit: q.Limit, Previous: prev.usage(), Current: cur.usage()}
	if res.Admitted {
		d := window.Decide(in) // cost 0: what is left with q counted
		d.Admitted, d.RetryAfter = true, 0
		s.noteLimit(cur, q.Limit, d.Remaining)
		if s.global != nil {
			s.queueGlobal(cur, q.Limit)
		}
		return d
	}
	in.Cost = q.Cost
	d := window.Decide(in)
	if d.Admitted { // the view lags what the origin saw
		d.Admitted, d.RetryAfter = false, max(d.RetryAfter, 1)
	}
	s.counters.admitsRefused.Add(1)
	s.denied(cur, now, q, d)
	return d
}

// mergeAdmission folds what Admit reported into cur: the origin holds
// res.Reported of this process's own cost, so that much is acknowledged,
// and the total merges as a read's would.
func (s *Service) mergeAdmission(cur *cell, res region.AdmitResult, now int64) {
	cur.mu.Lock()
	s.mergeAdmissionLocked(cur, res, now)
	cur.mu.Unlock()
}

// mergeAdmissionLocked is mergeAdmission for a caller holding cur's lock.
func (s *Service) mergeAdmissionLocked(cur *cell, res region.AdmitResult, now int64) {
	if res.Reported > cur.reported.Load() {
		cur.reported.Store(res.Reported)
		cur.clear(flagUnacked)
	}
	cur.merge(res.Total, now)
	s.observe(cur, res.Total, now)
}

// originFailed records a failed origin call for cur at now: the cell
// decides locally for ReadRetry, and every cell does while the breaker
// refuses calls.
func (s *Service) originFailed(cur *cell, now int64, err error) {
	cur.failedAt.Store(now)
	if errors.Is(err, region.ErrOriginOpen) {
		s.originOpenUntil.Store(now + s.readRetry)
	}
}
