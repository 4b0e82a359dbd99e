package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/window"
)

func TestCellEpochGivesTheResetWindowANewIdentity(t *testing.T) {
	const d = 10_000
	e := int64(1_000_000_123_456) // in window 100_000_012
	r := e / d
	for _, c := range []struct {
		epoch, seq int64
		want       int64
	}{
		{0, r, 0},         // never reset
		{e, r + 1, 0},     // the next window began after the reset
		{e, r + 5, 0},     // later windows too
		{e, r, e},         // the window holding the reset
		{e, r - 1, e},     // earlier windows: epoch e, only written after the reset
		{e, 0, e},         //
		{r * d, r, r * d}, // a reset at a window's first millisecond
		{r * d, r - 1, r * d},
	} {
		if got := CellEpoch(c.epoch, d, c.seq); got != c.want {
			t.Errorf("CellEpoch(%d, %d, %d) = %d, want %d", c.epoch, d, c.seq, got, c.want)
		}
	}
	for _, c := range []struct {
		seq, cellEpoch int64
		want           bool
	}{
		{r, 0, true},      // pre-reset usage of the reset window
		{r - 1, 0, true},  // the window before
		{r, e, false},     // post-reset usage
		{r, e + 1, false}, // a later reset's cell is not forgotten by this one
		{r + 1, 0, false}, // after the reset window
		{r - 1, e, false}, // written after the reset by a clock behind it
		{r, e - 1, true},  // an earlier reset's cell
	} {
		if got := Forgotten(e, d, c.seq, c.cellEpoch); got != c.want {
			t.Errorf("Forgotten(seq %d, cell epoch %d) = %v, want %v", c.seq-r, c.cellEpoch, got, c.want)
		}
	}
}

// cells is a region's counts by (sequence, epoch), as Redis, a bridge or
// MySQL keep them: they only ever grow.
type cells map[[2]int64]int64

// check decides one check at now against cs, reading and counting the
// cells CellEpoch names for the latest reset epoch, as a limiter would.
func (cs cells) check(epoch, now, d, limit, cost int64) window.Decision {
	seq := window.Sequence(now, d)
	cur := [2]int64{seq, CellEpoch(epoch, d, seq)}
	prev := [2]int64{seq - 1, CellEpoch(epoch, d, seq-1)}
	dec := window.Decide(window.Input{Now: now, Duration: d, Limit: limit, Cost: cost, Current: cs[cur], Previous: cs[prev]})
	if dec.Admitted {
		cs[cur] += cost
	}
	return dec
}

// TestAResetMakesChecksStartFromZero drives random traffic over a reset and
// compares every decision after it with a limiter that has never seen the
// traffic before the reset: current and previous windows start from zero,
// and nothing counted before the reset ever decreases. In half the rounds
// the host's clock is behind the one that stamped the reset (by up to the
// 3s clock-skew tolerance), so it learns the mark at a local time before
// the epoch: from then on it still decides as a fresh limiter would.
func TestAResetMakesChecksStartFromZero(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for round := 0; round < 300; round++ {
		d := int64(1000 * (1 + r.IntN(20)))
		limit := int64(1 + r.IntN(20))
		start := int64(now0) + r.Int64N(d)
		resetAt := start + r.Int64N(3*d)
		learn := resetAt // the local time at which the mark arrives
		if round%2 == 1 {
			learn -= r.Int64N(3000)
		}
		end := resetAt + r.Int64N(3*d)
		withReset, fresh := cells{}, cells{}
		var before cells
		for now := start; now < end; now += 1 + r.Int64N(d/5) {
			cost := int64(r.IntN(3))
			if now < learn {
				withReset.check(0, now, d, limit, cost)
				continue
			}
			if before == nil {
				before = cells{}
				for k, v := range withReset {
					before[k] = v
				}
			}
			got := withReset.check(resetAt, now, d, limit, cost)
			want := fresh.check(0, now, d, limit, cost)
			if got != want {
				t.Fatalf("round %d (d %d, limit %d, reset at +%d, learnt %dms before): check at +%d after the reset = %+v, a limiter that never saw the earlier traffic says %+v",
					round, d, limit, resetAt-start, resetAt-learn, now-resetAt, got, want)
			}
		}
		for k, v := range before {
			if withReset[k] < v {
				t.Fatalf("round %d: cell %v went down from %d to %d", round, k, v, withReset[k])
			}
		}
	}
}

