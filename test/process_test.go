package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
)

// instancesPerLimiter is how many micro instances a limiter process runs by
// default (--instances).
const instancesPerLimiter = 1

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binary builds cmd/<name> once per test run and returns its path.
func binary(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "sluice-bin-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir, "../cmd/...").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// process is a limiter or bridge started as its own OS process.
type process struct {
	cmd  *exec.Cmd
	done chan error
	// exited is closed once the process has exited and been waited for.
	exited chan struct{}
	stderr *lockedBuffer // what it wrote to stderr, also in the test log
}

func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(binary(t, name), args...)
	p := &process{cmd: cmd, done: make(chan error, 1), exited: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stdout = testWriter{t, name}
	cmd.Stderr = io.MultiWriter(testWriter{t, name}, p.stderr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := cmd.Wait()
		close(p.exited)
		p.done <- err
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// hasExited reports whether the process has exited (and been waited for).
func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop sends sig and returns the exit code, failing after timeout.
func (p *process) stop(t *testing.T, sig os.Signal, timeout time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %v of %v", timeout, sig)
		return -1
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.name, p)
	return len(p), nil
}

// waitService waits until n instances of the micro service answer $SRV.PING.
func waitService(t *testing.T, nc *nats.Conn, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest("$SRV.PING."+name, inbox, nil); err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			if _, err := sub.NextMsg(100 * time.Millisecond); err != nil {
				break
			}
			got++
		}
		_ = sub.Unsubscribe()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d %s instances answer", got, n, name)
		}
	}
}

// SIGTERM under load: the limiter exits 0, every check sent to it is
// answered (a decision, or 503 while it shuts down), and its queue peer takes
// over without a single request timing out.
func TestSIGTERMUnderLoadLosesNoRequest(t *testing.T) {
	srv := startServer(t)
	url := srv.ClientURL()
	victim := startProcess(t, "limiter", "--nats-url", url, "--region", "r1")
	startProcess(t, "limiter", "--nats-url", url, "--region", "r1")
	nc := connect(t, url)
	waitService(t, nc, "ratelimit", 2*instancesPerLimiter)

	c := bus.NewClient(nc, bus.WithTimeout(3*time.Second))
	var ok, unavailable atomic.Int64
	var failures []error
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{
					Identifier: fmt.Sprintf("u-%d-%d", g, i%50), Limit: 1_000_000, Duration: 60_000, Cost: 1})
				var se *bus.ServiceError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &se) && se.Code == 503:
					unavailable.Add(1)
				default:
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		})
	}
	for ok.Load() < 2000 {
		time.Sleep(5 * time.Millisecond)
	}
	if code := victim.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("limiter exited %d after SIGTERM, want 0", code)
	}
	after := ok.Load()
	for ok.Load() < after+2000 {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d checks failed during a graceful shutdown, first: %v", len(failures), failures[0])
	}
	t.Logf("%d checks answered, %d answered 503 while shutting down", ok.Load(), unavailable.Load())
}
