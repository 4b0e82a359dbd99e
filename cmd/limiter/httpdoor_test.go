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

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The --http-* flags are refused where they cannot work: before anything
// starts (exit 2), or when the token file or certificates cannot be used
// (exit 1); each with a line saying what is wrong.
func TestHTTPFlagsThatCannotWorkAreRefused(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	spaced := filepath.Join(dir, "spaced")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spaced, []byte("two tokens\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--http-admin-token-file", empty}, exitError, "need --http-listen"},
		{[]string{"--http-tls-cert", "c.pem", "--http-tls-key", "k.pem"}, exitError, "need --http-listen"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-tls-client-ca", "ca.pem"}, exitError, "need both --http-tls-cert and --http-tls-key"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-tls-cert", "c.pem"}, exitError, "need both --http-tls-cert and --http-tls-key"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-admin-token-file", filepath.Join(dir, "missing")}, 1, "--http-admin-token-file"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-admin-token-file", empty}, 1, "want one token"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-admin-token-file", spaced}, 1, "want one token"},
		{[]string{"--http-listen", "127.0.0.1:0", "--http-tls-cert", "nope.pem", "--http-tls-key", "nope-key.pem"}, 1, "nope.pem"},
	} {
		code, _, errs := runFor(t, 10*time.Second, append([]string{"serve", "--nats-listen", "127.0.0.1:0"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want %d saying %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
}

// serveHTTPDoor runs "limiter serve args..." until the test ends and
// returns the HTTP door's URL as its standard output says it, without the
// trailing path ("http://127.0.0.1:port").
func serveHTTPDoor(t *testing.T, args ...string) string {
	t.Helper()
	base, _ := serveHTTPDoorAndMetrics(t, args...)
	return base
}

// serveHTTPDoorAndMetrics is serveHTTPDoor that also returns the metrics
// page's URL when args hold --metrics-addr.
func serveHTTPDoorAndMetrics(t *testing.T, args ...string) (base, metrics string) {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	serveInBackground(t, pw, args...)
	lines := bufio.NewScanner(pr)
	wantMetrics := slices.Contains(args, "--metrics-addr")
	for (base == "" || wantMetrics && metrics == "") && lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "HTTP door listening on "); ok {
			base = strings.TrimSuffix(u, "/ratelimit/")
		}
		if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			metrics = strings.Fields(u)[0]
		}
	}
	go io.Copy(io.Discard, pr)
	if base == "" || wantMetrics && metrics == "" {
		t.Fatalf("the limiter never said where its HTTP door (%q) and metrics (%q) are", base, metrics)
	}
	return base, metrics
}

