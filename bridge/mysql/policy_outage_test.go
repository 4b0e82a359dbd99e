package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/service"
)

// Faults together: an override and a reset acknowledged while MySQL
// refuses every connection, then the bridge that acknowledged them stops
// (its queue with it) and a new one starts, MySQL still down. Nothing is
// lost: the limiter that accepted them gives them to the new bridge (their
// digests differ), which writes them once MySQL answers.
func TestPoliciesAcknowledgedDuringAMySQLOutageSurviveABridgeRestart(t *testing.T) {
	proxy, cfg := mysqltest.BehindProxy(t, mysqltest.Database(t))
	proxy.SetMode(tcpproxy.Refuse)
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	startBridge := func() (*bridge.Bridge, *link.Bridge, *mysql.Store) {
		store := openLazy(t, cfg.FormatDSN(), mysql.Config{RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond})
		bt := link.NewBridge(connect(), wire.Subjects{}, "us", nil)
		b, err := bridge.NewBridge(bridge.BridgeConfig{Region: "us", Store: store, Transport: bt,
			BatchInterval: 5 * time.Millisecond, StoreInterval: 10 * time.Millisecond, StoreTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		b.Start(t.Context())
		if err := bt.Serve(b); err != nil {
			t.Fatal(err)
		}
		return b, bt, store
	}
	b1, bt1, _ := startBridge()

	svc := service.New(service.Config{})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	lnc := connect()
	plink, err := link.NewPolicy(lnc, link.PolicyConfig{Region: "us", Table: svc.Policies(), Resets: svc,
		SyncInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := plink.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plink.Close(context.Background()) })
	lim, err := transport.Serve(lnc, transport.LimiterConfig{Service: svc, Region: "us", PolicyLink: plink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Shutdown(context.Background()) })
	if err := lnc.Flush(); err != nil {
		t.Fatal(err)
	}

	client := bus.NewClient(connect())
	if _, err := client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "vip_*", Limit: 5, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Reset(t.Context(), "acme", "api", "alice", 0); err != nil {
		t.Fatal(err)
	}
	if plink.Stats().Pending != 0 {
		t.Fatal("the bridge did not acknowledge")
	}
	waitFor(t, 5*time.Second, "both queued for MySQL, which refuses", func() bool { return b1.PolicyStoreQueued() == 2 })

	// The bridge goes during the outage, with what it queued.
	_ = bt1.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_ = b1.Close(ctx)
	cancel()
	b2, _, store := startBridge()
	waitFor(t, 5*time.Second, "the new bridge has both from the limiter", func() bool {
		_, _, ok := b2.Policies().Match("acme", "api", "vip_1")
		return ok && len(b2.Marks().All()) == 1
	})

	proxy.SetMode(tcpproxy.Pass)
	waitFor(t, 10*time.Second, "both in MySQL", func() bool {
		es, err := store.LoadOverrides(t.Context())
		if err != nil || len(es) != 1 || es[0].Limit != 5 {
			return false
		}
		ms, err := store.LoadMarks(t.Context(), time.Now().UnixMilli())
		return err == nil && len(ms) == 1 && ms[0].Identifier == "alice"
	})
}
