package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

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

func newService(t *testing.T, cfg Config) *Service {
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

func mustCheck(t *testing.T, s *Service, q Query) window.Decision {
	t.Helper()
	d, err := s.Check(context.Background(), q)
	if err != nil {
		t.Fatalf("Check(%+v): %v", q, err)
	}
	return d
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

func TestCloseReplaysEverythingPending(t *testing.T) {
	clk := newClock(t0)
	origin := region.NewMemory(clk.Now)
	s := New(Config{Now: clk.Now, Origin: origin, FlushInterval: time.Hour})
	var admitted int64
	for i := range 500 {
		if d := mustCheck(t, s, query(fmt.Sprint("id-", i%50), 1_000, int64(1+i%3))); d.Admitted {
			admitted += int64(1 + i%3)
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var total int64
	for i := range 50 {
		c, _, _ := origin.Read(context.Background(), window.Cell{Workspace: "ws", Namespace: "ns",
			Identifier: fmt.Sprint("id-", i), Duration: 60_000, Sequence: t0 / 60_000})
		total += c.Count
	}
	if total != admitted {
		t.Fatalf("origin holds %d after Close, admitted %d", total, admitted)
	}
	if _, err := s.Check(context.Background(), query("x", 1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("check after Close: err = %v, want ErrClosed", err)
	}
}

// Two services sharing one origin behave as one limiter once replay and
// stale refresh have run.
func TestServicesSharingAnOriginConverge(t *testing.T) {
	clk := newClock(t0)
	origin := region.NewMemory(clk.Now)
	a := newService(t, Config{Now: clk.Now, Origin: origin, FlushInterval: time.Hour})
	b := newService(t, Config{Now: clk.Now, Origin: origin, FlushInterval: time.Hour})
	mustCheck(t, b, query("alice", 10, 1)) // b's cell is now fresh
	for range 6 {
		mustCheck(t, a, query("alice", 10, 1))
	}
	if err := a.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, b, query("alice", 10, 0)); d.Remaining != 9 {
		t.Fatalf("b saw %d remaining while its cell was fresh, want its own view 9", d.Remaining)
	}
	clk.Advance(time.Second) // b's cell goes stale and is read again
	if d := mustCheck(t, b, query("alice", 10, 0)); d.Remaining != 3 {
		t.Fatalf("b saw %d remaining after a stale refresh, want 3", d.Remaining)
	}
	if err := b.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if d := mustCheck(t, a, query("alice", 10, 0)); d.Remaining != 3 {
		t.Fatalf("a saw %d remaining after b replayed, want 3", d.Remaining)
	}
}

// After a denial, checks refresh the current cell from origin first, so a
// limiter sees another limiter's replayed use without waiting FreshFor.
func TestDenialRefreshesFromOriginUntilDeadline(t *testing.T) {
	clk := newClock(t0)
	origin := region.NewMemory(clk.Now)
	a := newService(t, Config{Now: clk.Now, Origin: origin, FlushInterval: time.Hour})
	b := newService(t, Config{Now: clk.Now, Origin: origin, FlushInterval: time.Hour})
	mustCheck(t, b, query("alice", 10, 10))
	if d := mustCheck(t, b, query("alice", 10, 1)); d.Admitted {
		t.Fatal("b admitted past its limit")
	}
	if err := b.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// a is cold: it reads origin and sees b's 10.
	if d := mustCheck(t, a, query("alice", 10, 1)); d.Admitted {
		t.Fatalf("a admitted though origin holds the limit: %+v", d)
	}
	// Now b's window moves on. a denies, is strict, and its refresh happens
	// within StrictFreshFor, not FreshFor.
	clk.Advance(60 * time.Second)
	mustCheck(t, b, query("alice", 10, 0))
	clk.Advance(59 * time.Second) // previous weighs 1/60: 10/60 + cur
	mustCheck(t, a, query("alice", 10, 1))
	d1 := mustCheck(t, a, query("alice", 10, 0))
	mustCheck(t, b, query("alice", 10, 5))
	if err := b.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Millisecond) // past StrictFreshFor, well within FreshFor
	d2 := mustCheck(t, a, query("alice", 10, 0))
	if d2.Remaining != d1.Remaining-5 {
		t.Fatalf("strict a saw remaining %d then %d; want b's 5 counted after a strict refresh", d1.Remaining, d2.Remaining)
	}
}

// failingOrigin fails reads while fail is set: a test seam for the service's
// failure handling, not a stand-in for a server.
type failingOrigin struct {
	*region.Memory
	fail      atomic.Bool
	lostReply atomic.Bool // apply, then report failure
	reads     atomic.Int64
	applies   atomic.Int64
}

func (o *failingOrigin) Read(ctx context.Context, c window.Cell) (region.Totals, region.Totals, error) {
	o.reads.Add(1)
	if o.fail.Load() {
		return region.Totals{}, region.Totals{}, errors.New("origin down")
	}
	return o.Memory.Read(ctx, c)
}

func (o *failingOrigin) Apply(ctx context.Context, reporter string, rs []region.Report) ([]int64, error) {
	o.applies.Add(1)
	if o.fail.Load() {
		return nil, errors.New("origin down")
	}
	if o.lostReply.Load() {
		_, _ = o.Memory.Apply(ctx, reporter, rs)
		return nil, errors.New("reply lost")
	}
	return o.Memory.Apply(ctx, reporter, rs)
}

// A replay whose reply is lost after it was applied is sent again; the
// origin still counts every admitted cost exactly once.
func TestLostReplayReplyCountsOnce(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: region.NewMemory(clk.Now)}
	s := newService(t, Config{Now: clk.Now, Origin: o, FlushInterval: time.Hour})
	for range 4 {
		mustCheck(t, s, query("alice", 100, 2))
	}
	o.lostReply.Store(true)
	if err := s.flush(context.Background()); err == nil {
		t.Fatal("flush with a lost reply reported success")
	}
	mustCheck(t, s, query("alice", 100, 1))
	o.lostReply.Store(false)
	if err := s.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	cur, _, _ := o.Memory.Read(context.Background(), window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "alice", Duration: 60_000, Sequence: t0 / 60_000})
	c := cur.Count
	if c != 9 {
		t.Fatalf("origin holds %d after a lost reply and a retry, admitted 9", c)
	}
	if d := mustCheck(t, s, query("alice", 100, 0)); d.Remaining != 91 {
		t.Fatalf("the limiter sees %d remaining, want 91", d.Remaining)
	}
}

func TestFailedReadDecidesLocallyAndRetriesSoon(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: region.NewMemory(clk.Now)}
	o.fail.Store(true)
	s := newService(t, Config{Now: clk.Now, Origin: o, FlushInterval: time.Hour})
	for range 3 {
		if d := mustCheck(t, s, query("alice", 10, 1)); !d.Admitted {
			t.Fatalf("check denied while origin is down: %+v", d)
		}
	}
	if n := o.reads.Load(); n != 1 {
		t.Fatalf("%d reads within ReadRetry of a failure, want 1", n)
	}
	if err := s.flush(context.Background()); err == nil {
		t.Fatal("flush to a failing origin reported success")
	}
	o.fail.Store(false)
	clk.Advance(100 * time.Millisecond)
	mustCheck(t, s, query("alice", 10, 0))
	if n := o.reads.Load(); n != 2 {
		t.Fatalf("%d reads after ReadRetry, want a retry", n)
	}
	if err := s.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	cur, _, _ := o.Memory.Read(context.Background(), window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "alice", Duration: 60_000, Sequence: t0 / 60_000})
	c := cur.Count
	if c != 3 {
		t.Fatalf("origin holds %d after recovery, admitted 3", c)
	}
}

