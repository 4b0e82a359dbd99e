package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy/adminwire"
)

// startAdminLimiter runs an embedded NATS server and a limiter on it
// ("limiter serve" with extra args), and returns the server's URL once the
// limiter answers both its services' pings.
func startAdminLimiter(t *testing.T, extra ...string) string {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, append([]string{"--nats-url", url}, extra...)...)
	waitServing(t, url)
	// ratelimit-admin is registered after ratelimit.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := nc.Request("$SRV.PING.ratelimit-admin", nil, 200*time.Millisecond); err == nil {
			return url
		}
		if time.Now().After(deadline) {
			t.Fatal("limiter never answered $SRV.PING.ratelimit-admin")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// overrideCLI runs "limiter override args..." and returns its exit status,
// stdout and stderr.
func overrideCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runFor(t, 10*time.Second, append([]string{"override"}, args...)...)
}

// checkLimit runs "limiter check" of acme/api/id with limit 100 and returns
// its exit status and the reply's limit and shadow_denied.
func checkLimit(t *testing.T, url, id string, extra ...string) (int, checkOutput) {
	t.Helper()
	code, out, errs := runFor(t, 10*time.Second, append([]string{"check", "--nats-url", url, "--workspace", "acme",
		"--namespace", "api", "--identifier", id, "--limit", "100", "--duration", "10s"}, extra...)...)
	var resp checkOutput
	if code == exitError || json.Unmarshal([]byte(out), &resp) != nil {
		t.Fatalf("check %s: exit %d, stdout %q, stderr %q", id, code, out, errs)
	}
	return code, resp
}

// An override set from the command line is stored, listed, applied to the
// checks it covers (its limit, not theirs), and gone once deleted; each
// command prints the limiter's reply as JSON and exits 0.
func TestOverrideSetListApplyDelete(t *testing.T) {
	url := startAdminLimiter(t)
	ws := []string{"--nats-url", url, "--workspace", "acme"}
	stored := `{"namespace":"api","identifier":"user_*","limit":2,"duration":60000,"shadow":false}`

	code, out, errs := overrideCLI(t, append([]string{"set"}, append(ws, "--namespace", "api",
		"--identifier", "user_*", "--limit", "2", "--duration", "1m")...)...)
	if code != exitOK || strings.TrimSpace(out) != stored || errs != "" {
		t.Fatalf("set: exit %d, stdout %q, stderr %q; want 0 and %s", code, out, errs, stored)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `{"overrides":[` + stored + `]}`},
		{[]string{"--namespace", "api", "--json"}, `{"overrides":[` + stored + `]}`},
		{[]string{"--namespace", "web"}, `{"overrides":[]}`},
	} {
		code, out, errs := overrideCLI(t, append(append([]string{"list"}, ws...), tc.args...)...)
		if code != exitOK || strings.TrimSpace(out) != tc.want {
			t.Fatalf("list %v: exit %d, stdout %q, stderr %q; want 0 and %s", tc.args, code, out, errs, tc.want)
		}
	}

	// Checks of user_42 carry limit 100 and 10s; the override's 2 per
	// minute applies.
	for i := range 3 {
		code, resp := checkLimit(t, url, "user_42")
		wantCode := exitAdmitted
		if i == 2 {
			wantCode = exitDenied
		}
		if resp.Limit != 2 || resp.Success != (i < 2) || code != wantCode {
			t.Fatalf("check %d of user_42 under the override: exit %d, %+v; want limit 2, admitted twice", i+1, code, resp)
		}
	}
	if _, resp := checkLimit(t, url, "admin_1"); resp.Limit != 100 {
		t.Fatalf("admin_1, outside the pattern: %+v, want its own limit 100", resp)
	}

	// Replaced by a shadow override: the third check of user_43 would be
	// denied, and is answered success with shadow_denied.
	code, out, errs = overrideCLI(t, append([]string{"set"}, append(ws, "--namespace", "api",
		"--identifier", "user_*", "--limit", "2", "--duration", "60000", "--shadow", "--json")...)...)
	if code != exitOK || !strings.Contains(out, `"shadow":true`) {
		t.Fatalf("set --shadow: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for i := range 3 {
		code, resp := checkLimit(t, url, "user_43")
		if code != exitAdmitted || !resp.Success || resp.Limit != 2 || resp.ShadowDenied != (i == 2) {
			t.Fatalf("check %d of user_43 under the shadow override: exit %d, %+v; want admitted, shadow_denied on the third", i+1, code, resp)
		}
	}

	code, out, errs = overrideCLI(t, append([]string{"delete"}, append(ws, "--namespace", "api", "--identifier", "user_*")...)...)
	if code != exitOK || strings.TrimSpace(out) != `{"deleted":true}` {
		t.Fatalf("delete: exit %d, stdout %q, stderr %q; want 0 and {\"deleted\":true}", code, out, errs)
	}
	if code, out, _ := overrideCLI(t, append([]string{"list"}, ws...)...); code != exitOK || strings.TrimSpace(out) != `{"overrides":[]}` {
		t.Fatalf("list after delete: exit %d, stdout %q", code, out)
	}
	if _, resp := checkLimit(t, url, "user_44"); resp.Limit != 100 {
		t.Fatalf("user_44 after the delete: %+v, want its own limit 100", resp)
	}
	// Deleting it again is the limiter's 400.
	code, out, errs = overrideCLI(t, append([]string{"delete"}, append(ws, "--namespace", "api", "--identifier", "user_*")...)...)
	if code != exitError || out != "" || !strings.Contains(errs, "no such override") {
		t.Fatalf("second delete: exit %d, stdout %q, stderr %q; want 2 saying no such override", code, out, errs)
	}
}

