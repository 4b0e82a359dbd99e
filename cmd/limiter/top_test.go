package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/internal/natstest"
)

// waitInterest waits until some subscriber of srv's global account wants
// subject.
func waitInterest(t *testing.T, srv *server.Server, subject string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !srv.GlobalAccount().SubscriptionInterest(subject) {
		if time.Now().After(deadline) {
			t.Fatalf("nobody subscribed to %s", subject)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A limiter started with --decision-events publishes its denials (and,
// with --decision-events-admissions 1, its admissions); "limiter top"
// counts them by identifier, denied first, and counts a malformed event
// apart without letting it change the table.
func TestLimiterTopShowsWhoIsDenied(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown) // after the limiter's cleanup: it stops first
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, "--nats-url", url, "--decision-events", "--decision-events-admissions", "1")
	waitServing(t, url)

	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"top", "--nats-url", url, "--workspace", "acme", "--for", "3s", "--json"}, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	waitInterest(t, srv.Server(), "ratelimit.decisions.acme.api")

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, id := range []string{"hot", "hot", "hot", "hot", "hot", "warm", "warm", "warm"} {
		if _, err := nc.Request("ratelimit.check.acme.api", []byte(`{"identifier":"`+id+`","limit":2,"duration":60000}`), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.Request("ratelimit.check.other.api", []byte(`{"identifier":"x","limit":0,"duration":60000}`), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("ratelimit.decisions.acme.api", []byte(`{"workspace":`)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("limiter top: exit %d, stderr %q", r.code, r.err)
	}
	var got topOutput
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.out)), &got); err != nil {
		t.Fatalf("limiter top printed %q: %v", r.out, err)
	}
	want := topOutput{Events: 8, Malformed: 1, Top: []topRow{
		{Workspace: "acme", Namespace: "api", Identifier: "hot", Denied: 3, Admitted: 2, Limit: 2, RetryAfter: got.Top[0].RetryAfter},
		{Workspace: "acme", Namespace: "api", Identifier: "warm", Denied: 1, Admitted: 2, Limit: 2, RetryAfter: got.Top[1].RetryAfter},
	}}
	if len(got.Top) != 2 || got.Events != want.Events || got.Malformed != want.Malformed || got.Top[0] != want.Top[0] || got.Top[1] != want.Top[1] {
		t.Fatalf("limiter top saw %+v, want %+v", got, want)
	}
	if got.Top[0].RetryAfter <= 0 {
		t.Errorf("the last denial's retry_after is %d, want > 0", got.Top[0].RetryAfter)
	}
}

// With --decision-events-jetstream the limiter creates the stream and the
// events are kept in it; without JetStream on the server it refuses to
// start, saying why.
func TestDecisionEventsAreKeptInJetStream(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown) // after the limiter's cleanup: it stops first
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	url := srv.ClientURL()
	serveInBackground(t, io.Discard, "--nats-url", url, "--decision-events", "--decision-events-jetstream")
	waitServing(t, url)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 4 { // limit 1: three denials
		if _, err := nc.Request("ratelimit.check.acme.api", []byte(`{"identifier":"k","limit":1,"duration":60000}`), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := js.Stream(context.Background(), transport.DecisionStreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream holds %d events, want the 3 denials", info.State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}

	plain, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Shutdown()
	code, _, errs := runFor(t, 20*time.Second, "serve", "--nats-url", plain.ClientURL(), "--decision-events", "--decision-events-jetstream")
	if code == 0 || !strings.Contains(errs, "SLUICE_DECISIONS") {
		t.Fatalf("without JetStream: exit %d, stderr %q; want a refusal naming the stream", code, errs)
	}
}
