package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
)

// rlsLimiter is a limiter process serving Envoy's rate limit service.
type rlsLimiter struct {
	*process
	addr, metrics string
}

// startRLSLimiter starts a limiter with an embedded NATS server, serving
// the rate limit service from config, with args added.
func startRLSLimiter(t *testing.T, config string, args ...string) *rlsLimiter {
	t.Helper()
	// Every port chosen here, and all three apart: an embedded NATS server
	// on port 0 could be given the port just found free for the rate
	// limit service.
	addrs := distinctFreeAddrs(t, 3)
	l := &rlsLimiter{addr: addrs[0], metrics: addrs[1]}
	args = append([]string{"--nats-listen", addrs[2], "--rls-listen", l.addr, "--rls-config", config,
		"--metrics-addr", l.metrics, "--log-level", "info"}, args...)
	l.process = startProcess(t, "limiter", args...)
	return l
}

// dialRLS connects to a rate limit service and waits until its health
// check says it serves.
func dialRLS(t *testing.T, addr string, creds credentials.TransportCredentials) (rlsv3.RateLimitServiceClient, *grpc.ClientConn) {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rate limit service at %s not serving: %v %v", addr, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return rlsv3.NewRateLimitServiceClient(cc), cc
}

func rlsDesc(kvs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// look is a descriptor with hits_addend 0: it counts nothing.
func look(kvs ...string) *rlv3.RateLimitDescriptor {
	d := rlsDesc(kvs...)
	d.HitsAddend = wrapperspb.UInt64(0)
	return d
}

// Every example configuration of envoyproxy/ratelimit's README, served by a
// limiter process from one directory, matches as the README says.
func TestRLSServesUpstreamExamples(t *testing.T) {
	l := startRLSLimiter(t, "../rls/testdata/readme")
	c, _ := dialRLS(t, l.addr, nil)
	type want struct {
		rpu       uint32
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		none      bool
		unlimited bool
	}
	sec, min, day := rlsv3.RateLimitResponse_RateLimit_SECOND, rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsv3.RateLimitResponse_RateLimit_DAY
	cases := []struct {
		domain string
		d      *rlv3.RateLimitDescriptor
		w      want
	}{
		{"mongo_cps", look("database=users"), want{rpu: 500, unit: sec}},
		{"mongo_cps", look("database=other"), want{none: true}},
		{"messaging", look("message_type=marketing", "to_number=2061111111"), want{rpu: 5, unit: day}},
		{"messaging", look("to_number=2061111111"), want{rpu: 100, unit: day}},
		{"messaging", look("message_type=marketing"), want{none: true}},
		{"edge_proxy_per_ip", look("remote_address=50.0.0.1"), want{rpu: 10, unit: sec}},
		{"edge_proxy_per_ip", look("remote_address=50.0.0.5"), want{rpu: 0, unit: sec}},
		{"example4", look("key=value", "subkey=subvalue"), want{none: true}},
		{"example4_1", look("key=value", "subkey=subvalue"), want{rpu: 300, unit: sec}},
		{"internal", look("ldap=x"), want{unlimited: true}},
		{"internal", look("azure=x"), want{rpu: 100, unit: min}},
		{"example8", look("key1=unspecified_value"), want{rpu: 10, unit: min}},
		{"example8", look("key1=value1"), want{rpu: 20, unit: min}},
		{"example9", look("key1=valueXYZ"), want{rpu: 20, unit: min}},
		{"example9_1", look("path=/api/123/action"), want{rpu: 20, unit: min}},
		{"example9_1", look("path=/api/123/other"), want{none: true}},
		{"example9_2", look("route=/api/v1/resource/123/action"), want{rpu: 20, unit: min}},
		{"example10_wildcard", look("user=alice", "action=readfile", "resource=documents"), want{rpu: 100, unit: min}},
		{"unknown_domain", look("database=users"), want{none: true}},
	}
	for _, tc := range cases {
		r := shouldRateLimit(t, c, tc.domain, tc.d)
		st := r.Statuses[0]
		switch {
		case r.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK:
			t.Errorf("%s %v: %v, want OK (a look)", tc.domain, tc.d.Entries, r)
		case tc.w.none && (st.CurrentLimit != nil || st.LimitRemaining != 0):
			t.Errorf("%s %v: %v, want no limit", tc.domain, tc.d.Entries, st)
		case tc.w.unlimited && (st.CurrentLimit != nil || st.LimitRemaining != 1<<32-1):
			t.Errorf("%s %v: %v, want unlimited", tc.domain, tc.d.Entries, st)
		case !tc.w.none && !tc.w.unlimited && (st.CurrentLimit.GetRequestsPerUnit() != tc.w.rpu || st.CurrentLimit.GetUnit() != tc.w.unit):
			t.Errorf("%s %v: %v, want %d per %s", tc.domain, tc.d.Entries, st, tc.w.rpu, tc.w.unit)
		}
	}
	// Example 6: user-a's limit is in shadow mode: 11 hits of 10 are OK,
	// and counted as shadow; user-b's 20 are enforced.
	r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "example6", HitsAddend: 11,
		Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc("service=auth-service", "user=user-a")}})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Errorf("example 6, user-a over its shadow limit: %v %v", r, err)
	}
	if v := metricValue(t, l.metrics, `sluice_rls_shadow_mode_total{descriptor="service.user_user-a",domain="example6"}`); v != 11 {
		t.Errorf("example 6: shadow_mode_total %v, want 11", v)
	}
	r, err = c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "example6", HitsAddend: 21,
		Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc("service=auth-service", "user=user-b")}})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("example 6, user-b over its limit: %v %v", r, err)
	}
	// Example 7: with both descriptors, only the replacing limit applies.
	r = shouldRateLimit(t, c, "example7", rlsDesc("key_1=value_1", "user=bkthomps"), rlsDesc("key_2=value_2", "user=bkthomps"))
	if r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 10 || r.Statuses[1].LimitRemaining != 9 {
		t.Errorf("example 7: %v", r)
	}
	if r := shouldRateLimit(t, c, "example7", look("key_1=value_1", "user=bkthomps")); r.Statuses[0].LimitRemaining != 5 {
		t.Errorf("example 7: the replaced limit counted: %v", r)
	}
	// Example 3's blacklisted address is over its limit of 0 at once.
	if r := shouldRateLimit(t, c, "edge_proxy_per_ip", rlsDesc("remote_address=50.0.0.5")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("limit 0: %v", r)
	}
}

