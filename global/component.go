// Package global holds the cross-region layer: G-Counter components (one per
// window cell and region), their merge and sums, the publish rule, denials,
// the bridge's state, and the MySQL store that makes them durable.
//
// Each region writes only its own component of a cell; components merge by
// max and the global usage of a cell is the sum of its components. A region
// imports the sum of the other regions' components and never publishes it
// again, so no usage is ever counted twice.
package global

import "github.com/sluicehq/sluice/window"

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

// Denial says a region denied a request against a cell whose sliding
// usage was at least half the limit, and what the cell itself held then:
// other regions raise that exact cell's usage to at least Usage, so their
// decisions reproduce the denying region's. Usage is the denying region's
// view of the cell (its regional count plus what it imported), a lower
// bound of the cell's global usage, so raising to it never overcounts.
type Denial struct {
	Cell   window.Cell
	Region string // where the denial happened
	// Usage is the cell's usage when it was denied.
	Usage    int64
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
	// Floor is the largest usage another region's denial of the cell
	// carried (0: none): the cell's usage is raised to it.
	Floor int64
	// ExpireAt is when the cell stops mattering.
	ExpireAt int64
}
