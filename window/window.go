// Package window holds the sliding-window rule of Sluice: cell identity,
// sequences, the exact admission decision, remaining, reset and retry-after.
//
// Time is divided into fixed windows of a duration (milliseconds). The window
// holding instant now has sequence now/duration; its cell counts the cost
// admitted in it. A request is judged against the current cell plus the
// previous cell weighted by how much of the previous window still overlaps the
// sliding window ending now:
//
//	current + previous*(duration-elapsed)/duration + cost <= limit
//
// Decide evaluates that rule exactly, in 128-bit integer arithmetic, for every
// value the client API accepts (limits and costs up to 10^15, durations up to
// 366 days, counts up to MaxCount). Everything here is a pure function of its
// arguments: there is no clock and no state, so callers drive time by passing
// instants.
package window

import (
	"fmt"
	"math/bits"
	"strconv"
)

// MaxCount is the largest count a cell holds. Counts above it are treated as
// MaxCount; it is far above any limit the API accepts, so saturation never
// changes a decision.
const MaxCount = 1 << 62

// Cell identifies one fixed window of one identifier: the unit that counters,
// origin cells and global components are kept for. The limit is not part of a cell.
type Cell struct {
	Workspace  string
	Namespace  string
	Identifier string
	Duration   int64 // milliseconds, or a calendar period's code (Calendar)
	Sequence   int64 // Sequence(unix_ms, Duration)
	// Epoch is the reset epoch that is part of the cell's identity (unix
	// ms; docs/architecture.md, "Reset"): 0 for a cell never reset, else
	// the epoch of the reset whose window is Sequence or a later one.
	// Cells that differ only in Epoch are different cells.
	Epoch int64
}

// Expiry returns when c stops mattering: the end of the window after it, the
// last window in which c still weighs, plus graceMs for clocks that disagree.
// Stores may forget c after that.
func (c Cell) Expiry(graceMs int64) int64 {
	return Following(c.Sequence, c.Duration) + graceMs
}

// Sequence returns the sequence of the window of duration d (milliseconds,
// or a calendar period's code) holding unix millisecond now. Instants before
// the epoch are not supported and yield sequence 0 or less, which Decide
// still treats consistently.
func Sequence(now, d int64) int64 {
	if d < calendarBase {
		return now / d
	}
	seq, _, _ := calendarSpan(now, d)
	return seq
}

// Start returns the unix millisecond at which window seq of duration d
// begins.
func Start(seq, d int64) int64 {
	if d < calendarBase {
		return seq * d
	}
	return calendarStart(seq, d)
}

// End returns the unix millisecond at which window seq of duration d ends:
// the start of the window after it.
func End(seq, d int64) int64 {
	if d < calendarBase {
		return (seq + 1) * d
	}
	return calendarEnd(seq, d)
}

// Following returns the end of the window after window seq of duration d:
// the last instant at which seq's cell may weigh in a sliding window.
func Following(seq, d int64) int64 {
	if d < calendarBase {
		return (seq + 2) * d
	}
	return calendarEnd(calendarSequence(calendarEnd(seq, d), d), d)
}

// bounds returns the start and end of the window of duration d holding
// now, with start <= now < end.
func bounds(now, d int64) (start, end int64) {
	if d < calendarBase {
		s := now / d * d
		return s, s + d
	}
	_, start, end = calendarSpan(now, d)
	if end <= start { // not a valid code: a window of one millisecond
		start, end = now, now+1
	}
	return min(start, now), max(end, now+1)
}

// Decision is the outcome of one check against the rule.
type Decision struct {
	// Admitted reports whether the request's cost fits under the limit.
	Admitted bool
	// Remaining is how much more cost would be admitted now, after this
	// decision (with the cost counted when Admitted): never negative.
	Remaining int64
	// Reset is the unix millisecond at which the current fixed window ends.
	Reset int64
	// RetryAfter is how many milliseconds until a request of the same cost
	// would be admitted if nothing else arrived; 0 when Admitted. When cost
	// exceeds the limit no wait suffices and RetryAfter is RetryNever; it is
	// negative in no other case.
	RetryAfter int64
}