const rlsSemanticsConfig = `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: route
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: day}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: day
`

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomically, as a config map swaps
		t.Fatal(err)
	}
}

func remaining(r *rlsv3.RateLimitResponse) []string {
	var out []string
	for _, s := range r.Statuses {
		switch {
		case s.CurrentLimit == nil && s.LimitRemaining == 1<<32-1:
			out = append(out, s.Code.String()+"/unlimited")
		case s.CurrentLimit == nil:
			out = append(out, s.Code.String())
		default:
			out = append(out, fmt.Sprintf("%s/%d", s.Code, s.LimitRemaining))
		}
	}
	return append([]string{r.OverallCode.String()}, out...)
}

func expectRLS(t *testing.T, what string, r *rlsv3.RateLimitResponse, want ...string) {
	t.Helper()
	if got := remaining(r); !slices.Equal(got, want) {
		t.Errorf("%s: %v, want %v", what, got, want)
	}
}

// The request and response semantics over a real limiter process: hits 0
// and > 1, all or nothing, per-descriptor overrides, shadow mode,
// unlimited, replaces, statuses in order.
func TestRLSRequestSemanticsOverAProcess(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "shop.yaml")
	writeFile(t, conf, rlsSemanticsConfig)
	l := startRLSLimiter(t, conf)
	c, _ := dialRLS(t, l.addr, nil)
	call := func(hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: ds, HitsAddend: hits})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	expectRLS(t, "hits 3", call(3, rlsDesc("user=ann")), "OK", "OK/2")
	expectRLS(t, "a look", call(0, look("user=ann")), "OK", "OK/2")
	expectRLS(t, "3 more with a route", call(3, rlsDesc("route=/a"), rlsDesc("user=ann")), "OVER_LIMIT", "OK/100", "OVER_LIMIT/2")
	expectRLS(t, "route uncounted", call(0, look("route=/a")), "OK", "OK/100")
	expectRLS(t, "2 more", call(2, rlsDesc("route=/a"), rlsDesc("user=ann"), rlsDesc("nothing=here"), rlsDesc("internal=x")),
		"OK", "OK/98", "OK/0", "OK", "OK/unlimited")
	over := rlsDesc("user=ann")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_DAY}
	expectRLS(t, "override raises the limit of the same cell", call(1, over), "OK", "OK/4")
	expectRLS(t, "shadow within", call(1, rlsDesc("trial=t"), rlsDesc("route=/a")), "OK", "OK/0", "OK/97")
	expectRLS(t, "shadow over", call(1, rlsDesc("trial=t"), rlsDesc("route=/a")), "OK", "OK/0", "OK/96")
	expectRLS(t, "replaced", call(1, rlsDesc("key_1=value_1", "user=bkthomps"), rlsDesc("key_2=value_2", "user=bkthomps")), "OK", "OK", "OK/9")
	expectRLS(t, "the replaced limit untouched", call(0, look("key_1=value_1", "user=bkthomps")), "OK", "OK/5")
}

