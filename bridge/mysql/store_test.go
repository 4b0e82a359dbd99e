package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
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

// now is the instant the store tests load and expire against.
const now = storetest.Now

func TestStoreContract(t *testing.T) {
	for _, kind := range []struct {
		name string
		cfg  mysql.Config
	}{{"default", mysql.Config{}}, {"chunk-64", mysql.Config{ChunkSize: 64}}} {
		t.Run(kind.name, func(t *testing.T) { storetest.Contract(t, mysqlKind(kind.cfg)(t)) })
	}
}

// mysqlKind opens MySQL stores configured by cfg, all on one database of
// the kind's own, emptied for each store: creating and dropping a database
// is DDL, far slower than DELETE on a busy server.
func mysqlKind(cfg mysql.Config) func(t *testing.T) func(t *testing.T) bridge.Store {
	return func(t *testing.T) func(t *testing.T) bridge.Store {
		dsn := mysqltest.Database(t)
		return func(t *testing.T) bridge.Store {
			m := openMySQLOn(t, dsn, cfg)
			for _, table := range []string{"sluice_components", "sluice_overrides", "sluice_reset_marks"} {
				if _, err := m.DB().ExecContext(t.Context(), "DELETE FROM "+table); err != nil {
					t.Fatalf("empty %s: %v", table, err)
				}
			}
			return m
		}
	}
}

// openMySQL opens a MySQL store on a database of the test's own.
func openMySQL(t *testing.T, cfg mysql.Config) *mysql.Store {
	t.Helper()
	return openMySQLOn(t, mysqltest.Database(t), cfg)
}

