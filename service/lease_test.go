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

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// The invariant of a region (docs/architecture.md, "Exact in a region"):
// every admission is charged at the origin before it is final, and every
// denial is justified by admissions alone. So the origin's charged count is
// never below what the region admitted, its used count never above it, and
// every decision is the one an exact limiter makes for the same sequence.

// testRegion is limiters sharing one in-memory origin on a manual clock,
// whose settle rounds the test runs (as their loops would, every 10ms).
type testRegion struct {
	t    testing.TB
	clk  *manualClock
	mem  *regiontest.Memory
	svcs []*Service
	inDo bool // a check runs (do): a syncer may wait on the region's time
}

func newTestRegion(t testing.TB, n int, cfg Config) *testRegion {
	r := &testRegion{t: t, clk: newClock(t0)}
	r.mem = regiontest.NewMemory(r.clk.Now)
	for i := range n {
		c := cfg
		c.Now, c.Origin, c.ID = r.clk.Now, r.mem, fmt.Sprint("lim", i)
		s := start(c, false)
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		r.svcs = append(r.svcs, s)
	}
	return r
}

// tick lets d pass in steps of 10ms, each followed by every limiter's
// settle round. Outside do, no check runs: before each round it waits for
// the syncer that answered the last one to finish (it holds its cell a
// moment after the answer), as time would let it on a real clock.
func (r *testRegion) tick(d time.Duration) {
	for d > 0 {
		step := min(d, 10*time.Millisecond)
		r.clk.Advance(step)
		for _, s := range r.svcs {
			if !r.inDo {
				s.syncers.Wait()
			}
			s.settleTick()
		}
		d -= step
	}
}

// do runs f, which may wait on the origin, while the region's time passes:
// 10ms (and a settle round of every limiter) per millisecond f takes.
func (r *testRegion) do(f func()) {
	r.inDo = true
	defer func() { r.inDo = false }()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	for {
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
			r.tick(10 * time.Millisecond)
		}
	}
}

// counts returns what the origin holds of c without changing it (a sync
// whose Seq is never newer is stale).
func counts(t testing.TB, o region.Origin, c window.Cell) region.CellCounts {
	t.Helper()
	res, err := o.Sync(context.Background(), "probe", region.Sync{Cell: c, Limit: 1, ExpireAt: t0 + 24*3_600_000})
	if err != nil || !res.Stale {
		t.Fatalf("probe: %+v, %v", res, err)
	}
	return res.Current
}

func cellOf(q Query, now int64) window.Cell {
	return window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration,
		Sequence: now / q.Duration}
}

// warmLease checks q until s decides it at once: from its lease, holding a
// further 100, when s has an origin. On the system clock that may take the
// 100 ms over which a rate is first measured (a lease follows the rate),
// or the end of a window (a lease is no larger than the rate spends before
// its window ends): it checks for up to 5 s.
func warmLease(t testing.TB, s *Service, q Query) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 10_000 || time.Now().Before(deadline); i++ {
		if _, ok, _ := s.TryCheck(q); ok {
			if s.origin == nil {
				return
			}
			if b := s.table.load(q.key()); b != nil {
				if c := b.peek(s.nowMs() / q.Duration); c != nil && c.avail.Load() >= 100 {
					return
				}
			}
			continue
		}
		if _, err := s.Check(context.Background(), q); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatal("no lease after 10,000 checks and 5 s")
}

// Random checks and batches on random limiters of a region, one at a time,
// with time passing between them: every decision is the one exact limiter's
// for the same sequence, and after every step the origin's counts bracket
// what was admitted (used ≤ admitted ≤ charged). After Close every lease is
// back: used = charged = admitted. Limits of 0, 1, 7, 100 and 10^15; costs
// of 0 (a look) to 3; three and five limiters.
func TestSequentialChecksOverLimitersMatchOneExactLimiter(t *testing.T) {
	for _, n := range []int{3, 5} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%d limiters, seed %d", n, seed), func(t *testing.T) {
				sequentialRegion(t, n, seed)
			})
		}
	}
}

