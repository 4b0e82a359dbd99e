package natstest

import (
	"context"
	"testing"

	natsgo "github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/nats/embedded"
)

// Server starts a single nats-server for tb (StartServer), shut down at
// tb's end; it fails tb if the server does not start.
func Server(tb testing.TB) *embedded.Server {
	tb.Helper()
	srv, err := StartServer(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	return srv
}

// Connect connects to srv with opts for tb, closed at tb's end; it fails
// tb if the connection fails.
func Connect(tb testing.TB, srv *embedded.Server, opts ...natsgo.Option) *natsgo.Conn {
	tb.Helper()
	nc, err := natsgo.Connect(srv.ClientURL(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}
