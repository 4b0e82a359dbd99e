package window

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	_ "time/tzdata" // every zone of zoneNames loads on a host without a tz database
)

// A calendar period is a window aligned to the calendar: a minute, an hour,
// a day, an ISO week, a month or a year of a time zone. Its cells carry, in
// place of a duration in milliseconds, a duration code (Calendar) naming
// the unit and the zone, so that every layer that keys, stores or carries
// a cell carries the period with it and every process reads the same
// boundaries from it. A calendar period is a fixed window: each period is
// a cell of its own and no weight comes from the previous one; reset and
// retry-after are the period's end.
//
// Sequences of a calendar period grow with time, one a period, as those
// of a duration do, with one exception: an hour's sequence is 25 times
// the day's plus the hour since the zone's midnight, so a day of 23 hours
// skips two sequences and a day of 25 uses them all. A minute is the
// epoch's minute in every zone (every zone's offset has been a whole
// number of minutes since 1972); an hour counts from the zone's midnight,
// so the repeated hour of a clock set back is an hour of its own; a day,
// week, month and year begin at the zone's midnight (or at the first
// instant after it where the clock skips midnight).

// Unit is the unit of a calendar period.
type Unit uint8

// The units of a calendar period.
const (
	Minute Unit = 1 + iota
	Hour
	Day
	Week // ISO 8601: Monday to Sunday
	Month
	Year
)

