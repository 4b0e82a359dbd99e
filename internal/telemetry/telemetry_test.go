package telemetry

import (
	"context"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/window"
)

// testClock is a clock the test moves by hand, shared by the bridges.
type testClock struct{ ms atomic.Int64 }

func (c *testClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *testClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// startBridge runs a bridge of region on the NATS server at url, as
// cmd/bridge does (real transport, in-memory store), until the test ends.
func startBridge(t *testing.T, url, region string, regions []string, clk *testClock) (*bridge.Bridge, *link.Bridge) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tr := link.NewBridge(nc, wire.Subjects{}, region, nil)
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: region, Regions: regions, Store: bridge.NewMemoryStore(),
		Transport: tr, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	b.Start(context.Background())
	if err := tr.Serve(b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tr.Close()
		_ = b.Close(context.Background())
	})
	return b, tr
}

// component is region's count of a cell of the window at now.
func component(region string, now time.Time) global.Component {
	cell := window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "id", Duration: 60_000,
		Sequence: window.Sequence(now.UnixMilli(), 60_000)}
	return global.Component{Cell: cell, Region: region, Count: 5, ExpireAt: cell.Expiry(60_000)}
}

// gaugesByLabel returns the values of the gauge name on reg, by the value of
// its label.
func gaugesByLabel(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := "<no " + label + " label>"
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// The lag of a bridge is per other region: one series for each region of
// the deployment, a region that never sent included (its lag grows from the
// bridge's start, so an alert on it fires), and none for the bridge's own
// region, even though its own forwards come back to it. The label is
// peer_region, so it never collides with a target label "region" an
// operator sets on the scrape.
func TestRegionLagHasASeriesForEveryOtherRegionEvenASilentOne(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	clk := &testClock{}
	clk.ms.Store(time.Now().UnixMilli())
	// us expects eu and ap; ap has no bridge at all.
	us, usTr := startBridge(t, srv.ClientURL(), "us", []string{"us", "eu", "ap"}, clk)
	eu, _ := startBridge(t, srv.ClientURL(), "eu", nil, clk)
	reg := NewRegistry()
	RegisterBridge(reg, us, usTr)

	clk.advance(45 * time.Second)
	now := clk.now()
	us.FromLimiters([]global.Component{component("us", now)}, now.UnixMilli())
	eu.FromLimiters([]global.Component{component("eu", now)}, now.UnixMilli())
	deadline := time.Now().Add(5 * time.Second)
	for us.Stats().ComponentsFromPeers == 0 || us.Stats().ComponentsForwarded == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("us never heard from eu or never forwarded: %+v", us.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}

	got := gaugesByLabel(t, reg, "sluice_bridge_region_lag_seconds", "peer_region")
	want := map[string]float64{"eu": 0, "ap": 45}
	if !maps.Equal(got, want) {
		t.Fatalf("sluice_bridge_region_lag_seconds by peer_region = %v, want %v (eu just sent; ap silent since the start 45s ago)", got, want)
	}
}

// A bridge with nothing to forward still sends a heartbeat at least every
// second, so another region's lag for it measures the link, not the
// traffic: a quiet region with a working gateway shows no lag.
func TestAQuietRegionsBridgeHeartbeatsSoItsLagStaysLow(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	clk := &testClock{}
	clk.ms.Store(time.Now().UnixMilli())
	us, usTr := startBridge(t, srv.ClientURL(), "us", []string{"us", "eu"}, clk)
	startBridge(t, srv.ClientURL(), "eu", nil, clk) // no limiter, no traffic
	reg := NewRegistry()
	RegisterBridge(reg, us, usTr)

	// Ten quiet seconds pass on both bridges' clock; eu's next batch tick
	// (every 10ms of real time) sends a heartbeat.
	clk.advance(10 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := gaugesByLabel(t, reg, "sluice_bridge_region_lag_seconds", "peer_region")
		if lag, ok := got["eu"]; ok && lag < 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag by peer_region = %v 5s after 10 quiet seconds, want eu's below 1s (heartbeats)", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The registry holds the live heap and GOGC, which the limiter's GC floor
// makes the figures to read (its allocated heap runs above what it holds).
func TestRegistryHoldsTheLiveHeapAndGOGC(t *testing.T) {
	mfs, err := NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, n := range []string{"go_gc_heap_live_bytes", "go_gc_gogc_percent", "go_memstats_heap_alloc_bytes", "go_goroutines"} {
		if !have[n] {
			t.Errorf("the registry lacks %s", n)
		}
	}
}
