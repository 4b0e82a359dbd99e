package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// A reset of every duration reaches the identifier's bucket of each
// duration the limiter holds, applied here or received from elsewhere, and
// no other identifier's, both while the table indexes its durations and
// once it has seen more than it indexes (it walks the table then).
func TestAResetOfEveryDurationReachesEachDuration(t *testing.T) {
	for _, n := range []int{3, maxDurations + 6} {
		t.Run(fmt.Sprint(n, " durations"), func(t *testing.T) {
			clk := newClock(t0 + 30_000)
			s := newService(t, Config{Now: clk.Now})
			qs := make([]Query, n)
			for i := range qs {
				qs[i] = query("alice", 3, 1)
				qs[i].Duration = int64(1000 * (i + 2))
				exhaust(t, qs[i], s)
			}
			bob := query("bob", 3, 1)
			exhaust(t, bob, s)
			if _, many := s.table.durations(); many == (n > maxDurations) {
				t.Fatalf("with %d durations the index says it holds them: %v", n, many)
			}

			apply := func(reset func()) {
				t.Helper()
				reset()
				for _, q := range qs {
					if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != 2 {
						t.Fatalf("duration %d after a reset of every duration: %+v, want admitted from zero", q.Duration, d)
					}
					exhaust(t, q, s)
				}
				if d := mustCheck(t, s, bob); d.Admitted {
					t.Fatalf("another identifier was reset: %+v", d)
				}
			}
			apply(func() {
				if _, err := s.Reset("ws", "ns", "alice", policy.AllDurations); err != nil {
					t.Fatal(err)
				}
			})
			clk.Advance(time.Millisecond) // a later epoch
			apply(func() {
				m := policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "alice", Duration: policy.AllDurations, Epoch: clk.Now().UnixMilli()}
				if n, err := s.ApplyMarks(m); err != nil || n != 1 {
					t.Fatalf("apply a mark from elsewhere: %d, %v", n, err)
				}
			})
		})
	}
}

// What a reset of every duration costs the limiter, with 1,000 and 100,000
// identifiers held: it follows the identifier's buckets, not the table.
func BenchmarkResetEveryDuration(b *testing.B) {
	for _, held := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(held, " held"), func(b *testing.B) {
			clk := newClock(t0 + 30_000)
			s := newService(b, Config{Now: clk.Now})
			for i := range held {
				for _, d := range []int64{1000, 60_000} {
					q := query(fmt.Sprint("id-", i), 100, 1)
					q.Duration = d
					mustCheck(b, s, q)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := s.Reset("ws", "ns", fmt.Sprint("id-", i%held), policy.AllDurations); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A reset of every duration ends as such after minutes; the durations whose
// cells of the identifier this limiter holds, and that the reset still
// concerns, keep it as marks of their own (returned for the bridge), so
// the identifier's long window stays reset while its short one, long done
// with the reset, keeps nothing. So with the table's index of durations
// and past it (a walk of the table).
func TestAnExpiredResetOfEveryDurationStaysForTheDurationsHeld(t *testing.T) {
	const day = 86_400_000
	for _, extra := range []int{0, maxDurations + 2} {
		t.Run(fmt.Sprint(extra, " other durations"), func(t *testing.T) {
			clk := newClock(t0 + 30_000)
			s := newService(t, Config{Now: clk.Now})
			for i := range extra {
				q := query("other", 3, 1)
				q.Duration = int64(1000 * (i + 2))
				mustCheck(t, s, q)
			}
			long, short := query("alice", 3, 1), query("alice", 3, 1)
			long.Duration, short.Duration = day, 1000
			exhaust(t, long, s)
			exhaust(t, short, s)
			m, err := s.Reset("ws", "ns", "alice", policy.AllDurations)
			if err != nil {
				t.Fatal(err)
			}
			mustCheck(t, s, long) // one after the reset: 2 left
			clk.Advance(time.Duration(m.ExpireAt(s.cfg.ExpiryGrace.Milliseconds())-clk.Now().UnixMilli()) * time.Millisecond)
			kept := s.PruneMarks(clk.Now().UnixMilli(), s.cfg.ExpiryGrace.Milliseconds())
			want := policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "alice", Duration: day, Epoch: m.Epoch}
			if len(kept) != 1 || kept[0] != want {
				t.Fatalf("kept %+v, want %+v", kept, want)
			}
			if got := s.Marks().All(); len(got) != 1 || got[0] != want {
				t.Fatalf("marks %+v, want %+v", got, want)
			}
			// The day's window still counts from the reset: one admitted
			// after it, two left.
			if d := mustCheck(t, s, long); !d.Admitted || d.Remaining != 1 {
				t.Fatalf("the long window after the reset of every duration expired: %+v, want admitted, 1 left", d)
			}
		})
	}
}

// Resets of distinct identifiers at a support tool's pace (200,000 over an
// hour, 55 a second) are all accepted and applied: marks of every duration
// end within minutes, so the marks held follow the rate of resets, never
// their total, and stay far below MaxMarksPerWorkspace.
func TestTwoHundredThousandResetsInAnHourAreAllAccepted(t *testing.T) {
	clk := newClock(t0)
	s := newService(t, Config{Now: clk.Now})
	const n = 200_000
	step := time.Hour / n
	grace := s.cfg.ExpiryGrace.Milliseconds()
	most := 0
	for i := range n {
		id := fmt.Sprint("user-", i)
		if i%1000 == 0 {
			q := query(id, 3, 1)
			exhaust(t, q, s)
		}
		if _, err := s.Reset("ws", "ns", id, policy.AllDurations); err != nil {
			t.Fatalf("reset %d: %v", i, err)
		}
		if i%1000 == 0 {
			if d := mustCheck(t, s, query(id, 3, 1)); !d.Admitted || d.Remaining != 2 {
				t.Fatalf("reset %d not applied: %+v", i, d)
			}
		}
		clk.Advance(step)
		if i%500 == 0 {
			s.PruneMarks(clk.Now().UnixMilli(), grace)
			most = max(most, s.Marks().Len("ws"))
		}
	}
	if most > n/4 || most > policy.MaxMarksPerWorkspace/2 {
		t.Fatalf("up to %d marks held, want the last 10 minutes' resets at most", most)
	}
	t.Logf("marks held at most: %d of %d resets", most, n)
}

// The cost of a reset of every duration with few and with many marks held
// (90,000 identifiers reset already): a reset costs the buckets it
// touches, not the marks held. The resets go to 9,000 identifiers in turn
// (new marks, then raised ones), so the workspace stays within
// MaxMarksPerWorkspace however long it runs.
func BenchmarkResetOfEveryDuration(b *testing.B) {
	for _, held := range []int{0, 90_000} {
		b.Run(fmt.Sprint("held=", held), func(b *testing.B) {
			clk := newClock(t0)
			s := newService(b, Config{Now: clk.Now})
			for i := range held {
				if _, err := s.Reset("ws", "ns", fmt.Sprint("held-", i), policy.AllDurations); err != nil {
					b.Fatal(err)
				}
			}
			mustCheck(b, s, query("warm", 1000, 1))
			ids := make([]string, 9_000)
			for i := range ids {
				ids[i] = fmt.Sprint("user-", i)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := s.Reset("ws", "ns", ids[i%len(ids)], policy.AllDurations); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