func sequentialRegion(t *testing.T, n int, seed uint64) {
	r := newTestRegion(t, n, Config{})
	rnd := rand.New(rand.NewPCG(seed, 99))
	limits := []int64{0, 1, 7, 100, window.MaxLimit}
	admitted := make([]int64, len(limits))
	q := func(i int, cost int64) Query {
		return Query{Workspace: "ws", Namespace: "ns", Identifier: fmt.Sprint("id-", i), Limit: limits[i], Duration: 60_000, Cost: cost}
	}
	costs := []int64{0, 1, 1, 1, 2, 3}
	for op := range 400 {
		switch k := rnd.IntN(10); {
		case k < 2:
			r.tick(time.Duration(rnd.IntN(120)) * time.Millisecond)
		case k < 4: // a batch of 1 to 3 checks on one limiter
			s := r.svcs[rnd.IntN(n)]
			qs := make([]Query, 1+rnd.IntN(3))
			ids := make([]int, len(qs))
			for i := range qs {
				ids[i] = rnd.IntN(len(limits))
				qs[i] = q(ids[i], costs[rnd.IntN(len(costs))])
			}
			want, sum := true, map[int]int64{}
			for i, x := range qs {
				sum[ids[i]] += x.Cost
				want = want && admitted[ids[i]]+sum[ids[i]] <= limits[ids[i]]
			}
			var ok bool
			r.do(func() {
				var err error
				if ok, _, err = s.Batch(context.Background(), qs); err != nil {
					t.Error(err)
				}
			})
			if ok != want {
				t.Fatalf("op %d: batch %+v admitted %v, one exact limiter %v (admitted so far %v)", op, qs, ok, want, admitted)
			}
			if ok {
				for id, c := range sum {
					admitted[id] += c
				}
			}
		default:
			s := r.svcs[rnd.IntN(n)]
			i := rnd.IntN(len(limits))
			x := q(i, costs[rnd.IntN(len(costs))])
			var d window.Decision
			r.do(func() { d = mustCheck(t, s, x) })
			if want := admitted[i]+x.Cost <= limits[i]; d.Admitted != want {
				t.Fatalf("op %d: limiter %s: check of %d on %d of %d: admitted %v, one exact limiter %v",
					op, s.cfg.ID, x.Cost, admitted[i], limits[i], d.Admitted, want)
			}
			if d.Admitted {
				admitted[i] += x.Cost
			}
		}
		for i := range limits {
			c := counts(t, r.mem, cellOf(q(i, 0), r.clk.ms.Load()))
			if c.Used > admitted[i] || c.Charged < admitted[i] {
				t.Fatalf("op %d: id-%d: origin used %d, charged %d; admitted %d", op, i, c.Used, c.Charged, admitted[i])
			}
		}
	}
	for _, s := range r.svcs {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range limits {
		if c := counts(t, r.mem, cellOf(q(i, 0), r.clk.ms.Load())); c.Used != admitted[i] || c.Charged != admitted[i] {
			t.Fatalf("after Close, id-%d: origin used %d, charged %d; admitted %d", i, c.Used, c.Charged, admitted[i])
		}
	}
}

// burstRegion is limiters sharing one in-memory origin, with their own
// loops, at default settings, on a clock that runs at the system clock's
// rate from the start of a 10-minute window: the bursts of a test (seconds
// long, on 10-minute windows) never cross a window's edge, where a sliding
// window rightly frees room as the previous window's weight falls.
func burstRegion(t testing.TB, n int) ([]*Service, *regiontest.Memory, func() time.Time) {
	shift := -time.Duration(time.Now().UnixMilli()%600_000) * time.Millisecond
	now := func() time.Time { return time.Now().Add(shift) }
	mem := regiontest.NewMemory(now)
	var svcs []*Service
	for i := range n {
		s := New(Config{Origin: mem, ID: fmt.Sprint("lim", i), Now: now})
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		svcs = append(svcs, s)
	}
	return svcs, mem, now
}

// send sends n checks of cost 1 from callers goroutines as fast as they are
// answered, the i-th through pick(i), and returns how many were admitted.
func send(t testing.TB, n, callers int, q Query, pick func(i int) *Service) int64 {
	var next, admitted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				d, err := pick(int(i)).Check(context.Background(), q)
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
	return admitted.Load()
}

// Bursts of 3× the limit from 64 and 256 goroutines over three and five
// limiters, faster than any settle round, on fresh and warm identifiers and
// with one limiter taking its share first, admit exactly the limit, for
// limits from 1 to 100,000; and the origin then holds exactly that.
func TestBurstsOverLimitersAdmitExactlyTheLimit(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprint(n, " limiters"), func(t *testing.T) {
			svcs, mem, clock := burstRegion(t, n)
			spread := func(i int) *Service { return svcs[i%n] }
			var want []Query
			run := func(name string, limit int64, callers int, warm, first bool) {
				q := Query{Workspace: "ws", Namespace: "ns", Identifier: name, Limit: limit, Duration: 600_000, Cost: 1}
				total := int64(0)
				if warm {
					total += send(t, int(limit/2), 8, q, spread)
					time.Sleep(30 * time.Millisecond) // longer than a settle round
				}
				if first {
					total += send(t, int(limit), callers, q, func(int) *Service { return svcs[0] })
					total += send(t, int(2*limit), callers, q, spread)
				} else {
					total += send(t, int(3*limit), callers, q, spread)
				}
				if total != limit {
					t.Errorf("%s: admitted %d, one exact limiter %d", name, total, limit)
				}
				want = append(want, q)
			}
			for _, limit := range []int64{1, 10, 100, 1000} {
				for _, callers := range []int{64, 256} {
					for rep := range 3 {
						run(fmt.Sprintf("fresh-%d-%d-%d", limit, callers, rep), limit, callers, false, false)
					}
					run(fmt.Sprintf("warm-%d-%d", limit, callers), limit, callers, limit > 1, false)
					run(fmt.Sprintf("first-%d-%d", limit, callers), limit, callers, false, true)
				}
			}
			run("fresh-100000", 100_000, 256, false, false)
			for _, s := range svcs {
				if err := s.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			now := clock().UnixMilli()
			for _, q := range want {
				if c := counts(t, mem, cellOf(q, now)); c.Used != q.Limit || c.Charged != q.Limit {
					t.Errorf("%s: origin used %d, charged %d after Close; admitted %d", q.Identifier, c.Used, c.Charged, q.Limit)
				}
			}
		})
	}
}

