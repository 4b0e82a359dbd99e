-- 003: when each component last changed, by the server's clock in
-- microseconds since the Unix epoch (UTC, whatever the session's time zone),
-- indexed, so that a bridge reads only what changed since its last read.
-- Rows already here take the time of this migration. One statement, so it
-- applies whole or not at all.

ALTER TABLE sluice_components
  ADD COLUMN changed_us BIGINT NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  ADD KEY sluice_components_changed (changed_us);
