// Package natslimit lets a NATS service limit its own callers with Sluice:
// it wraps a micro.Handler (Middleware.Handler) or a plain nats.MsgHandler
// (Middleware.MsgHandler) so that each request is checked against a limit
// per caller before the handler sees it, and a caller over its limit is
// answered with the micro error convention instead.
//
// The caller is named by a KeyFunc: a subject token (SubjectToken), a
// header (Header), or the requesting account or user that nats-server
// states in the Nats-Request-Info header of requests crossing a service
// import (Account, User); FirstOf tries several in turn. A request that
// has no key (no such token or header, a Nats-Request-Info header absent
// or malformed, a key longer than an identifier's 512 bytes) is not
// refused: it is limited under Config.Unidentified, one identifier that
// every such request shares, so it can never spend a named caller's
// budget.
//
// The limit holds per Config.Window, a sliding window, or per
// Config.Period, a calendar period: a minute, hour, day, week, month or
// year of a time zone, a fixed window whose limit comes back whole at the
// period's end (README, "Monthly quotas and other calendar periods"). A
// monthly quota per calling account, renewed at midnight of the 1st in
// Berlin:
//
//	natslimit.Config{Checker: client, Workspace: "greeter", Namespace: "hello", Limit: 10_000, Period: "month@Europe/Berlin", Key: natslimit.Account()}
//
// A denial is answered with the headers Nats-Service-Error-Code: 429,
// Nats-Service-Error: a description, and Retry-After: the seconds, rounded
// up, until the limiter would admit the request (absent when no wait can,
// as under a limit of 0; under a calendar period, the seconds to the
// period's end). A micro endpoint counts it as an error in its stats. A
// plain handler's denial gets the same headers in a reply with no body,
// if the request has a reply subject; otherwise it is dropped.
//
// # When no limiter answers
//
// A check that fails — no limiter serves the workspace, none answers
// within Config.Timeout, or a limiter answers an error — fails open by
// default: the request goes to the handler as if admitted, and the
// failure is logged (at most once a second). The middleware guards a
// service's capacity and its callers' fair shares; an outage of the
// limiter that turned every request away would make the limiter a single
// point of failure of every service behind it, a larger outage than the
// excess it was there to stop, while a service running unlimited for the
// minutes of a limiter outage runs as it did before it had limits.
//
// What a failed check costs in time depends on the server: with no
// limiter subscribed, nats-server 2.15 answers a check that crossed the
// import into the limiters' account with no responders at once, while
// 2.9 lets it wait for Config.Timeout (both seen with the example's
// accounts). A limiter that hangs costs the timeout everywhere: keep it
// short where requests must not wait.
//
// Set Config.FailClosed where an admission past the limit costs more than
// a refusal: a limit that guards spending (messages sent, paid calls) or
// abuse. Then a failed check is answered Nats-Service-Error-Code: 503,
// Nats-Service-Error: "rate limiter unavailable", without Retry-After
// (nothing tells when the limiter will be back).
//
// A handler wrapped here runs as before: in the subscription's goroutine,
// one request at a time, after its check. The check is one request to a
// limiter, whose round trip is added to each request's time and holds the
// subscription (a micro endpoint handles one request at a time) while it
// lasts; README, "NATS service middleware", has the measured cost.
package natslimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/window"
)

// Checker asks a limiter whether r may spend its cost in
// workspace/namespace, as bus.Client.Check does (zero Cost counts 1); a
// *bus.Client is one.
type Checker interface {
	Check(ctx context.Context, workspace, namespace string, r bus.CheckRequest) (bus.CheckResponse, error)
}

// RetryAfterHeader is the header of a denial that tells, in whole seconds
// rounded up, when the limiter would admit the request again.
const RetryAfterHeader = "Retry-After"

// The codes and descriptions of the middleware's answers.
const (
	// CodeTooMany is the Nats-Service-Error-Code of a denial.
	CodeTooMany = 429
	// CodeUnavailable is the Nats-Service-Error-Code of a request refused
	// because no limiter answered its check, with Config.FailClosed.
	CodeUnavailable = 503

	// DescTooMany is the Nats-Service-Error of a denial that a wait can
	// turn into an admission.
	DescTooMany = "rate limit exceeded"
	// DescNever is the Nats-Service-Error of a denial that no wait can
	// turn into an admission: the limit is below the request's cost.
	DescNever = "rate limit exceeded: the limit admits no such request"
	// DescUnavailable is the Nats-Service-Error of a request refused
	// because no limiter answered its check.
	DescUnavailable = "rate limiter unavailable"
)

