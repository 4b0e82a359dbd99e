package bus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	sluicenats "github.com/sluicehq/sluice/nats"
	"github.com/sluicehq/sluice/service"
)

// A check that reaches a limiter after shutdown began is answered 503, not
// decided and not dropped.
func TestChecksAfterShutdownBeganAre503(t *testing.T) {
	srv, err := sluicenats.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	l.closing.Store(true) // as Shutdown does before it drains the endpoints
	for _, subject := range []string{"ratelimit.check.acme.api", "ratelimit.batch.acme"} {
		reply, err := nc.Request(subject, []byte(`{"identifier":"u","limit":1,"duration":60000}`), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != "503" {
			t.Fatalf("%s while shutting down: code %q, want 503", subject, code)
		}
	}
	if !l.closing.Load() || l.startAsync() {
		t.Fatal("an asynchronous check could start after shutdown began")
	}
}
