package mysql_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/storetest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
)

// logBuffer collects a logger's text lines; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many lines contain s.
func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.Lines(l.b.String()) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lazyConfig retries fast and logs at debug level into logs.
func lazyConfig(logs *logBuffer) mysql.Config {
	return mysql.Config{
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RetryMin: 20 * time.Millisecond,
		RetryMax: 100 * time.Millisecond,
	}
}

// openLazy opens a lazy store on dsn, closed at t.Cleanup.
func openLazy(t *testing.T, dsn string, cfg mysql.Config) *mysql.Store {
	t.Helper()
	m, err := mysql.OpenLazy(dsn, cfg)
	if err != nil {
		t.Fatalf("OpenMySQLLazy: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// waitReady polls Ready until it returns nil, failing the test after d.
func waitReady(t *testing.T, m *mysql.Store, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := m.Ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store not ready after %s: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitNotReady polls Ready until it fails with an error saying want.
func waitNotReady(t *testing.T, m *mysql.Store, want string, d time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := m.Ready()
		if err != nil && strings.Contains(err.Error(), want) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v after %s, want an error saying %q", err, d, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLazyMySQLRefusesCallsUntilTheServerAnswersThenConnects(t *testing.T) {
	proxy, cfg := mysqltest.BehindProxy(t, mysqltest.Database(t))
	proxy.SetMode(tcpproxy.Refuse)
	var logs logBuffer
	m := openLazy(t, cfg.FormatDSN(), lazyConfig(&logs))

	notReady := waitNotReady(t, m, "mysql: not reachable at "+proxy.Addr()+": ", 10*time.Second)
	if !errors.Is(notReady, bridge.ErrStoreUnavailable) {
		t.Fatalf("Ready = %v, want ErrStoreUnavailable", notReady)
	}
	t.Logf("Ready while the proxy refuses: %v", notReady)
	ctx := t.Context()
	c := storetest.Cell("lazy", 1)
	start := time.Now()
	err := m.UpsertComponents(ctx, []global.Component{storetest.Component(c, "eu", 3, now+1)})
	if !errors.Is(err, bridge.ErrStoreUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("UpsertComponents before connecting = %v after %s, want ErrStoreUnavailable at once", err, time.Since(start))
	}
	if _, err := storetest.Components(ctx, m, now); !errors.Is(err, bridge.ErrStoreUnavailable) {
		t.Fatalf("loading the components before connecting = %v, want ErrStoreUnavailable", err)
	}
	if _, err := m.DeleteExpired(ctx, now, 10); !errors.Is(err, bridge.ErrStoreUnavailable) {
		t.Fatalf("DeleteExpired before connecting = %v, want ErrStoreUnavailable", err)
	}
	if st := m.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %s after calls refused before connecting, want closed (untouched)", st)
	}
	// Several attempts fail (the retry starts at 20ms); the state is
	// logged once.
	for logs.count("level=DEBUG msg=\"global store not ready; trying again\"") < 3 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("fewer than 3 attempts in 10s; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := logs.count(`msg="global store not reachable; writes are queued and retried"`); n != 1 {
		t.Fatalf("%d lines say the store is not reachable, want 1; logs:\n%s", n, logs.String())
	}

	proxy.SetMode(tcpproxy.Pass)
	waitReady(t, m, 10*time.Second)
	storetest.UpsertComponents(t, m, storetest.Component(c, "eu", 3, now+1))
	got, err := storetest.Components(ctx, m, now)
	if err != nil || !slices.Equal(got, []global.Component{storetest.Component(c, "eu", 3, now+1)}) {
		t.Fatalf("loading the components once connected = %+v, %v", got, err)
	}
	if n := logs.count(`msg="global store connected"`); n != 1 {
		t.Fatalf("%d lines say the store connected, want 1; logs:\n%s", n, logs.String())
	}
}

func TestLazyMySQLWaitsForADatabaseThatMigrateMySQLCreates(t *testing.T) {
	dsn := mysqltest.MissingDatabase(t)
	name := dbName(t, dsn)
	var logs logBuffer
	cfg := lazyConfig(&logs)
	cfg.CreateDatabaseHint = "run the migration"
	m := openLazy(t, dsn, cfg)

	err := waitNotReady(t, m, `mysql: database "`+name+`" does not exist at `, 10*time.Second)
	if !errors.Is(err, mysql.ErrDatabaseMissing) || !errors.Is(err, bridge.ErrStoreUnavailable) || !strings.HasSuffix(err.Error(), ": run the migration") {
		t.Fatalf("Ready = %v, want ErrDatabaseMissing ending with the hint", err)
	}
	for logs.count("global store not ready; trying again") < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	if n := logs.count(`database \"` + name + `\" does not exist: run the migration`); n != 1 {
		t.Fatalf("%d lines say the database does not exist, want 1; logs:\n%s", n, logs.String())
	}

	rep, err := mysql.MigrateDatabase(t.Context(), dsn, mysql.Config{})
	if err != nil {
		t.Fatalf("MigrateMySQL: %v", err)
	}
	// The lazy store migrates too as soon as the database exists, and may
	// take the migration lock first: then MigrateMySQL finds the schema up
	// to date.
	applied := "created database " + name + "; applied migrations 001_components_denials.sql, 002_denial_usage.sql, 003_components_changed.sql, 004_denials_changed.sql, 005_overrides.sql, 006_reset_marks.sql, 007_components_epoch.sql, 008_denials_epoch.sql, 009_overrides_tombstones.sql, 010_drop_denials.sql"
	if got := rep.String(); got != applied && got != "created database "+name+"; schema is up to date" {
		t.Fatalf("MigrateMySQL did %q, want %q (or the schema up to date)", rep, applied)
	}
	waitReady(t, m, 10*time.Second)
	storetest.UpsertComponents(t, m, storetest.Component(storetest.Cell("created", 1), "eu", 1, now+1))

	rep, err = mysql.MigrateDatabase(t.Context(), dsn, mysql.Config{})
	if err != nil || rep.String() != "schema is up to date" || rep.CreatedDatabase {
		t.Fatalf("MigrateMySQL again = %q, %v; want schema is up to date", rep, err)
	}
	var charset, collation string
	if err := m.DB().QueryRowContext(t.Context(),
		"SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name,
	).Scan(&charset, &collation); err != nil || charset != "utf8mb4" || collation != "utf8mb4_bin" {
		t.Fatalf("database created with %s / %s (%v), want utf8mb4 / utf8mb4_bin", charset, collation, err)
	}
}

func TestLazyMySQLSaysWhenTheServerRefusesTheLogin(t *testing.T) {
	cfg, err := gomysql.ParseDSN(mysqltest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = "sluice_no_such_user", "s3cret"
	var logs logBuffer
	m := openLazy(t, cfg.FormatDSN(), lazyConfig(&logs))
	// MariaDB answers 1045 or 1698 (ER_ACCESS_DENIED_NO_PASSWORD_ERROR).
	err = waitNotReady(t, m, "mysql: refused at "+cfg.Addr+": Error ", 10*time.Second)
	if !strings.Contains(err.Error(), "Access denied") || !errors.Is(err, bridge.ErrStoreUnavailable) {
		t.Fatalf("Ready = %v, want ErrStoreUnavailable saying access is denied", err)
	}
	if n := logs.count(`msg="global store refused by MySQL; writes are queued and retried"`); n != 1 {
		t.Fatalf("%d lines say MySQL refused, want 1; logs:\n%s", n, logs.String())
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(logs.String(), "s3cret") {
		t.Fatalf("the password is printed: %v\n%s", err, logs.String())
	}
}

// A call made while the first attempt to connect is still running waits for
// it: a bridge starting beside a healthy MySQL loads from it at once.
func TestLazyMySQLCallsWaitForTheFirstAttempt(t *testing.T) {
	dsn := mysqltest.Database(t)
	var logs logBuffer
	m := openLazy(t, dsn, lazyConfig(&logs))
	if _, err := storetest.Components(t.Context(), m, now); err != nil {
		t.Fatalf("loading the components right after OpenMySQLLazy on a healthy server = %v, want it to wait and load", err)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready after a load = %v", err)
	}
}

// The wait for the first attempt is bounded by the caller's context: a
// server that does not answer at all never holds up a caller longer.
func TestLazyMySQLWaitForTheFirstAttemptEndsWithTheContext(t *testing.T) {
	proxy, cfg := mysqltest.BehindProxy(t, mysqltest.Database(t))
	proxy.SetMode(tcpproxy.Blackhole)
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
	var logs logBuffer
	m := openLazy(t, cfg.FormatDSN(), lazyConfig(&logs))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := storetest.Components(ctx, m, now)
	if took := time.Since(start); !errors.Is(err, bridge.ErrStoreUnavailable) || took > 2*time.Second {
		t.Fatalf("loading the components with a 200ms context while the server is silent = %v after %s, want ErrStoreUnavailable within it", err, took)
	}
	if err := m.Ready(); !errors.Is(err, bridge.ErrStoreUnavailable) || !strings.Contains(err.Error(), "mysql: connecting to "+proxy.Addr()) {
		t.Fatalf("Ready during the first attempt = %v, want it to say it is connecting", err)
	}
	proxy.SetMode(tcpproxy.Pass)
	waitReady(t, m, 20*time.Second)
}

func TestLazyMySQLRefusesABadDSNAtOnce(t *testing.T) {
	for _, dsn := range []string{"root@tcp(127.0.0.1:3306", "root@tcp(127.0.0.1:3306)/"} {
		m, err := mysql.OpenLazy(dsn, mysql.Config{})
		if err == nil {
			m.Close()
			t.Fatalf("OpenMySQLLazy(%q) succeeded", dsn)
		}
		if !errors.Is(err, mysql.ErrInvalidDSN) || !strings.Contains(err.Error(), "user:password@tcp(host:port)/database") {
			t.Fatalf("OpenMySQLLazy(%q) = %v, want ErrInvalidDSN showing the form", dsn, err)
		}
	}
}

func dbName(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.DBName
}
