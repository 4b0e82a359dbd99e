// Package bus is the Go client of Sluice: it asks limiters, over one NATS
// connection, whether an identifier may spend its cost (Client.Check), or
// several all or nothing (Client.Batch). It links only the wire format
// (bus/wire) and nats.go.
//
// The wire types a client sends and receives are those of package wire,
// named here too so that a client needs only this package.
package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
)

// The wire types of the client API (see package wire).
type (
	// CheckRequest is one check: identifier, limit, duration (ms), cost.
	CheckRequest = wire.CheckRequest
	// CheckResponse is a limiter's answer to a check.
	CheckResponse = wire.CheckResponse
	// BatchCheck is one check of a batch, with its namespace.
	BatchCheck = wire.BatchCheck
	// BatchResponse is a limiter's answer to a batch.
	BatchResponse = wire.BatchResponse
	// Encoding is a body encoding: Msgpack or JSON.
	Encoding = wire.Encoding
	// BadRequestError is the error for arguments the client refuses
	// before sending them.
	BadRequestError = wire.BadRequestError
)

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

// Client asks limiters over one NATS connection. It is safe for
// simultaneous use by multiple goroutines, and calls from many goroutines
// are many requests in flight on the one connection.
type Client struct {
	nc       *nats.Conn
	subjects wire.Subjects
	enc      Encoding
	timeout  time.Duration
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithEncoding sets the body encoding of requests (default Msgpack).
func WithEncoding(e Encoding) ClientOption { return func(c *Client) { c.enc = e } }

// WithSubjectPrefix sets the subject prefix (default DefaultPrefix).
func WithSubjectPrefix(p string) ClientOption {
	return func(c *Client) { c.subjects.Prefix = p }
}

// WithTimeout sets the timeout of calls whose context has no deadline
// (default DefaultTimeout).
func WithTimeout(d time.Duration) ClientOption { return func(c *Client) { c.timeout = d } }

// NewClient returns a Client using nc.
func NewClient(nc *nats.Conn, opts ...ClientOption) *Client {
	c := &Client{nc: nc, enc: Msgpack, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Check asks whether r may spend its cost in workspace/namespace. A denial
// is a normal response with Success false; errors are *ServiceError for a
// limiter's error reply, ErrNoResponders, *BadRequestError for arguments the
// client can tell are invalid before sending, or transport errors.
func (c *Client) Check(ctx context.Context, workspace, namespace string, r CheckRequest) (CheckResponse, error) {
	if err := wire.CheckTokens(workspace, namespace); err != nil {
		return CheckResponse{}, err
	}
	body, err := c.request(ctx, c.subjects.Check(workspace, namespace), wire.AppendCheckRequest(nil, c.enc, r))
	if err != nil {
		return CheckResponse{}, err
	}
	resp, err := wire.DecodeCheckResponse(c.enc, body)
	if err != nil {
		return CheckResponse{}, fmt.Errorf("decode check response: %w", err)
	}
	return resp, nil
}

// Batch asks, all or nothing, whether every check may spend its cost in
// workspace. Errors are as for Check.
func (c *Client) Batch(ctx context.Context, workspace string, checks []BatchCheck) (BatchResponse, error) {
	if err := wire.CheckTokens(workspace); err != nil {
		return BatchResponse{}, err
	}
	body, err := c.request(ctx, c.subjects.Batch(workspace), wire.AppendBatchRequest(nil, c.enc, wire.BatchRequest{Checks: checks}))
	if err != nil {
		return BatchResponse{}, err
	}
	resp, err := wire.DecodeBatchResponse(c.enc, body)
	if err != nil {
		return BatchResponse{}, fmt.Errorf("decode batch response: %w", err)
	}
	return resp, nil
}

func (c *Client) request(ctx context.Context, subject string, body []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", c.enc.ContentType())
	resp, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNoResponders
		}
		return nil, fmt.Errorf("request %s: %w", subject, err)
	}
	if err := ReplyError(resp); err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// ReplyError returns the *ServiceError carried by a reply's
// Nats-Service-Error-Code and Nats-Service-Error headers, or nil.
func ReplyError(m *nats.Msg) error {
	if m.Header == nil {
		return nil
	}
	code := m.Header.Get(micro.ErrorCodeHeader)
	if code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = 500
	}
	return &ServiceError{Code: n, Description: m.Header.Get(micro.ErrorHeader)}
}
