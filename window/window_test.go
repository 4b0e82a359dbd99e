package window

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
)

// admits is the reference rule in arbitrary precision:
// (cur+cost)*d + prev*(d-elapsed) <= limit*d.
func admits(now, d, limit, cost, cur, prev int64) bool {
	seq := now / d
	elapsed := now - seq*d
	lhs := new(big.Int).Mul(big.NewInt(cur+cost), big.NewInt(d))
	lhs.Add(lhs, new(big.Int).Mul(big.NewInt(prev), big.NewInt(d-elapsed)))
	rhs := new(big.Int).Mul(big.NewInt(limit), big.NewInt(d))
	return lhs.Cmp(rhs) <= 0
}

// remainingRef is max(0, limit - ceil(cur + prev*(d-elapsed)/d)) in big arithmetic.
func remainingRef(now, d, limit, cur, prev int64) int64 {
	elapsed := now - (now/d)*d
	num := new(big.Int).Mul(big.NewInt(prev), big.NewInt(d-elapsed))
	q, r := new(big.Int).QuoRem(num, big.NewInt(d), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	q.Add(q, big.NewInt(cur))
	rem := new(big.Int).Sub(big.NewInt(limit), q)
	if rem.Sign() < 0 {
		return 0
	}
	return rem.Int64()
}

// admitsAt reports whether a request of cost fits at instant t, where the
// counts (cur, prev) were observed at now and nothing else arrives; in a
// fixed window (fixed) no previous cell weighs.
func admitsAt(now, t, d, limit, cost, cur, prev int64, fixed bool) bool {
	if fixed {
		prev = 0
	}
	switch t/d - now/d {
	case 0:
		return admits(t, d, limit, cost, cur, prev)
	case 1:
		if fixed {
			return admits(t, d, limit, cost, 0, 0)
		}
		return admits(t, d, limit, cost, 0, cur)
	default:
		return admits(t, d, limit, cost, 0, 0)
	}
}

func checkAgainstReference(t *testing.T, in Input) {
	t.Helper()
	got := Decide(in)
	prev := in.Previous // what the reference weighs
	if in.Fixed {
		prev = 0
	}
	want := admits(in.Now, in.Duration, in.Limit, in.Cost, in.Current, prev)
	if got.Admitted != want {
		t.Fatalf("Decide(%+v).Admitted = %v, reference says %v", in, got.Admitted, want)
	}
	cur := in.Current
	if want {
		cur += in.Cost
	}
	if r := remainingRef(in.Now, in.Duration, in.Limit, cur, prev); got.Remaining != r {
		t.Fatalf("Decide(%+v).Remaining = %d, reference %d", in, got.Remaining, r)
	}
	if reset := (in.Now/in.Duration + 1) * in.Duration; got.Reset != reset {
		t.Fatalf("Decide(%+v).Reset = %d, want %d", in, got.Reset, reset)
	}
	if want {
		if got.RetryAfter != 0 {
			t.Fatalf("Decide(%+v).RetryAfter = %d for an admitted request", in, got.RetryAfter)
		}
		return
	}
	ra := got.RetryAfter
	if in.Cost > in.Limit {
		if ra != RetryNever {
			t.Fatalf("Decide(%+v).RetryAfter = %d for a cost above the limit, want RetryNever (%d)", in, ra, RetryNever)
		}
		return
	}
	if ra <= 0 {
		t.Fatalf("Decide(%+v).RetryAfter = %d for a denied request", in, ra)
	}
	if !admitsAt(in.Now, in.Now+ra, in.Duration, in.Limit, in.Cost, in.Current, in.Previous, in.Fixed) {
		t.Fatalf("Decide(%+v).RetryAfter = %d, but the request is still denied then", in, ra)
	}
	if admitsAt(in.Now, in.Now+ra-1, in.Duration, in.Limit, in.Cost, in.Current, in.Previous, in.Fixed) {
		t.Fatalf("Decide(%+v).RetryAfter = %d, but the request is admitted 1 ms earlier", in, ra)
	}
}

func TestDecideMatchesBigReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const maxLimit = 1_000_000_000_000_000
	durations := []int64{1000, 1001, 60_000, 86_400_000, 2_592_000_000, 31_622_400_000}
	for i := 0; i < 200_000; i++ {
		d := durations[r.IntN(len(durations))]
		if r.IntN(3) == 0 {
			d = 1000 + r.Int64N(31_622_400_000-1000+1)
		}
		var limit int64
		switch r.IntN(3) {
		case 0:
			limit = r.Int64N(20)
		case 1:
			limit = r.Int64N(100_000)
		default:
			limit = r.Int64N(maxLimit + 1)
		}
		count := func() int64 {
			if limit == 0 || r.IntN(4) == 0 {
				return r.Int64N(maxLimit + 1)
			}
			return r.Int64N(2*limit + 1)
		}
		cost := int64(1)
		switch r.IntN(4) {
		case 0:
			cost = 0
		case 1:
			cost = r.Int64N(limit + 2)
		case 2:
			cost = r.Int64N(maxLimit + 1)
		}
		in := Input{
			Now:      1_700_000_000_000 + r.Int64N(10*d),
			Duration: d,
			Limit:    limit,
			Cost:     cost,
			Current:  count(),
			Previous: count(),
			Fixed:    r.IntN(4) == 0,
		}
		checkAgainstReference(t, in)
	}
}