// RetryNever is the RetryAfter of a denial that no wait can turn into an
// admission: the cost exceeds the limit (any cost above 0 under limit 0).
// It is the only negative RetryAfter, so a client can tell "never" from
// "later" without knowing the rule.
const RetryNever = -1

// Charge is how a check's cost is charged. Every layer (the limiter, its
// origin, the wire, the clients, Envoy's service) speaks of it by these
// names.
type Charge uint8

const (
	// ChargeAll, the default, admits the cost whole when it fits and
	// charges nothing when it does not: a request decided before the work.
	ChargeAll Charge = iota
	// ChargeDrain admits the cost whole when it fits; when it does not, it
	// charges what the limit has left (nothing when nothing is left) and is
	// denied, so later checks are denied until the window frees room
	// (Gubernator's DRAIN_OVER_LIMIT).
	ChargeDrain
	// ChargeDebit charges the whole cost whether it fits or not: usage known
	// after the work (tokens a response used, bytes it sent), which counts
	// even past the limit and is never refused. Its decision says whether
	// the usage is within the limit once charged; later checks are denied
	// until the window has paid off what went past it.
	ChargeDebit
)

// ParseCharge returns the Charge s names: "all", "drain" or "debit".
func ParseCharge(s string) (Charge, error) {
	for c, name := range chargeNames {
		if s == name {
			return Charge(c), nil
		}
	}
	return ChargeAll, fmt.Errorf("charge %q: want all, drain or debit", s)
}

// chargeNames names each Charge, for ParseCharge and String alike.
var chargeNames = [...]string{ChargeAll: "all", ChargeDrain: "drain", ChargeDebit: "debit"}

// String returns the name ParseCharge reads.
func (c Charge) String() string {
	if int(c) < len(chargeNames) {
		return chargeNames[c]
	}
	return "Charge(" + strconv.Itoa(int(c)) + ")"
}

// Input is what one decision needs. Current and Previous are the counts of the
// current cell and of the cell before it (regional plus imported usage);
// negative counts are treated as 0 and counts above MaxCount as MaxCount.
type Input struct {
	Now      int64 // unix milliseconds
	Duration int64 // milliseconds, > 0, or a calendar period (Calendar)
	Limit    int64 // >= 0
	Cost     int64 // >= 0
	Current  int64
	Previous int64
	// Fixed asks for a fixed window: the cell alone is weighed, as if
	// Previous were 0, so the whole limit comes back at the window's end
	// (Reset). The default is the sliding window; a calendar period is
	// always fixed.
	Fixed bool
}

// Decide applies the rule to in. It allocates nothing and never rounds in the
// caller's favour: a request is admitted iff
// (Current+Cost)*Duration + Previous*(Duration-elapsed) <= Limit*Duration,
// computed in 128 bits (Previous 0 in a fixed window).
func Decide(in Input) Decision {
	start, end := bounds(in.Now, in.Duration)
	d := uint64(end - start)
	elapsed := uint64(in.Now - start)
	rest := d - elapsed // weight numerator of the previous cell, in (0, d]
	cur, prev := clamp(in.Current), clamp(in.Previous)
	fixed := in.Fixed || in.Duration >= calendarBase
	if fixed {
		prev = 0 // a fixed window weighs no previous cell
	}
	limit, cost := clamp(in.Limit), clamp(in.Cost)

	dec := Decision{Reset: end}
	// usage*d = cur*d + prev*rest, as 128-bit hi:lo.
	hi, lo := bits.Mul64(cur+cost, d)
	phi, plo := bits.Mul64(prev, rest)
	hi, lo = add(hi, lo, phi, plo)
	lhi, llo := bits.Mul64(limit, d)
	dec.Admitted = !less(lhi, llo, hi, lo)
	if dec.Admitted {
		cur += cost
	}
	// remaining = max(0, limit - ceil(cur + prev*rest/d))
	used := cur + ceilDiv(prev, rest, d)
	if used < limit {
		dec.Remaining = int64(limit - used)
	}
	if !dec.Admitted {
		dec.RetryAfter = retryAfter(cur, prev, limit, cost, elapsed, d, fixed)
	}
	return dec
}

