package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
)

// Errors of opening a MySQL store.
var (
	// ErrInvalidDSN is wrapped by the error of a DSN that cannot be parsed or
	// names no database: a configuration mistake that no retry repairs.
	ErrInvalidDSN = errors.New("invalid MySQL DSN")
	// ErrDatabaseMissing is wrapped, with bridge.ErrStoreUnavailable, while the
	// server answers that the DSN's database does not exist (MySQL error
	// 1049, ER_BAD_DB_ERROR). MigrateDatabase creates it.
	ErrDatabaseMissing = errors.New("database does not exist")
)

const (
	// mysqlErrBadDB is ER_BAD_DB_ERROR: the selected database does not exist.
	mysqlErrBadDB = 1049
	// mysqlDefaultRetryMin and mysqlDefaultRetryMax bound the wait between
	// two attempts of a lazy store to connect.
	mysqlDefaultRetryMin = time.Second
	mysqlDefaultRetryMax = 30 * time.Second
	// mysqlAttemptTimeout bounds one attempt to connect and migrate; the
	// migration lock alone may be waited for migrateLockWait.
	mysqlAttemptTimeout = migrateLockWait + 30*time.Second
	// defaultCreateDatabaseHint ends the message about a missing database
	// unless Config.CreateDatabaseHint says otherwise.
	defaultCreateDatabaseHint = "create it (utf8mb4, binary collation), then apply the schema"
)

// parseMySQLDSN parses dsn and applies the store's defaults: 5s dial, read
// and write timeouts unless set, and no client-side interpolation.
func parseMySQLDSN(dsn string) (*gomysql.Config, error) {
	mc, err := gomysql.ParseDSN(dsn)
	if err != nil {
		// The driver's errors start "invalid DSN: " and never quote the
		// password.
		return nil, fmt.Errorf("%w: %s (want user:password@tcp(host:port)/database)", ErrInvalidDSN,
			strings.TrimPrefix(err.Error(), "invalid DSN: "))
	}
	if mc.DBName == "" {
		return nil, fmt.Errorf("%w: it names no database (want user:password@tcp(host:port)/database)", ErrInvalidDSN)
	}
	mc.Timeout = orDefault(mc.Timeout, mysqlDefaultTimeout)
	mc.ReadTimeout = orDefault(mc.ReadTimeout, mysqlDefaultTimeout)
	mc.WriteTimeout = orDefault(mc.WriteTimeout, mysqlDefaultTimeout)
	mc.InterpolateParams = false
	return mc, nil
}

// openPool returns a connection pool for mc, which it does not use yet.
// The driver's messages go to drv.
func openPool(mc *gomysql.Config, maxConns int, drv *driverLogger) (*sql.DB, error) {
	mc = mc.Clone()
	mc.Logger = drv
	connector, err := gomysql.NewConnector(mc)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxLifetime(mysqlConnMaxLifetime)
	db.SetConnMaxIdleTime(mysqlConnMaxIdleTime)
	return db, nil
}

// newMySQL parses dsn and returns a store whose pool has not connected
// yet; it is not ready until connect succeeds.
func newMySQL(dsn string, cfg Config) (*Store, error) {
	mc, err := parseMySQLDSN(dsn)
	if err != nil {
		return nil, err
	}
	drv := newDriverLogger(cfg.Logger)
	cfg.ChunkSize = min(orDefault(cfg.ChunkSize, DefaultChunkSize), MaxChunkSize)
	cfg.ChangeLag = orDefault(cfg.ChangeLag, DefaultChangeLag)
	cfg.MaxConns = orDefault(cfg.MaxConns, mysqlDefaultMaxConns)
	if cfg.CreateDatabaseHint == "" {
		cfg.CreateDatabaseHint = defaultCreateDatabaseHint
	}
	db, err := openPool(mc, cfg.MaxConns, drv)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidDSN, err)
	}
	m := &Store{
		db:       db,
		maxConns: cfg.MaxConns,
		chunk:    cfg.ChunkSize,
		lagUs:    cfg.ChangeLag.Microseconds(),
		breaker:  cfg.Breaker.withDefaults(),
		log:      drv.log,
		drv:      drv,
		addr:     mc.Addr,
		database: mc.DBName,
		hint:     cfg.CreateDatabaseHint,
		tried:    make(chan struct{}),
		connSem:  make(chan struct{}, 1),
	}
	m.cb.Store(newStoreBreaker(m.breaker, m.log))
	drv.status = &m.status
	m.status.Store(&notReadyError{kind: notTried, msg: "mysql: connecting to " + m.addr})
	return m, nil
}

