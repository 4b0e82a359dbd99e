package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// manualClock is a clock tests move by hand.
type manualClock struct{ ms atomic.Int64 }

func newClock(ms int64) *manualClock {
	c := &manualClock{}
	c.ms.Store(ms)
	return c
}

func (c *manualClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *manualClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// t0 is a multiple of every duration the tests use: elapsed 0 at t0.
const t0 = int64(1_700_000_000_000) / 3_600_000 * 3_600_000

func newService(t testing.TB, cfg Config) *Service {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = newClock(t0).Now
	}
	s := New(cfg)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func query(id string, limit, cost int64) Query {
	return Query{Workspace: "ws", Namespace: "ns", Identifier: id, Limit: limit, Duration: 60_000, Cost: cost}
}

func mustCheck(t testing.TB, s *Service, q Query) window.Decision {
	t.Helper()
	d, err := s.Check(context.Background(), q)
	if err != nil {
		t.Fatalf("Check(%+v): %v", q, err)
	}
	return d.Decision
}

func TestCheckAdmitsUpToTheLimitThenDenies(t *testing.T) {
	s := newService(t, Config{})
	for i := range 10 {
		d := mustCheck(t, s, query("alice", 10, 1))
		if !d.Admitted || d.Remaining != int64(9-i) {
			t.Fatalf("check %d = %+v, want admitted with %d remaining", i, d, 9-i)
		}
	}
	d := mustCheck(t, s, query("alice", 10, 1))
	if d.Admitted || d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("11th check = %+v, want denied with a retry-after", d)
	}
	if d := mustCheck(t, s, query("bob", 10, 1)); !d.Admitted {
		t.Fatalf("another identifier was denied: %+v", d)
	}
}

func TestCostZeroLooksWithoutCounting(t *testing.T) {
	s := newService(t, Config{})
	mustCheck(t, s, query("alice", 10, 3))
	for range 5 {
		if d := mustCheck(t, s, query("alice", 10, 0)); !d.Admitted || d.Remaining != 7 {
			t.Fatalf("look = %+v, want admitted with 7 remaining", d)
		}
	}
}

func TestLimitZeroDeniesEveryCost(t *testing.T) {
	s := newService(t, Config{})
	if d := mustCheck(t, s, query("alice", 0, 1)); d.Admitted {
		t.Fatalf("limit 0 admitted cost 1: %+v", d)
	}
	if d := mustCheck(t, s, query("alice", 0, 0)); !d.Admitted || d.Remaining != 0 {
		t.Fatalf("limit 0 look = %+v, want admitted with nothing remaining", d)
	}
}

func TestInvalidQueryCountsNothing(t *testing.T) {
	s := newService(t, Config{})
	bad := []Query{
		{Workspace: "ws", Namespace: "ns", Identifier: "", Limit: 1, Duration: 60_000, Cost: 1},
		{Workspace: "ws", Namespace: "ns", Identifier: "a", Limit: -1, Duration: 60_000, Cost: 1},
		{Workspace: "ws", Namespace: "ns", Identifier: "a", Limit: 1, Duration: 999, Cost: 1},
		{Workspace: "ws", Namespace: "ns", Identifier: "a", Limit: 1, Duration: 60_000, Cost: window.MaxCost + 1},
	}
	for _, q := range bad {
		if _, err := s.Check(context.Background(), q); !errors.Is(err, ErrInvalidQuery) {
			t.Fatalf("Check(%+v) error = %v, want ErrInvalidQuery", q, err)
		}
		if _, _, err := s.TryCheck(q); !errors.Is(err, ErrInvalidQuery) {
			t.Fatalf("TryCheck(%+v) error = %v, want ErrInvalidQuery", q, err)
		}
	}
	if n := s.table.size(); n != 0 {
		t.Fatalf("invalid queries created %d buckets", n)
	}
}

func TestPreviousWindowDecaysAcrossTheBoundary(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now})
	for range 10 {
		mustCheck(t, s, query("alice", 10, 1))
	}
	clk.Advance(60 * time.Second) // next window, previous weighs 1
	if d := mustCheck(t, s, query("alice", 10, 1)); d.Admitted {
		t.Fatalf("admitted at the start of the next window with a full previous window: %+v", d)
	}
	clk.Advance(6 * time.Second) // previous weighs 0.9: 9 + 1 fits
	if d := mustCheck(t, s, query("alice", 10, 1)); !d.Admitted || d.Remaining != 0 {
		t.Fatalf("check at 10%% into the window = %+v, want admitted with 0 remaining", d)
	}
}

