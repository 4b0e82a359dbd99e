-- 010: a region's first denial of a cell travels and is stored as its
-- component (sluice_components), so the denials table goes.
-- One statement.

DROP TABLE IF EXISTS sluice_denials;
