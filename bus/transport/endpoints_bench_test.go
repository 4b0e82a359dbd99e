package transport

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// benchRequest is a micro.Request as the check endpoint sees one; replies go
// to a subject nobody listens on.
type benchRequest struct {
	subject, reply string
	data           []byte
	nc             *nats.Conn
}

func (r *benchRequest) Respond(b []byte, _ ...micro.RespondOpt) error {
	return r.nc.Publish(r.reply, b)
}
func (r *benchRequest) RespondJSON(any, ...micro.RespondOpt) error { return nil }
func (r *benchRequest) Error(string, string, []byte, ...micro.RespondOpt) error {
	return nil
}
func (r *benchRequest) Data() []byte           { return r.data }
func (r *benchRequest) Headers() micro.Headers { return nil }
func (r *benchRequest) Subject() string        { return r.subject }
func (r *benchRequest) Reply() string          { return r.reply }

// BenchmarkHandleCheck measures the check endpoint's work per request over
// 1000 warm identifiers, as its callback does it (without micro's own
// share): "check" with the reply queued to the replier, which publishes it
// to a real server from its own goroutine, "check-no-reply" without a reply
// (decode, decision, encode), and "echo", the reply publish alone as an
// echo responder does it from its callback.
func BenchmarkHandleCheck(b *testing.B) {
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	reqs := make([]*benchRequest, 1000)
	for i := range reqs {
		reqs[i] = &benchRequest{subject: "ratelimit.check.bench.api", reply: "_INBOX.nobody." + strconv.Itoa(i), nc: nc,
			data: wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: "user_" + strconv.Itoa(100000+i), Limit: window.MaxLimit, Duration: 60_000, Cost: 1})}
		if _, err := svc.Check(context.Background(), service.Query{Workspace: "bench", Namespace: "api", Identifier: "user_" + strconv.Itoa(100000+i), Limit: window.MaxLimit, Duration: 60_000, Cost: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.handleCheck(reqs[i%len(reqs)])
			i++
		}
	})
	b.Run("check-no-reply", func(b *testing.B) {
		quiet := make([]*benchRequest, len(reqs))
		for i, r := range reqs {
			q := *r
			q.reply = ""
			quiet[i] = &q
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.handleCheck(quiet[i%len(quiet)])
			i++
		}
	})
	b.Run("echo", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r := reqs[i%len(reqs)]
			_ = r.Respond(r.Data())
			i++
		}
	})
	if s := l.Stats(); s.AsyncChecks != 0 {
		b.Fatalf("%d checks went async", s.AsyncChecks)
	}
}

// BenchmarkCheckRoundTrip is one client's round trip for one check at a
// time through an embedded server to a limiter, next to the same round trip
// to a bare echo responder: the latency a lone request sees.
func BenchmarkCheckRoundTrip(b *testing.B) {
	srv := natstest.Server(b)
	lc := natstest.Connect(b, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(lc, LimiterConfig{Service: svc, Region: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	if _, err := lc.Subscribe("echo.bench", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		b.Fatal(err)
	}
	if err := lc.Flush(); err != nil { // the server holds both subscriptions
		b.Fatal(err)
	}
	nc := natstest.Connect(b, srv)
	body := wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: "user_100000", Limit: window.MaxLimit, Duration: 60_000, Cost: 1})
	for _, subject := range []string{"ratelimit.check.bench.api", "echo.bench"} {
		b.Run(subject, func(b *testing.B) {
			for b.Loop() {
				if _, err := nc.Request(subject, body, time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
