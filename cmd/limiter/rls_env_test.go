package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/natstest"
)

// egCA is Envoy Gateway's certgen in small: one CA signing every
// component's certificate, each good for servers and clients.
type egCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newEGCA(t *testing.T) *egCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &egCA{cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for names (and 127.0.0.1) as PEM certificate
// and key.
func (ca *egCA) issue(t *testing.T, names ...string) ([]byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func (ca *egCA) tlsConfig(t *testing.T, names ...string) *tls.Config {
	t.Helper()
	c, k := ca.issue(t, names...)
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

// The limiter started as Envoy Gateway starts envoyproxy/ratelimit, with
// its environment (internal/infrastructure/kubernetes/ratelimit/
// resource.go, testdata/deployments/default.yaml) and its certificate
// mount, takes its configuration from an xDS server over mTLS as Envoy
// Gateway's, answers Envoy's ShouldRateLimit over mTLS and /healthcheck.
// The only substitutions: the certificates' directory, the xDS server's
// and Redis's addresses, and port 0 for the listeners (GRPC_PORT, PORT,
// PROMETHEUS_ADDR), so the test runs beside others; plus the SLUICE_*
// variables an operator adds.
func TestEnvoyGatewayDeploymentServesEnvoyAndHealthChecks(t *testing.T) {
	ca := newEGCA(t)
	certs := t.TempDir() // Envoy Gateway mounts secret envoy-rate-limit at /certs
	c, k := ca.issue(t, "envoy-ratelimit", "envoy-ratelimit.envoy-gateway-system.svc")
	for name, data := range map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca.pem} {
		if err := os.WriteFile(filepath.Join(certs, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// Envoy Gateway's rate limit xDS server: mTLS with its own certificate,
	// a snapshot cache keyed by node id.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	xctx, xcancel := context.WithCancel(context.Background())
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(ca.tlsConfig(t, "envoy-gateway"))))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(xctx, cache, nil))
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { xcancel(); g.Stop() })

	nsrv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nsrv.Shutdown) // after the limiter's stop, registered below

	env := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "false", "CONFIG_TYPE": "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL": ln.Addr().String(), // envoy-gateway:18001
		"CONFIG_GRPC_XDS_NODE_ID":    "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS":        "true", "GRPC_SERVER_TLS_CERT": filepath.Join(certs, "tls.crt"),
		"GRPC_SERVER_TLS_KEY": filepath.Join(certs, "tls.key"), "GRPC_SERVER_TLS_CA_CERT": filepath.Join(certs, "ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    filepath.Join(certs, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     filepath.Join(certs, "tls.key"),
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  filepath.Join(certs, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp", "REDIS_URL": "127.0.0.1:6379", // redis.redis.svc:6379
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
		"GRPC_PORT": "0", "PORT": "0", // upstream's defaults 8081 and 8080
		// What the operator adds (EnvoyGateway's rateLimitDeployment.container.env).
		"SLUICE_NATS_URL":     nsrv.ClientURL(),
		"SLUICE_REDIS_PREFIX": "sluicetest-eg-" + strconv.FormatInt(time.Now().UnixNano(), 36),
	}
	for k, v := range env {
		t.Setenv(k, v)
	}

	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() { done <- run(ctx, []string{"envoy-ratelimit"}, pw, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("limiter exited %d: %s", code, stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Error("limiter did not stop within 15s")
		}
	})
	local := func(addr string) string { // [::]:port or 0.0.0.0:port
		_, port, _ := net.SplitHostPort(addr)
		return net.JoinHostPort("127.0.0.1", port)
	}
	var grpcAddr, health, metrics string
	lines := bufio.NewScanner(pr)
	for (grpcAddr == "" || health == "" || metrics == "") && lines.Scan() {
		l := lines.Text()
		if a, ok := strings.CutPrefix(l, "rate limit service (gRPC) listening on "); ok {
			grpcAddr = local(a)
		}
		if a, ok := strings.CutPrefix(l, "rate limit health check on http://"); ok {
			health = "http://" + local(strings.TrimSuffix(a, "/healthcheck")) + "/healthcheck"
		}
		if a, ok := strings.CutPrefix(l, "metrics on http://"); ok {
			metrics = "http://" + strings.TrimSuffix(strings.Fields(a)[0], "/metrics")
		}
	}
	go io.Copy(io.Discard, pr)
	if grpcAddr == "" || health == "" || metrics == "" {
		t.Fatalf("the limiter did not say where it serves (gRPC %q, health %q, metrics %q): %s", grpcAddr, health, metrics, stderr.String())
	}

	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// FORCE_START_WITHOUT_INITIAL_CONFIG: healthy before any policy exists.
	if code, body := get(health); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck before any configuration: %d %q, want 200 OK", code, body)
	}

	// A BackendTrafficPolicy of 2 requests a minute per client on a route,
	// as Envoy Gateway's translator writes it.
	const domain = "default/eg/http"
	snap, err := cachev3.NewSnapshot("1", map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: {
		&rlconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{{
			Key: "httproute/default/backend/rule/0/match/0", Value: "httproute/default/backend/rule/0/match/0",
			Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "rule-0-match-0",
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 2}}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
		t.Fatal(err)
	}

	// Envoy's call, with Envoy's client certificate of the same CA.
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(ca.tlsConfig(t, "envoy"))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	user := "u-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	call := func() (rlsv3.RateLimitResponse_Code, uint32) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		resp, err := client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: "httproute/default/backend/rule/0/match/0", Value: "httproute/default/backend/rule/0/match/0"},
				{Key: "rule-0-match-0", Value: user}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode(), resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, limit := call()
		if limit == 2 {
			if code != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call under the pushed limit: %v", code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pushed policy never applied: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _ := call(); code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("second call of 2 a minute: %v", code)
	}
	if code, _ := call(); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third call of 2 a minute: %v, want OVER_LIMIT", code)
	}
	if code, body := get(health); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck with a configuration: %d %q", code, body)
	}
	if v := scrapeLine(t, metrics+"/metrics", "sluice_rls_xds_connected"); v != "1" {
		t.Fatalf("sluice_rls_xds_connected %s, want 1", v)
	}
	// GRPC_SERVER_TLS_CA_CERT makes Envoy's client certificate required.
	other := newEGCA(t)
	stranger, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.tlsConfig(t, "x").RootCAs, Certificates: other.tlsConfig(t, "stranger").Certificates})))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if _, err := rlsv3.NewRateLimitServiceClient(stranger).ShouldRateLimit(sctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}); err == nil {
		t.Fatal("a client certificate of another CA was served")
	}
}

