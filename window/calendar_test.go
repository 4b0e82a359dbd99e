package window

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func mustCalendar(t *testing.T, s string) int64 {
	t.Helper()
	code, ok, err := ParseCalendar(s)
	if !ok || err != nil {
		t.Fatalf("ParseCalendar(%q): %v, %v", s, ok, err)
	}
	return code
}

func at(t *testing.T, zone, s string) int64 {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v.UnixMilli()
}

// The period holding an instant starts and ends where the zone's calendar
// says: months of 28 to 31 days, days of 23 and 25 hours across daylight
// saving, ISO weeks across a year's end, a day whose midnight the clock
// skips, a day a zone skipped, and minutes of 60 s where a leap second was
// inserted (Unix time has none).
func TestCalendarPeriodsFollowTheZonesCalendar(t *testing.T) {
	for _, c := range []struct {
		period, zone, now, start, end string
	}{
		{"month@Europe/Berlin", "Europe/Berlin", "2026-11-28 12:00:00", "2026-11-01 00:00:00", "2026-12-01 00:00:00"},
		{"month@Europe/Berlin", "Europe/Berlin", "2028-02-29 23:59:59", "2028-02-01 00:00:00", "2028-03-01 00:00:00"},
		{"month@Europe/Berlin", "Europe/Berlin", "2027-02-10 00:00:00", "2027-02-01 00:00:00", "2027-03-01 00:00:00"},
		{"month@Europe/Berlin", "Europe/Berlin", "2026-10-31 23:00:00", "2026-10-01 00:00:00", "2026-11-01 00:00:00"}, // 31 days and an hour
		{"month", "UTC", "2026-12-31 23:59:59", "2026-12-01 00:00:00", "2027-01-01 00:00:00"},
		{"day@Europe/Berlin", "Europe/Berlin", "2026-03-29 12:00:00", "2026-03-29 00:00:00", "2026-03-30 00:00:00"},       // 23 hours
		{"day@Europe/Berlin", "Europe/Berlin", "2026-10-25 12:00:00", "2026-10-25 00:00:00", "2026-10-26 00:00:00"},       // 25 hours
		{"day@America/Santiago", "America/Santiago", "2026-09-06 12:00:00", "2026-09-06 01:00:00", "2026-09-07 00:00:00"}, // midnight skipped
		{"day@Pacific/Apia", "Pacific/Apia", "2011-12-31 12:00:00", "2011-12-31 00:00:00", "2012-01-01 00:00:00"},         // 30 December skipped
		{"day@Pacific/Apia", "Pacific/Apia", "2011-12-29 12:00:00", "2011-12-29 00:00:00", "2011-12-31 00:00:00"},
		{"week@Europe/Berlin", "Europe/Berlin", "2026-11-28 12:00:00", "2026-11-23 00:00:00", "2026-11-30 00:00:00"},
		{"week", "UTC", "2027-01-01 00:00:00", "2026-12-28 00:00:00", "2027-01-04 00:00:00"},
		{"week", "UTC", "1970-01-01 00:00:00", "1969-12-29 00:00:00", "1970-01-05 00:00:00"},
		{"year@Asia/Tokyo", "Asia/Tokyo", "2026-12-31 23:59:59", "2026-01-01 00:00:00", "2027-01-01 00:00:00"},
		{"hour@Asia/Kolkata", "Asia/Kolkata", "2026-11-28 10:59:00", "2026-11-28 10:00:00", "2026-11-28 11:00:00"},
		{"hour@Europe/Berlin", "Europe/Berlin", "2026-03-29 03:30:00", "2026-03-29 03:00:00", "2026-03-29 04:00:00"}, // 02:00 skipped
		{"minute", "UTC", "2016-12-31 23:59:59", "2016-12-31 23:59:00", "2017-01-01 00:00:00"},
		{"minute@Asia/Kolkata", "UTC", "2016-12-31 23:59:59", "2016-12-31 23:59:00", "2017-01-01 00:00:00"},
	} {
		d := mustCalendar(t, c.period)
		now := at(t, c.zone, c.now)
		seq := Sequence(now, d)
		start, end := Start(seq, d), End(seq, d)
		if want := at(t, c.zone, c.start); start != want {
			t.Errorf("%s at %s: starts %v, want %s", c.period, c.now, time.UnixMilli(start), c.start)
		}
		if want := at(t, c.zone, c.end); end != want {
			t.Errorf("%s at %s: ends %v, want %s", c.period, c.now, time.UnixMilli(end), c.end)
		}
		if dec := Decide(Input{Now: now, Duration: d, Limit: 10, Cost: 1}); dec.Reset != end {
			t.Errorf("%s at %s: reset %d, want the period's end %d", c.period, c.now, dec.Reset, end)
		}
	}
}

// Across the clock set back, the repeated hour is an hour of its own: the
// 25 hours of the day are 25 periods of one hour each.
func TestCalendarHoursOfADayOf25(t *testing.T) {
	d := mustCalendar(t, "hour@Europe/Berlin")
	from := at(t, "Europe/Berlin", "2026-10-25 00:00:00")
	seen := map[int64]bool{}
	for ms := from; ms < from+25*hourMs; ms += 15 * 60_000 {
		seq := Sequence(ms, d)
		if End(seq, d)-Start(seq, d) != hourMs {
			t.Fatalf("hour %d lasts %d ms", seq, End(seq, d)-Start(seq, d))
		}
		seen[seq] = true
	}
	if len(seen) != 25 {
		t.Fatalf("%d hours in a day of 25", len(seen))
	}
}