// The limiter's refusal of a bad override (a 400) is exit status 2 with its
// message on stderr, and nothing is stored.
func TestOverrideRefusalSaysTheLimitersMessage(t *testing.T) {
	url := startAdminLimiter(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--identifier", "a**b", "--limit", "5", "--duration", "1m"}, `pattern "a**b" has two adjacent *; one * already matches any run of bytes`},
		{[]string{"--identifier", "u", "--limit", "5", "--duration", "10"}, "duration 10 out of range 1000..31622400000"},
	} {
		for _, enc := range [][]string{nil, {"--json"}} {
			args := append([]string{"set", "--nats-url", url, "--workspace", "acme", "--namespace", "api"}, tc.args...)
			code, out, errs := overrideCLI(t, append(args, enc...)...)
			if code != exitError || out != "" || !strings.Contains(errs, "400") || !strings.Contains(errs, tc.want) {
				t.Fatalf("set %v %v: exit %d, stdout %q, stderr %q; want 2 and the limiter's %q", tc.args, enc, code, out, errs, tc.want)
			}
		}
	}
	if code, out, _ := overrideCLI(t, "list", "--nats-url", url, "--workspace", "acme"); code != exitOK || strings.TrimSpace(out) != `{"overrides":[]}` {
		t.Fatalf("list after refusals: exit %d, stdout %q; want none stored", code, out)
	}
}

