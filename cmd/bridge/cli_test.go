package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/natstest"
)

// runFor runs the bridge command with args until it returns or d passes
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

func TestHelpSaysHowToUseIt(t *testing.T) {
	code, out, errs := runFor(t, 5*time.Second, "help")
	if code != 0 || !strings.HasPrefix(out, "usage: bridge ") || !strings.Contains(out, "migrate") || errs != "" {
		t.Fatalf("bridge help: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", code, out, errs)
	}
}

// A zero or negative interval is refused (exit 2, naming the flag) before
// anything starts, instead of being replaced by a default; so is a region
// that is not a token.
func TestZeroOrNegativeIntervalsAndBadRegionsAreRefused(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	_, _, help := runFor(t, 5*time.Second, "serve", "-h")
	var cases [][]string
	for _, m := range regexp.MustCompile(`(?m)^\s+-(\S+) duration$`).FindAllStringSubmatch(help, -1) {
		cases = append(cases, []string{"--" + m[1], "0s"}, []string{"--" + m[1], "-1s"})
	}
	if len(cases) < 10 {
		t.Fatalf("found %d duration flags in the help %q", len(cases)/2, help)
	}
	cases = append(cases, []string{"--region", "eu.west"}, []string{"--region", strings.Repeat("r", 65)},
		[]string{"--log-level", "loud"}, []string{"--subject-prefix", "a b"})
	for _, tc := range cases {
		// A reachable NATS server: the old code served here until the
		// context ended, and exited 0.
		code, out, errs := runFor(t, 3*time.Second, append([]string{"--nats-url", srv.ClientURL()}, tc...)...)
		if code != 2 || !strings.Contains(errs, tc[0]) || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 2 naming %s, nothing started", tc, code, out, errs, tc[0])
		}
	}
}

// A busy --metrics-addr stops the bridge before it says it serves, and a
// bridge that starts says so once.
func TestServingIsSaidOnceAndAfterTheMetricsAreBound(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, out, errs := runFor(t, 10*time.Second, "--nats-url", srv.ClientURL(), "--metrics-addr", ln.Addr().String())
	if code == 0 || !strings.Contains(errs, "--metrics-addr") || strings.Contains(out+errs, "serving") {
		t.Fatalf("busy metrics address: exit %d, stdout %q, stderr %q; want an error naming --metrics-addr and no serving line", code, out, errs)
	}

	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	stderr := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--metrics-addr", "127.0.0.1:0"}, pw, stderr)
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
	for !strings.Contains(stderr.String(), "bridge serving") {
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
	for _, what := range []string{"serving", "metrics on"} {
		if n := strings.Count(all, what); n != 1 {
			t.Fatalf("%q said %d times, want once; stdout %q, stderr %q", what, n, stdout, stderr.String())
		}
	}
}