// post sends body to url as curl -H 'Content-Type: application/json' -d
// does (with the headers in hdr, name and value pairs), and returns the
// status and body.
func post(t *testing.T, c *http.Client, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// A limiter started with --http-listen answers the README's curl requests:
// checks until the limit and a denial, a batch, a checks message, and the
// admin operations with the token of --http-admin-token-file (401 without
// it); its decisions count in the limiter's metrics.
func TestLimiterServesTheHTTPDoor(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, metrics := serveHTTPDoorAndMetrics(t, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--http-admin-token-file", token, "--metrics-addr", "127.0.0.1:0")
	c := &http.Client{}
	check := `{"identifier":"user_42","limit":3,"duration":60000}`
	for i, want := range []string{`"success":true,"limit":3,"remaining":2`, `"remaining":1`, `"remaining":0`, `"success":false`} {
		if code, body := post(t, c, base+"/ratelimit/check/acme/api", check); code != 200 || !strings.Contains(body, want) {
			t.Fatalf("check %d: %d %s, want 200 with %s", i, code, body, want)
		}
	}
	if code, body := post(t, c, base+"/ratelimit/batch/acme", `{"checks":[
		{"namespace":"api","identifier":"user_7","limit":10,"duration":60000,"cost":4},
		{"namespace":"web","identifier":"user_7","limit":5,"duration":60000,"cost":3}]}`); code != 200 || !strings.HasPrefix(body, `{"success":true,"results":[`) {
		t.Fatalf("batch: %d %s", code, body)
	}
	if code, body := post(t, c, base+"/ratelimit/checks/acme", `{"checks":[
		{"namespace":"api","identifier":"user_8","limit":1,"duration":60000},
		{"namespace":"api","identifier":"user_8","limit":1,"duration":60000}]}`); code != 200 ||
		!strings.Contains(body, `[{"success":true`) || !strings.Contains(body, `},{"success":false`) {
		t.Fatalf("checks: %d %s", code, body)
	}
	set := `{"namespace":"api","identifier":"user_42","limit":100,"duration":60000}`
	if code, body := post(t, c, base+"/ratelimit/admin/acme/override/set", set); code != 401 {
		t.Fatalf("override set without the token: %d %s, want 401", code, body)
	}
	if code, body := post(t, c, base+"/ratelimit/admin/acme/override/set", set, "Authorization", "Bearer s3cret"); code != 200 || body != `{"namespace":"api","identifier":"user_42","limit":100,"duration":60000,"shadow":false}` {
		t.Fatalf("override set: %d %s", code, body)
	}
	if code, body := post(t, c, base+"/ratelimit/check/acme/api", check); code != 200 || !strings.Contains(body, `"limit":100,"remaining":96`) {
		t.Fatalf("check under the override: %d %s", code, body)
	}
	if code, body := post(t, c, base+"/ratelimit/admin/acme/reset", `{"namespace":"api","identifier":"user_42"}`, "Authorization", "Bearer s3cret"); code != 200 || !strings.Contains(body, `"identifier":"user_42"`) {
		t.Fatalf("reset: %d %s", code, body)
	}
	if code, body := post(t, c, base+"/ratelimit/check/acme/api", check); code != 200 || !strings.Contains(body, `"remaining":99`) {
		t.Fatalf("check after the reset: %d %s", code, body)
	}
	if code, _ := post(t, c, base+"/ratelimit/check/acme/api", `{"limit":1}`); code != 400 {
		t.Fatalf("a bad check: %d, want 400", code)
	}
	// Admitted: 3 + 2 single checks, the batch (one decision) and the
	// checks message's first; denied: a single check and the message's second.
	for series, want := range map[string]string{`sluice_decisions_total{outcome="admitted"}`: "7",
		`sluice_decisions_total{outcome="denied"}`: "2", `sluice_check_errors_total{code="400"}`: "1"} {
		if v := scrapeLine(t, metrics, series); v != want {
			t.Errorf("%s = %s, want %s", series, v, want)
		}
	}
}

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, both signed by the CA, into dir, and returns their paths
// and the client's key pair and the CA pool.
func testPKI(t *testing.T, dir string) (caFile, certFile, keyFile string, client tls.Certificate, roots *x509.CertPool) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(ca)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := issue(2, "limiter", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	cliDER, cliKey := issue(3, "operator", x509.ExtKeyUsageClientAuth)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", srvKeyDER),
		tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey}, roots
}

// Over TLS with --http-tls-client-ca, checks need no client certificate,
// and a certificate the CA signed admits a request to the admin paths
// without a token; the door speaks HTTP/1.1 to a client that offers h2.
func TestHTTPDoorOverTLSAdmitsAdminByClientCertificate(t *testing.T) {
	ca, cert, key, clientCert, roots := testPKI(t, t.TempDir())
	base := serveHTTPDoor(t, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--http-tls-cert", cert, "--http-tls-key", key, "--http-tls-client-ca", ca)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("door at %s, want https", base)
	}
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	operator := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}}}}
	check := `{"identifier":"u","limit":5,"duration":60000}`
	resp, err := anonymous.Post(base+"/ratelimit/check/acme/api", "application/json", strings.NewReader(check))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" || !strings.Contains(string(b), `"success":true`) {
		t.Fatalf("a check without a client certificate: %s %d %s", resp.Proto, resp.StatusCode, b)
	}
	list := `{"namespace":"api"}`
	if code, body := post(t, anonymous, base+"/ratelimit/admin/acme/override/list", list); code != 403 {
		t.Fatalf("override list without a client certificate: %d %s, want 403", code, body)
	}
	if code, body := post(t, operator, base+"/ratelimit/admin/acme/override/list", list); code != 200 || body != `{"overrides":[]}` {
		t.Fatalf("override list with a client certificate: %d %s", code, body)
	}
	if code, body := post(t, operator, base+"/ratelimit/check/acme/api", check); code != 200 || !strings.Contains(body, `"remaining":3`) {
		t.Fatalf("a check with a client certificate: %d %s", code, body)
	}
}

