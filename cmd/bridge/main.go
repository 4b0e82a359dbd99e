// Command bridge runs a Sluice bridge: one per region (two for redundancy),
// it carries the region's G-Counter components and denials to the other
// regions over the NATS supercluster and into MySQL, keeps the other regions'
// components, and tells the region's limiters, per cell, the sum of foreign
// usage.
//
//	bridge [serve] [flags]         run the bridge (default)
//	bridge migrate --mysql-dsn D   create the database if it does not exist,
//	                               apply the MySQL schema, say what was done
//	bridge --version               print the version the binary was built as
//	bridge help                    say how to use it
//
// The bridge starts whether or not MySQL answers: it forwards over NATS at
// once, queues its writes, and writes them once MySQL answers and the
// database exists; /readyz says what is missing meanwhile. With --redis-url
// (the region's Redis, as its limiters use it) it also sweeps the region's
// counts from Redis into MySQL at start, when MySQL answers again, and every
// --sweep-interval, so nothing acknowledged is lost when a bridge stops or
// crashes, and a stop during a MySQL outage is prompt.
//
// Every flag can also come from the environment as SLUICE_ + the flag name in
// upper case with _ for - (SLUICE_MYSQL_DSN for --mysql-dsn).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/natsconn"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/internal/telemetry"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// version is the version this binary was built as, set at link time by
// `make build` (-ldflags "-X main.version=..."); empty: see buildinfo.Version.
var version string

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	v := buildinfo.Version(version)
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "migrate" || args[0] == "help") {
		cmd, args = args[0], args[1:]
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprintln(stdout, "bridge", v)
		return 0
	}
	switch cmd {
	case "migrate":
		return runMigrate(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, "usage: bridge [serve] [flags] | bridge migrate --mysql-dsn D; -h after either lists its flags")
		return 0
	default:
		return runServe(ctx, v, args, stdout, stderr)
	}
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := envflag.NewFlagSet("bridge migrate", stderr)
	dsn := fs.String("mysql-dsn", "", "MySQL/MariaDB DSN, e.g. user:pass@tcp(host:3306)/sluice (required)")
	err := envflag.ParsePositive(fs, args)
	if err == nil && *dsn == "" {
		err = errors.New("--mysql-dsn is required")
	}
	if err != nil {
		return envflag.Refuse(stderr, "bridge migrate", err)
	}
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep, err := mysql.MigrateDatabase(mctx, *dsn, mysql.Config{})
	if err != nil {
		fmt.Fprintln(stderr, "bridge migrate:", redact.Error(err, *dsn))
		if errors.Is(err, mysql.ErrInvalidDSN) {
			return 2
		}
		return 1
	}
	fmt.Fprintln(stdout, rep)
	return 0
}

type serveConfig struct {
	natsconn.ServeFlags   // --region, --subject-prefix, --metrics-addr, --log-level, --nats-*
	natsURL, mysqlDSN     string
	version               string // the binary's, as --version prints it
	shutdownTimeout       time.Duration
	bridge                bridge.BridgeConfig
	natsOpts              []nats.Option
	regions               string // --regions, parsed into bridge.Regions
	redisURL, redisPrefix string
}

