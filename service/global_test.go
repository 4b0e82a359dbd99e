package service

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/window"
)

// recordingSink records what the service publishes: a test seam standing
// for the NATS link, not for a server.
type recordingSink struct {
	mu    sync.Mutex
	comps []global.Component
}

func (r *recordingSink) Publish(cs []global.Component) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.comps = append(r.comps, cs...)
	return nil
}

func (r *recordingSink) take() []global.Component {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs := r.comps
	r.comps = nil
	return cs
}

func newGlobalService(t *testing.T, clk *manualClock) (*Service, *recordingSink) {
	sink := &recordingSink{}
	s := newService(t, Config{Now: clk.Now, Region: "eu", Global: sink, PublishInterval: time.Hour})
	return s, sink
}

func gcell(id string) window.Cell {
	return window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 60_000, Sequence: t0 / 60_000}
}

func TestRegionalCountIsPublishedEveryPercentOfTheLimit(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	for range 9 {
		mustCheck(t, s, query("alice", 1000, 1))
	}
	s.publish()
	if cs := sink.take(); len(cs) != 0 {
		t.Fatalf("published %+v after growth under 1%% of the limit", cs)
	}
	mustCheck(t, s, query("alice", 1000, 1))
	s.publish()
	cs := sink.take()
	if len(cs) != 1 || cs[0].Count != 10 || cs[0].Region != "eu" || cs[0].Cell != gcell("alice") {
		t.Fatalf("published %+v, want alice's 10 from eu", cs)
	}
	if want := gcell("alice").Expiry(60_000); cs[0].ExpireAt != want {
		t.Fatalf("expiry %d, want %d", cs[0].ExpireAt, want)
	}
	s.publish()
	if cs := sink.take(); len(cs) != 0 {
		t.Fatalf("published %+v without growth", cs)
	}
	// A cell another region shares publishes every growth.
	s.ApplyImports([]global.Import{{Cell: gcell("alice"), Foreign: 100}}, 0)
	mustCheck(t, s, query("alice", 1000, 1))
	s.publish()
	if cs := sink.take(); len(cs) != 1 || cs[0].Count != 11 {
		t.Fatalf("shared cell published %+v, want its regional 11 (never the import)", cs)
	}
}

func TestImportsCountInDecisionsButAreNeverPublished(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	s.ApplyImports([]global.Import{{Cell: gcell("bob"), Foreign: 7, Own: 2}}, 0)
	d := mustCheck(t, s, query("bob", 10, 1))
	if !d.Admitted || d.Remaining != 0 {
		t.Fatalf("check with 7 foreign and 2 own = %+v, want admitted with 0 remaining", d)
	}
	if d := mustCheck(t, s, query("bob", 10, 1)); d.Admitted {
		t.Fatalf("check past the global limit admitted: %+v", d)
	}
	s.publish()
	cs := sink.take()
	if len(cs) != 1 || cs[0].Count != 3 {
		t.Fatalf("published %+v, want the regional 3 (own 2 + 1), not the foreign 7", cs)
	}
	// Stale or smaller imports never lower anything.
	s.ApplyImports([]global.Import{{Cell: gcell("bob"), Foreign: 1}}, 0)
	if d := mustCheck(t, s, query("bob", 10, 0)); d.Remaining != 0 {
		t.Fatalf("a smaller import lowered usage: %+v", d)
	}
	// Imports for long-gone windows are ignored.
	old := gcell("carol")
	old.Sequence -= 5
	s.ApplyImports([]global.Import{{Cell: old, Foreign: 1000}}, 0)
	if d := mustCheck(t, s, query("carol", 10, 0)); d.Remaining != 10 {
		t.Fatalf("an import for an old window counted: %+v", d)
	}
}

// A cell's first denial publishes its component at once, however little
// it grew since it was last published, when the sliding usage before the
// request's cost is at least half the limit (the boundary: 5 of 10 is
// published, 4 of 10 is not). The cells are admitted under a limit of 1000
// (1% of it: 10, more than they grow) and denied under one of 10, as after
// an override lowered it.
func TestDenialIsPublishedFromHalfTheLimitWithTheRegionsCount(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	for range 5 {
		mustCheck(t, s, query("dave", 1000, 1))
	}
	s.publish()
	if cs := sink.take(); len(cs) != 0 {
		t.Fatalf("published %+v after growth under 1%% of the limit", cs)
	}
	if d := mustCheck(t, s, query("dave", 10, 6)); d.Admitted {
		t.Fatalf("cost 6 on 5 of 10 admitted: %+v", d)
	}
	mustCheck(t, s, query("dave", 10, 6)) // the second denial is not published again
	s.publish()
	cs := sink.take()
	if len(cs) != 1 || cs[0].Cell != gcell("dave") || cs[0].Count != 5 || cs[0].Region != "eu" {
		t.Fatalf("published %+v, want dave's component carrying 5", cs)
	}
	// 4 of 10 used: below half, not published; nor one oversized request on
	// a fresh identifier.
	for range 4 {
		mustCheck(t, s, query("erin", 1000, 1))
	}
	if d := mustCheck(t, s, query("erin", 10, 7)); d.Admitted {
		t.Fatalf("cost 7 on 4 of 10 admitted: %+v", d)
	}
	mustCheck(t, s, query("fred", 10, 11))
	s.publish()
	if cs := sink.take(); len(cs) != 0 {
		t.Fatalf("denials below half the limit were published: %+v", cs)
	}
	// A denial caused only by the previous window's weight: the region holds
	// nothing of the new cell.
	clk.Advance(60 * time.Second)
	if d := mustCheck(t, s, query("dave", 10, 6)); d.Admitted {
		t.Fatalf("admitted under the previous window's weight: %+v", d)
	}
	s.publish()
	if cs := sink.take(); len(cs) != 0 {
		t.Fatalf("a denial of an empty cell was published: %+v", cs)
	}
}

