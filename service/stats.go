package service

import (
	"sync/atomic"
	"time"
)

// Stats counts what a Service did since it started. Counters only grow;
// Cells and ReplayQueued are gauges.
type Stats struct {
	// Cells is the number of identifiers (buckets) held when Stats is
	// called: a new identifier counts at once, a dropped one leaves at once.
	Cells int64
	// OriginReads counts reads sent to the origin, OriginReadErrors those
	// that failed, OriginReadTime their total duration.
	OriginReads, OriginReadErrors int64
	// OriginReadTime is the total duration of origin reads and admissions.
	OriginReadTime time.Duration
	// OriginAdmits counts admissions decided at the origin (near the
	// limit), OriginAdmitErrors those that failed (decided locally
	// instead), OriginAdmitsRefused those the origin refused.
	OriginAdmits, OriginAdmitErrors, OriginAdmitsRefused int64
	// Replays counts replay calls, ReplayErrors those that failed,
	// ReplayCells the cells they carried; ReplayQueued is how many cells wait
	// to be replayed now.
	Replays, ReplayErrors, ReplayCells int64
	ReplayQueued                       int64
	// ComponentsPublished and DenialsPublished count what was sent to the
	// bridge; ImportsApplied what came back.
	ComponentsPublished, DenialsPublished int64
	ImportsApplied                        int64
	// PublishErrors counts publish rounds that failed (and were retried);
	// ImportsRefused imports refused as invalid, for a later window than
	// the clock-skew tolerance allows, or stamped by a clock beyond it.
	PublishErrors, ImportsRefused int64
	// ImportsStored counts imports this process stored in the origin for
	// cells created later (StoreImports), ImportStoreErrors the calls that
	// failed.
	ImportsStored, ImportStoreErrors int64
}

// counters holds a Service's counters.
type counters struct {
	reads, readErrs, readNanos       atomic.Int64
	admits, admitErrs, admitsRefused atomic.Int64
	releaseErrs                      atomic.Int64
	replays, replayErrs, replayCells atomic.Int64
	componentsOut, denialsOut        atomic.Int64
	publishErrs                      atomic.Int64
	importsIn                        atomic.Int64
	importsStored, importStoreErrs   atomic.Int64
}

// Stats returns the service's counters. It takes no lock a replay round
// or a check holds, so it answers at once whatever the origin does.
func (s *Service) Stats() Stats {
	c := &s.counters
	// Never flushMu: a replay round holds it across network calls.
	queued := s.deferredN.Load() + s.replay.n.Load()
	return Stats{
		Cells:       int64(s.table.size()),
		OriginReads: c.reads.Load(), OriginReadErrors: c.readErrs.Load(),
		OriginReadTime: time.Duration(c.readNanos.Load()),
		OriginAdmits:   c.admits.Load(), OriginAdmitErrors: c.admitErrs.Load(), OriginAdmitsRefused: c.admitsRefused.Load(),
		Replays: c.replays.Load(), ReplayErrors: c.replayErrs.Load(), ReplayCells: c.replayCells.Load(),
		ReplayQueued:        queued,
		ComponentsPublished: c.componentsOut.Load(), DenialsPublished: c.denialsOut.Load(),
		ImportsApplied: c.importsIn.Load(),
		PublishErrors:  c.publishErrs.Load(), ImportsRefused: s.refused.Total(),
		ImportsStored: c.importsStored.Load(), ImportStoreErrors: c.importStoreErrs.Load(),
	}
}
