package service

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// region3 is three limiters of one region sharing one origin and one clock,
// at default settings.
func region3(t *testing.T, clk *manualClock) ([]*Service, *region.Memory) {
	t.Helper()
	o := region.NewMemory(clk.Now)
	var ss []*Service
	for range 3 {
		ss = append(ss, newService(t, Config{Now: clk.Now, Origin: o}))
	}
	return ss, o
}

// exactAllowance is what one exact limiter admits of checks of cost 1 at
// the given instants, in order.
func exactAllowance(at []int64, limit, duration int64) int64 {
	counts := map[int64]int64{}
	var admitted int64
	for _, now := range at {
		seq := now / duration
		if window.Decide(window.Input{Now: now, Duration: duration, Limit: limit, Cost: 1,
			Current: counts[seq], Previous: counts[seq-1]}).Admitted {
			counts[seq]++
			admitted++
		}
	}
	return admitted
}

// Sparse traffic spread round robin over three limiters of a region, at
// default settings, against small and large caps of daily and minute
// windows: the region admits exactly what one exact limiter admits.
func TestRegionAdmitsExactlyNearTheLimit(t *testing.T) {
	for _, c := range []struct {
		limit, duration int64
		every           time.Duration
		checks          int
	}{
		{1, 86_400_000, time.Second, 5},
		{1, 60_000, time.Second, 130}, // across two minute boundaries
		{10, 86_400_000, 250 * time.Millisecond, 30},
		{30, 86_400_000, 250 * time.Millisecond, 60},
		{30, 60_000, 250 * time.Millisecond, 500},
		{1000, 86_400_000, 20 * time.Millisecond, 1200},
	} {
		t.Run(fmt.Sprintf("limit %d per %dms every %v", c.limit, c.duration, c.every), func(t *testing.T) {
			clk := newClock(t0)
			ss, _ := region3(t, clk)
			var admitted int64
			var at []int64
			for i := range c.checks {
				at = append(at, clk.Now().UnixMilli())
				d := mustCheck(t, ss[i%3], Query{Workspace: "ws", Namespace: "ns", Identifier: "sparse",
					Limit: c.limit, Duration: c.duration, Cost: 1})
				if d.Admitted {
					admitted++
				}
				clk.Advance(c.every)
				for _, s := range ss { // what each replay loop does within that time
					if err := s.flush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			}
			if want := exactAllowance(at, c.limit, c.duration); admitted != want {
				t.Fatalf("the region admitted %d, one exact limiter %d", admitted, want)
			}
		})
	}
}

// Far from its limit, a check is decided locally: a hot identifier with a
// huge limit never asks the origin to admit.
func TestFarFromTheLimitNothingIsAdmittedAtTheOrigin(t *testing.T) {
	clk := newClock(t0)
	ss, _ := region3(t, clk)
	for i := range 3000 {
		mustCheck(t, ss[i%3], query("hot", window.MaxLimit, 1))
		if i%100 == 0 {
			clk.Advance(10 * time.Millisecond)
		}
	}
	for i, s := range ss {
		if n := s.Stats().OriginAdmits; n != 0 {
			t.Fatalf("limiter %d asked the origin to admit %d times far from the limit", i, n)
		}
	}
}

// A limit of 1 is always near: the first admission of each limiter is
// decided by the origin, so only one of three is admitted.
func TestALimitOfOneIsDecidedByTheOrigin(t *testing.T) {
	clk := newClock(t0)
	ss, _ := region3(t, clk)
	admitted := 0
	for _, s := range ss {
		if mustCheck(t, s, query("once", 1, 1)).Admitted {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("three limiters admitted %d against a limit of 1", admitted)
	}
}

// Concurrent batches and single checks on the same cells near their limits,
// over three limiters sharing the origin: no cell ever holds more than its
// limit, and every batch is counted whole or not at all. The cells are first
// filled to 12 of 20 in a quick stream, which the limiters have replayed
// and seen: they are near their limits, so what follows is decided by the
// origin.
func TestConcurrentBatchesNearTheLimitStayAllOrNothing(t *testing.T) {
	clk := newClock(t0)
	ss, o := region3(t, clk)
	const limit = 20
	ids := []string{"p", "q", "r"}
	var (
		wg                sync.WaitGroup
		batchesOK, single atomic.Int64
		perCell           [3]atomic.Int64
	)
	for i := range 36 {
		if !mustCheck(t, ss[i%3], query(ids[i/12], limit, 1)).Admitted {
			t.Fatalf("check %d of the fill denied", i)
		}
		perCell[i/12].Add(1)
		clk.Advance(time.Millisecond)
		for _, s := range ss {
			if err := s.flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for w := range 12 {
		wg.Go(func() {
			s := ss[w%3]
			for i := range 30 {
				if w%2 == 0 {
					qs := []Query{query(ids[i%3], limit, 1), query(ids[(i+1)%3], limit, 2)}
					ok, ds, err := s.Batch(context.Background(), qs)
					if err != nil {
						t.Error(err)
						return
					}
					for _, d := range ds {
						if d.Admitted != ok {
							t.Errorf("batch %v with a decision %+v", ok, d)
						}
					}
					if ok {
						batchesOK.Add(1)
						perCell[i%3].Add(1)
						perCell[(i+1)%3].Add(2)
					}
				} else {
					d, err := s.Check(context.Background(), query(ids[i%3], limit, 1))
					if err != nil {
						t.Error(err)
						return
					}
					if d.Admitted {
						single.Add(1)
						perCell[i%3].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, s := range ss {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		cur, _, _ := o.Read(context.Background(), window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id,
			Duration: 60_000, Sequence: t0 / 60_000})
		if got := perCell[i].Load(); got > limit || cur.Count != got {
			t.Fatalf("cell %s: admitted %d (limit %d), origin holds %d", id, got, limit, cur)
		}
	}
	t.Logf("batches admitted %d, single checks %d", batchesOK.Load(), single.Load())
}

// A flood on an identifier whose limit every limiter's view shows reached
// costs the origin only the shared strict-mode reads (one per
// StrictFreshFor per limiter): such denials never go to the origin.
func TestAFloodOnADeniedIdentifierCostsOnlyTheStrictReads(t *testing.T) {
	clk := newClock(t0 + 1000)
	ss, _ := region3(t, clk)
	for i := 0; ; i++ {
		if !mustCheck(t, ss[i%3], query("flooded", 10, 1)).Admitted {
			break
		}
		clk.Advance(time.Millisecond)
		for _, s := range ss {
			if err := s.flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each limiter's next check learns the cell is full: from its strict
	// read, or, where its view still showed room, from the origin refusing
	// the admission.
	for _, s := range ss {
		if mustCheck(t, s, query("flooded", 10, 1)).Admitted {
			t.Fatal("a full cell admitted")
		}
	}
	var reads, admits [3]int64
	for i, s := range ss {
		st := s.Stats()
		reads[i], admits[i] = st.OriginReads, st.OriginAdmits
	}
	const flood, stepMs = 3000, 1 // 3000 checks over 3 seconds
	for i := range flood {
		if mustCheck(t, ss[i%3], query("flooded", 10, 1)).Admitted {
			t.Fatal("a denied identifier admitted within its window")
		}
		if i%3 == 2 {
			clk.Advance(stepMs * time.Millisecond)
		}
	}
	elapsed := int64(flood / 3 * stepMs)
	for i, s := range ss {
		st := s.Stats()
		if n := st.OriginAdmits - admits[i]; n != 0 {
			t.Fatalf("limiter %d asked the origin to decide %d denials", i, n)
		}
		// Strict mode: at most one read per StrictFreshFor (25ms), and one more.
		if n, most := st.OriginReads-reads[i], elapsed/25+1; n > most {
			t.Fatalf("limiter %d read the origin %d times in %dms of flood, want at most %d", i, n, elapsed, most)
		}
	}
}
