package rls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/service"
)

// xdsNode is the node id the tests' management server serves.
const xdsNode = "envoy-ratelimit"

// xdsServer is go-control-plane's xDS server in the test process, serving
// a snapshot cache keyed by node id, as Envoy Gateway runs it.
type xdsServer struct {
	addr  string
	cache cachev3.SnapshotCache
	mu    sync.Mutex
	nacks []*discoveryv3.DiscoveryRequest // requests carrying an error
	acks  []string                        // versions acknowledged
}

func startXDSServer(t *testing.T, tc *tls.Config) *xdsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveXDS(t, ln, tc)
}

func serveXDS(t *testing.T, ln net.Listener, tc *tls.Config) *xdsServer {
	t.Helper()
	x := &xdsServer{addr: ln.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	g := grpc.NewServer(opts...)
	ctx, cancel := context.WithCancel(context.Background())
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, x.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			x.mu.Lock()
			defer x.mu.Unlock()
			switch {
			case req.GetErrorDetail() != nil:
				x.nacks = append(x.nacks, req)
			case req.GetResponseNonce() != "":
				x.acks = append(x.acks, req.GetVersionInfo())
			}
			return nil
		}}))
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() {
		cancel()
		g.Stop()
	})
	return x
}

// push makes the configuration of xdsNode version v: the resources given.
func (x *xdsServer) push(t *testing.T, v string, rcs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	rs := make([]cachetypes.Resource, len(rcs))
	for i, rc := range rcs {
		rs[i] = rc
	}
	snap, err := cachev3.NewSnapshot(v, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), xdsNode, snap); err != nil {
		t.Fatal(err)
	}
}

func (x *xdsServer) nacked() []*discoveryv3.DiscoveryRequest {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), x.nacks...)
}

// limitConfig is one domain with one descriptor key=value limited to n per
// unit.
func limitConfig(name, domain, key, value string, n uint32, unit rlconfv3.RateLimitUnit) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: key, Value: value, RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}}}}
}

// syncBuffer is a log destination safe for the client's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// xdsRLS is a rate limit service fed by an XDS client, served over gRPC.
type xdsRLS struct {
	srv     *Server
	metrics *Metrics
	xds     *XDS
	client  rlsv3.RateLimitServiceClient
	log     *syncBuffer
}

