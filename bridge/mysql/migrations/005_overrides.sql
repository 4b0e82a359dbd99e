-- 005: overrides (DESIGN.md §3.6), one row per (workspace, namespace, pattern):
-- the winning entry of the last-writer-wins merge (docs/architecture.md,
-- "Policies"). A delete is a row with deleted = 1 (a tombstone) so that a set
-- older than it cannot come back. The upsert keeps the row that
-- policy.Compare orders last: (version_ms, origin, deleted, limit_value,
-- duration_ms, shadow), compared as a tuple.

CREATE TABLE IF NOT EXISTS sluice_overrides (
  workspace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  pattern     VARBINARY(512) NOT NULL,
  limit_value BIGINT NOT NULL,
  duration_ms BIGINT NOT NULL,
  shadow      TINYINT NOT NULL,
  deleted     TINYINT NOT NULL,
  version_ms  BIGINT NOT NULL,
  origin      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  changed_us  BIGINT NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  PRIMARY KEY (workspace, namespace, pattern),
  KEY sluice_overrides_changed (changed_us)
) ENGINE=InnoDB;