func TestConcurrentChecksAdmitExactlyTheLimit(t *testing.T) {
	for _, limit := range []int64{1, 97, 1000} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			s := newService(t, Config{FlushInterval: time.Millisecond})
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					for range 2*int(limit)/64 + 4 {
						d, err := s.Check(context.Background(), query("hot", limit, 1))
						if err != nil {
							t.Error(err)
							return
						}
						if d.Admitted {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != limit {
				t.Fatalf("64 racing clients got %d admitted, want exactly %d", got, limit)
			}
		})
	}
}

func TestBatchIsAllOrNothing(t *testing.T) {
	s := newService(t, Config{})
	mustCheck(t, s, query("b", 5, 4))
	ok, ds, err := s.Batch(context.Background(), []Query{query("a", 10, 2), query("b", 5, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if ok || ds[0].Admitted || ds[1].Admitted {
		t.Fatalf("batch with one check over its limit = %v %+v, want refused", ok, ds)
	}
	if ds[0].RetryAfter != 0 || ds[0].Remaining != 10 || ds[1].RetryAfter == 0 {
		t.Fatalf("refused batch results = %+v: want the fitting check with 10 remaining and no retry, the other with a retry", ds)
	}
	if d := mustCheck(t, s, query("a", 10, 0)); d.Remaining != 10 {
		t.Fatalf("refused batch counted %d on a", 10-d.Remaining)
	}
	ok, ds, err = s.Batch(context.Background(), []Query{query("a", 10, 2), query("b", 5, 1), query("a", 10, 3)})
	if err != nil || !ok {
		t.Fatalf("fitting batch = %v %+v %v", ok, ds, err)
	}
	if d := mustCheck(t, s, query("a", 10, 0)); d.Remaining != 5 {
		t.Fatalf("after admitted batch a has %d remaining, want 5", d.Remaining)
	}
	if _, _, err := s.Batch(context.Background(), []Query{query("a", 10, 1), query("", 10, 1)}); !errors.Is(err, ErrInvalidQuery) {
		t.Fatalf("batch with an invalid query: err = %v", err)
	}
	if d := mustCheck(t, s, query("a", 10, 0)); d.Remaining != 5 {
		t.Fatalf("invalid batch counted %d", 5-d.Remaining)
	}
}

// Concurrent batches over two identifiers, racing single checks on one of
// them, never count a batch partially: every admitted batch counts on both.
func TestConcurrentBatchesNeverCountPartially(t *testing.T) {
	s := newService(t, Config{FlushInterval: time.Millisecond})
	const limitA, limitB = 1_000, 300
	var batches, singles atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for range 100 {
				ok, _, err := s.Batch(context.Background(), []Query{query("a", limitA, 1), query("b", limitB, 1)})
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					batches.Add(1)
				}
			}
		})
		if g%4 == 0 {
			wg.Go(func() {
				for range 100 {
					if d, _ := s.Check(context.Background(), query("b", limitB, 1)); d.Admitted {
						singles.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	usedA := limitA - mustCheck(t, s, query("a", limitA, 0)).Remaining
	usedB := limitB - mustCheck(t, s, query("b", limitB, 0)).Remaining
	if usedA != batches.Load() {
		t.Fatalf("a counted %d but %d batches were admitted", usedA, batches.Load())
	}
	if usedB != batches.Load()+singles.Load() || usedB != limitB {
		t.Fatalf("b counted %d; batches %d + singles %d; limit %d", usedB, batches.Load(), singles.Load(), limitB)
	}
}

func TestJanitorDropsCellsThatCanNoLongerMatter(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now})
	for i := range 1000 {
		mustCheck(t, s, query(fmt.Sprint("id-", i), 10, 1))
	}
	clk.Advance(60 * time.Second)
	mustCheck(t, s, query("id-0", 10, 1))
	if _, buckets := s.sweep(); buckets != 0 {
		t.Fatalf("swept %d buckets while their cells still weigh", buckets)
	}
	clk.Advance(60 * time.Second)
	if _, buckets := s.sweep(); buckets != 999 {
		t.Fatalf("swept %d buckets two windows later, want 999", buckets)
	}
	clk.Advance(60 * time.Second)
	s.sweep()
	if n := s.table.size(); n != 0 {
		t.Fatalf("%d buckets left after every window ended", n)
	}
}

// Stats().Cells is the table's size when it is read: a scrape sees new
// identifiers at once, not at the janitor's next tick.
func TestStatsCellsCountsIdentifiersWhenRead(t *testing.T) {
	clk := newClock(t0)
	// An hourly janitor never ticks during the test: the count must follow
	// the checks themselves.
	s := newService(t, Config{Now: clk.Now, JanitorInterval: time.Hour})
	for i := range 100 {
		mustCheck(t, s, query(fmt.Sprint("id-", i), 10, 1))
		if got := s.Stats().Cells; got != int64(i+1) {
			t.Fatalf("after %d new identifiers Stats().Cells = %d", i+1, got)
		}
	}
	mustCheck(t, s, query("id-0", 10, 1)) // a known identifier adds nothing
	if got := s.Stats().Cells; got != 100 {
		t.Fatalf("Stats().Cells = %d after a check of a known identifier, want 100", got)
	}
	// Three windows later a sweep (the janitor's, run here because its
	// ticker is not on the injected clock) drops every bucket; the count
	// follows at once.
	clk.Advance(3 * 60 * time.Second)
	s.sweep()
	if got := s.Stats().Cells; got != 0 {
		t.Fatalf("Stats().Cells = %d after the sweep dropped every bucket, want 0", got)
	}
}

func TestStrictModeKeepsBucketUntilItsDeadline(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now})
	mustCheck(t, s, query("alice", 0, 1)) // denied: strict until the end of the next window
	q := query("alice", 0, 1)
	b := s.table.load(q.key())
	if got, want := b.strictUntil.Load(), t0+2*60_000; got != want {
		t.Fatalf("strict deadline = %d, want %d (end of the window after the denial)", got, want)
	}
}

func TestLocalOnlyDecidesEverythingWithoutWaiting(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now})
	d, ok, err := s.TryCheck(query("alice", 10, 1))
	if !ok || err != nil || !d.Admitted {
		t.Fatalf("TryCheck on a cold identifier without an origin = %+v %v %v, want decided", d, ok, err)
	}
	clk.Advance(time.Second)
	if d, ok, _ := s.TryCheck(query("alice", 10, 1)); !ok || d.Remaining != 8 {
		t.Fatalf("TryCheck after FreshFor without an origin = %+v %v, want decided from the cells", d, ok)
	}
	if s.settle.head.Load() != nil {
		t.Fatal("a local-only service queued a cell for the origin")
	}
}

