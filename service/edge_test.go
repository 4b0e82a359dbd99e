package service

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// The edges of "one region, one count" (docs/architecture.md, "One count of
// a cell"), each on the in-memory origin with a manual clock, at the
// default configuration unless a test says why not.

// fillBehindIdleLease makes b of r hold an idle lease of q's cell while a
// fills what it leaves: afterwards a check on a fits only if b's lease is
// unused (it waits on the origin). It returns what the region admitted.
// q's limit leaves b a lease (a share of the room) once it takes one.
func fillBehindIdleLease(t *testing.T, r *testRegion, a, b *Service, q Query) int64 {
	t.Helper()
	admitted, lease := leaseOn(t, r, b, q)
	for admitted < q.Limit-lease {
		if !mustCheck(t, a, q).Admitted {
			t.Fatalf("a denied at %d of %d with b's lease of %d", admitted, q.Limit, lease)
		}
		admitted++
	}
	return admitted
}

// leaseOn checks q on s of r until s holds a lease of q's cell (a cell
// takes none until s has admitted minLeaseUses in it before the check at hand), and
// returns what s admitted and the lease.
func leaseOn(t *testing.T, r *testRegion, s *Service, q Query) (admitted, lease int64) {
	t.Helper()
	for admitted <= minLeaseUses {
		r.do(func() { mustCheck(t, s, q) })
		admitted++
		if c := s.table.load(q.key()).peek(r.clk.ms.Load() / q.Duration); c != nil && c.avail.Load() > 0 {
			return admitted, c.avail.Load()
		}
	}
	t.Fatalf("no lease after %d checks", admitted)
	return 0, 0
}

