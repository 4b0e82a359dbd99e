package natslimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/natslimit"
	"github.com/sluicehq/sluice/service"
)

// exampleConf is the example's nats-server configuration: the accounts
// SLUICE (limiters), greeter (the service), acme (importing greet.> with
// share: true) and globex (without).
const exampleConf = "../examples/nats-service/nats.conf"

// world is the example's nats-server, started from exampleConf on a free
// port.
type world struct {
	srv       *server.Server
	passwords map[string]string // user → password, as the config defines them
}

func startWorld(t testing.TB) *world {
	t.Helper()
	opts, err := server.ProcessConfigFile(exampleConf)
	if err != nil {
		t.Fatal(err)
	}
	opts.HTTPPort = 0
	w := &world{passwords: map[string]string{}}
	for _, u := range opts.Users {
		w.passwords[u.Username] = u.Password
	}
	w.srv = natstest.StartSecuredServer(t, opts)
	return w
}

// connect connects as user, with the password of the config.
func (w *world) connect(t testing.TB, user string) *nats.Conn {
	t.Helper()
	pw, ok := w.passwords[user]
	if !ok {
		t.Fatalf("no user %q in %s", user, exampleConf)
	}
	nc, err := nats.Connect(w.srv.ClientURL(), nats.UserInfo(user, pw), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// limiter is a Sluice limiter in this process (memory origin), connected
// as the user limiter of SLUICE.
type limiter struct {
	svc  *service.Service
	lim  *transport.Limiter
	once sync.Once
}

// startLimiter serves checks with the clock now (nil: the system's) until
// stop or the test's end.
func (w *world) startLimiter(t testing.TB, now func() time.Time) *limiter {
	t.Helper()
	nc := w.connect(t, "limiter")
	svc := service.New(service.Config{Region: "us", Now: now})
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "us"})
	if err != nil {
		t.Fatal(err)
	}
	l := &limiter{svc: svc, lim: lim}
	t.Cleanup(func() { l.stop(t) })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// stop shuts the limiter down, once: its endpoints leave, so checks find
// no responders.
func (l *limiter) stop(t testing.TB) {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.lim.Shutdown(ctx); err != nil {
			t.Errorf("limiter shutdown: %v", err)
		}
		if err := l.svc.Close(ctx); err != nil {
			t.Errorf("service close: %v", err)
		}
	})
}

// greeter is the example's service account side: a connection as the
// user greeter, its Sluice client, and a micro service to add endpoints
// to.
type greeter struct {
	nc     *nats.Conn
	client *bus.Client
	svc    micro.Service
}

func (w *world) startGreeter(t testing.TB) *greeter {
	t.Helper()
	nc := w.connect(t, "greeter")
	svc, err := micro.AddService(nc, micro.Config{Name: "greeter", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return &greeter{nc: nc, client: bus.NewClient(nc, bus.WithTimeout(2*time.Second)), svc: svc}
}

// middleware returns a Middleware of the greeter's workspace over its
// client, with cfg's other fields.
func (g *greeter) middleware(t testing.TB, cfg natslimit.Config) *natslimit.Middleware {
	t.Helper()
	cfg.Checker, cfg.Workspace = g.client, "greeter"
	m, err := natslimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// endpoint adds a micro endpoint on subject answering "ok", behind m (none
// when m is nil), and waits until the server has its interest.
func (g *greeter) endpoint(t testing.TB, name, subject string, m *natslimit.Middleware) {
	t.Helper()
	var h micro.Handler = micro.HandlerFunc(func(req micro.Request) { _ = req.Respond([]byte("ok")) })
	if m != nil {
		h = m.Handler(h)
	}
	if err := g.svc.AddEndpoint(name, h, micro.WithEndpointSubject(subject)); err != nil {
		t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// request sends a request with no body from nc and returns the reply.
func request(t testing.TB, nc *nats.Conn, subject string) *nats.Msg {
	t.Helper()
	msg, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	return msg
}
