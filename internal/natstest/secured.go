package natstest

import (
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
)

// StartSecuredServer starts a single nats-server on a random loopback port
// with opts (its authentication or TLS settings; host, port, logging and
// signals are set here), shut down at t.Cleanup, and returns it once it is
// ready for connections. It fails the test if the server does not start
// within 5s.
func StartSecuredServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = loopback, -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("natstest: nats-server not ready within 5s")
	}
	return s
}