// Another region's usage, arriving as foreign usage, makes this region decide the same requests as that region
// would: denied at cost 6 and admitted at cost 5 on 5 of 10 used elsewhere,
// and what this region then admits adds to it.
func TestForeignUsageCountsWithOwnAdmissions(t *testing.T) {
	clk := newClock(t0)
	s, _ := newGlobalService(t, clk)
	s.ApplyImports([]global.Import{{Cell: gcell("gus"), Foreign: 5, ExpireAt: gcell("gus").Expiry(0)}}, 0)
	if d := mustCheck(t, s, query("gus", 10, 6)); d.Admitted || d.Remaining != 5 {
		t.Fatalf("cost 6 on 5 of 10 used elsewhere: %+v, want denied with 5 remaining", d)
	}
	if d := mustCheck(t, s, query("gus", 10, 5)); !d.Admitted || d.Remaining != 0 {
		t.Fatalf("cost 5 on 5 of 10 used elsewhere: %+v, want admitted with 0 remaining", d)
	}
	if d := mustCheck(t, s, query("gus", 10, 1)); d.Admitted {
		t.Fatalf("admitted past the limit of foreign and own usage together: %+v", d)
	}
	// The next window still feels the whole cell through the previous weight.
	clk.Advance(60 * time.Second)
	if d := mustCheck(t, s, query("gus", 10, 1)); d.Admitted {
		t.Fatalf("the window after a full cell admitted at once: %+v", d)
	}
}

// An import for the window after the local one (the bridge's or another
// region's clock is ahead, within the tolerance) never moves a local
// window: checks stay in the window of this process's clock, and the import
// counts once that clock reaches its window.
func TestImportsForALaterWindowWaitForTheLocalClock(t *testing.T) {
	clk := newClock(t0 + 58_000) // 2s before the end of a 1-minute window
	s, _ := newGlobalService(t, clk)
	next := gcell("gina")
	next.Sequence++
	s.ApplyImports([]global.Import{{Cell: next, Foreign: 7, ExpireAt: next.Expiry(60_000)}}, clk.Now().UnixMilli())
	d := mustCheck(t, s, query("gina", 10, 1))
	if want := t0 + 60_000; d.Reset != want || !d.Admitted || d.Remaining != 9 {
		t.Fatalf("check after an import for the next window: %+v, want reset %d (the local window), 9 remaining", d, want)
	}
	clk.Advance(3 * time.Second) // now in the next window
	d = mustCheck(t, s, query("gina", 10, 1))
	// 7 foreign + 1 now, and 1 from the previous window weighted 59/60.
	if d.Reset != t0+120_000 || d.Remaining != 1 {
		t.Fatalf("check in the next window: %+v, want the waiting import counted (remaining 1)", d)
	}
	if n := s.Stats().ImportsRefused; n != 0 {
		t.Fatalf("%d imports refused, want none", n)
	}
}

// Imports that no clock within the tolerance could produce are refused and
// counted: a window further ahead, a sequence whose instants overflow, a
// message stamped far from the local clock. Counts at the top of the range
// saturate: the cell denies, never wraps into admitting.
func TestImportsOutsideTheBoundsAreRefusedAndSumsSaturate(t *testing.T) {
	clk := newClock(t0 + 30_000)
	s, _ := newGlobalService(t, clk)
	now := clk.Now().UnixMilli()
	ahead := gcell("hank")
	ahead.Sequence++ // starts 30s from now, beyond the 3s tolerance
	far, overflow := gcell("hank"), gcell("hank")
	far.Sequence = math.MaxInt64 / far.Duration        // its instants are at the end of int64
	overflow.Sequence = math.MaxInt64/far.Duration + 1 // sequence × duration overflows
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ApplyImports([]global.Import{
			{Cell: ahead, Foreign: 5, ExpireAt: ahead.Expiry(0)},
			{Cell: far, Foreign: 5},
			{Cell: overflow, Foreign: 5},
			{Cell: gcell("hank"), Foreign: -1},
		}, now)
		s.ApplyImports([]global.Import{{Cell: gcell("hank"), Foreign: 5}}, now+10_000)
		if d := mustCheck(t, s, query("hank", 10, 1)); d.Reset != t0+60_000 || d.Remaining != 9 {
			t.Errorf("check after refused imports: %+v, want the local window untouched", d)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a check after an import of an overflowing sequence did not return")
	}
	refused := map[string]int64{}
	for r, n := range s.Refused() {
		refused[r.Reason] += n
	}
	if refused["future_window"] != 1 || refused["invalid"] != 3 || refused["clock_skew"] != 1 {
		t.Fatalf("refused %v, want 1 future_window, 3 invalid, 1 clock_skew", refused)
	}
	// Own and foreign counts at MaxCount: their sum saturates and denies.
	s.ApplyImports([]global.Import{{Cell: gcell("ivy"), Foreign: window.MaxCount, Own: window.MaxCount,
		ExpireAt: gcell("ivy").Expiry(0)}}, now)
	if d := mustCheck(t, s, query("ivy", window.MaxLimit, 1)); d.Admitted {
		t.Fatalf("a cell at the top of the count range admitted: %+v", d)
	}
}

