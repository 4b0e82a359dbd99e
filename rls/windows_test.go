package rls

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
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

// unit_multiplier and window are read strictly: a multiplier of 0, a
// window over 366 days, an unknown kind, or either on an unlimited
// rate_limit stop the load with an error that says what to fix.
func TestWindowKeysAreReadStrictly(t *testing.T) {
	for _, c := range []struct{ limit, want string }{
		{"{unit: minute, unit_multiplier: 0, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: minute, unit_multiplier: -2, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: minute, unit_multiplier: x, requests_per_unit: 1}", "unit_multiplier must be an integer from 1"},
		{"{unit: year, unit_multiplier: 2, requests_per_unit: 1}", "a window of 2 × YEAR is over 366 days"},
		{"{unit: day, unit_multiplier: 367, requests_per_unit: 1}", "a window of 367 × DAY is over 366 days"},
		{"{unit: minute, requests_per_unit: 1, window: tumbling}", `window "tumbling": want sliding or fixed`},
		{"{unlimited: true, window: fixed}", "should not specify unit_multiplier or window when unlimited"},
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
	if m := conf.domains["d"].keys["k"]; m == nil {
		t.Fatalf("no descriptor k in %+v", conf.domains["d"])
	}
}