// OpenLazy returns a MySQL store at once, without waiting for the
// server: only a DSN that does not parse or names no database is an error
// (wrapping ErrInvalidDSN). The DSN's timeout, readTimeout and
// writeTimeout default to 5s when it sets none, and parameters are never
// interpolated client-side. A goroutine connects and runs the migrations
// (migrate), at once and then, while that fails, again after a wait that
// doubles from
// Config.RetryMin to RetryMax. Until it has succeeded, Ready says why
// not and every call fails, without asking the server, with an error
// wrapping bridge.ErrStoreUnavailable; calls made before the first attempt has
// finished wait for it first, as long as their context allows, so that a
// process starting beside a healthy server loads from it. Each change of
// that state (unreachable, database missing, other failure, connected) is
// logged once; single retries are logged at debug level. Close stops the
// goroutine.
func OpenLazy(dsn string, cfg Config) (*Store, error) {
	m, err := newMySQL(dsn, cfg)
	if err != nil {
		return nil, fmt.Errorf("global: open mysql: %w", err)
	}
	retryMin := orDefault(cfg.RetryMin, mysqlDefaultRetryMin)
	retryMax := max(orDefault(cfg.RetryMax, mysqlDefaultRetryMax), retryMin)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.loop.Go(func() { m.connectLoop(ctx, retryMin, retryMax) })
	return m, nil
}

// connectLoop tries to connect and migrate until it succeeds or ctx ends.
func (m *Store) connectLoop(ctx context.Context, retryMin, retryMax time.Duration) {
	defer m.markTried()
	wait := retryMin
	for {
		if m.connect(ctx) {
			return
		}
		m.markTried()
		// Up to a fifth less, so that bridges started together spread out.
		d := wait - rand.N(wait/5+1)
		m.log.Debug("global store not ready; trying again", "in", d.Round(time.Millisecond), "reason", m.Ready())
		if !sleep(ctx, d) {
			return
		}
		wait = min(2*wait, retryMax)
	}
}

// connect makes one attempt to reach the server and migrate, records the
// outcome and reports whether the store is ready. Attempts run one at a
// time: one that waits for another past ctx's end fails, and one that
// finds the store ready makes none.
func (m *Store) connect(ctx context.Context) bool {
	select {
	case m.connSem <- struct{}{}:
		defer func() { <-m.connSem }()
	case <-ctx.Done():
		return false
	}
	if m.status.Load() == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, mysqlAttemptTimeout)
	defer cancel()
	m.drv.last.Store(nil)
	if err := m.db.PingContext(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return false // closed
		}
		var me *gomysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == mysqlErrBadDB:
			m.setStatus(noDatabase, fmt.Sprintf("mysql: database %q does not exist at %s: %s", m.database, m.addr, m.hint), err)
		case errors.As(err, &me):
			// The server answered: it is reachable, but refuses (access
			// denied, too many connections...).
			m.setStatus(refused, fmt.Sprintf("mysql: refused at %s: %v", m.addr, err), err)
		default:
			err = m.withDriverCause(err)
			m.setStatus(unreachable, fmt.Sprintf("mysql: not reachable at %s: %v", m.addr, err), err)
		}
		return false
	}
	applied, err := migrate(ctx, m.db)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return false
		}
		m.setStatus(schemaFailing, fmt.Sprintf("mysql: schema not brought up to date at %s: %v", m.addr, err), err)
		return false
	}
	m.status.Store(nil)
	if len(applied) == 0 {
		applied = []string{}
	}
	m.log.Info("global store connected", "addr", m.addr, "database", m.database, "migrations_applied", applied)
	return true
}

// Reconnect makes the store's next calls go over fresh connections: it
// closes the pool's idle connections, which an outage may have left dead
// while the server answers again, and checks on a newly dialed one that the
// server answers (a ping), before ctx ends; connections in use are left
// alone. A store that has not connected yet (OpenLazy) makes one attempt to
// connect and migrate instead, as its goroutine does. Once the server
// answered, an open or half-open write breaker is closed (logged, and
// passed to Breaker.OnStateChange, as a change to closed): the answer is the
// probe the breaker waits Breaker.OpenFor for, so the next write is tried at
// once. Otherwise it returns an error wrapping bridge.ErrStoreUnavailable
// that says why, and the breaker is left as it was.
func (m *Store) Reconnect(ctx context.Context) error {
	if m.status.Load() != nil {
		if m.connect(ctx) {
			m.closeBreaker()
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("global: mysql: reconnect to %s: %w: %w", m.addr, bridge.ErrStoreUnavailable, err)
		}
		return fmt.Errorf("global: mysql: reconnect: %w", m.Ready())
	}
	m.db.SetMaxIdleConns(0) // closes the idle ones
	m.db.SetMaxIdleConns(m.maxConns)
	if err := m.db.PingContext(ctx); err != nil {
		return fmt.Errorf("global: mysql: reconnect to %s: %w: %w", m.addr, bridge.ErrStoreUnavailable, err)
	}
	m.closeBreaker()
	return nil
}