// Far from its limit a hot identifier is decided from the lease: after a
// short warm-up, checks are answered at once (TryCheck) and ask the origin
// about once per lease, not per check.
func TestFarFromTheLimitChecksSpendTheLease(t *testing.T) {
	// The system clock: a lease follows the rate this process admits at.
	s := newService(t, Config{Origin: regiontest.NewMemory(nil), Now: time.Now})
	q := query("hot", window.MaxLimit, 1)
	warmLease(t, s, q)
	before := s.Stats()
	inline := 0
	for range 100_000 {
		if _, ok, _ := s.TryCheck(q); ok {
			inline++
		} else {
			mustCheck(t, s, q)
		}
	}
	after := s.Stats()
	calls := after.OriginSyncs - before.OriginSyncs + after.Settles - before.Settles
	t.Logf("100,000 checks: %d decided inline, %d origin calls, %d leased", inline, calls, after.Leased-before.Leased)
	if inline < 99_000 || calls > 1_000 {
		t.Fatalf("100,000 checks far from the limit: %d decided from the lease, %d origin calls", inline, calls)
	}
}

// Leases shrink as the cell fills: near the limit every admission is
// decided at the origin, and after the burst every lease goes back.
func TestLeasesShrinkNearTheLimit(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	q := query("fill", 1000, 1)
	for i := range 3000 {
		var d window.Decision
		r.do(func() { d = mustCheck(t, r.svcs[i%3], q) })
		if d.Admitted != (i < 1000) {
			t.Fatalf("check %d: admitted %v", i, d.Admitted)
		}
		if i%50 == 0 {
			r.tick(10 * time.Millisecond)
		}
	}
	c := counts(t, r.mem, cellOf(q, r.clk.ms.Load()))
	if c.Used > 1000 || c.Charged != 1000 {
		t.Fatalf("origin used %d, charged %d at the limit", c.Used, c.Charged)
	}
	r.tick(200 * time.Millisecond) // idle leases go back
	if c := counts(t, r.mem, cellOf(q, r.clk.ms.Load())); c.Used != 1000 || c.Charged != 1000 {
		t.Fatalf("after the leases went back, origin used %d, charged %d", c.Used, c.Charged)
	}
	var leased int64
	for _, s := range r.svcs {
		leased += s.Stats().Leased
	}
	if leased == 0 {
		t.Fatal("no lease was granted on the way")
	}
}

// A limiter that dies loses nothing it admitted under a lease: the origin
// charged it in advance. Its unused lease counts as used once it is no
// longer live: the others admit up to the limit less what it charged.
func TestADeadLimitersLeaseIsChargedAndThenCountsAsUsed(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	dead, alive := r.svcs[0], r.svcs[1]
	q := query("dies", 10_000, 1)
	var admitted int64
	for range 200 {
		r.do(func() {
			if mustCheck(t, dead, q).Admitted {
				admitted++
			}
		})
	}
	if dead.Stats().Leased == 0 {
		t.Fatal("the limiter never held a lease")
	}
	r.svcs = r.svcs[1:] // dead: no more settle rounds
	c := counts(t, r.mem, cellOf(q, r.clk.ms.Load()))
	if c.Charged < admitted {
		t.Fatalf("origin charged %d, the dead limiter admitted %d", c.Charged, admitted)
	}
	r.tick(400 * time.Millisecond) // past LeaseFor + grace
	var more int64
	for range int(q.Limit) {
		r.do(func() {
			if mustCheck(t, alive, q).Admitted {
				more++
			}
		})
	}
	if more != q.Limit-c.Charged {
		t.Fatalf("the live limiter admitted %d, want the limit less what the dead one charged (%d)", more, q.Limit-c.Charged)
	}
}