// DefaultTimeout bounds a check when Config.Timeout is 0: long enough for
// a limiter that waits on its origin (the limiter's own bound is 250ms by
// default) to answer.
const DefaultTimeout = 500 * time.Millisecond

// DefaultUnidentified is the identifier of requests without a key when
// Config.Unidentified is empty.
const DefaultUnidentified = "unidentified"

// Config is what a Middleware checks: a limit per caller in one
// workspace and namespace.
type Config struct {
	// Checker asks the limiters: a *bus.Client, connected where the
	// check subjects of Workspace are served. Required.
	Checker Checker
	// Workspace and Namespace scope the callers' identifiers: 1 to 64
	// characters of [A-Za-z0-9_-] each. Behind NATS accounts the
	// workspace is the service's own account (docs/tenants.md).
	Workspace, Namespace string
	// Limit is how many requests of one caller a Window (or Period)
	// admits: 0 to 10^15 (0 admits none). Overrides set by an
	// administrator for the namespace replace it, as for any check.
	Limit int64
	// Window is the sliding window's length: whole milliseconds, 1s to
	// 366 days. Exactly one of Window and Period is set.
	Window time.Duration
	// Period is a calendar period in place of Window, as
	// window.ParseCalendar reads it: minute, hour, day, week, month or
	// year, alone (UTC) or followed by @ and an IANA time zone
	// ("month@Europe/Berlin"). Each period is a fixed window: the limit
	// comes back whole at the period's end, where a denial's Retry-After
	// runs to.
	Period string
	// Key names the caller of a request. Required.
	Key KeyFunc
	// Cost, if set, says what a request spends of its caller's limit, from
	// its subject, headers and body (say, its size in KiB, or the items it
	// carries); nil: 1. A cost below 1 counts 1 and one above the API's
	// largest cost counts that.
	Cost func(subject string, h nats.Header, data []byte) int64
	// Unidentified is the identifier under which requests without a key
	// are limited, all together. Empty means DefaultUnidentified. Pick
	// one no caller's key can be.
	Unidentified string
	// FailClosed refuses a request whose check failed (503) instead of
	// admitting it. See the package doc for why the default is to admit.
	FailClosed bool
	// Timeout bounds each check. Zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives failed checks, at most one line a second (with the
	// count of failures since the last line), and replies that could not
	// be sent. Nil discards them.
	Logger *slog.Logger
}

// Middleware checks each request of the handlers it wraps against a
// Config's limit. It is safe for simultaneous use by multiple goroutines,
// and one Middleware may wrap any number of handlers, which then share
// their callers' limits.
type Middleware struct {
	cfg      Config
	duration int64 // the checks' Duration: Window in milliseconds, or Period's code
	failures failureLog
}

// New returns a Middleware for cfg, or an error saying which field of cfg
// is missing or out of bounds.
func New(cfg Config) (*Middleware, error) {
	switch {
	case cfg.Checker == nil:
		return nil, errors.New("natslimit: Config.Checker is required")
	case cfg.Key == nil:
		return nil, errors.New("natslimit: Config.Key is required")
	case cfg.Limit < 0 || cfg.Limit > wire.MaxLimit:
		return nil, fmt.Errorf("natslimit: Config.Limit %d is not within 0 to %d", cfg.Limit, int64(wire.MaxLimit))
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("natslimit: Config.Timeout %v is negative", cfg.Timeout)
	case len(cfg.Unidentified) > wire.MaxIdentifierLen:
		return nil, fmt.Errorf("natslimit: Config.Unidentified is longer than %d bytes", wire.MaxIdentifierLen)
	}
	if err := wire.CheckTokens(cfg.Workspace, cfg.Namespace); err != nil {
		return nil, fmt.Errorf("natslimit: Config.Workspace or Namespace: %w", err)
	}
	duration, err := window.DurationOf(cfg.Window, cfg.Period)
	if err != nil {
		return nil, fmt.Errorf("natslimit: Config.Window, Config.Period: %w", err)
	}
	cfg.Unidentified = cmp.Or(cfg.Unidentified, DefaultUnidentified)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return &Middleware{cfg: cfg, duration: duration, failures: failureLog{logger: cfg.Logger}}, nil
}