func TestResetStampsAnEpochPastWhatChecksUse(t *testing.T) {
	ms := NewMarks()
	m1, err := ms.Reset("acme", "api", "alice", 60_000, now0)
	if err != nil {
		t.Fatal(err)
	}
	if m1.Epoch != now0 || ms.Epoch("acme", "api", "alice", 60_000) != now0 {
		t.Fatalf("first reset %+v", m1)
	}
	// The same millisecond again: one later, so it forgets what came since.
	m2, _ := ms.Reset("acme", "api", "alice", 60_000, now0)
	if m2.Epoch != now0+1 {
		t.Fatalf("second reset in the same ms: epoch %d", m2.Epoch)
	}
	// A clock behind: still later than what checks use.
	m3, _ := ms.Reset("acme", "api", "alice", AllDurations, now0-5000)
	if m3.Epoch != now0+2 {
		t.Fatalf("reset of all with a clock behind: epoch %d, want %d", m3.Epoch, now0+2)
	}
	for _, c := range []struct {
		d    int64
		want int64
	}{{60_000, now0 + 2}, {1000, now0 + 2}} {
		if got := ms.Epoch("acme", "api", "alice", c.d); got != c.want {
			t.Errorf("Epoch(d %d) = %d, want %d", c.d, got, c.want)
		}
	}
	if got := ms.Epoch("acme", "api", "bob", 60_000); got != 0 {
		t.Errorf("another identifier has epoch %d", got)
	}
	if got := ms.Epoch("acme", "web", "alice", 60_000); got != 0 {
		t.Errorf("another namespace has epoch %d", got)
	}
	if ms.Len("acme") != 2 {
		t.Errorf("Len = %d, want 2 (one per duration reset and one for all)", ms.Len("acme"))
	}
}

func TestResetRefusesBadInputAndChangesNothing(t *testing.T) {
	ms := NewMarks()
	for _, c := range []struct {
		ws, ns, id string
		d          int64
		now        int64
		want       string
	}{
		{"a.b", "api", "x", 0, now0, "workspace"},
		{"acme", "", "x", 0, now0, "namespace"},
		{"acme", "api", "", 0, now0, "identifier of 0 bytes"},
		{"acme", "api", strings.Repeat("x", 513), 0, now0, "513 bytes"},
		{"acme", "api", "x", 999, now0, "duration 999"},
		{"acme", "api", "x", -1, now0, "duration -1"},
		{"acme", "api", "x", window.MaxDuration + 1, now0, "duration"},
		{"acme", "api", "x", 0, window.MaxTime + 1, "epoch"},
	} {
		if _, err := ms.Reset(c.ws, c.ns, c.id, c.d, c.now); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Reset(%q, %q, %d bytes, %d) = %v, want ErrInvalid with %q", c.ws, c.ns, len(c.id), c.d, err, c.want)
		}
	}
	if _, err := ms.Merge(Mark{"acme", "api", "x", 0, now0}, Mark{"acme", "api", "x", 0, 0}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Merge with an invalid mark: %v", err)
	}
	if len(ms.All()) != 0 || ms.Digest() != 0 {
		t.Fatalf("refused input changed the marks: %v", ms.All())
	}
}

