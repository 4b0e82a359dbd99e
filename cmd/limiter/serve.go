package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/gcfloor"
	"github.com/sluicehq/sluice/internal/natsconn"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

// serveConfig is the limiter's configuration, from flags and environment.
type serveConfig struct {
	natsconn.ServeFlags                        // --region, --subject-prefix, --metrics-addr, --log-level, --nats-*
	natsURL, natsListen, redisURL, redisPrefix string
	version                                    string // the binary's, as --version prints it
	shutdownTimeout                            time.Duration
	instances, maxWaiting, gcHeadroomMiB       int
	svc                                        service.Config
	breaker                                    region.BreakerConfig
	natsOpts                                   []nats.Option
	rls                                        rlsConfig
	events                                     eventsConfig
	http                                       httpConfig
	breakerFailures                            uint // --breaker-failures, checked into breaker.Failures
}

// eventsConfig configures the decision stream (--decision-events...).
type eventsConfig struct {
	on, jetstream    bool
	admissions, size int
	maxAge           time.Duration
}

func runServe(ctx context.Context, version string, args []string, stdout, stderr io.Writer) int {
	c := serveConfig{version: version}
	fs := envflag.NewFlagSet("limiter serve", stderr)
	fs.StringVar(&c.natsURL, "nats-url", "", "NATS server to connect to; empty starts an embedded server on --nats-listen")
	fs.StringVar(&c.natsListen, "nats-listen", "127.0.0.1:4222", "address of the embedded NATS server (port 0: any free port)")
	fs.StringVar(&c.redisURL, "redis-url", "", "the region's Redis (redis://host:port[/db], rediss://..., redis+cluster://host:port[?addr=host2:port]); empty keeps counts in process memory")
	fs.StringVar(&c.redisPrefix, "redis-prefix", region.DefaultKeyPrefix, "prefix of every Redis key; limiters of one region share it")
	fs.UintVar(&c.breakerFailures, "breaker-failures", 5, "consecutive failed origin calls of checks (or of settle rounds) that open the read (or apply) circuit breaker")
	fs.DurationVar(&c.breaker.OpenFor, "breaker-open-for", time.Second, "how long an open breaker waits before one call probes the origin again")
	fs.IntVar(&c.maxWaiting, "max-waiting-checks", transport.DefaultMaxWaiting, "most checks waiting on Redis at once (cold, stale or strict cells), for the whole process and shared fairly between tenants (workspaces, Envoy domains); a check past its tenant's share is decided from local state at once, as while Redis fails")
	fs.IntVar(&c.instances, "instances", 1, "micro service instances, each on its own NATS connection sharing the cell table (an endpoint handles one message at a time; more instances use more cores)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown may take to finish checks in flight and settle with Redis")
	fs.DurationVar(&c.svc.FreshFor, "fresh-for", time.Second, "how long a sync with Redis lets a cell deny or answer a look from its counts; also how often, at least, a cell in use reports")
	fs.DurationVar(&c.svc.StrictFreshFor, "strict-fresh-for", 25*time.Millisecond, "for a look, after a denial and near a limit: how old the counts may be before a check refreshes them")
	fs.DurationVar(&c.svc.ReadTimeout, "read-timeout", 250*time.Millisecond, "how long a check waits on one Redis call: a later answer denies it (it may still land), and counts as a failure towards the breaker")
	fs.DurationVar(&c.svc.ReadRetry, "read-retry", 100*time.Millisecond, "after a failed Redis call, how long an identifier decides locally before asking again")
	fs.DurationVar(&c.svc.FlushInterval, "flush-interval", 10*time.Millisecond, "settle loop cadence; cells near a limit (less than half left) report this often")
	fs.DurationVar(&c.svc.FarFlushInterval, "far-flush-interval", 100*time.Millisecond, "near a limit, how long an unused lease is kept before it goes back")
	fs.DurationVar(&c.svc.LeaseAhead, "lease-ahead", 200*time.Millisecond, "how much of a limiter's recent traffic on an identifier a lease covers (at least 1% of the limit): what a SIGKILL of it can over-count a cell by")
	fs.DurationVar(&c.svc.LeaseFor, "lease-for", time.Second, "how long a lease Redis grants is spent (renewed while in use); a lease of a limiter that died counts as used 100ms after")
	fs.IntVar(&c.svc.FlushWorkers, "flush-workers", 2, "settle calls in flight at once")
	fs.IntVar(&c.svc.FlushBatch, "flush-batch", 512, "cells per settle call")
	fs.DurationVar(&c.svc.MaxClockSkew, "max-clock-skew", global.DefaultMaxClockSkew, "how far the bridge's clock may be from this host's: imports stamped further away, or for windows starting later than this host's clock plus it, are refused and counted")
	fs.BoolVar(&c.events.on, "decision-events", false, "publish each denial as a JSON event on <subject-prefix>.decisions.<workspace>.<namespace> (README, \"Who is being limited\"); never slows a check: events the connection cannot take are dropped and counted")
	fs.IntVar(&c.events.admissions, "decision-events-admissions", 0, "with --decision-events, publish one admission in this many too (1: every one); 0: denials only")
	fs.IntVar(&c.events.size, "decision-events-buffer", 8192, "with --decision-events, how many events wait at most for the NATS connection before new ones are dropped")
	fs.BoolVar(&c.events.jetstream, "decision-events-jetstream", false, "with --decision-events, keep the events in the JetStream stream SLUICE_DECISIONS (created or updated at start; the server must have JetStream)")
	fs.DurationVar(&c.events.maxAge, "decision-events-max-age", 24*time.Hour, "with --decision-events-jetstream, how long the stream keeps an event")
	fs.IntVar(&c.gcHeadroomMiB, "gc-headroom-mib", 64, "keep the garbage collector's heap goal this many MiB above the live heap (fewer collections under load, at most this much more memory); 0: Go's default; ignored when GOGC is set")
	c.rls.register(fs)
	c.http.register(fs)
	c.ServeFlags.RegisterFlags(fs)
	log, err := c.check(fs, args, stderr)
	if err != nil {
		return envflag.Refuse(stderr, "limiter", err)
	}
	if err := serve(ctx, c, log, stdout); err != nil {
		// Once the logger exists, stderr holds only its lines: the error
		// that ends the process too (an errors.Join stays one line), unless
		// serve logged it already.
		if !errors.As(err, new(loggedError)) {
			log.Error("limiter stopped with an error", "error", err)
		}
		return 1
	}
	return 0
}

