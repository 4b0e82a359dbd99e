package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// "limiter reset" forgets an identifier's usage: the check after it is
// admitted with the whole limit left; it prints the limiter's reply as JSON
// (the epoch under "reset") and exits 0, and a refusal exits 2 with the
// limiter's message. A reset of one duration leaves the others.
func TestResetForgetsUsageFromTheCommandLine(t *testing.T) {
	url := startAdminLimiter(t)
	if code, resp := checkLimit(t, url, "zed", "--cost", "100"); code != exitOK || resp.Remaining != 0 {
		t.Fatalf("spending the limit: exit %d, %+v", code, resp)
	}
	if code, _ := checkLimit(t, url, "zed"); code == exitOK {
		t.Fatal("a check beyond the limit was admitted")
	}
	for _, enc := range [][]string{nil, {"--json"}} {
		args := append([]string{"reset", "--nats-url", url, "--workspace", "acme", "--namespace", "api",
			"--identifier", "zed", "--duration", "10s"}, enc...)
		code, out, errs := runFor(t, 10*time.Second, args...)
		var resp struct {
			Namespace, Identifier string
			Duration, Reset       int64
		}
		if code != exitOK || json.Unmarshal([]byte(out), &resp) != nil || resp.Namespace != "api" ||
			resp.Identifier != "zed" || resp.Duration != 10_000 || resp.Reset < time.Now().Add(-time.Minute).UnixMilli() {
			t.Fatalf("reset %v: exit %d, stdout %q, stderr %q", enc, code, out, errs)
		}
		if code, resp := checkLimit(t, url, "zed"); code != exitOK || resp.Remaining != 99 {
			t.Fatalf("check after the reset: exit %d, %+v; want admitted with 99 left", code, resp)
		}
	}
	// The other duration of the identifier is untouched by a reset of 10s,
	// and freed by a reset of every duration.
	minute := []string{"check", "--nats-url", url, "--workspace", "acme", "--namespace", "api", "--identifier", "zed",
		"--limit", "1", "--duration", "1m"}
	if code, _, _ := runFor(t, 10*time.Second, minute...); code != exitOK {
		t.Fatal("first check of the minute denied")
	}
	if code, _, _ := runFor(t, 10*time.Second, minute...); code == exitOK {
		t.Fatal("second check of the minute admitted")
	}
	if code, _, errs := runFor(t, 10*time.Second, "reset", "--nats-url", url, "--workspace", "acme", "--namespace", "api",
		"--identifier", "zed"); code != exitOK {
		t.Fatalf("reset of every duration: exit %d, %s", code, errs)
	}
	if code, _, _ := runFor(t, 10*time.Second, minute...); code != exitOK {
		t.Fatal("check of the minute denied after a reset of every duration")
	}

	code, out, errs := runFor(t, 10*time.Second, "reset", "--nats-url", url, "--workspace", "acme", "--namespace", "api",
		"--identifier", "zed", "--duration", "10")
	if code != exitError || out != "" || !strings.Contains(errs, "400") || !strings.Contains(errs, "duration 10 out of range") {
		t.Fatalf("reset of a duration out of range: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, _, errs = runFor(t, 10*time.Second, "reset", "--nats-url", "nats://127.0.0.1:1", "--workspace", "acme")
	if code != exitError || !strings.Contains(errs, "--namespace") || !strings.Contains(errs, "--identifier") {
		t.Fatalf("reset without its flags: exit %d, stderr %q", code, errs)
	}
}
