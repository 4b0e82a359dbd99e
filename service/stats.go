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

// counters holds a Service's counters, each under the name of the Stats
// field it is reported as.
type counters struct {
	OriginSyncs, OriginSyncErrors, OriginSyncTime atomic.Int64
	OriginRequests, OriginDenials, OriginWaits    atomic.Int64
	WaitsDenied                                   atomic.Int64
	Leased                                        atomic.Int64
	Settles, SettleErrors, SettleCells            atomic.Int64
	ComponentsPublished                           atomic.Int64
	PublishErrors                                 atomic.Int64
	ImportsApplied                                atomic.Int64
	ImportsStored, ImportStoreErrors              atomic.Int64
	AdmittedLocally                               atomic.Int64
	Generations, Reversals                        atomic.Int64
	ExpiredDropped                                atomic.Int64
	LocalsRaised, LocalRaiseErrors                atomic.Int64
	LateCalls                                     atomic.Int64
	Debits, DebitsOver, DebitedCost               atomic.Int64
	Drains, DrainedCost                           atomic.Int64
}

// Stats returns the service's counters. It takes no lock a settle round
// or a check holds, so it answers at once whatever the origin does.
func (s *Service) Stats() Stats {
	st := Stats{
		Cells: int64(s.table.size()),
		// Never flushMu: a settle round holds it across network calls.
		SettleQueued:   s.deferredN.Load() + s.settle.n.Load(),
		ImportsRefused: s.refused.Total(),
		LocalsWaiting:  s.others.n.Load(),
	}
	c := &s.counters
	st.OriginSyncs, st.OriginSyncErrors, st.OriginSyncTime = c.OriginSyncs.Load(), c.OriginSyncErrors.Load(), time.Duration(c.OriginSyncTime.Load())
	st.OriginRequests, st.OriginDenials, st.OriginWaits = c.OriginRequests.Load(), c.OriginDenials.Load(), c.OriginWaits.Load()
	st.WaitsDenied, st.Leased = c.WaitsDenied.Load(), c.Leased.Load()
	st.Settles, st.SettleErrors, st.SettleCells = c.Settles.Load(), c.SettleErrors.Load(), c.SettleCells.Load()
	st.ComponentsPublished, st.PublishErrors, st.ImportsApplied = c.ComponentsPublished.Load(), c.PublishErrors.Load(), c.ImportsApplied.Load()
	st.ImportsStored, st.ImportStoreErrors = c.ImportsStored.Load(), c.ImportStoreErrors.Load()
	st.AdmittedLocally, st.Generations, st.Reversals = c.AdmittedLocally.Load(), c.Generations.Load(), c.Reversals.Load()
	st.ExpiredDropped, st.LocalsRaised, st.LocalRaiseErrors = c.ExpiredDropped.Load(), c.LocalsRaised.Load(), c.LocalRaiseErrors.Load()
	st.LateCalls, st.Debits, st.DebitsOver, st.DebitedCost = c.LateCalls.Load(), c.Debits.Load(), c.DebitsOver.Load(), c.DebitedCost.Load()
	st.Drains, st.DrainedCost = c.Drains.Load(), c.DrainedCost.Load()
	return st
}
