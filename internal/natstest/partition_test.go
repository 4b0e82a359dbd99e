package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

// healBound is how long the mesh may take to re-form after HealGateways.
const healBound = 5 * time.Second

func startCuttable(t *testing.T, ctx context.Context, regions ...string) *Supercluster {
	t.Helper()
	sc, err := StartSuperclusterWith(ctx, SuperclusterOptions{Regions: regions, CuttableGateways: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	return sc
}

// waitProxyConns waits until every region's proxy carries one connection
// per other region: the inbound gateways into that region, and nothing
// else.
func waitProxyConns(ctx context.Context, t *testing.T, sc *Supercluster) {
	t.Helper()
	want := len(sc.regions) - 1
	err := sc.poll(ctx, func() (string, error) {
		for _, r := range sc.regions {
			if n := sc.proxies[r].Conns(); n != want {
				return fmt.Sprintf("proxy of %q carries %d connections, want %d", r, n, want), nil
			}
		}
		return "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkProxied fails the test unless every gateway connection of sc
// passes through the proxy of the region it goes into, and no server knows
// any other address for a gateway than a proxy's.
func checkProxied(ctx context.Context, t *testing.T, sc *Supercluster) {
	t.Helper()
	proxyOf := make(map[string]string, len(sc.regions)) // address -> region
	for _, r := range sc.regions {
		proxyOf[sc.proxies[r].Addr()] = r
	}
	for _, r := range sc.regions {
		s := sc.Server(r)
		gz, err := s.Gatewayz(nil)
		if err != nil {
			t.Fatal(err)
		}
		// What r tells other gateways about itself.
		if got, want := net.JoinHostPort(gz.Host, strconv.Itoa(gz.Port)), sc.proxies[r].Addr(); got != want {
			t.Errorf("region %q advertises its gateway at %s, want its proxy %s", r, got, want)
		}
		if real := s.GatewayAddr().String(); proxyOf[real] != "" {
			t.Fatalf("region %q gateway listener %s is a proxy address", r, real)
		}
		// Where r's outbound gateways actually go.
		for o, rgw := range gz.OutboundGateways {
			addr := net.JoinHostPort(rgw.Connection.IP, strconv.Itoa(rgw.Connection.Port))
			if proxyOf[addr] != o {
				t.Errorf("outbound gateway from %q to %q (configured: %v) connects to %s, not to the proxy of %q (%s)",
					r, o, rgw.IsConfigured, addr, o, sc.proxies[o].Addr())
			}
		}
		// Every URL r knows for a configured remote, including those it
		// learned from the remote's INFO.
		vz, err := s.Varz(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range vz.Gateway.Gateways {
			for _, u := range g.URLs {
				if proxyOf[u] != g.Name {
					t.Errorf("region %q knows gateway %q at %s, not only at its proxy %s",
						r, g.Name, u, sc.proxies[g.Name].Addr())
				}
			}
		}
	}
	waitProxyConns(ctx, t, sc)
}

// checkNoAnswer fails the test unless a few requests on subj from nc all go
// unanswered.
func checkNoAnswer(ctx context.Context, t *testing.T, nc *natsgo.Conn, subj string) {
	t.Helper()
	for i := range 5 {
		rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		msg, err := nc.RequestWithContext(rctx, subj, nil)
		cancel()
		switch {
		case err == nil:
			t.Fatalf("request %d on %s answered by %q across a partition", i, subj, msg.Data)
		case errors.Is(err, natsgo.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
		default:
			t.Fatalf("request %d on %s: %v", i, subj, err)
		}
	}
}

func TestSuperclusterCuttableWiring(t *testing.T) {
	ctx := testContext(t)
	sc := startCuttable(t, ctx, "us", "eu", "ap")
	checkProxied(ctx, t, sc)

	// After a cut and heal the reconnected gateways use the proxies too.
	sc.CutGateways()
	if err := sc.WaitPartitioned(ctx); err != nil {
		t.Fatal(err)
	}
	sc.HealGateways()
	if err := sc.WaitMesh(ctx); err != nil {
		t.Fatal(err)
	}
	checkProxied(ctx, t, sc)
}

func TestSuperclusterPartitionAndHeal(t *testing.T) {
	ctx := testContext(t)
	sc := startCuttable(t, ctx, "us", "eu", "ap")
	clients := make(map[string]*natsgo.Conn)
	for _, r := range sc.Regions() {
		clients[r] = connect(t, sc.ClientURL(r))
	}
	eu := clients["eu"]

	respond(t, connect(t, sc.ClientURL("us")), "limits.check", "us")
	requestUntil(ctx, t, eu, "limits.check", "us")

	for cycle := 1; cycle <= 2; cycle++ {
		start := time.Now()
		sc.CutGateways()
		if err := sc.WaitPartitioned(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("cycle %d: partitioned %v after CutGateways", cycle, time.Since(start).Round(time.Millisecond))

		checkNoAnswer(ctx, t, eu, "limits.check")
		// Each region keeps serving its own clients.
		subj := "limits.local." + strconv.Itoa(cycle)
		for r, nc := range clients {
			respond(t, connect(t, sc.ClientURL(r)), subj, r)
			msg, err := nc.RequestWithContext(ctx, subj, nil)
			if err != nil {
				t.Fatalf("cycle %d: local request in %q: %v", cycle, r, err)
			}
			if string(msg.Data) != r {
				t.Fatalf("cycle %d: local request in %q answered by %q", cycle, r, msg.Data)
			}
		}
		if err := sc.WaitPartitioned(ctx); err != nil {
			t.Fatal(err) // still cut: the servers keep retrying in vain
		}

		start = time.Now()
		sc.HealGateways()
		if err := sc.poll(ctx, sc.missingGateway); err != nil {
			t.Fatal(err)
		}
		connected := time.Since(start)
		if err := sc.WaitMesh(ctx); err != nil {
			t.Fatal(err)
		}
		meshed := time.Since(start)
		requestUntil(ctx, t, eu, "limits.check", "us")
		t.Logf("cycle %d: after HealGateways, gateways connected in %v, WaitMesh done in %v, eu->us request answered in %v",
			cycle, connected.Round(time.Millisecond), meshed.Round(time.Millisecond),
			time.Since(start).Round(time.Millisecond))
		// nats-server reconnects to a configured gateway about every 1.1s,
		// so the mesh is normally whole within that. The bound is looser,
		// for loaded machines; it catches a heal that takes several
		// reconnect rounds or falls back to backoff.
		if meshed > healBound {
			t.Errorf("cycle %d: mesh took %v to re-form, want under %v", cycle, meshed, healBound)
		}
	}
}

func TestSuperclusterCutWithoutProxies(t *testing.T) {
	ctx := testContext(t)
	sc, err := StartSuperclusterWith(ctx, SuperclusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	if len(sc.proxies) != 0 {
		t.Fatalf("%d proxies without CuttableGateways", len(sc.proxies))
	}

	sc.CutGateways() // no-op
	if missing, err := sc.missingGateway(); err != nil || missing != "" {
		t.Fatalf("after CutGateways without proxies: %s %v", missing, err)
	}
	sc.HealGateways() // no-op
	if err := sc.WaitMesh(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range sc.Regions() {
		addr := sc.Server(r).GatewayAddr().String()
		gz, err := sc.Server(r).Gatewayz(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := net.JoinHostPort(gz.Host, strconv.Itoa(gz.Port)); got != addr {
			t.Errorf("region %q advertises %s, want its listener %s", r, got, addr)
		}
	}

	sc.StopRegion("ap")
	start := time.Now()
	if err := sc.WaitMesh(ctx); err == nil {
		t.Error("WaitMesh succeeded with a stopped region")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("WaitMesh took %v to fail with a stopped region", d)
	}
}

func TestStartSuperclusterWithInvalid(t *testing.T) {
	for _, regions := range [][]string{{"us", "us"}, {"us", ""}, {"us", "e u"}} {
		sc, err := StartSuperclusterWith(t.Context(), SuperclusterOptions{Regions: regions, CuttableGateways: true})
		if err == nil {
			sc.Shutdown()
			t.Errorf("regions %q accepted", regions)
		}
	}
}