// Every period holding an instant contains it, periods follow one another
// without gap or overlap, sequences never go back, and Following is the end
// of the next period: for random instants of 1970 to 2100 in every unit and
// zones with daylight saving, half-hour offsets and skipped days.
func TestCalendarPeriodsTileTime(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	zones := []string{"", "Europe/Berlin", "America/Santiago", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Apia", "America/St_Johns"}
	hi := at(t, "UTC", "2100-01-01 00:00:00")
	for _, z := range zones {
		for u := Minute; u <= Year; u++ {
			d, err := Calendar(u, z)
			if err != nil {
				t.Fatal(err)
			}
			for range 300 {
				now := rnd.Int64N(hi)
				seq := Sequence(now, d)
				start, end := Start(seq, d), End(seq, d)
				if start > now || now >= end {
					t.Fatalf("%s: %v is outside its period %d [%v, %v)", CalendarName(d), time.UnixMilli(now), seq, time.UnixMilli(start), time.UnixMilli(end))
				}
				next := Sequence(end, d)
				if next <= seq || Start(next, d) != end {
					t.Fatalf("%s: period %d ends %v; the next (%d) starts %v", CalendarName(d), seq, time.UnixMilli(end), next, time.UnixMilli(Start(next, d)))
				}
				if Sequence(end-1, d) != seq {
					t.Fatalf("%s: the last instant of period %d is in %d", CalendarName(d), seq, Sequence(end-1, d))
				}
				if f := Following(seq, d); f != End(next, d) {
					t.Fatalf("%s: Following(%d) = %d, want %d", CalendarName(d), seq, f, End(next, d))
				}
				if err := (Cell{Workspace: "w", Namespace: "n", Identifier: "i", Duration: d, Sequence: seq, Epoch: now}).Validate(); err != nil {
					t.Fatalf("%s: %v", CalendarName(d), err)
				}
			}
		}
	}
}

// A calendar period is a fixed window: the previous cell weighs nothing,
// and a denial waits for the period's end.
func TestCalendarPeriodsAreFixedWindows(t *testing.T) {
	d := mustCalendar(t, "month@Europe/Berlin")
	now := at(t, "Europe/Berlin", "2026-11-28 12:00:00")
	end := at(t, "Europe/Berlin", "2026-12-01 00:00:00")
	dec := Decide(Input{Now: now, Duration: d, Limit: 10_000, Cost: 1, Current: 9_999, Previous: 10_000})
	if !dec.Admitted || dec.Remaining != 0 {
		t.Fatalf("9,999 of 10,000 used, a full previous month: %+v, want admitted with 0 left", dec)
	}
	dec = Decide(Input{Now: now, Duration: d, Limit: 10_000, Cost: 1, Current: 10_000})
	if dec.Admitted || dec.RetryAfter != end-now || dec.Reset != end {
		t.Fatalf("over the month's quota: %+v, want retry after %d, reset %d", dec, end-now, end)
	}
	if r := Room(Input{Now: now, Duration: d, Limit: 10_000, Cost: 1, Previous: 10_000}); r != 9_999 {
		t.Fatalf("room %d, want 9,999", r)
	}
}

func TestParseCalendar(t *testing.T) {
	for _, s := range []string{"minute", "hour", "day", "week", "month", "year", "day@Europe/Berlin", "month@America/New_York", "year@Asia/Tokyo"} {
		d := mustCalendar(t, s)
		if !IsCalendar(d) || ValidDuration(d) != nil || CalendarName(d) != s {
			t.Errorf("%q: code %d reads back as %q", s, d, CalendarName(d))
		}
	}
	if a, b := mustCalendar(t, "day"), mustCalendar(t, "day@UTC"); a != b {
		t.Errorf("day and day@UTC differ: %d, %d", a, b)
	}
	if a, b := mustCalendar(t, "minute"), mustCalendar(t, "minute@Europe/Berlin"); a != b {
		t.Errorf("a minute differs by zone: %d, %d", a, b)
	}
	for _, s := range []string{"month@Mars/Olympus", "day@", "day@europe/berlin"} {
		if _, ok, err := ParseCalendar(s); !ok || err == nil {
			t.Errorf("%q: ok %v, err %v; want a unit with a bad zone", s, ok, err)
		}
	}
	for _, s := range []string{"", "sliding", "fixed", "months", "Month"} {
		if _, ok, _ := ParseCalendar(s); ok {
			t.Errorf("%q read as a calendar period", s)
		}
	}
	for _, d := range []int64{calendarBase, calendarBase + 7, maxCalendar + 1, MaxDuration + 1, MinDuration - 1} {
		if ValidDuration(d) == nil {
			t.Errorf("duration %d accepted", d)
		}
	}
}

// DurationOf takes exactly one of a window length and a calendar period,
// each within its rule.
func TestDurationOf(t *testing.T) {
	month := mustCalendar(t, "month@Europe/Berlin")
	for _, c := range []struct {
		length time.Duration
		period string
		want   int64
		err    string
	}{
		{time.Minute, "", 60_000, ""},
		{0, "month@Europe/Berlin", month, ""},
		{time.Minute, "day", 0, "both set"},
		{0, "", 0, "neither"},
		{999 * time.Millisecond, "", 0, "whole milliseconds from 1s"},
		{1500 * time.Millisecond, "", 1500, ""},
		{time.Second + time.Microsecond, "", 0, "whole milliseconds"},
		{367 * 24 * time.Hour, "", 0, "whole milliseconds"},
		{0, "fortnight", 0, CalendarRule},
		{0, "day@Mars/Olympus", 0, "Mars/Olympus"},
	} {
		got, err := DurationOf(c.length, c.period)
		if c.err == "" && (err != nil || got != c.want) || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("DurationOf(%v, %q) = %d, %v; want %d, error containing %q", c.length, c.period, got, err, c.want, c.err)
		}
	}
}