func BenchmarkCheckWarm(b *testing.B) {
	month, _, _ := window.ParseCalendar("month@Europe/Berlin")
	for _, c := range []struct {
		name string
		d    int64
	}{{"duration", 60_000}, {"calendar", month}} {
		b.Run(c.name, func(b *testing.B) {
			s := New(Config{})
			defer s.Close(context.Background())
			q := query("user_1234567890abcdef", window.MaxLimit, 1)
			q.Duration = c.d
			ctx := context.Background()
			s.Check(ctx, q)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok, _ := s.TryCheck(q); !ok {
					s.Check(ctx, q)
				}
			}
		})
	}
}

// BenchmarkCheckWarmPolicy is BenchmarkCheckWarm with 10,000 overrides in
// the identifier's namespace (half exact, half prefixes): none matching, an
// exact one and a prefix one. The bucket's cached match keeps them at the
// cost of no override (docs/performance.md's targets: warm check within 100 ns, 0 allocs).
func BenchmarkCheckWarmPolicy(b *testing.B) {
	for _, tc := range []struct{ name, id string }{
		{"none", "other_1234567890abcdef"},
		{"exact", "user_1234567890abcdef"},
		{"prefix", "pre_1234567890abcdef"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(Config{})
			defer s.Close(context.Background())
			tbl := s.Policies()
			now := s.Now().UnixMilli()
			set := func(pattern string, limit int64) {
				if _, err := tbl.Set(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: pattern},
					policy.Override{Limit: limit, Duration: 60_000}, now, "r1"); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 4999 {
				set(fmt.Sprintf("id_%d", i), 10)
				set(fmt.Sprintf("p%d_*", i), 10)
			}
			set("user_1234567890abcdef", window.MaxLimit)
			set("pre_*", window.MaxLimit)
			q := query(tc.id, window.MaxLimit, 1)
			ctx := context.Background()
			s.Check(ctx, q)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok, _ := s.TryCheck(q); !ok {
					s.Check(ctx, q)
				}
			}
		})
	}
}

func BenchmarkCheckWarmParallel(b *testing.B) {
	s := New(Config{})
	defer s.Close(context.Background())
	ctx := context.Background()
	ids := make([]Query, 1024)
	for i := range ids {
		ids[i] = query(fmt.Sprintf("user_%016d", i), window.MaxLimit, 1)
		s.Check(ctx, ids[i])
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			q := ids[r.IntN(len(ids))]
			if _, ok, _ := s.TryCheck(q); !ok {
				s.Check(ctx, q)
			}
		}
	})
}

