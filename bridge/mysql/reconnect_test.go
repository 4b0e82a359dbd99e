package mysql_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/storetest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// A bridge (with a sweep, as with --redis-url) whose MySQL link
// was cut, its write breaker open, is stopped right after the link came
// back, before any periodic write got through. Its last writes go over a
// fresh connection, past the open breaker: MySQL holds every count and
// override it took in, and nothing is logged as not yet durable.
func TestBridgeStoppedJustAfterMySQLIsBackWritesOnAFreshConnection(t *testing.T) {
	s := startStopScenario(t)
	s.proxy.SetMode(tcpproxy.Refuse) // resets every pooled connection
	s.b.FromLimiters([]global.Component{s.comp("a", 25), s.comp("b", 7)}, 0)
	override := policy.Entry{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: "vip_*"},
		Override: policy.Override{Limit: 5, Duration: 60_000}, Version: policy.Version{At: time.Now().UnixMilli(), Origin: "us"}}
	if err := s.b.FromLimiterPolicies([]policy.Entry{override}, nil, 0); err != nil {
		t.Fatal(err)
	}
	// Open for a minute once tripped: no periodic write gets through
	// between the link's return and the stop.
	waitFor(t, 10*time.Second, "the write breaker open with 2 rows and the override queued", func() bool {
		n, err := s.b.Backlog()
		return s.store.BreakerState() == gobreaker.StateOpen && n == 2 && err != nil && s.b.PolicyStoreQueued() == 1
	})

	s.proxy.SetMode(tcpproxy.Pass)
	s.stop()
	if a, b := s.inMySQL("a"), s.inMySQL("b"); a != 25 || b != 7 {
		t.Fatalf("after the stop MySQL holds a=%d b=%d, want 25 and 7 (what the bridge took in); log:\n%s", a, b, s.logs.String())
	}
	es, err := s.direct.LoadOverrides(t.Context())
	if err != nil || len(es) != 1 || es[0] != override {
		t.Fatalf("overrides in MySQL = %+v, %v; want %+v", es, err, override)
	}
	if n := s.logs.count("not yet durable"); n != 0 {
		t.Fatalf("%d lines say rows are not yet durable, want none; log:\n%s", n, s.logs.String())
	}
	if st := s.store.BreakerState(); st != gobreaker.StateClosed {
		t.Fatalf("write breaker %s after the last writes succeeded, want closed", st)
	}
}

// The same stop with MySQL still down, refusing connections or silent:
// the bridge tries a fresh connection for at most 2s (half of the 10s it
// was given is more), then stops, saying in one line that it retried on a
// fresh connection and how many rows are not yet durable.
func TestBridgeStoppedWhileMySQLStaysDownGivesUpWithinTheRetryDeadline(t *testing.T) {
	const (
		retryDeadline = 2 * time.Second // bridge's closeRetryMax
		margin        = 1500 * time.Millisecond
	)
	for _, mode := range []tcpproxy.Mode{tcpproxy.Refuse, tcpproxy.Blackhole} {
		t.Run(mode.String(), func(t *testing.T) {
			s := startStopScenario(t)
			s.proxy.SetMode(mode)
			s.b.FromLimiters([]global.Component{s.comp("a", 25), s.comp("b", 7)}, 0)
			waitFor(t, 10*time.Second, "a failed store call", func() bool {
				_, err := s.b.Backlog()
				return err != nil
			})
			took := s.stop()
			// Close first waits for the loops, whose store calls end within
			// StoreTimeout; then comes the last try.
			if limit := stopStoreTimeout + retryDeadline + margin; took > limit {
				t.Fatalf("close took %v with MySQL %s, want at most %v; log:\n%s", took, mode, limit, s.logs.String())
			}
			out := s.logs.String()
			if n := s.logs.count("not yet durable"); n != 1 {
				t.Fatalf("%d lines say rows are not yet durable, want 1; log:\n%s", n, out)
			}
			var line string
			for l := range strings.Lines(out) {
				if strings.Contains(l, "not yet durable") {
					line = l
				}
			}
			if !strings.Contains(line, "after retrying on a fresh connection") || !strings.Contains(line, "not_durable=2") {
				t.Fatalf("the line does not say it retried on a fresh connection and that 2 rows are not durable:\n%s", line)
			}
			t.Logf("close took %v: %s", took.Round(time.Millisecond), strings.TrimSpace(line))
			if a, b := s.inMySQL("a"), s.inMySQL("b"); a != 10 || b != 0 {
				t.Fatalf("MySQL holds a=%d b=%d while down, want 10 and 0", a, b)
			}
		})
	}
}

