package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// The reset marks' upsert (migration 006): per key the larger epoch and the
// later expiry. changed_us goes first, while epoch_ms is still the old one.
const (
	markColumns = "workspace, namespace, identifier, duration_ms, epoch_ms, expire_at"
	markUpdate  = "changed_us = IF(VALUES(epoch_ms) > epoch_ms, " + serverMicros + ", changed_us), " +
		"expire_at = GREATEST(expire_at, VALUES(expire_at)), epoch_ms = GREATEST(epoch_ms, VALUES(epoch_ms))"
	markArity = 6
)

// UpsertMarks merges ms into sluice_reset_marks by max of epoch (and of
// expiry, policy.Mark.ExpireAt with global.MarkGrace), in key order, at
// most ChunkSize rows a statement.
func (m *Store) UpsertMarks(ctx context.Context, ms []policy.Mark) error {
	ms, err := global.PrepareMarks(ms)
	if err != nil {
		return fmt.Errorf("global: mysql: upsert reset marks: %w", err)
	}
	if len(ms) == 0 {
		return nil
	}
	if err := m.usable(ctx, "upsert reset marks"); err != nil {
		return err
	}
	grace := global.MarkGrace.Milliseconds()
	return m.write("upsert reset marks", func() error {
		args := make([]any, 0, min(len(ms), m.chunk)*markArity)
		for start := 0; start < len(ms); start += m.chunk {
			chunk := ms[start:min(start+m.chunk, len(ms))]
			args = args[:0]
			for _, mk := range chunk {
				args = append(args, mk.Workspace, mk.Namespace, []byte(mk.Identifier), mk.Duration, mk.Epoch, mk.ExpireAt(grace))
			}
			var q strings.Builder
			q.WriteString("INSERT INTO sluice_reset_marks (" + markColumns + ") VALUES ")
			for i := range chunk {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString("(?,?,?,?,?,?)")
			}
			q.WriteString(" ON DUPLICATE KEY UPDATE " + markUpdate)
			if _, err := m.exec(ctx, q.String(), args...); err != nil {
				return fmt.Errorf("rows %d to %d of %d: %w", start, start+len(chunk), len(ms), err)
			}
		}
		return nil
	})
}

// LoadMarks returns every mark of sluice_reset_marks that still matters
// at now (expire_at > now).
func (m *Store) LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error) {
	if err := m.usable(ctx, "load reset marks"); err != nil {
		return nil, err
	}
	var out []policy.Mark
	err := m.load(ctx, "SELECT workspace, namespace, identifier, duration_ms, epoch_ms FROM sluice_reset_marks WHERE expire_at > ?",
		[]any{now}, func(scan func(...any) error) error {
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
