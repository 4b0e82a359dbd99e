package service

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/window"
)

// A token budget over three limiters: each request looks (cost 0) and, when
// the look is admitted, debits the tokens its response used. Looks are
// admitted while the budget has room, and none once it is spent, from any
// limiter (requests further apart than the age a look's counts may have);
// the debits are all charged, so the budget is overdrawn by at most the
// last request's tokens; the debit that overdrew says so; every
// view of the cell counts every token; and the window pays the excess off
// as it slides: looks come back only once the previous window's weight
// leaves room.
func TestDebitsChargeEveryTokenAndLooksStopWhenTheBudgetIsSpent(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	const budget = 10_000
	look := Query{Workspace: "ws", Namespace: "llm", Identifier: "tenant", Limit: budget, Duration: 60_000}
	debit := look
	debit.Charge = window.ChargeDebit
	var charged, overdrawn int64
	var spentAt int = -1
	for i := range 60 {
		s := r.svcs[i%3]
		// A look reads counts at most StrictFreshFor old: requests a little
		// further apart than that see every debit before them.
		r.tick(50 * time.Millisecond) // twice StrictFreshFor's default
		var d window.Decision
		r.do(func() { d = mustCheck(t, s, look) })
		if charged > budget {
			if d.Admitted {
				t.Fatalf("request %d: a look admitted with %d of %d tokens charged", i, charged, budget)
			}
			if spentAt < 0 {
				spentAt = i
			}
			continue
		}
		if !d.Admitted {
			t.Fatalf("request %d: a look denied with %d of %d tokens charged", i, charged, budget)
		}
		debit.Cost = int64(500 + 431*i%4_500) // 500 to 5,000 tokens
		r.do(func() { d = mustCheck(t, s, debit) })
		charged += debit.Cost
		if d.Admitted != (charged <= budget) {
			t.Fatalf("request %d: debit of %d to %d charged: admitted %v", i, debit.Cost, charged, d.Admitted)
		}
		if charged > budget {
			overdrawn = charged - budget
			if d.Remaining != 0 || d.RetryAfter <= 0 {
				t.Fatalf("request %d: the debit that overdrew: %+v", i, d)
			}
			if overdrawn > debit.Cost {
				t.Fatalf("overdrawn by %d, more than the last request's %d tokens", overdrawn, debit.Cost)
			}
		}
	}
	if spentAt < 0 {
		t.Fatalf("the budget was never spent: %d charged", charged)
	}
	var cost, over int64
	for _, s := range r.svcs {
		st := s.Stats()
		cost, over = cost+st.DebitedCost, over+st.DebitsOver
	}
	if cost != charged || over != 1 {
		t.Fatalf("the limiters count %d debited, %d debits over the limit; want %d and 1", cost, over, charged)
	}
	r.tick(time.Second) // settle rounds report what the leases held
	now := r.clk.Now().UnixMilli()
	if got := counts(t, r.mem, cellOf(look, now)); got.Used != charged {
		t.Fatalf("the origin counts %d tokens used, %d were charged", got.Used, charged)
	}
	// The next window: the spent one weighs charged·(1 − elapsed); looks
	// come back once that is within the budget.
	next := (now/look.Duration + 1) * look.Duration
	back := look.Duration - look.Duration*budget/charged // elapsed from which the weight fits
	for _, at := range []int64{back / 2, back + 1_000} {
		r.tick(time.Duration(next+at-r.clk.Now().UnixMilli()) * time.Millisecond)
		var d window.Decision
		r.do(func() { d = mustCheck(t, r.svcs[0], look) })
		if want := at > back; d.Admitted != want {
			t.Fatalf("a look %d ms into the next window (room from %d ms): admitted %v", at, back, d.Admitted)
		}
	}
}

// A drain admits what fits whole, and of a cost that does not fit charges
// what the limit has left and is denied; afterwards nothing is left, in
// every view, however the cost was spread over three limiters.
func TestDrainChargesWhatIsLeftAndIsDenied(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	q := Query{Workspace: "ws", Namespace: "ns", Identifier: "drain", Limit: 100, Duration: 60_000, Cost: 40,
		Charge: window.ChargeDrain}
	var ds []window.Decision
	for i := range 3 {
		r.do(func() { ds = append(ds, mustCheck(t, r.svcs[i], q)) })
	}
	if !ds[0].Admitted || !ds[1].Admitted || ds[2].Admitted || ds[2].Remaining != 0 || ds[2].RetryAfter <= 0 {
		t.Fatalf("drains of 40, 40, 40 against 100: %+v", ds)
	}
	if st := r.svcs[2].Stats(); st.Drains != 1 || st.DrainedCost != 20 {
		t.Fatalf("the third limiter counts %d drains of %d, want 1 of 20", st.Drains, st.DrainedCost)
	}
	one := q
	one.Cost, one.Charge = 1, window.ChargeAll
	var d window.Decision
	r.do(func() { d = mustCheck(t, r.svcs[1], one) })
	if d.Admitted {
		t.Fatalf("a check of 1 after the drain: %+v", d)
	}
	r.tick(time.Second)
	if got := counts(t, r.mem, cellOf(q, r.clk.Now().UnixMilli())); got.Used != 100 {
		t.Fatalf("the origin counts %d used after draining 100", got.Used)
	}
	// A drain with nothing left charges nothing.
	r.do(func() { d = mustCheck(t, r.svcs[2], q) })
	if d.Admitted {
		t.Fatalf("a drain with nothing left: %+v", d)
	}
	r.tick(time.Second)
	if got := counts(t, r.mem, cellOf(q, r.clk.Now().UnixMilli())); got.Used != 100 {
		t.Fatalf("the origin counts %d used after a drain of nothing", got.Used)
	}
}

// A batch is all or nothing: a check in it that drains or debits is
// refused before anything is counted.
func TestABatchRefusesOtherCharges(t *testing.T) {
	s := newService(t, Config{})
	q := query("b", 10, 1)
	for _, c := range []window.Charge{window.ChargeDrain, window.ChargeDebit} {
		qc := q
		qc.Charge = c
		if _, _, err := s.Batch(t.Context(), []Query{q, qc}); err == nil {
			t.Errorf("a batch with a %v check: no error", c)
		}
	}
	if d := mustCheck(t, s, q); d.Remaining != 9 {
		t.Fatalf("after the refused batches: %+v, want nothing counted before", d)
	}
}
