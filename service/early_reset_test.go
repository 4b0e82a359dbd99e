package service

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// Imports for a window this process's clock has not reached (the sender's
// clock is ahead) wait for their cell: the cell of their sequence and of
// their reset epoch. Here a reset accepted by a replica whose clock is ahead
// lies in the next window, so that window's cell of epoch 0 holds only
// usage before the reset, and its cell of the reset's epoch what came after.
// An early import of the forgotten cell is dropped (it neither waits nor
// merges with the reset cell's); one of the reset's cell waits and is
// applied, whichever arrives first.
func TestEarlyImportsWaitForTheCellOfTheirEpoch(t *testing.T) {
	const limit = 10
	start := func(t *testing.T) (*Service, *manualClock, global.Import, global.Import) {
		clk := newClock(t0 + 58_000) // 2s before the end of a 1-minute window
		s, _ := newGlobalService(t, clk)
		epoch := t0 + 60_500 // in the next window, 2.5s ahead: within the skew tolerance
		if _, err := s.ApplyMarks(policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "ivy", Duration: 60_000, Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		old := gcell("ivy")
		old.Sequence++ // the next window, epoch 0: usage before the reset
		reset := old
		reset.Epoch = epoch
		return s, clk, global.Import{Cell: old, Foreign: 8, ExpireAt: old.Expiry(60_000)},
			global.Import{Cell: reset, Foreign: 3, ExpireAt: reset.Expiry(60_000)}
	}
	apply := func(s *Service, clk *manualClock, is ...global.Import) {
		for _, imp := range is {
			s.ApplyImports([]global.Import{imp}, clk.Now().UnixMilli())
		}
	}
	// enter moves the clock into the next window, past the reset, and checks
	// once: the check installs the cells of that window.
	enter := func(t *testing.T, s *Service, clk *manualClock) int64 {
		t.Helper()
		clk.Advance(3 * time.Second)
		d := mustCheck(t, s, query("ivy", limit, 1))
		if !d.Admitted || d.Reset != t0+120_000 {
			t.Fatalf("check in the next window: %+v, want admitted in the window ending %d", d, t0+120_000)
		}
		return d.Remaining
	}

	t.Run("forgotten import alone", func(t *testing.T) {
		s, clk, old, _ := start(t)
		apply(s, clk, old)
		if n := s.early.n.Load(); n != 0 {
			t.Fatalf("%d imports wait after one of a cell the reset forgot, want it dropped", n)
		}
		if got := enter(t, s, clk); got != limit-1 {
			t.Fatalf("remaining %d, want %d: usage before the reset counted", got, limit-1)
		}
	})
	t.Run("forgotten import then the reset cell's", func(t *testing.T) {
		s, clk, old, reset := start(t)
		apply(s, clk, old, reset)
		if got, want := enter(t, s, clk), limit-reset.Foreign-1; got != want {
			t.Fatalf("remaining %d, want %d: the reset cell's %d foreign and 1 own (usage before the reset, %d, must not count)",
				got, want, reset.Foreign, old.Foreign)
		}
	})
	t.Run("the reset cell's import then the forgotten one", func(t *testing.T) {
		s, clk, old, reset := start(t)
		apply(s, clk, reset, old)
		if got, want := enter(t, s, clk), limit-reset.Foreign-1; got != want {
			t.Fatalf("remaining %d, want %d: the reset cell's %d foreign and 1 own (usage before the reset, %d, must not count)",
				got, want, reset.Foreign, old.Foreign)
		}
	})
	t.Run("the reset cell's import alone", func(t *testing.T) {
		s, clk, _, reset := start(t)
		apply(s, clk, reset)
		if got, want := enter(t, s, clk), limit-reset.Foreign-1; got != want {
			t.Fatalf("remaining %d, want %d: the early import of the reset's cell not applied", got, want)
		}
	})
	t.Run("an import of the cell epoch 0 where no reset forgets it", func(t *testing.T) {
		// The same import is applied for an identifier without marks, and
		// for one reset in the current window: every window after the
		// reset's began after it, so its cell of epoch 0 holds only usage
		// since the reset.
		clk := newClock(t0 + 58_000)
		s, _ := newGlobalService(t, clk)
		if _, err := s.Reset("ws", "ns", "kim", 60_000); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"jay", "kim"} {
			next := gcell(id)
			next.Sequence++
			apply(s, clk, global.Import{Cell: next, Foreign: 8, ExpireAt: next.Expiry(60_000)})
		}
		clk.Advance(3 * time.Second)
		for _, id := range []string{"jay", "kim"} {
			if d := mustCheck(t, s, query(id, limit, 1)); !d.Admitted || d.Remaining != 1 {
				t.Fatalf("%s: check in the next window: %+v, want 8 foreign and 1 own counted (remaining 1)", id, d)
			}
		}
	})
}
