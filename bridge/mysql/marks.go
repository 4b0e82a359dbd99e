package mysql

import (
	"context"
	"fmt"

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

// UpsertMarks merges ms into sluice_reset_marks by max of epoch (and of
// expiry, policy.Mark.ExpireAt with global.MarkGrace), in key order, at
// most ChunkSize rows a statement.
func (m *Store) UpsertMarks(ctx context.Context, ms []policy.Mark) error {
	ms, err := bridge.PrepareMarks(ms)
	if err != nil {
		return fmt.Errorf("global: mysql: upsert reset marks: %w", err)
	}
	if len(ms) == 0 {
		return nil
	}
	grace := global.MarkGrace.Milliseconds()
	return m.upsert(ctx, "upsert reset marks", "sluice_reset_marks", markColumns, markUpdate, len(ms), func(args []any, i int) []any {
		mk := &ms[i]
		return append(args, mk.Workspace, mk.Namespace, []byte(mk.Identifier), mk.Duration, mk.Epoch, mk.ExpireAt(grace))
	})
}

// LoadMarks returns every mark of sluice_reset_marks that still matters
// at now (expire_at > now).
func (m *Store) LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error) {
	if err := m.usable(ctx, "load reset marks"); err != nil {
		return nil, err
	}
	return m.loadMarks(ctx, "expire_at > ?", now)
}

// loadMarks returns the rows of sluice_reset_marks where where holds
// (with args).
func (m *Store) loadMarks(ctx context.Context, where string, args ...any) ([]policy.Mark, error) {
	var out []policy.Mark
	err := m.load(ctx, "SELECT workspace, namespace, identifier, duration_ms, epoch_ms FROM sluice_reset_marks WHERE "+where,
		args, func(scan func(...any) error) error {
			var mk policy.Mark
			var id []byte
			if err := scan(&mk.Workspace, &mk.Namespace, &id, &mk.Duration, &mk.Epoch); err != nil {
				return err
			}
			mk.Identifier = string(id)
			out = append(out, mk)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("global: mysql: load reset marks: %w", err)
	}
	return out, nil
}