// metricValue returns the value of the series of name with the labels
// (`name{a="b",...}` as Prometheus prints it) at addr, or -1.
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// A changed configuration is used within the reload interval; an invalid
// one is refused with a log line and a metric, and the previous one stays.
func TestRLSReloadsGoodConfigurationAndRefusesBad(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "a.yaml")
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	l := startRLSLimiter(t, dir, "--rls-reload-interval", "100ms")
	c, _ := dialRLS(t, l.addr, nil)
	limitOf := func() uint32 {
		return shouldRateLimit(t, c, "d", look("k=v")).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	if got := limitOf(); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n")
	waitFor("the new limit", func() bool { return limitOf() == 7 })
	// A second file with a domain the first already has: refused.
	writeFile(t, filepath.Join(dir, "b.yaml"), "domain: d\n")
	waitFor("the refusal logged", func() bool { return strings.Contains(l.stderr.String(), "rls configuration refused") })
	if !strings.Contains(l.stderr.String(), `domain \"d\" is already defined in`) {
		t.Errorf("the log line does not say what is wrong:\n%s", l.stderr.String())
	}
	waitFor("the refusal counted", func() bool {
		return metricValue(t, l.metrics, `sluice_rls_config_loads_total{result="error"}`) == 1 &&
			metricValue(t, l.metrics, "sluice_rls_config_last_load_success") == 0
	})
	if got := limitOf(); got != 7 {
		t.Fatalf("after a refused configuration the limit is %d, want 7 (kept)", got)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), ": not yaml [")
	waitFor("invalid YAML refused", func() bool { return metricValue(t, l.metrics, `sluice_rls_config_loads_total{result="error"}`) == 2 })
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")
	waitFor("a valid configuration again", func() bool { return limitOf() == 9 })
	if v := metricValue(t, l.metrics, "sluice_rls_config_last_load_success"); v != 1 {
		t.Errorf("config_last_load_success %v, want 1", v)
	}
	if v := metricValue(t, l.metrics, `sluice_rls_hits_total{descriptor="k",domain="d"}`); v != 0 {
		t.Errorf("hits_total of looks %v, want 0", v)
	}
	shouldRateLimit(t, c, "d", rlsDesc("k=v"))
	if v := metricValue(t, l.metrics, `sluice_rls_hits_total{descriptor="k",domain="d"}`); v != 1 {
		t.Errorf("hits_total %v, want 1", v)
	}
}

// A limiter that is started on an invalid configuration says why and exits.
func TestRLSRefusesToStartOnAnInvalidConfiguration(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	l := startRLSLimiter(t, conf)
	select {
	case <-l.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the limiter did not exit")
	}
	if !strings.Contains(l.stderr.String(), `invalid rate limit unit \"fortnight\"`) {
		t.Errorf("stderr does not say what is wrong:\n%s", l.stderr.String())
	}
}

