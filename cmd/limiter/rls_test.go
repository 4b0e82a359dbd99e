package main

import (
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
