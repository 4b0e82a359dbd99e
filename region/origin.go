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

	// Apply adds each delta to its cell, sets the cell to expire at the
	// delta's absolute ExpireAt (idempotently, in the same atomic step), and
	// returns the cells' new totals in the order of deltas, in one round trip.
	// On error the caller must assume any subset may have been applied; it
	// keeps the deltas and tries again, so a lost reply can count a delta
	// twice but never drops one.
	Apply(ctx context.Context, deltas []Delta) ([]int64, error)

	// Close releases the origin's resources. It does not wait for calls in
	// flight to other goroutines.
	Close() error
}

// Delta is cost admitted locally for one cell and not yet applied to the
// origin.
type Delta struct {
	Cell  window.Cell
	Delta int64
	// ExpireAt is the unix millisecond after which the cell can no longer
	// affect a decision and the origin may forget it.
	ExpireAt int64
}

// ExpireAt returns when the origin may forget cell c: after the end of the
// window that follows it, the last window in which c still weighs, plus
// grace for clocks that disagree.
func ExpireAt(c window.Cell, graceMs int64) int64 {
	return (c.Sequence+2)*c.Duration + graceMs
}