// Stopping a limiter while many clients check over HTTP loses no count and
// no decision. Each check names a fresh identifier, so each waits on Redis
// and many are in flight when the stop begins. Once the limiter has exited
// 0, a second limiter on the same Redis looks at every identifier: those
// whose clients were told "admitted" are counted, and those whose clients
// got a 503 or no answer at all (the listener had closed) are not.
func TestHTTPDoorStopUnderLoadLosesNothing(t *testing.T) {
	// A day's window; a run that would begin in the day's last minute waits
	// for the next day, so no window turns during it.
	const day = 86_400_000
	if left := day - time.Now().UnixMilli()%day; left < 60_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	redisURL, prefix := redistest.SharedURL(t), redistest.Prefix(t)
	args := []string{"serve", "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--redis-url", redisURL, "--redis-prefix", prefix}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	defer pr.Close()
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, args, pw, io.Discard) }()
	lines := bufio.NewScanner(pr)
	base := ""
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "HTTP door listening on "); ok {
			base = strings.TrimSuffix(u, "/ratelimit/")
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if base == "" {
		t.Fatal("the limiter never said where its HTTP door listens")
	}

	const limit = 10
	// What each client was told of each identifier it checked once.
	const (
		toldAdmitted = iota
		toldDenied
		told503
		noAnswer
	)
	const clients = 16
	var told [clients]map[string]int
	var decided atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range clients {
		told[g] = map[string]int{}
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("g%d-%d", g, i)
				resp, err := client.Post(base+"/ratelimit/check/acme/api", "application/json",
					strings.NewReader(fmt.Sprintf(`{"identifier":%q,"limit":%d,"duration":%d}`, id, limit, day)))
				if err != nil {
					told[g][id] = noAnswer
					time.Sleep(time.Millisecond)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 503 {
					told[g][id] = told503
					continue
				}
				r, err := wire.DecodeCheckResponse(wire.JSON, b)
				if resp.StatusCode != 200 || err != nil {
					t.Errorf("%d %s", resp.StatusCode, b)
					continue
				}
				decided.Add(1)
				told[g][id] = toldDenied
				if r.Success {
					told[g][id] = toldAdmitted
				}
			}
		})
	}
	for decided.Load() < 500 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Fatalf("the limiter exited %d, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the limiter did not stop within 15s")
	}
	close(stop)
	wg.Wait()

	// Look at every identifier through a second limiter, in checks
	// messages of up to 1,000 looks. It only reads: a read timeout long
	// enough that a loaded machine's Redis answers every look (at the
	// default, a look Redis answers late is answered from the reader's own
	// empty cells).
	base = serveHTTPDoor(t, append(args[1:], "--read-timeout", "10s")...)
	c := &http.Client{}
	var ids []string
	var want []int
	counts := map[int]int{}
	for g := range clients {
		for id, what := range told[g] {
			ids = append(ids, id)
			want = append(want, what)
			counts[what]++
		}
	}
	for lo := 0; lo < len(ids); lo += wire.MaxChecks {
		hi := min(lo+wire.MaxChecks, len(ids))
		var b strings.Builder
		b.WriteString(`{"checks":[`)
		for i, id := range ids[lo:hi] {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"namespace":"api","identifier":%q,"limit":%d,"duration":%d,"cost":0}`, id, limit, day)
		}
		b.WriteString(`]}`)
		code, body := post(t, c, base+"/ratelimit/checks/acme", b.String())
		r, err := wire.DecodeChecksResponse(wire.JSON, []byte(body))
		if code != 200 || err != nil || len(r.Results) != hi-lo {
			t.Fatalf("looks: %d %.200s (%v)", code, body, err)
		}
		for i, res := range r.Results {
			counted := res.Remaining == limit-1
			if res.Error != "" || !counted && res.Remaining != limit {
				t.Fatalf("look at %s: %+v", ids[lo+i], res)
			}
			if what := want[lo+i]; counted != (what == toldAdmitted) {
				t.Errorf("%s: counted in Redis %v, but its client was told %d (0 admitted, 2 503, 3 no answer)", ids[lo+i], counted, what)
			}
		}
	}
	t.Logf("%d admitted, %d answered 503, %d not answered (the listener had closed)", counts[toldAdmitted], counts[told503], counts[noAnswer])
}
