package tcpproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// startEcho starts a TCP server on loopback that echoes what each connection
// sends and closes the connection at end of stream. It is stopped, and its
// goroutines awaited, at t.Cleanup.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("echo: listen: %v", err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = make(map[net.Conn]struct{})
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// startProxy starts a Proxy to target and closes it at t.Cleanup.
func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// dial connects to addr and closes the connection at t.Cleanup.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends msg on c and fails t unless the same bytes come back
// within 2s.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %q: %v", msg, err)
	}
	if string(got) != msg {
		t.Fatalf("read back %q, want %q", got, msg)
	}
}

// expectTimeout writes msg on c and fails t unless a read then times out
// after 100ms with nothing received.
func expectTimeout(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatalf("set read deadline: %v", err)
	}
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read = %d bytes, %v; want a timeout", n, err)
	}
}

// expectFailFast fails t unless writing msg to c, or reading afterwards,
// fails with something other than a timeout within 1s.
func expectFailFast(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	start := time.Now()
	if err := c.SetDeadline(start.Add(time.Second)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	_, err := io.WriteString(c, msg)
	if err == nil {
		_, err = c.Read(make([]byte, 64))
	}
	checkFailedFast(t, err, start)
}

// expectDialFailFast fails t unless dialing addr, writing msg and reading
// fails with something other than a timeout within 1s. The dial itself may
// fail, if the reset arrives before the handshake is complete.
func expectDialFailFast(t *testing.T, addr, msg string) {
	t.Helper()
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		checkFailedFast(t, err, start)
		return
	}
	defer c.Close()
	expectFailFast(t, c, msg)
}

func checkFailedFast(t *testing.T, err error, start time.Time) {
	t.Helper()
	var ne net.Error
	switch {
	case err == nil:
		t.Fatal("connection worked; want a failure")
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("timed out after %v; want an immediate failure", time.Since(start))
	}
}

// waitFor polls cond until it holds or 2s have passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPass(t *testing.T) {
	p := startProxy(t, startEcho(t))
	if p.Mode() != Pass {
		t.Fatalf("Mode() = %v, want Pass", p.Mode())
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	if n := p.Conns(); n != 1 {
		t.Errorf("Conns() = %d, want 1", n)
	}

	// A payload far larger than the queues, read while it is written.
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		werr <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %d bytes: %v", len(want), err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write %d bytes: %v", len(want), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("large payload came back altered")
	}
}

func TestEndOfStream(t *testing.T) {
	p := startProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	// The echo server sees the end of stream and closes; so must we.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after CloseWrite: %v, want EOF", err)
	}
	waitFor(t, "Conns() == 0", func() bool { return p.Conns() == 0 })
}

func TestDelay(t *testing.T) {
	const d = 100 * time.Millisecond
	p := startProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm-up")

	p.SetDelay(d)
	start := time.Now()
	roundTrip(t, c, "slow")
	// The delay applies in each direction.
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("round trip took %v with delay %v, want at least %v", rtt, d, 2*d)
	}

	// Chunks sent in quick succession keep their order.
	var want bytes.Buffer
	for i := range 20 {
		msg := string(rune('a' + i))
		want.WriteString(msg)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatalf("write: %v", err)
		}
		time.Sleep(time.Millisecond) // make separate chunks likely
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != want.String() {
		t.Fatalf("read %q, want %q", got, want.String())
	}

	p.SetDelay(0)
	start = time.Now()
	roundTrip(t, c, "fast")
	if rtt := time.Since(start); rtt >= d {
		t.Errorf("round trip took %v after SetDelay(0)", rtt)
	}
}

func TestBlackhole(t *testing.T) {
	p := startProxy(t, startEcho(t))
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")

	p.SetMode(Blackhole)
	if p.Mode() != Blackhole {
		t.Fatalf("Mode() = %v, want Blackhole", p.Mode())
	}
	expectTimeout(t, old, "lost")
	during := dial(t, p.Addr())
	expectTimeout(t, during, "lost too")
	if n := p.Conns(); n != 2 {
		t.Errorf("Conns() = %d while black-holed, want 2", n)
	}

	p.SetMode(Pass)
	// What was sent while black-holed is gone; new traffic flows, on the
	// old connection, on the one accepted while black-holed, and on a new
	// one.
	roundTrip(t, old, "after")
	roundTrip(t, during, "after too")
	roundTrip(t, dial(t, p.Addr()), "new")
}

func TestBlackholeDelaysEndOfStream(t *testing.T) {
	p := startProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")

	p.SetMode(Blackhole)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read while black-holed: %v, want a timeout", err)
	}

	p.SetMode(Pass)
	if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after Pass: %v, want EOF", err)
	}
}

func TestRefuse(t *testing.T) {
	p := startProxy(t, startEcho(t))
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")

	p.SetMode(Refuse)
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() = %d after Refuse, want 0", n)
	}
	expectFailFast(t, old, "open")
	expectDialFailFast(t, p.Addr(), "new")
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() = %d while refusing, want 0", n)
	}

	p.SetMode(Pass)
	roundTrip(t, dial(t, p.Addr()), "after")
}

func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close() // nothing listens there now

	p := startProxy(t, target)
	expectDialFailFast(t, p.Addr(), "anyone?")
	waitFor(t, "Conns() == 0", func() bool { return p.Conns() == 0 })
}

func TestStartBadTarget(t *testing.T) {
	if p, err := Start("no-port"); err == nil {
		_ = p.Close()
		t.Fatal("Start accepted a target without a port")
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	echo := startEcho(t)
	before := runtime.NumGoroutine()

	p, err := Start(echo)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// Connections in every state: idle, carrying a delayed chunk, and
	// black-holed with a pending end of stream.
	idle := dial(t, p.Addr())
	roundTrip(t, idle, "idle")
	delayed := dial(t, p.Addr())
	roundTrip(t, delayed, "delayed")
	p.SetDelay(time.Hour)
	if _, err := io.WriteString(delayed, "in flight"); err != nil {
		t.Fatal(err)
	}
	p.SetDelay(0)
	ended := dial(t, p.Addr())
	roundTrip(t, ended, "ended")
	p.SetMode(Blackhole)
	if err := ended.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Conns() == 3", func() bool { return p.Conns() == 3 })

	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() = %d after Close, want 0", n)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Error("Proxy still accepts connections after Close")
	}
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}
