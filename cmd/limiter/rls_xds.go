package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/service"
)

// rlsXDSConfig holds the --rls-xds-* flags: the rate limit configuration
// from an xDS management server instead of files.
type rlsXDSConfig struct {
	server, nodeID, nodeMetadata, headers string
	metadata, header                      map[string]string // nodeMetadata and headers parsed, by checkXDS
	useTLS                                bool
	tls                                   rls.XDSTLS
	maxMessageBytes                       int
	backoffMin, backoffMax                time.Duration
}

func (c *rlsXDSConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "rls-xds-server", "", "xDS management server (host:port) to take the rate limit configuration from (RateLimitConfig resources over ADS, state of the world), instead of --rls-config")
	fs.StringVar(&c.nodeID, "rls-xds-node-id", "default", "node id sent to the xDS server, which serves the configuration of that node (Envoy Gateway: envoy-ratelimit)")
	fs.StringVar(&c.nodeMetadata, "rls-xds-node-metadata", "", "node metadata sent to the xDS server: key=value pairs separated by commas")
	fs.StringVar(&c.headers, "rls-xds-headers", "", "gRPC metadata sent with the xDS stream: name:value pairs separated by commas")
	fs.BoolVar(&c.useTLS, "rls-xds-tls", false, "speak TLS to the xDS server (implied by any --rls-xds-tls-* file); without --rls-xds-tls-ca the system's roots verify it")
	fs.StringVar(&c.tls.Cert, "rls-xds-tls-cert", "", "PEM client certificate presented to the xDS server (mTLS); with --rls-xds-tls-key; read again at each reconnection")
	fs.StringVar(&c.tls.Key, "rls-xds-tls-key", "", "PEM private key of --rls-xds-tls-cert")
	fs.StringVar(&c.tls.CA, "rls-xds-tls-ca", "", "PEM CA bundle that verifies the xDS server's certificate")
	fs.StringVar(&c.tls.ServerName, "rls-xds-tls-server-name", "", "name the xDS server's certificate must carry; empty: the host of --rls-xds-server")
	fs.IntVar(&c.maxMessageBytes, "rls-xds-max-message-bytes", 16<<20, "largest xDS response accepted, in bytes")
	fs.DurationVar(&c.backoffMin, "rls-xds-backoff-min", 500*time.Millisecond, "first wait before reconnecting to the xDS server; doubled at each failure up to --rls-xds-backoff-max (each wait drawn between half and all of it)")
	fs.DurationVar(&c.backoffMax, "rls-xds-backoff-max", 30*time.Second, "longest wait before reconnecting to the xDS server")
}

// tlsFiles is the TLS to the server, nil for plaintext.
func (c *rlsXDSConfig) tlsFiles() *rls.XDSTLS {
	if !c.useTLS && c.tls == (rls.XDSTLS{}) {
		return nil
	}
	return &c.tls
}

// check reports flag combinations of the xDS source that cannot work.
func (c *rlsConfig) checkXDS() error {
	switch {
	case c.listen == "":
		return errors.New("--rls-xds-server needs --rls-listen")
	case c.config != "":
		return errors.New("--rls-config and --rls-xds-server are two sources of one configuration: give one")
	case c.xds.maxMessageBytes <= 0:
		return fmt.Errorf("--rls-xds-max-message-bytes %d: want a positive size", c.xds.maxMessageBytes)
	case c.xds.backoffMax < c.xds.backoffMin: // both positive: envflag.RequirePositive
		return fmt.Errorf("--rls-xds-backoff-min %s, --rls-xds-backoff-max %s: want 0 < min <= max", c.xds.backoffMin, c.xds.backoffMax)
	}
	var err error
	if c.xds.metadata, err = pairs(c.xds.nodeMetadata, "=", "--rls-xds-node-metadata"); err != nil {
		return err
	}
	c.xds.header, err = pairs(c.xds.headers, ":", "--rls-xds-headers")
	return err
}

// pairs parses "k<sep>v,k2<sep>v2".
func pairs(s, sep, flagName string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for p := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(p, sep)
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s: %q is not name%svalue", flagName, p, sep)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// configSource returns what keeps srv's configuration: the xDS client
// with --rls-xds-server, else the files' Reloader, loaded once now (an
// invalid file stops the start).
func (c *rlsConfig) configSource(srv *rls.Server, metrics *rls.Metrics, reg prometheus.Registerer, log *slog.Logger) (func(context.Context), error) {
	if c.xds.server == "" {
		rl := &rls.Reloader{Path: c.config, Server: srv, Metrics: metrics, Logger: log, Interval: c.reload}
		if err := rl.Load(); err != nil {
			return nil, fmt.Errorf("--rls-config: %w", err)
		}
		return rl.Run, nil
	}
	x, err := rls.NewXDS(rls.XDSConfig{Server: c.xds.server, NodeID: c.xds.nodeID, NodeMetadata: c.xds.metadata, Headers: c.xds.header,
		TLS: c.xds.tlsFiles(), MaxMessageBytes: c.xds.maxMessageBytes, BackoffMin: c.xds.backoffMin, BackoffMax: c.xds.backoffMax,
		Target: srv, Metrics: metrics, Registerer: reg, Logger: log, UserAgent: buildinfo.Version(version)})
	if err != nil {
		return nil, fmt.Errorf("--rls-xds-server: %w", err)
	}
	return x.Run, nil
}

// configName says where the configuration comes from, for the log.
func (c *rlsConfig) configName() string {
	if c.xds.server != "" {
		return "xds://" + c.xds.server
	}
	return c.config
}

// rlsHealth serves /healthcheck: envoyproxy/ratelimit's HTTP health check.
type rlsHealth struct {
	srv      *http.Server
	stopping atomic.Bool
}

// startRLSHealth serves /healthcheck on listen, --rls-health-listen (nil
// when off): 200 "OK" while the service serves, and has a domain unless
// --rls-ready-without-domains; 500 and the reason otherwise, and from
// shutdown on.
func startRLSHealth(listen string, srv *rls.Server, svc *service.Service, log *slog.Logger, stdout io.Writer) (*rlsHealth, error) {
	if listen == "" {
		return nil, nil
	}
	h := &rlsHealth{}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case h.stopping.Load() || svc.Closed():
			http.Error(w, "shutting down", http.StatusInternalServerError)
		case srv.Ready() != nil:
			http.Error(w, srv.Ready().Error(), http.StatusInternalServerError)
		default:
			_, _ = io.WriteString(w, "OK")
		}
	})
	hs, addr, err := telemetry.ServeProbe("--rls-health-listen", listen, mux, log, "rls health listener stopped")
	if err != nil {
		return nil, err
	}
	h.srv = hs
	fmt.Fprintf(stdout, "rate limit health check on http://%s/healthcheck\n", addr)
	return h, nil
}

// fail makes /healthcheck answer 500 from now on. Nil does nothing.
func (h *rlsHealth) fail() {
	if h != nil {
		h.stopping.Store(true)
	}
}

// close stops the listener. Nil does nothing.
func (h *rlsHealth) close(ctx context.Context) {
	if h != nil {
		_ = h.srv.Shutdown(ctx)
	}
}
