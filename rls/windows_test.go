package rls

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// parityConfig holds the limits of envoyproxy/ratelimit's README shapes
// the fixed-window tests compare against: per minute, per hour, and per
// two minutes (unit_multiplier), plus one limit that asks for the sliding
// window whatever the server's kind.
const parityConfig = `
domain: parity
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: twomin
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 5}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 3, window: sliding}
`

// parityStep is one call of a case and what envoyproxy/ratelimit answers
// it with: the status's code and remaining, and duration_until_reset (the
// end of the fixed window, whatever the code).
type parityStep struct {
	at        time.Duration // from the case's start, a whole minute and hour
	code      string
	remaining uint32
	reset     time.Duration
}

// With --rls-windows fixed, each limit answers as envoyproxy/ratelimit
// does on the same YAML (its README's examples, case by case): a window
// aligned to the epoch, the limit counted within it, the whole limit back
// at its end, and duration_until_reset that end on every status. A limit
// of unit_multiplier units says so in current_limit. A rate_limit that asks
// for the sliding window keeps it: the full window before still weighs
// just after it ended.
func TestFixedWindowsAnswerAsEnvoysRateLimitService(t *testing.T) {
	const minute, hour = time.Minute, time.Hour
	cases := []struct {
		key   string
		steps []parityStep
	}{
		{"minute", []parityStep{
			{10 * time.Second, "OK", 2, 50 * time.Second},
			{20 * time.Second, "OK", 1, 40 * time.Second},
			{30 * time.Second, "OK", 0, 30 * time.Second},
			{40 * time.Second, "OVER_LIMIT", 0, 20 * time.Second},
			{59 * time.Second, "OVER_LIMIT", 0, time.Second},
			{minute, "OK", 2, minute}, // the next minute: all of it back
			{minute + time.Second, "OK", 1, 59 * time.Second},
		}},
		{"hour", []parityStep{
			{0, "OK", 1, hour},
			{30 * minute, "OK", 0, 30 * minute},
			{59 * minute, "OVER_LIMIT", 0, minute},
			{hour + time.Second, "OK", 1, hour - time.Second},
		}},
		{"twomin", []parityStep{
			{0, "OK", 4, 2 * minute},
			{10 * time.Second, "OK", 3, 110 * time.Second},
			{20 * time.Second, "OK", 2, 100 * time.Second},
			{30 * time.Second, "OK", 1, 90 * time.Second},
			{90 * time.Second, "OK", 0, 30 * time.Second},
			{100 * time.Second, "OVER_LIMIT", 0, 20 * time.Second},
			{2 * minute, "OK", 4, 2 * minute}, // the window is two minutes long, from an even minute
		}},
	}
	for _, c := range cases {
		t.Run(c.key, func(t *testing.T) {
			h := newHarnessOf(t, parityConfig, ServerConfig{Windows: Fixed})
			start := h.now.Load()
			for i, s := range c.steps {
				h.now.Store(start + s.at.Milliseconds())
				st := h.call(t, "parity", 0, desc(c.key+"=x")).Statuses[0]
				if st.Code.String() != s.code || st.LimitRemaining != s.remaining || st.DurationUntilReset.AsDuration() != s.reset {
					t.Fatalf("step %d at %v: %s, remaining %d, duration_until_reset %v; want %s, %d, %v",
						i, s.at, st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), s.code, s.remaining, s.reset)
				}
				if c.key == "twomin" && (st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
					st.CurrentLimit.GetUnitMultiplier().GetValue() != 2 || st.CurrentLimit.GetRequestsPerUnit() != 5) {
					t.Fatalf("step %d: current_limit %v, want 5 a MINUTE × 2", i, st.CurrentLimit)
				}
				if c.key != "twomin" && st.CurrentLimit.GetUnitMultiplier() != nil {
					t.Fatalf("step %d: current_limit %v carries a unit_multiplier", i, st.CurrentLimit)
				}
			}
		})
	}

	t.Run("a rate_limit that asks for the sliding window keeps it", func(t *testing.T) {
		h := newHarnessOf(t, parityConfig, ServerConfig{Windows: Fixed})
		start := h.now.Load()
		h.call(t, "parity", 3, desc("slide=x"))
		h.now.Store(start + time.Minute.Milliseconds() + 1)
		if st := h.call(t, "parity", 0, desc("slide=x")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("1 ms after a full minute under the sliding rule: %v, want OVER_LIMIT", st.Code)
		}
		if st := h.call(t, "parity", 0, desc("minute=y")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a fixed limit beside it: %v", st.Code)
		}
	})

	t.Run("the sliding window is the default", func(t *testing.T) {
		h := newHarnessOf(t, parityConfig, ServerConfig{})
		start := h.now.Load()
		h.call(t, "parity", 3, desc("minute=x"))
		h.now.Store(start + time.Minute.Milliseconds() + 1)
		if st := h.call(t, "parity", 0, desc("minute=x")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("1 ms after a full minute by default: %v, want OVER_LIMIT (sliding)", st.Code)
		}
	})
}