// check parses args into c and returns the logger the flags ask for, or
// what makes them unable to work.
func (c *serveConfig) check(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, error) {
	if err := envflag.ParsePositive(fs, args, "breaker-failures", "instances", "max-waiting-checks", "flush-workers", "flush-batch", "decision-events-buffer"); err != nil {
		return nil, err
	}
	if c.gcHeadroomMiB < 0 {
		return nil, fmt.Errorf("--gc-headroom-mib %d: want 0 (off) or more", c.gcHeadroomMiB)
	}
	if err := c.rls.check(); err != nil {
		return nil, err
	}
	if err := c.http.check(); err != nil {
		return nil, err
	}
	c.breaker.Failures = uint32(min(c.breakerFailures, math.MaxUint32))
	// The embedded server takes no credentials: said before Check finds
	// them incomplete.
	c.ReadEnv(os.Getenv)
	if c.natsURL == "" && c.Configured() {
		return nil, errors.New("NATS credentials and --nats-tls-* need --nats-url: the embedded server takes neither")
	}
	opts, log, err := c.ServeFlags.Check(c.natsURL, stderr)
	c.natsOpts = opts
	return log, err
}

// loggedError is an error serve has logged already: the command exits 1
// without printing it again.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

// serve runs the limiter until ctx ends, then shuts down gracefully. c has
// passed runServe's checks (flags, prefix, region).
func serve(ctx context.Context, c serveConfig, log *slog.Logger, stdout io.Writer) error {
	if c.gcHeadroomMiB > 0 && os.Getenv("GOGC") == "" {
		// The limiter's garbage is its traffic (NATS copies every message)
		// and its live heap often a few MiB: at GOGC's default it would
		// collect dozens of times a second under load (docs/performance.md).
		floor := gcfloor.Start(uint64(c.gcHeadroomMiB) << 20)
		defer floor.Stop()
	}
	var breaker *region.Breaker
	var trips telemetry.TripCounter // the Redis origin, when there is one
	origin := "memory"              // where counts are kept, for the serving line
	if c.redisURL != "" {
		// go-redis writes its own lines ("redis: ... pool.go: ...", one per
		// failed dial while Redis is down) to the process's stderr through a
		// logger that is a package-level variable of the library. It is
		// process-wide state, so the command that owns the process sets it,
		// once, here; package region, a library, leaves it alone.
		redis.SetLogger(redisLogger{log})
		rd, err := region.NewRedis(region.RedisConfig{URL: c.redisURL, KeyPrefix: c.redisPrefix})
		if err != nil {
			return fmt.Errorf("--redis-url: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := rd.Ping(pctx); err != nil {
			log.Warn("Redis does not answer yet; deciding locally until it does", "error", err)
		}
		cancel()
		c.breaker.Name = "redis"
		c.breaker.Logger = log
		breaker = region.NewBreaker(rd, c.breaker)
		c.svc.Origin = breaker
		trips, origin = rd, "redis"
	}

	url := c.natsURL
	if url == "" {
		emb, err := embedded.Start(ctx, c.natsListen)
		if err != nil {
			return fmt.Errorf("embedded NATS: %w (pass --nats-listen 127.0.0.1:0 for any free port, or --nats-url to use a running server)", err)
		}
		defer emb.Shutdown()
		url = emb.ClientURL()
		fmt.Fprintf(stdout, "embedded NATS server listening on %s\n", url)
	}
	conns := make([]*natsconn.Conn, c.instances)
	for i := range conns {
		nc, err := natsconn.Connect(url, "sluice-limiter", log, c.natsOpts...)
		if err != nil {
			return err
		}
		defer nc.Close()
		conns[i] = nc
	}
	nc := conns[0].Conn
	regionName, err := conns[0].ServedRegion(c.Region)
	if err != nil {
		return err
	}

	c.svc.Logger = log
	c.svc.Region = regionName
	glink := link.NewGlobal(nc, wire.Subjects{Prefix: c.Prefix}, regionName, log)
	if c.redisURL != "" {
		glink.ShareOrigin() // one limiter of the region stores each import in Redis
		c.svc.Locals = glink
	}
	c.svc.Global = glink
	events, err := startEvents(ctx, &c, nc, regionName)
	if err != nil {
		return err
	}
	if events != nil {
		c.svc.Decisions = events
	}
	svc := service.New(c.svc)
	var (
		lims    []*transport.Limiter
		rlsSrv  *rlsServer
		httpSrv *httpServer
	)
	shutdownAll := func(ctx context.Context) error {
		var errs []error
		for _, l := range lims {
			errs = append(errs, l.Shutdown(ctx))
		}
		return errors.Join(errs...)
	}
	// abort stops what started before a step of the start failed, the doors
	// first, and returns that step's err.
	abort := func(err error) error {
		httpSrv.stop(context.Background())
		rlsSrv.stop(context.Background())
		_ = shutdownAll(context.Background())
		_ = svc.Close(context.Background())
		return err
	}
	// The policies before the imports, and both before the checks: a
	// limiter serves by the region's overrides from its first check (none
	// without a bridge), and applies the bridge's imports knowing its reset
	// marks. Imports applied before the marks would make cells of epoch 0
	// (without Redis an import makes its cell), drop the imports of a
	// reset's cell (not of that epoch), and the marks would then forget
	// those cells: other regions' usage since a reset would not count.
	plink, err := link.NewPolicy(nc, link.PolicyConfig{Subjects: wire.Subjects{Prefix: c.Prefix},
		Region: regionName, Table: svc.Policies(), Resets: svc, Now: svc.Now, MaxClockSkew: c.svc.MaxClockSkew, Logger: log})
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = plink.Start(pctx)
		cancel()
	}
	if err != nil {
		return abort(err)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = glink.Attach(actx, svc)
	cancel()
	if err != nil {
		_ = plink.Close(context.Background())
		return abort(err)
	}
	reg := telemetry.NewRegistry()
	var observe func(time.Duration)
	if c.MetricsAddr != "" {
		observe = telemetry.CheckLatency(reg)
	}
	var ids []string
	// One bound on checks waiting on Redis for the whole process, shared
	// fairly between tenants by every door.
	waiting := door.NewWaiting(c.maxWaiting)
	// Each instance is a micro service on its own connection sharing the one
	// cell table: a micro endpoint handles one message at a time, so more
	// instances use more cores.
	for _, conn := range conns {
		lim, err := transport.Serve(conn.Conn, transport.LimiterConfig{Service: svc, Region: regionName,
			Subjects: wire.Subjects{Prefix: c.Prefix}, Logger: log, ObserveLatency: observe, Waiting: waiting,
			Version: buildinfo.Semver(c.version), PolicyLink: plink})
		if err != nil {
			return abort(err)
		}
		lims = append(lims, lim)
		ids = append(ids, lim.Info().ID)
	}
	// The endpoints' subscriptions must reach the server before anything
	// says the limiter serves: a client that reads "metrics on" or "limiter
	// serving" and checks at once would otherwise find no responders.
	for _, conn := range conns {
		if err := conn.FlushTimeout(5 * time.Second); err != nil {
			return abort(fmt.Errorf("subscribe the check endpoints: %w", err))
		}
	}
	rlsAddr, httpAddr := "off", "off" // the doors' listeners, for the serving line
	if c.rls.listen != "" {
		if rlsSrv, err = startRLS(c.rls, svc, waiting, reg, log, stdout); err != nil {
			return abort(err)
		}
		rlsAddr = rlsSrv.addr
	}
	// The HTTP door's requests run on goroutines of their own, so one
	// instance's endpoints serve them all.
	if c.http.listen != "" {
		if httpSrv, err = startHTTP(c.http, lims[0], log, stdout); err != nil {
			return abort(err)
		}
		httpAddr = httpSrv.addr
	}
	var metricsSrv *http.Server
	if c.MetricsAddr != "" {
		var bs telemetry.BreakerState
		if breaker != nil {
			bs = breaker
		}
		telemetry.RegisterLimiter(reg, lims, svc, glink, bs)
		if trips != nil {
			telemetry.RegisterTrips(reg, trips)
		}
		telemetry.RegisterPolicies(reg, svc, plink)
		if events != nil {
			telemetry.RegisterDecisionStream(reg, events.DecisionStream)
		}
		var addr string
		metricsSrv, addr, err = telemetry.Serve(c.MetricsAddr, reg, func() error {
			for _, conn := range conns {
				if !conn.IsConnected() {
					return errors.New("NATS not connected")
				}
			}
			if svc.Closed() {
				return errors.New("shutting down")
			}
			return rlsSrv.ready()
		}, log)
		if err != nil {
			return abort(err)
		}
		fmt.Fprintf(stdout, "metrics on http://%s/metrics (probes /healthz, /readyz)\n", addr)
	}

	// Said once, on the log, when everything is up: endpoints subscribed and
	// the metrics listener bound. Standard output says only where the
	// process listens.
	log.Info("limiter serving", "version", c.version, "region", regionName, "nats", redact.Conn(url), "instances", ids, "origin", origin,
		"rls", rlsAddr, "http", httpAddr, "check", wire.Subjects{Prefix: c.Prefix}.Check("<workspace>", "<namespace>"))

	<-ctx.Done()
	log.Info("shutting down: no new checks, finishing those in flight, settling with Redis")
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	// The doors first: their requests in flight get their decisions from
	// endpoints still serving.
	httpSrv.stop(sctx)
	rlsSrv.stop(sctx)
	err = errors.Join(shutdownAll(sctx), plink.Close(sctx), svc.Close(sctx), glink.Close(), events.close(sctx), telemetry.Shutdown(sctx, metricsSrv))
	for _, conn := range conns {
		err = errors.Join(err, conn.Drain(sctx))
	}
	if err != nil {
		// One line an operator can act on; with Redis down, what it lacks.
		attrs := []any{"error", err}
		if pe := (*service.PendingError)(nil); errors.As(err, &pe) {
			attrs = append(attrs, "cells_not_settled", pe.Cells, "cost_never_sent", pe.Unsent)
		}
		log.Error("shutdown incomplete", attrs...)
		return loggedError{fmt.Errorf("shutdown: %w", err)}
	}
	log.Info("stopped")
	return nil
}

// redisLogger passes go-redis's own messages to slog at debug level: while
// Redis is down they repeat on every failed call, and the breakers' state
// changes already say so once at info and warn level.
type redisLogger struct{ log *slog.Logger }

// Printf logs one go-redis message at debug level, formatting it only when
// debug is enabled.
func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	if !l.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	l.log.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, args...)), "from", "go-redis")
}

