package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/internal/natstest"
)

// serveInBackground runs "limiter serve args..." until the test ends,
// writing its standard output to stdout.
func serveInBackground(t *testing.T, stdout io.Writer, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve"}, args...), stdout, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("limiter did not stop within 15s")
		}
	})
}

// waitServing waits until a limiter answers discovery pings on url,
// connecting with opts.
func waitServing(t *testing.T, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := nc.Request("$SRV.PING.ratelimit", nil, 200*time.Millisecond); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("limiter never answered $SRV.PING.ratelimit")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCheckExitStatusSaysAdmittedDeniedOrError(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, "--nats-url", url)
	waitServing(t, url)

	check := func(extra ...string) (int, string, string) {
		var out, errb bytes.Buffer
		args := append([]string{"check", "--nats-url", url, "--workspace", "acme", "--namespace", "api",
			"--identifier", "cli-user", "--duration", "1m"}, extra...)
		code := run(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, _ := check("--limit", "1")
	var resp map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &resp) != nil || resp["success"] != true || resp["remaining"] != 0.0 {
		t.Fatalf("first check: exit %d, output %q; want 0 and an admitted JSON reply", code, out)
	}
	code, out, _ = check("--limit", "1", "--json")
	if code != 1 || !strings.Contains(out, `"success":false`) || !strings.Contains(out, `"retry_after":`) {
		t.Fatalf("second check: exit %d, output %q; want 1 and a denial", code, out)
	}
	code, _, errs := check("--limit", "1", "--duration", "10")
	if code != 2 || !strings.Contains(errs, "duration must be between 1000 and 31622400000") {
		t.Fatalf("bad duration: exit %d, stderr %q; want 2 and the service's message", code, errs)
	}
	code, _, errs = check()
	if code != 2 || !strings.Contains(errs, "required") {
		t.Fatalf("missing --limit: exit %d, stderr %q", code, errs)
	}
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"check", "--nats-url", "nats://127.0.0.1:1", "--workspace", "a",
		"--namespace", "b", "--identifier", "c", "--limit", "1"}, io.Discard, &errb); code != 2 {
		t.Fatalf("unreachable NATS: exit %d (%s), want 2", code, errb.String())
	}
}

func TestEnvironmentFillsFlags(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	t.Setenv("SLUICE_NATS_URL", srv.ClientURL())
	t.Setenv("SLUICE_SUBJECT_PREFIX", "rl")
	serveInBackground(t, io.Discard)
	waitServing(t, srv.ClientURL())
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("rl.check.acme.api", []byte(`{"identifier":"u","limit":1,"duration":60000}`), time.Second); err != nil {
		t.Fatalf("limiter configured by SLUICE_SUBJECT_PREFIX=rl does not answer rl.check: %v", err)
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"check", "--workspace", "acme", "--namespace", "api",
		"--identifier", "u", "--limit", "1"}, &out, io.Discard); code != 1 {
		t.Fatalf("check via SLUICE_NATS_URL and SLUICE_SUBJECT_PREFIX: exit %d, output %q; want a denial (1)", code, out.String())
	}
}

func TestEmbeddedServerSaysWhereItListens(t *testing.T) {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	serveInBackground(t, pw, "--nats-listen", "127.0.0.1:0")
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "embedded NATS server listening on ")
	if !ok {
		t.Fatalf("first line %q does not say where the embedded server listens", line)
	}
	go io.Copy(io.Discard, pr)
	waitServing(t, url)
}

func TestBusyPortIsOneClearLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"--nats-listen", ln.Addr().String()}, io.Discard, &stderr)
	msg := strings.TrimSpace(stderr.String())
	if code == 0 || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "address already in use") || strings.Contains(msg, "goroutine") {
		t.Fatalf("busy port: exit %d, stderr %q; want one line saying the address is in use", code, msg)
	}
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--log-level", "loud"},
		{"--subject-prefix", "bad prefix"},
		{"--no-such-flag"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), append(args, "--nats-listen", "127.0.0.1:0"), io.Discard, &stderr); code == 0 {
			t.Fatalf("%v: exit 0, want an error (stderr %q)", args, stderr.String())
		}
	}
}

// scrapeLine reads a metrics page and returns the value of the first line
// starting with prefix.
func scrapeLine(t *testing.T, url, prefix string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %q in %s", prefix, url)
	return ""
}

