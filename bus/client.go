// Package bus is the Go client of Sluice: it asks limiters, over one NATS
// connection, whether an identifier may spend its cost (Client.Check), or
// several all or nothing (Client.Batch). Concurrent Check calls to one
// workspace are coalesced into checks messages (README, "Many checks in one message"), each
// decided exactly as if sent alone. It links only the wire format
// (bus/wire) and nats.go.
//
// A client writes its checks as CheckRequest and BatchCheck, whose zero Cost
// counts 1 and whose Peek looks without counting; the replies are the wire
// types of package wire, named here too so that a client needs only this
// package.
package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/window"
)

// The wire types of the client API (see package wire).
type (
	// CheckResponse is a limiter's answer to a check. Its Never method
	// tells a denial that no wait can fix (RetryAfter is RetryNever).
	CheckResponse = wire.CheckResponse
	// BatchResponse is a limiter's answer to a batch.
	BatchResponse = wire.BatchResponse
	// Encoding is a body encoding: Msgpack or JSON.
	Encoding = wire.Encoding
	// BadRequestError is the error for arguments the client refuses
	// before sending them.
	BadRequestError = wire.BadRequestError
)

// RetryNever is the RetryAfter of a denial that no wait can turn into an
// admission: the cost is above the limit (any cost under limit 0).
const RetryNever = wire.RetryNever

// CheckRequest is one check as a Go caller writes it. Its zero Cost counts 1,
// as a request without "cost" does on the wire, so CheckRequest{Identifier,
// Limit, Duration} spends one unit. Looking without counting is explicit:
// Peek.
type CheckRequest struct {
	// Identifier names what is limited (a user, an IP, a key): 1 to 512
	// bytes of anything.
	Identifier string
	// Limit is how much cost the window admits, 0 to 10^15.
	Limit int64
	// Duration is the window length in milliseconds, 1000 to 31,622,400,000
	// (366 days), or a calendar period (window.ParseCalendar: "month",
	// "day@Europe/Berlin"), which is a fixed window whatever Fixed says.
	Duration int64
	// Cost is what the check spends when admitted; 0 means 1. It must be 0
	// when Peek is set.
	Cost int64
	// Peek asks without counting anything (cost 0 on the wire): the reply
	// says whether the window is within its limit and what remains.
	Peek bool
	// Shadow asks for shadow mode: the check is counted exactly as if
	// enforced, and a check enforcement would deny is answered
	// Success with ShadowDenied set.
	Shadow bool
	// Fixed asks for a fixed window: the window's own count alone is
	// weighed, and the whole limit comes back when it ends. The default is
	// the sliding window.
	Fixed bool
	// Charge is how Cost is charged: ChargeAll (the default, all or
	// nothing), ChargeDrain (what is left when the cost does not fit, and
	// denied) or ChargeDebit (the whole cost whatever the room: usage known
	// afterwards, such as the tokens a response used; Success says whether
	// the usage is within the limit once charged). A batch's checks charge
	// all.
	Charge Charge
}

// Charge is how a check's cost is charged (window.Charge).
type Charge = window.Charge

// The charges.
const (
	ChargeAll   = window.ChargeAll
	ChargeDrain = window.ChargeDrain
	ChargeDebit = window.ChargeDebit
)

// Wire returns r as the wire sends it: cost 1 for a zero Cost, cost 0 for a
// Peek. It returns a *BadRequestError when Peek is set with a Cost.
func (r CheckRequest) Wire() (wire.CheckRequest, error) {
	w := wire.CheckRequest{Identifier: r.Identifier, Limit: r.Limit, Duration: r.Duration, Cost: r.Cost, Shadow: r.Shadow,
		Fixed: r.Fixed, Charge: r.Charge}
	switch {
	case r.Peek && r.Cost != 0:
		return wire.CheckRequest{}, &BadRequestError{Msg: fmt.Sprintf("a peek counts nothing: leave cost 0, got %d", r.Cost)}
	case r.Peek:
		w.Cost = 0
	case r.Cost == 0:
		w.Cost = 1
	}
	return w, nil
}

// BatchCheck is one check of a batch: a CheckRequest (zero Cost counts 1,
// Peek looks) and the namespace it applies to.
type BatchCheck struct {
	// Namespace scopes the identifier: 1 to 64 characters of [A-Za-z0-9_-].
	Namespace string
	CheckRequest
}