func TestResetRefusesANewMarkBeyondTheWorkspaceBound(t *testing.T) {
	ms := NewMarks()
	for i := 0; i < MaxMarksPerWorkspace; i++ {
		if _, err := ms.Reset("acme", "api", fmt.Sprint(i), 60_000, now0); err != nil {
			t.Fatal(err)
		}
	}
	before := ms.Digest()
	if _, err := ms.Reset("acme", "api", "one-more", 60_000, now0); !errors.Is(err, ErrTooMany) || !strings.Contains(err.Error(), "100000 reset marks") {
		t.Fatalf("reset beyond the bound: %v", err)
	}
	if _, err := ms.Reset("acme", "api", "0", AllDurations, now0); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a new duration of a known identifier beyond the bound: %v", err)
	}
	if ms.Digest() != before || ms.Epoch("acme", "api", "one-more", 60_000) != 0 {
		t.Fatal("a refused reset changed the marks")
	}
	// A mark held can be raised; another workspace is unaffected.
	if _, err := ms.Reset("acme", "api", "0", 60_000, now0+1); err != nil {
		t.Fatalf("raising a mark at the bound: %v", err)
	}
	if _, err := ms.Reset("other", "api", "x", 60_000, now0); err != nil {
		t.Fatal(err)
	}
	// Expired marks make room.
	if n, _ := ms.Prune((Mark{Duration: 60_000, Epoch: now0 + 1}).ExpireAt(0), 0, nil); n != MaxMarksPerWorkspace+1 {
		t.Fatalf("pruned %d", n)
	}
	if _, err := ms.Reset("acme", "api", "one-more", 60_000, now0); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
}

func TestMarksExpireWhenTheirCellsCanNoLongerWeigh(t *testing.T) {
	const d, grace = 10_000, 60_000
	ms := NewMarks()
	m, _ := ms.Reset("acme", "api", "alice", d, now0)
	all, _ := ms.Reset("acme", "api", "bob", AllDurations, now0)
	exp := m.ExpireAt(grace)
	if want := int64((now0/d+2)*d + grace); exp != want {
		t.Fatalf("ExpireAt = %d, want %d", exp, want)
	}
	// From the window after next on, CellEpoch gives 0 to every cell a check reads.
	if seq := window.Sequence((now0/d+2)*d, d); CellEpoch(m.Epoch, d, seq-1) != 0 {
		t.Fatal("the previous cell two windows on still has the reset's epoch")
	}
	if n, _ := ms.Prune(exp-1, grace, nil); n != 0 {
		t.Fatalf("pruned %d before expiry", n)
	}
	if n, _ := ms.Prune(exp, grace, nil); n != 1 || ms.Epoch("acme", "api", "alice", d) != 0 {
		t.Fatalf("pruned %d at expiry", n)
	}
	// A mark of every duration lasts as one of AllDurationsFor; with no
	// cells of its identifier held, nothing stays of it.
	if want := (now0/AllDurationsFor+2)*AllDurationsFor + grace; all.ExpireAt(grace) != int64(want) {
		t.Fatalf("a mark of every duration expires at %d, want %d", all.ExpireAt(grace), want)
	}
	if ms.Epoch("acme", "api", "bob", window.MaxDuration) != all.Epoch {
		t.Fatal("the mark of every duration went with the short one")
	}
	if n, kept := ms.Prune(all.ExpireAt(grace), grace, nil); n != 1 || len(kept) != 0 || len(ms.All()) != 0 || ms.Digest() != 0 || ms.Len("acme") != 0 {
		t.Fatalf("pruned %d, kept %v, left %v", n, kept, ms.All())
	}
}

// A mark of every duration that expires stays, for each longer duration
// whose cells of its identifier the replica holds, as a mark of that
// duration, which lasts as long as those cells matter; durations whose
// cells no longer need it, and identifiers without cells, keep nothing.
// The marks left are the same whichever replica turned them, and a
// duration reset later on its own keeps its own epoch.
func TestAMarkOfEveryDurationStaysOnlyForTheDurationsInUse(t *testing.T) {
	const grace = 60_000
	const day, minute, month = 86_400_000, 60_000, 30 * 86_400_000
	ms := NewMarks()
	all, _ := ms.Reset("acme", "api", "bob", AllDurations, now0)
	gone, _ := ms.Reset("acme", "api", "carol", AllDurations, now0)
	later, err := ms.Reset("acme", "api", "bob", month, now0+1000)
	if err != nil {
		t.Fatal(err)
	}
	inUse := func(ws, ns, id string) []int64 {
		if id == "bob" {
			return []int64{minute, day, month}
		}
		return nil
	}
	at := all.ExpireAt(grace)
	n, kept := ms.Prune(at, grace, inUse)
	// bob's day stays as its own mark; the minute's cells are done with
	// the reset by then, and the month holds a later mark of its own.
	want := []Mark{{"acme", "api", "bob", day, all.Epoch}}
	if n != 2 || !slices.Equal(kept, want) {
		t.Fatalf("pruned %d, kept %v; want 2 (bob's and carol's marks of every duration) and %v", n, kept, want)
	}
	if got := ms.All(); !slices.Equal(got, []Mark{want[0], later}) {
		t.Fatalf("left %v, want %v", got, []Mark{want[0], later})
	}
	if ms.Epoch("acme", "api", "bob", day) != all.Epoch || ms.Epoch("acme", "api", "bob", minute) != 0 ||
		ms.Epoch("acme", "api", "bob", month) != later.Epoch || ms.Epoch("acme", "api", "carol", day) != 0 {
		t.Fatal("epochs after the prune")
	}
	_ = gone
	// Another replica that turned the same mark holds the same marks: the
	// digests agree.
	other := NewMarks()
	if _, err := other.Merge(all, gone, later); err != nil {
		t.Fatal(err)
	}
	other.Prune(at, grace, inUse)
	if other.Digest() != ms.Digest() {
		t.Fatalf("digests differ: %v against %v", other.All(), ms.All())
	}
	// The day's mark goes when the day's cells no longer weigh.
	if n, _ := ms.Prune(want[0].ExpireAt(grace), grace, inUse); n != 1 || ms.Epoch("acme", "api", "bob", day) != 0 {
		t.Fatalf("pruned %d at the day's expiry", n)
	}
}

func TestMarksMergeConvergesInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for round := 0; round < 300; round++ {
		var marks []Mark
		for i := 1 + r.IntN(30); i > 0; i-- {
			marks = append(marks, Mark{"w", "n", []string{"a", "b"}[r.IntN(2)], []int64{0, 1000, 60_000}[r.IntN(3)], now0 + r.Int64N(5)})
		}
		want := NewMarks()
		if _, err := want.Merge(marks...); err != nil {
			t.Fatal(err)
		}
		for replica := 0; replica < 4; replica++ {
			got := NewMarks()
			order := slices.Clone(marks)
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, m := range order {
				for k := 1 + r.IntN(2); k > 0; k-- {
					if _, err := got.Merge(m); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !slices.Equal(got.All(), want.All()) || got.Digest() != want.Digest() {
				t.Fatalf("round %d: marks differ\n got %v\nwant %v", round, got.All(), want.All())
			}
		}
		if n, _ := want.Merge(marks...); n != 0 {
			t.Fatalf("round %d: merging again raised %d marks", round, n)
		}
		// Epoch is the max over the marks of the duration and of all.
		for _, id := range []string{"a", "b"} {
			for _, d := range []int64{1000, 60_000, 5000} {
				var max int64
				for _, m := range marks {
					if m.Identifier == id && (m.Duration == d || m.Duration == AllDurations) && m.Epoch > max {
						max = m.Epoch
					}
				}
				if got := want.Epoch("w", "n", id, d); got != max {
					t.Fatalf("round %d: Epoch(%s, %d) = %d, want %d", round, id, d, got, max)
				}
			}
		}
	}
}

func TestInputStampedAheadOfTheClockIsRefused(t *testing.T) {
	const skew = 3000
	m := Mark{"acme", "api", "alice", AllDurations, now0 + skew}
	if err := m.CheckAt(now0, skew); err != nil {
		t.Fatalf("a mark at the tolerance: %v", err)
	}
	m.Epoch++
	if err := m.CheckAt(now0, skew); !errors.Is(err, ErrFuture) {
		t.Fatalf("a mark past the tolerance: %v", err)
	}
	m.Duration = 5
	if err := m.CheckAt(now0, skew); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an invalid mark: %v", err)
	}
	e := Entry{Key: Key{"acme", "api", "a*"}, Override: Override{1, 1000, false}, Version: Version{now0 + skew, "eu"}}
	if err := e.CheckAt(now0, skew); err != nil {
		t.Fatalf("an entry at the tolerance: %v", err)
	}
	e.Version.At++
	if err := e.CheckAt(now0, skew); !errors.Is(err, ErrFuture) {
		t.Fatalf("an entry past the tolerance: %v", err)
	}
	e.Pattern = "a**b"
	if err := e.CheckAt(now0, skew); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an invalid entry: %v", err)
	}
}