var unitNames = [...]string{Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns the unit's name as Calendar reads it.
func (u Unit) String() string {
	if u >= Minute && u <= Year {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// calendarBase is the first duration code of a calendar period: far above
// MaxDuration, so a duration and a calendar period never share a value.
// A code is calendarBase + zone index<<3 + unit.
const calendarBase = 1 << 40

// maxCalendar is the largest duration code.
const maxCalendar = calendarBase + int64(len(zoneNames)-1)<<3 + int64(Year)

// IsCalendar reports whether duration d is a calendar period's code (valid
// or not) rather than milliseconds.
func IsCalendar(d int64) bool { return d >= calendarBase }

// Calendar returns the duration code of the period of unit u in the named
// IANA zone ("" is UTC). A minute is the same in every zone, so its code
// names UTC whatever the zone.
func Calendar(u Unit, zone string) (int64, error) {
	if u < Minute || u > Year {
		return 0, fmt.Errorf("calendar unit %d is not minute, hour, day, week, month or year", u)
	}
	z, ok := zoneIndexes[zone] // "UTC" is zone 0, as "" is
	if !ok && zone != "" {
		return 0, fmt.Errorf("time zone %q is not an IANA zone name", zone)
	}
	if u == Minute {
		z = 0
	}
	return calendarBase + int64(z)<<3 + int64(u), nil
}

// CalendarRule is how a calendar period is written, as every message says.
const CalendarRule = "minute, hour, day, week, month or year, optionally followed by @ and an IANA time zone (month@Europe/Berlin)"

// ParseCalendar reads a calendar period as "<unit>" or "<unit>@<zone>"
// (day@America/New_York) and returns its duration code; ok is false when
// s does not start with a unit name, so that the caller may read it as
// something else.
func ParseCalendar(s string) (code int64, ok bool, err error) {
	unit, zone, at := strings.Cut(s, "@")
	for u := Minute; u <= Year; u++ {
		if unit == unitNames[u] {
			if at && zone == "" {
				return 0, true, fmt.Errorf("calendar period %q names no time zone after @", s)
			}
			code, err := Calendar(u, zone)
			return code, true, err
		}
	}
	return 0, false, nil
}

// CalendarName returns the period of code d as ParseCalendar reads it
// ("month@Europe/Berlin", "day" in UTC), or "" when d is not a valid code.
func CalendarName(d int64) string {
	u, z, ok := calendarOf(d)
	if !ok {
		return ""
	}
	if z == 0 {
		return unitNames[u]
	}
	return unitNames[u] + "@" + zoneNames[z]
}

// calendarOf splits code d into its unit and zone index.
func calendarOf(d int64) (Unit, int, bool) {
	if d < calendarBase || d > maxCalendar {
		return 0, 0, false
	}
	u, z := Unit(d&7), int((d-calendarBase)>>3)
	return u, z, u >= Minute && u <= Year
}

// zoneIndexes is zoneNames inverted: a check naming a zone finds it in one
// lookup.
var zoneIndexes = func() map[string]int {
	m := make(map[string]int, len(zoneNames))
	for i, n := range zoneNames {
		m[n] = i
	}
	return m
}()

// zoneCache holds each zone once loaded: the tz database's rules, which
// never change while the process runs, read once instead of per check.
var zoneCache [len(zoneNames)]atomic.Pointer[time.Location]

func zoneOf(z int) *time.Location {
	if z == 0 {
		return time.UTC
	}
	if l := zoneCache[z].Load(); l != nil {
		return l
	}
	l, err := time.LoadLocation(zoneNames[z])
	if err != nil { // unreachable: time/tzdata holds every name of zoneNames
		l = time.UTC
	}
	zoneCache[z].Store(l)
	return l
}

// spanCache holds, by duration code, the last period a calendar
// computation found: checks in that period, nearly all of them, are then
// answered by two comparisons instead of a reading of the zone's calendar.
// Like zoneCache, it only saves work: every entry is what calendarSpan
// would compute again.
var spanCache [len(zoneNames) << 3]atomic.Pointer[calendarPeriod]

// calendarPeriod is one period of a calendar code: its sequence, start and
// end.
type calendarPeriod struct{ seq, start, end int64 }

// cachedPeriod returns the period of code spanCache holds, or nil.
func cachedPeriod(code int64) *calendarPeriod {
	if i := code - calendarBase; i >= 0 && i < int64(len(spanCache)) {
		return spanCache[i].Load()
	}
	return nil
}

// calendarSpan returns the sequence, start and end of the period of code
// holding now (start <= now < end for a valid code).
func calendarSpan(now, code int64) (seq, start, end int64) {
	i := code - calendarBase
	if i < 0 || i >= int64(len(spanCache)) {
		return 0, 0, 0
	}
	if p := spanCache[i].Load(); p != nil && p.start <= now && now < p.end {
		return p.seq, p.start, p.end
	}
	seq = calendarSequence(now, code)
	start, end = calendarStart(seq, code), calendarEnd(seq, code)
	if start <= now && now < end {
		spanCache[i].Store(&calendarPeriod{seq, start, end})
	}
	return seq, start, end
}

// ValidDuration reports whether d is a window the API accepts: MinDuration
// to MaxDuration milliseconds, or a calendar period's code.
func ValidDuration(d int64) error {
	if _, _, ok := calendarOf(d); ok || d >= MinDuration && d <= MaxDuration {
		return nil
	}
	return fmt.Errorf("duration %d is neither %d to %d milliseconds nor a calendar period", d, MinDuration, MaxDuration)
}

const (
	dayMs  = 86_400_000
	hourMs = 3_600_000
)

// dayStart returns the first instant (unix ms) of the zone's day number
// day (days since 1970-01-01 in the zone's calendar).
func dayStart(day int64, loc *time.Location) int64 {
	y, m, d := time.UnixMilli(day * dayMs).UTC().Date()
	return midnight(y, m, d, loc)
}

// midnight returns the first instant (unix ms) of date y-m-d in loc: its
// midnight, or where the clock skips midnight (or the whole day) the
// instant it jumps to, which time.Date may place before the jump.
func midnight(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if ly, lm, ld := t.Date(); ly != y || lm != m || ld != d {
		// t lies before the jump, on the day before: the day begins where
		// t's offset ends.
		if _, end := t.ZoneBounds(); !end.IsZero() {
			return end.UnixMilli()
		}
	}
	return t.UnixMilli()
}

// localDay returns the zone's day number of instant now, and its year and
// month.
func localDay(now int64, loc *time.Location) (day int64, y int, m time.Month) {
	y, m, d := time.UnixMilli(now).In(loc).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMilli() / dayMs, y, m
}

// calendarSequence is Sequence for a calendar period.
func calendarSequence(now, code int64) int64 {
	u, z, ok := calendarOf(code)
	if !ok {
		return 0
	}
	if u == Minute {
		return floorDiv(now, 60_000)
	}
	loc := zoneOf(z)
	day, y, m := localDay(now, loc)
	switch u {
	case Hour:
		h := floorDiv(now-dayStart(day, loc), hourMs)
		return day*25 + min(max(h, 0), 24)
	case Day:
		return day
	case Week:
		return floorDiv(day+3, 7) // 1970-01-01 was a Thursday: its week began on day -3
	case Month:
		return int64(y-1970)*12 + int64(m-1)
	}
	return int64(y - 1970)
}

// calendarStart is Start for a calendar period.
func calendarStart(seq, code int64) int64 {
	if p := cachedPeriod(code); p != nil && p.seq == seq {
		return p.start
	}
	u, z, ok := calendarOf(code)
	if !ok {
		return 0
	}
	if u == Minute {
		return seq * 60_000
	}
	loc := zoneOf(z)
	switch u {
	case Hour:
		day := floorDiv(seq, 25)
		return min(dayStart(day, loc)+(seq-day*25)*hourMs, dayStart(day+1, loc))
	case Day:
		return dayStart(seq, loc)
	case Week:
		return dayStart(seq*7-3, loc)
	case Month:
		return midnight(1970+int(floorDiv(seq, 12)), time.Month(seq-floorDiv(seq, 12)*12+1), 1, loc)
	}
	return midnight(1970+int(seq), 1, 1, loc)
}

// calendarEnd is End for a calendar period.
func calendarEnd(seq, code int64) int64 {
	if p := cachedPeriod(code); p != nil && p.seq == seq {
		return p.end
	}
	if u, z, ok := calendarOf(code); ok && u == Hour {
		day := floorDiv(seq, 25)
		return min(calendarStart(seq, code)+hourMs, dayStart(day+1, zoneOf(z)))
	}
	return calendarStart(seq+1, code)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// DurationOf returns the Duration of checks that count in a window of
// length (whole milliseconds, MinDuration to MaxDuration) or in the
// calendar period named by period (ParseCalendar): exactly one of them
// set. The error says which rule the pair breaks.
func DurationOf(length time.Duration, period string) (int64, error) {
	lo, hi := MinDuration*time.Millisecond, MaxDuration*time.Millisecond
	switch {
	case length != 0 && period != "":
		return 0, fmt.Errorf("window and period are both set (%v and %q): set one", length, period)
	case period != "":
		code, ok, err := ParseCalendar(period)
		if !ok {
			return 0, fmt.Errorf("period must be %s, got %q", CalendarRule, period)
		}
		if err != nil {
			return 0, fmt.Errorf("period %q: %w", period, err)
		}
		return code, nil
	case length == 0:
		return 0, fmt.Errorf("neither window (whole milliseconds from %v to %v) nor period (%s) is set", lo, hi, CalendarRule)
	case length%time.Millisecond != 0 || length < lo || length > hi:
		return 0, fmt.Errorf("window must be whole milliseconds from %v to %v, got %v", lo, hi, length)
	}
	return length.Milliseconds(), nil
}
