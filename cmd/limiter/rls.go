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
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// rlsConfig holds the --rls-* flags: Envoy's rate limit service.
type rlsConfig struct {
	listen, healthListen, config, workspace, windows, charge string
	reload, maxAge                                           time.Duration
	headers, upstreamMetrics, readyWithoutConf               bool
	maxDescriptors, maxEntries                               int
	tls                                                      rls.TLSFiles
	xds                                                      rlsXDSConfig // rls_xds.go
}

func (c *rlsConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "rls-listen", "", "address to serve Envoy's rate limit service (gRPC ShouldRateLimit, health, reflection) on; empty: off")
	fs.StringVar(&c.config, "rls-config", "", "rate limit configuration in envoyproxy/ratelimit's YAML format: a file, or a directory whose files (all of them, in subdirectories too, whatever their names; hidden ones skipped and named in the log) are read; required with --rls-listen")
	fs.StringVar(&c.workspace, "rls-workspace", rls.DefaultWorkspace, "workspace of the cells the rate limit service checks (namespace: the domain; identifier: the descriptor)")
	fs.DurationVar(&c.reload, "rls-reload-interval", time.Second, "how often the --rls-config files are checked for changes; a changed, valid configuration replaces the one in use")
	fs.DurationVar(&c.maxAge, "rls-max-connection-age", time.Hour, "close a client's connection gracefully once it is this old (calls in flight finish), so Envoy's long-lived connections spread over limiters added since")
	fs.BoolVar(&c.upstreamMetrics, "rls-upstream-metrics", false, "also expose the rate limit service's counts under envoyproxy/ratelimit's Prometheus names (ratelimit_service_rate_limit_total_hits{domain,key1,key2}, over_limit, near_limit, within_limit, shadow_mode, ratelimit_service_config_load_success/error), so its dashboards and alerts keep working")
	fs.StringVar(&c.windows, "rls-windows", "sliding", "kind of window of the limits whose YAML names none (window: in a rate_limit) and of limit overrides Envoy sends: sliding (the window before weighs by how much of it still overlaps), fixed (each window alone, aligned to the epoch, the whole limit back at its end: envoyproxy/ratelimit's), calendar or calendar@<IANA zone> (a limit of one minute, hour, day, week, month or year counts in that period of the zone's calendar, UTC's without a zone: a daily limit renews at midnight; seconds and unit_multiplier windows fixed)")
	fs.StringVar(&c.charge, "rls-charge", "all", "how the limits whose YAML names no charge (charge: in a rate_limit) charge hits: all (a request over any limit counts nothing), debit (every hit counted, over the limit too, as envoyproxy/ratelimit counts them: Envoy Gateway's response cost and AI Gateway's token limits, sent when the response is done) or drain (what is left of the limit when the hits do not fit)")
	fs.BoolVar(&c.headers, "rls-response-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of the descriptor closest to its limit to every response")
	fs.IntVar(&c.maxDescriptors, "rls-max-descriptors", rls.DefaultMaxDescriptors, "most descriptors in one ShouldRateLimit call; a call with more is refused (INVALID_ARGUMENT) before anything is counted")
	fs.IntVar(&c.maxEntries, "rls-max-entries", rls.DefaultMaxEntries, "most entries in one descriptor; a call with a longer one is refused (INVALID_ARGUMENT) before anything is counted")
	fs.BoolVar(&c.readyWithoutConf, "rls-ready-without-domains", false, "report the rate limit service ready (gRPC health, /readyz) even while its configuration has no domain; by default it is ready only with at least one (upstream's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)")
	fs.StringVar(&c.tls.Cert, "rls-tls-cert", "", "PEM certificate of the rate limit service's TLS listener; with --rls-tls-key")
	fs.StringVar(&c.tls.Key, "rls-tls-key", "", "PEM private key of --rls-tls-cert")
	fs.StringVar(&c.tls.ClientCA, "rls-tls-client-ca", "", "PEM CA bundle: clients of the rate limit service must present a certificate it signed (mTLS)")
	fs.StringVar(&c.healthListen, "rls-health-listen", "", "address to serve envoyproxy/ratelimit's HTTP health check (GET /healthcheck: 200 OK, else 500) on; empty: off")
	c.xds.register(fs)
}

