package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
)

// helperArgsEnv carries, JSON-encoded, the arguments of the limiter that
// TestHelperLimiterProcess runs in a child process.
const helperArgsEnv = "SLUICE_TEST_LIMITER_ARGS"

// TestHelperLimiterProcess is not a test: run as a child of the test binary
// with SLUICE_TEST_LIMITER_ARGS set, it runs the limiter command as main does,
// on the process's own standard output and error, until SIGTERM.
func TestHelperLimiterProcess(t *testing.T) {
	raw := os.Getenv(helperArgsEnv)
	if raw == "" {
		t.Skip("helper process for TestLimiterStderrIsOnlySlog")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLimiterStderrIsOnlySlog runs a limiter whose Redis refuses every
// connection, checks it for about two seconds and stops it: everything the
// process wrote to its standard error must be slog text lines. go-redis
// writes its own "redis: ..." lines to the process's stderr (not to the
// writer run is given), so the limiter runs in a child process whose stderr
// the test reads.
func TestLimiterStderrIsOnlySlog(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused

	// The admitted cost cannot be replayed to a Redis that is down, so
	// shutdown gives up after --shutdown-timeout and the process exits 1.
	args, _ := json.Marshal([]string{"serve", "--nats-listen", "127.0.0.1:0", "--redis-url", "redis://" + closed,
		"--shutdown-timeout", "1s"})
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLimiterProcess$")
	cmd.Env = append(os.Environ(), helperArgsEnv+"="+string(args))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	urls := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if u, ok := strings.CutPrefix(lines.Text(), "embedded NATS server listening on "); ok {
				urls <- strings.TrimSpace(u)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var url string
	select {
	case url = <-urls:
	case err := <-exited:
		t.Fatalf("limiter exited before serving: %v; stderr:\n%s", err, stderr.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("limiter never said where its NATS server listens; stderr:\n%s", stderr.String())
	}
	waitServing(t, url)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	client := bus.NewClient(nc)

	// Checks of new identifiers read Redis (and fail), admissions queue
	// replays (which fail): both kinds of calls go to the refusing port.
	start := time.Now()
	for i := 0; time.Since(start) < 2*time.Second; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := client.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "u" + string(rune('a'+i%26)), Limit: 100, Duration: 60_000, Cost: 1})
		cancel()
		if err != nil {
			t.Fatalf("check %d with Redis down: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond) // pacing the checks, not waiting for an outcome
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		t.Logf("limiter exit: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("limiter did not stop within 20s of SIGTERM")
	}

	out := stderr.String()
	if strings.TrimSpace(out) == "" {
		t.Fatal("the limiter wrote nothing to stderr; want at least its slog lines")
	}
	var bad []string
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "redis:") || !strings.HasPrefix(line, "time=") || !strings.Contains(line, " level=") {
			bad = append(bad, line)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of the limiter's stderr lines are not slog text lines, e.g.:\n%s\n\nstderr:\n%s", len(bad), strings.Join(bad[:min(len(bad), 5)], "\n"), out)
	}
}
