package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/rls"
)

// httpConfig holds the --http-* flags: the HTTP door (transport.HTTPHandler).
type httpConfig struct {
	listen, tokenFile string
	tls               rls.TLSFiles // the same files, and rotation, as the rate limit service's
}

func (c *httpConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "http-listen", "", "address to serve the HTTP door on (check, batch, checks and the admin operations as POST /ratelimit/...); empty: off")
	fs.StringVar(&c.tokenFile, "http-admin-token-file", "", "file holding the bearer token that admits requests to the HTTP door's admin paths (Authorization: Bearer <token>)")
	fs.StringVar(&c.tls.Cert, "http-tls-cert", "", "PEM certificate of the HTTP door's TLS listener; with --http-tls-key")
	fs.StringVar(&c.tls.Key, "http-tls-key", "", "PEM private key of --http-tls-cert")
	fs.StringVar(&c.tls.ClientCA, "http-tls-client-ca", "", "PEM CA bundle: a client certificate it signed admits requests to the HTTP door's admin paths (mTLS); checks need none")
}

// check reports flag combinations that cannot work.
func (c *httpConfig) check() error {
	switch {
	case c.listen == "" && (c.tokenFile != "" || c.tls.Enabled()):
		return errors.New("--http-admin-token-file and --http-tls-* need --http-listen")
	case c.tls.Enabled() && (c.tls.Cert == "" || c.tls.Key == ""):
		return errors.New("--http-tls-* need both --http-tls-cert and --http-tls-key")
	}
	return nil
}

// The HTTP door's server limits: a client has ReadHeaderTimeout to send
// its request's headers and ReadTimeout for the whole request (a body is at
// most the NATS max payload); a reply waits on Redis for a second at most.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 30 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpIdleTimeout       = 2 * time.Minute
	httpMaxHeaderBytes    = 64 << 10
	// httpStopWait bounds how long stop waits for requests in flight.
	httpStopWait = 5 * time.Second
)

// httpServer is the running HTTP door.
type httpServer struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

// startHTTP reads the token, binds the listener and serves lim's HTTP door.
func startHTTP(c httpConfig, lim *transport.Limiter, log *slog.Logger, stdout io.Writer) (*httpServer, error) {
	var token string
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--http-admin-token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" || strings.ContainsAny(token, " \t\r\n") {
			return nil, fmt.Errorf("--http-admin-token-file %s: want one token, without spaces", c.tokenFile)
		}
	}
	var tc *tls.Config
	if c.tls.Enabled() {
		var err error
		// HTTP/1.1, and a client certificate verified only when one is
		// presented: checks need none, and the admin paths are open to a
		// verified one.
		if tc, err = c.tls.ConfigFor("http/1.1", tls.VerifyClientCertIfGiven); err != nil {
			return nil, fmt.Errorf("--http-tls-*: %w", err)
		}
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("--http-listen: %w", err)
	}
	srv := &http.Server{
		Handler:           lim.HTTPHandler(transport.HTTPConfig{AdminToken: token, Logger: log}),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		// HTTP/1.1 only: a non-nil empty map keeps net/http from adding h2.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		// The server's own complaints (a TLS handshake that failed, a
		// malformed request line) are the clients' business.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	h := &httpServer{addr: ln.Addr().String(), srv: srv, done: make(chan struct{})}
	scheme := "http"
	if tc != nil {
		scheme = "https"
		ln = tls.NewListener(ln, tc)
	}
	go func() {
		defer close(h.done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP door stopped", "error", err)
		}
	}()
	fmt.Fprintf(stdout, "HTTP door listening on %s://%s%s\n", scheme, h.addr, transport.HTTPPathPrefix)
	log.Info("HTTP door serving", "addr", h.addr, "tls", tc != nil, "admin_token", token != "", "admin_client_certificates", c.tls.ClientCA != "")
	if token != "" && tc == nil && !loopback(h.addr) {
		log.Warn("the HTTP door's admin token crosses the network in clear: add --http-tls-cert and --http-tls-key")
	}
	return h, nil
}

// loopback reports whether addr's host is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// stop stops taking requests and waits for those in flight to be answered
// (at most httpStopWait, or until ctx ends; then their connections are
// closed). The limiter's endpoints must still serve: stop it before
// Limiter.Shutdown, so that every check the door took gets its decision.
// Nil does nothing.
func (h *httpServer) stop(ctx context.Context) {
	if h == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, httpStopWait)
	defer cancel()
	if err := h.srv.Shutdown(sctx); err != nil {
		_ = h.srv.Close()
	}
	<-h.done
}