// After Redis lost a cell, the region's own count the bridge restored
// (Import's Own) is what admissions are decided against: with 900 of 1000
// restored, a burst admits 100.
func TestARestoredLowerBoundIsCountedAtTheOrigin(t *testing.T) {
	svcs, mem, clock := burstRegion(t, 3)
	q := Query{Workspace: "ws", Namespace: "ns", Identifier: "restored", Limit: 1000, Duration: 600_000, Cost: 1}
	c := cellOf(q, clock().UnixMilli())
	if err := mem.Import(context.Background(), []region.Imported{{Cell: c, Own: 900, ExpireAt: c.Expiry(60_000)}}); err != nil {
		t.Fatal(err)
	}
	if got := send(t, 3000, 64, q, func(i int) *Service { return svcs[i%3] }); got != 100 {
		t.Fatalf("admitted %d over a restored 900 of 1000, want 100", got)
	}
}

// A batch naming one cell twice reserves both costs: 6 and 6 of 10 is
// refused, 5 and 5 admitted; a refused batch counts nothing anywhere (its
// reservation goes back to the lease and from there to the origin), and
// nothing of it is published.
func TestBatchesReserveEachCellOnceAndGiveBackWhenRefused(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	sink := &recordingSink{}
	for _, s := range r.svcs {
		s.global = sink
	}
	a := r.svcs[0]
	qa := func(cost int64) Query { return query("twice", 10, cost) }
	var ok bool
	var err error
	r.do(func() { ok, _, err = a.Batch(context.Background(), []Query{qa(6), qa(6)}) })
	if err != nil || ok {
		t.Fatalf("6 and 6 of 10: admitted %v, %v", ok, err)
	}
	// The second query's reservation is denied by the view or the origin;
	// a refused batch where a reservation was made and then given back: a
	// cell with a lease, and another the origin refuses.
	warm := query("warm", 1_000_000, 1)
	for range 50 {
		r.do(func() { mustCheck(t, a, warm) })
	}
	r.tick(10 * time.Millisecond)
	full := query("full", 1, 1)
	r.do(func() { mustCheck(t, r.svcs[1], full) })
	cw := a.table.load(warm.key()).peek(r.clk.ms.Load() / warm.Duration)
	availBefore := cw.avail.Load()
	if availBefore < 5 {
		t.Fatalf("no lease to reserve from (avail %d)", availBefore)
	}
	r.do(func() { ok, _, err = a.Batch(context.Background(), []Query{query("warm", 1_000_000, 5), full}) })
	if err != nil || ok {
		t.Fatalf("a batch with a full cell: admitted %v, %v", ok, err)
	}
	if cw.held.Load() != 0 || cw.avail.Load() != availBefore {
		t.Fatalf("after the refusal: held %d, avail %d; want the reservation back in the lease (%d)",
			cw.held.Load(), cw.avail.Load(), availBefore)
	}
	r.do(func() { ok, _, err = a.Batch(context.Background(), []Query{qa(5), qa(5)}) })
	if err != nil || !ok {
		t.Fatalf("5 and 5 of 10: admitted %v, %v", ok, err)
	}
	r.tick(2500 * time.Millisecond) // past LeaseFor after the last report: the unused leases go back
	for _, s := range r.svcs {
		s.publishTick()
	}
	comps := sink.take()
	for _, c := range comps {
		if c.Cell.Identifier == "warm" && c.Count != 50 {
			t.Fatalf("published %d for the warm cell, admitted 50", c.Count)
		}
	}
	for _, q := range []Query{qa(0), warm} {
		c := counts(t, r.mem, cellOf(q, r.clk.ms.Load()))
		want := map[string]int64{"twice": 10, "warm": 50}[q.Identifier]
		if c.Used != want || c.Charged != want {
			t.Fatalf("%s: origin used %d, charged %d; admitted %d", q.Identifier, c.Used, c.Charged, want)
		}
	}
}

