package mysql

import (
	"context"
	"database/sql"
	"strings"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/policy"
)

// The overrides' upsert (migration 005). The row kept is the one whose
// (version_ms, origin, deleted, limit_value, duration_ms, shadow) is the
// larger tuple: policy.Compare's order (origin is ascii_bin, so byte
// order). MySQL assigns left to right, each assignment seeing the ones
// before it, so changed_us goes first (on the old values) and the columns
// follow from the least significant to the most: when one is assigned,
// every column that could decide the comparison is still the old one, or
// equal in both rows.
const (
	overrideColumns = "workspace, namespace, pattern, limit_value, duration_ms, shadow, deleted, version_ms, origin"
	overrideWins    = "(VALUES(version_ms), VALUES(origin), VALUES(deleted), VALUES(limit_value), VALUES(duration_ms), VALUES(shadow)) > " +
		"(version_ms, origin, deleted, limit_value, duration_ms, shadow)"
)

var overrideUpdate = func() string {
	parts := []string{"changed_us = IF(" + overrideWins + ", " + serverMicros + ", changed_us)"}
	for _, col := range []string{"shadow", "duration_ms", "limit_value", "deleted", "origin", "version_ms"} {
		parts = append(parts, col+" = IF("+overrideWins+", VALUES("+col+"), "+col+")")
	}
	return strings.Join(parts, ", ")
}()

// overrideRows is the kind of sluice_overrides.
var overrideRows = kind[policy.Entry]{
	name: "overrides", table: "sluice_overrides", columns: overrideColumns, update: overrideUpdate, sel: overrideColumns,
	prepare: bridge.PrepareOverrides,
	args: func(args []any, e *policy.Entry) []any {
		return append(args, e.Workspace, e.Namespace, []byte(e.Pattern), e.Limit, e.Duration,
			boolInt(e.Shadow), boolInt(e.Deleted), e.Version.At, e.Version.Origin)
	},
	scan: func(r *sql.Rows, e *policy.Entry) error {
		var pattern []byte
		var shadow, deleted int
		if err := r.Scan(&e.Workspace, &e.Namespace, &pattern, &e.Limit, &e.Duration, &shadow, &deleted,
			&e.Version.At, &e.Version.Origin); err != nil {
			return err
		}
		e.Pattern, e.Shadow, e.Deleted = string(pattern), shadow != 0, deleted != 0
		return nil
	},
}

// UpsertOverrides merges es into sluice_overrides: per key the entry
// policy.Compare orders last is kept, in key order, at most ChunkSize rows
// a statement.
func (m *Store) UpsertOverrides(ctx context.Context, es []policy.Entry) error {
	return overrideRows.upsert(ctx, m, es)
}

// LoadOverrides returns every row of sluice_overrides, tombstones included.
func (m *Store) LoadOverrides(ctx context.Context) ([]policy.Entry, error) {
	return overrideRows.load(ctx, m, 0, "TRUE")
}

// boolInt is b as the 0 or 1 of a TINYINT column.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