// Handler returns a micro.Handler that checks each request and passes it
// to next when admitted, in the same goroutine. A denied request is
// answered with Request.Error and the headers of the package doc.
func (m *Middleware) Handler(next micro.Handler) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		h := m.decide(req.Subject(), nats.Header(req.Headers()), req.Data())
		if h == nil {
			next.Handle(req)
			return
		}
		if err := req.Error(h.Get(micro.ErrorCodeHeader), h.Get(micro.ErrorHeader), nil, micro.WithHeaders(micro.Headers(h))); err != nil {
			m.cfg.Logger.Warn("natslimit: answering a refused request", "subject", req.Subject(), "error", err)
		}
	})
}

// MsgHandler returns a nats.MsgHandler that checks each message and passes
// it to next when admitted, in the same goroutine. A denied message with a
// reply subject is answered with a reply of no body and the headers of the
// package doc; one without is dropped.
func (m *Middleware) MsgHandler(next nats.MsgHandler) nats.MsgHandler {
	return func(msg *nats.Msg) {
		h := m.decide(msg.Subject, msg.Header, msg.Data)
		if h == nil {
			next(msg)
			return
		}
		if msg.Reply == "" {
			return
		}
		if err := msg.RespondMsg(&nats.Msg{Header: h}); err != nil {
			m.cfg.Logger.Warn("natslimit: answering a refused message", "subject", msg.Subject, "error", err)
		}
	}
}

// decide checks the request of subject, headers h and body data against
// its caller's limit: nil admits it, else the headers of its refusal.
func (m *Middleware) decide(subject string, h nats.Header, data []byte) nats.Header {
	id, ok := m.cfg.Key(subject, h)
	if !ok || id == "" || len(id) > wire.MaxIdentifierLen {
		id = m.cfg.Unidentified
	}
	cost := int64(1)
	if m.cfg.Cost != nil {
		cost = min(max(m.cfg.Cost(subject, h, data), 1), wire.MaxCost)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Timeout)
	resp, err := m.cfg.Checker.Check(ctx, m.cfg.Workspace, m.cfg.Namespace,
		bus.CheckRequest{Identifier: id, Limit: m.cfg.Limit, Duration: m.duration, Cost: cost})
	cancel()
	switch {
	case err != nil:
		m.failures.record(err, m.cfg.FailClosed)
		if m.cfg.FailClosed {
			return refusal(CodeUnavailable, DescUnavailable, "")
		}
		return nil
	case resp.Success:
		return nil
	case resp.RetryAfter == bus.RetryNever:
		return refusal(CodeTooMany, DescNever, "")
	default:
		return refusal(CodeTooMany, DescTooMany, retryAfterSeconds(resp.RetryAfter))
	}
}

// refusal returns the headers of a refusal: the micro error convention's
// code and description, and Retry-After unless retryAfter is empty.
func refusal(code int, desc, retryAfter string) nats.Header {
	h := nats.Header{micro.ErrorCodeHeader: {strconv.Itoa(code)}, micro.ErrorHeader: {desc}}
	if retryAfter != "" {
		h[RetryAfterHeader] = []string{retryAfter}
	}
	return h
}

// retryAfterSeconds is a Retry-After value for ms milliseconds: whole
// seconds, rounded up, at least 1.
func retryAfterSeconds(ms int64) string {
	return strconv.FormatInt(max((ms+999)/1000, 1), 10)
}

// failureLog logs failed checks, at most one line a second.
type failureLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	last   time.Time // of the last line
	missed int       // failures since the last line
}

// record counts a failed check, logging it unless a line was written less
// than a second ago.
func (f *failureLog) record(err error, failClosed bool) {
	f.mu.Lock()
	f.missed++
	now := time.Now()
	if now.Sub(f.last) < time.Second {
		f.mu.Unlock()
		return
	}
	n := f.missed
	f.last, f.missed = now, 0
	f.mu.Unlock()
	outcome := "admitted (fail open)"
	if failClosed {
		outcome = "refused (fail closed)"
	}
	f.logger.Warn("natslimit: no limiter answered; requests "+outcome, "failures", n, "error", err)
}
