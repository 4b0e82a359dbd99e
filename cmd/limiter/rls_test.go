package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The --rls-* flags are refused, before anything starts, where they cannot
// work: each with exit status 2 and a line saying what is missing.
func TestRLSFlagsThatCannotWorkAreRefused(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(conf, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"--rls-listen", "127.0.0.1:0"}, "--rls-listen needs --rls-config"},
		{[]string{"--rls-config", conf}, "need --rls-listen"},
		{[]string{"--rls-tls-cert", "c.pem"}, "need --rls-listen"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-config", conf, "--rls-reload-interval", "0s"}, "--rls-reload-interval 0s: want a positive duration"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-config", conf, "--rls-max-descriptors", "0"}, "--rls-max-descriptors 0: want a positive number"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-config", conf, "--rls-max-entries", "-1"}, "--rls-max-entries -1: want a positive number"},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-config", conf, "--rls-windows", "tumbling"}, `--rls-windows: window "tumbling": want sliding, fixed, calendar`},
		{[]string{"--rls-listen", "127.0.0.1:0", "--rls-config", conf, "--rls-windows", "calendar@Mars/Olympus"}, `--rls-windows: window "calendar@Mars/Olympus": time zone "Mars/Olympus" is not an IANA zone name`},
	}
	for _, tc := range cases {
		code, _, errs := runFor(t, 5*time.Second, append([]string{"serve", "--nats-listen", "127.0.0.1:0"}, tc.args...)...)
		if code != exitError || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errs, tc.msg)
		}
	}
	// Started, but the listener's inputs are bad: exit 1 with what is wrong.
	bad := []struct {
		args []string
		msg  string
	}{
		{[]string{"--rls-config", filepath.Join(t.TempDir(), "missing.yaml")}, "--rls-config: rls config:"},
		{[]string{"--rls-config", conf, "--rls-workspace", "a b"}, "--rls-workspace"},
		{[]string{"--rls-config", conf, "--rls-tls-cert", "nope.pem"}, "both a certificate and a key are required"},
		{[]string{"--rls-config", conf, "--rls-tls-cert", "nope.pem", "--rls-tls-key", "nope-key.pem"}, "nope.pem"},
	}
	for _, tc := range bad {
		code, _, errs := runFor(t, 10*time.Second, append([]string{"serve", "--nats-listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0"}, tc.args...)...)
		if code != 1 || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 1 saying %q", tc.args, code, errs, tc.msg)
		}
	}
}

// With the rate limit service on, /readyz says not ready while its
// configuration has no domain (it would answer OK to everything), and
// ready once a reload brings one; --rls-ready-without-domains opts out.
func TestRLSReadinessRequiresADomain(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(conf, []byte("# no domain yet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readyz := func(extra ...string) string {
		t.Helper()
		pr, pw := io.Pipe()
		t.Cleanup(func() { pr.Close() })
		serveInBackground(t, pw, append([]string{"--nats-listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
			"--rls-listen", "127.0.0.1:0", "--rls-config", dir, "--rls-reload-interval", "50ms"}, extra...)...)
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
				go io.Copy(io.Discard, pr)
				return strings.TrimSuffix(strings.Fields(u)[0], "/metrics") + "/readyz"
			}
		}
		t.Fatal("the limiter never said where its metrics are")
		return ""
	}
	probe := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	url := readyz()
	if code, body := probe(url); code != http.StatusServiceUnavailable || !strings.Contains(body, "no domain") {
		t.Fatalf("/readyz with no domain: %d %q, want 503 saying there is no domain", code, body)
	}
	if err := os.WriteFile(conf, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := probe(url)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after a domain was loaded: %d %q", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	other := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir = other
	if code, body := probe(readyz("--rls-ready-without-domains")); code != http.StatusOK {
		t.Fatalf("/readyz with --rls-ready-without-domains: %d %q", code, body)
	}
}
