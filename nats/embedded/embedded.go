// Package embedded runs a nats-server inside the process: what a limiter
// started without --nats-url serves its clients on, and what tests start
// their servers with (internal/natstest builds topologies from it).
//
// Every function that waits takes a [context.Context] and returns only once
// the server it started accepts clients; on error nothing is left running.
package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
)

// DefaultServerName is the server name Start uses when Config.ServerName
// is empty.
const DefaultServerName = "sluice-embedded"

const (
	// readyTimeout caps how long a server may take to become ready, even
	// when the caller's context allows longer.
	readyTimeout = 5 * time.Second
	// readyPoll is the slice handed to ReadyForConnections. It polls every
	// 25ms internally and busy-loops for durations of 25ms or less, so
	// slightly more than 25ms gives two checks per call and no spinning.
	readyPoll = 30 * time.Millisecond
)

// Config configures StartConfig. Only Listen is required.
type Config struct {
	// Listen is the client address, "host:port". Port "0" picks a random
	// free port; an empty host listens on all interfaces.
	Listen string

	// ServerName names the server. Empty means DefaultServerName.
	ServerName string

	// ClusterName names the server's cluster. It opens no route listener:
	// the server stays a cluster of one. Empty leaves it unset.
	ClusterName string
}

// Server is a nats-server running inside this process. Its methods are safe
// for concurrent use.
type Server struct {
	srv       *server.Server
	clientURL string
}

// Start starts an in-process nats-server accepting clients on listen
// ("host:port"; port "0" picks a random free port) and returns once it is
// ready for connections. It is StartConfig with only Listen set.
func Start(ctx context.Context, listen string) (*Server, error) {
	return StartConfig(ctx, Config{Listen: listen})
}

// StartConfig starts an in-process nats-server configured by cfg,
// with logging and signal handling disabled, and returns once it is ready
// for connections.
//
// If cfg.Listen names a fixed port that is already in use, it returns an
// error such as "listen 127.0.0.1:4222: bind: address already in use" that
// wraps the net error (errors.Is(err, syscall.EADDRINUSE) holds). The check
// binds the address and releases it before the server binds it again, so a
// process that grabs the port in between is not detected; the server then
// never becomes ready and StartConfig fails when waiting ends.
//
// Waiting ends when ctx is done or after 5s, whichever comes first; the
// server is then shut down and an error returned.
func StartConfig(ctx context.Context, cfg Config) (*Server, error) {
	host, port, err := parseListen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded: start embedded server: %w", err)
	}
	if port != server.RANDOM_PORT {
		if err := probeListen(cfg.Listen); err != nil {
			return nil, fmt.Errorf("embedded: start embedded server: %w", err)
		}
	}
	opts := &server.Options{
		ServerName: cmp.Or(cfg.ServerName, DefaultServerName),
		Host:       host,
		Port:       port,
		NoLog:      true,
		NoSigs:     true,
	}
	opts.Cluster.Name = cfg.ClusterName
	return StartOptions(ctx, opts)
}

// ClientURL returns a URL a client on this machine can dial, such as
// "nats://127.0.0.1:4222". A server listening on all interfaces is reported
// on the loopback address.
func (e *Server) ClientURL() string { return e.clientURL }

// Server returns the underlying nats-server, for inspection (monitoring
// endpoints such as Varz or Gatewayz) or for options this package does not
// expose.
func (e *Server) Server() *server.Server { return e.srv }

// Shutdown stops the server, disconnecting its clients, and returns once
// shutdown is complete. It may be called more than once.
func (e *Server) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// StartOptions starts an in-process nats-server with opts as they are (the
// caller sets logging, signals, clusters and gateways) and returns once it
// is ready for connections. On failure the server has been shut down.
func StartOptions(ctx context.Context, opts *server.Options) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedded: start server %q: %w", opts.ServerName, err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: create server %q: %w", opts.ServerName, err)
	}
	go srv.Start()
	if err := waitReady(ctx, srv); err != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("embedded: start server %q: %w", opts.ServerName, err)
	}
	return &Server{srv: srv, clientURL: dialableURL(srv.ClientURL())}, nil
}

// waitReady waits until srv accepts connections on all its listeners, ctx
// is done, or readyTimeout passes.
func waitReady(ctx context.Context, srv *server.Server) error {
	ctx, cancel := context.WithTimeoutCause(ctx, readyTimeout,
		fmt.Errorf("not ready within %v: %w", readyTimeout, context.DeadlineExceeded))
	defer cancel()
	for !srv.ReadyForConnections(readyPoll) {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for listeners: %w", context.Cause(ctx))
		}
	}
	return nil
}

// parseListen splits a "host:port" listen address into nats-server's Host
// and Port options, mapping port 0 to server.RANDOM_PORT.
func parseListen(listen string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("parse listen address: %w", err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("parse listen address %q: invalid port %q", listen, p)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// probeListen reports whether listen can be bound right now, by binding and
// releasing it.
func probeListen(listen string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		// Drop net.OpError's own "listen tcp <addr>:" prefix so the
		// message stays one short line; the cause is still wrapped.
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			err = opErr.Err
		}
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("release probe listener on %s: %w", listen, err)
	}
	return nil
}

// dialableURL rewrites a client URL whose host is unspecified (0.0.0.0,
// ::) to use the loopback address of the same family.
func dialableURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return raw
	}
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		u.Host = net.JoinHostPort("127.0.0.1", port)
	case ip != nil && ip.IsUnspecified():
		u.Host = net.JoinHostPort("::1", port)
	}
	return u.String()
}
