-- 006: reset marks (DESIGN.md §3.6, reset), one row per (workspace,
-- namespace, identifier, duration_ms), duration_ms 0 for every duration:
-- the latest epoch, merged by max (docs/architecture.md, "Reset"). expire_at
-- is when the mark stops mattering (policy.Mark.ExpireAt); rows past it are
-- no longer loaded.

CREATE TABLE IF NOT EXISTS sluice_reset_marks (
  workspace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  identifier  VARBINARY(512) NOT NULL,
  duration_ms BIGINT NOT NULL,
  epoch_ms    BIGINT NOT NULL,
  expire_at   BIGINT NOT NULL,
  changed_us  BIGINT NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  PRIMARY KEY (workspace, namespace, identifier, duration_ms),
  KEY sluice_reset_marks_expire_at (expire_at),
  KEY sluice_reset_marks_changed (changed_us)
) ENGINE=InnoDB;
