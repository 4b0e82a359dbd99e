-- 004: changed_us on the denials, as 003 does on the components.

ALTER TABLE sluice_denials
  ADD COLUMN changed_us BIGINT NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  ADD KEY sluice_denials_changed (changed_us);
