package rls

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/service"
)

// The reloader swaps in a changed, valid configuration; it refuses an
// invalid or unreadable one once per distinct content, with a log line and
// a metric, and keeps the previous one.
func TestReloaderKeepsTheLastGoodConfiguration(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	write := func(text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: one\n")
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	srv, err := NewServer(ServerConfig{Service: svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	r := &Reloader{Path: dir, Server: srv, Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := r.Load(); err != nil {
		t.Fatal(err)
	}
	domains := func() string { return strings.Join(srv.Config().Domains(), ",") }
	if domains() != "one" {
		t.Fatalf("domains %s", domains())
	}
	r.check() // unchanged: nothing happens
	write("domain: two\n")
	r.check()
	if domains() != "two" || !strings.Contains(logs.String(), "rls configuration reloaded") {
		t.Fatalf("after a valid change: %s\n%s", domains(), logs.String())
	}
	write("domain: [three]\n")
	r.check()
	r.check() // the same bad content: refused once
	if domains() != "two" || strings.Count(logs.String(), "rls configuration refused") != 1 ||
		!strings.Contains(logs.String(), "domain must be a string") {
		t.Fatalf("after an invalid change: %s\n%s", domains(), logs.String())
	}
	if v := testutil.ToFloat64(m.loads.WithLabelValues("error")); v != 1 {
		t.Errorf("config_loads_total{result=error} %v", v)
	}
	if v := testutil.ToFloat64(m.loaded); v != 0 {
		t.Errorf("config_last_load_success %v", v)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	r.check()
	if domains() != "two" || !strings.Contains(logs.String(), "rls configuration unreadable") {
		t.Fatalf("after the directory went away: %s\n%s", domains(), logs.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("domain: four\n")
	r.check()
	if domains() != "four" || testutil.ToFloat64(m.loaded) != 1 || testutil.ToFloat64(m.loads.WithLabelValues("success")) != 3 {
		t.Fatalf("back: %s, metrics %v %v", domains(), testutil.ToFloat64(m.loaded), testutil.ToFloat64(m.loads.WithLabelValues("success")))
	}
}

func TestTLSFilesAreChecked(t *testing.T) {
	if (TLSFiles{}).Enabled() {
		t.Error("no files, enabled")
	}
	for _, f := range []TLSFiles{{Cert: "c"}, {Key: "k"}, {ClientCA: "ca"}} {
		if _, err := f.Config(); err == nil || !strings.Contains(err.Error(), "both a certificate and a key") {
			t.Errorf("%+v: %v", f, err)
		}
	}
	if _, err := (TLSFiles{Cert: "missing.pem", Key: "missing-key.pem"}).Config(); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("missing files: %v", err)
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// With a maximum connection age, a client's connection is replaced while
// it keeps calling, and no call fails.
func TestMaxConnectionAgeReplacesConnectionsWithoutFailingCalls(t *testing.T) {
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	conf, err := Parse(File{Name: "c.yaml", Data: []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: svc}, conf)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPC(srv, nil, 200*time.Millisecond)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	go func() { _ = g.Serve(cl) }()
	defer g.Stop(context.Background())
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := rlsv3.NewRateLimitServiceClient(cc)
	deadline := time.Now().Add(10 * time.Second)
	for cl.n.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections in 10s", cl.n.Load())
		}
		if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlv3.RateLimitDescriptor{desc("route=/age")}}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The gRPC health of the service ("" and ServiceName) is SERVING only while
// its configuration has at least one domain, as envoyproxy/ratelimit's
// with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: a configuration of no
// domain answers OK to everything, so it must not look ready.
func TestHealthRequiresADomain(t *testing.T) {
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	empty, err := Parse(File{Name: "empty.yaml", Data: []byte("# nothing yet\n")})
	if err != nil {
		t.Fatal(err)
	}
	one, err := Parse(File{Name: "one.yaml", Data: []byte("domain: one\n")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: svc}, empty)
	if err != nil {
		t.Fatal(err)
	}
	hc := serveHealth(t, srv)
	expectHealth(t, hc, "an empty configuration", healthpb.HealthCheckResponse_NOT_SERVING)
	srv.SetConfig(one)
	expectHealth(t, hc, "a domain loaded", healthpb.HealthCheckResponse_SERVING)
	srv.SetConfig(empty)
	expectHealth(t, hc, "the domain gone again", healthpb.HealthCheckResponse_NOT_SERVING)
	srv.SetConfig(nil)
	expectHealth(t, hc, "no configuration", healthpb.HealthCheckResponse_NOT_SERVING)
}

// serveHealth serves srv over gRPC until the test ends and returns a
// health client of it.
func serveHealth(t *testing.T, srv *Server) healthpb.HealthClient {
	t.Helper()
	g := NewGRPC(srv, nil, 0)
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
	return healthpb.NewHealthClient(cc)
}

// expectHealth checks the status of "" and of ServiceName.
func expectHealth(t *testing.T, hc healthpb.HealthClient, what string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for _, name := range []string{"", ServiceName} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != want {
			t.Fatalf("%s: health of %q %v %v, want %v", what, name, r.GetStatus(), err, want)
		}
	}
}

// A directory's hidden files are skipped, and each one is named: in a log
// line and in sluice_rls_config_skipped_files{path}, until it is gone.
// Kubernetes' own entries of a ConfigMap mount (..data and the directory
// it points to, whose files the visible links lead to) are not reported.
func TestReloaderNamesTheFilesItSkips(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "..2026_11_27_19_00_00.1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "..2026_11_27_19_00_00.1", "a.yaml"), []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..2026_11_27_19_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	write(".limits.yaml", "domain: hidden\n")
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	srv, err := NewServer(ServerConfig{Service: svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	r := &Reloader{Path: dir, Server: srv, Metrics: NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := r.Load(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(srv.Config().Domains(), ","); got != "a" {
		t.Fatalf("domains %s, want a (through the link)", got)
	}
	hidden := filepath.Join(dir, ".limits.yaml")
	if !strings.Contains(logs.String(), "rls configuration skips files") || !strings.Contains(logs.String(), hidden) ||
		strings.Contains(logs.String(), "..data") || strings.Contains(logs.String(), "..2026") {
		t.Fatalf("the log does not name exactly the hidden file:\n%s", logs.String())
	}
	skipped := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_rls_config_skipped_files" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "path" {
						out[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		return out
	}
	if got := skipped(); len(got) != 1 || got[hidden] != 1 {
		t.Fatalf("sluice_rls_config_skipped_files %v, want {%s: 1}", got, hidden)
	}
	if err := os.Remove(hidden); err != nil {
		t.Fatal(err)
	}
	r.check()
	if got := skipped(); len(got) != 0 {
		t.Fatalf("after the hidden file went: %v", got)
	}
}
