// Package httplimit limits HTTP requests with Sluice: a net/http
// middleware that checks every request with a limiter before the handler
// runs, and answers the ones over their limit 429 Too Many Requests.
//
// A request is checked as one Sluice check: its key (the client's address by
// default, see ClientAddr) is the identifier, its cost (1 by default) is
// spent against the Rule's limit per window in the Rule's workspace and
// namespace. An admitted request goes on to the handler; a denied one is
// answered 429 with Retry-After, by default, or by the Denied hook.
//
// The window is a sliding one of Rule.Window, or a calendar period of
// Rule.Period: a minute, hour, day, week, month or year of a time zone,
// each a fixed window whose quota comes back whole at the period's end
// (README, "Monthly quotas and other calendar periods"). A monthly quota
// of 10,000 requests per key, renewed at midnight of the 1st in Berlin:
//
//	httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 10_000, Period: "month@Europe/Berlin"}
//
// # Header fields
//
// Admitted and denied responses carry the RateLimit-Policy and RateLimit
// fields of draft-ietf-httpapi-ratelimit-headers-11 ("RateLimit header
// fields for HTTP", 23 May 2026; its fields are written exactly as in -10):
// each a List of one Item, the policy's name as a String with parameters.
//
//	RateLimit-Policy: "api";q=100;w=60
//	RateLimit: "api";r=42;t=17
//
// q is the limit the reply was decided against and w the window in seconds,
// rounded up; when an override applied, q is the override's limit and w is
// left out (the reply does not carry the override's window). Under a
// calendar period (Rule.Period) w is the length of the period the reply
// was decided in, the one ending at the reply's reset, as the zone's
// calendar has it: a day in Berlin is w=86400, or 82800 and 90000 on the
// days the clocks change; a month of 31 days w=2678400, and March an hour
// less. The draft makes w optional and means it as the quota's time
// window, which that period is; it is exact, where a nominal month would
// advertise a rate the period does not have.
//
// r is what remains after the request (the reply's remaining). On an
// admission t is the number of seconds until the current fixed window ends
// (the reply's reset), rounded up: Sluice's window slides, so quota comes
// back gradually over the next window rather than all at that instant,
// which the draft allows ("the client MUST NOT assume that all its service
// limit will be fully restored"); a calendar period is a fixed window, so
// its whole quota does come back at t. On a denial t equals Retry-After,
// the reply's retry-after rounded up to whole seconds (at least 1): the
// first second at which the same request would be admitted if nothing else
// arrived (under a calendar period, the period's end). A denial that no
// wait can fix (the cost is above the limit) has neither t nor
// Retry-After. WithLegacyHeaders adds X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset (the window's end in Unix
// seconds, as ulule/limiter and go-chi/httprate write it).
//
// # When no limiter answers
//
// The middleware fails open by default: when no limiter answers (none is
// subscribed in any reachable region, none answered within the check's
// timeout, every one that did was shutting down, or the client's connection
// is closed), the request goes on to
// the handler without RateLimit fields. A rate limiter is there to keep
// clients to their share, and an outage of it should not become an outage
// of every API behind it; Sluice itself decides locally when Redis, MySQL
// or a gateway fails for the same reason, and "no limiter answered" means
// that no limiter in any region the client can reach is serving. Choose
// FailClosed (WithFailureMode) where admitting unchecked requests costs more
// than refusing them, say a paid quota or an expensive backend: requests
// are then answered 503 Service Unavailable while no limiter answers. Both
// are logged with WithLogger.
//
// # Named policies
//
// The limit and window can live in the limiter rather than in the code: an
// override set on the Rule's workspace and namespace (README, "Overrides
// and shadow mode"; pattern "*" for every key, or patterns for some)
// replaces the Rule's Limit and Window (or Period) for the keys it
// matches, so an operator changes the policy without a deploy. The Rule's
// Limit and Window (or Period) then apply to keys no override matches; a
// Limit of 0 refuses those (429 without Retry-After), making the overrides
// the only policy.
//
// The middleware is safe for use by many goroutines, as the Go client is.
package httplimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/window"
)

// Checker asks a limiter whether r may spend its cost: *bus.Client is one.
// Wrap a client in a Checker of your own to count, trace or log checks;
// such a wrapper reports that no limiter answered by returning an error
// that wraps bus.ErrNoResponders or context.DeadlineExceeded, as the client
// does.
type Checker interface {
	Check(ctx context.Context, workspace, namespace string, r bus.CheckRequest) (bus.CheckResponse, error)
}

