package service

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// exhaust checks q (cost 1) on the services in turn until each denies it,
// and returns how many were admitted.
func exhaust(t *testing.T, q Query, svcs ...*Service) int64 {
	t.Helper()
	var admitted int64
	for i := range 10 * q.Limit {
		d, err := svcs[int(i)%len(svcs)].Check(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted++
		}
	}
	for _, s := range svcs {
		if d := mustCheck(t, s, q); d.Admitted {
			t.Fatalf("%+v admitted after the limit was spent: %+v", q, d)
		}
	}
	return admitted
}

// A reset forgets the identifier's usage in the current and the previous
// window: the checks after it start from zero. A reset of one duration
// leaves the identifier's other durations as they were, and other
// identifiers too.
func TestResetForgetsTheCurrentAndPreviousWindow(t *testing.T) {
	clk := newClock(t0 + 30_000)
	s := newService(t, Config{Now: clk.Now})
	minute, second := query("alice", 10, 1), query("alice", 4, 1)
	second.Duration = 1000
	other := query("bob", 10, 1)
	exhaust(t, minute, s)
	clk.Advance(time.Minute) // the next window, half way: half of the previous one weighs
	if got := exhaust(t, minute, s); got != 5 {
		t.Fatalf("admitted %d in the second window, want 5 (half the previous weighs)", got)
	}
	exhaust(t, second, s)
	exhaust(t, other, s)

	m, err := s.Reset("ws", "ns", "alice", 60_000)
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != clk.ms.Load() || m.Duration != 60_000 {
		t.Fatalf("mark %+v, want epoch %d of duration 60000", m, clk.ms.Load())
	}
	if d := mustCheck(t, s, minute); !d.Admitted || d.Remaining != 9 {
		t.Fatalf("first check after the reset: %+v, want admitted with 9 remaining (nothing before counts)", d)
	}
	if got := exhaust(t, minute, s); got != 9 {
		t.Fatalf("admitted %d more after the reset, want 9", got)
	}
	if d := mustCheck(t, s, second); d.Admitted {
		t.Fatalf("a reset of the minute freed the second: %+v", d)
	}
	if d := mustCheck(t, s, other); d.Admitted {
		t.Fatalf("a reset of alice freed bob: %+v", d)
	}

	// The next window: the previous one is the reset's, which holds only
	// what came after the reset (10, weighing 10·(60−10)/60 at 10s).
	clk.Advance(40 * time.Second)
	if got := exhaust(t, minute, s); got != 1 {
		t.Fatalf("admitted %d in the window after the reset's, want 1 (10 after the reset weigh 8.33)", got)
	}

	// A reset of every duration frees the second as well.
	if _, err := s.Reset("ws", "ns", "alice", policy.AllDurations); err != nil {
		t.Fatal(err)
	}
	for _, q := range []Query{minute, second} {
		if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != q.Limit-1 {
			t.Fatalf("%+v after a reset of every duration: %+v", q, d)
		}
	}
}

// A reset refused (invalid) changes nothing; one of a bucket not held yet
// applies to the cells made after it, as a mark merged from elsewhere does.
func TestResetOfAnIdentifierNotHeldAppliesWhenItsCellsAreMade(t *testing.T) {
	clk := newClock(t0)
	marks := policy.NewMarks()
	s := newService(t, Config{Now: clk.Now, Marks: marks})
	if _, err := s.Reset("ws", "ns", "", 0); !errors.Is(err, policy.ErrInvalid) {
		t.Fatalf("reset of an empty identifier: %v, want ErrInvalid", err)
	}
	if _, err := s.ApplyMarks(policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "carol", Epoch: t0 + 5}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Millisecond)
	q := query("carol", 3, 1)
	exhaust(t, q, s)
	b := s.table.load(q.key())
	if c := b.peek(t0 / 60_000); c == nil || c.epoch != t0+5 {
		t.Fatalf("cell of the reset's window: %+v, want epoch %d", c, t0+5)
	}
	if c := b.peek(t0/60_000 - 1); c == nil || c.epoch != t0+5 {
		t.Fatalf("previous cell: %+v, want epoch %d", c, t0+5)
	}
	clk.Advance(time.Minute)
	if c, _ := b.cellFor(t0/60_000 + 1); c.epoch != 0 {
		t.Fatalf("the window after the reset's has epoch %d, want 0", c.epoch)
	}
}