func TestDecideCases(t *testing.T) {
	const d = 10_000
	const month = 2_592_000_000
	base := int64(1_700_000_000_000) // a multiple of d: elapsed 0
	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		{"empty window admits", Input{Now: base, Duration: d, Limit: 10, Cost: 1},
			Decision{Admitted: true, Remaining: 9, Reset: base + d}},
		{"limit zero never admits a cost", Input{Now: base, Duration: d, Limit: 0, Cost: 1},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: RetryNever}},
		{"a cost above the limit is never admitted, even on an empty cell", Input{Now: base + 2500, Duration: d, Limit: 10, Cost: 11},
			Decision{Admitted: false, Remaining: 10, Reset: base + d, RetryAfter: RetryNever}},
		{"limit zero admits a look", Input{Now: base, Duration: d, Limit: 0, Cost: 0},
			Decision{Admitted: true, Remaining: 0, Reset: base + d}},
		{"exactly at the limit admits", Input{Now: base, Duration: d, Limit: 10, Cost: 1, Current: 9},
			Decision{Admitted: true, Remaining: 0, Reset: base + d}},
		{"over the limit waits for the window end", Input{Now: base + 2500, Duration: d, Limit: 10, Cost: 1, Current: 10},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: 8500}},
		// Halfway through, previous 10 weighs 5: 5+5+1 > 10; it weighs 4 at 6000 ms.
		{"previous cell decays", Input{Now: base + 5000, Duration: d, Limit: 10, Cost: 1, Current: 5, Previous: 10},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: 1000}},
		// A weighted 4.5 is not rounded down: 5 + 4.5 + 1 > 10.
		{"no rounding in the caller's favour", Input{Now: base + 5500, Duration: d, Limit: 10, Cost: 1, Current: 5, Previous: 10},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: 500}},
		// Denied with current at the limit: next window, previous 10 must fall to 9.
		{"retry after spans into the next window", Input{Now: base, Duration: d, Limit: 10, Cost: 1, Current: 10},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: d + 1000}},
		// A fixed window weighs no previous cell: the whole limit is there.
		{"a fixed window ignores the previous cell", Input{Now: base + 5000, Duration: d, Limit: 10, Cost: 1, Current: 5, Previous: 10, Fixed: true},
			Decision{Admitted: true, Remaining: 4, Reset: base + d}},
		// And a denial there waits for the window's end, not for a decay.
		{"a fixed window's denial waits for its end", Input{Now: base, Duration: d, Limit: 10, Cost: 1, Current: 10, Previous: 10, Fixed: true},
			Decision{Admitted: false, Remaining: 0, Reset: base + d, RetryAfter: d}},
		// 1e15*(d-1)/d = 1e15 - 385802.47, so 385802 remains; the full cost fits at the window end.
		{"huge values do not overflow", Input{Now: 656*month + 1, Duration: month, Limit: 1e15, Cost: 1e15, Previous: 1e15},
			Decision{Admitted: false, Remaining: 385802, Reset: 657 * month, RetryAfter: month - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.in)
			if got != tt.want {
				t.Fatalf("Decide(%+v) = %+v, want %+v", tt.in, got, tt.want)
			}
			checkAgainstReference(t, tt.in)
		})
	}
}