// A cell fits the 128-byte size class: with its bucket, table entry and key
// that keeps an active cell within the 256-byte budget of docs/performance.md's targets (the
// next size class, 144, costs 16 bytes on every cell).
func TestCellFitsItsSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(cell{}); got > 128 {
		t.Fatalf("cell is %d bytes, want at most 128", got)
	}
	// What a warm decision reads (with or without an origin), and what
	// tells whether a previous cell is fresh, stay in the cell's first
	// cache line.
	var c cell
	for name, end := range map[string]uintptr{
		"seq":        unsafe.Offsetof(c.seq) + 8,
		"count":      unsafe.Offsetof(c.count) + 8,
		"imported":   unsafe.Offsetof(c.imported) + 8,
		"avail":      unsafe.Offsetof(c.avail) + 8,
		"leaseUntil": unsafe.Offsetof(c.leaseUntil) + 8,
		"syncedAt":   unsafe.Offsetof(c.syncedAt) + 8,
	} {
		if end > 64 {
			t.Errorf("cell.%s ends at byte %d, beyond the first cache line", name, end)
		}
	}
}

// The warm check of a limiter with an origin: what a Redis-backed limiter
// runs for a hot identifier far from its limit, spending its lease
// (counting the check in flight included).
func BenchmarkCheckWarmWithOrigin(b *testing.B) {
	s := New(Config{Origin: regiontest.NewMemory(nil), FreshFor: time.Hour, LeaseFor: time.Hour, LeaseAhead: time.Hour})
	defer s.Close(context.Background())
	q := query("user_1234567890abcdef", window.MaxLimit, 1)
	warmLease(b, s, q)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, _ := s.TryCheck(q); !ok {
			s.Check(ctx, q)
		}
	}
}

// nopLocals is a LocalPublisher that drops what it is given: the cost of a
// local count apart from its transport.
type nopLocals struct{}

func (nopLocals) PublishLocal(window.Cell, string, int64, int64) {}

// A check decided while the origin fails (its breaker open): counted in
// the cell's local count and handed to the publisher before the decision
// returns.
func BenchmarkCheckWhileOriginFails(b *testing.B) {
	down := &failingOrigin{Memory: regiontest.NewMemory(nil)}
	down.fail.Store(true)
	s := New(Config{Origin: region.NewBreaker(down, region.BreakerConfig{OpenFor: time.Hour}), Locals: nopLocals{}})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = s.Close(ctx)
	}()
	q := query("user_1234567890abcdef", window.MaxLimit, 1)
	ctx := context.Background()
	for range 10 { // open the breaker
		s.Check(ctx, q)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, _ := s.TryCheck(q); !ok {
			s.Check(ctx, q)
		}
	}
}

// The warm, fresh check allocates nothing: with no origin, and with one.
// (Run without the race detector: `make test` runs the Allocations tests
// apart, as the detector's instrumentation allocates.)
func TestAllocationsWarmCheck(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; make test runs this test without it")
	}
	// A clock that stands in the middle of a window, and a long LeaseAhead:
	// the lease covers the thousand checks measured.
	clk := newClock(t0 + 30_000)
	for name, cfg := range map[string]Config{
		"local":       {},
		"with origin": {Now: clk.Now, Origin: regiontest.NewMemory(clk.Now), FreshFor: time.Hour, LeaseFor: time.Hour, LeaseAhead: time.Hour},
	} {
		s := New(cfg)
		q := query("user_1234567890abcdef", window.MaxLimit, 1)
		warmLease(t, s, q)
		if n := testing.AllocsPerRun(1000, func() {
			if _, ok, _ := s.TryCheck(q); !ok {
				t.Fatal("a warm, fresh check was not decided at once")
			}
		}); n != 0 {
			t.Errorf("%s: a warm check allocates %v times", name, n)
		}
		_ = s.Close(context.Background())
	}
}

// Cold checks on a Redis origin: every check on an identifier nobody
// checked (Envoy's limit per client address), at 16, 64 and 256 in
// flight, each a trip to Redis. trip-syncs is the mean number of syncs a
// round trip to Redis carried.
func BenchmarkCheckColdRedis(b *testing.B) {
	rd, err := region.NewRedis(region.RedisConfig{URL: redistest.SharedURL(b), KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{Origin: region.NewBreaker(rd, region.BreakerConfig{})})
	defer s.Close(context.Background())
	for _, inFlight := range []int{16, 64, 256} {
		b.Run(strconv.Itoa(inFlight), func(b *testing.B) {
			var next atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			t0 := rd.TripStats()
			b.SetParallelism(max(1, inFlight/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					q := Query{Workspace: "acme", Namespace: "rls", Identifier: run + "-" + strconv.FormatInt(next.Add(1), 36),
						Duration: 1000, Limit: 1000, Cost: 1}
					if d, err := s.Check(ctx, q); err != nil || !d.Admitted {
						b.Errorf("cold check: %+v, %v", d, err)
						return
					}
				}
			})
			t1 := rd.TripStats()
			b.ReportMetric(float64(t1.Syncs-t0.Syncs)/float64(max(1, t1.Trips-t0.Trips)), "trip-syncs")
		})
	}
}
