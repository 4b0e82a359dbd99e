package natsconn

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	sluicenats "github.com/sluicehq/sluice/nats"
)

func TestConnectRegionAndDrain(t *testing.T) {
	srv, err := sluicenats.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	c, err := Connect(srv.ClientURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Region("eu"); got != "eu" {
		t.Fatalf("explicit region = %q", got)
	}
	if got := c.Region(""); got != "local" {
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
	if _, err := Connect("nats://127.0.0.1:1", "test", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("connected to nothing")
	}
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