// FuzzCalendar holds every calendar code and instant to the tiling
// invariants (docs/architecture.md, "Calendar periods").
func FuzzCalendar(f *testing.F) {
	f.Add(int64(1_796_079_600_000), uint16(5*8+5))
	f.Add(int64(0), uint16(2))
	f.Add(int64(1_325_152_800_000), uint16(3))
	f.Fuzz(func(t *testing.T, now int64, z uint16) {
		d := calendarBase + int64(z)
		if now < 0 || now > 4_102_444_800_000 || ValidDuration(d) != nil {
			t.Skip()
		}
		seq := Sequence(now, d)
		start, end := Start(seq, d), End(seq, d)
		next := Sequence(end, d)
		if start > now || now >= end || next <= seq || Start(next, d) != end || Following(seq, d) != End(next, d) {
			t.Fatalf("%s at %d: period %d [%d, %d), next %d from %d", CalendarName(d), now, seq, start, end, next, Start(next, d))
		}
		if dec := Decide(Input{Now: now, Duration: d, Limit: 1, Cost: 2}); dec.Reset != end || dec.Admitted {
			t.Fatalf("%s at %d: %+v, reset want %d", CalendarName(d), now, dec, end)
		}
	})
}

func FuzzDecide(f *testing.F) {
	f.Add(int64(1_700_000_000_123), int64(60_000), int64(10), int64(1), int64(5), int64(7))
	f.Add(int64(1_700_000_000_000), int64(1000), int64(0), int64(0), int64(0), int64(0))
	f.Add(int64(1_700_000_000_999), int64(2_592_000_000), int64(1e15), int64(1e15), int64(1e15), int64(1e15))
	f.Add(int64(0), int64(1000), int64(1), int64(2), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, now, d, limit, cost, cur, prev int64) {
		fixed := prev%2 != 0 // odd previous counts ask for a fixed window as well
		// Restrict to what the API accepts and what the service passes.
		if now < 0 || d < 1000 || d > 31_622_400_000 || limit < 0 || limit > 1e15 ||
			cost < 0 || cost > 1e15 || cur < 0 || cur > 4e15 || prev < 0 || prev > 4e15 {
			t.Skip()
		}
		checkAgainstReference(t, Input{Now: now, Duration: d, Limit: limit, Cost: cost, Current: cur, Previous: prev})
		if fixed {
			checkAgainstReference(t, Input{Now: now, Duration: d, Limit: limit, Cost: cost, Current: cur, Previous: prev, Fixed: true})
		}
	})
}

func BenchmarkDecide(b *testing.B) {
	month, _, _ := ParseCalendar("month@Europe/Berlin")
	for _, c := range []struct {
		name string
		d    int64
	}{{"duration", 60_000}, {"calendar", month}} {
		b.Run(c.name, func(b *testing.B) {
			in := Input{Now: 1_700_000_012_345, Duration: c.d, Limit: 1000, Cost: 1, Current: 400, Previous: 700}
			b.ReportAllocs()
			for b.Loop() {
				in.Now++
				_ = Decide(in)
			}
		})
	}
}

// BenchmarkRoom measures Room, which an origin calls on every check that
// knows its current cell's count.
func BenchmarkRoom(b *testing.B) {
	month, _, _ := ParseCalendar("month@Europe/Berlin")
	for _, c := range []struct {
		name string
		d    int64
	}{{"duration", 60_000}, {"calendar", month}} {
		b.Run(c.name, func(b *testing.B) {
			in := Input{Now: 1_700_000_012_345, Duration: c.d, Limit: 1000, Cost: 1, Previous: 700}
			b.ReportAllocs()
			for b.Loop() {
				in.Now++
				_ = Room(in)
			}
		})
	}
}