// Each subcommand names every required flag it lacks (and its environment
// variable) and exits 2 before connecting; a missing or unknown subcommand
// is exit 2 too, and -h lists the subcommands.
func TestOverrideNamesTheMissingFlags(t *testing.T) {
	offline := []string{"--nats-url", "nats://127.0.0.1:1"}
	for _, tc := range []struct {
		op       string
		required map[string]string
	}{
		{"set", map[string]string{"--workspace": "acme", "--namespace": "api", "--identifier": "user_*", "--limit": "5", "--duration": "1m"}},
		{"get", map[string]string{"--workspace": "acme", "--namespace": "api", "--identifier": "user_*"}},
		{"delete", map[string]string{"--workspace": "acme", "--namespace": "api", "--identifier": "user_*"}},
		{"list", map[string]string{"--workspace": "acme"}},
	} {
		for missing := range tc.required {
			args := append([]string{tc.op}, offline...)
			for flag, v := range tc.required {
				if flag != missing {
					args = append(args, flag, v)
				}
			}
			code, out, errs := overrideCLI(t, args...)
			want := "missing required " + missing + " (or " + "SLUICE_" + strings.ToUpper(strings.ReplaceAll(missing[2:], "-", "_")) + ")"
			if code != exitError || out != "" || !strings.Contains(errs, want) || strings.Contains(errs, "connect") {
				t.Fatalf("%s without %s: exit %d, stdout %q, stderr %q; want 2 saying %q before connecting", tc.op, missing, code, out, errs, want)
			}
		}
		// With every required flag, the error is the unreachable NATS.
		args := append([]string{tc.op}, offline...)
		for flag, v := range tc.required {
			args = append(args, flag, v)
		}
		if code, _, errs := overrideCLI(t, args...); code != exitError || strings.Contains(errs, "missing") || !strings.Contains(errs, "connect to NATS") {
			t.Fatalf("%s with its required flags, NATS unreachable: exit %d, stderr %q", tc.op, code, errs)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing subcommand"},
		{[]string{"reset"}, `unknown subcommand "reset"`},
		{[]string{"set", "--timeout", "0s"}, "--timeout"},
		{[]string{"set", "--duration", "0"}, "duration"},
		{[]string{"list", "extra"}, `unexpected argument "extra"`},
		{[]string{"list", "--nats-url", "nats://127.0.0.1:1", "--workspace", "acme", "--limit", "1001"}, "--limit 1001: want 1 to 1000"},
		{[]string{"list", "--nats-url", "nats://127.0.0.1:1", "--workspace", "acme", "--limit", "0"}, "--limit 0: want 1 to 1000"},
	} {
		if code, _, errs := overrideCLI(t, tc.args...); code != exitError || !strings.Contains(errs, tc.want) {
			t.Fatalf("override %v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errs, tc.want)
		}
	}
	code, out, _ := overrideCLI(t, "-h")
	for _, sub := range []string{"set", "get", "delete", "list"} {
		if code != exitOK || !strings.Contains(out, "\n  "+sub+" ") {
			t.Fatalf("override -h: exit %d, stdout %q; want 0 listing %s", code, out, sub)
		}
	}
	if code, out, _ := runFor(t, 5*time.Second, "help"); code != 0 || !strings.Contains(out, "limiter override set|get|delete|list") {
		t.Fatalf("limiter help: exit %d, %q; want it to mention limiter override", code, out)
	}
	if code, _, errs := overrideCLI(t, "set", "-h"); code != exitOK || !strings.Contains(errs, "-shadow") || !strings.Contains(errs, "-identifier") {
		t.Fatalf("override set -h: exit %d, stderr %q; want its flags", code, errs)
	}
}

// SLUICE_* variables fill every flag the command line leaves out, as for
// "limiter check".
func TestOverrideEnvironmentFillsFlags(t *testing.T) {
	// The limiter is started, and has read its own flags, before the
	// environment is set.
	url := startAdminLimiter(t, "--subject-prefix", "rl")
	for name, v := range map[string]string{"NATS_URL": url, "SUBJECT_PREFIX": "rl", "WORKSPACE": "acme", "NAMESPACE": "api",
		"IDENTIFIER": "env_*", "LIMIT": "1", "DURATION": "30s", "SHADOW": "true", "JSON": "true"} {
		t.Setenv("SLUICE_"+name, v)
	}
	code, out, errs := overrideCLI(t, "set")
	want := `{"namespace":"api","identifier":"env_*","limit":1,"duration":30000,"shadow":true}`
	if code != exitOK || strings.TrimSpace(out) != want {
		t.Fatalf("set from the environment: exit %d, stdout %q, stderr %q; want %s", code, out, errs, want)
	}
	// The command line wins over the environment.
	code, out, errs = overrideCLI(t, "set", "--limit", "3", "--shadow=false")
	want = `{"namespace":"api","identifier":"env_*","limit":3,"duration":30000,"shadow":false}`
	if code != exitOK || strings.TrimSpace(out) != want {
		t.Fatalf("set with --limit 3 --shadow=false over the environment: exit %d, stdout %q, stderr %q; want %s", code, out, errs, want)
	}
	if code, out, errs := overrideCLI(t, "list"); code != exitOK || strings.TrimSpace(out) != `{"overrides":[`+want+`]}` {
		t.Fatalf("list from the environment: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, errs := overrideCLI(t, "delete"); code != exitOK || strings.TrimSpace(out) != `{"deleted":true}` {
		t.Fatalf("delete from the environment: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// "override get" prints one pattern's override as stored, or the limiter's
// 400 for a pattern without one; "override list" follows the limiter's
// pages (of --limit, or of its default, or shorter for bytes) and prints
// every override once, in order, as one reply.
func TestOverrideGetAndPagedList(t *testing.T) {
	url := startAdminLimiter(t)
	ws := []string{"--nats-url", url, "--workspace", "acme"}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// 1,500 overrides of ~400-byte patterns (more than one page of the
	// default limit), set through the endpoint by 16 clients at once.
	client := bus.NewClient(nc, bus.WithCoalescing(false))
	want := make([]bus.Override, 1500)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(want); i += 16 {
				want[i] = bus.Override{Namespace: "api", Identifier: fmt.Sprintf("u%05d-", i) + strings.Repeat("<x", 196) + "*",
					Limit: int64(i), Duration: 60_000, Shadow: i%2 == 0}
				if _, err := client.SetOverride(context.Background(), "acme", want[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	one, _ := json.Marshal(want[42])
	for _, enc := range [][]string{nil, {"--json"}} {
		code, out, errs := overrideCLI(t, append(append([]string{"get"}, ws...), append([]string{"--namespace", "api", "--identifier", want[42].Identifier}, enc...)...)...)
		if code != exitOK || strings.TrimSpace(out) != string(one) {
			t.Fatalf("get %v: exit %d, stdout %q, stderr %q; want 0 and %s", enc, code, out, errs, one)
		}
		code, out, errs = overrideCLI(t, append(append([]string{"get"}, ws...), append([]string{"--namespace", "api", "--identifier", "u00042-x"}, enc...)...)...)
		if code != exitError || out != "" || !strings.Contains(errs, "400") || !strings.Contains(errs, `no such override: acme/api pattern "u00042-x"`) {
			t.Fatalf("get of a pattern never set %v: exit %d, stdout %q, stderr %q; want 2 and no such override", enc, code, out, errs)
		}
	}

	wantList, _ := json.Marshal(adminwire.ListResponse{Overrides: want})
	for _, args := range [][]string{nil, {"--json"}, {"--limit", "7"}, {"--namespace", "api", "--limit", "1000", "--json"}} {
		code, out, errs := overrideCLI(t, append(append([]string{"list"}, ws...), args...)...)
		if code != exitOK || strings.TrimSpace(out) != string(wantList) {
			t.Fatalf("list %v: exit %d, stderr %q, %d bytes of stdout; want 0 and the %d overrides in order (%d bytes)", args, code, errs, len(out), len(want), len(wantList))
		}
	}
}