// Each variable becomes the flag the README's table says, upstream's
// defaults apply where one is unset, a SLUICE_* variable wins over the
// variable it would be translated from, and what cannot be honoured is
// refused.
func TestEnvoyRatelimitEnvironmentTranslation(t *testing.T) {
	translate := func(env map[string]string) ([]string, error) {
		args, _, err := envoyRatelimitArgs(func(k string) string { return env[k] })
		slices.Sort(args)
		return args, err
	}
	got, err := translate(nil)
	want := []string{"--log-level=warn", "--rls-config=/srv/runtime_data/current/config", "--rls-health-listen=0.0.0.0:8080",
		"--rls-listen=0.0.0.0:8081", "--rls-ready-without-domains=true"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("no variables: %v %v, want %v", got, err, want)
	}
	got, err = translate(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "LOG_LEVEL": "TRACE",
		"CONFIG_GRPC_XDS_SERVER_URL": "xds:18001", "CONFIG_GRPC_XDS_NODE_METADATA": "a=b",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/c/ca.crt",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10s", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c/tls.crt",
		"GRPC_SERVER_TLS_KEY": "/c/tls.key", "GRPC_CLIENT_TLS_CACERT": "/c/client-ca.crt", "GRPC_MAX_CONNECTION_AGE": "24h",
		"USE_PROMETHEUS": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
		"REDIS_URL": "r1:6379,r2:6379", "REDIS_TYPE": "cluster", "REDIS_TLS": "true", "REDIS_AUTH": "user:p@ss", "REDIS_SOCKET_TYPE": "tcp",
		"SLUICE_RLS_LISTEN": "127.0.0.1:9000"})
	want = []string{"--log-level=debug", "--metrics-addr=:9090", "--redis-url=rediss+cluster://user:p%40ss@r1:6379?addr=r2%3A6379",
		"--rls-health-listen=0.0.0.0:8080", "--rls-max-connection-age=24h", "--rls-response-headers=true",
		"--rls-tls-cert=/c/tls.crt", "--rls-tls-client-ca=/c/client-ca.crt", "--rls-tls-key=/c/tls.key",
		"--rls-xds-backoff-min=10s", "--rls-xds-node-id=default", "--rls-xds-node-metadata=a=b", "--rls-xds-server=xds:18001",
		"--rls-xds-tls-ca=/c/ca.crt", "--rls-xds-tls=true"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("xDS, TLS, Redis cluster:\n got %v %v\nwant %v", got, err, want)
	}
	// Over xDS without FORCE_START_WITHOUT_INITIAL_CONFIG, health waits
	// for a domain; SLUICE_REDIS_URL replaces upstream's Redis.
	got, err = translate(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "REDIS_URL": "/var/run/r.sock",
		"REDIS_TLS_CLIENT_CERT": "/x.crt", "SLUICE_REDIS_URL": "redis://127.0.0.1:6379"})
	if err != nil || slices.Contains(got, "--rls-ready-without-domains=true") || slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--redis-url") }) {
		t.Fatalf("xDS without FORCE_START...: %v %v", got, err)
	}
	for _, env := range []map[string]string{
		{"CONFIG_TYPE": "GRPC_XDS_DELTA"}, {"GRPC_UDS": "/tmp/rl.sock"}, {"GRPC_CLIENT_TLS_SAN": "envoy"},
		{"GLOBAL_SHADOW_MODE": "true"}, {"MERGE_DOMAIN_CONFIG": "true"}, {"PROMETHEUS_PATH": "/stats"},
		{"REDIS_URL": "r:6379", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL"}, {"REDIS_URL": "/var/run/r.sock"},
		{"REDIS_TLS_CLIENT_CERT": "/x.crt"}, {"USE_PROMETHEUS": "yes please"},
	} {
		if got, err := translate(env); err == nil {
			t.Errorf("%v: %v, want a refusal", env, got)
		}
	}
}

// The README's table names every variable the translation knows.
func TestEnvoyRatelimitVariablesAreDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// Every variable the translation reads, over environments that take
	// each of its branches (files, xDS over TLS, TLS, metrics, Redis).
	read := map[string]bool{}
	for _, env := range []map[string]string{{}, {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
		"GRPC_SERVER_USE_TLS": "true", "USE_PROMETHEUS": "true", "REDIS_URL": "r:6379", "REDIS_SOCKET_TYPE": "tcp"}} {
		if _, _, err := envoyRatelimitArgs(func(k string) string { read[k] = true; return env[k] }); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"RUNTIME_ROOT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "GRPC_SERVER_TLS_CERT", "PROMETHEUS_ADDR", "REDIS_AUTH"} {
		if !read[n] {
			t.Fatalf("the translation did not read %s: a branch was not taken", n)
		}
	}
	for n := range read {
		if strings.HasPrefix(n, envflag.Prefix) {
			continue // Sluice's own, documented with the flags
		}
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("README does not name `%s`", n)
		}
	}
}
