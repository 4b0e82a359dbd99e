package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// Defaults of a MySQL store.
const (
	// DefaultChunkSize is how many rows one upsert statement writes
	// unless Config.ChunkSize says otherwise.
	DefaultChunkSize = 500
	// DefaultChangeLag is Config.ChangeLag's default.
	DefaultChangeLag = time.Second
	// MaxChunkSize is the largest ChunkSize: a statement has at most
	// 65535 placeholders and a row takes 8.
	MaxChunkSize = 65535 / 8

	// mysqlDefaultTimeout is the dial, read and write timeout of the
	// connections whose DSN sets none.
	mysqlDefaultTimeout = 5 * time.Second
	// mysqlDefaultMaxConns bounds the open connections by default.
	mysqlDefaultMaxConns = 8
	// mysqlConnMaxLifetime and mysqlConnMaxIdleTime recycle connections so
	// that none outlives a server-side wait_timeout or a failover.
	mysqlConnMaxLifetime = 5 * time.Minute
	mysqlConnMaxIdleTime = time.Minute
	// mysqlDeadlockTries is how often a statement that lost a deadlock is
	// run in all. Upserts of sorted chunks can still deadlock on InnoDB's
	// gap locks when they insert new rows; each statement is its own
	// transaction and idempotent, so running it again is safe.
	mysqlDeadlockTries = 5
	// mysqlErrDeadlock is ER_LOCK_DEADLOCK.
	mysqlErrDeadlock = 1213

	// migrateLock is the named lock that serializes migrate across
	// processes; migrateLockWait bounds how long migrate waits for it.
	migrateLock     = "sluice_migrate"
	migrateLockWait = 30 * time.Second
	// migrateLockPoll is how often a held lock is asked for again.
	migrateLockPoll = 50 * time.Millisecond
	// migrateReleaseTimeout bounds RELEASE_LOCK, which runs even when the
	// caller's context has ended.
	migrateReleaseTimeout = 5 * time.Second
)

// migrationFiles are the schema migrations: migrations/NNN_name.sql, each
// one version, applied in the order of NNN.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// Config configures a MySQL store; zero fields take the defaults.
type Config struct {
	// ChunkSize is the most rows one upsert statement writes. Default
	// DefaultChunkSize (500); values above MaxChunkSize are
	// lowered to it.
	ChunkSize int
	// MaxConns bounds the connections open to the server. Default 8.
	MaxConns int
	// Breaker configures the circuit breaker of the writes.
	Breaker Breaker
	// Logger receives one line per breaker state change and the
	// driver's own warnings. Nil discards them.
	Logger *slog.Logger
	// RetryMin and RetryMax bound the wait between two attempts of a store
	// opened with OpenLazy to connect: it starts at RetryMin and
	// doubles up to RetryMax. Defaults 1s and 30s.
	RetryMin, RetryMax time.Duration
	// ChangeLag is how far before the server's clock at a LoadChanged
	// the mark it returns lies: a write whose statement began before the
	// read but committed after it carries a changed_us up to its own
	// duration earlier, and the next read still finds it if that duration
	// is under ChangeLag. Each changed row is read about 1 + ChangeLag /
	// (time between reads) times. Default DefaultChangeLag (1s).
	ChangeLag time.Duration
	// CreateDatabaseHint ends the message that says the DSN's database does
	// not exist, telling the operator how to create it, e.g. `run "bridge
	// migrate --mysql-dsn ..." to create it`. It must hold no password
	// (the commands pass the DSN through internal/redact). Default: a
	// generic instruction.
	CreateDatabaseHint string
}

// Breaker configures the circuit breaker in front of a MySQL store's
// writes; zero fields take the defaults.
type Breaker struct {
	// Failures is how many consecutive failed writes open the breaker.
	// Default 5.
	Failures uint32
	// OpenFor is how long the breaker stays open before letting one write
	// through to probe the server. Default 2s.
	OpenFor time.Duration
	// OnStateChange, if set, is called after each state change, with the
	// breaker locked: it must not call the store.
	OnStateChange func(from, to gobreaker.State)
}