// check reports flag combinations, bounds on a call and kinds of window
// that cannot work.
func (c *rlsConfig) check() error {
	switch {
	case c.maxDescriptors <= 0:
		return fmt.Errorf("--rls-max-descriptors %d: want a positive number", c.maxDescriptors)
	case c.maxEntries <= 0:
		return fmt.Errorf("--rls-max-entries %d: want a positive number", c.maxEntries)
	}
	if _, _, err := rls.ParseWindow(c.windows); err != nil {
		return fmt.Errorf("--rls-windows: %w", err)
	}
	if _, err := window.ParseCharge(c.charge); err != nil {
		return fmt.Errorf("--rls-charge: %w", err)
	}
	switch {
	case c.xds.server != "":
		return c.checkXDS()
	case c.listen == "" && c.healthListen != "":
		return errors.New("--rls-health-listen needs --rls-listen")
	case c.listen == "" && (c.config != "" || c.tls.Enabled()):
		return errors.New("--rls-config and --rls-tls-* need --rls-listen")
	case c.listen != "" && c.config == "":
		return errors.New("--rls-listen needs --rls-config (a file or a directory of envoyproxy/ratelimit YAML) or --rls-xds-server")
	}
	return nil
}

// rlsServer is the running rate limit service.
type rlsServer struct {
	addr   string
	srv    *rls.Server
	grpc   *rls.GRPC
	health *rlsHealth
	cancel context.CancelFunc
	done   chan struct{}
}

// startRLS loads the configuration, binds the listener and serves. An
// invalid configuration stops the start.
func startRLS(c rlsConfig, svc *service.Service, waiting *door.Waiting, reg prometheus.Registerer, log *slog.Logger, stdout io.Writer) (*rlsServer, error) {
	metrics := rls.NewMetrics(reg)
	if c.upstreamMetrics {
		metrics.WithUpstreamNames(reg)
	}
	windows, zone, _ := rls.ParseWindow(c.windows) // checked by check
	charge, _ := window.ParseCharge(c.charge)
	srv, err := rls.NewServer(rls.ServerConfig{Service: svc, Workspace: c.workspace, Metrics: metrics, Windows: windows, Zone: zone, Charge: charge,
		ResponseHeaders: c.headers, Waiting: waiting, MaxDescriptors: c.maxDescriptors, MaxEntries: c.maxEntries,
		ReadyWithoutDomains: c.readyWithoutConf}, nil)
	if err != nil {
		return nil, fmt.Errorf("--rls-workspace: %w", err)
	}
	runConfig, err := c.configSource(srv, metrics, reg, log)
	if err != nil {
		return nil, err
	}
	var tc *tls.Config
	if c.tls.Enabled() {
		if tc, err = c.tls.Config(); err != nil {
			return nil, fmt.Errorf("--rls-tls-*: %w", err)
		}
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("--rls-listen: %w", err)
	}
	health, err := startRLSHealth(c.healthListen, srv, svc, log, stdout)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	g := rls.NewGRPC(srv, tc, c.maxAge)
	ctx, cancel := context.WithCancel(context.Background())
	r := &rlsServer{addr: ln.Addr().String(), srv: srv, grpc: g, health: health, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		runConfig(ctx)
	}()
	go func() {
		if err := g.Serve(ln); err != nil {
			log.Error("rls listener stopped", "error", err)
		}
	}()
	fmt.Fprintf(stdout, "rate limit service (gRPC) listening on %s\n", ln.Addr())
	log.Info("rls serving", "addr", ln.Addr().String(), "tls", tc != nil, "client_certificates", c.tls.ClientCA != "",
		"config", c.configName(), "domains", srv.Config().Domains(), "workspace", c.workspace)
	return r, nil
}

// stop stops taking calls, waits for those in flight (at most 2s, or until
// ctx ends: a call decides within 1s; what still runs then is a stream,
// such as a health watch or reflection, and is cut), and stops watching the
// configuration. Nil does nothing.
func (r *rlsServer) stop(ctx context.Context) {
	if r == nil {
		return
	}
	r.health.fail()
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r.grpc.Stop(gctx)
	r.health.close(gctx)
	r.cancel()
	<-r.done
}

// ready reports whether the rate limit service is ready (rls.Server.Ready),
// for the limiter's /readyz. Nil (the service off) is ready.
func (r *rlsServer) ready() error {
	if r == nil {
		return nil
	}
	return r.srv.Ready()
}
