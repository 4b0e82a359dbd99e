package natsconn

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/natstest"
)

func TestConnectRegionAndDrain(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	var logs syncBuffer
	c, err := Connect(srv.ClientURL(), "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ServedRegion("eu"); got != "eu" {
		t.Fatalf("explicit region = %q", got)
	}
	if got, _ := c.ServedRegion(""); got != "local" {
		t.Fatalf("region of a server without a cluster = %q, want local", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Drain(ctx); err != nil || !c.IsClosed() {
		t.Fatalf("Drain: %v, closed %v", err, c.IsClosed())
	}
	if err := c.Drain(ctx); err != nil {
		t.Fatalf("second Drain: %v", err)
	}
	// A connection closed on purpose was not lost: nothing to warn about.
	if out := logs.String(); out != "" {
		t.Fatalf("draining logged %q", out)
	}
	if _, err := Connect("nats://127.0.0.1:1", "test", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("connected to nothing")
	}
}

// syncBuffer is a bytes.Buffer safe for nats.go's callback goroutine and
// the test.
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

func TestNewLogger(t *testing.T) {
	var out bytes.Buffer
	log, err := NewLogger(&out, "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("quiet")
	log.Warn("loud")
	if bytes.Contains(out.Bytes(), []byte("quiet")) || !bytes.Contains(out.Bytes(), []byte("loud")) {
		t.Fatalf("warn logger wrote %q", out.String())
	}
	if _, err := NewLogger(&out, "chatty"); err == nil {
		t.Fatal("a bad level was accepted")
	}
}