// Store is the bridge.Store on MySQL or MariaDB. Safe for concurrent use.
//
// Writes go through a circuit breaker: after Breaker.Failures consecutive
// failed writes they are refused at once with an error wrapping
// bridge.ErrStoreOpen for Breaker.OpenFor, then one write probes the server and a
// success closes the breaker. A write whose caller's context was canceled
// counts neither way; a timeout is a failure. Loads bypass the breaker.
// Reconnect closes it early, once the server answers on a fresh connection.
//
// A store from OpenLazy is usable only once it has connected and
// brought its schema up to date; see OpenLazy and Ready.
type Store struct {
	db       *sql.DB
	maxConns int // Config.MaxConns: the pool's open and idle bound
	chunk    int
	lagUs    int64 // Config.ChangeLag in microseconds
	breaker  Breaker
	cb       atomic.Pointer[gobreaker.TwoStepCircuitBreaker[struct{}]] // replaced by Reconnect
	log      *slog.Logger
	drv      *driverLogger

	addr, database, hint string

	// status says why the store is not ready; nil once it has connected
	// and migrated: every call may go on.
	status    atomic.Pointer[notReadyError]
	tried     chan struct{} // closed once the first attempt to connect ended
	triedOnce sync.Once
	connSem   chan struct{}      // held by an attempt to connect (connect)
	cancel    context.CancelFunc // stops the connect loop; nil if none
	loop      sync.WaitGroup     // the connect loop
	closeOnce sync.Once
}

var (
	_ bridge.Store       = (*Store)(nil)
	_ bridge.Reconnecter = (*Store)(nil)
)

// withDefaults returns cfg with its zero fields set to the defaults.
func (cfg Breaker) withDefaults() Breaker {
	cfg.Failures = orDefault(cfg.Failures, 5)
	cfg.OpenFor = orDefault(cfg.OpenFor, 2*time.Second)
	return cfg
}

// orDefault returns v, or def if v is not positive: the value of a
// setting whose zero (or negative) value means its default.
func orDefault[T int | uint32 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// breakerName names the write breaker in the log.
const breakerName = "global-store"

// newStoreBreaker returns a closed write breaker as cfg (with its
// defaults) describes.
func newStoreBreaker(cfg Breaker, log *slog.Logger) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        breakerName,
		MaxRequests: 1,
		Timeout:     cfg.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= cfg.Failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			breakerChanged(cfg, log, from, to)
		},
	})
}

// breakerChanged logs a change of the write breaker's state and passes it
// to cfg.OnStateChange.
func breakerChanged(cfg Breaker, log *slog.Logger, from, to gobreaker.State) {
	switch to {
	case gobreaker.StateOpen:
		log.Warn("global store failing: breaker open, writes refused", "breaker", breakerName, "from", from.String(), "open_for", cfg.OpenFor)
	case gobreaker.StateHalfOpen:
		log.Info("global store breaker half-open: probing", "breaker", breakerName)
	case gobreaker.StateClosed:
		log.Info("global store back: breaker closed", "breaker", breakerName, "from", from.String())
	}
	if cfg.OnStateChange != nil {
		cfg.OnStateChange(from, to)
	}
}

// DB returns the store's connection pool, for migrations and inspection.
// Closing it closes the store.
func (m *Store) DB() *sql.DB { return m.db }

// BreakerState returns the state of the write breaker.
func (m *Store) BreakerState() gobreaker.State { return m.cb.Load().State() }

// Close stops trying to connect, if it still was, and closes the
// connection pool; calls made after it fail.
func (m *Store) Close() error {
	m.closeOnce.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		m.loop.Wait()
	})
	if err := m.db.Close(); err != nil {
		return fmt.Errorf("global: mysql: close: %w", err)
	}
	return nil
}

// write runs f through the breaker.
func (m *Store) write(op string, f func() error) error {
	done, err := m.cb.Load().Allow()
	if err != nil {
		return fmt.Errorf("global: mysql: %s: %w: %w", op, bridge.ErrStoreOpen, err)
	}
	err = f()
	done(err)
	if err != nil {
		return fmt.Errorf("global: mysql: %s: %w", op, err)
	}
	return nil
}

