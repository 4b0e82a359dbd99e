-- 007: a component's cell includes its reset epoch (docs/architecture.md,
-- "Reset"): 0 for every cell never reset, so every existing row keeps its
-- identity; a cell of a reset's epoch is a row of its own. One statement, so
-- it applies whole or not at all (the denials follow in 008, for the same
-- reason).

ALTER TABLE sluice_components
  ADD COLUMN epoch_ms BIGINT NOT NULL DEFAULT 0 AFTER `sequence`,
  DROP PRIMARY KEY,
  ADD PRIMARY KEY (workspace, namespace, identifier, duration_ms, `sequence`, epoch_ms, region);