func TestTryCheckNeedsWarmFreshCellsWithAnOrigin(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now, Origin: region.NewMemory(clk.Now)})
	if _, ok, _ := s.TryCheck(query("alice", 10, 1)); ok {
		t.Fatal("TryCheck decided a cold identifier")
	}
	mustCheck(t, s, query("alice", 10, 1))
	if d, ok, err := s.TryCheck(query("alice", 10, 1)); !ok || err != nil || !d.Admitted || d.Remaining != 8 {
		t.Fatalf("TryCheck on a warm cell = %+v %v %v", d, ok, err)
	}
	clk.Advance(time.Second)
	if _, ok, _ := s.TryCheck(query("alice", 10, 1)); ok {
		t.Fatal("TryCheck decided a stale cell")
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
	if s.replay.head.Load() != nil {
		t.Fatal("a local-only service queued replay")
	}
}

func BenchmarkCheckWarm(b *testing.B) {
	s := New(Config{})
	defer s.Close(context.Background())
	q := query("user_1234567890abcdef", window.MaxLimit, 1)
	ctx := context.Background()
	s.Check(ctx, q)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, _ := s.TryCheck(q); !ok {
			s.Check(ctx, q)
		}
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

// slowOrigin counts reads and holds each for a moment so that concurrent
// checks overlap: a test seam, not a stand-in for a server.
type slowOrigin struct {
	*region.Memory
	delay time.Duration
	reads atomic.Int64
}

func (o *slowOrigin) Read(ctx context.Context, c window.Cell) (region.Totals, region.Totals, error) {
	o.reads.Add(1)
	time.Sleep(o.delay)
	return o.Memory.Read(ctx, c)
}

func concurrentChecks(t *testing.T, s *Service, q Query, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := s.Check(context.Background(), q); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestConcurrentColdAndStrictChecksShareOneRead(t *testing.T) {
	clk := newClock(t0)
	o := &slowOrigin{Memory: region.NewMemory(clk.Now), delay: 20 * time.Millisecond}
	s := newService(t, Config{Now: clk.Now, Origin: o, FlushInterval: time.Hour, ReadTimeout: time.Second})
	concurrentChecks(t, s, query("alice", 10, 0), 50)
	if n := o.reads.Load(); n != 1 {
		t.Fatalf("50 concurrent cold checks made %d origin reads, want 1", n)
	}
	mustCheck(t, s, query("alice", 0, 1)) // a denial: strict mode
	clk.Advance(30 * time.Millisecond)    // past StrictFreshFor
	before := o.reads.Load()
	concurrentChecks(t, s, query("alice", 10, 0), 50)
	if n := o.reads.Load() - before; n != 1 {
		t.Fatalf("50 concurrent strict checks made %d origin reads, want 1", n)
	}
	before = o.reads.Load()
	concurrentChecks(t, s, query("alice", 10, 0), 50)
	if n := o.reads.Load() - before; n != 0 {
		t.Fatalf("strict checks within StrictFreshFor of a read made %d reads, want 0", n)
	}
}

// While the origin fails, replay rounds back off exponentially (to a
// second) instead of re-sending every queued cell every FlushInterval; the
// first round after it recovers replays everything.
func TestReplayBacksOffWhileTheOriginFails(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: region.NewMemory(clk.Now)}
	s := newService(t, Config{Now: clk.Now, Origin: o, FlushInterval: time.Hour})
	// Unreported cost of 1% of the limit or more, so due every round;
	// decided locally (outside the near-limit rule's margin), so queued.
	mustCheck(t, s, query("alice", 100, 20))
	o.fail.Store(true)
	for range 100 { // one second of 10ms rounds
		s.replayTick()
		clk.Advance(10 * time.Millisecond)
	}
	if n := o.applies.Load(); n > 8 {
		t.Fatalf("%d replay calls in a second of failures, want a backoff", n)
	}
	o.fail.Store(false)
	clk.Advance(time.Second)
	s.replayTick()
	cur, _, _ := o.Memory.Read(context.Background(), window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "alice", Duration: 60_000, Sequence: t0 / 60_000})
	c := cur.Count
	if c != 20 || s.replayBackoff != 0 {
		t.Fatalf("after recovery origin holds %d (want 20), backoff %v (want reset)", c, s.replayBackoff)
	}
}