// exec runs one autocommitted statement, again if it loses a deadlock.
func (m *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for try := 1; ; try++ {
		res, err := m.db.ExecContext(ctx, query, args...)
		var me *gomysql.MySQLError
		if err == nil || try == mysqlDeadlockTries || !errors.As(err, &me) || me.Number != mysqlErrDeadlock {
			return res, err
		}
		// Back off a few milliseconds, more on each try, with jitter so
		// that the two sides do not collide again.
		wait := time.Duration(try)*5*time.Millisecond + rand.N(5*time.Millisecond)
		m.log.Debug("global store statement lost a deadlock: retrying", "try", try, "wait", wait)
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// The upserts. changed_us is the server's clock in microseconds when a row
// is inserted (the column's default) or raised; an upsert that raises
// nothing leaves it, so a bridge's next LoadChanged does not read the row
// again. MySQL evaluates the assignments left to right, so changed_us is
// compared with the old values before they are raised.
const (
	componentColumns = "workspace, namespace, identifier, duration_ms, `sequence`, epoch_ms, region, `count`, expire_at"
	componentUpdate  = "changed_us = IF(VALUES(`count`) > `count` OR VALUES(expire_at) > expire_at, " + serverMicros + ", changed_us), " +
		"`count` = GREATEST(`count`, VALUES(`count`)), expire_at = GREATEST(expire_at, VALUES(expire_at))"
	// serverMicros is the server's clock at the statement's start, in
	// microseconds since the Unix epoch, independent of time zones.
	serverMicros = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
)

// upsertSQL returns the statement that upserts rows rows into table, one
// placeholder a column of columns.
func upsertSQL(table, columns, update string, rows int) string {
	row := "(?" + strings.Repeat(",?", strings.Count(columns, ",")) + ")"
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + strings.Repeat(row+",", rows-1) + row +
		" ON DUPLICATE KEY UPDATE " + update
}

// A kind is one table of rows the store keeps and how its rows are
// written and read: every kind's upsert and load run the same code, built
// from these fields alone.
type kind[T any] struct {
	// name names the kind in errors and ops: "upsert <name>", "load <name>".
	name string
	// table, columns and update make the upsert (upsertSQL); sel is the
	// columns a load selects, in the order scan reads them.
	table, columns, update, sel string
	// prepare checks, sorts and merges the rows of an upsert.
	prepare func([]T) ([]T, error)
	// args appends the arguments of v, one a column of columns.
	args func(args []any, v *T) []any
	// scan reads the row r is at into v.
	scan func(r *sql.Rows, v *T) error
}

// upsert merges rows into k's table, through the breaker, prepared by
// k.prepare (in primary-key order, rows of the same key merged first), at
// most ChunkSize rows an autocommitted statement. On error, the chunks
// before the failing one are written.
func (k *kind[T]) upsert(ctx context.Context, m *Store, rows []T) error {
	op := "upsert " + k.name
	rows, err := k.prepare(rows)
	if err != nil {
		return fmt.Errorf("global: mysql: %s: %w", op, err)
	}
	if len(rows) == 0 {
		return nil
	}
	if err := m.usable(ctx, op); err != nil {
		return err
	}
	return m.write(op, func() error {
		n := len(rows)
		args := make([]any, 0, min(n, m.chunk)*(strings.Count(k.columns, ",")+1))
		for start := 0; start < n; start += m.chunk {
			end := min(start+m.chunk, n)
			args = args[:0]
			for i := start; i < end; i++ {
				args = k.args(args, &rows[i])
			}
			if _, err := m.exec(ctx, upsertSQL(k.table, k.columns, k.update, end-start), args...); err != nil {
				return fmt.Errorf("rows %d to %d of %d: %w", start, end, n, err)
			}
		}
		return nil
	})
}

// load returns the rows of k's table where where holds (with args) and,
// if changedAfter is positive, whose changed_us is after it, reading past
// the breaker once the store is usable; nil if there are none.
func (k *kind[T]) load(ctx context.Context, m *Store, changedAfter int64, where string, args ...any) (out []T, err error) {
	if err := m.usable(ctx, "load "+k.name); err != nil {
		return nil, err
	}
	if changedAfter > 0 {
		where, args = "changed_us > ? AND "+where, append([]any{changedAfter}, args...)
	}
	defer func() {
		if err != nil {
			out, err = nil, fmt.Errorf("global: mysql: load %s: %w", k.name, err)
		}
	}()
	rows, err := m.db.QueryContext(ctx, "SELECT "+k.sel+" FROM "+k.table+" WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var v T
		if err := k.scan(rows, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// componentRows is the kind of sluice_components, whose rows are a cell's
// key, a region, a count and an expiry.
var componentRows = kind[global.Component]{
	name: "components", table: "sluice_components", columns: componentColumns, update: componentUpdate, sel: componentColumns,
	prepare: bridge.PrepareComponents,
	args: func(args []any, c *global.Component) []any {
		return append(args, c.Cell.Workspace, c.Cell.Namespace, []byte(c.Cell.Identifier), c.Cell.Duration,
			c.Cell.Sequence, c.Cell.Epoch, c.Region, c.Count, c.ExpireAt)
	},
	scan: func(r *sql.Rows, c *global.Component) error {
		var id []byte
		if err := r.Scan(&c.Cell.Workspace, &c.Cell.Namespace, &id, &c.Cell.Duration, &c.Cell.Sequence, &c.Cell.Epoch,
			&c.Region, &c.Count, &c.ExpireAt); err != nil {
			return err
		}
		c.Cell.Identifier = string(id)
		return nil
	},
}

// UpsertComponents merges cs into sluice_components, at most ChunkSize rows
// per autocommitted statement, in primary-key order, components of the same
// key merged first. On error, the chunks before the failing one are
// written.
func (m *Store) UpsertComponents(ctx context.Context, cs []global.Component) error {
	return componentRows.upsert(ctx, m, cs)
}

// LoadChanged returns the live rows whose changed_us is after since (every
// live row when since is zero or lies after the server's clock, which then
// went back), reading past the breaker. The mark it returns is the server's
// clock when the read began, less Config.ChangeLag.
func (m *Store) LoadChanged(ctx context.Context, now int64, since bridge.Mark) (bridge.Changes, error) {
	if err := m.usable(ctx, "load changed"); err != nil {
		return bridge.Changes{}, err
	}
	var serverUs int64
	if err := m.db.QueryRowContext(ctx, "SELECT "+serverMicros).Scan(&serverUs); err != nil {
		return bridge.Changes{}, fmt.Errorf("global: mysql: load changed: read the server's clock: %w", err)
	}
	ch := bridge.Changes{Next: bridge.Mark(max(serverUs-m.lagUs, 1))}
	// since is the clock of the previous read less the lag: a clock now
	// before that read went back, and rows raised since may carry
	// changed_us below since.
	ch.Full = since <= 0 || serverUs < int64(since)+m.lagUs
	after := int64(since) // rows changed after it; 0 (every row) for a full read
	if ch.Full {
		after = 0
	}
	// Components and reset marks are live until their expire_at.
	var err error
	if ch.Components, err = componentRows.load(ctx, m, after, "expire_at > ?", now); err != nil {
		return bridge.Changes{}, err
	}
	// Tombstones past their retention are left out, as DeleteExpired
	// deletes them: a full read does not bring back what a bridge pruned.
	if ch.Overrides, err = overrideRows.load(ctx, m, after, "(deleted = 0 OR version_ms >= ?)", policy.TombstoneCutoff(now)); err != nil {
		return bridge.Changes{}, err
	}
	if ch.Marks, err = markRows.load(ctx, m, after, "expire_at > ?", now); err != nil {
		return bridge.Changes{}, err
	}
	return ch, nil
}

// DeleteExpired deletes the components and the reset marks
// with ExpireAt <= now, then the override tombstones older than
// policy.TombstoneCutoff(now), batch rows per autocommitted statement, until a
// statement deletes fewer than batch. It returns how many rows went, with
// ctx's error if ctx ended first; ending so between statements does not
// count against the breaker.
func (m *Store) DeleteExpired(ctx context.Context, now int64, batch int) (int64, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("global: mysql: delete expired: batch %d is not positive", batch)
	}
	if err := m.usable(ctx, "delete expired"); err != nil {
		return 0, err
	}
	var total int64
	var stopped error
	err := m.write("delete expired", func() error {
		tombs := policy.TombstoneCutoff(now)
		for _, d := range []struct {
			table, where string
			before       int64
		}{
			{"sluice_components", "expire_at <= ?", now},
			{"sluice_reset_marks", "expire_at <= ?", now},
			{"sluice_overrides", "deleted = 1 AND version_ms < ?", tombs}, // migration 009's index
		} {
			q := "DELETE FROM " + d.table + " WHERE " + d.where + " LIMIT ?"
			for {
				if err := ctx.Err(); err != nil {
					stopped = err
					return nil
				}
				res, err := m.exec(ctx, q, d.before, batch)
				if err != nil {
					return fmt.Errorf("%s: %w", d.table, err)
				}
				n, err := res.RowsAffected()
				if err != nil {
					return fmt.Errorf("%s: rows affected: %w", d.table, err)
				}
				total += n
				if n < int64(batch) {
					break
				}
			}
		}
		return nil
	})
	if err == nil && stopped != nil {
		err = fmt.Errorf("global: mysql: delete expired: stopped after %d rows: %w", total, stopped)
	}
	return total, err
}

// A migration is one version of the schema.
type migration struct {
	version    int
	name       string
	statements []string
}

// migrations parses the embedded migration files, in version order.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, name := range names {
		base := path.Base(name)
		digits := base[:len(base)-len(strings.TrimLeft(base, "0123456789"))]
		v, err := strconv.Atoi(digits)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: the name does not start with a positive version", base)
		}
		if len(ms) > 0 && ms[len(ms)-1].version >= v {
			return nil, fmt.Errorf("migration %s: version %d is not above the previous one", base, v)
		}
		text, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		m := migration{version: v, name: base, statements: splitStatements(string(text))}
		if len(m.statements) == 0 {
			return nil, fmt.Errorf("migration %s: no statement", base)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// splitStatements drops the lines of text that are "--" comments and
// splits the rest on semicolons. Migrations must not put a semicolon in
// a string or an identifier.
func splitStatements(text string) []string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	var out []string
	for stmt := range strings.SplitSeq(b.String(), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// migrate brings the schema of db's database up to date: it applies, in
// order, each embedded migration whose version is not yet recorded in
// sluice_schema_migrations, and records it. It holds the named lock
// sluice_migrate meanwhile, waiting up to 30s for it, so concurrent calls,
// from any process, apply each migration once and all succeed. Running it
// again is a no-op. Versions recorded that it does not know (a newer
// binary migrated) are left alone. DDL commits implicitly, so a migration
// that fails part-way is not recorded and runs again in full next time:
// its statements must be idempotent. It returns the names of the
// migrations it applied.
func migrate(ctx context.Context, db *sql.DB) ([]string, error) {
	ms, err := migrations()
	if err != nil {
		return nil, fmt.Errorf("global: migrate: %w", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("global: migrate: %w", err)
	}
	defer conn.Close()

	var dbName sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbName); err != nil {
		return nil, fmt.Errorf("global: migrate: %w", err)
	}
	if !dbName.Valid {
		return nil, errors.New("global: migrate: no database selected")
	}

	if err := acquireMigrateLock(ctx, conn); err != nil {
		discardConn(conn)
		return nil, fmt.Errorf("global: migrate %s: %w", dbName.String, err)
	}
	applied, err := applyMigrations(ctx, conn, ms)
	if rerr := releaseMigrateLock(ctx, conn); rerr != nil {
		// The connection may still hold the lock: never return it to the
		// pool, so that closing it releases the lock.
		discardConn(conn)
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return applied, fmt.Errorf("global: migrate %s: %w", dbName.String, err)
	}
	return applied, nil
}

// acquireMigrateLock takes the named lock on conn. It asks without waiting
// on the server, again every 50ms, so that no statement outlasts the
// connection's read timeout and ctx is honoured throughout.
func acquireMigrateLock(ctx context.Context, conn *sql.Conn) error {
	deadline := time.Now().Add(migrateLockWait)
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", migrateLock).Scan(&got); err != nil {
			return fmt.Errorf("get lock %s: %w", migrateLock, err)
		}
		switch {
		case !got.Valid:
			return fmt.Errorf("get lock %s: the server returned NULL", migrateLock)
		case got.Int64 == 1:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("get lock %s: still held by another session after %s", migrateLock, migrateLockWait)
		}
		if !sleep(ctx, migrateLockPoll) {
			return fmt.Errorf("get lock %s: %w", migrateLock, ctx.Err())
		}
	}
}

// releaseMigrateLock releases the named lock, even once ctx has ended.
func releaseMigrateLock(ctx context.Context, conn *sql.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrateReleaseTimeout)
	defer cancel()
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", migrateLock).Scan(&released); err != nil {
		return fmt.Errorf("release lock %s: %w", migrateLock, err)
	}
	if released.Int64 != 1 {
		return fmt.Errorf("release lock %s: not held by this session", migrateLock)
	}
	return nil
}

// discardConn makes conn be closed, not pooled, when it is closed.
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// applyMigrations applies the migrations of ms not yet recorded, on conn,
// which holds the migration lock, and returns the names of those it
// applied.
func applyMigrations(ctx context.Context, conn *sql.Conn, ms []migration) ([]string, error) {
	const create = `CREATE TABLE IF NOT EXISTS sluice_schema_migrations (
  version    INT NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
	if _, err := conn.ExecContext(ctx, create); err != nil {
		return nil, fmt.Errorf("create sluice_schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("read sluice_schema_migrations: %w", err)
	}
	var done []string
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		for i, stmt := range m.statements {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return done, fmt.Errorf("migration %s, statement %d: %w", m.name, i+1, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO sluice_schema_migrations (version, name) VALUES (?, ?)", m.version, m.name); err != nil {
			return done, fmt.Errorf("migration %s: record: %w", m.name, err)
		}
		done = append(done, m.name)
	}
	return done, nil
}

// appliedVersions returns the versions sluice_schema_migrations records.
func appliedVersions(ctx context.Context, conn *sql.Conn) (map[int]bool, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version FROM sluice_schema_migrations")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	applied := make(map[int]bool)
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	return applied, rows.Err()
}
