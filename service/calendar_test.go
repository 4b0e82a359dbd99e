package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

func calendarQuery(t *testing.T, id, period string, limit int64) Query {
	t.Helper()
	d, ok, err := window.ParseCalendar(period)
	if !ok || err != nil {
		t.Fatalf("%s: %v, %v", period, ok, err)
	}
	return Query{Workspace: "ws", Namespace: "ns", Identifier: id, Limit: limit, Duration: d, Cost: 1}
}

func inZone(t *testing.T, zone string, y int, m time.Month, d, h, min int) int64 {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return time.Date(y, m, d, h, min, 0, 0, loc).UnixMilli()
}

// A daily quota in Berlin over three limiters of one region, through the
// day of 25 hours when the clock goes back: exactly the quota is admitted
// over the whole day, every admission's reset is the next midnight (25
// hours after this one), the origin holds exactly what was admitted, and
// at midnight the quota renews.
func TestACalendarDayAdmitsItsQuotaAcrossALongDay(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	midnight := inZone(t, "Europe/Berlin", 2026, 10, 25, 0, 0)
	next := inZone(t, "Europe/Berlin", 2026, 10, 26, 0, 0)
	if next-midnight != 25*3_600_000 {
		t.Fatalf("the day lasts %v", time.Duration(next-midnight)*time.Millisecond)
	}
	r.clk.ms.Store(midnight)
	const limit = 100
	q := calendarQuery(t, "daily", "day@Europe/Berlin", limit)
	admitted := 0
	for i := range 3 * limit {
		var d window.Decision
		before := r.clk.ms.Load()
		r.do(func() { d = mustCheck(t, r.svcs[i%3], q) }) // time may pass while it waits
		after := r.clk.ms.Load()
		if d.Admitted {
			admitted++
			if d.Reset != next {
				t.Fatalf("check %d: reset %v, want the next midnight %v", i, time.UnixMilli(d.Reset), time.UnixMilli(next))
			}
		} else if d.RetryAfter < next-after || d.RetryAfter > next-before {
			t.Fatalf("check %d denied: retry after %d ms, want %d to %d (the next midnight)", i, d.RetryAfter, next-after, next-before)
		}
		// The day's 25 hours, spread: the clock jumps, then a settle round.
		r.clk.Advance(time.Duration(25*3_600_000/(3*limit)-20) * time.Millisecond)
		r.tick(10 * time.Millisecond)
	}
	if admitted != limit {
		t.Fatalf("admitted %d over the day, want the quota %d", admitted, limit)
	}
	for _, s := range r.svcs {
		s.settleTick()
	}
	if c := counts(t, r.mem, window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "daily", Duration: q.Duration,
		Sequence: window.Sequence(midnight, q.Duration)}); c.Used != limit {
		t.Fatalf("the origin's day holds %d, want %d", c.Used, limit)
	}
	r.clk.ms.Store(next)
	var d window.Decision
	r.do(func() { d = mustCheck(t, r.svcs[0], q) })
	if !d.Admitted || d.Remaining != limit-1 {
		t.Fatalf("the next day's first check: %+v, want admitted with %d left", d, limit-1)
	}
}

// A monthly quota in New York renews at midnight of the first, New York
// time, not UTC's, and a denial's retry-after says when; the same
// identifier's sliding window of a minute keeps counts of its own.
func TestACalendarMonthRenewsAtTheZonesMidnight(t *testing.T) {
	clk := newClock(inZone(t, "America/New_York", 2026, 11, 30, 23, 59))
	s := newService(t, Config{Now: clk.Now})
	q := calendarQuery(t, "monthly", "month@America/New_York", 10)
	for i := range 10 {
		if d := mustCheck(t, s, q); !d.Admitted {
			t.Fatalf("check %d of a monthly 10 denied: %+v", i, d)
		}
	}
	renew := inZone(t, "America/New_York", 2026, 12, 1, 0, 0)
	d := mustCheck(t, s, q)
	if d.Admitted || d.RetryAfter != renew-clk.ms.Load() || d.Reset != renew {
		t.Fatalf("the 11th: %+v, want denied until %d", d, renew)
	}
	sliding := query("monthly", 10, 1)
	if d := mustCheck(t, s, sliding); !d.Admitted || d.Remaining != 9 {
		t.Fatalf("the identifier's sliding minute: %+v, want its own count", d)
	}
	clk.Advance(30 * time.Second) // past UTC's midnight of the 1st hours ago, not New York's
	if d := mustCheck(t, s, q); d.Admitted {
		t.Fatalf("30 s before New York's midnight: %+v, want denied", d)
	}
	clk.ms.Store(renew)
	if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != 9 {
		t.Fatalf("at New York's midnight: %+v, want a renewed quota", d)
	}
}

