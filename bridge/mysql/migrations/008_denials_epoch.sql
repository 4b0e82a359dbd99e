-- 008: a denial's cell includes its reset epoch, as 007 did for components.
-- One statement.

ALTER TABLE sluice_denials
  ADD COLUMN epoch_ms BIGINT NOT NULL DEFAULT 0 AFTER `sequence`,
  DROP PRIMARY KEY,
  ADD PRIMARY KEY (workspace, namespace, identifier, duration_ms, `sequence`, epoch_ms, region);