func runServe(ctx context.Context, version string, args []string, stdout, stderr io.Writer) int {
	c := serveConfig{version: version}
	fs := envflag.NewFlagSet("bridge serve", stderr)
	fs.StringVar(&c.natsURL, "nats-url", nats.DefaultURL, "NATS server of the bridge's region")
	fs.StringVar(&c.regions, "regions", "", "the deployment's regions, comma-separated (this one may be listed): each other one gets a sluice_bridge_region_lag_seconds series from the start, even if it never sends; empty: only regions heard from or found in the store")
	fs.StringVar(&c.mysqlDSN, "mysql-dsn", "", "MySQL/MariaDB DSN of the global store; empty keeps it in memory (nothing durable)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown may take to forward and store what is pending")
	fs.DurationVar(&c.bridge.BatchInterval, "batch-interval", 10*time.Millisecond, "how often components are forwarded and imports broadcast")
	fs.DurationVar(&c.bridge.StoreInterval, "store-interval", 100*time.Millisecond, "how often the region's components are written to MySQL")
	fs.DurationVar(&c.bridge.ReloadInterval, "reload-interval", time.Second, "how often what changed in MySQL (every region's components, overrides and reset marks) is read back")
	fs.DurationVar(&c.bridge.CleanupInterval, "cleanup-interval", time.Minute, "how often expired rows are deleted")
	fs.StringVar(&c.redisURL, "redis-url", "", "the region's Redis, as its limiters' --redis-url: the bridge sweeps every live cell's count from it into MySQL, so a bridge that stops, crashes or outlives a MySQL outage loses nothing; empty: MySQL holds only what this process wrote")
	fs.StringVar(&c.redisPrefix, "redis-prefix", region.DefaultKeyPrefix, "prefix of every Redis key, as the region's limiters' --redis-prefix")
	fs.DurationVar(&c.bridge.SweepInterval, "sweep-interval", bridge.DefaultSweepInterval, "with --redis-url: how often the region's counts are swept from Redis into MySQL (also at start and when MySQL answers again)")
	fs.DurationVar(&c.bridge.MaxClockSkew, "max-clock-skew", global.DefaultMaxClockSkew, "how far another host's clock may be from this host's: messages stamped further away, and entries for windows starting later than this host's clock plus it, are refused and counted")
	c.ServeFlags.RegisterFlags(fs)
	log, err := c.check(fs, args, stderr)
	if err != nil {
		return envflag.Refuse(stderr, "bridge", err)
	}
	if err := serve(ctx, c, log, stdout); err != nil {
		if errors.Is(err, mysql.ErrInvalidDSN) {
			return envflag.Refuse(stderr, "bridge", fmt.Errorf("--mysql-dsn: %w", err))
		}
		if errors.Is(err, errRedisURL) {
			return envflag.Refuse(stderr, "bridge", err)
		}
		// Once the logger exists, stderr holds only its lines.
		log.Error("bridge stopped with an error", "error", err)
		return 1
	}
	return 0
}

// check parses args into c and returns the logger the flags ask for, or
// what makes them unable to work.
func (c *serveConfig) check(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, error) {
	if err := envflag.ParsePositive(fs, args); err != nil {
		return nil, err
	}
	opts, log, err := c.ServeFlags.Check(c.natsURL, stderr)
	if err != nil {
		return nil, err
	}
	c.natsOpts = opts
	if c.bridge.Regions, err = splitRegions(c.regions); err != nil {
		return nil, fmt.Errorf("--regions: %w", err)
	}
	return log, nil
}

