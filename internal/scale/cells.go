package scale

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/window"
)

// The cells of the scenario: workspace Workspace, namespace LoadedNamespace
// for the rows loaded into MySQL, NewNamespace for cells that only the
// traffic creates; identifiers of 10 bytes (a letter and 9 digits).
const (
	Workspace       = "scale"
	LoadedNamespace = "loaded"
	NewNamespace    = "new"
	// WindowMs is every cell's window: 30 days, a long window the API
	// allows, so no cell of the run expires or changes window while it
	// runs (unless it starts within minutes of a 30-day boundary).
	WindowMs = 2_592_000_000
	// expiryGraceMs is what limiters add to a cell's expiry (the
	// service's default ExpiryGrace).
	expiryGraceMs = 60_000
)

func loadedID(i int) string { return fmt.Sprintf("c%09d", i) }
func newID(i int) string    { return fmt.Sprintf("n%09d", i) }

// loadedOwner is the region whose component loaded cell i is; loadedCount
// its count. Every loaded cell has one component.
func loadedOwner(regions []string, i int) int { return i % len(regions) }
func loadedCount(i int) int64                 { return 1 + int64(i%3) }

// loadRows inserts n loaded cells into sluice_components, in multi-row
// INSERTs in primary-key order, two statements in flight.
func loadRows(ctx context.Context, db *sql.DB, regions []string, n int, nowMs int64) error {
	const perStatement = 2000
	seq := window.Sequence(nowMs, WindowMs)
	expire := window.Cell{Duration: WindowMs, Sequence: seq}.Expiry(expiryGraceMs)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for start := 0; start < n; start += perStatement {
		end := min(n, start+perStatement)
		g.Go(func() error {
			var b strings.Builder
			b.WriteString("INSERT INTO sluice_components (workspace, namespace, identifier, duration_ms, `sequence`, region, `count`, expire_at) VALUES ")
			args := make([]any, 0, 8*(end-start))
			for i := start; i < end; i++ {
				if i > start {
					b.WriteByte(',')
				}
				b.WriteString("(?,?,?,?,?,?,?,?)")
				args = append(args, Workspace, LoadedNamespace, []byte(loadedID(i)), int64(WindowMs), seq,
					regions[loadedOwner(regions, i)], loadedCount(i), expire)
			}
			if _, err := db.ExecContext(ctx, b.String(), args...); err != nil {
				return fmt.Errorf("load rows %d..%d: %w", start, end, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// foreignTruth returns, from the store, what a bridge of region must hold
// of the other regions: the cells with a live component of another region,
// and the sum of those components.
func foreignTruth(ctx context.Context, db *sql.DB, region string, nowMs int64) (cells, sum int64, err error) {
	err = db.QueryRowContext(ctx,
		"SELECT COUNT(DISTINCT workspace, namespace, identifier, duration_ms, `sequence`), COALESCE(SUM(`count`), 0)"+
			" FROM sluice_components WHERE region <> ? AND expire_at > ? AND `count` > 0", region, nowMs).Scan(&cells, &sum)
	return cells, sum, err
}

// loadedSum is the sum of the counts of n loaded cells.
func loadedSum(n int) int64 {
	var s int64
	for i := range n {
		s += loadedCount(i)
	}
	return s
}

// storedSum is the sum of every component in the store.
func storedSum(ctx context.Context, db *sql.DB) (int64, error) {
	var s int64
	err := db.QueryRowContext(ctx, "SELECT COALESCE(SUM(`count`), 0) FROM sluice_components").Scan(&s)
	return s, err
}
