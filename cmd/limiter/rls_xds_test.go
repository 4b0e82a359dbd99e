package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// --rls-xds-* flags are refused where they cannot work, before anything
// starts.
func TestRLSXDSFlagsThatCannotWorkAreRefused(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(conf, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--rls-xds-server", "127.0.0.1:1"}, "--rls-xds-server needs --rls-listen"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-xds-server", "127.0.0.1:1", "--rls-config", conf}, "two sources of one configuration"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-xds-server", "127.0.0.1:1", "--rls-xds-node-metadata", "novalue"}, "is not name=value"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-xds-server", "127.0.0.1:1", "--rls-xds-backoff-min", "2s", "--rls-xds-backoff-max", "1s"}, "want 0 < min <= max"},
		{[]string{"--rls-health-listen", "127.0.0.1:0"}, "--rls-health-listen needs --rls-listen"},
	} {
		code, _, errs := runFor(t, 5*time.Second, append([]string{"serve", "--nats-listen", "127.0.0.1:0"}, tc.args...)...)
		if code != exitError || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errs, tc.msg)
		}
	}
}

// Started on an xDS server that never answers, the service serves (OK to
// every call) and /healthcheck says 500 until a configuration with a
// domain arrives; with --rls-ready-without-domains it says OK.
func TestRLSHealthCheckWaitsForADomain(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks gRPC
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	health := func(extra ...string) (int, string) {
		t.Helper()
		pr, pw := io.Pipe()
		t.Cleanup(func() { pr.Close() })
		serveInBackground(t, pw, append([]string{"--nats-listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0",
			"--rls-xds-server", ln.Addr().String(), "--rls-health-listen", "127.0.0.1:0"}, extra...)...)
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			if u, ok := strings.CutPrefix(lines.Text(), "rate limit health check on "); ok {
				go io.Copy(io.Discard, pr)
				resp, err := http.Get(u)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
		}
		t.Fatal("the limiter never said where its health check is")
		return 0, ""
	}
	if code, body := health(); code != http.StatusInternalServerError || !strings.Contains(body, "no domain loaded") {
		t.Fatalf("/healthcheck before any configuration: %d %q, want 500", code, body)
	}
	if code, body := health("--rls-ready-without-domains"); code != http.StatusOK || body != "OK" {
		t.Fatalf("/healthcheck with --rls-ready-without-domains: %d %q, want 200 OK", code, body)
	}
}