// openMySQLOn opens a MySQL store on dsn, closed at t.Cleanup.
func openMySQLOn(t *testing.T, dsn string, cfg mysql.Config) *mysql.Store {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	m, err := mysql.Open(t.Context(), dsn, cfg)
	if err != nil {
		t.Fatalf("OpenMySQL: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// migrations returns the rows of sluice_schema_migrations.
func migrations(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), "SELECT version, name, applied_at FROM sluice_schema_migrations ORDER BY version")
	if err != nil {
		t.Fatalf("read sluice_schema_migrations: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int
		var name, at string
		if err := rows.Scan(&v, &name, &at); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d %s %s", v, name, at))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// openDB opens a plain pool on dsn.
func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	m := openMySQL(t, mysql.Config{})
	before := migrations(t, m.DB())
	if len(before) == 0 || !strings.HasPrefix(before[0], "1 001_") {
		t.Fatalf("after OpenMySQL, migrations = %q, want version 1 first", before)
	}
	for range 2 {
		if err := mysql.Migrate(t.Context(), m.DB()); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}
	if after := migrations(t, m.DB()); !slices.Equal(after, before) {
		t.Fatalf("Migrate again changed the migrations:\n got %q\nwant %q", after, before)
	}
	// The store still works, and the lock was released.
	storetest.UpsertComponents(t, m, storetest.Component(storetest.Cell("a", 1), "eu", 1, now+1))
	var free int
	if err := m.DB().QueryRowContext(t.Context(), "SELECT IS_FREE_LOCK('sluice_migrate')").Scan(&free); err != nil || free != 1 {
		t.Fatalf("IS_FREE_LOCK('sluice_migrate') = %d, %v; want 1", free, err)
	}
}

func TestConcurrentMigrationsAllSucceed(t *testing.T) {
	dsn := mysqltest.Database(t)
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		db := openDB(t, dsn) // a pool each, as separate bridges have
		wg.Go(func() {
			<-start
			errs[i] = mysql.Migrate(t.Context(), db)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	got := migrations(t, openDB(t, dsn))
	files, err := fs.Glob(os.DirFS("migrations"), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(files) {
		t.Fatalf("migrations = %q, want each of %q recorded once", got, files)
	}
	for i, f := range files {
		if !strings.HasPrefix(got[i], fmt.Sprintf("%d %s ", i+1, f)) {
			t.Fatalf("migrations = %q, want each of %q recorded once, in order", got, files)
		}
	}
}

func TestMigrateWithoutADatabaseFails(t *testing.T) {
	db := openDB(t, mysqltest.DSN(t))
	if err := mysql.Migrate(t.Context(), db); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Fatalf("Migrate with no database selected = %v, want a no database error", err)
	}
}

func TestOpenMySQLFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	server, err := gomysql.ParseDSN(mysqltest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	server.DBName = ""

	cases := []struct {
		name, dsn, want string
	}{
		{"when the DSN is invalid", "root@tcp(127.0.0.1:3306", "invalid MySQL DSN"},
		{"when the DSN names no database", server.FormatDSN(), "names no database"},
		{"when the server is unreachable", "root@tcp(" + closed + ")/sluice", "reach " + closed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			m, err := mysql.Open(ctx, tc.dsn, mysql.Config{})
			if err == nil {
				m.Close()
				t.Fatal("OpenMySQL succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("OpenMySQL = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestCanceledWritesDoNotTripTheBreaker(t *testing.T) {
	m := openMySQL(t, mysql.Config{Breaker: mysql.Breaker{Failures: 1}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 3 {
		err := m.UpsertComponents(ctx, []global.Component{storetest.Component(storetest.Cell("a", 1), "eu", 1, now+1)})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("UpsertComponents with a canceled context = %v, want context.Canceled", err)
		}
	}
	if st := m.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %s after canceled writes, want closed", st)
	}
	storetest.UpsertComponents(t, m, storetest.Component(storetest.Cell("a", 1), "eu", 1, now+1))
}

// eventually calls f until it succeeds, failing the test if it has not
// within d. It is for steps that a busy machine may delay past a short
// timeout, not for what a test asserts.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, d, err)
		}
		t.Logf("%s: %v; trying again", what, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBreakerOpensWhenTheServerGoesSilentAndClosesAfterRecovery black-holes
// the network between the store and MariaDB.
func TestBreakerOpensWhenTheServerGoesSilentAndClosesAfterRecovery(t *testing.T) {
	const (
		timeout  = 500 * time.Millisecond
		failures = 3
		openFor  = time.Second
	)
	proxy, cfg := mysqltest.BehindProxy(t, mysqltest.Database(t))
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = timeout, timeout, timeout
	dsn := cfg.FormatDSN()
	for _, p := range []string{"timeout=500ms", "readTimeout=500ms", "writeTimeout=500ms"} {
		if !strings.Contains(dsn, p) {
			t.Fatalf("DSN %q lacks %s", dsn, p)
		}
	}

	var mu sync.Mutex
	var states []gobreaker.State
	var openedAt time.Time
	var m *mysql.Store
	eventually(t, 10*time.Second, "OpenMySQL through the proxy", func() (err error) {
		m, err = mysql.Open(t.Context(), dsn, mysql.Config{
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
			Breaker: mysql.Breaker{
				Failures: failures,
				OpenFor:  openFor,
				OnStateChange: func(_, to gobreaker.State) {
					mu.Lock()
					defer mu.Unlock()
					states = append(states, to)
					if to == gobreaker.StateOpen && openedAt.IsZero() {
						openedAt = time.Now()
					}
				},
			},
		})
		return err
	})
	t.Cleanup(func() { _ = m.Close() })
	ctx := t.Context()
	c := storetest.Cell("a", 1)
	write := func(count int64) error {
		return m.UpsertComponents(ctx, []global.Component{storetest.Component(c, "eu", count, now+1)})
	}
	eventually(t, 10*time.Second, "write through the proxy", func() error { return write(1) })
	if st := m.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %s before the fault, want closed", st)
	}

	proxy.SetMode(tcpproxy.Blackhole)
	for i := range failures {
		start := time.Now()
		err := write(int64(2 + i))
		took := time.Since(start)
		t.Logf("write %d through the black hole failed after %s: %v", i, took.Round(time.Millisecond), err)
		if err == nil || errors.Is(err, bridge.ErrStoreOpen) {
			t.Fatalf("write %d through the black hole = %v, want a failure of its own", i, err)
		}
		if took > 5*timeout {
			t.Fatalf("write %d through the black hole took %s, want about %s", i, took, timeout)
		}
	}
	if st := m.BreakerState(); st != gobreaker.StateOpen {
		t.Fatalf("breaker %s after %d failures, want open", st, failures)
	}
	if err := m.Ready(); err == nil || !strings.Contains(err.Error(), "mysql: writes failing at "+proxy.Addr()) {
		t.Fatalf("Ready with the breaker open = %v, want it to say writes are failing", err)
	}
	refused := []struct {
		name string
		call func() error
	}{
		{"UpsertComponents", func() error { return write(9) }},
		{"DeleteExpired", func() error { _, err := m.DeleteExpired(ctx, now, 100); return err }},
	}
	for _, r := range refused {
		start := time.Now()
		err := r.call()
		// Far below the timeout: the server was not asked.
		if took := time.Since(start); !errors.Is(err, bridge.ErrStoreOpen) || took > timeout/2 {
			t.Fatalf("%s with the breaker open = %v after %s, want ErrStoreOpen at once", r.name, err, took)
		}
	}
	// Loads bypass the breaker: they try, and time out.
	if _, err := storetest.Components(ctx, m, now); err == nil || errors.Is(err, bridge.ErrStoreOpen) {
		t.Fatalf("loading the components through the black hole = %v, want a failure of its own", err)
	}

	proxy.SetMode(tcpproxy.Pass)
	mu.Lock()
	wait := time.Until(openedAt.Add(openFor))
	mu.Unlock()
	time.Sleep(wait + 50*time.Millisecond)
	// The probe write normally succeeds at once; on a busy machine it may
	// outlast the short timeout and reopen the breaker for another OpenFor.
	eventually(t, 10*time.Second, "write after recovery", func() error { return write(10) })
	if st := m.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %s after a successful write, want closed", st)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready after recovery = %v", err)
	}
	eventually(t, 10*time.Second, "load after recovery", func() error {
		got, err := storetest.Components(ctx, m, now)
		if err == nil && !slices.Equal(got, []global.Component{storetest.Component(c, "eu", 10, now+1)}) {
			t.Fatalf("loading the components after recovery = %+v, want count 10", got)
		}
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	if len(states) < 3 || states[0] != gobreaker.StateOpen || states[1] != gobreaker.StateHalfOpen || states[len(states)-1] != gobreaker.StateClosed {
		t.Fatalf("breaker states %v, want open, half-open, ..., closed", states)
	}
}