// gRPC health checking and server reflection: grpcurl works without proto
// files.
func TestRLSHealthAndReflection(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "c.yaml")
	writeFile(t, conf, "domain: d\n")
	l := startRLSLimiter(t, conf)
	_, cc := dialRLS(t, l.addr, nil)
	r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("overall health: %v %v", r, err)
	}
	stream, err := reflectpb.NewServerReflectionClient(cc).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, "envoy.service.ratelimit.v3.RateLimitService") || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Errorf("reflection lists %v", names)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitService"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("reflection has no descriptor of the service: %v %v", resp, err)
	}
	// On SIGTERM the service stops cleanly, even with a stream open.
	if code := l.stop(t, os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// certs is a CA and certificates it signed, written as PEM files.
type certs struct {
	dir                 string
	ca                  *x509.Certificate
	caKey               *ecdsa.PrivateKey
	caPool              *x509.CertPool
	serverCert, clientC tls.Certificate
}

func newCA(t *testing.T, dir, name string) *certs {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	c := &certs{dir: dir, ca: ca, caKey: key, caPool: x509.NewCertPool()}
	c.caPool.AddCert(ca)
	writePEM(t, filepath.Join(dir, name+"-ca.pem"), "CERTIFICATE", der)
	return c
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue writes a certificate and key signed by the CA for name, and returns
// them loaded.
func (c *certs) issue(t *testing.T, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(c.dir, name+".pem"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(c.dir, name+"-key.pem"), "EC PRIVATE KEY", kb)
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, name+".pem"), filepath.Join(c.dir, name+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Over TLS with client certificates: a client with a certificate of the
// configured CA is served; one without a certificate, with one of another
// CA, or without TLS is refused.
func TestRLSTLSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "trusted")
	ca.issue(t, "server", x509.ExtKeyUsageServerAuth)
	good := ca.issue(t, "envoy", x509.ExtKeyUsageClientAuth)
	other := newCA(t, dir, "other")
	bad := other.issue(t, "intruder", x509.ExtKeyUsageClientAuth)
	conf := filepath.Join(dir, "c.yaml")
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	l := startRLSLimiter(t, conf, "--rls-tls-cert", filepath.Join(dir, "server.pem"), "--rls-tls-key", filepath.Join(dir, "server-key.pem"),
		"--rls-tls-client-ca", filepath.Join(dir, "trusted-ca.pem"))
	c, _ := dialRLS(t, l.addr, credentials.NewTLS(&tls.Config{RootCAs: ca.caPool, Certificates: []tls.Certificate{good}}))
	if r := shouldRateLimit(t, c, "d", rlsDesc("k=v")); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("over mTLS: %v", r)
	}
	refused := func(what string, creds credentials.TransportCredentials) {
		t.Helper()
		cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc("k=v")}})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the connection refused (Unavailable)", what, err)
		}
	}
	refused("no client certificate", credentials.NewTLS(&tls.Config{RootCAs: ca.caPool}))
	refused("a certificate of another CA", credentials.NewTLS(&tls.Config{RootCAs: ca.caPool, Certificates: []tls.Certificate{bad}}))
	refused("plaintext", insecure.NewCredentials())
	if r := shouldRateLimit(t, c, "d", look("k=v")); r.Statuses[0].LimitRemaining != 4 {
		t.Errorf("the refused calls counted: %v", r)
	}
}

const rlsBurstConfig = "domain: burst\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: %d}\n"

// Three limiters on one Redis serving the rate limit service: a burst of
// three times the limit on one descriptor, from 64 callers spread over the
// three, admits exactly the limit.
func TestRLSThreeLimitersOnOneRedisAdmitExactlyTheLimit(t *testing.T) {
	redisURL, prefix := redistest.SharedURL(t), redistest.Prefix(t)
	const limit = 300
	conf := filepath.Join(t.TempDir(), "burst.yaml")
	writeFile(t, conf, fmt.Sprintf(rlsBurstConfig, limit))
	var clients []rlsv3.RateLimitServiceClient
	for range 3 {
		l := startRLSLimiter(t, conf, "--redis-url", redisURL, "--redis-prefix", prefix, "--log-level", "warn")
		c, _ := dialRLS(t, l.addr, nil)
		clients = append(clients, c)
	}
	waitOutDayBoundary(t)
	for round, id := range []string{"cold", "warm"} {
		if round == 1 { // warm: every limiter has seen the cell
			for _, c := range clients {
				shouldRateLimit(t, c, "burst", look("user="+id))
			}
		}
		var ok, over, failed atomic.Int64
		var next atomic.Int64
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				c := clients[g%3]
				for next.Add(1) <= 3*limit {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "burst", Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc("user=" + id)}})
					cancel()
					switch {
					case err != nil:
						failed.Add(1)
					case r.OverallCode == rlsv3.RateLimitResponse_OK:
						ok.Add(1)
					default:
						over.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if ok.Load() != limit || failed.Load() != 0 {
			t.Errorf("%s burst of %d over three limiters: %d admitted, %d over, %d failed; want exactly %d admitted",
				id, 3*limit, ok.Load(), over.Load(), failed.Load(), limit)
		}
	}
}

// waitOutDayBoundary sleeps past midnight UTC if it is less than a minute
// away, so a burst of day-long windows stays in one window.
func waitOutDayBoundary(t *testing.T) {
	now := time.Now().UTC()
	next := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	if left := next.Sub(now); left < time.Minute {
		time.Sleep(left + time.Second)
	}
}