// Rule is what every request is checked against.
type Rule struct {
	// Workspace and Namespace scope the keys: 1 to 64 characters of
	// [A-Za-z0-9_-] each. Overrides set on them apply (named policies).
	Workspace string
	Namespace string
	// Limit is how much cost a key may spend per Window or Period: 0 to
	// 10^15.
	Limit int64
	// Window is the sliding window's length: 1 s to 366 days, whole
	// milliseconds. Exactly one of Window and Period is set.
	Window time.Duration
	// Period is a calendar period in place of Window, as
	// window.ParseCalendar reads it: minute, hour, day, week, month or
	// year, alone (UTC) or followed by @ and an IANA time zone
	// ("month@Europe/Berlin"). Each period is a fixed window: the limit
	// comes back whole at the period's end, which is the reply's reset and
	// where a denial's Retry-After runs to.
	Period string
	// Name names the policy in the RateLimit and RateLimit-Policy fields: 1
	// to 64 printable ASCII characters. Empty means Namespace.
	Name string
}

// FailureMode says what happens to a request when no limiter answers.
type FailureMode int

const (
	// FailOpen lets the request through to the handler, without RateLimit
	// fields: the default.
	FailOpen FailureMode = iota
	// FailClosed refuses the request: the error handler answers it, by
	// default 503 Service Unavailable.
	FailClosed
)

// ErrUnavailable is wrapped by the error handed to the error handler when
// no limiter answered and the middleware fails closed.
var ErrUnavailable = errors.New("httplimit: no limiter answered")

// ErrInvalidRequest is wrapped by the error handed to the error handler when
// a request cannot be checked because of what it is: the key function
// failed, or its key or cost is refused (a key of 0 or more than 512
// bytes, a negative cost).
var ErrInvalidRequest = errors.New("httplimit: request cannot be checked")

// Decision is a limiter's answer to one request's check.
type Decision struct {
	// Key is the identifier the request was checked as.
	Key string
	// Cost is what the request was to spend (1 for a cost of 0, as in
	// bus.CheckRequest).
	Cost int64
	// Reply is the limiter's reply: Reply.Success reports the admission,
	// Reply.RetryAfter (milliseconds) when to try again, Reply.Never()
	// that no wait helps.
	Reply bus.CheckResponse
}

// DeniedFunc answers a denied request. When it runs, the response's
// RateLimit-Policy, RateLimit and Retry-After fields are set; it writes the
// status and body.
type DeniedFunc func(w http.ResponseWriter, r *http.Request, d Decision)

// ErrorFunc answers a request that could not be checked: err wraps
// ErrUnavailable (no limiter answered, failing closed), ErrInvalidRequest,
// or another error of the client.
type ErrorFunc func(w http.ResponseWriter, r *http.Request, err error)

// CostFunc returns what a request spends: 0 counts 1, as in
// bus.CheckRequest; 0 to 10^15.
type CostFunc func(r *http.Request) int64

// Option configures a Middleware.
type Option func(*Middleware)

// WithKey sets the key function (default ClientAddr(Proxies{}): the
// immediate peer's address, no proxy trusted).
func WithKey(f KeyFunc) Option { return func(m *Middleware) { m.key = f } }

// WithCost sets the cost function (default: every request costs 1).
func WithCost(f CostFunc) Option { return func(m *Middleware) { m.cost = f } }

// WithFailureMode sets what happens when no limiter answers (default
// FailOpen).
func WithFailureMode(f FailureMode) Option { return func(m *Middleware) { m.failure = f } }

// WithDenied sets the hook that answers denied requests (default: 429 Too
// Many Requests, a text/plain body).
func WithDenied(f DeniedFunc) Option { return func(m *Middleware) { m.denied = f } }

// WithErrorHandler sets the hook that answers requests that could not be
// checked (default: 503 for ErrUnavailable, 400 for ErrInvalidRequest, 500
// otherwise, each with a text/plain body).
func WithErrorHandler(f ErrorFunc) Option { return func(m *Middleware) { m.onError = f } }

// WithLegacyHeaders also writes X-RateLimit-Limit, X-RateLimit-Remaining
// and X-RateLimit-Reset (Unix seconds at which the current window ends).
func WithLegacyHeaders() Option { return func(m *Middleware) { m.fields.legacy = true } }

// WithTimeout bounds each check (default 0: the request's context, and the
// client's own timeout, bus.DefaultTimeout, when that has no deadline). A
// check not answered within it counts as no limiter answering.
func WithTimeout(d time.Duration) Option { return func(m *Middleware) { m.timeout = d } }

// WithLogger logs each check that failed, at Warn (default: no logging).
func WithLogger(l *slog.Logger) Option { return func(m *Middleware) { m.log = l } }