// retryAfter returns the milliseconds from elapsed (into the current window of
// length d) until cur+cost plus the decaying previous cell first fits under
// limit, assuming no further traffic.
func retryAfter(cur, prev, limit, cost, elapsed, d uint64, fixed bool) int64 {
	toEnd := d - elapsed
	if cur+cost <= limit {
		// Within this window: need prev*(d-e) <= slack*d, i.e. e >= d - floor(slack*d/prev).
		// prev > 0 here, or the request would have been admitted.
		slack := limit - cur - cost
		q := floorMulDiv(slack, d, prev, d)
		e := d - q
		if e < d {
			return int64(e - elapsed)
		}
		// The previous cell's weight reaches zero exactly at the window end.
		return int64(toEnd)
	}
	if cost > limit {
		return RetryNever
	}
	// In the next window: current becomes 0 and this window's cur becomes the
	// previous cell, weighted (d-x)/d at x ms into it (not at all in a fixed
	// window, where prev is 0). Need cur*(d-x) <= (limit-cost)*d.
	if cur == 0 || fixed {
		return int64(toEnd)
	}
	q := floorMulDiv(limit-cost, d, cur, d)
	return int64(toEnd + (d - q))
}

// floorMulDiv returns min(floor(a*b/c), max) for c > 0 without overflow.
func floorMulDiv(a, b, c, max uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return max // quotient would not fit in 64 bits; certainly >= max
	}
	q, _ := bits.Div64(hi, lo, c)
	if q > max {
		return max
	}
	return q
}

// ceilDiv returns ceil(a*b/d) for b <= d, d > 0.
func ceilDiv(a, b, d uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, r := bits.Div64(hi, lo, d) // a*b/d <= a, so hi < d
	if r != 0 {
		q++
	}
	return q
}

func clamp(v int64) uint64 {
	switch {
	case v < 0:
		return 0
	case v > MaxCount:
		return MaxCount
	}
	return uint64(v)
}

func add(hi, lo, hi2, lo2 uint64) (uint64, uint64) {
	lo, c := bits.Add64(lo, lo2, 0)
	hi, _ = bits.Add64(hi, hi2, c)
	return hi, lo
}

// less reports whether a < b for 128-bit values.
func less(ahi, alo, bhi, blo uint64) bool {
	return ahi < bhi || (ahi == bhi && alo < blo)
}

// Bounds of the client API under which Decide is exact. Requests outside them
// are rejected before they reach the rule.
const (
	// MaxLimit is the largest limit a check may ask for.
	MaxLimit = 1_000_000_000_000_000
	// MaxCost is the largest cost one check may spend.
	MaxCost = MaxLimit
	// MinDuration is the shortest window, in milliseconds.
	MinDuration = 1000
	// MaxDuration is the longest window, in milliseconds (366 days, so
	// that Envoy's YEAR unit fits).
	MaxDuration = 31_622_400_000
	// MaxIdentifierLen is the longest identifier, in bytes.
	MaxIdentifierLen = 512
)

// MaxTokenLen is the longest workspace, namespace or region token.
const MaxTokenLen = 64

// TokenRule is the token rule (ValidToken) as every message says it.
const TokenRule = "1 to 64 characters of [A-Za-z0-9_-]"

// TokenError returns the error for a token that breaks the rule:
// "<what> "<s>" is not " + TokenRule.
func TokenError(what, s string) error {
	return fmt.Errorf("%s %q is not %s", what, s, TokenRule)
}

