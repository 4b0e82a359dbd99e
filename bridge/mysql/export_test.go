package mysql

import (
	"context"
	"database/sql"
	"fmt"
)

// Open connects to the server of dsn (a go-sql-driver/mysql DSN that
// names a database), checks that it answers and runs the migrations
// (migrate), for the tests that need a store connected before they go on;
// the bridge uses OpenLazy. It fails, holding nothing open, if the DSN is
// invalid or names no database (an error wrapping ErrInvalidDSN), if the
// server does not answer before ctx ends or the dial times out, or if
// migration fails.
func Open(ctx context.Context, dsn string, cfg Config) (*Store, error) {
	m, err := newMySQL(dsn, cfg)
	if err != nil {
		return nil, fmt.Errorf("global: open mysql: %w", err)
	}
	m.markTried()
	if err := m.db.PingContext(ctx); err != nil {
		_ = m.db.Close()
		return nil, fmt.Errorf("global: open mysql: reach %s: %w", m.addr, m.withDriverCause(err))
	}
	if _, err := migrate(ctx, m.db); err != nil {
		_ = m.db.Close()
		return nil, fmt.Errorf("global: open mysql: %w", err)
	}
	m.status.Store(nil)
	return m, nil
}

// Migrate runs migrate on db, for the tests of migrations on a pool of
// their own (MigrateDatabase is the command's).
func Migrate(ctx context.Context, db *sql.DB) error {
	_, err := migrate(ctx, db)
	return err
}
