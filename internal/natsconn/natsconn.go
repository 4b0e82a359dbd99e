// Package natsconn holds what the Sluice processes do alike with NATS and
// their logs: how they authenticate and secure the connection (Security, the
// --nats-* flags), the other flags the limiter and the bridge share
// (ServeFlags), a connection that logs its state changes once each and can
// be drained to the end, the region a process serves, and the logger.
package natsconn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/window"
)

// Conn is a NATS connection whose closing can be awaited.
type Conn struct {
	*nats.Conn
	closed chan struct{}
}

// Connect connects to url (one server or a comma-separated list) as name
// with opts (e.g. from Security.Options), reconnecting forever, and logs the
// loss and return of the connection once each. Neither its logs nor its
// errors show a password or token of url.
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*Conn, error) {
	c := &Conn{closed: make(chan struct{})}
	nc, err := Dial(url, name, append(slices.Clip(opts), nats.MaxReconnects(-1),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed on purpose (Close or Drain): not lost
			}
			log.Warn("NATS connection lost; reconnecting", "error", redact.Error(err, url))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS connection back", "server", redact.Conn(nc.ConnectedUrl()))
		}))...)
	if err != nil {
		return nil, err
	}
	c.Conn = nc
	return c, nil
}

// Dial connects to url as name with opts, once, for short-lived clients
// such as "limiter check". Its error names the URL without its secrets and
// says when the server refused the credentials.
func Dial(url, name string, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append(slices.Clip(opts), nats.Name(name))...)
	if err != nil {
		hint := ""
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
			hint = " (the server refused the credentials: check --nats-creds, --nats-nkey, --nats-user with its password, or the token)"
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w%s", redact.Conn(url), redact.Error(err, url), hint)
	}
	return nc, nil
}

// Drain drains the connection and waits until it closed or ctx ends: Drain
// itself returns at once, while the draining subscriptions still answer what
// they hold and replies are flushed.
func (c *Conn) Drain(ctx context.Context) error {
	if err := c.Conn.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		return fmt.Errorf("drain NATS connection: %w", err)
	}
	select {
	case <-c.closed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain NATS connection: %w", ctx.Err())
	}
}

// ServedRegion returns the region a process on c serves: explicit when
// given, else the connected NATS cluster's name, else "local". It refuses
// a name that is not a subject token: a cluster may be named anything, and
// a process whose cluster's name cannot be a region must be given --region.
func (c *Conn) ServedRegion(explicit string) (string, error) {
	name := cmp.Or(explicit, c.ConnectedClusterName(), "local")
	if !wire.ValidToken(name) {
		return "", fmt.Errorf("region %q (the NATS cluster's name): want %s; pass --region", name, window.TokenRule)
	}
	return name, nil
}

// NewLogger returns a text logger on w at the named level (debug, info, warn
// or error).
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