// With an origin, a limiter holds what it serves: imports for cells it does
// not hold create nothing, and are stored in the origin, from which a cell
// created later reads the other regions' usage (and the own lower bound)
// with its totals. Imports for cells it holds apply at once.
func TestImportsForCellsNotHeldGoToTheOriginAndHydrateNewCells(t *testing.T) {
	clk := newClock(t0)
	origin := regiontest.NewMemory(clk.Now)
	s := newService(t, Config{Now: clk.Now, Region: "eu", Global: &recordingSink{}, PublishInterval: time.Hour, Origin: origin})
	now := clk.Now().UnixMilli()

	mustCheck(t, s, query("held", 10, 1))
	var is []global.Import
	for i := range 1000 {
		c := gcell(fmt.Sprint("elsewhere-", i))
		is = append(is, global.Import{Cell: c, Foreign: 8, ExpireAt: c.Expiry(60_000)})
	}
	is = append(is, global.Import{Cell: gcell("held"), Foreign: 6, ExpireAt: gcell("held").Expiry(60_000)})
	s.ApplyImports(is, now)
	if err := s.StoreImports(t.Context(), is, now); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().Cells; n != 1 {
		t.Fatalf("the limiter holds %d cells after imports for 1000 it never served, want its 1", n)
	}
	if d := mustCheck(t, s, query("held", 10, 0)); d.Remaining != 3 {
		t.Fatalf("held cell after an import of 6 foreign: %+v, want 3 remaining (10 - 6 - 1)", d)
	}
	// A cell created now starts from the global view the origin keeps.
	if d := mustCheck(t, s, query("elsewhere-7", 10, 1)); !d.Admitted || d.Remaining != 1 {
		t.Fatalf("first check of a cell used elsewhere: %+v, want admitted with 1 remaining (10 - 8 - 1)", d)
	}
	if d := mustCheck(t, s, query("elsewhere-7", 10, 2)); d.Admitted {
		t.Fatalf("cost 2 on 9 of 10 admitted: %+v", d)
	}
	if got := s.Stats().ImportsStored; got != 1001 {
		t.Fatalf("%d imports stored, want 1001", got)
	}
}

// The cost of one import entry at a limiter: applied to a cell it holds,
// passed over for one it does not, and stored in an in-memory origin (with
// Redis, the Redis script's cost comes on top: region's BenchmarkRedisImport).
func BenchmarkApplyImports(b *testing.B) {
	const n = 1000
	for _, held := range []bool{true, false} {
		name := "not-held"
		if held {
			name = "held"
		}
		b.Run(name, func(b *testing.B) {
			clk := newClock(t0)
			s := New(Config{Now: clk.Now, Region: "eu", Global: &recordingSink{}, PublishInterval: time.Hour, Origin: regiontest.NewMemory(clk.Now), FreshFor: time.Hour})
			defer s.Close(context.Background())
			is := make([]global.Import, n)
			for i := range is {
				c := gcell(fmt.Sprint("id-", i))
				is[i] = global.Import{Cell: c, Foreign: int64(i), ExpireAt: c.Expiry(60_000)}
				if held {
					if _, err := s.Check(context.Background(), query(c.Identifier, 1000, 1)); err != nil {
						b.Fatal(err)
					}
				}
			}
			now := clk.Now().UnixMilli()
			b.ReportAllocs()
			for b.Loop() {
				s.ApplyImports(is, now)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/import")
		})
	}
	b.Run("store-in-memory-origin", func(b *testing.B) {
		clk := newClock(t0)
		s := New(Config{Now: clk.Now, Region: "eu", Global: &recordingSink{}, PublishInterval: time.Hour, Origin: regiontest.NewMemory(clk.Now)})
		defer s.Close(context.Background())
		is := make([]global.Import, n)
		for i := range is {
			c := gcell(fmt.Sprint("id-", i))
			is[i] = global.Import{Cell: c, Foreign: int64(i + 1), ExpireAt: c.Expiry(60_000)}
		}
		now := clk.Now().UnixMilli()
		b.ReportAllocs()
		for b.Loop() {
			if err := s.StoreImports(context.Background(), is, now); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/import")
	})
}
