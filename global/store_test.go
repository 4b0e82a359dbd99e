package global_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/window"
)

// now is the instant the store tests load and expire against.
const now = int64(1_700_000_000_000)

// cellOf returns a cell of the usual workspace and namespace.
func cellOf(id string, seq int64) window.Cell {
	return window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 60_000, Sequence: seq}
}

func comp(c window.Cell, region string, count, expireAt int64) global.Component {
	return global.Component{Cell: c, Region: region, Count: count, ExpireAt: expireAt}
}

func denial(c window.Cell, region string, limit, expireAt int64) global.Denial {
	return global.Denial{Cell: c, Region: region, Usage: limit, ExpireAt: expireAt}
}

func compareCells(a, b window.Cell) int {
	return cmp.Or(
		cmp.Compare(a.Workspace, b.Workspace),
		cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Identifier, b.Identifier),
		cmp.Compare(a.Duration, b.Duration),
		cmp.Compare(a.Sequence, b.Sequence),
	)
}

func sortedComponents(cs []global.Component) []global.Component {
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b global.Component) int {
		return cmp.Or(compareCells(a.Cell, b.Cell), cmp.Compare(a.Region, b.Region))
	})
	return cs
}

func sortedDenials(ds []global.Denial) []global.Denial {
	ds = slices.Clone(ds)
	slices.SortFunc(ds, func(a, b global.Denial) int {
		return cmp.Or(compareCells(a.Cell, b.Cell), cmp.Compare(a.Region, b.Region))
	})
	return ds
}

func upsertComponents(t *testing.T, s global.Store, cs ...global.Component) {
	t.Helper()
	if err := s.UpsertComponents(t.Context(), cs); err != nil {
		t.Fatalf("UpsertComponents: %v", err)
	}
}

func upsertDenials(t *testing.T, s global.Store, ds ...global.Denial) {
	t.Helper()
	if err := s.UpsertDenials(t.Context(), ds); err != nil {
		t.Fatalf("UpsertDenials: %v", err)
	}
}

// load returns the components live at now.
func load(t *testing.T, s global.Store) []global.Component {
	t.Helper()
	got, err := s.LoadComponents(t.Context(), now)
	if err != nil {
		t.Fatalf("LoadComponents: %v", err)
	}
	return sortedComponents(got)
}

// loadDenials returns the denials live at now.
func loadDenials(t *testing.T, s global.Store) []global.Denial {
	t.Helper()
	got, err := s.LoadDenials(t.Context(), now)
	if err != nil {
		t.Fatalf("LoadDenials: %v", err)
	}
	return sortedDenials(got)
}

// wantComponents fails unless the components live at at are exactly want.
func wantComponents(t *testing.T, s global.Store, at int64, want ...global.Component) {
	t.Helper()
	got, err := s.LoadComponents(t.Context(), at)
	if err != nil {
		t.Fatalf("LoadComponents: %v", err)
	}
	got, want = sortedComponents(got), sortedComponents(want)
	if !slices.Equal(got, want) {
		t.Fatalf("LoadComponents(%d):\n got %d: %s\nwant %d: %s", at, len(got), brief(got), len(want), brief(want))
	}
}

// wantDenials fails unless the denials live at at are exactly want.
func wantDenials(t *testing.T, s global.Store, at int64, want ...global.Denial) {
	t.Helper()
	got, err := s.LoadDenials(t.Context(), at)
	if err != nil {
		t.Fatalf("LoadDenials: %v", err)
	}
	got, want = sortedDenials(got), sortedDenials(want)
	if !slices.Equal(got, want) {
		t.Fatalf("LoadDenials(%d):\n got %d: %s\nwant %d: %s", at, len(got), brief(got), len(want), brief(want))
	}
}

// brief formats at most a few elements of xs.
func brief[T any](xs []T) string {
	if len(xs) > 4 {
		return fmt.Sprintf("%+v ...", xs[:4])
	}
	return fmt.Sprintf("%+v", xs)
}

