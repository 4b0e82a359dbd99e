// Package global holds what limiters and bridges exchange about the
// cross-region layer: G-Counter components (one per window cell and region)
// and imports, the checks that what arrives from other processes
// must pass, the refusals those checks count, and the grace of reset marks'
// expiry. It holds no bridge: the bridge's logic, its G-Counter state and
// its stores are in package bridge (the MySQL store in bridge/mysql), which
// imports this package; the limiter (package service) imports this one and
// never that one.
//
// Each region writes only its own component of a cell; components merge by
// max and the global usage of a cell is the sum of its components. A region
// imports the sum of the other regions' components and never publishes it
// again, so no usage is ever counted twice. A region's first denial of a
// cell travels as its component too, published at once.
package global

import (
	"time"

	"github.com/sluicehq/sluice/window"
)

// Component is one region's published usage of one window cell: the region's
// total as its limiters last knew it. It only grows within a cell.
type Component struct {
	Cell   window.Cell
	Region string
	Count  int64
	// ExpireAt is the unix millisecond after which the cell can no longer
	// affect a decision.
	ExpireAt int64
}

// Import is what a bridge tells its region's limiters about one cell.
type Import struct {
	Cell window.Cell
	// Foreign is the sum of the other regions' components.
	Foreign int64
	// Own is the region's own published count: a lower bound for limiters
	// that have not seen the same regional total yet.
	Own int64
	// ExpireAt is when the cell stops mattering.
	ExpireAt int64
}

// MarkGrace is added to a reset mark's expiry (policy.Mark.ExpireAt): the
// cells' expiry grace, for clocks that disagree.
const MarkGrace = 60 * time.Second