// Concurrent batches and single checks over three limiters near their
// limits stay all or nothing and never exceed a limit.
func TestConcurrentBatchesNearTheLimitStayAllOrNothing(t *testing.T) {
	svcs, mem, clock := burstRegion(t, 3)
	const limit = 40
	qa := Query{Workspace: "ws", Namespace: "ns", Identifier: "a", Limit: limit, Duration: 600_000, Cost: 1}
	qb := qa
	qb.Identifier = "b"
	var both, singles atomic.Int64
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			s := svcs[g%3]
			for range 10 {
				if g%2 == 0 {
					ok, _, err := s.Batch(context.Background(), []Query{qa, qb})
					if err != nil {
						t.Error(err)
					}
					if ok {
						both.Add(1)
					}
				} else if d, _ := s.Check(context.Background(), qa); d.Admitted {
					singles.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for _, s := range svcs {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	now := clock().UnixMilli()
	ca, cb := counts(t, mem, cellOf(qa, now)), counts(t, mem, cellOf(qb, now))
	if ca.Used != both.Load()+singles.Load() || cb.Used != both.Load() || ca.Used > limit || ca.Charged != ca.Used || cb.Charged != cb.Used {
		t.Fatalf("a: used %d charged %d, b: used %d charged %d; batches admitted %d, singles %d",
			ca.Used, ca.Charged, cb.Used, cb.Charged, both.Load(), singles.Load())
	}
	if ca.Used != limit {
		t.Fatalf("a holds %d of %d after 480 requests: a false denial", ca.Used, limit)
	}
}

// failingOrigin fails syncs while fail is set, or applies them and loses
// the reply while lostReply is: a test seam for the service's failure
// handling, not a stand-in for a server.
type failingOrigin struct {
	*regiontest.Memory
	fail      atomic.Bool
	lostReply atomic.Bool
	syncs     atomic.Int64
	settles   atomic.Int64
}

func (o *failingOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	o.syncs.Add(1)
	if o.fail.Load() {
		return region.SyncResult{}, errors.New("origin down")
	}
	res, err := o.Memory.Sync(ctx, reporter, s)
	if o.lostReply.Load() {
		return region.SyncResult{}, errors.New("reply lost")
	}
	return res, err
}

func (o *failingOrigin) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	o.settles.Add(1)
	if o.fail.Load() {
		return nil, errors.New("origin down")
	}
	res, err := o.Memory.Settle(ctx, reporter, ss)
	if o.lostReply.Load() {
		return nil, errors.New("reply lost")
	}
	return res, err
}

// Syncs whose replies are lost after the origin applied them (grants
// included) are followed by later ones: the origin counts every admission
// exactly once and nothing it granted into a lost reply.
func TestLostRepliesCountEachAdmissionOnce(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: regiontest.NewMemory(clk.Now)}
	s := start(Config{Now: clk.Now, Origin: o}, false)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	q := query("lost", 1000, 2)
	var admitted int64
	for i := range 40 {
		o.lostReply.Store(i%3 == 1)
		if mustCheck(t, s, q).Admitted {
			admitted += 2
		}
		clk.Advance(5 * time.Millisecond)
		s.settleTick()
	}
	o.lostReply.Store(false)
	clk.Advance(2 * time.Second) // past any backoff
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := counts(t, o.Memory, cellOf(q, clk.ms.Load())); c.Used != admitted || c.Charged != admitted {
		t.Fatalf("origin used %d, charged %d; admitted %d", c.Used, c.Charged, admitted)
	}
}

// While the origin fails, checks are decided locally at once (one failed
// call per ReadRetry), and what they admitted reaches the origin once it is
// back; settle rounds back off meanwhile.
func TestAFailingOriginDecidesLocallyAndSettlesLater(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: regiontest.NewMemory(clk.Now)}
	o.fail.Store(true)
	s := start(Config{Now: clk.Now, Origin: o}, false)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	for range 3 {
		if d := mustCheck(t, s, query("alice", 10, 1)); !d.Admitted {
			t.Fatalf("check denied while the origin is down: %+v", d)
		}
	}
	if n := o.syncs.Load(); n != 1 {
		t.Fatalf("%d syncs within ReadRetry of a failure, want 1", n)
	}
	for range 100 { // one second of rounds
		s.settleTick()
		clk.Advance(10 * time.Millisecond)
	}
	if n := o.settles.Load(); n > 8 {
		t.Fatalf("%d settle calls in a second of failures, want a backoff", n)
	}
	o.fail.Store(false)
	clk.Advance(time.Second)
	s.syncers.Wait() // the syncer of the failed call holds the cell a moment after it answered
	s.settleTick()
	if c := counts(t, o.Memory, cellOf(query("alice", 10, 0), clk.ms.Load())); c.Used != 3 || c.Charged != 3 {
		t.Fatalf("after recovery origin used %d, charged %d; admitted 3", c.Used, c.Charged)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Close while the origin is down says what it could not hand on: the cells
// and the cost admitted without the origin.
func TestCloseSaysWhatTheOriginLacks(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: regiontest.NewMemory(clk.Now)}
	o.fail.Store(true)
	s := start(Config{Now: clk.Now, Origin: o}, false)
	for i := range 4 {
		mustCheck(t, s, query(fmt.Sprint("down-", i), 10, 2))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var pe *PendingError
	if err := s.Close(ctx); !errors.As(err, &pe) || pe.Cells != 4 || pe.Unsent != 8 {
		t.Fatalf("Close with the origin down: %v; want 4 cells and 8 cost never sent", err)
	}
}

// A backlog is settled over several rounds of bounded size, not in one.
func TestSettleRoundsAreBounded(t *testing.T) {
	clk := newClock(t0)
	o := &failingOrigin{Memory: regiontest.NewMemory(clk.Now)}
	o.fail.Store(true)
	s := start(Config{Now: clk.Now, Origin: o, FlushWorkers: 1, FlushBatch: 10}, false)
	for i := range 100 {
		mustCheck(t, s, query(fmt.Sprint("id-", i), 100, 20))
	}
	o.fail.Store(false)
	clk.Advance(time.Second)
	before := o.settles.Load()
	s.settleTick()
	if n := o.settles.Load() - before; n != 2 {
		t.Fatalf("first round made %d calls of 10 cells, want 2 (a round carries 2 x workers x batch cells)", n)
	}
	for range 4 {
		s.settleTick()
	}
	if n := o.settles.Load() - before; n != 10 {
		t.Fatalf("five rounds made %d calls, want all 100 cells in 10", n)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// slowOrigin holds each request-path sync for a moment so that concurrent
// checks overlap, and counts them: a test seam, not a stand-in for a
// server.
type slowOrigin struct {
	*regiontest.Memory
	delay time.Duration
	syncs atomic.Int64
}

func (o *slowOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	o.syncs.Add(1)
	time.Sleep(o.delay)
	return o.Memory.Sync(ctx, reporter, s)
}

func concurrentChecks(t *testing.T, s *Service, q Query, n int) []window.Decision {
	t.Helper()
	out := make([]window.Decision, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			d, err := s.Check(context.Background(), q)
			if err != nil {
				t.Error(err)
			}
			out[i] = d.Decision
		})
	}
	wg.Wait()
	return out
}

// Concurrent cold checks of one cell travel in one sync (or a few, those
// that arrive while one is in flight join the next), as do concurrent looks
// in strict mode; looks within StrictFreshFor of a sync ask nothing.
func TestConcurrentColdAndStrictChecksShareSyncs(t *testing.T) {
	clk := newClock(t0)
	o := &slowOrigin{Memory: regiontest.NewMemory(clk.Now), delay: 20 * time.Millisecond}
	s := start(Config{Now: clk.Now, Origin: o, ReadTimeout: time.Second}, false)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	ds := concurrentChecks(t, s, query("alice", 10, 1), 50)
	admitted := 0
	for _, d := range ds {
		if d.Admitted {
			admitted++
		}
	}
	if n := o.syncs.Load(); admitted != 10 || n > 3 {
		t.Fatalf("50 concurrent cold checks: %d admitted (want 10) in %d syncs (want at most 3)", admitted, n)
	}
	clk.Advance(30 * time.Millisecond) // past StrictFreshFor; strict since the denials
	before := o.syncs.Load()
	concurrentChecks(t, s, query("alice", 10, 0), 50)
	if n := o.syncs.Load() - before; n != 1 {
		t.Fatalf("50 concurrent strict looks made %d syncs, want 1", n)
	}
	before = o.syncs.Load()
	concurrentChecks(t, s, query("alice", 10, 0), 50)
	if n := o.syncs.Load() - before; n != 0 {
		t.Fatalf("looks within StrictFreshFor of a sync made %d syncs, want 0", n)
	}
}

// A look answers by the rule after a burst, in the window of the burst and
// the next: with the limit used, remaining 0 and the wait until the used
// cost decays; a minute later, what the previous window's weight leaves.
// (A denial must not outlive what the rule says.)
func TestALookAfterABurstFollowsTheRule(t *testing.T) {
	for _, n := range []int{1, 2} {
		r := newTestRegion(t, n, Config{})
		q := query(fmt.Sprint("look-", n), 10, 1)
		var ds []window.Decision
		r.do(func() {
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Go(func() {
					d := mustCheck(t, r.svcs[i%n], q)
					mu.Lock()
					ds = append(ds, d)
					mu.Unlock()
				})
			}
			wg.Wait()
		})
		admitted := int64(0)
		for _, d := range ds {
			if d.Admitted {
				admitted++
			}
		}
		if admitted != 10 {
			t.Fatalf("%d limiters: 40 concurrent checks on a limit of 10 admitted %d", n, admitted)
		}
		look := q
		look.Cost = 0
		for _, at := range []int64{r.clk.ms.Load() + 30, t0 + 60_000 + 20_000} {
			r.tick(time.Duration(at-r.clk.ms.Load()) * time.Millisecond)
			now := r.clk.ms.Load()
			in := window.Input{Now: now, Duration: q.Duration, Limit: 10, Current: 10}
			if now >= t0+60_000 {
				in.Current, in.Previous = 0, 10
			}
			for i, s := range r.svcs {
				var got window.Decision
				r.do(func() { got = mustCheck(t, s, look) })
				if want := window.Decide(in); got != want {
					t.Fatalf("%d limiters: limiter %d's look %dms after t0: %+v, want %+v", n, i, now-t0, got, want)
				}
				if now >= t0+60_000 {
					continue // the next window has room: a check would count
				}
				r.do(func() { got = mustCheck(t, s, q) })
				in.Cost = 1
				if want := window.Decide(in); got != want {
					t.Fatalf("%d limiters: limiter %d's check %dms after t0: %+v, want %+v", n, i, now-t0, got, want)
				}
				in.Cost = 0
			}
		}
	}
}

// gatedOrigin holds settle calls while gate is closed, and refuses syncs
// while refuse is set: a test seam to keep a sync on its way, not a
// stand-in for a server.
type gatedOrigin struct {
	*regiontest.Memory
	gate    chan struct{}
	entered chan struct{}
	refuse  atomic.Bool
}

func (o *gatedOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if o.refuse.Load() {
		return region.SyncResult{}, errors.New("connection refused")
	}
	return o.Memory.Sync(ctx, reporter, s)
}

func (o *gatedOrigin) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	o.entered <- struct{}{}
	<-o.gate
	return o.Memory.Settle(ctx, reporter, ss)
}

