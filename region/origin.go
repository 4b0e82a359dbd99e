// Package region holds a region's shared store of window-cell counts (the
// origin) that converges the limiter processes of one region: the Origin
// interface, its in-memory implementation for a single process, and the
// Redis implementation for a real region.
package region

import (
	"context"

	"github.com/sluicehq/sluice/window"
)

// Origin is a region's shared store of cell totals. Implementations are safe
// for concurrent use. Totals only grow inside a cell: Apply adds, nothing
// subtracts, and a cell's key expires on its own after ExpireAt.
type Origin interface {
	// Read returns, in one round trip, what the region knows of cell c and
	// of the cell before it (c.Sequence-1): the regional totals (never
	// below the own lower bound Import recorded) and the other regions'
	// usage Import recorded. Missing cells count 0.
	Read(ctx context.Context, c window.Cell) (current, previous Totals, err error)

	// Apply records, for each report, that reporter has admitted report.Own
	// in its cell so far, sets the cell to expire at the report's absolute
	// ExpireAt (in the same atomic step), and returns the cells' totals in
	// the order of reports, in one round trip. A cell's total is the sum over
	// reporters of the highest Own each reported, so Apply is idempotent: a
	// report sent again after a lost reply, or overtaken by a later one,
	// changes nothing. On error any subset may have been applied; the caller
	// sends its current counts again later and nothing is lost or counted
	// twice.
	Apply(ctx context.Context, reporter string, reports []Report) ([]int64, error)

	// Admit decides one admission in the cell atomically, in one round
	// trip: it first records a.Own as Apply would (so the reporter's
	// unreported admissions count), then admits a.Cost if the cell's total
	// is at most a.Max, adding it to the total and to the reporter's own
	// count, and sets the cell's expiry. It returns whether it admitted, the
	// total and the reporter's recorded own count after the call. On error
	// the admission may or may not have been made; if it was, the
	// reporter's recorded own count exceeds what it admitted by a.Cost until
	// its own count catches up, which errs towards denial, never admission.
	Admit(ctx context.Context, reporter string, a Admission) (AdmitResult, error)

	// Release takes back cost that Admit admitted for reporter in cell c and
	// the reporter never used (a batch that was refused after reserving),
	// from the total and from the reporter's own count.
	Release(ctx context.Context, reporter string, c window.Cell, cost int64) error

	// Import records, for each cell, the other regions' usage and the
	// region's own published count as its bridge reported them, each kept
	// at its maximum, so that a limiter that creates the cell later starts
	// from the global view (Read). A cell Import creates expires at its
	// ExpireAt. Calls are idempotent and may be repeated or reordered.
	Import(ctx context.Context, imports []Imported) error

	// Close releases the origin's resources. It does not wait for calls in
	// flight to other goroutines.
	Close() error
}

// Totals is what an origin knows of one cell.
type Totals struct {
	// Count is the regional total: what the region's limiters admitted
	// (Apply, Admit), or the own lower bound Import recorded if higher.
	Count int64
	// Foreign is the other regions' usage Import recorded.
	Foreign int64
}

// Imported is one cell's global view as the region's bridge sent it.
type Imported struct {
	Cell window.Cell
	// Foreign is the sum of the other regions' counts.
	Foreign int64
	// Own is the region's own count as the bridge last stored it: a lower
	// bound of the regional total.
	Own int64
	// ExpireAt is the unix millisecond after which the cell no longer
	// matters.
	ExpireAt int64
}

// Admission is one request to admit cost in one cell at the origin.
type Admission struct {
	Cell window.Cell
	// Own is everything the reporter has admitted in the cell so far, as
	// in Report; the origin records it before deciding.
	Own int64
	// Cost is what to admit.
	Cost int64
	// Max is the largest total (before Cost) at which Cost fits: the
	// limit's room for the current cell once the previous cell's weighted
	// share, other regions' usage and Cost are taken out, computed by the
	// caller in exact integer arithmetic.
	Max int64
	// ExpireAt is as in Report.
	ExpireAt int64
}

// AdmitResult is the outcome of Admit.
type AdmitResult struct {
	Admitted bool
	// Total is the cell's total after the call (with Cost if admitted).
	Total int64
	// Reported is the reporter's recorded own count after the call.
	Reported int64
}

// Report is one reporter's cumulative admitted cost in one cell.
type Report struct {
	Cell window.Cell
	// Own is everything the reporter has admitted in the cell so far; it
	// only grows.
	Own int64
	// ExpireAt is the unix millisecond after which the cell can no longer
	// affect a decision and the origin may forget it.
	ExpireAt int64
}