// unit_multiplier, window and charge are read strictly: a multiplier of 0,
// a window over 366 days, an unknown kind or charge, a calendar window of
// seconds (a calendar has no second), of several units or in a zone that is
// not an IANA zone, or any of them on an unlimited rate_limit stop the load
// with an error that says what to fix.
func TestWindowKeysAreReadStrictly(t *testing.T) {
	for _, c := range []struct{ limit, want string }{
		{"{unit: minute, unit_multiplier: 0, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: minute, unit_multiplier: -2, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: minute, unit_multiplier: x, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: year, unit_multiplier: 2, requests_per_unit: 1}", "a window of 2 × YEAR is over 366 days"},
		{"{unit: day, unit_multiplier: 367, requests_per_unit: 1}", "a window of 367 × DAY is over 366 days"},
		{"{unit: minute, requests_per_unit: 1, window: tumbling}", `window "tumbling": want sliding, fixed, calendar or calendar@<IANA zone>`},
		{"{unit: second, requests_per_unit: 1, window: calendar}", "a calendar has no period of a second (no calendar second)"},
		{"{unit: second, requests_per_unit: 1, window: calendar@Europe/Berlin}", "no calendar second"},
		{"{unit: day, requests_per_unit: 1, window: calendar@Mars/Olympus}", `time zone "Mars/Olympus" is not an IANA zone name`},
		{"{unit: day, requests_per_unit: 1, window: calendar@}", "names no time zone after @"},
		{"{unit: day, requests_per_unit: 1, window: fixed@Europe/Berlin}", `window "fixed@Europe/Berlin": want sliding, fixed, calendar`},
		{"{unit: hour, unit_multiplier: 2, requests_per_unit: 1, window: calendar}", "window calendar counts one hour of the calendar: unit_multiplier 2 needs window: fixed or sliding"},
		{"{unlimited: true, window: calendar@Europe/Berlin}", "should not specify unit_multiplier, window or charge when unlimited"},
		{"{unlimited: true, window: fixed}", "should not specify unit_multiplier, window or charge when unlimited"},
		{"{unlimited: true, charge: debit}", "should not specify unit_multiplier, window or charge when unlimited"},
		{"{unit: minute, requests_per_unit: 1, charge: overdraft}", `charge "overdraft": want all, drain or debit`},
	} {
		_, err := Parse(File{Name: "w.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + c.limit + "\n")})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.limit, err, c.want)
		}
	}
	conf, err := Parse(File{Name: "w.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unit_multiplier: 366, requests_per_unit: 1, window: fixed}\n")})
	if err != nil {
		t.Fatal(err)
	}
	if m := conf.domains["d"]["k"]; m == nil {
		t.Fatalf("no descriptor k in %+v", conf.domains["d"])
	}
}