// What this process admits while a sync of the cell is on its way is
// reported by a later one: the origin ends up with every admission. Here a
// settle round gives an expired lease back and is held on its way, while
// the origin refuses checks' syncs and the read breaker opens: checks are
// decided locally meanwhile. (A reply once cleared the cell's mark of
// unsettled admissions after the fact, and those admissions never reached
// the origin.)
func TestAdmissionsWhileASyncIsOnItsWayAreReported(t *testing.T) {
	clk := newClock(t0)
	o := &gatedOrigin{Memory: regiontest.NewMemory(clk.Now), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	// The manual clock stands still while the lease is warmed: a long
	// LeaseAhead sizes a lease of 100 from the rate its first interval shows.
	s := start(Config{Now: clk.Now, Origin: region.NewBreaker(o, region.BreakerConfig{Failures: 1, OpenFor: time.Minute}),
		LeaseAhead: time.Hour}, false)
	q := query("inflight", window.MaxLimit, 1)
	close(o.gate)
	warmLease(t, s, q)
	o.gate = make(chan struct{})
	clk.Advance(time.Second) // the lease expired: the next round gives it back
	// Rounds until one sends the cell: a round skips it while the last
	// check's sync is still ending (that check returned a moment before).
	round := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(round)
		for {
			s.settleTick()
			select {
			case <-sent:
				return
			default:
			}
		}
	}()
	<-o.entered // the round's sync is on its way
	close(sent)
	// The origin refuses a check's sync: the read breaker opens, and the
	// next check it refuses makes every identifier decide locally.
	o.refuse.Store(true)
	for _, id := range []string{"refused", "refused-by-the-breaker"} {
		mustCheck(t, s, query(id, window.MaxLimit, 1))
	}
	for range 5 {
		if d := mustCheck(t, s, q); !d.Admitted {
			t.Fatal("denied while a sync was on its way")
		}
	}
	close(o.gate)
	<-round
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := counts(t, o.Memory, cellOf(q, clk.ms.Load()))
	local := s.table.load(q.key()).peek(clk.ms.Load() / q.Duration).count.Load()
	if c.Used != local || c.Charged != local {
		t.Fatalf("origin used %d, charged %d; the limiter admitted %d (5 of them while a sync was on its way)", c.Used, c.Charged, local)
	}
}

