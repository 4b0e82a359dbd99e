package natstest

import (
	"context"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/nats/embedded"
)

// testContext returns a context that bounds one test's waiting.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *natsgo.Conn {
	t.Helper()
	nc, err := natsgo.Connect(url, natsgo.NoReconnect())
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// respond subscribes nc to subj in queue group "q", replying with reply,
// and waits until the server has registered the subscription.
func respond(t *testing.T, nc *natsgo.Conn, subj, reply string) *natsgo.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribe(subj, "q", func(m *natsgo.Msg) {
		_ = m.Respond([]byte(reply))
	})
	if err != nil {
		t.Fatalf("subscribe %s: %v", subj, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return sub
}

// requestUntil repeats a request on subj from nc until the reply is want,
// failing the test if ctx ends first or if a reply is in bad.
func requestUntil(ctx context.Context, t *testing.T, nc *natsgo.Conn, subj, want string, bad ...string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		msg, err := nc.RequestWithContext(rctx, subj, nil)
		cancel()
		if err == nil {
			got := string(msg.Data)
			if got == want {
				return
			}
			for _, b := range bad {
				if got == b {
					t.Fatalf("request %s answered by %q, want %q", subj, got, want)
				}
			}
			last = "answered by " + got
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("request %s not answered by %q before deadline (last: %s)", subj, want, last)
		case <-tick.C:
		}
	}
}

func TestStartServerRequestReply(t *testing.T) {
	ctx := testContext(t)
	e, err := StartServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	if got := e.Server().Name(); got != embedded.DefaultServerName {
		t.Errorf("server name = %q, want %q", got, embedded.DefaultServerName)
	}

	nc := connect(t, e.ClientURL())
	if _, err := nc.Subscribe("echo", func(m *natsgo.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	msg, err := nc.RequestWithContext(ctx, "echo", []byte("hi"))
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if string(msg.Data) != "hi" {
		t.Errorf("reply = %q, want %q", msg.Data, "hi")
	}

	e.Shutdown()
	e.Shutdown() // idempotent
	if e.Server().Running() {
		t.Error("server still running after Shutdown")
	}
}

func startSupercluster(t *testing.T, ctx context.Context, regions ...string) *Supercluster {
	t.Helper()
	sc, err := StartSupercluster(ctx, regions...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Shutdown)
	return sc
}

func TestSuperclusterDefaults(t *testing.T) {
	sc := startSupercluster(t, testContext(t))
	if got := strings.Join(sc.Regions(), ","); got != "us,eu,ap" {
		t.Errorf("Regions() = %s, want us,eu,ap", got)
	}
	for _, r := range sc.Regions() {
		s := sc.Server(r)
		if s == nil || s.ClusterName() != r {
			t.Errorf("region %q: server %v, want cluster named %q", r, s, r)
		}
		if n := s.NumOutboundGateways(); n != 2 {
			t.Errorf("region %q: %d outbound gateways, want 2", r, n)
		}
	}
	if sc.Server("nowhere") != nil || sc.ClientURL("nowhere") != "" {
		t.Error("unknown region returned a server or URL")
	}
	sc.StopRegion("nowhere") // no-op

	if _, err := StartSupercluster(t.Context(), "us", "us"); err == nil {
		t.Error("duplicate regions accepted")
	}
}

func TestSuperclusterCrossRegion(t *testing.T) {
	ctx := testContext(t)
	sc := startSupercluster(t, ctx, "us", "eu", "ap")

	respond(t, connect(t, sc.ClientURL("us")), "limits.check", "us")
	requestUntil(ctx, t, connect(t, sc.ClientURL("eu")), "limits.check", "us")
	requestUntil(ctx, t, connect(t, sc.ClientURL("ap")), "limits.check", "us")
}

func TestSuperclusterPrefersLocalQueueMember(t *testing.T) {
	ctx := testContext(t)
	sc := startSupercluster(t, ctx, "us", "eu", "ap")
	eu := connect(t, sc.ClientURL("eu"))

	// First make sure eu knows of the us member, so that answers from eu
	// below are a choice rather than the only option.
	respond(t, connect(t, sc.ClientURL("us")), "limits.check", "us")
	requestUntil(ctx, t, eu, "limits.check", "us")

	respond(t, connect(t, sc.ClientURL("eu")), "limits.check", "eu")
	for i := range 200 {
		msg, err := eu.RequestWithContext(ctx, "limits.check", nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if string(msg.Data) != "eu" {
			t.Fatalf("request %d answered by %q, want the local eu member", i, msg.Data)
		}
	}
}

func TestSuperclusterFailoverToRemoteQueueMember(t *testing.T) {
	ctx := testContext(t)
	sc := startSupercluster(t, ctx, "us", "eu", "ap")
	eu := connect(t, sc.ClientURL("eu"))

	respond(t, connect(t, sc.ClientURL("us")), "limits.check", "us")
	requestUntil(ctx, t, eu, "limits.check", "us")

	memberConn := connect(t, sc.ClientURL("eu"))
	member := respond(t, memberConn, "limits.check", "eu")
	requestUntil(ctx, t, eu, "limits.check", "eu", "us")

	if err := member.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := memberConn.Flush(); err != nil {
		t.Fatal(err)
	}
	requestUntil(ctx, t, eu, "limits.check", "us", "eu")

	// Stopping a region leaves the others serving each other.
	sc.StopRegion("ap")
	if sc.Server("ap").Running() {
		t.Error("ap still running after StopRegion")
	}
	requestUntil(ctx, t, eu, "limits.check", "us", "eu")
}