// A storeKind is one implementation of Store. Its setup runs once per
// kind and returns a function that opens a store on which nothing has been
// written yet.
type storeKind struct {
	name  string
	setup func(t *testing.T) func(t *testing.T) global.Store
}

var storeKinds = []storeKind{
	{"memory", func(*testing.T) func(t *testing.T) global.Store {
		return func(t *testing.T) global.Store {
			s := global.NewMemoryStore()
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	}},
	{"mysql", mysqlKind(global.MySQLConfig{})},
	{"mysql-chunk-64", mysqlKind(global.MySQLConfig{ChunkSize: 64})},
}

// mysqlKind opens MySQL stores configured by cfg, all on one database of
// the kind's own, emptied for each store: creating and dropping a database
// is DDL, far slower than DELETE on a busy server.
func mysqlKind(cfg global.MySQLConfig) func(t *testing.T) func(t *testing.T) global.Store {
	return func(t *testing.T) func(t *testing.T) global.Store {
		dsn := mysqltest.Database(t)
		return func(t *testing.T) global.Store {
			m := openMySQLOn(t, dsn, cfg)
			for _, table := range []string{"sluice_components", "sluice_denials"} {
				if _, err := m.DB().ExecContext(t.Context(), "DELETE FROM "+table); err != nil {
					t.Fatalf("empty %s: %v", table, err)
				}
			}
			return m
		}
	}
}

// openMySQL opens a MySQL store on a database of the test's own.
func openMySQL(t *testing.T, cfg global.MySQLConfig) *global.MySQL {
	t.Helper()
	return openMySQLOn(t, mysqltest.Database(t), cfg)
}

// openMySQLOn opens a MySQL store on dsn, closed at t.Cleanup.
func openMySQLOn(t *testing.T, dsn string, cfg global.MySQLConfig) *global.MySQL {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	m, err := global.OpenMySQL(t.Context(), dsn, cfg)
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

// storeContract is what every Store guarantees; each test gets a fresh,
// empty store.
var storeContract = []struct {
	name string
	run  func(t *testing.T, s global.Store)
}{
	{"UpsertKeepsTheMaxCountAndExpiry", func(t *testing.T, s global.Store) {
		c := cellOf("user-1", 7)
		steps := []struct {
			count, expireAt         int64
			wantCount, wantExpireAt int64
		}{
			{5, now + 1000, 5, now + 1000},
			{3, now + 2000, 5, now + 2000}, // a lower count keeps the count
			{7, now + 500, 7, now + 2000},  // an earlier expiry keeps the expiry
			{1, now + 1, 7, now + 2000},    // lower both: nothing changes
			{7, now + 2000, 7, now + 2000}, // equal: nothing changes
			{8, now + 3000, 8, now + 3000},
		}
		for i, st := range steps {
			upsertComponents(t, s, comp(c, "eu", st.count, st.expireAt))
			if got := load(t, s); !slices.Equal(got, []global.Component{comp(c, "eu", st.wantCount, st.wantExpireAt)}) {
				t.Fatalf("step %d: after count %d expiry %d, got %+v, want count %d expiry %d",
					i, st.count, st.expireAt, got, st.wantCount, st.wantExpireAt)
			}
		}
	}},
	{"DuplicatesInOneCallMergeByMax", func(t *testing.T, s global.Store) {
		c := cellOf("user-1", 7)
		upsertComponents(t, s,
			comp(c, "eu", 3, now+10),
			comp(c, "eu", 9, now+5),
			comp(c, "us", 1, now+5),
			comp(c, "eu", 4, now+20),
		)
		wantComponents(t, s, now, comp(c, "eu", 9, now+20), comp(c, "us", 1, now+5))
		upsertDenials(t, s, denial(c, "eu", 10, now+5), denial(c, "eu", 4, now+50))
		wantDenials(t, s, now, denial(c, "eu", 10, now+50))
	}},
	{"RegionsOfOneCellAreKeptApart", func(t *testing.T, s global.Store) {
		c := cellOf("user-1", 7)
		cs := []global.Component{
			comp(c, "eu-west", 1, now+100),
			comp(c, "us_east", 2, now+200),
			comp(c, "ap", 3, now+300),
			comp(c, "AP", 4, now+400), // regions are case-sensitive
		}
		upsertComponents(t, s, cs...)
		upsertComponents(t, s, comp(c, "us_east", 20, now+200))
		cs[1].Count = 20
		wantComponents(t, s, now, cs...)
	}},
	{"KeysDifferingInAnyColumnAreKeptApart", func(t *testing.T, s global.Store) {
		base := cellOf("id", 7)
		vary := []func(*window.Cell){
			func(*window.Cell) {},
			func(c *window.Cell) { c.Workspace = "WS" },
			func(c *window.Cell) { c.Workspace = "ws-2" },
			func(c *window.Cell) { c.Namespace = "NS" },
			func(c *window.Cell) { c.Namespace = "ns_2" },
			func(c *window.Cell) { c.Identifier = "ID" },
			func(c *window.Cell) { c.Identifier = "id " }, // no trailing-space padding
			func(c *window.Cell) { c.Identifier = "id\x00" },
			func(c *window.Cell) { c.Duration = 1000 },
			func(c *window.Cell) { c.Duration = 2_592_000_000 },
			func(c *window.Cell) { c.Sequence = 8 },
			func(c *window.Cell) { c.Sequence = 0 },
		}
		var cs []global.Component
		var ds []global.Denial
		for i, f := range vary {
			c := base
			f(&c)
			cs = append(cs, comp(c, "eu", int64(i+1), now+int64(i+1)))
			ds = append(ds, denial(c, "eu", int64(100+i), now+int64(i+1)))
		}
		upsertComponents(t, s, cs...)
		upsertDenials(t, s, ds...)
		wantComponents(t, s, now, cs...)
		wantDenials(t, s, now, ds...)
	}},
	{"IdentifiersRoundTripByteForByte", func(t *testing.T, s global.Store) {
		ids := []string{
			"\x00",
			"\xff",
			"\x00\xff\x00",
			"a\x00b",
			strings.Repeat("\xff", 512),
			strings.Repeat("x", 511) + "\x00",
			"{user}",
			"{",
			"}",
			"'; DROP TABLE sluice_components; --",
			"\\N",
			"é",
			"\xc3", // half of é: not valid UTF-8
			"\xf0\x9f\x98\x80",
			"trailing ",
			"trailing",
			"Trailing",
		}
		var cs []global.Component
		var ds []global.Denial
		for i, id := range ids {
			cs = append(cs, comp(cellOf(id, 1), "eu", int64(i+1), now+1000))
			ds = append(ds, denial(cellOf(id, 1), "us", int64(i+1), now+1000))
		}
		upsertComponents(t, s, cs...)
		upsertDenials(t, s, ds...)
		wantComponents(t, s, now, cs...)
		wantDenials(t, s, now, ds...)
		// Upserting again finds the same rows rather than adding some.
		for i := range cs {
			cs[i].Count += 100
		}
		upsertComponents(t, s, cs...)
		wantComponents(t, s, now, cs...)
	}},
	{"LoadsSkipExpiredRows", func(t *testing.T, s global.Store) {
		past := comp(cellOf("past", 1), "eu", 1, now-1)
		edge := comp(cellOf("edge", 1), "eu", 2, now) // ExpireAt == now: expired
		live := comp(cellOf("live", 1), "eu", 3, now+1)
		upsertComponents(t, s, past, edge, live)
		upsertDenials(t, s,
			denial(past.Cell, "eu", 1, now-1),
			denial(edge.Cell, "eu", 2, now),
			denial(live.Cell, "eu", 3, now+1))
		wantComponents(t, s, now, live)
		wantDenials(t, s, now, denial(live.Cell, "eu", 3, now+1))
		wantComponents(t, s, now-2, past, edge, live)
	}},
	{"DeleteExpiredRemovesOnlyExpiredRows", func(t *testing.T, s global.Store) {
		var expiredC, liveC []global.Component
		var expiredD, liveD []global.Denial
		for i := range 23 {
			expiredC = append(expiredC, comp(cellOf(fmt.Sprint("old-", i), 1), "eu", 1, now-int64(i))) // i == 0: exactly now
		}
		for i := range 5 {
			liveC = append(liveC, comp(cellOf(fmt.Sprint("new-", i), 1), "eu", 1, now+1+int64(i)))
		}
		for i := range 9 {
			expiredD = append(expiredD, denial(cellOf(fmt.Sprint("old-", i), 1), "eu", 1, now-int64(i)))
		}
		for i := range 2 {
			liveD = append(liveD, denial(cellOf(fmt.Sprint("new-", i), 1), "eu", 1, now+1+int64(i)))
		}
		upsertComponents(t, s, append(slices.Clone(expiredC), liveC...)...)
		upsertDenials(t, s, append(slices.Clone(expiredD), liveD...)...)

		n, err := s.DeleteExpired(t.Context(), now, 4)
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		if want := int64(len(expiredC) + len(expiredD)); n != want {
			t.Fatalf("DeleteExpired deleted %d rows, want %d", n, want)
		}
		// Loading as of long ago would show any expired row still there.
		wantComponents(t, s, 0, liveC...)
		wantDenials(t, s, 0, liveD...)

		n, err = s.DeleteExpired(t.Context(), now, 4)
		if err != nil || n != 0 {
			t.Fatalf("DeleteExpired again = %d, %v; want 0, nil", n, err)
		}
	}},
	{"ChunkedUpsertOf1200ComponentsWorks", func(t *testing.T, s global.Store) {
		cs := make([]global.Component, 1200)
		for i := range cs {
			cs[i] = comp(cellOf(fmt.Sprintf("id-%04d", i), int64(i%3)), []string{"eu", "us"}[i%2], int64(i), now+int64(i)+1)
		}
		rand.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		upsertComponents(t, s, cs...)
		wantComponents(t, s, now, cs...)
		for i := range cs {
			if i%2 == 0 {
				cs[i].Count += 1000
			}
		}
		upsertComponents(t, s, cs...)
		wantComponents(t, s, now, cs...)
	}},
	{"DenialsKeepTheLargerLimitAndExpiry", func(t *testing.T, s global.Store) {
		c := cellOf("user-1", 7)
		steps := []struct {
			limit, expireAt         int64
			wantLimit, wantExpireAt int64
		}{
			{10, now + 100, 10, now + 100},
			{5, now + 200, 10, now + 200},
			{20, now + 50, 20, now + 200},
			{1, now + 1, 20, now + 200},
		}
		for i, st := range steps {
			upsertDenials(t, s, denial(c, "eu", st.limit, st.expireAt))
			if got := loadDenials(t, s); !slices.Equal(got, []global.Denial{denial(c, "eu", st.wantLimit, st.wantExpireAt)}) {
				t.Fatalf("step %d: after limit %d expiry %d, got %+v, want limit %d expiry %d",
					i, st.limit, st.expireAt, got, st.wantLimit, st.wantExpireAt)
			}
		}
		// Another denying region of the same cell is another denial.
		upsertDenials(t, s, denial(c, "us", 3, now+100))
		wantDenials(t, s, now, denial(c, "eu", 20, now+200), denial(c, "us", 3, now+100))
	}},
	{"ConcurrentOverlappingUpsertsNeverFail", func(t *testing.T, s global.Store) {
		const rounds, ids = 20, 300
		want := make(map[string]global.Component)
		for round := range rounds {
			sets := make([][]global.Component, 2)
			for g := range sets {
				// Goroutine 0 writes ids [0, 200), goroutine 1 [100, 300),
				// in an order of their own, each new rows and old ones.
				for i := g * ids / 3; i < g*ids/3+2*ids/3; i++ {
					c := comp(cellOf(fmt.Sprint("id-", i), int64(round/5)), "eu", int64(round*10+g+i%7), now+int64(round)+1)
					sets[g] = append(sets[g], c)
					k := fmt.Sprintf("%q/%d", c.Cell.Identifier, c.Cell.Sequence)
					old := want[k]
					want[k] = comp(c.Cell, "eu", max(old.Count, c.Count), max(old.ExpireAt, c.ExpireAt))
				}
				rand.Shuffle(len(sets[g]), func(i, j int) { sets[g][i], sets[g][j] = sets[g][j], sets[g][i] })
			}
			var wg sync.WaitGroup
			errs := make([]error, len(sets))
			start := make(chan struct{})
			for g, set := range sets {
				wg.Go(func() {
					<-start
					errs[g] = s.UpsertComponents(t.Context(), set)
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		wantComponents(t, s, now, slices.Collect(maps.Values(want))...)
	}},
	{"InvalidRowsAreRejectedWholesale", func(t *testing.T, s global.Store) {
		ok := comp(cellOf("ok", 1), "eu", 1, now+1)
		tooLong := strings.Repeat("w", 65)
		invalid := []struct {
			name string
			edit func(*global.Component)
		}{
			{"empty workspace", func(c *global.Component) { c.Cell.Workspace = "" }},
			{"long workspace", func(c *global.Component) { c.Cell.Workspace = tooLong }},
			{"workspace with a dot", func(c *global.Component) { c.Cell.Workspace = "a.b" }},
			{"non-ASCII namespace", func(c *global.Component) { c.Cell.Namespace = "é" }},
			{"empty identifier", func(c *global.Component) { c.Cell.Identifier = "" }},
			{"identifier of 513 bytes", func(c *global.Component) { c.Cell.Identifier = strings.Repeat("i", 513) }},
			{"zero duration", func(c *global.Component) { c.Cell.Duration = 0 }},
			{"empty region", func(c *global.Component) { c.Region = "" }},
			{"region with a space", func(c *global.Component) { c.Region = "eu west" }},
			{"negative count", func(c *global.Component) { c.Count = -1 }},
		}
		for _, tc := range invalid {
			bad := ok
			tc.edit(&bad)
			if err := s.UpsertComponents(t.Context(), []global.Component{ok, bad}); err == nil {
				t.Errorf("%s: UpsertComponents succeeded", tc.name)
			}
			if tc.name == "negative count" {
				continue
			}
			d := denial(bad.Cell, bad.Region, 1, now+1)
			if err := s.UpsertDenials(t.Context(), []global.Denial{denial(ok.Cell, "eu", 1, now+1), d}); err == nil {
				t.Errorf("%s: UpsertDenials succeeded", tc.name)
			}
		}
		if err := s.UpsertDenials(t.Context(), []global.Denial{denial(ok.Cell, "eu", -1, now+1)}); err == nil {
			t.Errorf("negative limit: UpsertDenials succeeded")
		}
		wantComponents(t, s, 0)
		wantDenials(t, s, 0)
	}},
	{"EmptyWritesSucceed", func(t *testing.T, s global.Store) {
		upsertComponents(t, s)
		upsertDenials(t, s)
		wantComponents(t, s, 0)
		wantDenials(t, s, 0)
	}},
	{"DeleteExpiredRejectsANonPositiveBatch", func(t *testing.T, s global.Store) {
		upsertComponents(t, s, comp(cellOf("old", 1), "eu", 1, now-1))
		for _, batch := range []int{0, -1} {
			if _, err := s.DeleteExpired(t.Context(), now, batch); err == nil {
				t.Errorf("DeleteExpired(batch %d) succeeded", batch)
			}
		}
		wantComponents(t, s, 0, comp(cellOf("old", 1), "eu", 1, now-1))
	}},
	{"CallsAfterCloseFail", func(t *testing.T, s global.Store) {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		ctx := t.Context()
		if err := s.UpsertComponents(ctx, []global.Component{comp(cellOf("a", 1), "eu", 1, now+1)}); err == nil {
			t.Error("UpsertComponents after Close succeeded")
		}
		if _, err := s.LoadComponents(ctx, now); err == nil {
			t.Error("LoadComponents after Close succeeded")
		}
		if _, err := s.DeleteExpired(ctx, now, 10); err == nil {
			t.Error("DeleteExpired after Close succeeded")
		}
	}},
}

func TestStoreContract(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			open := kind.setup(t)
			for _, tc := range storeContract {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
			}
		})
	}
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
	m := openMySQL(t, global.MySQLConfig{})
	before := migrations(t, m.DB())
	if len(before) == 0 || !strings.HasPrefix(before[0], "1 001_") {
		t.Fatalf("after OpenMySQL, migrations = %q, want version 1 first", before)
	}
	for range 2 {
		if err := global.Migrate(t.Context(), m.DB()); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}
	if after := migrations(t, m.DB()); !slices.Equal(after, before) {
		t.Fatalf("Migrate again changed the migrations:\n got %q\nwant %q", after, before)
	}
	// The store still works, and the lock was released.
	upsertComponents(t, m, comp(cellOf("a", 1), "eu", 1, now+1))
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
			errs[i] = global.Migrate(t.Context(), db)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	got := migrations(t, openDB(t, dsn))
	if len(got) != 2 || !strings.HasPrefix(got[0], "1 001_") || !strings.HasPrefix(got[1], "2 002_") {
		t.Fatalf("migrations = %q, want versions 1 and 2 recorded once each", got)
	}
}

func TestMigrateWithoutADatabaseFails(t *testing.T) {
	db := openDB(t, mysqltest.DSN(t))
	if err := global.Migrate(t.Context(), db); err == nil || !strings.Contains(err.Error(), "no database") {
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
	server, err := mysql.ParseDSN(mysqltest.DSN(t))
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
			m, err := global.OpenMySQL(ctx, tc.dsn, global.MySQLConfig{})
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
	m := openMySQL(t, global.MySQLConfig{Breaker: global.MySQLBreaker{Failures: 1}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 3 {
		err := m.UpsertComponents(ctx, []global.Component{comp(cellOf("a", 1), "eu", 1, now+1)})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("UpsertComponents with a canceled context = %v, want context.Canceled", err)
		}
	}
	if st := m.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %s after canceled writes, want closed", st)
	}
	upsertComponents(t, m, comp(cellOf("a", 1), "eu", 1, now+1))
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
	var m *global.MySQL
	eventually(t, 10*time.Second, "OpenMySQL through the proxy", func() (err error) {
		m, err = global.OpenMySQL(t.Context(), dsn, global.MySQLConfig{
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
			Breaker: global.MySQLBreaker{
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
	c := cellOf("a", 1)
	write := func(count int64) error {
		return m.UpsertComponents(ctx, []global.Component{comp(c, "eu", count, now+1)})
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
		if err == nil || errors.Is(err, global.ErrStoreOpen) {
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
		{"UpsertDenials", func() error { return m.UpsertDenials(ctx, []global.Denial{denial(c, "eu", 9, now+1)}) }},
		{"DeleteExpired", func() error { _, err := m.DeleteExpired(ctx, now, 100); return err }},
	}
	for _, r := range refused {
		start := time.Now()
		err := r.call()
		// Far below the timeout: the server was not asked.
		if took := time.Since(start); !errors.Is(err, global.ErrStoreOpen) || took > timeout/2 {
			t.Fatalf("%s with the breaker open = %v after %s, want ErrStoreOpen at once", r.name, err, took)
		}
	}
	// Loads bypass the breaker: they try, and time out.
	if _, err := m.LoadComponents(ctx, now); err == nil || errors.Is(err, global.ErrStoreOpen) {
		t.Fatalf("LoadComponents through the black hole = %v, want a failure of its own", err)
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
		got, err := m.LoadComponents(ctx, now)
		if err == nil && !slices.Equal(got, []global.Component{comp(c, "eu", 10, now+1)}) {
			t.Fatalf("LoadComponents after recovery = %+v, want count 10", got)
		}
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	if len(states) < 3 || states[0] != gobreaker.StateOpen || states[1] != gobreaker.StateHalfOpen || states[len(states)-1] != gobreaker.StateClosed {
		t.Fatalf("breaker states %v, want open, half-open, ..., closed", states)
	}
}
