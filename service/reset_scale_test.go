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