// A query naming a duration that is neither milliseconds in range nor a
// calendar period is refused and counts nothing.
func TestAnUnknownCalendarCodeIsRefused(t *testing.T) {
	s := newService(t, Config{})
	q := calendarQuery(t, "bad", "month", 10)
	q.Duration |= 7 // unit 7: none
	if _, err := s.Check(t.Context(), q); err == nil {
		t.Fatalf("duration %d accepted", q.Duration)
	}
}

// An override naming a calendar period turns a tenant's per-minute checks
// into a monthly quota: its checks are decided against the month of its
// zone, as a fixed window, on the warm path too; a reset of that period
// forgets the month's usage.
func TestACalendarOverrideAndResetApplyToTheMonth(t *testing.T) {
	clk := newClock(inZone(t, "Europe/Berlin", 2026, 11, 28, 12, 0))
	s := newService(t, Config{Now: clk.Now})
	month := calendarQuery(t, "x", "month@Europe/Berlin", 0).Duration
	if _, err := s.Policies().Set(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: "tenant_*"},
		policy.Override{Limit: 5, Duration: month}, s.nowMs(), "r1"); err != nil {
		t.Fatal(err)
	}
	renew := inZone(t, "Europe/Berlin", 2026, 12, 1, 0, 0)
	q := query("tenant_a", 1000, 1)
	for i := range 5 {
		if d := mustCheck(t, s, q); !d.Admitted || d.Reset != renew || d.Remaining != int64(4-i) {
			t.Fatalf("check %d under a monthly 5: %+v, want admitted, reset at the month's end", i, d)
		}
	}
	if d, ok, err := s.TryCheck(q); err != nil || ok && d.Admitted {
		t.Fatalf("the warm path over the monthly 5: %+v, %v, %v; want denied or undecided", d, ok, err)
	}
	if d := mustCheck(t, s, q); d.Admitted || d.RetryAfter != renew-clk.ms.Load() {
		t.Fatalf("over the monthly 5: %+v, want denied until the 1st", d)
	}
	if _, err := s.Reset("ws", "ns", "tenant_a", month); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, s, q); !d.Admitted || d.Remaining != 4 {
		t.Fatalf("after a reset of the month: %+v, want 4 left", d)
	}
}

// Bursts of 3× a monthly quota from 64 goroutines over three limiters, in
// uneven shares (four of every seven checks to one limiter), faster than
// any settle round, admit exactly the quota, and the origin then holds
// exactly that: a calendar period's cells take the exact path a duration's
// do.
func TestBurstsAdmitExactlyAMonthsQuota(t *testing.T) {
	start := time.UnixMilli(inZone(t, "Europe/Berlin", 2026, 11, 1, 0, 0))
	began := time.Now()
	now := func() time.Time { return start.Add(time.Since(began)) } // the system clock's pace, from the month's start
	mem := regiontest.NewMemory(now)
	var svcs []*Service
	for i := range 3 {
		s := New(Config{Origin: mem, ID: fmt.Sprint("lim", i), Now: now})
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		svcs = append(svcs, s)
	}
	shares := [7]int{0, 0, 0, 0, 1, 1, 2} // four sevenths, two, one
	uneven := func(i int) *Service { return svcs[shares[i%7]] }
	var qs []Query
	for _, limit := range []int64{1, 10, 1000} {
		q := calendarQuery(t, fmt.Sprint("burst-", limit), "month@Europe/Berlin", limit)
		if got := send(t, int(3*limit), 64, q, uneven); got != limit {
			t.Errorf("a monthly quota of %d: %d admitted", limit, got)
		}
		qs = append(qs, q)
	}
	for _, s := range svcs {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range qs {
		c := counts(t, mem, window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier,
			Duration: q.Duration, Sequence: window.Sequence(now().UnixMilli(), q.Duration)})
		if c.Used != q.Limit || c.Charged != q.Limit {
			t.Errorf("%s: origin used %d, charged %d after Close; admitted %d", q.Identifier, c.Used, c.Charged, q.Limit)
		}
	}
}