// decisionEvents is the running decision stream; nil when off.
type decisionEvents struct {
	*transport.DecisionStream
}

// startEvents starts the decision stream when --decision-events asks for
// it (nil otherwise), first creating its JetStream stream when
// --decision-events-jetstream does. It names this process in the events
// by c.svc.ID, which it draws when empty.
func startEvents(ctx context.Context, c *serveConfig, nc *nats.Conn, regionName string) (*decisionEvents, error) {
	if !c.events.on {
		if c.events.jetstream || c.events.admissions != 0 {
			return nil, errors.New("--decision-events-jetstream and --decision-events-admissions need --decision-events")
		}
		return nil, nil
	}
	if c.events.admissions < 0 {
		return nil, fmt.Errorf("--decision-events-admissions must be 0 or more, got %d", c.events.admissions)
	}
	subjects := wire.Subjects{Prefix: c.Prefix}
	if c.events.jetstream {
		jctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := transport.EnsureDecisionStream(jctx, nc, subjects, c.events.maxAge, 0)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if c.svc.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.svc.ID = hex.EncodeToString(b[:])
	}
	return &decisionEvents{transport.NewDecisionStream(nc, transport.DecisionStreamConfig{Subjects: subjects,
		Region: regionName, Limiter: c.svc.ID, SampleAdmissions: c.events.admissions, Buffer: c.events.size})}, nil
}

// close publishes the queued events; a nil stream has none.
func (e *decisionEvents) close(ctx context.Context) error {
	if e == nil {
		return nil
	}
	return e.Close(ctx)
}
