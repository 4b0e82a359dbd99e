package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/window"
)

func TestFieldValuesAreStructuredFieldItems(t *testing.T) {
	cases := []struct{ got, want string }{
		{policyField("api", 100, 60_000), `"api";q=100;w=60`},
		{policyField("api", 100, 1_500), `"api";q=100;w=2`}, // rounded up
		{policyField("api", 0, 0), `"api";q=0`},
		{policyField(`a"b\c`, 1, 1_000), `"a\"b\\c";q=1;w=1`},
		{limitField("api", 42, 17), `"api";r=42;t=17`},
		{limitField("api", 0, 0), `"api";r=0;t=0`},
		{limitField("api", 5, -1), `"api";r=5`},
		{limitField("api", -3, 2), `"api";r=0;t=2`},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for ms, want := range map[int64]int64{-5: 0, 0: 0, 1: 1, 999: 1, 1000: 1, 1001: 2, 36_000: 36, 86_400_001: 86_401} {
		if got := ceilSeconds(ms); got != want {
			t.Errorf("ceilSeconds(%d) = %d, want %d", ms, got, want)
		}
	}
}

func TestPolicyNames(t *testing.T) {
	for _, ok := range []string{"api", "a b", `"\`, "~!@#"} {
		if err := checkPolicyName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "tab\there", "é", "x\x7f", string(make([]byte, 65))} {
		if err := checkPolicyName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The fields of one reply, at 2026-11-27T12:00:10.250Z, 10.25 s into a
// one-minute window that resets at 12:01:00.
func TestFieldsOfAReply(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 10, 250_000_000, time.UTC)
	reset := time.Date(2026, 11, 27, 12, 1, 0, 0, time.UTC).UnixMilli()
	f := fields{name: "api", windowMs: 60_000}
	cases := []struct {
		name string
		f    fields
		resp bus.CheckResponse
		want map[string]string // "" : absent
	}{
		{name: "admitted", f: f, resp: bus.CheckResponse{Success: true, Limit: 100, Remaining: 42, Reset: reset},
			want: map[string]string{"RateLimit-Policy": `"api";q=100;w=60`, "RateLimit": `"api";r=42;t=50`, "Retry-After": ""}},
		{name: "denied", f: f, resp: bus.CheckResponse{Limit: 100, Reset: reset, RetryAfter: 49_750 + 600},
			want: map[string]string{"RateLimit-Policy": `"api";q=100;w=60`, "RateLimit": `"api";r=0;t=51`, "Retry-After": "51"}},
		{name: "denied for under a second", f: f, resp: bus.CheckResponse{Limit: 100, Reset: reset, RetryAfter: 1},
			want: map[string]string{"RateLimit": `"api";r=0;t=1`, "Retry-After": "1"}},
		{name: "never", f: f, resp: bus.CheckResponse{Limit: 1, Remaining: 1, Reset: reset, RetryAfter: bus.RetryNever},
			want: map[string]string{"RateLimit-Policy": `"api";q=1;w=60`, "RateLimit": `"api";r=1`, "Retry-After": ""}},
		{name: "override: its limit, no window", f: f, resp: bus.CheckResponse{Success: true, Limit: 5, Remaining: 4, Reset: reset, Override: "user_*"},
			want: map[string]string{"RateLimit-Policy": `"api";q=5`, "RateLimit": `"api";r=4;t=50`}},
		{name: "reset behind this clock", f: f, resp: bus.CheckResponse{Success: true, Limit: 100, Remaining: 1, Reset: now.UnixMilli() - 5},
			want: map[string]string{"RateLimit": `"api";r=1;t=0`}},
		{name: "shadow denied is admitted", f: f, resp: bus.CheckResponse{Success: true, ShadowDenied: true, Limit: 100, Reset: reset},
			want: map[string]string{"RateLimit": `"api";r=0;t=50`, "Retry-After": ""}},
		{name: "legacy", f: fields{name: "api", windowMs: 60_000, legacy: true},
			resp: bus.CheckResponse{Success: true, Limit: 100, Remaining: 42, Reset: reset},
			want: map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "42", "X-RateLimit-Reset": "1795780860"}},
		{name: "no legacy unless asked", f: f, resp: bus.CheckResponse{Success: true, Limit: 100, Remaining: 42, Reset: reset},
			want: map[string]string{"X-RateLimit-Limit": "", "X-RateLimit-Remaining": "", "X-RateLimit-Reset": ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			c.f.write(h, c.resp, now)
			for k, v := range c.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
				if v == "" && len(h.Values(k)) > 0 {
					t.Errorf("%s present: %q", k, h.Values(k))
				}
			}
		})
	}
}

// Under a calendar period w is the length of the period the reply was
// decided in, the one its reset ends, as the zone's calendar has it: the
// 25 hours of 25 October 2026 in Berlin, the day the clocks go back; with
// no reset in the reply, the period holding the middleware's clock; with
// an override, no w.
func TestFieldsOfACalendarPeriod(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	code, _, err := window.ParseCalendar("day@Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	f := fields{name: "daily", period: code}
	now := time.Date(2026, 10, 25, 12, 0, 0, 0, berlin)
	start, end := time.Date(2026, 10, 25, 0, 0, 0, 0, berlin), time.Date(2026, 10, 26, 0, 0, 0, 0, berlin)
	if got := end.Sub(start); got != 25*time.Hour {
		t.Fatalf("the day is %v long, want 25h", got)
	}
	for _, c := range []struct {
		name string
		now  time.Time
		resp bus.CheckResponse
		want string
	}{
		{"the reply's period", now, bus.CheckResponse{Success: true, Limit: 7, Remaining: 6, Reset: end.UnixMilli()}, `"daily";q=7;w=90000`},
		{"the reply's period, not the clock's", end.Add(time.Second), bus.CheckResponse{Limit: 7, Reset: end.UnixMilli(), RetryAfter: 1},
			`"daily";q=7;w=90000`},
		{"no reset: the clock's period", end.Add(time.Hour), bus.CheckResponse{Limit: 7, RetryAfter: bus.RetryNever}, `"daily";q=7;w=86400`},
		{"override", now, bus.CheckResponse{Success: true, Limit: 9, Reset: end.UnixMilli(), Override: "*"}, `"daily";q=9`},
	} {
		h := http.Header{}
		f.write(h, c.resp, c.now)
		if got := h.Get("RateLimit-Policy"); got != c.want {
			t.Errorf("%s: RateLimit-Policy %q, want %q", c.name, got, c.want)
		}
	}
}
