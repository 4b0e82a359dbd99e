package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"

	"github.com/sluicehq/sluice/internal/natstest"
)

const (
	natsToken     = "nats-t0ken-s3cret"
	mysqlPassword = "mysql-pw-s3cret"
	redisPassword = "redis-pw-s3cret"
)

// startTokenServer runs an embedded nats-server that admits only natsToken
// for the test and returns its address (host:port).
func startTokenServer(t *testing.T) string {
	t.Helper()
	return natstest.StartSecuredServer(t, &server.Options{Authorization: natsToken}).Addr().String()
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A bridge given a NATS token in its URL and a MySQL password in its DSN
// (MySQL unreachable, so it logs and reports why) prints neither in its
// logs, its standard output, /readyz or /metrics.
func TestBridgeShowsNoSecret(t *testing.T) {
	addr := startTokenServer(t)
	dsn := "sluice:" + mysqlPassword + "@tcp(" + closedAddr(t) + ")/sluice?timeout=1s"
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", "nats://" + natsToken + "@" + addr, "--region", "us", "--metrics-addr", "127.0.0.1:0",
			"--mysql-dsn", dsn, "--redis-url", "redis://:" + redisPassword + "@" + closedAddr(t), "--log-level", "debug",
			"--shutdown-timeout", "2s"}, pw, &stderr)
		pw.Close()
	}()
	var stdout syncBuffer
	lines := bufio.NewScanner(pr)
	var base string
	for base == "" && lines.Scan() {
		_, _ = stdout.Write([]byte(lines.Text() + "\n"))
		if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			base = strings.TrimSuffix(strings.Fields(u)[0], "/metrics")
		}
	}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&stdout, pr); close(copied) }()
	if base == "" {
		cancel()
		t.Fatalf("the bridge never said where its probes are; stderr:\n%s", stderr.String())
	}
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Wait until the store has said it cannot reach MySQL: the log line and
	// the probe that quote the DSN's address.
	deadline := time.Now().Add(10 * time.Second)
	var ready string
	for ready = get("/readyz"); !strings.Contains(ready, "not reachable") || !strings.Contains(stderr.String(), "sweep of the region's counts failed"); ready = get("/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never said MySQL is not reachable (%q), or no sweep of Redis failed:\n%s", ready, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	metrics := get("/metrics")
	cancel()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("bridge did not stop within 15s")
	}
	<-copied
	logs := stderr.String()
	if !strings.Contains(logs, "bridge serving") || !strings.Contains(logs, "nats://xxxxx@"+addr) {
		t.Errorf("logs do not name the NATS server with its token hidden:\n%s", logs)
	}
	for where, text := range map[string]string{"log": logs, "standard output": stdout.String(), "/readyz": ready, "/metrics": metrics} {
		for _, secret := range []string{natsToken, mysqlPassword, redisPassword} {
			if strings.Contains(text, secret) {
				t.Errorf("the bridge's %s shows %q:\n%s", where, secret, text)
			}
		}
	}
}

// The bridge authenticates with --nats-token-file, and a wrong token is
// refused at start with an error that says so and does not show it.
func TestBridgeAuthenticatesWithATokenFile(t *testing.T) {
	addr := startTokenServer(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	bad := filepath.Join(dir, "wrong")
	if err := os.WriteFile(good, []byte(natsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("wrong-t0ken"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", "nats://" + addr, "--nats-token-file", good, "--region", "us"}, io.Discard, &out)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "bridge serving") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("bridge with --nats-token-file never served; log %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("bridge exit %d after a graceful stop", code)
	}

	var errb bytes.Buffer
	code := run(context.Background(), []string{"--nats-url", "nats://" + addr, "--nats-token-file", bad, "--region", "us"}, io.Discard, &errb)
	if code != 1 || !strings.Contains(errb.String(), "refused the credentials") || strings.Contains(errb.String(), "wrong-t0ken") {
		t.Fatalf("wrong token: exit %d, stderr %q; want 1, saying the credentials were refused, without the token", code, errb.String())
	}
}