// A check whose caller gives up while its sync is on its way is denied: the
// origin answers, and this limiter's counts miss what others hold, so it is
// never admitted from them. What the origin granted it meanwhile joins the
// lease and goes back unused, so the origin ends up counting nothing.
func TestACheckGivenUpWhileItsSyncIsOnItsWayIsDeniedAndCountsNothing(t *testing.T) {
	clk := newClock(t0)
	o := &slowOrigin{Memory: regiontest.NewMemory(clk.Now), delay: 50 * time.Millisecond}
	s := start(Config{Now: clk.Now, Origin: o, ReadTimeout: time.Second}, false)
	q := query("gave-up", 100, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	d, err := s.Check(ctx, q)
	if err != nil || d.Admitted || d.RetryAfter < 1 {
		t.Fatalf("a check given up on: %+v, %v; want denied, with a retry_after", d, err)
	}
	if n := s.Stats().WaitsDenied; n != 1 {
		t.Fatalf("%d checks denied after their callers gave up, want 1", n)
	}
	if err := s.Close(context.Background()); err != nil { // waits for the sync, then gives the lease back
		t.Fatal(err)
	}
	if c := counts(t, o.Memory, cellOf(q, clk.ms.Load())); c.Used != 0 || c.Charged != 0 {
		t.Fatalf("origin used %d, charged %d; admitted none", c.Used, c.Charged)
	}
}

// After the origin denies a check, what it counted against it (here the
// unused lease of a limiter that died, counted as used once no longer live,
// which no report will ever lower) denies the identifier's checks that it
// denies until the rule lets more in, without asking again: a flood on an
// exhausted identifier costs one origin call, not one per check.
func TestAnOriginDenialAnswersTheFloodThatFollows(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	alive, dead := r.svcs[0], r.svcs[1]
	q := query("flood", 1000, 1)
	for range 900 {
		r.do(func() { mustCheck(t, dead, q) })
	}
	r.svcs = r.svcs[:1] // dead: no more settle rounds
	r.tick(2500 * time.Millisecond)
	c := counts(t, r.mem, cellOf(q, r.clk.ms.Load()))
	if c.Used <= 900 || c.Charged != c.Used {
		t.Fatalf("used %d, charged %d; want the dead limiter's 900 and its unused lease, counted as used", c.Used, c.Charged)
	}
	admitted, denied, before := int64(0), 0, int64(0)
	for range 1000 { // at one instant: the origin answers each at once
		d := mustCheck(t, alive, q)
		switch {
		case d.Admitted:
			admitted++
		case denied == 0: // the origin's denial
			denied++
			before = alive.Stats().OriginSyncs
		}
	}
	if want := q.Limit - c.Charged; admitted != want {
		t.Fatalf("admitted %d, want the limit less what the dead limiter charged (%d)", admitted, want)
	}
	if n := alive.Stats().OriginSyncs - before; n != 0 {
		t.Fatalf("the checks after the first denial made %d origin calls, want 0", n)
	}
}

// A limiter that took a lease and then received nothing more holds it idle
// while the others fill the cell. A check elsewhere that fits only if that
// lease is unused waits; if its caller gives up first it is denied, never
// admitted without the origin (that would overshoot). The idle lease goes
// back before it ends (after FarFlushInterval when its cell is near the
// limit), and the check is admitted then.
func TestAnIdleLeaseMakesOthersWaitNeverOvershoot(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	a, b := r.svcs[0], r.svcs[1]
	q := query("idle", 40, 1)
	admitted, lease := leaseOn(t, r, b, q)
	// a fills what b's lease leaves; no time passes for the region, so b's
	// lease stays where it is. The check after that fits only if the lease
	// is unused: it waits, and its caller gives up after 20ms.
	for range 2 * q.Limit {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		d, err := a.Check(ctx, q)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			break
		}
		admitted++
	}
	if admitted != q.Limit-lease {
		t.Fatalf("a admitted up to %d with b's lease of %d unused, want %d", admitted, lease, q.Limit-lease)
	}
	if a.Stats().WaitsDenied != 1 {
		t.Fatalf("%d checks denied after waiting, want the 1 that waited on b's lease", a.Stats().WaitsDenied)
	}
	// b's idle lease goes back before it ends; a's checks fill the cell
	// exactly.
	r.tick(time.Second)
	for range lease + 2 {
		var d window.Decision
		r.do(func() { d = mustCheck(t, a, q) })
		if d.Admitted {
			admitted++
		}
	}
	if admitted != q.Limit {
		t.Fatalf("admitted %d in all, want %d", admitted, q.Limit)
	}
}

