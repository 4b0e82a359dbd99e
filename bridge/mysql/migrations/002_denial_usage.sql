-- 002: a denial carries the cell's usage when it was denied, not the limit
-- (other regions raise the cell to it; see docs/architecture.md). MySQL 8.0
-- and MariaDB 10.5 or later. One statement, so it either applies whole or
-- not at all.

ALTER TABLE sluice_denials RENAME COLUMN limit_value TO usage_count;
