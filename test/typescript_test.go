package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/service"
)

// tsExample is examples/typescript, seen from this package's directory.
var tsExample = filepath.Join("..", "examples", "typescript")

// buildTSExample compiles the TypeScript example into its dist/ with the
// pinned TypeScript compiler. node_modules comes from `make node`
// (scripts/node.sh); only when it is missing does the test run `npm ci`.
// Node missing is a failure: the example is part of what `make test` checks.
func buildTSExample(t *testing.T) (node string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (run `make node`, which installs it with apt): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = tsExample
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), tsExample, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(tsExample, "node_modules")); errors.Is(err, fs.ErrNotExist) {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatalf("npm is not installed (run `make node`): %v", err)
		}
		run(npm, "ci", "--no-audit", "--no-fund")
	}
	run(node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json")
	return node
}

// tsRun is one run of the example's CLI.
type tsRun struct {
	exit   int
	stdout string
	stderr string
}

// decision decodes the JSON decision the CLI printed.
func (r tsRun) decision(t *testing.T) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("stdout is not a JSON decision: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return d
}

// The TypeScript example (nats.js, msgpack by default, JSON on request)
// speaks the client contract of the README's "Reference" to a real limiter over a real
// NATS server: decisions, the encodings and Content-Type it sends, the 400
// error replies, and its refusal to build a subject from a bad token.
func TestTypeScriptExampleTalksTheClientContract(t *testing.T) {
	node := buildTSExample(t)
	srv := startServer(t)
	// The limiter runs at its defaults but for the clock: a fixed instant,
	// 20s into a one-minute window, makes reset and retry_after exact.
	const duration = 60_000
	now := time.UnixMilli(30_000*duration + 20_000)
	lim := startLimiter(t, srv.ClientURL(), "local", service.Config{Now: func() time.Time { return now }})
	reset := float64(30_001 * duration)

	// A plain subscriber sees every check the example sends, beside the
	// limiter's queue group.
	watcher := connect(t, srv.ClientURL())
	sent, err := watcher.SubscribeSync("ratelimit.check.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	// sentBy runs the CLI with args and returns what it printed and the
	// checks it sent (none when it refused before sending).
	sentBy := func(args ...string) (tsRun, []*nats.Msg) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join("dist", "main.js"), "--nats-url", srv.ClientURL()}, args...)...)
		cmd.Dir = tsExample
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		r := tsRun{stdout: stdout.String(), stderr: stderr.String()}
		switch {
		case errors.As(err, &exitErr):
			r.exit = exitErr.ExitCode()
		case err != nil:
			t.Fatalf("node %v: %v", args, err)
		}
		// The limiter answered or the process ended, so the server has
		// routed every check it sent; a round trip of the watcher's own
		// puts them ahead of this point.
		if err := watcher.Flush(); err != nil {
			t.Fatal(err)
		}
		var msgs []*nats.Msg
		for {
			m, err := sent.NextMsg(10 * time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) {
				return r, msgs
			}
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
	}
	user := []string{"--workspace", "acme", "--namespace", "api", "--identifier", "user-42"}

	// msgpack, as the Go client: limit 3 admits three and denies the fourth.
	for i, want := range []map[string]any{
		{"success": true, "limit": 3.0, "remaining": 2.0, "reset": reset, "retry_after": 0.0},
		{"success": true, "limit": 3.0, "remaining": 1.0, "reset": reset, "retry_after": 0.0},
		{"success": true, "limit": 3.0, "remaining": 0.0, "reset": reset, "retry_after": 0.0},
		// The three weigh in the next window as its previous cell: one
		// more fits once 3·(60000−e)/60000 + 1 ≤ 3, at e = 20000 of the
		// next window, 40000 + 20000 ms from now.
		{"success": false, "limit": 3.0, "remaining": 0.0, "reset": reset, "retry_after": 60_000.0},
	} {
		r, msgs := sentBy(append(user, "--limit", "3", "--duration", "1m")...)
		wantExit := 0
		if !want["success"].(bool) {
			wantExit = 1
		}
		if r.exit != wantExit {
			t.Fatalf("check %d: exit %d, want %d (stderr %q)", i+1, r.exit, wantExit, r.stderr)
		}
		if got := r.decision(t); !reflect.DeepEqual(got, want) {
			t.Errorf("check %d: decision %v, want %v", i+1, got, want)
		}
		if len(msgs) != 1 {
			t.Fatalf("check %d: %d messages sent, want 1", i+1, len(msgs))
		}
		m := msgs[0]
		if m.Subject != "ratelimit.check.acme.api" || m.Header.Get("Content-Type") != "application/msgpack" {
			t.Errorf("check %d: sent to %s with Content-Type %q, want ratelimit.check.acme.api, application/msgpack",
				i+1, m.Subject, m.Header.Get("Content-Type"))
		}
		body, rest, err := msgp.ReadIntfBytes(m.Data)
		wantBody := map[string]any{"identifier": "user-42", "limit": int64(3), "duration": int64(duration)}
		if err != nil || len(rest) != 0 || !reflect.DeepEqual(msgpInts(body), wantBody) {
			t.Errorf("check %d: body %v (err %v, %d trailing bytes), want the msgpack map %v (cost absent: the contract's default 1)",
				i+1, body, err, len(rest), wantBody)
		}
	}

	// JSON on request; cost 0 only looks.
	r, msgs := sentBy(append(user, "--limit", "3", "--duration", "60000", "--cost", "0", "--json")...)
	if want := (map[string]any{"success": true, "limit": 3.0, "remaining": 0.0, "reset": reset, "retry_after": 0.0}); r.exit != 0 || !reflect.DeepEqual(r.decision(t), want) {
		t.Errorf("JSON look: exit %d, decision %s, want exit 0 and %v", r.exit, r.stdout, want)
	}
	if len(msgs) != 1 || msgs[0].Header.Get("Content-Type") != "application/json" ||
		!bytes.Equal(msgs[0].Data, []byte(`{"identifier":"user-42","limit":3,"duration":60000,"cost":0}`)) {
		t.Errorf("JSON look: sent %d messages, first %v", len(msgs), msgs)
	}

	// Usage known afterwards: a fixed-window debit of 5 against 3 is
	// counted and says so; the look after it is denied. The keys go on the
	// wire as the README writes them.
	tokens := []string{"--workspace", "acme", "--namespace", "llm", "--identifier", "tenant", "--limit", "3", "--window", "fixed"}
	r, msgs = sentBy(append(tokens, "--cost", "5", "--charge", "debit", "--json")...)
	if d := r.decision(t); r.exit != 1 || d["success"] != false || d["remaining"] != 0.0 || len(msgs) != 1 ||
		!bytes.Equal(msgs[0].Data, []byte(`{"identifier":"tenant","limit":3,"duration":60000,"cost":5,"window":"fixed","charge":"debit"}`)) {
		t.Errorf("a debit of 5 against 3: exit %d, decision %s, sent %v; want denied, counted", r.exit, r.stdout, msgs)
	}
	if r, _ = sentBy(append(tokens, "--cost", "0")...); r.exit != 1 {
		t.Errorf("a look after the debit: exit %d, decision %s; want denied (the 5 were counted)", r.exit, r.stdout)
	}
	if r, msgs = sentBy(append(tokens, "--charge", "overdraft")...); r.exit != 2 || len(msgs) != 0 {
		t.Errorf("--charge overdraft: exit %d, %d sent; want 2, nothing sent", r.exit, len(msgs))
	}

	// A monthly quota in New York: the calendar period goes on the wire as
	// "window" with no "duration" key, in either encoding; a cost of 3
	// against 3 is admitted, the next check denied, and both say the quota
	// renews at midnight of the 1st of next month, New York time.
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	y, m, _ := now.In(newYork).Date()
	renews := time.Date(y, m+1, 1, 0, 0, 0, 0, newYork).UnixMilli()
	monthly := []string{"--workspace", "acme", "--namespace", "quota", "--identifier", "tenant", "--limit", "3", "--window", "month@America/New_York"}
	r, msgs = sentBy(append(monthly, "--cost", "3", "--json")...)
	if want := (map[string]any{"success": true, "limit": 3.0, "remaining": 0.0, "reset": float64(renews), "retry_after": 0.0}); r.exit != 0 || !reflect.DeepEqual(r.decision(t), want) || len(msgs) != 1 ||
		!bytes.Equal(msgs[0].Data, []byte(`{"identifier":"tenant","limit":3,"cost":3,"window":"month@America/New_York"}`)) {
		t.Errorf("3 of a monthly 3: exit %d, decision %s, sent %v; want exit 0, %v, no duration key", r.exit, r.stdout, msgs, want)
	}
	r, msgs = sentBy(monthly...)
	if want := (map[string]any{"success": false, "limit": 3.0, "remaining": 0.0, "reset": float64(renews), "retry_after": float64(renews - now.UnixMilli())}); r.exit != 1 || !reflect.DeepEqual(r.decision(t), want) {
		t.Errorf("the 4th of a monthly 3: exit %d, decision %s; want exit 1, %v", r.exit, r.stdout, want)
	}
	if len(msgs) != 1 {
		t.Fatalf("the 4th of a monthly 3: %d messages sent, want 1", len(msgs))
	}
	body, rest, err := msgp.ReadIntfBytes(msgs[0].Data)
	if wantBody := (map[string]any{"identifier": "tenant", "limit": int64(3), "window": "month@America/New_York"}); err != nil || len(rest) != 0 || !reflect.DeepEqual(msgpInts(body), wantBody) {
		t.Errorf("the 4th of a monthly 3: body %v (err %v, %d trailing bytes), want the msgpack map %v", body, err, len(rest), wantBody)
	}
	// A duration beside a calendar period, or a unit that is none, is
	// refused before sending; a zone the limiter does not know is its 400.
	for _, tc := range []struct {
		args []string
		sent int
		want string
	}{
		{[]string{"--window", "month", "--duration", "1m"}, 0, "sluice-check: --duration must be absent with a calendar --window (month)"},
		{[]string{"--window", "fortnight"}, 0, "sluice-check: --window must be sliding, fixed or a calendar period"},
		{[]string{"--window", "month@Mars/Olympus"}, 1, `sluice-check: 400 window: time zone "Mars/Olympus" is not an IANA zone name`},
	} {
		r, msgs := sentBy(append([]string{"--workspace", "acme", "--namespace", "quota", "--identifier", "fresh", "--limit", "3"}, tc.args...)...)
		if r.exit != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, tc.want) || len(msgs) != tc.sent {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, %d sent; want exit 2, no decision, stderr %q..., %d sent",
				tc.args, r.exit, r.stdout, r.stderr, len(msgs), tc.want, tc.sent)
		}
	}

	// Bad input: the limiter's 400 reply, in either encoding, and nothing counted.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit=-1"}, "sluice-check: 400 limit must be between 0 and 1000000000000000"},
		{[]string{"--limit", "3", "--duration", "10", "--json"}, "sluice-check: 400 duration must be between 1000 and 31622400000 milliseconds"},
	} {
		r, msgs := sentBy(append([]string{"--workspace", "acme", "--namespace", "api", "--identifier", "fresh"}, tc.args...)...)
		if r.exit != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, tc.want) || len(msgs) != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, %d sent; want exit 2, no decision, stderr %q..., 1 sent",
				tc.args, r.exit, r.stdout, r.stderr, len(msgs), tc.want)
		}
	}
	r, _ = sentBy("--workspace", "acme", "--namespace", "api", "--identifier", "fresh", "--limit", "3", "--cost", "0")
	if d := r.decision(t); d["remaining"] != 3.0 {
		t.Errorf("after two refused requests, fresh has remaining %v, want 3: an error reply counted something", d["remaining"])
	}

	// The reply's optional fields: the override that applied, and a
	// denial shadow mode turned into an admission.
	for _, o := range []struct {
		pattern string
		ov      policy.Override
	}{
		{"vip-*", policy.Override{Limit: 5, Duration: duration}},
		{"shadowed", policy.Override{Limit: 0, Duration: duration, Shadow: true}},
	} {
		if _, err := lim.svc.Policies().Set(policy.Key{Workspace: "acme", Namespace: "api", Pattern: o.pattern}, o.ov, now.UnixMilli(), "local"); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		id   string
		want map[string]any
	}{
		{"vip-1", map[string]any{"success": true, "limit": 5.0, "remaining": 4.0, "reset": reset, "retry_after": 0.0, "override": "vip-*"}},
		{"shadowed", map[string]any{"success": true, "limit": 0.0, "remaining": 0.0, "reset": reset, "retry_after": 0.0,
			"shadow_denied": true, "override": "shadowed"}},
	} {
		r, _ := sentBy("--workspace", "acme", "--namespace", "api", "--identifier", tc.id, "--limit", "3", "--duration", "1m")
		if got := r.decision(t); r.exit != 0 || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: exit %d, decision %v; want exit 0 and %v", tc.id, r.exit, got, tc.want)
		}
	}

	// A workspace that is not a subject token is refused before sending:
	// "a.b" would otherwise address another subject.
	r, msgs = sentBy("--workspace", "a.b", "--namespace", "api", "--identifier", "x", "--limit", "3")
	if r.exit != 2 || !strings.Contains(r.stderr, "workspace must be 1 to 64 characters of [A-Za-z0-9_-]") || len(msgs) != 0 {
		t.Errorf("workspace a.b: exit %d, stderr %q, %d sent; want exit 2, the token rule, nothing sent", r.exit, r.stderr, len(msgs))
	}
}