// Two limiters sharing an origin: the identifier exhausted over both, one
// resets it, the other learns the mark (as its bridge will carry it): both
// admit again, exactly the limit between them, in the reset's window and
// the previous one. The origin still holds the usage before the reset under
// the cells of epoch 0, which no decision reads again, and a limiter
// started afresh with the marks admits from zero too.
func TestResetOverLimitersSharingAnOrigin(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		clk := newClock(t0 + 30_000)
		testResetOverLimiters(t, clk, regiontest.NewMemory(clk.Now))
	})
	t.Run("redis", func(t *testing.T) {
		url := redistest.SharedURL(t)
		// Windows near the real clock: Redis expires cells by it.
		clk := newClock(time.Now().UnixMilli()/60_000*60_000 - 30_000)
		prefix := redistest.Prefix(t)
		open := func() lookingOrigin {
			r, err := region.NewRedis(region.RedisConfig{URL: url, KeyPrefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		testResetOverLimiters(t, clk, open(), open(), open(), open())
	})
}

// lookingOrigin is an origin a test can also look at without a sync:
// (*region.Redis).Read and internal/regiontest's Memory.Read.
type lookingOrigin interface {
	region.Origin
	Read(ctx context.Context, c window.Cell) (current, previous region.Totals, err error)
}

func testResetOverLimiters(t *testing.T, clk *manualClock, origins ...lookingOrigin) {
	originAt := func(i int) lookingOrigin { return origins[min(i, len(origins)-1)] }
	start := func(i int, marks *policy.Marks) *Service {
		s := New(Config{Now: clk.Now, Origin: originAt(i), ID: fmt.Sprint("lim", i), Marks: marks})
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	a, b := start(0, nil), start(1, nil)
	q := query("dave", 10, 1)
	q.Duration = 60_000
	if got := exhaust(t, q, a, b); got != 10 {
		t.Fatalf("admitted %d in the first window, want 10", got)
	}
	clk.Advance(time.Minute)
	if got := exhaust(t, q, a, b); got != 5 {
		t.Fatalf("admitted %d in the second window, want 5", got)
	}
	m, err := a.Reset(q.Workspace, q.Namespace, q.Identifier, policy.AllDurations)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ApplyMarks(m); err != nil {
		t.Fatal(err)
	}
	if got := exhaust(t, q, b, a); got != 10 {
		t.Fatalf("admitted %d over both after the reset, want 10", got)
	}
	// What the origin holds of the cells before the reset is untouched.
	seq := clk.ms.Load() / q.Duration
	old := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration, Sequence: seq}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, prev, err := originAt(2).Read(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Count != 5 || prev.Count != 10 {
		t.Fatalf("origin holds %d and %d in the cells of epoch 0, want 5 and 10 (untouched)", cur.Count, prev.Count)
	}
	reset := old
	reset.Epoch = m.Epoch
	if cur, prev, err := originAt(2).Read(ctx, reset); err != nil || cur.Count != 10 || prev.Count != 0 {
		t.Fatalf("origin holds %+v and %+v in the cells of the reset's epoch, %v; want 10 and 0", cur, prev, err)
	}

	// Limiters started afresh (their marks from the bridge): usage before
	// the reset does not come back.
	marks := policy.NewMarks()
	if _, err := marks.Merge(m); err != nil {
		t.Fatal(err)
	}
	c := start(2, marks)
	if d := mustCheck(t, c, q); d.Admitted {
		t.Fatalf("a new limiter admitted what the reset's cell has spent: %+v", d)
	}
	clk.Advance(time.Minute) // the next window: the reset's weighs 10·30/60
	d := start(3, marks)
	if got := exhaust(t, q, d, c); got != 5 {
		t.Fatalf("admitted %d in the window after the reset's, want 5", got)
	}
}

// The lease a limiter held in a cell the reset forgot goes back to the
// origin with the next settle round, and the strict deadline and firm
// counts of the identifier go with the forgotten usage.
func TestResetGivesTheForgottenCellsLeaseBack(t *testing.T) {
	// A long LeaseAhead: the lease is warmed while the clock stands still.
	r := newTestRegion(t, 1, Config{LeaseAhead: time.Hour})
	s := r.svcs[0]
	q := query("erin", 1_000_000, 1)
	warmLease(t, s, q)
	old := cellOf(q, r.clk.ms.Load())
	if c := counts(t, r.mem, old); c.Charged <= c.Used {
		t.Fatalf("no lease charged before the reset: %+v", c)
	}
	b := s.table.load(q.key())
	b.strictUntil.Store(r.clk.ms.Load() + 60_000)
	if _, err := s.Reset(q.Workspace, q.Namespace, q.Identifier, q.Duration); err != nil {
		t.Fatal(err)
	}
	if b.strictUntil.Load() != 0 || b.firm.Load() != nil {
		t.Fatal("strict deadline or firm counts kept after the reset")
	}
	r.tick(20 * time.Millisecond)
	if c := counts(t, r.mem, old); c.Charged != c.Used {
		t.Fatalf("the forgotten cell's lease was not given back: %+v", c)
	}
	if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != q.Limit-1 {
		t.Fatalf("check after the reset: %+v", d)
	}
}

// The cells of a reset's epoch are published with it, and imports reach
// only the cell of their epoch: other regions' usage of a cell the reset
// forgot never comes back.
func TestAResetsCellsArePublishedAndImportedUnderTheirEpoch(t *testing.T) {
	clk := newClock(t0 + 30_000)
	s, sink := newGlobalService(t, clk)
	q := query("frank", 10, 5)
	old := gcell("frank")
	s.ApplyImports([]global.Import{{Cell: old, Foreign: 5, ExpireAt: old.Expiry(60_000)}}, 0)
	mustCheck(t, s, q) // 5 own + 5 foreign: the limit
	if d := mustCheck(t, s, q); d.Admitted {
		t.Fatalf("admitted beyond the limit: %+v", d)
	}
	m, err := s.Reset("ws", "ns", "frank", 0)
	if err != nil {
		t.Fatal(err)
	}
	reset := old
	reset.Epoch = m.Epoch
	// Other regions' usage of the old cell arrives again: it is dropped.
	s.ApplyImports([]global.Import{{Cell: old, Foreign: 9, ExpireAt: old.Expiry(60_000)}}, 0)
	if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != 5 {
		t.Fatalf("after the reset: %+v, want admitted with 5 left", d)
	}
	s.publish()
	cs := sink.take()
	var found bool
	for _, c := range cs {
		if c.Cell == reset {
			found = c.Count == 5
		}
	}
	if !found {
		t.Fatalf("published %+v, want the reset's cell with 5", cs)
	}
	// An import of the reset's cell is applied.
	s.ApplyImports([]global.Import{{Cell: reset, Foreign: 5, ExpireAt: reset.Expiry(60_000)}}, 0)
	if d := mustCheck(t, s, q); d.Admitted {
		t.Fatalf("the reset cell's import was not applied: %+v", d)
	}
	s.publish()
	for _, c := range sink.take() {
		if c.Cell != reset {
			t.Fatalf("published %+v after the denial, want only the reset's cell", c.Cell)
		}
	}
}