// tokenConfig is an AI Gateway's token budget: the request's call looks
// (hits_addend 0) and the call when the response is done (Envoy's
// apply_on_stream_done) carries the tokens it used.
const tokenConfig = `
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10000}
  - key: budget
    rate_limit: {unit: minute, requests_per_unit: 10000, charge: debit}
`

// With charge debit (the server's --rls-charge, or a rate_limit's own), the
// tokens a response used are counted even past the budget, as
// envoyproxy/ratelimit counts them, so the next request's look is over it;
// with all-or-nothing charging the same charge is refused and lost, and the
// tenant is admitted for ever. Once the budget is spent, no look passes
// until the window frees room.
func TestDebitedTokensStopTheNextRequest(t *testing.T) {
	for _, c := range []struct {
		name   string
		key    string
		charge window.Charge
	}{
		{"--rls-charge debit", "tenant", window.ChargeDebit},
		{"charge: debit in the YAML", "budget", window.ChargeAll},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarnessOf(t, tokenConfig, ServerConfig{Charge: c.charge})
			tokens := uint32(0)
			for i := range 10 {
				look := h.call(t, "llm", 0, desc(c.key+"=acme")).Statuses[0]
				if want := tokens <= 10_000; (look.Code == rlsv3.RateLimitResponse_OK) != want {
					t.Fatalf("request %d with %d tokens used: look %v", i, tokens, look.Code)
				}
				if look.Code != rlsv3.RateLimitResponse_OK {
					continue
				}
				done := h.call(t, "llm", 4_000, desc(c.key+"=acme")).Statuses[0]
				tokens += 4_000
				if want := tokens <= 10_000; (done.Code == rlsv3.RateLimitResponse_OK) != want {
					t.Fatalf("request %d: the response's 4,000 tokens to %d: %v", i, tokens, done.Code)
				}
			}
			if tokens != 12_000 {
				t.Fatalf("%d tokens charged, want 12,000 (three responses, the third past the budget)", tokens)
			}
		})
	}
	t.Run("all or nothing loses the response's tokens", func(t *testing.T) {
		h := newHarnessOf(t, tokenConfig, ServerConfig{})
		for range 3 {
			h.call(t, "llm", 4_000, desc("tenant=acme"))
		}
		if st := h.call(t, "llm", 0, desc("tenant=acme")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("the look after a refused charge: %v, want OK (the charge was lost)", st.Code)
		}
	})
}

// --rls-windows fixed with --rls-charge debit counts hits over the limit as
// envoyproxy/ratelimit does (INCRBY on every call): over the limit, every
// call is OVER_LIMIT and still counted, and the next window starts from
// nothing. A debited limit refuses the request first, and the request's
// all-or-nothing limits then count nothing.
func TestFixedDebitedLimitsCountHitsOverTheLimitAsUpstream(t *testing.T) {
	h := newHarnessOf(t, parityConfig, ServerConfig{Windows: Fixed, Charge: window.ChargeDebit})
	start := h.now.Load()
	for i, want := range []string{"OK OK/2", "OK OK/1", "OK OK/0", "OVER_LIMIT OVER_LIMIT/0", "OVER_LIMIT OVER_LIMIT/0"} {
		if got := summary(h.call(t, "parity", 0, desc("minute=x"))); got != want {
			t.Fatalf("call %d: %s, want %s", i, got, want)
		}
	}
	h.now.Store(start + time.Minute.Milliseconds())
	// All five hits were counted: read through the sliding rule, the
	// minute before weighs almost 5 of its limit of 3 (3 would fit).
	look := service.Query{Workspace: DefaultWorkspace, Namespace: "parity", Identifier: "minute=x", Limit: 3, Duration: 60_000}
	if d, err := h.svc.Check(t.Context(), look); err != nil || d.Admitted {
		t.Fatalf("a sliding look at the minute after five hits: %+v, %v; want denied (five counted)", d, err)
	}
	if got := summary(h.call(t, "parity", 0, desc("minute=x"))); got != "OK OK/2" {
		t.Fatalf("the next minute: %s, want OK OK/2", got)
	}
	// Under all-or-nothing charging the hour limit beside an exhausted
	// debited one counts nothing.
	h2 := newHarnessOf(t, parityConfig+"  - key: allhour\n    rate_limit: {unit: hour, requests_per_unit: 5, charge: all}\n",
		ServerConfig{Windows: Fixed, Charge: window.ChargeDebit})
	h2.call(t, "parity", 3, desc("minute=y"))
	if got := summary(h2.call(t, "parity", 0, desc("minute=y"), desc("allhour=y"))); got != "OVER_LIMIT OVER_LIMIT/0 OK/5" {
		t.Fatalf("over the debited minute beside an hour: %s", got)
	}
}