// A batch whose reservation waits on a lease held elsewhere when its
// caller gives up is refused, as a single check is: it is never decided
// from this limiter's counts, which miss the lease (here they would admit
// it, one over the limit).
func TestABatchWhoseCallerGivesUpWhileItWaitsIsRefused(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	a, b := r.svcs[0], r.svcs[1]
	q := query("batch-deadline", 40, 1)
	fillBehindIdleLease(t, r, a, b, q)
	other := query("batch-deadline-other", 10, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ok, ds, err := a.Batch(ctx, []Query{other, q})
	if err != nil {
		t.Fatal(err)
	}
	if ok || ds[1].Admitted || ds[1].RetryAfter < 1 {
		t.Fatalf("a batch given up on while it waits: admitted %v, %+v; want refused, the waiting query with a retry_after", ok, ds)
	}
	if n := a.Stats().WaitsDenied; n != 1 {
		t.Fatalf("%d given up on and denied, want 1", n)
	}
	if c := counts(t, r.mem, cellOf(other, r.clk.ms.Load())); c.Used != 0 {
		t.Fatalf("the refused batch counted %d on its other cell", c.Used)
	}
}

// A check queued behind another check of its cell that waits on the
// origin, and not yet sent when its caller gives up, is denied: the origin
// answers (it keeps the first pending), so this limiter's counts must not
// decide it.
func TestACheckNeverSentWhenItsCallerGivesUpIsDenied(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	a, b := r.svcs[0], r.svcs[1]
	q := query("queued-deadline", 40, 1)
	fillBehindIdleLease(t, r, a, b, q)
	// The first waits on b's lease (no time passes for the region, so it
	// stays pending); a sync carries checks of one limit, so the second,
	// of another limit, stays queued behind it.
	first := make(chan window.Decision, 1)
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	go func() {
		d, _ := a.Check(fctx, q)
		first <- d.Decision
	}()
	for a.Stats().OriginWaits == 0 {
		time.Sleep(time.Millisecond)
	}
	q2 := q
	q2.Limit = q.Limit + 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	d, err := a.Check(ctx, q2)
	if err != nil {
		t.Fatal(err)
	}
	if d.Admitted || d.RetryAfter < 1 {
		t.Fatalf("a check never sent when its caller gave up: %+v; want denied", d)
	}
	fcancel()
	if d := <-first; d.Admitted {
		t.Fatalf("the check pending on b's lease was admitted when its caller gave up: %+v", d)
	}
}

// An override whose duration differs from the one checks send is decided
// on the warm path (TryCheck) once its cells are warm, not sent to the
// asynchronous path (and past its bound, to a local decision) every time.
func TestAnOverrideOfAnotherDurationIsDecidedOnTheWarmPath(t *testing.T) {
	r := newTestRegion(t, 1, Config{})
	s := r.svcs[0]
	q := query("override-duration", 1000, 1)
	if _, err := s.Policies().Set(policy.Key{Workspace: q.Workspace, Namespace: q.Namespace, Pattern: q.Identifier},
		policy.Override{Limit: 100_000, Duration: 2 * q.Duration}, r.clk.ms.Load(), "r1"); err != nil {
		t.Fatal(err)
	}
	// Checks until the cell holds a lease for ten: the first syncs take
	// none (fewer than minLeaseUses admitted before them), later ones
	// leases sized to the rate the checks show.
	policed := q
	policed.Duration = 2 * q.Duration
	for range 100 {
		if b := s.table.load(policed.key()); b != nil {
			if c := b.peek(r.clk.ms.Load() / policed.Duration); c != nil && c.avail.Load() >= 10 {
				break
			}
		}
		r.do(func() { mustCheck(t, s, q) })
	}
	for i := range 10 {
		d, ok, err := s.TryCheck(q)
		if err != nil || !ok {
			t.Fatalf("check %d on the warm override cell: decided %v, %v; want decided without waiting", i, ok, err)
		}
		if !d.Admitted || d.Limit != 100_000 {
			t.Fatalf("check %d: %+v; want admitted under the override's limit", i, d)
		}
	}
}

// A lease the origin counted as used once it ended, given back by its
// holder after all (it was late, not dead), lowers the cell's count, and
// a limiter's cached denial does not outlive that: its next check past
// StrictFreshFor asks the origin, sees the lease back, and is admitted.
func TestALeaseThatComesBackEndsTheDenialItCaused(t *testing.T) {
	r := newTestRegion(t, 2, Config{})
	a, b := r.svcs[0], r.svcs[1]
	q := query("late", 40, 1)
	admitted := fillBehindIdleLease(t, r, a, b, q)
	// b stalls (a pause, a starved host): its settle rounds stop, its lease
	// ends at the origin and counts as used; a's next check is denied.
	// (Checks from here on are answered by the origin at once: no time
	// passes while they run, which would let ForgetAfter pass too.)
	r.svcs = r.svcs[:1]
	r.tick(1200 * time.Millisecond)
	d := mustCheck(t, a, q)
	if d.Admitted {
		t.Fatalf("admitted with b's ended lease counted as used: %+v", d)
	}
	// b is back and gives back the lease it never spent: the origin's count
	// goes down by it.
	r.svcs = append(r.svcs, b)
	r.tick(20 * time.Millisecond)
	if c := counts(t, r.mem, cellOf(q, r.clk.ms.Load())); c.Used != admitted {
		t.Fatalf("origin count %d after b gave its lease back, want the %d admitted", c.Used, admitted)
	}
	r.tick(50 * time.Millisecond) // past StrictFreshFor
	if d = mustCheck(t, a, q); !d.Admitted {
		t.Fatalf("still denied after the lease came back: %+v", d)
	}
	if a.Stats().Reversals == 0 {
		t.Fatal("a never saw the reversal")
	}
}

// What a limiter admitted while the origin failed reaches the other
// limiters (through the bridge's import of the region's own count) before
// it reaches the origin. When the origin answers again, it counts those
// admissions once: the other limiter's floor counted them as lost, and the
// report that carries them takes them back out.
func TestAdmissionsMadeWhileTheOriginFailedAreCountedOnce(t *testing.T) {
	clk := newClock(t0)
	mem := regiontest.NewMemory(clk.Now)
	down := &failingOrigin{Memory: mem}
	a := start(Config{Now: clk.Now, Origin: down, ID: "a"}, false)
	b := start(Config{Now: clk.Now, Origin: mem, ID: "b"}, false)
	t.Cleanup(func() { _ = a.Close(context.Background()); _ = b.Close(context.Background()) })
	q := query("blip", 1000, 1)
	tick := func(d time.Duration) {
		for ; d > 0; d -= 10 * time.Millisecond {
			clk.Advance(10 * time.Millisecond)
			for _, s := range []*Service{a, b} {
				s.syncers.Wait() // no check runs: let a syncer that answered one finish
				s.settleTick()
			}
		}
	}
	for range 100 {
		mustCheck(t, a, q)
	}
	mustCheck(t, b, q)
	tick(time.Second) // everything reported, leases back
	down.fail.Store(true)
	for range 50 {
		if !mustCheck(t, a, q).Admitted {
			t.Fatal("denied while the origin is down")
		}
	}
	// The bridge passes on a's count (151 of the region's) to the region:
	// b holds it, and stores it in the origin, which counts the 50 it
	// never saw as lost admissions.
	cell := cellOf(q, clk.ms.Load())
	own := a.table.load(q.key()).peek(cell.Sequence).admitted()
	imports := []global.Import{{Cell: cell, Own: own, ExpireAt: cell.Expiry(60_000)}}
	b.ApplyImports(imports, 0)
	if err := b.StoreImports(context.Background(), imports, 0); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, b, q) // b's sync carries its floor, 151 + 1
	down.fail.Store(false)
	tick(2 * time.Second) // a reports the 50
	c := counts(t, mem, cell)
	if want := int64(152); c.Used != want || c.Charged != want {
		t.Fatalf("origin used %d, charged %d; the region admitted %d", c.Used, c.Charged, want)
	}
}

