package embedded

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

// testContext returns a context that bounds one test's waiting.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStartOnABusyPortFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	e, err := Start(testContext(t), l.Addr().String())
	if err == nil {
		e.Shutdown()
		t.Fatal("Start on a busy port succeeded")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("error %q does not mention %q", err, "address already in use")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error %q does not wrap EADDRINUSE", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q spans several lines", err)
	}
}

func TestStartRefusesInvalidAddresses(t *testing.T) {
	for _, listen := range []string{"", "4222", "127.0.0.1:http", "127.0.0.1:70000"} {
		if e, err := Start(testContext(t), listen); err == nil {
			e.Shutdown()
			t.Errorf("Start(%q) succeeded", listen)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if e, err := Start(ctx, "127.0.0.1:0"); !errors.Is(err, context.Canceled) {
		if e != nil {
			e.Shutdown()
		}
		t.Errorf("Start with a canceled context: err = %v, want context.Canceled", err)
	}
}

func TestStartConfig(t *testing.T) {
	e, err := StartConfig(testContext(t), Config{
		Listen:      ":0",
		ServerName:  "edge-1",
		ClusterName: "edge",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	if got := e.Server().Name(); got != "edge-1" {
		t.Errorf("server name = %q, want %q", got, "edge-1")
	}
	if got := e.Server().ClusterName(); got != "edge" {
		t.Errorf("cluster name = %q, want %q", got, "edge")
	}
	if !strings.HasPrefix(e.ClientURL(), "nats://127.0.0.1:") {
		t.Errorf("ClientURL = %q, want a loopback URL", e.ClientURL())
	}
	nc, err := natsgo.Connect(e.ClientURL(), natsgo.NoReconnect())
	if err != nil {
		t.Fatalf("connect %s: %v", e.ClientURL(), err)
	}
	nc.Close()
}