// stopStoreTimeout is the scenario's StoreTimeout.
const stopStoreTimeout = time.Second

// stopScenario is a bridge with a sweep whose MySQL store goes through a
// proxy the test controls, and a direct view of the same database.
type stopScenario struct {
	t      *testing.T
	proxy  *tcpproxy.Proxy
	store  *mysql.Store // the bridge's, through the proxy
	direct *mysql.Store // the same database, not through the proxy
	b      *bridge.Bridge
	logs   *logBuffer
	now    int64
	closed bool // the test closed b
}

// startStopScenario starts the bridge with MySQL reachable and waits until
// a's first count, 10, is in MySQL: the pool holds connections that the
// cut will kill.
func startStopScenario(t *testing.T) *stopScenario {
	t.Helper()
	dsn := mysqltest.Database(t)
	proxy, cfg := mysqltest.BehindProxy(t, dsn)
	s := &stopScenario{t: t, proxy: proxy, logs: &logBuffer{}, now: time.Now().UnixMilli()}
	log := slog.New(slog.NewTextHandler(s.logs, nil))
	s.store = openLazy(t, cfg.FormatDSN(), mysql.Config{Logger: log, RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Breaker: mysql.Breaker{OpenFor: time.Minute}})
	waitReady(t, s.store, 10*time.Second)
	s.direct = openMySQLOn(t, dsn, mysql.Config{})
	// The region's Redis stand-in holds nothing: every count comes from
	// the limiters, so MySQL holds only what the bridge wrote.
	sweep := func(context.Context, func([]global.Component) error) error { return nil }
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: "us", Store: s.store, Transport: dropTransport{}, Logger: log,
		Sweep: sweep, SweepInterval: time.Hour, StoreInterval: 10 * time.Millisecond, ReloadInterval: 20 * time.Millisecond,
		StoreTimeout: stopStoreTimeout})
	if err != nil {
		t.Fatal(err)
	}
	s.b = b
	b.Start(t.Context())
	t.Cleanup(func() {
		if !s.closed {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		}
	})
	b.FromLimiters([]global.Component{s.comp("a", 10)}, 0)
	waitFor(t, 10*time.Second, "a's first count in MySQL", func() bool { return s.inMySQL("a") == 10 })
	return s
}

// stop closes the bridge with 10s to do it, as a SIGTERM with the default
// --shutdown-timeout does, and returns how long that took.
func (s *stopScenario) stop() time.Duration {
	s.t.Helper()
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.b.Close(ctx); err != nil {
		s.t.Fatalf("close: %v", err)
	}
	return time.Since(start)
}

func (s *stopScenario) cell(id string) window.Cell {
	return window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 600_000,
		Sequence: window.Sequence(s.now, 600_000)}
}

func (s *stopScenario) comp(id string, n int64) global.Component {
	c := s.cell(id)
	return global.Component{Cell: c, Region: "us", Count: n, ExpireAt: c.Expiry(60_000)}
}

// inMySQL returns us's count of id in MySQL, read directly (0: no row).
func (s *stopScenario) inMySQL(id string) int64 {
	s.t.Helper()
	cs, err := storetest.Components(s.t.Context(), s.direct, time.Now().UnixMilli())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, c := range cs {
		if c.Cell == s.cell(id) && c.Region == "us" {
			return c.Count
		}
	}
	return 0
}

// dropTransport drops what a bridge sends: only the store matters here.
type dropTransport struct{}

func (dropTransport) Forward(context.Context, []global.Component) error { return nil }
func (dropTransport) Broadcast(context.Context, []global.Import) error  { return nil }
func (dropTransport) ForwardPolicies(context.Context, []policy.Entry, []policy.Mark) error {
	return nil
}
func (dropTransport) BroadcastPolicies(context.Context, []policy.Entry, []policy.Mark, uint64) error {
	return nil
}