// While the origin stays down longer than a cell's window, the settle
// queue drops the cells whose window has expired at the origin instead of
// keeping them for ever.
func TestTheSettleQueueDropsCellsWhoseWindowExpired(t *testing.T) {
	clk := newClock(t0)
	down := &failingOrigin{Memory: regiontest.NewMemory(clk.Now)}
	down.fail.Store(true)
	s := start(Config{Now: clk.Now, Origin: down}, false)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	q := query("expired", 100, 1)
	q.Duration = 1000
	for range 3 {
		mustCheck(t, s, q)
	}
	s.settleTick()
	if s.Stats().SettleQueued == 0 {
		t.Fatal("nothing queued for the origin")
	}
	clk.Advance(65 * time.Second) // past the cell's expiry (two windows and ExpiryGrace) and any backoff
	s.settleTick()
	if st := s.Stats(); st.SettleQueued != 0 || st.ExpiredDropped == 0 {
		t.Fatalf("queued %d, dropped %d; want the expired cell dropped", st.SettleQueued, st.ExpiredDropped)
	}
}

// A limiter that has not synced a cell for half of ForgetAfter reports it
// under a new generation; what it admitted before stays counted once.
// Over 100 restarts of a limiter on one hot cell, half of them SIGKILLs
// (the process is dropped, its lease left behind), the origin keeps only
// the reporters of the last ForgetAfter: its state stays flat.
func TestReportersComeAndGoAndTheOriginKeepsOnlyTheRecentOnes(t *testing.T) {
	r := newTestRegion(t, 1, Config{})
	s := r.svcs[0]
	q := query("restarts", 1_000_000, 1)
	admitted := int64(0)
	check := func(s *Service) {
		r.do(func() {
			if mustCheck(t, s, q).Admitted {
				admitted++
			}
		})
	}
	check(s)
	r.tick(6 * time.Second) // idle past half of ForgetAfter
	check(s)
	if n := s.Stats().Generations; n != 1 {
		t.Fatalf("%d new generations, want 1", n)
	}
	cell := cellOf(q, r.clk.ms.Load())
	most := 0
	for i := range 100 {
		c := start(Config{Now: r.clk.Now, Origin: r.mem, ID: fmt.Sprint("restart-", i)}, false)
		r.svcs = append(r.svcs, c)
		for range 20 {
			check(c)
		}
		r.tick(100 * time.Millisecond)
		r.svcs = r.svcs[:1]
		if i%2 == 0 {
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		} else {
			c.stopOnce.Do(func() { close(c.stop) }) // SIGKILL: its loops stop, its lease stays behind
		}
		most = max(most, r.mem.Reporters(cell))
	}
	r.tick(region.ForgetAfter + 2*time.Second)
	check(s)
	// Each restart lasted about 100ms of the region's clock: ForgetAfter
	// holds about 100 of them, half killed, plus retirement marks.
	if n := r.mem.Reporters(cell); n > 2 {
		t.Fatalf("%d reporters kept once everything is older than ForgetAfter, want the live limiter's", n)
	}
	if most > 110 {
		t.Fatalf("up to %d reporters kept, want at most the last ForgetAfter's", most)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := counts(t, r.mem, cell)
	// Killed limiters' unused leases count as used: at most their bound
	// (1% of the limit) each.
	if c.Used < admitted || c.Used > admitted+50*10_000 {
		t.Fatalf("origin count %d, admitted %d", c.Used, admitted)
	}
}

// A burst inflates a limiter's rate estimate; its lease follows what it
// admits in LeaseAhead, and the origin caps what one reporter holds unused
// in all, not each grant. A SIGKILL two seconds after a burst (the
// issue's case: limit 600 per minute, a burst of 100 on one limiter, then
// steady traffic over three) over-counts the cell by at most
// max(1% of the limit, 200ms of that limiter's traffic).
func TestAKillAfterABurstOverCountsWithinTheBound(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	q := query("burst-kill", 600, 1)
	victim := r.svcs[0]
	var mu sync.Mutex
	admitted := int64(0)
	count := func(d window.Decision) {
		if d.Admitted {
			mu.Lock()
			admitted++
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	r.do(func() {
		for range 100 {
			wg.Go(func() { count(mustCheck(t, victim, q)) })
		}
		wg.Wait()
	})
	// Steady: 60 checks a second over the three, for two seconds.
	for i := range 120 {
		s := r.svcs[i%3]
		r.do(func() { count(mustCheck(t, s, q)) })
		r.tick(50 * time.Millisecond)
	}
	victimRate := 20.0 // checks a second on the killed limiter
	r.svcs = r.svcs[1:]
	victim.stopOnce.Do(func() { close(victim.stop) }) // SIGKILL
	r.tick(1500 * time.Millisecond)                   // its lease ends at the origin
	c := counts(t, r.mem, cellOf(q, r.clk.ms.Load()))
	bound := max((q.Limit+99)/100, int64(victimRate*0.2+0.999))
	t.Logf("admitted %d, origin count %d: over by %d (bound %d)", admitted, c.Used, c.Used-admitted, bound)
	if c.Used < admitted || c.Used > admitted+bound {
		t.Fatalf("origin count %d, admitted %d: over by %d, bound %d", c.Used, admitted, c.Used-admitted, bound)
	}
}

// localPeers hands a limiter's local counts to the region's other
// limiters, as the NATS link does (link.Global).
type localPeers struct{ to []*Service }

func (p *localPeers) PublishLocal(c window.Cell, id string, count, expireAt int64) {
	for _, s := range p.to {
		s.ApplyLocals([]global.Component{{Cell: c, Region: id, Count: count, ExpireAt: expireAt}}, 0)
	}
}

// A limiter that admitted while the origin failed and died before it
// could report loses nothing: its local count went to the other limiter
// before each decision was returned, and that one raises the origin to it
// once the origin answers. And when it lives on, its own report and the
// other limiter's raise tell the same admissions twice: counted once,
// whichever comes first.
func TestLocalAdmissionsSurviveTheLimiterThatMadeThem(t *testing.T) {
	for _, tc := range []struct {
		name string
		// survives: a reports itself once the origin answers; first: its
		// report comes before b's raise.
		survives, first bool
	}{
		{name: "killed"},
		{name: "alive, reporting first", survives: true, first: true},
		{name: "alive, reporting after the raise", survives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock(t0)
			mem := regiontest.NewMemory(clk.Now)
			down := &failingOrigin{Memory: mem}
			b := start(Config{Now: clk.Now, Origin: mem, ID: "b"}, false)
			a := start(Config{Now: clk.Now, Origin: down, ID: "a", Locals: &localPeers{to: []*Service{b}}}, false)
			t.Cleanup(func() {
				// a's origin may still fail ("killed"): its Close gives up.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_ = a.Close(ctx)
				_ = b.Close(context.Background())
			})
			q := query("local-"+strings.ReplaceAll(tc.name, " ", "-"), 1000, 1)
			tick := func(ss ...*Service) {
				for range 200 {
					clk.Advance(10 * time.Millisecond)
					for _, s := range ss {
						s.syncers.Wait()
						s.settleTick()
					}
				}
			}
			for range 100 {
				mustCheck(t, a, q)
			}
			tick(a, b) // everything reported, leases back
			down.fail.Store(true)
			for range 50 {
				if !mustCheck(t, a, q).Admitted {
					t.Fatal("denied while the origin is down")
				}
			}
			if a.Stats().AdmittedLocally != 50 {
				t.Fatalf("a admitted %d locally, want 50", a.Stats().AdmittedLocally)
			}
			if got := b.Stats().LocalsWaiting; got != 1 {
				t.Fatalf("b holds %d local counts of a, want 1", got)
			}
			cell := cellOf(q, clk.ms.Load())
			if c := counts(t, mem, cell); c.Used != 100 {
				t.Fatalf("the origin counts %d while down, want the 100 it saw", c.Used)
			}
			if tc.survives {
				down.fail.Store(false)
				if tc.first {
					tick(a)
				}
			}
			tick(b)
			if tc.survives {
				tick(a, b)
			}
			if c := counts(t, mem, cell); c.Used != 150 || c.Charged != 150 {
				t.Fatalf("the origin counts %d used, %d charged; the region admitted 150", c.Used, c.Charged)
			}
			if st := b.Stats(); st.LocalsWaiting != 0 || st.LocalsRaised == 0 {
				t.Fatalf("b raised %d local counts and holds %d, want them raised and none held", st.LocalsRaised, st.LocalsWaiting)
			}
			// A look through b, and the count it holds, agree.
			d, err := b.Check(context.Background(), Query{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier,
				Limit: q.Limit, Duration: q.Duration, Cost: 0})
			if err != nil {
				t.Fatal(err)
			}
			if used := q.Limit - d.Remaining; used != 150 {
				t.Fatalf("a look through b says %d used, want 150", used)
			}
		})
	}
}

// delayedOrigin answers the request path's syncs after delay: a Redis
// that answers, later than a check waits.
type delayedOrigin struct {
	*regiontest.Memory
	delay time.Duration
}

func (o *delayedOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	select {
	case <-time.After(o.delay):
	case <-ctx.Done():
		return region.SyncResult{}, ctx.Err()
	}
	return o.Memory.Sync(ctx, reporter, s)
}

// At the default ReadTimeout (250ms) an origin that answers in 60ms, as a
// loaded Redis does, decides the check, and the breaker stays closed even
// at one failure to open: checks are never decided from this process's
// counts while the origin answers. One that does not answer within
// ReadTimeout has failed: its check is denied (the call may still land)
// and the breaker counts it.
func TestASlowOriginDecidesAndOnlyAnUnansweredCallOpensTheBreaker(t *testing.T) {
	mem := regiontest.NewMemory(nil)
	slow := &delayedOrigin{Memory: mem, delay: 60 * time.Millisecond}
	bk := region.NewBreaker(slow, region.BreakerConfig{Failures: 1})
	s := New(Config{Origin: bk})
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	q := query("slow-origin", 1000, 1)
	for i := range 3 {
		q.Identifier = fmt.Sprint("slow-origin-", i) // cold: each asks the origin
		d, err := s.Check(context.Background(), q)
		if err != nil || !d.Admitted {
			t.Fatalf("a check on an origin 60ms away: %+v, %v; want admitted by it", d, err)
		}
	}
	if st := bk.State(region.CallRead); st != gobreaker.StateClosed {
		t.Fatalf("the read breaker is %v with an origin that answers, want closed", st)
	}
	if st := s.Stats(); st.LateCalls != 0 || st.OriginSyncErrors != 0 || st.AdmittedLocally != 0 || st.OriginRequests != 3 {
		t.Fatalf("late %d, errors %d, local %d, decided by the origin %d: want 0, 0, 0, 3",
			st.LateCalls, st.OriginSyncErrors, st.AdmittedLocally, st.OriginRequests)
	}

	slow.delay = 2 * s.cfg.ReadTimeout
	q.Identifier = "slow-origin-unanswered"
	d, err := s.Check(context.Background(), q)
	if err != nil || d.Admitted {
		t.Fatalf("a check whose call went unanswered: %+v, %v; want denied", d, err)
	}
	if st := s.Stats(); st.LateCalls != 1 || st.AdmittedLocally != 0 {
		t.Fatalf("late %d, local %d: want 1, 0", st.LateCalls, st.AdmittedLocally)
	}
	if st := bk.State(region.CallRead); st != gobreaker.StateOpen {
		t.Fatalf("the read breaker is %v after an unanswered call (one failure opens it), want open", st)
	}
}