// closeBreaker replaces an open or half-open write breaker with a closed
// one, reporting the change as the breaker would.
func (m *Store) closeBreaker() {
	old := m.cb.Load()
	from := old.State()
	if from == gobreaker.StateClosed || !m.cb.CompareAndSwap(old, newStoreBreaker(m.breaker, m.log)) {
		return
	}
	breakerChanged(m.breaker, m.log, from, gobreaker.StateClosed)
}

// setStatus records why the store is not ready (msg, because of cause),
// and logs it if the kind of reason changed.
func (m *Store) setStatus(kind notReadyKind, msg string, cause error) {
	st := &notReadyError{kind: kind, msg: msg, cause: cause}
	if prev := m.status.Swap(st); prev != nil && prev.kind == st.kind {
		return
	}
	switch st.kind {
	case noDatabase:
		m.log.Error(fmt.Sprintf("MySQL database %q does not exist: %s; writes are queued until it does", m.database, m.hint), "addr", m.addr)
	case refused:
		m.log.Error("global store refused by MySQL; writes are queued and retried", "addr", m.addr, "error", st.cause)
	case unreachable:
		m.log.Warn("global store not reachable; writes are queued and retried", "addr", m.addr, "error", st.cause)
	default:
		m.log.Error("global store schema not brought up to date; writes are queued and retried", "addr", m.addr, "error", st.cause)
	}
}

// markTried records that the first attempt to connect has finished.
func (m *Store) markTried() { m.triedOnce.Do(func() { close(m.tried) }) }

// usable returns nil if the store may be asked, else an error wrapping
// bridge.ErrStoreUnavailable. Before the first attempt to connect has finished it
// waits for it, as long as ctx allows.
func (m *Store) usable(ctx context.Context, op string) error {
	if m.status.Load() == nil {
		return nil
	}
	select {
	case <-m.tried:
	case <-ctx.Done():
		return fmt.Errorf("global: mysql: %s: %w: waiting for the first connection: %w", op, bridge.ErrStoreUnavailable, ctx.Err())
	}
	if m.status.Load() == nil {
		return nil
	}
	return fmt.Errorf("global: mysql: %s: %w", op, m.Ready())
}

// Ready returns nil while the store can be written: it has connected and
// brought its schema up to date, and its write breaker is closed. Otherwise
// it says what is missing, naming the server's address and never the
// password: "mysql: not reachable at host:port: ...", "mysql: database
// \"name\" does not exist at host:port: <CreateDatabaseHint>" (wrapping
// ErrDatabaseMissing), "mysql: writes failing at host:port: circuit
// breaker open", and so on. Errors before the first connection wrap
// bridge.ErrStoreUnavailable.
func (m *Store) Ready() error {
	if st := m.status.Load(); st != nil {
		return st
	}
	if st := m.cb.Load().State(); st != gobreaker.StateClosed {
		return fmt.Errorf("mysql: writes failing at %s: circuit breaker %s", m.addr, st)
	}
	return nil
}

// withDriverCause adds to the driver's "invalid connection" the cause that
// the driver logged instead of returning, such as a connection reset.
func (m *Store) withDriverCause(err error) error {
	if cause := m.drv.last.Load(); cause != nil && errors.Is(err, gomysql.ErrInvalidConn) {
		return fmt.Errorf("%w (%s)", err, *cause)
	}
	return err
}

// notReadyKind is the kind of reason a store is not ready; each change of
// kind is logged once.
type notReadyKind int

const (
	notTried      notReadyKind = iota // no attempt has finished
	unreachable                       // no answer from the server
	noDatabase                        // ER_BAD_DB_ERROR
	refused                           // the server answered with another error
	schemaFailing                     // connected, but the migrations failed
)

// notReadyError says why a store is not ready. Its text is msg alone; it
// wraps bridge.ErrStoreUnavailable, ErrDatabaseMissing for noDatabase, and
// its cause.
type notReadyError struct {
	kind  notReadyKind
	msg   string
	cause error
}

