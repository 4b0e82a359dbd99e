package service

import (
	"sync/atomic"
	"time"
)

// Stats counts what a Service did since it started. Counters only grow;
// Cells and SettleQueued are gauges.
type Stats struct {
	// Cells is the number of identifiers (buckets) held when Stats is
	// called: a new identifier counts at once, a dropped one leaves at once.
	Cells int64
	// OriginSyncs counts the origin calls checks waited on (checks the
	// lease did not cover, and refreshes of cold, stale or strict cells),
	// OriginSyncErrors those that failed (the checks were decided locally),
	// OriginSyncTime their total duration.
	OriginSyncs, OriginSyncErrors int64
	OriginSyncTime                time.Duration
	// OriginRequests counts checks and batch reservations the origin
	// decided, OriginDenials those it denied, OriginWaits how often one
	// had to wait for leases held elsewhere, and WaitsDenied the checks
	// whose callers gave up while they still waited (denied).
	OriginRequests, OriginDenials, OriginWaits, WaitsDenied int64
	// Leased is the cost the origin granted as leases, to spend locally.
	Leased int64
	// Settles counts settle calls (the background syncs), SettleErrors
	// those that failed, SettleCells the cells they carried; SettleQueued is
	// how many cells have something for the origin now.
	Settles, SettleErrors, SettleCells int64
	SettleQueued                       int64
	// ComponentsPublished counts what was sent to the bridge;
	// ImportsApplied what came back.
	ComponentsPublished, ImportsApplied int64
	// PublishErrors counts publish rounds that failed (and were retried);
	// ImportsRefused imports refused as invalid, for a later window than
	// the clock-skew tolerance allows, or stamped by a clock beyond it.
	PublishErrors, ImportsRefused int64
	// ImportsStored counts imports this process stored in the origin for
	// cells created later (StoreImports), ImportStoreErrors the calls that
	// failed.
	ImportsStored, ImportStoreErrors int64
	// AdmittedLocally counts checks and batch queries admitted without the
	// origin (it failed, or the caller asked for a local decision:
	// CheckLocal, BatchLocal): counted here, charged at the origin later.
	AdmittedLocally int64
	// Generations counts cells this process started a new generation of at
	// the origin (it had not synced them for half of ForgetAfter);
	// Reversals the times the origin said a lease it had counted as used
	// came back, so this process lowered its count of the cell.
	Generations, Reversals int64
	// ExpiredDropped counts cells dropped from the settle queue because
	// their window had expired at the origin (the origin was unreachable
	// for that long).
	ExpiredDropped int64
	// LocalsRaised counts other limiters' local counts (ApplyLocals) this
	// process raised the origin to, LocalRaiseErrors the calls that
	// failed (they are tried again); LocalsWaiting how many wait now.
	LocalsRaised, LocalRaiseErrors, LocalsWaiting int64
	// LateCalls counts origin calls on the request path that did not
	// answer within ReadTimeout (or could not start, another sync of the
	// cell holding it that long): their checks were denied, and their
	// identifiers stalled for ReadRetry.
	LateCalls int64
	// Debits counts checks that debited their cost (window.ChargeDebit),
	// DebitsOver those that took the usage past the limit, DebitedCost the
	// cost they charged; Drains counts checks denied that charged what the
	// limit had left (window.ChargeDrain), DrainedCost what they charged.
	// Debits and drains count in no admission or denial count of their own
	// beyond their decision's.
	Debits, DebitsOver, DebitedCost int64
	Drains, DrainedCost             int64
}

// counters holds a Service's counters.
type counters struct {
	syncs, refreshes, syncErrs, syncNanos atomic.Int64
	syncRequests, syncDenials, syncWaits  atomic.Int64
	pendingDenials                        atomic.Int64
	leased                                atomic.Int64
	settles, settleErrs, settleCells      atomic.Int64
	componentsOut                         atomic.Int64
	publishErrs                           atomic.Int64
	importsIn                             atomic.Int64
	importsStored, importStoreErrs        atomic.Int64
	localAdmits                           atomic.Int64
	generations, reversals                atomic.Int64
	expiredDropped                        atomic.Int64
	localsRaised, localFlushErrs          atomic.Int64
	lateCalls                             atomic.Int64
	debits, debitsOver, debitedCost       atomic.Int64
	drains, drainedCost                   atomic.Int64
}

// Stats returns the service's counters. It takes no lock a settle round
// or a check holds, so it answers at once whatever the origin does.
func (s *Service) Stats() Stats {
	c := &s.counters
	// Never flushMu: a settle round holds it across network calls.
	queued := s.deferredN.Load() + s.settle.n.Load()
	return Stats{
		Cells:       int64(s.table.size()),
		OriginSyncs: c.syncs.Load() + c.refreshes.Load(), OriginSyncErrors: c.syncErrs.Load(),
		OriginSyncTime: time.Duration(c.syncNanos.Load()),
		OriginRequests: c.syncRequests.Load(), OriginDenials: c.syncDenials.Load(), OriginWaits: c.syncWaits.Load(),
		WaitsDenied: c.pendingDenials.Load(),
		Leased:      c.leased.Load(),
		Settles:     c.settles.Load(), SettleErrors: c.settleErrs.Load(), SettleCells: c.settleCells.Load(),
		SettleQueued:        queued,
		ComponentsPublished: c.componentsOut.Load(),
		ImportsApplied:      c.importsIn.Load(),
		PublishErrors:       c.publishErrs.Load(), ImportsRefused: s.refused.Total(),
		ImportsStored: c.importsStored.Load(), ImportStoreErrors: c.importStoreErrs.Load(),
		AdmittedLocally: c.localAdmits.Load(),
		Generations:     c.generations.Load(), Reversals: c.reversals.Load(),
		ExpiredDropped: c.expiredDropped.Load(),
		LocalsRaised:   c.localsRaised.Load(), LocalRaiseErrors: c.localFlushErrs.Load(), LocalsWaiting: s.others.n.Load(),
		LateCalls: c.lateCalls.Load(),
		Debits:    c.debits.Load(), DebitsOver: c.debitsOver.Load(), DebitedCost: c.debitedCost.Load(),
		Drains: c.drains.Load(), DrainedCost: c.drainedCost.Load(),
	}
}