// calendarConfig holds calendar windows: daily in three zones (one with
// summer time), weekly and monthly, beside limits that name no window.
const calendarConfig = `
domain: cal
descriptors:
  - key: tokyo
    rate_limit: {unit: day, requests_per_unit: 2, window: calendar@Asia/Tokyo}
  - key: newyork
    rate_limit: {unit: day, requests_per_unit: 2, window: calendar@America/New_York}
  - key: utc
    rate_limit: {unit: day, requests_per_unit: 2, window: calendar}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 1, window: calendar@Asia/Tokyo}
  - key: berlin
    rate_limit: {unit: month, requests_per_unit: 3, window: calendar@Europe/Berlin}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: twomin
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 5}
`

// expectStatus calls d and fails unless its status has code, remaining and
// duration_until_reset, and current_limit is rpu a unit with no
// multiplier.
func expectStatus(t *testing.T, h *harness, d *rlv3.RateLimitDescriptor, code string, remaining uint32, reset time.Duration,
	rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) {
	t.Helper()
	st := h.call(t, "cal", 0, d).Statuses[0]
	if st.Code.String() != code || st.LimitRemaining != remaining || st.DurationUntilReset.AsDuration() != reset {
		t.Fatalf("%v at %v: %s, remaining %d, duration_until_reset %v; want %s, %d, %v", d.Entries, time.UnixMilli(h.now.Load()).UTC(),
			st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), code, remaining, reset)
	}
	if cur := st.CurrentLimit; cur.GetRequestsPerUnit() != rpu || cur.GetUnit() != unit || cur.GetUnitMultiplier() != nil {
		t.Fatalf("%v: current_limit %v, want %d a %s", d.Entries, cur, rpu, unit)
	}
}

// zoneMidnight returns the first instant (unix ms) of day y-m-d in zone.
func zoneMidnight(t *testing.T, zone string, y int, m time.Month, d int) int64 {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc).UnixMilli()
}

