package mysql

import (
	"context"
	"database/sql"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// The reset marks' upsert (migration 006): per key the larger epoch and the
// later expiry. changed_us goes first, while epoch_ms is still the old one.
const (
	markColumns = "workspace, namespace, identifier, duration_ms, epoch_ms, expire_at"
	markUpdate  = "changed_us = IF(VALUES(epoch_ms) > epoch_ms, " + serverMicros + ", changed_us), " +
		"expire_at = GREATEST(expire_at, VALUES(expire_at)), epoch_ms = GREATEST(epoch_ms, VALUES(epoch_ms))"
)

// markRows is the kind of sluice_reset_marks; a load reads no expiry.
var markRows = kind[policy.Mark]{
	name: "reset marks", table: "sluice_reset_marks", columns: markColumns, update: markUpdate,
	sel:     "workspace, namespace, identifier, duration_ms, epoch_ms",
	prepare: bridge.PrepareMarks,
	args: func(args []any, mk *policy.Mark) []any {
		return append(args, mk.Workspace, mk.Namespace, []byte(mk.Identifier), mk.Duration, mk.Epoch,
			mk.ExpireAt(global.MarkGrace.Milliseconds()))
	},
	scan: func(r *sql.Rows, mk *policy.Mark) error {
		var id []byte
		if err := r.Scan(&mk.Workspace, &mk.Namespace, &id, &mk.Duration, &mk.Epoch); err != nil {
			return err
		}
		mk.Identifier = string(id)
		return nil
	},
}

// UpsertMarks merges ms into sluice_reset_marks by max of epoch (and of
// expiry, policy.Mark.ExpireAt with global.MarkGrace), in key order, at
// most ChunkSize rows a statement.
func (m *Store) UpsertMarks(ctx context.Context, ms []policy.Mark) error {
	return markRows.upsert(ctx, m, ms)
}

// LoadMarks returns every mark of sluice_reset_marks that still matters
// at now (expire_at > now).
func (m *Store) LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error) {
	return markRows.load(ctx, m, 0, "expire_at > ?", now)
}
