package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/internal/natstest"
)

const (
	natsUser     = "sluice"
	natsPassword = "nats-pw-s3cret"
	// redisPassword goes to the shared Redis, which has none: go-redis's
	// AUTH fails, so the limiter logs Redis errors the secret must stay
	// out of.
	redisPassword = "redis-pw-s3cret"
)

// startAuthServer runs an embedded nats-server that admits only
// natsUser/natsPassword for the test and returns its address (host:port).
func startAuthServer(t *testing.T) string {
	t.Helper()
	return natstest.StartSecuredServer(t, &server.Options{Username: natsUser, Password: natsPassword}).Addr().String()
}

// noSecret fails the test if text, from where, shows a password.
func noSecret(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range []string{natsPassword, redisPassword} {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the password %q:\n%s", where, s, text)
		}
	}
}

// A limiter given passwords in its URLs prints neither in its logs (debug
// level: the most it says), its standard output or /metrics; "limiter check"
// and a failed connect do not either.
func TestNoSecretReachesLogsErrorsOrMetrics(t *testing.T) {
	addr := startAuthServer(t)
	url := fmt.Sprintf("nats://%s:%s@%s", natsUser, natsPassword, addr)

	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--nats-url", url, "--metrics-addr", "127.0.0.1:0", "--log-level", "debug",
			"--redis-url", "redis://:" + redisPassword + "@127.0.0.1:6379", "--redis-prefix", fmt.Sprintf("sluicetest-secrets-%d", time.Now().UnixNano())},
			pw, &stderr)
		pw.Close()
	}()
	var stdout syncBuffer
	lines := bufio.NewScanner(pr)
	var metricsURL string
	for metricsURL == "" && lines.Scan() {
		_, _ = stdout.Write([]byte(lines.Text() + "\n"))
		if rest, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			metricsURL, _, _ = strings.Cut(rest, " ")
		}
	}
	if metricsURL == "" {
		cancel()
		t.Fatalf("limiter never served metrics; stderr:\n%s", stderr.String())
	}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&stdout, pr); close(copied) }()

	// "limiter check" through the same server, the password from a file.
	pwFile := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(pwFile, []byte(natsPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var checkOut, checkErr bytes.Buffer
	code := run(context.Background(), []string{"check", "--nats-url", "nats://" + addr, "--nats-user", natsUser,
		"--nats-password-file", pwFile, "--workspace", "acme", "--namespace", "api", "--identifier", "u", "--limit", "5"},
		&checkOut, &checkErr)
	if code != exitAdmitted {
		t.Fatalf("check with --nats-user and --nats-password-file: exit %d, stderr %q", code, checkErr.String())
	}

	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "sluice_decisions_total") {
		t.Fatalf("/metrics has no sluice_decisions_total:\n%s", page)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("limiter did not stop within 15s")
	}
	<-copied
	logs := stderr.String()
	if !strings.Contains(logs, "limiter serving") || !strings.Contains(logs, "nats://"+natsUser+":xxxxx@"+addr) {
		t.Errorf("logs do not name the NATS server with its password hidden:\n%s", logs)
	}
	noSecret(t, "the limiter's log", logs)
	noSecret(t, "the limiter's standard output", stdout.String())
	noSecret(t, "/metrics", string(page))
	noSecret(t, "limiter check", checkOut.String()+checkErr.String())

	// Connects that fail: a wrong password, and no server at all.
	for _, bad := range []string{
		fmt.Sprintf("nats://%s:%s-wrong@%s", natsUser, natsPassword, addr),
		fmt.Sprintf("nats://%s:%s@127.0.0.1:1", natsUser, natsPassword),
	} {
		var errb bytes.Buffer
		if code := run(context.Background(), []string{"serve", "--nats-url", bad, "--redis-url", "redis://:" + redisPassword + "@127.0.0.1:6379"}, io.Discard, &errb); code != 1 {
			t.Errorf("serve --nats-url %s: exit %d, want 1; stderr %q", bad, code, errb.String())
		}
		noSecret(t, "a failed limiter start", errb.String())
		errb.Reset()
		if code := run(context.Background(), []string{"check", "--nats-url", bad, "--workspace", "a", "--namespace", "b",
			"--identifier", "c", "--limit", "1"}, io.Discard, &errb); code != exitError {
			t.Errorf("check --nats-url %s: exit %d, want %d; stderr %q", bad, code, exitError, errb.String())
		}
		if !strings.Contains(errb.String(), "connect to NATS at nats://"+natsUser+":xxxxx@") {
			t.Errorf("check's error %q does not name the server with its password hidden", errb.String())
		}
		noSecret(t, "a failed check", errb.String())
	}
}

// The credential flags reach the connection: a limiter that authenticates
// with --nats-user and SLUICE_NATS_PASSWORD serves checks.
func TestLimiterAuthenticatesWithUserAndPasswordFromTheEnvironment(t *testing.T) {
	addr := startAuthServer(t)
	t.Setenv("SLUICE_NATS_PASSWORD", natsPassword)
	serveInBackground(t, io.Discard, "--nats-url", "nats://"+addr, "--nats-user", natsUser)
	waitServing(t, "nats://"+addr, nats.UserInfo(natsUser, natsPassword))
}

func TestCredentialFlagsAreRefusedWithoutANATSURLOrWhenBad(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--nats-listen", "127.0.0.1:0", "--nats-user", "u"}, "need --nats-url"},
		{[]string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-user", "u"}, "no password"},
		{[]string{"check", "--nats-creds", "/nonexistent/user.creds", "--workspace", "a", "--namespace", "b", "--identifier", "c", "--limit", "1"}, "--nats-creds"},
	} {
		var errb bytes.Buffer
		if code := run(context.Background(), c.args, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 saying %q", c.args, code, errb.String(), c.want)
		}
	}
}