// msgpInts gives a decoded msgpack map's integers one type (msgp reads a
// positive fixint as int64 or uint64 depending on its encoding) so that
// maps compare by value.
func msgpInts(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		if n, ok := x.(uint64); ok {
			x = int64(n)
		}
		out[k] = x
	}
	return out
}

// The TypeScript example's checks function sends many checks in one
// checks message (README, "Many checks in one message"): one message on ratelimit.checks.<ws>,
// one result per check in order, each decided as if alone (a repeated
// identifier is denied once its limit is spent, a bad identifier gets its
// own 400 result while the others are decided), in both encodings.
func TestTypeScriptExampleSendsManyChecksInOneMessage(t *testing.T) {
	node := buildTSExample(t)
	srv := startServer(t)
	const duration = 60_000
	now := time.UnixMilli(30_000*duration + 20_000)
	startLimiter(t, srv.ClientURL(), "local", service.Config{Now: func() time.Time { return now }})
	reset := float64(30_001 * duration)
	watcher := connect(t, srv.ClientURL())
	sent, err := watcher.SubscribeSync("ratelimit.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, enc := range []string{"msgpack", "json"} {
		ws := "many-" + enc
		args := []string{filepath.Join("dist", "main.js"), "--nats-url", srv.ClientURL(), "--workspace", ws, "--namespace", "api",
			"--identifier", "u1", "--identifier", "u1", "--identifier", strings.Repeat("x", 513), "--identifier", "u2",
			"--limit", "1", "--duration", "1m"}
		if enc == "json" {
			args = append(args, "--json")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, node, args...)
		cmd.Dir = tsExample
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
			t.Fatalf("%s: %v (stderr %q), want exit 2: one check got an error", enc, err, stderr.String())
		}
		var got []map[string]any
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
			t.Fatalf("%s: stdout %q: %v", enc, stdout.String(), err)
		}
		want := []map[string]any{
			{"success": true, "limit": 1.0, "remaining": 0.0, "reset": reset, "retry_after": 0.0},
			// The one admission weighs in the next window until its end.
			{"success": false, "limit": 1.0, "remaining": 0.0, "reset": reset, "retry_after": 100_000.0},
			{"error": "identifier must be 1 to 512 bytes, got 513", "code": 400.0},
			{"success": true, "limit": 1.0, "remaining": 0.0, "reset": reset, "retry_after": 0.0},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: results\n got %v\nwant %v", enc, got, want)
		}
		if err := watcher.Flush(); err != nil {
			t.Fatal(err)
		}
		var subjects []string
		for {
			m, err := sent.NextMsg(10 * time.Millisecond)
			if err != nil {
				break
			}
			if !strings.HasPrefix(m.Subject, "ratelimit.gc") {
				subjects = append(subjects, m.Subject)
			}
		}
		if len(subjects) != 1 || subjects[0] != "ratelimit.checks."+ws {
			t.Errorf("%s: sent %v, want one message on ratelimit.checks.%s", enc, subjects, ws)
		}
	}
}
