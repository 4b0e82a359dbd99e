-- 001: the G-Counter components of every region, and the denials.
-- Tokens are ASCII with a binary collation (case-sensitive, one byte a
-- character); identifiers are arbitrary bytes. The primary key is at most
-- 64+64+512+8+8+64 bytes plus length prefixes, well under InnoDB's 3072.
-- IF NOT EXISTS: DDL commits implicitly, so a migration interrupted before
-- its version was recorded must be able to run again.

CREATE TABLE IF NOT EXISTS sluice_components (
  workspace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  identifier  VARBINARY(512) NOT NULL,
  duration_ms BIGINT NOT NULL,
  `sequence`  BIGINT NOT NULL,
  region      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  `count`     BIGINT NOT NULL,
  expire_at   BIGINT NOT NULL,
  updated_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (workspace, namespace, identifier, duration_ms, `sequence`, region),
  KEY sluice_components_expire_at (expire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS sluice_denials (
  workspace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  identifier  VARBINARY(512) NOT NULL,
  duration_ms BIGINT NOT NULL,
  `sequence`  BIGINT NOT NULL,
  region      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  limit_value BIGINT NOT NULL,
  expire_at   BIGINT NOT NULL,
  created_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (workspace, namespace, identifier, duration_ms, `sequence`, region),
  KEY sluice_denials_expire_at (expire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
