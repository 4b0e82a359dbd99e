package global

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/window"
)

// What arrives from another process (a limiter, a bridge, the store) is
// input, not truth: entries are checked against the contract's bounds and
// against the receiver's own clock before they touch any state.

// DefaultMaxClockSkew is how far, by default, another host's clock may be
// from this host's before its input is refused.
const DefaultMaxClockSkew = 3 * time.Second

// MaxExpiryGrace bounds how far past the end of the window after a cell its
// expiry may lie (limiters add 60s by default).
const MaxExpiryGrace = time.Hour

// Why input is refused. Every refusal wraps one of these.
var (
	// ErrInvalid: a cell or a value outside the contract's bounds, or an
	// entry that the sender could not have sent (another region's
	// component on a region's own subject).
	ErrInvalid = errors.New("invalid entry")
	// ErrFutureWindow: a window that starts after the receiver's clock
	// plus the clock-skew tolerance; applying it would move the receiver's
	// windows.
	ErrFutureWindow = errors.New("window ahead of the local clock by more than the clock-skew tolerance")
	// ErrClockSkew: a message stamped by a clock that differs from the
	// receiver's by more than the tolerance (or delayed that long).
	ErrClockSkew = errors.New("sender's clock differs from the local clock by more than the clock-skew tolerance")
)

// Reason names the refusal err wraps, for metrics and logs: "invalid",
// "future_window" or "clock_skew".
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrFutureWindow):
		return "future_window"
	case errors.Is(err, ErrClockSkew):
		return "clock_skew"
	}
	return "invalid"
}

// CheckSentAt checks the send time a message was stamped with (unix ms by
// the sender's clock; 0: not stamped) against now, the receiver's clock.
func CheckSentAt(sentAt, now int64, skew time.Duration) error {
	if sentAt == 0 {
		return nil
	}
	if d := sentAt - now; d > skew.Milliseconds() || -d > skew.Milliseconds() {
		return fmt.Errorf("%w: stamped %dms from now (tolerance %v)", ErrClockSkew, d, skew)
	}
	return nil
}

// checkCell checks a cell's bounds and that its window starts no later than
// now plus skew.
func checkCell(c window.Cell, now int64, skew time.Duration) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if start := window.Start(c.Sequence, c.Duration); start > now+skew.Milliseconds() {
		return fmt.Errorf("%w: window starts %dms from now (tolerance %v)", ErrFutureWindow, start-now, skew)
	}
	return nil
}

func checkCount(name string, v int64) error {
	if v < 0 || v > window.MaxCount {
		return fmt.Errorf("%w: %s %d out of range 0..%d", ErrInvalid, name, v, int64(window.MaxCount))
	}
	return nil
}

func checkExpiry(c window.Cell, expireAt int64) error {
	if max := c.Expiry(MaxExpiryGrace.Milliseconds()); expireAt < 0 || expireAt > max {
		return fmt.Errorf("%w: expire_at %d out of range 0..%d", ErrInvalid, expireAt, max)
	}
	return nil
}

func checkRegion(r string) error {
	if !window.ValidToken(r) {
		return fmt.Errorf("%w: %w", ErrInvalid, window.TokenError("region", r))
	}
	return nil
}

// Check reports whether c may be merged at now (the receiver's clock): a
// valid cell whose window starts at most skew after now, a valid region, a
// count of 0 to window.MaxCount and an expiry at most MaxExpiryGrace past
// the cell's.
func (c Component) Check(now int64, skew time.Duration) error {
	return errors.Join(checkCell(c.Cell, now, skew), checkRegion(c.Region),
		checkCount("count", c.Count), checkExpiry(c.Cell, c.ExpireAt))
}

// Check reports whether i may be applied at now, by the rules of
// Component.Check for its cell, with foreign and own each of 0 to
// window.MaxCount.
func (i Import) Check(now int64, skew time.Duration) error {
	return errors.Join(checkCell(i.Cell, now, skew), checkCount("foreign", i.Foreign),
		checkCount("own", i.Own), checkExpiry(i.Cell, i.ExpireAt))
}

// Refusal names what was refused: where it came from and why.
type Refusal struct {
	// Source is "limiters", "regions", "store", "redis" (a bridge's sweep)
	// or "bridge" (a limiter's imports).
	Source string
	// Region is the sending region, where known.
	Region string
	// Reason is Reason of the error.
	Reason string
}

// Refusals counts refused input and logs it, at most once per interval
// with the counts since the last line. Safe for concurrent use; the zero
// value is not usable, call NewRefusals.
type Refusals struct {
	log   *slog.Logger
	every rate.Sometimes

	mu     sync.Mutex
	counts map[Refusal]int64
	logged int64 // total at the last log line
	total  int64
}

// NewRefusals returns counters that log to log (nil discards) at most once
// per interval.
func NewRefusals(log *slog.Logger, interval time.Duration) *Refusals {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Refusals{log: log, every: rate.Sometimes{First: 1, Interval: interval}, counts: make(map[Refusal]int64)}
}

// Add counts n refusals of r, caused by err (the last one of them).
func (f *Refusals) Add(r Refusal, n int, err error) {
	if n <= 0 {
		return
	}
	f.mu.Lock()
	f.counts[r] += int64(n)
	f.total += int64(n)
	f.mu.Unlock()
	f.every.Do(func() {
		f.mu.Lock()
		since := f.total - f.logged
		f.logged = f.total
		f.mu.Unlock()
		f.log.Warn("refused input from another process", "source", r.Source, "region", r.Region,
			"reason", r.Reason, "refused_since_last_line", since, "error", err)
	})
}

// Counts returns how many refusals of each kind there were.
func (f *Refusals) Counts() map[Refusal]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.counts)
}

// Total returns how many refusals there were.
func (f *Refusals) Total() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
