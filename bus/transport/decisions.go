package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// DecisionStreamConfig configures a DecisionStream.
type DecisionStreamConfig struct {
	// Subjects gives the prefix of the events' subjects.
	Subjects wire.Subjects
	// Region and Limiter name the publisher in each event.
	Region, Limiter string
	// SampleAdmissions publishes one admission in SampleAdmissions (1:
	// every one); 0 publishes denials only (the default).
	SampleAdmissions int
	// Buffer is how many events wait, at most, for the connection; past
	// it events are dropped and counted (Dropped). Default 8192.
	Buffer int
	// Now is the clock of the events' At. Nil: time.Now.
	Now func() time.Time
}

// DecisionStream is a service.DecisionSink that publishes denials (and
// sampled admissions) as wire.DecisionEvent JSON on
// Subjects.Decisions(workspace, namespace). It never slows a check: an
// event goes into a bounded queue without waiting, and one goroutine
// publishes; when the queue is full the event is dropped and counted.
type DecisionStream struct {
	nc        *nats.Conn
	cfg       DecisionStreamConfig
	queue     chan wire.DecisionEvent
	admits    atomic.Uint64
	dropped   atomic.Int64
	published atomic.Int64
	failed    atomic.Int64
	closed    atomic.Bool
	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewDecisionStream starts publishing the decisions handed to it on nc.
// Close stops it.
func NewDecisionStream(nc *nats.Conn, cfg DecisionStreamConfig) *DecisionStream {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 8192
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &DecisionStream{nc: nc, cfg: cfg, queue: make(chan wire.DecisionEvent, cfg.Buffer),
		closing: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

// Decided queues the event of a denial, or of one admission in
// SampleAdmissions, without waiting: a full queue drops it (Dropped).
func (s *DecisionStream) Decided(q service.Query, d service.Decision) {
	outcome := wire.OutcomeDenied
	switch {
	case d.Admitted:
		if n := s.cfg.SampleAdmissions; n <= 0 || s.admits.Add(1)%uint64(n) != 0 {
			return
		}
		outcome = wire.OutcomeAdmitted
	case d.Shadow:
		outcome = wire.OutcomeShadowDenied
	}
	if s.closed.Load() || len(s.queue) == cap(s.queue) {
		s.dropped.Add(1)
		return
	}
	e := wire.DecisionEvent{
		Workspace: strings.Clone(q.Workspace), Namespace: strings.Clone(q.Namespace),
		Identifier: strings.Clone(q.Identifier), Outcome: outcome, Cost: q.Cost,
		Limit: d.Limit, Duration: q.Duration, Window: window.CalendarName(q.Duration), Override: d.Override,
		Remaining: d.Remaining, Reset: d.Reset, RetryAfter: d.RetryAfter,
		Region: s.cfg.Region, Limiter: s.cfg.Limiter, At: s.cfg.Now().UnixMilli(),
	}
	if e.Window != "" {
		e.Duration = 0
	}
	select {
	case s.queue <- e:
	default:
		s.dropped.Add(1)
	}
}

func (s *DecisionStream) run() {
	defer close(s.done)
	for {
		select {
		case e := <-s.queue:
			s.publish(e)
		case <-s.closing:
			// The only receiver: what len counts is there to take.
			for len(s.queue) > 0 {
				s.publish(<-s.queue)
			}
			return
		}
	}
}

func (s *DecisionStream) publish(e wire.DecisionEvent) {
	body, err := json.Marshal(e)
	if err == nil {
		err = s.nc.Publish(s.cfg.Subjects.Decisions(e.Workspace, e.Namespace), body)
	}
	if err != nil {
		s.failed.Add(1)
		return
	}
	s.published.Add(1)
}

// Published is how many events were handed to the connection.
func (s *DecisionStream) Published() int64 { return s.published.Load() }

// Dropped is how many events were dropped because the queue was full (the
// connection lagged).
func (s *DecisionStream) Dropped() int64 { return s.dropped.Load() }

// Failed is how many events the connection refused (closed, or the event
// did not encode).
func (s *DecisionStream) Failed() int64 { return s.failed.Load() }

// Close publishes what is queued and flushes the connection, waiting at
// most until ctx ends (10 s for a ctx without a deadline). Decisions after
// Close are dropped.
func (s *DecisionStream) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closed.Store(true); close(s.closing) })
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("decision stream: close: %w", ctx.Err())
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := s.nc.FlushWithContext(ctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("decision stream: flush: %w", err)
	}
	return nil
}

// DecisionStreamName is the JetStream stream EnsureDecisionStream keeps
// (wire.DecisionStreamName).
const DecisionStreamName = wire.DecisionStreamName

// EnsureDecisionStream creates, or updates to these limits, the JetStream
// stream DecisionStreamName that keeps the decision events of subjects:
// events older than maxAge (0: 24 h) or past maxBytes (0: 1 GiB) are
// discarded, oldest first. Events are published without waiting for the
// stream's acknowledgement, so a lagging stream never slows a check.
func EnsureDecisionStream(ctx context.Context, nc *nats.Conn, subjects wire.Subjects, maxAge time.Duration, maxBytes int64) error {
	if maxAge <= 0 {
		maxAge = 24 * time.Hour
	}
	if maxBytes <= 0 {
		maxBytes = 1 << 30
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("decision stream: %w", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        DecisionStreamName,
		Description: "Sluice decision events (denials and sampled admissions)",
		Subjects:    []string{subjects.DecisionsWildcard()},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      maxAge,
		MaxBytes:    maxBytes,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("decision stream: create %s: %w", DecisionStreamName, err)
	}
	return nil
}