// Middleware checks requests with a limiter before they reach a handler.
// Build it with New; Handler wraps a handler with it.
type Middleware struct {
	client   Checker
	rule     Rule
	duration int64 // the checks' Duration: Window in milliseconds, or Period's code
	fields   fields
	key      KeyFunc
	cost     CostFunc
	failure  FailureMode
	denied   DeniedFunc
	onError  ErrorFunc
	timeout  time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// New returns a Middleware checking requests against rule with client. It
// returns an error when client is nil or rule is out of bounds.
func New(client Checker, rule Rule, opts ...Option) (*Middleware, error) {
	if client == nil {
		return nil, errors.New("httplimit: nil client")
	}
	if err := wire.CheckTokens(rule.Workspace, rule.Namespace); err != nil {
		return nil, fmt.Errorf("httplimit: rule: %w", err)
	}
	if rule.Limit < 0 || rule.Limit > wire.MaxLimit {
		return nil, fmt.Errorf("httplimit: rule: limit must be between 0 and %d, got %d", int64(wire.MaxLimit), rule.Limit)
	}
	duration, err := window.DurationOf(rule.Window, rule.Period)
	if err != nil {
		return nil, fmt.Errorf("httplimit: rule: %w", err)
	}
	rule.Name = cmp.Or(rule.Name, rule.Namespace)
	if err := checkPolicyName(rule.Name); err != nil {
		return nil, fmt.Errorf("httplimit: rule: %w", err)
	}
	f := fields{name: rule.Name, windowMs: duration}
	if window.IsCalendar(duration) {
		f = fields{name: rule.Name, period: duration}
	}
	m := &Middleware{
		client:   client,
		rule:     rule,
		duration: duration,
		fields:   f,
		key:      ClientAddr(Proxies{}),
		denied:   deny,
		onError:  answerError,
		now:      time.Now,
	}
	for _, o := range opts {
		o(m)
	}
	return m, nil
}

// Handler returns next wrapped by m: each request is checked, and only an
// admitted one (or one let through while no limiter answers, failing open)
// reaches next. Its signature is the one chi's Use and echo's
// WrapMiddleware take.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// serve checks r and answers it or hands it to next.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.key(r)
	if err != nil {
		m.fail(w, r, fmt.Errorf("%w: key: %w", ErrInvalidRequest, err))
		return
	}
	req := bus.CheckRequest{Identifier: key, Limit: m.rule.Limit, Duration: m.duration}
	if m.cost != nil {
		req.Cost = m.cost(r)
	}
	ctx := r.Context()
	if m.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	resp, err := m.client.Check(ctx, m.rule.Workspace, m.rule.Namespace, req)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone: nobody to answer
		}
		if unavailable(err) {
			if m.log != nil {
				m.log.Warn("httplimit: no limiter answered", "mode", m.failure.String(), "err", err)
			}
			if m.failure == FailOpen {
				next.ServeHTTP(w, r)
				return
			}
			m.onError(w, r, fmt.Errorf("%w: %w", ErrUnavailable, err))
			return
		}
		m.fail(w, r, classify(err))
		return
	}
	m.fields.write(w.Header(), resp, m.now())
	if !resp.Success {
		m.denied(w, r, Decision{Key: key, Cost: max(req.Cost, 1), Reply: resp})
		return
	}
	next.ServeHTTP(w, r)
}

// fail logs err and hands it to the error handler.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	if m.log != nil {
		m.log.Warn("httplimit: request not checked", "err", err)
	}
	m.onError(w, r, err)
}

// unavailable reports whether err says that no limiter answered: nobody
// serves the subject, nobody answered in time, every limiter that answered
// was shutting down (503), or the client's connection is closed.
func unavailable(err error) bool {
	var se *bus.ServiceError
	switch {
	case errors.Is(err, bus.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.As(err, &se):
		return se.Code == http.StatusServiceUnavailable
	}
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining)
}

// classify returns err wrapped with ErrInvalidRequest when the request's key
// or cost was refused (a *bus.BadRequestError, or a limiter's 400), and
// as it is otherwise.
func classify(err error) error {
	var bad *bus.BadRequestError
	var se *bus.ServiceError
	if errors.As(err, &bad) || (errors.As(err, &se) && se.Code == http.StatusBadRequest) {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return err
}

func (f FailureMode) String() string {
	if f == FailClosed {
		return "fail-closed"
	}
	return "fail-open"
}

// deny is the default DeniedFunc: 429 with a short text/plain body.
func deny(w http.ResponseWriter, _ *http.Request, _ Decision) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

// answerError is the default ErrorFunc.
func answerError(w http.ResponseWriter, _ *http.Request, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrUnavailable):
		code = http.StatusServiceUnavailable
	case errors.Is(err, ErrInvalidRequest):
		code = http.StatusBadRequest
	}
	http.Error(w, http.StatusText(code), code)
}