// Envoy waits 20 ms by default. Under load from 64 callers (16 under the
// race detector), and with Redis
// answering 100 ms late, every call still answers within its 20 ms
// deadline: the limiter decides by three quarters of the caller's time.
func TestRLSAnswersWithinEnvoysDeadline(t *testing.T) {
	proxy, err := tcpproxy.Start(strings.TrimPrefix(redistest.SharedURL(t), "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	conf := filepath.Join(t.TempDir(), "d.yaml")
	writeFile(t, conf, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n")
	l := startRLSLimiter(t, conf, "--redis-url", "redis://"+proxy.Addr(), "--redis-prefix", redistest.Prefix(t), "--log-level", "warn")
	c, _ := dialRLS(t, l.addr, nil)
	// 64 callers, as Envoy's workers might be; under the race detector the
	// instrumented client could not send them in time itself, so 16.
	callers := 64
	if raceDetector {
		callers = 16
	}
	run := func(what string, calls int, measured bool) {
		t.Helper()
		var next, late, failed atomic.Int64
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		for g := range callers {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(calls); i = next.Add(1) {
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					// Distinct identifiers: every call is a cold cell that must ask Redis.
					_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
						Descriptors: []*rlv3.RateLimitDescriptor{rlsDesc(fmt.Sprintf("user=%s-%d-%d", what, g, i))}})
					cancel()
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
					switch {
					case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
						late.Add(1)
					case err != nil:
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if !measured {
			return
		}
		slices.Sort(lat)
		t.Logf("%s: p50 %v p99 %v p99.9 %v max %v", what, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)*999/1000], lat[len(lat)-1])
		// The machine is shared with other work, and every cold call
		// waits on Redis up to half its deadline: allow scheduling hiccups
		// in three calls of a hundred (a limiter that waited on Redis past
		// the deadline would miss it in every cold call).
		if late.Load() > int64(calls)*3/100 || failed.Load() != 0 {
			t.Errorf("%s: %d of %d calls missed the 20ms deadline, %d failed", what, late.Load(), calls, failed.Load())
		}
	}
	// Warm first, as Envoy's steady state is: the gRPC connection and
	// Redis's connection pool (64 connections dialled through the proxy).
	run("warm-up", 1000, false)
	run("fast", 4000, true)
	proxy.SetDelay(100 * time.Millisecond)
	run("slow-warm-up", 500, false)
	run("slow", 2000, true)
}

// Three regions serving the rate limit service: a descriptor exhausted
// through one region's rate limit service is denied by the others' within
// the cross-region convergence target (250 ms), as the NATS checks are.
func TestRLSBurstInOneRegionIsDeniedElsewhereWithin250ms(t *testing.T) {
	const limit = 50
	conf := filepath.Join(t.TempDir(), "global.yaml")
	writeFile(t, conf, fmt.Sprintf("domain: global\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", limit))
	sc, err := natstest.StartSuperclusterWith(testContext(t), natstest.SuperclusterOptions{Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	w := &world{t: t, sc: sc, dsn: mysqltest.Database(t), redis: redistest.SharedURL(t),
		prefixes: map[string]string{}, bridges: map[string]*process{}, limiters: map[string][]*process{},
		clients: map[string]*bus.Client{}, conns: map[string]*nats.Conn{}}
	rlsClients := map[string]rlsv3.RateLimitServiceClient{}
	for _, r := range regions {
		w.prefixes[r] = redistest.Prefix(t)
		w.bridges[r] = w.startBridge(r, w.dsn)
	}
	for _, r := range regions {
		w.conns[r] = connect(t, sc.ClientURL(r))
		waitService(t, w.conns[r], link.BridgeService, 1)
		addr := freeAddr(t)
		w.limiters[r] = append(w.limiters[r], startProcess(t, "limiter", "--nats-url", sc.ClientURL(r), "--region", r,
			"--redis-url", w.redis, "--redis-prefix", w.prefixes[r], "--log-level", "warn", "--rls-listen", addr, "--rls-config", conf))
		w.clients[r] = bus.NewClient(w.conns[r])
		rlsClients[r], _ = dialRLS(t, addr, nil)
	}
	for _, r := range regions {
		waitService(t, w.conns[r], "ratelimit", len(regions)*instancesPerLimiter)
	}
	w.warmUp()
	over := func(region, id string) bool {
		return shouldRateLimit(t, rlsClients[region], "global", rlsDesc("user="+id)).OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for round, src := range regions {
		id := fmt.Sprint("rls-burst-", round)
		admitted := 0
		for !over(src, id) {
			if admitted++; admitted > limit {
				t.Fatalf("%s admitted %d of a limit of %d", src, admitted, limit)
			}
		}
		for _, dst := range regions {
			if dst == src {
				continue
			}
			start, own := time.Now(), 0
			for !over(dst, id) {
				if own++; 2*own >= limit || time.Since(start) > 2*time.Second {
					t.Fatalf("burst in %s: %s admitted %d more over %v", src, dst, own, time.Since(start))
				}
				time.Sleep(10 * time.Millisecond)
			}
			took := time.Since(start)
			t.Logf("burst in %s, denied in %s after %v", src, dst, took)
			if took > 250*time.Millisecond {
				t.Errorf("burst in %s: %s denied after %v, want within 250ms", src, dst, took)
			}
		}
	}
}