func startXDSRLS(t *testing.T, server string, tlsFiles *XDSTLS) *xdsRLS {
	t.Helper()
	svc := service.New(service.Config{})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	reg := prometheus.NewRegistry()
	r := &xdsRLS{metrics: NewMetrics(reg), log: &syncBuffer{}}
	var err error
	if r.srv, err = NewServer(ServerConfig{Service: svc, Metrics: r.metrics}, nil); err != nil {
		t.Fatal(err)
	}
	g := NewGRPC(r.srv, nil, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(context.Background()) })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	r.client = rlsv3.NewRateLimitServiceClient(cc)

	r.xds, err = NewXDS(XDSConfig{Server: server, NodeID: xdsNode, TLS: tlsFiles, Target: r.srv, Metrics: r.metrics,
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(r.log, nil)),
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.xds.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// call asks ShouldRateLimit for one descriptor key=value of domain, with
// hits as its cost (0 looks without counting).
func (r *xdsRLS) call(t *testing.T, domain, key, value string, hits uint64) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := desc(key + "=" + value)
	d.HitsAddend = wrapperspb.UInt64(hits)
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// limitOf is the requests_per_unit the service applies to key=value of
// domain, looked at without counting; 0 when no limit applies.
func (r *xdsRLS) limitOf(t *testing.T, domain, key, value string) uint32 {
	t.Helper()
	return r.call(t, domain, key, value, 0).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// eventually polls cond until it holds, for at most 15s (a generous
// bound for a loaded machine; it holds within milliseconds here).
func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s: not within 15s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// A configuration pushed by the management server is what the service
// answers by, through its real ShouldRateLimit, each time it changes; a
// withdrawn one leaves no limit. Before the first, the service runs with
// none (Configured is false) and answers OK.
func TestXDSConfigurationPushedChangedAndWithdrawn(t *testing.T) {
	xs := startXDSServer(t, nil)
	r := startXDSRLS(t, xs.addr, nil)
	if r.srv.Ready() == nil {
		t.Fatal("configured before any push")
	}
	if resp := r.call(t, "edge", "client", "a", 1); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("before any configuration: %v, want OK with no limit", resp)
	}

	xs.push(t, "1", limitConfig("edge", "edge", "client", "a", 1, rlconfv3.RateLimitUnit_MINUTE))
	took := eventually(t, "push 1 applied", func() bool { return r.limitOf(t, "edge", "client", "a") == 1 })
	t.Logf("push 1 answered by after %s", took)
	if r.srv.Ready() != nil {
		t.Fatal("not configured after a push with a domain")
	}
	if c := r.call(t, "edge", "client", "a", 1).GetOverallCode(); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call of a limit of 1: %v", c)
	}
	if c := r.call(t, "edge", "client", "a", 1).GetOverallCode(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call of a limit of 1: %v, want OVER_LIMIT", c)
	}

	// Changed: a higher limit on the same descriptor, and a second domain.
	xs.push(t, "2", limitConfig("edge", "edge", "client", "a", 5, rlconfv3.RateLimitUnit_MINUTE),
		limitConfig("api", "api", "user", "", 2, rlconfv3.RateLimitUnit_YEAR))
	took = eventually(t, "push 2 applied", func() bool { return r.limitOf(t, "edge", "client", "a") == 5 })
	t.Logf("push 2 answered by after %s", took)
	if c := r.call(t, "edge", "client", "a", 1).GetOverallCode(); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the limit was raised to 5: %v, want OK", c)
	}
	if got := r.limitOf(t, "api", "user", "anyone"); got != 2 {
		t.Fatalf("the second domain's limit: %d, want 2", got)
	}
	if got := r.srv.Config().Domains(); strings.Join(got, ",") != "api,edge" {
		t.Fatalf("domains %v", got)
	}

	// Withdrawn: an empty state of the world.
	xs.push(t, "3")
	took = eventually(t, "push 3 (nothing) applied", func() bool { return r.srv.Ready() != nil })
	t.Logf("withdrawal answered by after %s", took)
	if resp := r.call(t, "edge", "client", "a", 1); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("after withdrawal: %v, want OK with no limit", resp)
	}
	if v := testutil.ToFloat64(r.metrics.loads.WithLabelValues("success")); v != 3 {
		t.Fatalf("config_loads_total{success} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(r.xds.updates.WithLabelValues("ack")); v != 3 {
		t.Fatalf("xds_updates_total{ack} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(r.xds.connected); v != 1 {
		t.Fatalf("xds_connected = %v, want 1", v)
	}
}

// A push that fails validation is refused (NACK, with the parser's error
// and the version still in use), counted and logged; the previous
// configuration stays in use, and the next good push applies.
func TestXDSBrokenPushIsRefusedAndThePreviousConfigurationKept(t *testing.T) {
	xs := startXDSServer(t, nil)
	r := startXDSRLS(t, xs.addr, nil)
	xs.push(t, "1", limitConfig("edge", "edge", "client", "a", 3, rlconfv3.RateLimitUnit_SECOND))
	eventually(t, "push 1 applied", func() bool { return r.limitOf(t, "edge", "client", "a") == 3 })

	// Broken: the same domain in two resources, and a limit without a unit.
	xs.push(t, "2", limitConfig("one", "edge", "client", "a", 7, rlconfv3.RateLimitUnit_SECOND),
		limitConfig("two", "edge", "client", "b", 7, rlconfv3.RateLimitUnit_UNKNOWN))
	eventually(t, "push 2 refused", func() bool { return len(xs.nacked()) >= 1 })
	nack := xs.nacked()[0]
	if nack.GetVersionInfo() != "1" || !strings.Contains(nack.GetErrorDetail().GetMessage(), `xDS resource "two"`) {
		t.Fatalf("NACK version %q, error %q; want version 1 and the parser's error naming the resource",
			nack.GetVersionInfo(), nack.GetErrorDetail().GetMessage())
	}
	if got := r.limitOf(t, "edge", "client", "a"); got != 3 {
		t.Fatalf("after a refused push the limit is %d, want the previous 3", got)
	}
	if v := testutil.ToFloat64(r.metrics.loads.WithLabelValues("error")); v != 1 {
		t.Fatalf("config_loads_total{error} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(r.metrics.loaded); v != 0 {
		t.Fatalf("config_last_load_success = %v, want 0", v)
	}
	if v := testutil.ToFloat64(r.xds.updates.WithLabelValues("nack")); v != 1 {
		t.Fatalf("xds_updates_total{nack} = %v, want 1", v)
	}
	// The snapshot cache sends a refused version again at once: it is
	// refused again, and counted and logged once.
	eventually(t, "push 2 sent again and refused again", func() bool { return len(xs.nacked()) >= 3 })
	if v := testutil.ToFloat64(r.metrics.loads.WithLabelValues("error")); v != 1 {
		t.Fatalf("config_loads_total{error} = %v after the refused version came back, want 1", v)
	}
	if log := r.log.String(); strings.Count(log, "rls configuration refused over xDS; keeping the previous one") != 1 || !strings.Contains(log, "version=2") {
		t.Fatalf("log %q does not say once that version 2 was refused", log)
	}

	xs.push(t, "3", limitConfig("edge", "edge", "client", "a", 9, rlconfv3.RateLimitUnit_SECOND))
	eventually(t, "push 3 applied", func() bool { return r.limitOf(t, "edge", "client", "a") == 9 })
	if v := testutil.ToFloat64(r.metrics.loaded); v != 1 {
		t.Fatalf("config_last_load_success = %v after a good push, want 1", v)
	}
}

// Over mutual TLS the client verifies the server by the CA and presents
// its certificate; without a certificate the server's CA signed, it gets
// no configuration and keeps trying.
func TestXDSOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, "xds-ca"), newTestCA(t, "other-ca")
	sc, sk := ca.issue(t, "envoy-gateway", x509.ExtKeyUsageServerAuth)
	cert, err := tls.X509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	xs := startXDSServer(t, &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	xs.push(t, "1", limitConfig("edge", "edge", "client", "a", 4, rlconfv3.RateLimitUnit_HOUR))

	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.crt", ca.pem)
	cc, ck := ca.issue(t, "envoy-ratelimit", x509.ExtKeyUsageClientAuth)
	oc, ok := other.issue(t, "stranger", x509.ExtKeyUsageClientAuth)

	good := startXDSRLS(t, xs.addr, &XDSTLS{Cert: write("tls.crt", cc), Key: write("tls.key", ck), CA: caFile})
	eventually(t, "configuration over mTLS", func() bool { return good.limitOf(t, "edge", "client", "a") == 4 })

	stranger := startXDSRLS(t, xs.addr, &XDSTLS{Cert: write("o.crt", oc), Key: write("o.key", ok), CA: caFile})
	eventually(t, "a client of another CA refused", func() bool {
		return strings.Count(stranger.log.String(), "rls xDS stream ended; reconnecting") >= 2
	})
	if stranger.srv.Ready() == nil || testutil.ToFloat64(stranger.xds.connected) != 0 {
		t.Fatal("a client certificate of another CA got the configuration")
	}
	// A server the client's CA did not sign is refused by the client.
	wrongCA := startXDSRLS(t, xs.addr, &XDSTLS{Cert: write("tls2.crt", cc), Key: write("tls2.key", ck), CA: write("other.crt", other.pem)})
	eventually(t, "a server of another CA refused", func() bool {
		return strings.Contains(wrongCA.log.String(), "certificate signed by unknown authority")
	})
	if wrongCA.srv.Ready() == nil {
		t.Fatal("the client trusted a server its CA did not sign")
	}
}

// When the management server goes away, the configuration in use stays;
// the client reconnects (with backoff) once it is back, and applies what
// it then serves.
func TestXDSReconnectsAndKeepsTheConfigurationMeanwhile(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = g.Serve(ln) }()
	snap, _ := cachev3.NewSnapshot("1", map[resourcev3.Type][]cachetypes.Resource{
		resourcev3.RateLimitConfigType: {limitConfig("edge", "edge", "client", "a", 6, rlconfv3.RateLimitUnit_MINUTE)}})
	if err := cache.SetSnapshot(ctx, xdsNode, snap); err != nil {
		t.Fatal(err)
	}
	r := startXDSRLS(t, addr, nil)
	eventually(t, "first server's configuration", func() bool { return r.limitOf(t, "edge", "client", "a") == 6 })

	cancel()
	g.Stop()
	eventually(t, "the stream's end seen", func() bool { return testutil.ToFloat64(r.xds.connected) == 0 })
	if got := r.limitOf(t, "edge", "client", "a"); got != 6 {
		t.Fatalf("with the server gone the limit is %d, want 6 kept", got)
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port of the first server: %v", err)
	}
	xs := serveXDS(t, ln2, nil)
	xs.push(t, "7", limitConfig("edge", "edge", "client", "a", 8, rlconfv3.RateLimitUnit_MINUTE))
	eventually(t, "the restarted server's configuration", func() bool { return r.limitOf(t, "edge", "client", "a") == 8 })
	if !strings.Contains(r.log.String(), "rls xDS stream ended; reconnecting") {
		t.Fatal("the reconnection was not logged")
	}
}