// A client address's cell sees a check or two a window (Envoy's limit per
// address): a lease would go back unused and cost a settle to give back,
// so such a cell holds none, and each check costs one sync and nothing
// after it. A cell whose rate spends a lease still gets one.
func TestACellCheckedOnceOrTwiceAWindowHoldsNoLease(t *testing.T) {
	clk := newClock(t0 + 500)
	s := start(Config{Now: clk.Now, Origin: regiontest.NewMemory(clk.Now)}, false)
	defer s.Close(context.Background())
	q := Query{Workspace: "ws", Namespace: "ns", Identifier: "10.0.0.1", Limit: 1000, Duration: 1000, Cost: 1}
	for i := range 2 {
		if d := mustCheck(t, s, q); !d.Admitted {
			t.Fatalf("check %d of a fresh address denied: %+v", i+1, d)
		}
		clk.Advance(100 * time.Millisecond)
	}
	st := s.Stats()
	c := s.table.load(q.key()).peek(t0 / 1000)
	if c == nil || c.avail.Load() != 0 || st.SettleQueued != 0 || st.OriginSyncs != 2 {
		var avail int64 = -1
		if c != nil {
			avail = c.avail.Load()
		}
		t.Fatalf("two checks 100 ms apart: lease %d, %d cells to settle, %d syncs; want no lease, nothing to settle, 2 syncs",
			avail, st.SettleQueued, st.OriginSyncs)
	}

	hot := q
	hot.Identifier = "10.0.0.2"
	for range 20 {
		mustCheck(t, s, hot)
		clk.Advance(2 * time.Millisecond)
	}
	if syncs := s.Stats().OriginSyncs - st.OriginSyncs; syncs >= 20 {
		t.Fatalf("20 checks in 40 ms: %d syncs; want a lease to cover some", syncs)
	}
}