// A backlog is replayed over several rounds of bounded size, not in one.
func TestReplayRoundsAreBounded(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: region.NewMemory(clk.Now)}
	s := newService(t, Config{Now: clk.Now, Origin: o, FlushInterval: time.Hour, FlushWorkers: 1, FlushBatch: 10})
	for i := range 100 { // 20% of the limit unreported: all due; outside the near-limit margin: local
		mustCheck(t, s, query(fmt.Sprint("id-", i), 100, 20))
	}
	s.replayTick()
	if n := o.applies.Load(); n != 2 {
		t.Fatalf("first round made %d calls of 10 cells, want 2 (a round carries 2 x workers x batch cells)", n)
	}
	for range 4 {
		s.replayTick()
	}
	if n := o.applies.Load(); n != 10 {
		t.Fatalf("five rounds made %d calls, want all 100 cells in 10", n)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A cell fits the 128-byte size class: with its bucket, table entry and key
// that keeps an active cell within the 256-byte budget of DESIGN.md §11 (the
// next size class, 144, costs 16 bytes on every cell).
func TestCellFitsItsSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(cell{}); got > 128 {
		t.Fatalf("cell is %d bytes, want at most 128", got)
	}
	// What a decision without an origin reads, and what tells whether a
	// previous cell is fresh, stay in the cell's first cache line.
	var c cell
	for name, end := range map[string]uintptr{
		"seq":      unsafe.Offsetof(c.seq) + 8,
		"count":    unsafe.Offsetof(c.count) + 8,
		"imported": unsafe.Offsetof(c.imported) + 8,
		"syncedAt": unsafe.Offsetof(c.syncedAt) + 8,
	} {
		if end > 64 {
			t.Errorf("cell.%s ends at byte %d, beyond the first cache line", name, end)
		}
	}
}

// The warm check of a limiter with an origin: what a Redis-backed limiter
// runs for a fresh cell (counting the check in flight included).
func BenchmarkCheckWarmWithOrigin(b *testing.B) {
	s := New(Config{Origin: region.NewMemory(nil), FreshFor: time.Hour})
	defer s.Close(context.Background())
	q := query("user_1234567890abcdef", window.MaxLimit, 1)
	ctx := context.Background()
	s.Check(ctx, q)
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
	for name, cfg := range map[string]Config{
		"local":       {},
		"with origin": {Origin: region.NewMemory(nil), FreshFor: time.Hour},
	} {
		s := New(cfg)
		q := query("user_1234567890abcdef", window.MaxLimit, 1)
		if _, err := s.Check(context.Background(), q); err != nil {
			t.Fatal(err)
		}
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
