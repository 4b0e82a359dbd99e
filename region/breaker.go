package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/window"
)

// ErrOriginOpen is wrapped by the errors of calls refused while the breaker
// is open: the origin is failing and is not asked at all.
var ErrOriginOpen = errors.New("origin circuit breaker open")

// BreakerConfig configures a Breaker; zero fields take the defaults.
type BreakerConfig struct {
	// Name appears in logs and metrics. Default "origin".
	Name string
	// Failures is how many consecutive failed calls open the breaker.
	// Default 5.
	Failures uint32
	// OpenFor is how long the breaker stays open before letting one call
	// through to probe the origin. Default 1s.
	OpenFor time.Duration
	// Logger receives one line per state change. Nil discards them.
	Logger *slog.Logger
	// OnStateChange, if set, is called after each state change.
	OnStateChange func(from, to gobreaker.State)
}

// Breaker is an Origin behind a circuit breaker (sony/gobreaker): after
// Failures consecutive failures it refuses calls at once with ErrOriginOpen
// for OpenFor, then lets one call probe; a success closes it. A caller
// giving up (its context canceled) counts neither way; a timeout is a
// failure.
type Breaker struct {
	origin Origin
	cb     *gobreaker.TwoStepCircuitBreaker[struct{}]
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
	failures := cfg.Failures
	return &Breaker{
		origin: o,
		cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        cfg.Name,
			MaxRequests: 1,
			Timeout:     cfg.OpenFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
			IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
			OnStateChange: func(name string, from, to gobreaker.State) {
				switch to {
				case gobreaker.StateOpen:
					log.Warn("origin failing: breaker open, deciding locally", "breaker", name, "from", from.String())
				case gobreaker.StateHalfOpen:
					log.Info("origin breaker half-open: probing", "breaker", name)
				case gobreaker.StateClosed:
					log.Info("origin back: breaker closed", "breaker", name)
				}
				if cfg.OnStateChange != nil {
					cfg.OnStateChange(from, to)
				}
			},
		}),
	}
}

// State returns the breaker's state.
func (b *Breaker) State() gobreaker.State { return b.cb.State() }

func (b *Breaker) allow() (func(error), error) {
	done, err := b.cb.Allow()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOriginOpen, err)
	}
	return done, nil
}

// Read reads through the breaker.
func (b *Breaker) Read(ctx context.Context, c window.Cell) (int64, int64, error) {
	done, err := b.allow()
	if err != nil {
		return 0, 0, err
	}
	cur, prev, err := b.origin.Read(ctx, c)
	done(err)
	return cur, prev, err
}

// Apply applies through the breaker.
func (b *Breaker) Apply(ctx context.Context, reporter string, reports []Report) ([]int64, error) {
	done, err := b.allow()
	if err != nil {
		return nil, err
	}
	totals, err := b.origin.Apply(ctx, reporter, reports)
	done(err)
	return totals, err
}

// Close closes the origin.
func (b *Breaker) Close() error { return b.origin.Close() }