// The encodings of request bodies.
const (
	Msgpack = wire.Msgpack
	JSON    = wire.JSON
)

// DefaultPrefix is the subject prefix limiters serve by default.
const DefaultPrefix = wire.DefaultPrefix

// ServiceError is an error reply from a limiter: the micro service error
// convention's code (400 bad request, 500 internal, 503 shutting down) and
// description.
type ServiceError struct {
	Code        int
	Description string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("ratelimit service error %d: %s", e.Code, e.Description)
}

// ErrNoResponders is returned when no limiter serves the subject (none is
// running in any reachable region). It wraps nats.ErrNoResponders.
var ErrNoResponders = fmt.Errorf("no limiter answered: %w", nats.ErrNoResponders)

// DefaultTimeout bounds a client call whose context has no deadline.
const DefaultTimeout = 2 * time.Second

// DefaultAttempts is how many times a call is sent, at most, while limiters
// answer 503 (shutting down).
const DefaultAttempts = 4

// retryPause is the pause before the second send of a call answered 503;
// each further pause doubles it.
const retryPause = 5 * time.Millisecond

// retry is the client's one policy for a reply of 503 (a limiter shutting
// down, which counted nothing), the same for a call sent on its own
// (Client.request) and for one coalesced (lane.answer): the call is sent
// again after a pause, 5 ms and then twice the last, at most the client's
// attempts in all, and only while its caller waits past the pause. No
// other error is sent again: a 400 would fail again, a 500 or a timeout
// may have counted.
type retry struct {
	attempt int           // sends so far
	pause   time.Duration // before the next send
}

// firstSend is the retry state of a call before its first send.
func firstSend() retry { return retry{attempt: 1, pause: retryPause} }

// again reports whether a call whose last send was answered err is sent
// again, and after what pause, given the client's attempts and when the
// call's caller stops waiting (zero: never); if so it counts that send.
func (r *retry) again(err error, attempts int, deadline time.Time) (time.Duration, bool) {
	var se *ServiceError
	if r.attempt >= attempts || !errors.As(err, &se) || se.Code != 503 {
		return 0, false
	}
	if !deadline.IsZero() && time.Until(deadline) <= r.pause {
		return 0, false // the pause would outlast the caller
	}
	pause := r.pause
	r.attempt++
	r.pause *= 2
	return pause, true
}