// serve runs the bridge until ctx ends, then shuts down gracefully. c has
// passed runServe's checks (flags, prefix, region).
func serve(ctx context.Context, c serveConfig, log *slog.Logger, stdout io.Writer) error {

	// The store is opened first, so that a DSN that does not parse stops
	// the bridge before anything else. MySQL itself is not waited for: the
	// store connects in the background, the bridge forwards over NATS
	// meanwhile and queues its writes, and /readyz says what is missing.
	var store bridge.Store
	storeReady := func() error { return nil }
	if c.mysqlDSN == "" {
		log.Warn("no --mysql-dsn: the global store is in memory and nothing is durable")
		store = bridge.NewMemoryStore()
	} else {
		st, err := mysql.OpenLazy(c.mysqlDSN, mysql.Config{
			Logger:             log,
			CreateDatabaseHint: fmt.Sprintf("run \"bridge migrate --mysql-dsn %s\" to create it", redact.Conn(c.mysqlDSN)),
		})
		if err != nil {
			return err
		}
		store, storeReady = st, st.Ready
	}
	defer store.Close()

	// The region's Redis, for sweeps: not dialled here (a bridge starts
	// while Redis is down and sweeps once it answers).
	var rdb *region.Redis
	if c.redisURL != "" {
		var err error
		if rdb, err = region.NewRedis(region.RedisConfig{URL: c.redisURL, KeyPrefix: c.redisPrefix}); err != nil {
			return fmt.Errorf("%w: %w", errRedisURL, err)
		}
		defer rdb.Close()
	} else if c.mysqlDSN != "" {
		log.Warn("no --redis-url: MySQL gets only what this bridge process writes; changes it holds when it stops during a MySQL outage, or when it crashes, are not recovered")
	}

	conn, err := natsconn.Connect(c.natsURL, "sluice-bridge", log, c.natsOpts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	nc := conn.Conn
	regionName, err := conn.ServedRegion(c.Region)
	if err != nil {
		return err
	}

	subjects := wire.Subjects{Prefix: c.Prefix}
	bt := link.NewBridge(nc, subjects, regionName, log, link.BridgeVersion(buildinfo.Semver(c.version)))
	c.bridge.Region, c.bridge.Store, c.bridge.Transport, c.bridge.Logger = regionName, store, bt, log
	if rdb != nil {
		c.bridge.Sweep = sweepRedis(rdb, c.redisURL, regionName, log)
	}
	reg := telemetry.NewRegistry()
	if c.MetricsAddr != "" {
		obs := telemetry.NewBridgeObservers(reg)
		c.bridge.ObserveStoreWrite, c.bridge.ObserveBatch = obs.StoreWrite, obs.Batch
	}
	b, err := bridge.NewBridge(c.bridge)
	if err != nil {
		return err
	}
	b.Start(ctx)
	if err := bt.Serve(b); err != nil {
		_ = b.Close(context.Background())
		return err
	}
	var metricsSrv *http.Server
	if c.MetricsAddr != "" {
		telemetry.RegisterBridge(reg, b, bt)
		var addr string
		metricsSrv, addr, err = telemetry.Serve(c.MetricsAddr, reg, func() error {
			// One line, each missing part's text separated by "; ", for the
			// probe's answer.
			var missing []string
			if !nc.IsConnected() {
				missing = append(missing, "NATS not connected")
			}
			if err := storeReady(); err != nil {
				missing = append(missing, err.Error())
			}
			if rows, err := b.Backlog(); err != nil && rows > 0 {
				missing = append(missing, fmt.Sprintf("%d rows not yet durable in MySQL", rows))
			}
			if len(missing) == 0 {
				return nil
			}
			return errors.New(strings.Join(missing, "; "))
		}, log)
		if err != nil {
			_ = bt.Close()
			_ = b.Close(context.Background())
			return err
		}
		fmt.Fprintf(stdout, "metrics on http://%s/metrics (probes /healthz, /readyz)\n", addr)
	}

	// Said once, on the log, when everything is up (metrics bound too);
	// standard output says only where the process listens.
	log.Info("bridge serving", "version", c.version, "region", regionName, "nats", redact.Conn(nc.ConnectedUrl()), "durable", c.mysqlDSN != "")

	<-ctx.Done()
	log.Info("shutting down: forwarding and storing what is pending")
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	err = errors.Join(bt.Close(), b.Close(sctx))
	err = errors.Join(err, telemetry.Shutdown(sctx, metricsSrv))
	err = errors.Join(err, conn.Drain(sctx))
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// errRedisURL marks a --redis-url or --redis-prefix that does not parse.
var errRedisURL = errors.New("--redis-url")

// sweepRedis returns the bridge's sweep of the region's Redis at url: every
// live cell's count (region.Redis.ScanCounts: the cell's count as every
// view reads it, a lease counted as used once no longer live) as this
// region's component.
// Its errors never show the URL's password.
func sweepRedis(r *region.Redis, url, regionName string, log *slog.Logger) bridge.SweepFunc {
	return func(ctx context.Context, yield func([]global.Component) error) error {
		rep, err := r.ScanCounts(ctx, func(cs []region.CellCount) error {
			out := make([]global.Component, len(cs))
			for i, c := range cs {
				out[i] = global.Component{Cell: c.Cell, Region: regionName, Count: c.Count, ExpireAt: c.ExpireAt}
			}
			return yield(out)
		})
		if rep.Skipped > 0 {
			log.Debug("sweep skipped keys that are not cells, or cells gone or empty", "keys", rep.Skipped)
		}
		return redact.Error(err, url) // nil for nil
	}
}

// splitRegions parses the --regions list: names separated by commas,
// spaces around them ignored, each a subject token.
func splitRegions(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var out []string
	for _, r := range strings.Split(list, ",") {
		r = strings.TrimSpace(r)
		if !wire.ValidToken(r) {
			return nil, fmt.Errorf("region %q: want names of %s, separated by commas", r, window.TokenRule)
		}
		out = append(out, r)
	}
	return out, nil
}