// ValidToken reports whether s is a workspace, namespace or region token: 1
// to MaxTokenLen characters, each of [A-Za-z0-9_-]. It takes the bytes of a
// request as they are, without converting them.
func ValidToken[T string | []byte](s T) bool {
	if len(s) == 0 || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// MaxTime is the latest unix millisecond a cell may start at (about 140,000
// years from 1970): every instant derived from a valid cell (its start, its
// end, the end of the window after it, plus any expiry grace below MaxTime)
// fits in an int64.
const MaxTime = 1 << 52

// MaxSequence returns the largest valid sequence of duration d: the window
// after it still starts before MaxTime.
func MaxSequence(d int64) int64 {
	if d < calendarBase {
		return MaxTime/d - 1
	}
	// The unit's sequence at that instant in UTC: two years below MaxTime,
	// so no zone's offset takes an instant of a valid cell past it, and
	// no zone's rules are read to validate a cell.
	return calendarSequence(MaxTime-2*MaxDuration, calendarBase+d&7)
}

// Validate reports whether c is a cell the client API could have made:
// tokens satisfying ValidToken, an identifier of 1 to MaxIdentifierLen bytes,
// a duration ValidDuration accepts, a sequence of 0 to
// MaxSequence(duration), an epoch of 0 or of Start(sequence) to
// Start(sequence+2)+MaxEpochLead-1 (a reset's epoch lies in the window of
// the cell that carries it or in the next: the current and previous cells
// of a check in the reset's window; MaxEpochLead tolerates a host whose
// clock is behind the reset's). Arithmetic on a valid cell's instants never
// overflows. It says nothing of whether the cell is near any clock.
func (c Cell) Validate() error {
	switch {
	case !ValidToken(c.Workspace):
		return TokenError("workspace", c.Workspace)
	case !ValidToken(c.Namespace):
		return TokenError("namespace", c.Namespace)
	case len(c.Identifier) == 0 || len(c.Identifier) > MaxIdentifierLen:
		return fmt.Errorf("identifier of %d bytes is not 1 to %d bytes", len(c.Identifier), MaxIdentifierLen)
	case ValidDuration(c.Duration) != nil:
		return ValidDuration(c.Duration)
	case c.Sequence < 0 || c.Sequence > MaxSequence(c.Duration):
		return fmt.Errorf("sequence %d out of range 0..%d", c.Sequence, MaxSequence(c.Duration))
	case c.Epoch != 0 && (c.Epoch < Start(c.Sequence, c.Duration) || c.Epoch > MaxTime ||
		c.Epoch >= Following(c.Sequence, c.Duration)+MaxEpochLead):
		return fmt.Errorf("epoch %d is neither 0 nor in range %d..%d", c.Epoch, Start(c.Sequence, c.Duration),
			min(Following(c.Sequence, c.Duration)+MaxEpochLead-1, MaxTime))
	}
	return nil
}

// MaxEpochLead is how far, at most, a cell's epoch lies beyond the end of
// the window after the cell's (milliseconds): a host whose clock is behind
// the reset's by up to this much may count into an earlier window's cell of
// that epoch after learning the reset. Far above any tolerated clock skew.
const MaxEpochLead = 60_000

// AddCounts returns a+b for counts a, b >= 0, saturated at MaxCount (never
// wrapping): a sum of counts from many sources stays a count, and a count at
// MaxCount denies every request.
func AddCounts(a, b int64) int64 {
	if s := a + b; s >= a && s <= MaxCount {
		return s
	}
	return MaxCount
}

// Room returns the largest Current at which Decide admits in (in.Current
// itself is ignored): floor((Limit·Duration − Previous·(Duration−elapsed)) /
// Duration) − Cost (Previous 0 in a fixed window), computed exactly in 128
// bits, or -1 when no Current fits. An origin that knows the current cell's count can then admit
// exactly, comparing one integer, without multiplying anything.
func Room(in Input) int64 {
	start, end := bounds(in.Now, in.Duration)
	d := uint64(end - start)
	rest := d - uint64(in.Now-start)
	prev, limit, cost := clamp(in.Previous), clamp(in.Limit), clamp(in.Cost)
	if in.Fixed || in.Duration >= calendarBase {
		prev = 0
	}
	lhi, llo := bits.Mul64(limit, d)
	phi, plo := bits.Mul64(prev, rest)
	if less(lhi, llo, phi, plo) {
		return -1
	}
	lo, borrow := bits.Sub64(llo, plo, 0)
	hi, _ := bits.Sub64(lhi, phi, borrow)
	q, _ := bits.Div64(hi, lo, d) // (limit·d − …)/d <= limit, so hi < d
	if q < cost {
		return -1
	}
	return int64(q - cost)
}
