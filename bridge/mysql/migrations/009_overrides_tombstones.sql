-- 009: an index for the cleanup of override tombstones (deleted rows whose
-- version is older than the tombstone retention), so that DeleteExpired
-- reads only the rows it deletes however many live overrides are kept.
-- One statement.

ALTER TABLE sluice_overrides ADD KEY sluice_overrides_tombstones (deleted, version_ms);
