package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/natstest"
)

// runFor runs the limiter command with args until it returns or d passes
// (then its context ends, as on SIGTERM), and returns its exit status and
// what it wrote. A command that should refuse its flags returns at once; one
// that serves instead returns when d ends, so a test never hangs on it.
func runFor(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheckNamesTheMissingFlag(t *testing.T) {
	base := map[string]string{"--workspace": "acme", "--namespace": "api", "--identifier": "u", "--limit": "1"}
	for missing := range base {
		args := []string{"check", "--nats-url", "nats://127.0.0.1:1"}
		for flag, v := range base {
			if flag != missing {
				args = append(args, flag, v)
			}
		}
		code, _, errs := runFor(t, 5*time.Second, args...)
		if code != exitError || !strings.Contains(errs, "missing required "+missing+" ") {
			t.Fatalf("without %s: exit %d, stderr %q; want 2 naming %s", missing, code, errs, missing)
		}
		for flag := range base {
			if flag != missing && strings.Contains(errs, flag) {
				t.Fatalf("without %s: stderr %q also names %s, which was given", missing, errs, flag)
			}
		}
	}
	// --limit 0 is a limit (deny every cost), not a missing flag.
	code, _, errs := runFor(t, 5*time.Second, "check", "--nats-url", "nats://127.0.0.1:1",
		"--workspace", "a", "--namespace", "b", "--identifier", "c", "--limit", "0")
	if code != exitError || strings.Contains(errs, "missing") || !strings.Contains(errs, "connect to NATS") {
		t.Fatalf("--limit 0: exit %d, stderr %q; want it accepted (the error is the unreachable NATS)", code, errs)
	}
}

// durationFlags lists the flags that "limiter serve -h" shows as durations.
func durationFlags(t *testing.T) []string {
	t.Helper()
	_, _, help := runFor(t, 5*time.Second, "serve", "-h")
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+-(\S+) duration$`).FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		t.Fatalf("found %d duration flags in the help %q", len(names), help)
	}
	return names
}

// A zero or negative interval, timeout or count is refused (exit 2, naming
// the flag) before anything starts, instead of being replaced by a default.
func TestZeroOrNegativeIntervalsAndCountsAreRefused(t *testing.T) {
	var cases [][]string
	for _, name := range durationFlags(t) {
		cases = append(cases, []string{"--" + name, "0s"}, []string{"--" + name, "-1s"})
	}
	for _, name := range []string{"breaker-failures", "instances", "max-waiting-checks", "flush-workers", "flush-batch"} {
		cases = append(cases, []string{"--" + name, "0"})
	}
	cases = append(cases, []string{"--log-level", "loud"}, []string{"--subject-prefix", "a b"}, []string{"--gc-headroom-mib", "-1"})
	for _, tc := range cases {
		// An embedded server on any free port: the old code served here
		// until the context ended, and exited 0.
		code, out, errs := runFor(t, 3*time.Second, append([]string{"serve", "--nats-listen", "127.0.0.1:0"}, tc...)...)
		if code != 2 || !strings.Contains(errs, tc[0]) || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 2 naming %s, nothing started", tc, code, out, errs, tc[0])
		}
	}
	for _, tc := range [][]string{{"--duration", "0"}, {"--duration", "-1m"}, {"--timeout", "0s"}} {
		code, _, errs := runFor(t, 5*time.Second, append([]string{"check", "--nats-url", "nats://127.0.0.1:1",
			"--workspace", "a", "--namespace", "b", "--identifier", "c", "--limit", "1"}, tc...)...)
		if code != exitError || !strings.Contains(errs, tc[0][1:]) || strings.Contains(errs, "connect") {
			t.Fatalf("check %v: exit %d, stderr %q; want 2 naming %s before connecting", tc, code, errs, tc[0])
		}
	}
}

func TestRegionMustBeAToken(t *testing.T) {
	for _, region := range []string{"eu.west", "a b", strings.Repeat("r", 65)} {
		code, out, errs := runFor(t, 3*time.Second, "--nats-listen", "127.0.0.1:0", "--region", region)
		if code != 2 || !strings.Contains(errs, "--region") || out != "" {
			t.Fatalf("--region %q: exit %d, stdout %q, stderr %q; want 2 naming --region, nothing started", region, code, out, errs)
		}
	}
}

// A busy --metrics-addr stops the limiter before it says it serves.
func TestMetricsAddrIsBoundBeforeServing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, out, errs := runFor(t, 10*time.Second, "--nats-listen", "127.0.0.1:0", "--metrics-addr", ln.Addr().String())
	if code == 0 || !strings.Contains(errs, "--metrics-addr") || strings.Contains(out+errs, "serving") {
		t.Fatalf("busy metrics address: exit %d, stdout %q, stderr %q; want an error naming --metrics-addr and no serving line", code, out, errs)
	}
}

// Each start is said once across standard output and error: where the
// embedded server and the metrics listen on stdout, that the limiter serves
// on the log.
func TestEachStartIsSaidOnce(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	stderr := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}, pw, stderr)
	}()
	var stdout []string
	lines := bufio.NewScanner(pr)
	for lines.Scan() {
		stdout = append(stdout, lines.Text())
		if strings.HasPrefix(lines.Text(), "metrics on ") {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), "limiter serving") {
		if time.Now().After(deadline) {
			t.Fatalf("no serving line on the log: %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	all := strings.Join(stdout, "\n") + "\n" + stderr.String()
	for _, what := range []string{"serving", "listening on", "metrics on"} {
		if n := strings.Count(all, what); n != 1 {
			t.Fatalf("%q said %d times, want once; stdout %q, stderr %q", what, n, stdout, stderr.String())
		}
	}
}

// "limiter check --cost 0" looks without counting, as documented.
func TestCheckCostZeroOnlyLooks(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, "--nats-url", url)
	waitServing(t, url)
	check := func(extra ...string) (int, string) {
		code, out, _ := runFor(t, 5*time.Second, append([]string{"check", "--nats-url", url, "--workspace", "acme",
			"--namespace", "api", "--identifier", "look", "--limit", "1"}, extra...)...)
		return code, out
	}
	for range 2 {
		if code, out := check("--cost", "0"); code != exitAdmitted || !strings.Contains(out, `"remaining":1`) {
			t.Fatalf("--cost 0: exit %d, %q; want admitted with 1 remaining", code, out)
		}
	}
	if code, out := check(); code != exitAdmitted || !strings.Contains(out, `"remaining":0`) {
		t.Fatalf("default cost: exit %d, %q; want admitted, counting 1", code, out)
	}
}

// "limiter check --charge" and "--window" reach the limiter through both
// encodings: a debit past the limit is counted (the look after it is
// denied), a drain counts what is left, and a bad value is refused before
// anything is sent.
func TestCheckChargesAndWindows(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, "--nats-url", url)
	waitServing(t, url)
	check := func(id string, extra ...string) (int, string) {
		code, out, _ := runFor(t, 5*time.Second, append([]string{"check", "--nats-url", url, "--workspace", "acme",
			"--namespace", "api", "--identifier", id, "--limit", "3"}, extra...)...)
		return code, out
	}
	for _, enc := range [][]string{nil, {"--json"}} {
		id := fmt.Sprint("debit", len(enc))
		if code, out := check(id, append(enc, "--charge", "debit", "--cost", "5", "--window", "fixed")...); code != exitDenied || !strings.Contains(out, `"remaining":0`) {
			t.Fatalf("%v a debit of 5 against 3: exit %d, %q; want denied (and counted)", enc, code, out)
		}
		if code, out := check(id, append(enc, "--cost", "0", "--window", "fixed")...); code != exitDenied {
			t.Fatalf("%v a look after the debit: exit %d, %q; want denied: the 5 were counted", enc, code, out)
		}
		id = fmt.Sprint("drain", len(enc))
		check(id, append(enc, "--cost", "2")...)
		if code, out := check(id, append(enc, "--charge", "drain", "--cost", "2")...); code != exitDenied || !strings.Contains(out, `"remaining":0`) {
			t.Fatalf("%v a drain of 2 with 1 left: exit %d, %q; want denied, 1 drained", enc, code, out)
		}
		if code, out := check(id, append(enc, "--cost", "0")...); code != exitAdmitted || !strings.Contains(out, `"remaining":0`) {
			t.Fatalf("%v a look after the drain: exit %d, %q; want 0 remaining", enc, code, out)
		}
	}
	// A monthly quota in Berlin: the third call of three is admitted, the
	// fourth denied, and both say the quota renews on the first of next
	// month at midnight, Berlin time.
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	y, m, _ := time.Now().In(berlin).Date()
	renews := fmt.Sprintf(`"reset":%d`, time.Date(y, m+1, 1, 0, 0, 0, 0, berlin).UnixMilli())
	if code, out := check("monthly", "--window", "month@Europe/Berlin", "--cost", "3"); code != exitAdmitted || !strings.Contains(out, renews) {
		t.Fatalf("3 of a monthly 3: exit %d, %q; want admitted, %s", code, out, renews)
	}
	if code, out := check("monthly", "--window", "month@Europe/Berlin"); code != exitDenied || !strings.Contains(out, renews) {
		t.Fatalf("the 4th of a monthly 3: exit %d, %q; want denied, %s", code, out, renews)
	}
	for _, bad := range [][]string{{"--charge", "overdraft"}, {"--window", "tumbling"}, {"--window", "month@Mars/Olympus"}, {"--window", "day", "--duration", "1m"}} {
		if code, _ := check("bad", bad...); code != exitError {
			t.Fatalf("%v: exit %d, want %d", bad, code, exitError)
		}
	}
}