func TestMetricsAndProbesMove(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	serveInBackground(t, pw, "--nats-url", srv.ClientURL(), "--metrics-addr", "127.0.0.1:0",
		"--redis-url", "redis://127.0.0.1:6379", "--redis-prefix", "sluicetest-metrics-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	lines := bufio.NewScanner(pr)
	var base string
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			base = strings.TrimSuffix(strings.Fields(u)[0], "/metrics")
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if base == "" {
		t.Fatal("the limiter never said where its metrics are")
	}
	waitServing(t, srv.ClientURL())
	for _, probe := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(base + probe)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", probe, resp, err)
		}
		resp.Body.Close()
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 3 {
		if _, err := nc.Request("ratelimit.check.acme.api", []byte(`{"identifier":"m","limit":2,"duration":60000}`), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.Request("ratelimit.check.acme.api", []byte(`{"limit":2}`), time.Second); err != nil {
		t.Fatal(err)
	}
	// Shadow mode: two checks over the limit, answered success.
	for range 3 {
		if _, err := nc.Request("ratelimit.check.acme.web", []byte(`{"identifier":"s","limit":1,"duration":60000,"shadow":true}`), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	m := base + "/metrics"
	if v := scrapeLine(t, m, `sluice_shadow_denied_total{namespace="web",workspace="acme"}`); v != "2" {
		t.Fatalf("shadow denials = %s, want 2", v)
	}
	if v := scrapeLine(t, m, `sluice_policy_stale`); v != "0" {
		t.Fatalf("policy_stale = %s with no bridge, want 0", v)
	}
	if v := scrapeLine(t, m, `sluice_policy_overrides`); v != "0" {
		t.Fatalf("policy_overrides = %s, want 0", v)
	}
	if v := scrapeLine(t, m, `sluice_decisions_total{outcome="admitted"}`); v != "5" {
		t.Fatalf("admitted = %s, want 5 (2, and 3 shadow checks: their replies say success)", v)
	}
	if v := scrapeLine(t, m, `sluice_decisions_total{outcome="denied"}`); v != "1" {
		t.Fatalf("denied = %s, want 1", v)
	}
	for series, want := range map[string]string{
		`namespace="api",outcome="admitted",workspace="acme"`:      "2",
		`namespace="api",outcome="denied",workspace="acme"`:        "1",
		`namespace="web",outcome="admitted",workspace="acme"`:      "1",
		`namespace="web",outcome="shadow_denied",workspace="acme"`: "2",
	} {
		if v := scrapeLine(t, m, `sluice_namespace_decisions_total{`+series+`}`); v != want {
			t.Fatalf("namespace decisions {%s} = %s, want %s", series, v, want)
		}
	}
	if v := scrapeLine(t, m, `sluice_check_errors_total{code="400"}`); v != "1" {
		t.Fatalf("400s = %s, want 1", v)
	}
	if v := scrapeLine(t, m, `sluice_origin_syncs_total`); v == "0" {
		t.Fatal("no origin calls counted for a cold identifier")
	}
	if v := scrapeLine(t, m, `sluice_origin_requests_total`); v == "0" {
		t.Fatal("no checks decided by the origin counted for a limit of 2")
	}
	for _, call := range []string{"read", "apply"} {
		if v := scrapeLine(t, m, `sluice_origin_breaker_state{call="`+call+`"}`); v != "0" {
			t.Fatalf("%s breaker state %s, want 0 (closed)", call, v)
		}
	}
	scrapeLine(t, m, `sluice_check_duration_seconds_count`)
}

// --instances 2 serves two micro instances sharing one cell table: both
// answer, and together they admit exactly the limit.
func TestInstancesShareOneCellTable(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	serveInBackground(t, io.Discard, "--nats-url", srv.ClientURL(), "--instances", "2")
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inbox := nats.NewInbox()
		sub, _ := nc.SubscribeSync(inbox)
		_ = nc.PublishRequest("$SRV.PING.ratelimit", inbox, nil)
		n := 0
		for {
			if _, err := sub.NextMsg(200 * time.Millisecond); err != nil {
				break
			}
			n++
		}
		_ = sub.Unsubscribe()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d instances answer, want 2", n)
		}
	}
	admitted := 0
	for range 200 {
		reply, err := nc.Request("ratelimit.check.acme.api", []byte(`{"identifier":"shared","limit":50,"duration":60000}`), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(reply.Data), `"success":true`) {
			admitted++
		}
	}
	if admitted != 50 {
		t.Fatalf("two instances admitted %d, want exactly the limit 50", admitted)
	}
}