// A rate_limit with window: calendar@<zone> counts in its unit's period
// of the zone's calendar: a daily limit's duration_until_reset is the time
// to the zone's next midnight (23 hours' day of summer time included), the
// whole limit is back at that midnight and not a millisecond before, a
// weekly one renews on Monday, a monthly one on the first of the month;
// current_limit echoes the unit. The harness's clock starts on Friday,
// 2027-01-15, 08:00 UTC: 17:00 in Tokyo, 09:00 in Berlin.
func TestCalendarWindowsRenewAtTheZonesCalendar(t *testing.T) {
	const hour, day = time.Hour, 24 * time.Hour
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	dayUnit, weekUnit, monthUnit := rlsv3.RateLimitResponse_RateLimit_DAY, rlsv3.RateLimitResponse_RateLimit_WEEK, rlsv3.RateLimitResponse_RateLimit_MONTH

	t.Run("daily in Tokyo", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{})
		midnight := zoneMidnight(t, "Asia/Tokyo", 2027, 1, 16)
		if until := time.Duration(midnight-h.now.Load()) * time.Millisecond; until != 7*hour {
			t.Fatalf("Tokyo's next midnight is %v away, want 7h", until)
		}
		expectStatus(t, h, desc("tokyo=x"), "OK", 1, 7*hour, 2, dayUnit)
		expectStatus(t, h, desc("tokyo=x"), "OK", 0, 7*hour, 2, dayUnit)
		expectStatus(t, h, desc("tokyo=x"), "OVER_LIMIT", 0, 7*hour, 2, dayUnit)
		h.now.Store(midnight - 1)
		expectStatus(t, h, desc("tokyo=x"), "OVER_LIMIT", 0, time.Millisecond, 2, dayUnit)
		h.now.Store(midnight)
		expectStatus(t, h, desc("tokyo=x"), "OK", 1, day, 2, dayUnit)
		// UTC's calendar without a zone: its midnight is 16 hours away.
		h.now.Store(midnight - ms(7*hour))
		expectStatus(t, h, desc("utc=x"), "OK", 1, 16*hour, 2, dayUnit)
	})

	t.Run("daily in New York on the day summer time begins", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{})
		// 2027-03-14, 00:30 EST: the day lasts 23 hours, so midnight is
		// 22h30m away.
		h.now.Store(zoneMidnight(t, "America/New_York", 2027, 3, 14) + ms(30*time.Minute))
		next := zoneMidnight(t, "America/New_York", 2027, 3, 15)
		if until := time.Duration(next-h.now.Load()) * time.Millisecond; until != 22*hour+30*time.Minute {
			t.Fatalf("the next midnight is %v away, want 22h30m", until)
		}
		expectStatus(t, h, desc("newyork=x"), "OK", 1, 22*hour+30*time.Minute, 2, dayUnit)
		expectStatus(t, h, desc("newyork=x"), "OK", 0, 22*hour+30*time.Minute, 2, dayUnit)
		expectStatus(t, h, desc("newyork=x"), "OVER_LIMIT", 0, 22*hour+30*time.Minute, 2, dayUnit)
		h.now.Store(next)
		expectStatus(t, h, desc("newyork=x"), "OK", 1, day, 2, dayUnit)
	})

	t.Run("weekly in Tokyo", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{})
		monday := zoneMidnight(t, "Asia/Tokyo", 2027, 1, 18)
		expectStatus(t, h, desc("week=x"), "OK", 0, 2*day+7*hour, 1, weekUnit)
		expectStatus(t, h, desc("week=x"), "OVER_LIMIT", 0, 2*day+7*hour, 1, weekUnit)
		h.now.Store(monday)
		expectStatus(t, h, desc("week=x"), "OK", 0, 7*day, 1, weekUnit)
	})

	t.Run("monthly in Berlin", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{})
		first := zoneMidnight(t, "Europe/Berlin", 2027, 2, 1)
		until := time.Duration(first-h.now.Load()) * time.Millisecond
		if until != 16*day+15*hour {
			t.Fatalf("Berlin's first of February is %v away, want 16 days 15 hours", until)
		}
		for _, left := range []uint32{2, 1, 0} { // a day apart
			expectStatus(t, h, desc("berlin=x"), "OK", left, until, 3, monthUnit)
			h.now.Add(ms(day))
			until -= day
		}
		expectStatus(t, h, desc("berlin=x"), "OVER_LIMIT", 0, until, 3, monthUnit)
		h.now.Store(first - 1)
		expectStatus(t, h, desc("berlin=x"), "OVER_LIMIT", 0, time.Millisecond, 3, monthUnit)
		h.now.Store(first)
		expectStatus(t, h, desc("berlin=x"), "OK", 2, 28*day, 3, monthUnit) // February 2027 has no clock change in Berlin
	})
}

