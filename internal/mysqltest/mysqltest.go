// Package mysqltest gives tests databases of their own on the MariaDB (or
// MySQL) server of the development environment.
//
// The server is found through SLUICE_TEST_MYSQL_DSN, or is the one that
// `make services` provides on 127.0.0.1:3306, reached as its test account
// sluicetest (password sluicetest), which may touch only databases named
// sluicetest_*: the tests never need root. A
// server that does not answer fails the test rather than skipping it: the
// services are part of the test environment. Each database is created for
// one test, named sluicetest_ and 16 random hex digits, and dropped when
// that test ends; nothing else on the server is touched.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/internal/tcpproxy"
)

// DSNEnv names the environment variable that overrides the server's DSN.
const DSNEnv = "SLUICE_TEST_MYSQL_DSN"

// DefaultDSN is the server that `make services` provides, as the test
// account scripts/services.sh creates: every privilege on databases whose
// names start with DatabasePrefix, none elsewhere.
const DefaultDSN = "sluicetest:sluicetest@tcp(127.0.0.1:3306)/"

// DatabasePrefix starts the name of every database that Database creates.
const DatabasePrefix = "sluicetest_"

const (
	// pingTimeout bounds how long DSN waits for the server to answer.
	pingTimeout = 5 * time.Second
	// adminTimeout bounds creating or dropping a database.
	adminTimeout = 30 * time.Second
)

// DSN returns SLUICE_TEST_MYSQL_DSN or DefaultDSN; t.Fatal
// (never Skip) with "run make services" if MariaDB does not answer within
// 5s.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(DSNEnv)
	if dsn == "" {
		dsn = DefaultDSN
	}
	db, addr, err := open(dsn)
	if err != nil {
		t.Fatalf("mysqltest: %s: %v", DSNEnv, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("mysqltest: MariaDB at %s does not answer within %s (run make services): %v", addr, pingTimeout, err)
	}
	return dsn
}

// Database creates a fresh database named sluicetest_<16 hex> on that
// server, drops it at t.Cleanup, and returns a DSN selecting it. The DSN
// keeps every parameter of the server's DSN.
func Database(t testing.TB) string {
	t.Helper()
	dsn := DSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("mysqltest: %s: %v", DSNEnv, err)
	}
	name := newName()
	if err := admin(dsn, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("mysqltest: create database %s: %v", name, err)
	}
	dropAtCleanup(t, dsn, name)
	cfg.DBName = name
	return cfg.FormatDSN()
}

// MissingDatabase returns a DSN selecting a database named sluicetest_<16
// hex> that does not exist, for tests of what creates it; whatever creates
// it, it is dropped at t.Cleanup.
func MissingDatabase(t testing.TB) string {
	t.Helper()
	dsn := DSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("mysqltest: %s: %v", DSNEnv, err)
	}
	name := newName()
	dropAtCleanup(t, dsn, name)
	cfg.DBName = name
	return cfg.FormatDSN()
}

// BehindProxy starts a TCP proxy (internal/tcpproxy), closed at
// t.Cleanup, in front of the server of dsn, and returns the proxy and the
// DSN with the proxy's address in the server's place: a test controls what
// reaches the server by the proxy's mode.
func BehindProxy(t testing.TB, dsn string) (*tcpproxy.Proxy, *mysql.Config) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("mysqltest: %v", err)
	}
	proxy, err := tcpproxy.Start(cfg.Addr)
	if err != nil {
		t.Fatalf("mysqltest: %v", err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cfg.Addr = proxy.Addr()
	return proxy, cfg
}

// newName returns a fresh database name: sluicetest_ and 16 random hex
// digits.
func newName() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return DatabasePrefix + hex.EncodeToString(b[:])
}

// dropAtCleanup drops database name, if it exists, when t ends.
func dropAtCleanup(t testing.TB, dsn, name string) {
	t.Cleanup(func() {
		if err := admin(dsn, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("mysqltest: drop database %s: %v", name, err)
		}
	})
}

// open returns a pool for dsn, which it does not use yet, and the server's
// address.
func open(dsn string) (*sql.DB, string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = pingTimeout
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, "", err
	}
	return sql.OpenDB(c), cfg.Addr, nil
}

// admin runs one statement on the server of dsn.
func admin(dsn, stmt string) error {
	db, _, err := open(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}
