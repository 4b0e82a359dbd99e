package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long a redis-server may take to answer PING.
	startTimeout = 10 * time.Second
	// stopTimeout bounds how long a redis-server may take to exit after
	// SIGTERM before it is killed.
	stopTimeout = 5 * time.Second
	// startAttempts bounds the ports tried when the chosen one turns out to
	// be taken by the time redis-server binds it.
	startAttempts = 5
	// Ports are drawn from [portMin, portMax). The range lies below the
	// ephemeral ports of Linux (32768-60999) and macOS (49152-65535), so
	// outgoing connections do not take them, and P+10000, the cluster bus
	// port, stays below 65536.
	portMin, portMax = 20000, 32768
	// busOffset is the distance from a node's port to its cluster bus port.
	busOffset = 10000
	// probeTimeout bounds each readiness probe of a starting server.
	probeTimeout = 250 * time.Millisecond
	// logLimit bounds the server output kept for error messages.
	logLimit = 64 << 10
)

// errPortTaken reports that another process holds a port chosen for a
// redis-server; trying another port may succeed.
var errPortTaken = errors.New("port taken")

// A server is one running redis-server child process.
type server struct {
	addr   string
	cmd    *exec.Cmd
	out    *tailBuffer
	exited chan struct{} // closed once cmd.Wait has returned
	err    error         // what cmd.Wait returned; read after exited
}

// startServer starts a redis-server, in cluster mode if cluster is set, on a
// free port, and registers its stop with t.Cleanup. It fails the test if no
// server comes up.
func startServer(t testing.TB, cluster bool) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found: run make services")
	}
	dir := t.TempDir()
	var err error
	for range startAttempts {
		var port int
		port, err = freePort(cluster)
		if err != nil {
			break
		}
		var s *server
		s, err = launch(dir, port, cluster)
		if err != nil {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		err = s.waitReady(ctx)
		cancel()
		if err == nil {
			t.Cleanup(func() {
				if err := s.stop(); err != nil {
					t.Errorf("redistest: %v", err)
				}
			})
			return s
		}
		_ = s.stop()
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	t.Fatalf("redistest: start redis-server: %v", err)
	return nil
}

// freePort returns a random port of 127.0.0.1 that nothing listens on; with
// bus set, the port 10000 above it must be free too.
func freePort(bus bool) (int, error) {
	var err error
	for range 100 {
		port := portMin + rand.IntN(portMax-portMin)
		if err = checkFree(port); err != nil {
			continue
		}
		if bus {
			if err = checkFree(port + busOffset); err != nil {
				continue
			}
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d): %w", portMin, portMax, err)
}

// checkFree returns nil if port can be listened on at 127.0.0.1.
func checkFree(port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return ln.Close()
}

// launch starts redis-server on port, working in dir, without waiting for
// it to serve.
func launch(dir string, port int, cluster bool) (*server, error) {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", "",
	}
	if cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
			"--cluster-node-timeout", "5000",
		)
	}
	s := &server{
		addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cmd:    exec.Command("redis-server", args...),
		out:    &tailBuffer{max: logLimit},
		exited: make(chan struct{}),
	}
	s.cmd.Stdout = s.out
	s.cmd.Stderr = s.out
	setSysProcAttr(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("run redis-server on port %d: %w", port, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// waitReady returns nil once the server answers PING, and an error if it
// exits or ctx is done first. The error wraps errPortTaken if the port was
// taken.
func (s *server) waitReady(ctx context.Context) error {
	// Give up on a probe as soon as the server exits.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.exited:
			cancel()
		case <-ctx.Done():
		}
	}()

	// Wait for the port to accept connections before using go-redis,
	// which logs dial errors and retries them with backoff.
	err := poll(ctx, func() error { return dialOnce(ctx, "tcp", s.addr) })
	if err == nil {
		// go-redis does not abandon a read when ctx is canceled, so the
		// probe's short timeout bounds how late an exit is noticed.
		c := adminClient(s.addr, probeTimeout)
		defer c.Close()
		err = poll(ctx, func() error { return s.probe(ctx, c) })
	}
	select {
	case <-s.exited:
		return fmt.Errorf("redis-server on %s: %w", s.addr, s.exitError())
	default:
	}
	if err != nil {
		return fmt.Errorf("redis-server on %s: not ready: %w", s.addr, err)
	}
	return nil
}

// probe returns nil if the server at the other end of c answers PING and
// is this one, not another that held the port.
func (s *server) probe(ctx context.Context, c *redis.Client) error {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if pid, ok := infoField(info, "process_id"); !ok || pid != strconv.Itoa(s.cmd.Process.Pid) {
		return fmt.Errorf("%w: a server with process_id %q answers", errPortTaken, pid)
	}
	return c.Ping(ctx).Err()
}

// exitError describes the exit of a server that ended early. Call it only
// after s.exited is closed.
func (s *server) exitError() error {
	out := s.out.String()
	err := fmt.Errorf("redis-server exited (%v); its output ends:\n%s", s.err, out)
	if strings.Contains(out, "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// stop sends SIGTERM to the server, kills it if it has not exited after 5s,
// and returns once it has exited. It returns an error only if the server had
// to be killed.
func (s *server) stop() error {
	select {
	case <-s.exited:
		return nil // exited by itself, e.g. on SHUTDOWN from a test
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.exited:
		return nil
	case <-timer.C:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("redis-server on %s ignored SIGTERM for %v and was killed; its output ends:\n%s",
		s.addr, stopTimeout, s.out.String())
}

// dialOnce returns nil if a connection to addr can be opened within 100ms,
// and closes it.
func dialOnce(ctx context.Context, network, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// infoField returns the value of field in the output of INFO.
func infoField(info, field string) (string, bool) {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v, true
		}
	}
	return "", false
}

// splitAddr splits "host:port" for CLUSTER MEET.
func splitAddr(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("address %q: %w", addr, err)
	}
	return host, port, nil
}

// A tailBuffer keeps the last max bytes written to it. It is safe for
// concurrent use.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p, dropping the oldest bytes beyond the limit.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

// String returns the bytes kept.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