// With --rls-windows calendar@<zone>, the limits that name no window count
// in their unit's calendar period of the zone, and so do the limit
// overrides Envoy sends; a limit of seconds or of unit_multiplier units,
// which a calendar has no period of, counts in a fixed window aligned to
// the epoch. Under any other server kind, an override stays what it was:
// not a calendar window, even on a descriptor whose YAML limit is one.
func TestServerWideCalendarWindows(t *testing.T) {
	const hour, minute = time.Hour, time.Minute
	dayUnit := rlsv3.RateLimitResponse_RateLimit_DAY
	override := func(d *rlv3.RateLimitDescriptor, rpu uint32, u typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return d
	}

	t.Run("calendar@Asia/Tokyo", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{Windows: Calendar, Zone: "Asia/Tokyo"})
		start := h.now.Load()
		expectStatus(t, h, desc("day=x"), "OK", 1, 7*hour, 2, dayUnit)
		expectStatus(t, h, override(desc("day=y"), 3, typev3.RateLimitUnit_DAY), "OK", 2, 7*hour, 3, dayUnit)
		expectStatus(t, h, override(desc("day=z"), 3, typev3.RateLimitUnit_SECOND), "OK", 2, time.Second, 3, rlsv3.RateLimitResponse_RateLimit_SECOND)
		// A limit's own calendar keeps its zone.
		expectStatus(t, h, desc("newyork=x"), "OK", 1, 21*hour, 2, dayUnit) // 03:00 in New York
		// Two minutes: fixed, from an even minute of the epoch.
		for i := range 6 {
			st := h.call(t, "cal", 0, desc("twomin=x")).Statuses[0]
			if want := i < 5; (st.Code == rlsv3.RateLimitResponse_OK) != want || st.DurationUntilReset.AsDuration() != 2*minute {
				t.Fatalf("call %d of a limit of 5 in two minutes: %v, duration_until_reset %v; want 2m, OK for the first 5",
					i, st.Code, st.DurationUntilReset.AsDuration())
			}
		}
		h.now.Store(start + (2 * minute).Milliseconds())
		if st := h.call(t, "cal", 0, desc("twomin=x")).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 4 {
			t.Fatalf("the next two minutes: %v, remaining %d; want OK, 4 (fixed: nothing weighs from before)", st.Code, st.LimitRemaining)
		}
	})

	t.Run("overrides are not calendar windows under fixed", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{Windows: Fixed})
		// Envoy's DAY over Tokyo's calendar limit: the epoch's day, which
		// ends at UTC's midnight, 16 hours away.
		expectStatus(t, h, override(desc("tokyo=x"), 2, typev3.RateLimitUnit_DAY), "OK", 1, 16*hour, 2, dayUnit)
		expectStatus(t, h, desc("tokyo=x"), "OK", 1, 7*hour, 2, dayUnit)
	})

	t.Run("overrides are not calendar windows under sliding", func(t *testing.T) {
		h := newHarnessOf(t, calendarConfig, ServerConfig{})
		utcMidnight := zoneMidnight(t, "UTC", 2027, 1, 16)
		h.call(t, "cal", 0, override(desc("tokyo=x"), 1, typev3.RateLimitUnit_DAY))
		h.now.Store(utcMidnight + 1)
		if st := h.call(t, "cal", 0, override(desc("tokyo=x"), 1, typev3.RateLimitUnit_DAY)).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("1 ms into the next day under the sliding rule: %v, want OVER_LIMIT (the day before still weighs)", st.Code)
		}
	})

	t.Run("the zone is checked", func(t *testing.T) {
		svc := service.New(service.Config{})
		t.Cleanup(func() { _ = svc.Close(context.Background()) })
		for _, c := range []struct {
			cfg  ServerConfig
			want string
		}{
			{ServerConfig{Service: svc, Windows: Calendar, Zone: "Mars/Olympus"}, `time zone "Mars/Olympus" is not an IANA zone name`},
			{ServerConfig{Service: svc, Windows: Fixed, Zone: "Europe/Berlin"}, "needs Windows Calendar"},
			{ServerConfig{Service: svc, Zone: "Europe/Berlin"}, "needs Windows Calendar"},
		} {
			if _, err := NewServer(c.cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
			}
		}
		if _, err := NewServer(ServerConfig{Service: svc, Windows: Calendar}, nil); err != nil {
			t.Errorf("calendar in UTC: %v", err)
		}
	})
}