func TestAddCountsSaturates(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{0, 0, 0}, {1, 2, 3}, {MaxCount - 1, 1, MaxCount}, {MaxCount, 1, MaxCount},
		{MaxCount, MaxCount, MaxCount}, {1 << 62, 1 << 62, MaxCount}, {math.MaxInt64, 1, MaxCount},
	} {
		if got := AddCounts(c.a, c.b); got != c.want {
			t.Errorf("AddCounts(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestCellValidateBoundsEveryInstant(t *testing.T) {
	ok := Cell{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: MinDuration, Sequence: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []int64{MinDuration, 60_000, MaxDuration} {
		c := ok
		c.Duration, c.Sequence = d, MaxSequence(d)
		if err := c.Validate(); err != nil {
			t.Fatalf("duration %d, sequence %d: %v", d, c.Sequence, err)
		}
		if end := Start(c.Sequence+2, d) + 3_600_000; end < Start(c.Sequence, d) {
			t.Fatalf("duration %d: the instants of the last valid cell overflow", d)
		}
		c.Sequence++
		if c.Validate() == nil {
			t.Fatalf("duration %d: sequence %d beyond MaxSequence accepted", d, c.Sequence)
		}
	}
	for _, bad := range []Cell{
		{Workspace: "", Namespace: "ns", Identifier: "id", Duration: MinDuration},
		{Workspace: "w.s", Namespace: "ns", Identifier: "id", Duration: MinDuration},
		{Workspace: "ws", Namespace: "ns", Identifier: "", Duration: MinDuration},
		{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: MinDuration - 1},
		{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: MinDuration, Sequence: -1},
		{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: MaxDuration + 1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A cell's epoch is 0 or lies between the start of its window and the end
// of the next plus MaxEpochLead: the current and previous cells of a check
// in the reset's window, and a late host's earlier cells.
func TestCellValidateBoundsTheEpoch(t *testing.T) {
	c := Cell{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: 60_000, Sequence: 100}
	for _, e := range []int64{0, Start(100, 60_000), Start(101, 60_000) + 5, Start(102, 60_000) + MaxEpochLead - 1} {
		c.Epoch = e
		if err := c.Validate(); err != nil {
			t.Errorf("epoch %d refused: %v", e, err)
		}
	}
	for _, e := range []int64{-1, 1, Start(100, 60_000) - 1, Start(102, 60_000) + MaxEpochLead, MaxTime + 1} {
		c.Epoch = e
		if c.Validate() == nil {
			t.Errorf("epoch %d accepted", e)
		}
	}
}

// Room is the largest current usage Decide admits at: exactly at it the
// request is admitted, one above it refused.
func TestRoomIsWhereDecideTurns(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 200_000 {
		d := MinDuration + r.Int64N(MaxDuration-MinDuration+1)
		if i%2 == 0 {
			d = []int64{1000, 60_000, 86_400_000}[i%3]
		}
		limit := r.Int64N(MaxLimit + 1)
		if i%3 == 0 {
			limit = r.Int64N(100)
		}
		in := Input{Now: 1_700_000_000_000 + r.Int64N(d), Duration: d, Limit: limit,
			Cost: r.Int64N(limit + 2), Previous: r.Int64N(2*limit + 2), Fixed: i%5 == 0}
		prev := in.Previous // what the reference weighs
		if in.Fixed {
			prev = 0
		}
		room := Room(in)
		if room < 0 {
			in.Current = 0
			if Decide(in).Admitted {
				t.Fatalf("%+v: Room says nothing fits, Decide admits at 0", in)
			}
			continue
		}
		in.Current = room
		if !Decide(in).Admitted || !admits(in.Now, d, limit, in.Cost, room, prev) {
			t.Fatalf("%+v: refused at Room %d", in, room)
		}
		in.Current = room + 1
		if Decide(in).Admitted || admits(in.Now, d, limit, in.Cost, room+1, prev) {
			t.Fatalf("%+v: admitted above Room %d", in, room)
		}
	}
}

// The token rule's words say what ValidToken does: its length bound is
// MaxTokenLen.
func TestTokenRuleSaysTheBound(t *testing.T) {
	if want := "1 to " + strconv.Itoa(MaxTokenLen) + " characters of [A-Za-z0-9_-]"; TokenRule != want {
		t.Fatalf("TokenRule %q, want %q", TokenRule, want)
	}
	if err := TokenError("namespace", "a b"); err == nil || err.Error() != `namespace "a b" is not `+TokenRule {
		t.Fatalf("TokenError: %v", err)
	}
}

// Each Charge reads back from its name, and a name that is none is refused.
func TestChargeNamesRoundTrip(t *testing.T) {
	for _, c := range []Charge{ChargeAll, ChargeDrain, ChargeDebit} {
		if got, err := ParseCharge(c.String()); err != nil || got != c {
			t.Errorf("ParseCharge(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ParseCharge("overdraft"); err == nil {
		t.Error(`ParseCharge("overdraft") succeeded`)
	}
}
