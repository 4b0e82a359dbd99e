package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// ErrOriginOpen is wrapped by the errors of calls refused while the breaker
// is open: the origin is failing and is not asked at all.
var ErrOriginOpen = errors.New("origin circuit breaker open")

// Call names a kind of origin call. Reads (Sync) and applies (Settle,
// Import) sit behind separate breakers: a read waits on the request path
// with a tight deadline, an apply (a background settle round) runs with a
// loose one, so an origin too slow for reads but still taking writes keeps
// receiving settle rounds, and what limiters hold unreported does not grow
// while it is merely slow.
type Call string

// The calls a Breaker guards.
const (
	CallRead  Call = "read"
	CallApply Call = "apply"
)

// BreakerConfig configures a Breaker; zero fields take the defaults.
type BreakerConfig struct {
	// Name appears in logs and metrics. Default "origin".
	Name string
	// Failures is how many consecutive failed calls of one kind open that
	// kind's breaker. Default 5.
	Failures uint32
	// OpenFor is how long a breaker stays open before letting one call
	// through to probe the origin. Default 1s.
	OpenFor time.Duration
	// Logger receives one line per state change. Nil discards them.
	Logger *slog.Logger
	// OnStateChange, if set, is called after each state change of either
	// breaker.
	OnStateChange func(call Call, from, to gobreaker.State)
}

// Breaker is an Origin behind two circuit breakers (sony/gobreaker), one for
// reads and one for applies: after Failures consecutive failures of one kind
// it refuses calls of that kind at once with ErrOriginOpen for OpenFor, then
// lets one call probe; a success closes it. A caller giving up (its context
// canceled), a call refused for an invalid local count (ErrInvalidLocal)
// and a call never sent (ErrNotSent: its deadline passed while it waited
// for a round trip or a connection) count neither way: the origin was not
// asked. A call that was sent and timed out is a failure.
type Breaker struct {
	origin Origin
	// cbs are the breakers, by callIndex: [0] read, [1] apply; opens
	// counts the times each opened.
	cbs   [2]*gobreaker.TwoStepCircuitBreaker[struct{}]
	opens [2]atomic.Int64
}

// NewBreaker wraps o.
func NewBreaker(o Origin, cfg BreakerConfig) *Breaker {
	if cfg.Name == "" {
		cfg.Name = "origin"
	}
	if cfg.Failures == 0 {
		cfg.Failures = 5
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Breaker{origin: o}
	for _, call := range []Call{CallRead, CallApply} {
		b.cbs[callIndex(call)] = newBreaker(cfg, call, log, &b.opens[callIndex(call)])
	}
	return b
}

func newBreaker(cfg BreakerConfig, call Call, log *slog.Logger, opens *atomic.Int64) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	failures := cfg.Failures
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        cfg.Name + " " + string(call),
		MaxRequests: 1,
		Timeout:     cfg.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, ErrInvalidLocal) || errors.Is(err, ErrNotSent)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				opens.Add(1)
			}
			switch {
			case to == gobreaker.StateOpen && call == CallRead:
				log.Warn("origin reads failing: breaker open, deciding locally", "breaker", name, "from", from.String())
			case to == gobreaker.StateOpen:
				log.Warn("origin applies failing: breaker open, settle rounds wait", "breaker", name, "from", from.String())
			case to == gobreaker.StateHalfOpen:
				log.Info("origin breaker half-open: probing", "breaker", name)
			case to == gobreaker.StateClosed:
				log.Info("origin back: breaker closed", "breaker", name)
			}
			if cfg.OnStateChange != nil {
				cfg.OnStateChange(call, from, to)
			}
		},
	})
}

// Opens returns how many times the breaker guarding call has opened (from
// closed or, after a failed probe, from half-open).
func (b *Breaker) Opens(call Call) int64 { return b.opens[callIndex(call)].Load() }

func callIndex(call Call) int {
	if call == CallApply {
		return 1
	}
	return 0
}

// State returns the state of the breaker guarding call.
func (b *Breaker) State(call Call) gobreaker.State { return b.cbs[callIndex(call)].State() }

// guard runs call through cb: refused with ErrOriginOpen while cb is open,
// and its error counted by cb otherwise.
func guard[T any](cb *gobreaker.TwoStepCircuitBreaker[struct{}], call func() (T, error)) (T, error) {
	done, err := cb.Allow()
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%w: %w", ErrOriginOpen, err)
	}
	v, err := call()
	done(err)
	return v, err
}

// Import imports through the apply breaker: it is a write off the request
// path, as replays are.
func (b *Breaker) Import(ctx context.Context, imports []Imported) error {
	_, err := guard(b.cbs[callIndex(CallApply)], func() (struct{}, error) { return struct{}{}, b.origin.Import(ctx, imports) })
	return err
}

// Sync syncs through the read breaker: it waits on the request path as a
// read does.
func (b *Breaker) Sync(ctx context.Context, reporter string, s Sync) (SyncResult, error) {
	return guard(b.cbs[callIndex(CallRead)], func() (SyncResult, error) { return b.origin.Sync(ctx, reporter, s) })
}

// Settle settles through the apply breaker: it runs in the background with
// a loose deadline.
func (b *Breaker) Settle(ctx context.Context, reporter string, ss []Sync) ([]SyncResult, error) {
	return guard(b.cbs[callIndex(CallApply)], func() ([]SyncResult, error) { return b.origin.Settle(ctx, reporter, ss) })
}

// Close closes the origin.
func (b *Breaker) Close() error { return b.origin.Close() }
