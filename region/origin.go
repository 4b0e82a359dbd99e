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
	// Read returns, in one round trip, the regional totals of cell c and of
	// the cell before it (c.Sequence-1). Missing cells count 0.
	Read(ctx context.Context, c window.Cell) (current, previous int64, err error)

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

	// Close releases the origin's resources. It does not wait for calls in
	// flight to other goroutines.
	Close() error
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