// Client asks limiters over one NATS connection. It is safe for
// simultaneous use by multiple goroutines, and calls from many goroutines
// are many requests in flight on the one connection.
//
// A call that a limiter answers 503 (it is shutting down; nothing was
// counted) is sent again after a short pause, up to the client's attempts
// and within the call's context: the limiter's queue peers, in its region or
// another, take the new request. Other errors are returned at once.
//
// Concurrent Check calls to one workspace are coalesced (coalesce.go): a
// call that finds a message of its workspace in flight waits for its reply
// and then leaves with every call waiting by then, in one checks message
// (sooner if they fill one, or if the message in flight is late); a call
// alone leaves at once, on the check subject. Each call is decided by the
// limiter exactly as if it had been sent alone. WithCoalescing(false)
// sends every call on its own.
type Client struct {
	nc       *nats.Conn
	subjects wire.Subjects
	enc      Encoding
	timeout  time.Duration
	attempts int

	coalesce    bool
	maxChecks   int
	maxInFlight int
	lanes       sync.Map // workspace -> *lane
	lastLane    atomic.Pointer[lane]
	replies     replies
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithEncoding sets the body encoding of requests (default Msgpack).
func WithEncoding(e Encoding) ClientOption { return func(c *Client) { c.enc = e } }

// WithSubjectPrefix sets the subject prefix (default DefaultPrefix).
func WithSubjectPrefix(p string) ClientOption { return func(c *Client) { c.subjects.Prefix = p } }

// WithTimeout sets the timeout of calls whose context has no deadline
// (default DefaultTimeout). It bounds every attempt of a call together.
func WithTimeout(d time.Duration) ClientOption { return func(c *Client) { c.timeout = d } }

// WithAttempts sets how many times a call is sent at most while limiters
// answer 503 (default DefaultAttempts); 1 never resends. Values below 1
// count as 1.
func WithAttempts(n int) ClientOption { return func(c *Client) { c.attempts = max(n, 1) } }

// NewClient returns a Client using nc.
func NewClient(nc *nats.Conn, opts ...ClientOption) *Client {
	c := &Client{nc: nc, enc: Msgpack, timeout: DefaultTimeout, attempts: DefaultAttempts,
		coalesce: true, maxChecks: DefaultMaxCoalesced, maxInFlight: DefaultMaxInFlight}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Check asks whether r may spend its cost (1 when r.Cost is 0; nothing when
// r.Peek) in workspace/namespace. A denial is a normal response with
// Success false; errors are *ServiceError for a limiter's error reply (a
// 503 only once every attempt got one), ErrNoResponders, *BadRequestError
// for arguments the client can tell are invalid before sending, an error
// wrapping ctx's error (or context.DeadlineExceeded after the client's
// timeout) when no answer came in time, or transport errors. With
// coalescing (the default), a call whose context ends before its check was
// sent is not sent at all.
func (c *Client) Check(ctx context.Context, workspace, namespace string, r CheckRequest) (CheckResponse, error) {
	if err := wire.CheckTokens(workspace, namespace); err != nil {
		return CheckResponse{}, err
	}
	wr, err := r.Wire()
	if err != nil {
		return CheckResponse{}, err
	}
	if c.coalesce {
		return c.checkCoalesced(ctx, workspace, namespace, wr)
	}
	return requestDecoded(ctx, c, c.subjects.Check(workspace, namespace), wire.AppendCheckRequest(nil, c.enc, wr), "check", wire.DecodeCheckResponse)
}

// Batch asks, all or nothing, whether every check may spend its cost in
// workspace. Costs and errors are as for Check.
func (c *Client) Batch(ctx context.Context, workspace string, checks []BatchCheck) (BatchResponse, error) {
	if err := wire.CheckTokens(workspace); err != nil {
		return BatchResponse{}, err
	}
	req := wire.BatchRequest{Checks: make([]wire.BatchCheck, len(checks))}
	for i, ch := range checks {
		wr, err := ch.Wire()
		if err != nil {
			return BatchResponse{}, fmt.Errorf("check %d: %w", i, err)
		}
		req.Checks[i] = wire.BatchCheck{Namespace: ch.Namespace, CheckRequest: wr}
	}
	return requestDecoded(ctx, c, c.subjects.Batch(workspace), wire.AppendBatchRequest(nil, c.enc, req), "batch", wire.DecodeBatchResponse)
}

// requestDecoded is request, the reply decoded with decode; a reply that
// does not decode is an error naming what, which states decode's error but
// does not wrap it: a *BadRequestError means arguments the client refused,
// never a limiter's malformed reply. Every error returns the zero T.
func requestDecoded[T any](ctx context.Context, c *Client, subject string, body []byte, what string,
	decode func(Encoding, []byte) (T, error)) (T, error) {
	var zero T
	reply, err := c.request(ctx, subject, body)
	if err != nil {
		return zero, err
	}
	v, err := decode(c.enc, reply)
	if err != nil {
		return zero, fmt.Errorf("decode %s response: %v", what, err)
	}
	return v, nil
}

// request sends body on subject and returns the reply's body, sending it
// again while limiters answer 503 (retry).
func (c *Client) request(ctx context.Context, subject string, body []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", c.enc.ContentType())
	r := firstSend()
	for {
		resp, err := c.nc.RequestMsgWithContext(ctx, msg)
		if err != nil {
			if errors.Is(err, nats.ErrNoResponders) {
				return nil, ErrNoResponders
			}
			return nil, fmt.Errorf("request %s: %w", subject, err)
		}
		err = ReplyError(resp)
		if err == nil {
			return resp.Data, nil
		}
		pause, ok := r.again(err, c.attempts, deadline)
		if !ok {
			return nil, err
		}
		// A limiter shutting down counted nothing: ask again; its queue
		// peers take the request once it has left the group.
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// ReplyError returns the *ServiceError carried by a reply's
// Nats-Service-Error-Code and Nats-Service-Error headers, or nil.
func ReplyError(m *nats.Msg) error {
	code := m.Header.Get(micro.ErrorCodeHeader) // "" for a reply without headers
	if code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = 500
	}
	return &ServiceError{Code: n, Description: m.Header.Get(micro.ErrorHeader)}
}