func (e *notReadyError) Error() string { return e.msg }

func (e *notReadyError) Unwrap() []error {
	errs := []error{bridge.ErrStoreUnavailable}
	if e.kind == noDatabase {
		errs = append(errs, ErrDatabaseMissing)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// driverLogger passes the driver's messages, such as the cause of an
// "invalid connection", to slog. Until its store is ready they are at debug
// level (the store logs its state changes) and the last one is kept, so
// that the store can say what "invalid connection" stood for.
type driverLogger struct {
	log    *slog.Logger
	status *atomic.Pointer[notReadyError] // the store's; nil: always ready
	last   atomic.Pointer[string]
}

// newDriverLogger returns a driverLogger to log (nil: discarded) that
// logs as for a ready store until a store gives it its status.
func newDriverLogger(log *slog.Logger) *driverLogger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &driverLogger{log: log}
}

// Print logs v as one line: a warning once the store is ready, else at
// debug level.
func (l *driverLogger) Print(v ...any) {
	msg := strings.TrimSpace(fmt.Sprint(v...))
	if l.status != nil && l.status.Load() != nil {
		l.last.Store(&msg)
		l.log.Debug("mysql driver: " + msg)
		return
	}
	l.log.Warn("mysql driver: " + msg)
}

// MigrateReport says what MigrateDatabase did.
type MigrateReport struct {
	// Database is the DSN's database.
	Database string
	// CreatedDatabase is true if the database did not exist and
	// MigrateDatabase created it.
	CreatedDatabase bool
	// Applied names the migrations applied, in order; empty if the schema
	// was up to date.
	Applied []string
}

// String says what was done, e.g. "created database sluice; applied
// migrations 001_components_denials.sql", or "schema is up to date".
func (r MigrateReport) String() string {
	s := "schema is up to date"
	if len(r.Applied) > 0 {
		s = "applied migrations " + strings.Join(r.Applied, ", ")
	}
	if r.CreatedDatabase {
		s = "created database " + r.Database + "; " + s
	}
	return s
}

// MigrateDatabase brings the database of dsn up to date: if the server says it
// does not exist, it connects without selecting a database and creates it
// (CREATE DATABASE IF NOT EXISTS, utf8mb4 with the binary collation), then
// runs the migrations (migrate). It says what it did; a database that
// exists is not touched but by them, so no privilege to create databases
// is needed then. Errors wrap ErrInvalidDSN for a DSN that does not parse or names no
// database. cfg.Logger (nil: discarded) receives the driver's warnings.
func MigrateDatabase(ctx context.Context, dsn string, cfg Config) (MigrateReport, error) {
	mc, err := parseMySQLDSN(dsn)
	if err != nil {
		return MigrateReport{}, fmt.Errorf("global: migrate: %w", err)
	}
	rep := MigrateReport{Database: mc.DBName}
	drv := newDriverLogger(cfg.Logger)
	db, err := openPool(mc, 2, drv)
	if err != nil {
		return rep, fmt.Errorf("global: migrate: %w: %w", ErrInvalidDSN, err)
	}
	defer db.Close()
	err = db.PingContext(ctx)
	if me := (*gomysql.MySQLError)(nil); errors.As(err, &me) && me.Number == mysqlErrBadDB {
		if rep.CreatedDatabase, err = createDatabase(ctx, mc, drv); err != nil {
			return rep, fmt.Errorf("global: migrate: %w", err)
		}
		err = db.PingContext(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("global: migrate: reach %s: %w", mc.Addr, err)
	}
	if rep.Applied, err = migrate(ctx, db); err != nil {
		return rep, err
	}
	return rep, nil
}

// createDatabase creates the database of mc unless it exists, on a
// connection that selects none, and reports whether it created it.
func createDatabase(ctx context.Context, mc *gomysql.Config, drv *driverLogger) (bool, error) {
	server := mc.Clone()
	server.DBName = ""
	db, err := openPool(server, 1, drv)
	if err != nil {
		return false, err
	}
	defer db.Close()
	name := "`" + strings.ReplaceAll(mc.DBName, "`", "``") + "`"
	res, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
	if err != nil {
		return false, fmt.Errorf("create database %s at %s: %w", mc.DBName, mc.Addr, err)
	}
	// 1 row when created, 0 (and a warning) when it already existed.
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("create database %s at %s: rows affected: %w", mc.DBName, mc.Addr, err)
	}
	return n > 0, nil
}
