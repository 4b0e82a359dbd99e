package bus_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// The golden-bytes test of the client wire: every message that crosses NATS
// between a requester and a limiter (subject, reply subject, headers, body),
// for the Go client in both encodings and for raw requests as another
// language's client sends them, compared byte for byte with
// testdata/golden. A change to what clients see fails it; go test
// ./bus -run TestWireBytesAreGolden -update writes the files again (read
// the diff before committing it).
//
// How the bytes are caught: a tap connection subscribes to the subjects the
// limiter serves and to _INBOX.>, all into one channel, so it holds the
// messages in the order its read loop got them; the file writes each
// request followed by its reply. It does not subscribe to '>': a
// subscriber on a subject nobody serves would take away NATS's
// no-responders reply, which is itself part of what a client sees (the
// unknown-operation case records that reply at the requester, since NATS
// sends it to the requester alone). The test lives in bus's external test
// package because the coalesced case needs bus.Queued (export_test.go) to
// know that each call waits in the queue before the next one is made, so
// that the checks message holds them in a fixed order.
//
// What is normalised, because it is random by nature: the second token of
// an inbox subject (the connection's nuid), written {nuid}, and the 8
// characters nats.go appends to its request inbox for each request, written
// {token}. The coalescing client's reply subjects end with its own counter,
// kept as it is. No header value is random: none is dropped. Everything
// else is fixed: the limiter's clock (goldenNow), a fresh server, limiter
// and client for each case, and every call made one after another.

var updateGolden = flag.Bool("update", false, "rewrite the golden files of TestWireBytesAreGolden")

// goldenNow is the limiter's clock in every case: 30.25 s into a minute,
// so a 60 s window resets at 1795290360000, as in the README's examples.
var goldenNow = time.UnixMilli(1795290330250)

// goldenDir holds one file per case.
const goldenDir = "testdata/golden"

// tapSubjects are the subjects a client sends to and receives replies on.
var tapSubjects = []string{
	markerSubject,
	"ratelimit.check.*.*",
	"ratelimit.batch.*",
	"ratelimit.checks.*",
	"ratelimit.admin.*.override.set",
	"ratelimit.admin.*.override.get",
	"ratelimit.admin.*.override.delete",
	"ratelimit.admin.*.override.list",
	"ratelimit.admin.*.reset",
	"_INBOX.>",
}

// wireMsg is one message as it crossed NATS.
type wireMsg struct {
	subject, reply string
	header         nats.Header
	data           []byte
	note           string // how it was caught, when not by the tap
}

// wireRig is one case's world: an embedded NATS server, a limiter on the
// in-memory origin with a fixed clock, a tap, and the requester's
// connection nc (Go clients and raw requests alike).
type wireRig struct {
	t     *testing.T
	url   string
	nc    *nats.Conn
	tap   chan *nats.Msg
	mux   string // nc's request-inbox prefix, "_INBOX.<nuid>."
	msgs  []wireMsg
	round int // drains so far
	relay *goldenRelay
}

func newWireRig(t *testing.T) *wireRig {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()
	svc := service.New(service.Config{Now: func() time.Time { return goldenNow }})
	startLimiterAt(t, url, "ratelimit", svc)

	r := &wireRig{t: t, url: url, tap: make(chan *nats.Msg, 8192)}
	tc := connect(t, url)
	for _, s := range tapSubjects {
		if _, err := tc.ChanSubscribe(s, r.tap); err != nil {
			t.Fatal(err)
		}
	}
	if err := tc.Flush(); err != nil {
		t.Fatal(err)
	}
	r.nc = connect(t, url)
	in := r.nc.NewRespInbox() // the prefix, and 8 random characters each request replaces
	r.mux = in[:len(in)-8]
	return r
}

// client returns a Go client on the rig's connection.
func (r *wireRig) client(opts ...bus.ClientOption) *bus.Client { return bus.NewClient(r.nc, opts...) }

// markerSubject carries the drain's markers: not a subject of the
// contract, and never recorded.
const markerSubject = "golden.marker"

// drain collects what the tap caught: it publishes a marker on every
// connection that sent requests, after which the tap has every request
// they sent (NATS keeps one connection's messages in order), and waits for
// each marker and for the reply to every request caught (every call of a
// case has returned by then, so each reply is on its way to the tap).
func (r *wireRig) drain() {
	r.t.Helper()
	conns := []*nats.Conn{r.nc}
	if r.relay != nil {
		conns = append(conns, r.relay.nc)
	}
	r.round++
	for i, nc := range conns {
		if err := nc.Publish(markerSubject, fmt.Appendf(nil, "%d/%d", r.round, i)); err != nil {
			r.t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			r.t.Fatal(err)
		}
	}
	markers := len(conns)
	deadline := time.After(5 * time.Second)
	for {
		open := map[string]bool{}
		for _, m := range r.msgs {
			if m.reply != "" {
				open[m.reply] = true
			}
		}
		for _, m := range r.msgs {
			delete(open, m.subject)
		}
		if markers == 0 && len(open) == 0 {
			return
		}
		select {
		case m := <-r.tap:
			if m.Subject == markerSubject {
				if strings.HasPrefix(string(m.Data), fmt.Sprintf("%d/", r.round)) {
					markers--
				}
				continue
			}
			r.msgs = append(r.msgs, wireMsg{subject: m.Subject, reply: m.Reply, header: m.Header, data: m.Data})
		case <-deadline:
			r.t.Fatalf("the tap caught %d markers of %d and no reply to %d requests", len(conns)-markers, len(conns), len(open))
		}
	}
}

// ordered returns the messages as exchanges: each request (in the order
// the tap caught them: one connection's, one after another) followed by
// its reply. The tap may catch a reply before the request it answers when
// the two come from different connections, which says nothing about the
// wire.
func (r *wireRig) ordered() []wireMsg {
	r.t.Helper()
	var out []wireMsg
	replies := map[string]wireMsg{}
	for _, m := range r.msgs {
		if m.reply == "" {
			if _, dup := replies[m.subject]; dup {
				r.t.Fatalf("two replies on %s", m.subject)
			}
			replies[m.subject] = m
		}
	}
	for _, m := range r.msgs {
		if m.reply == "" {
			continue
		}
		out = append(out, m)
		if rep, ok := replies[m.reply]; ok {
			out = append(out, rep)
			delete(replies, m.reply)
		}
	}
	if len(replies) > 0 {
		r.t.Fatalf("%d replies to no request caught", len(replies))
	}
	return out
}

// request sends a raw request, as a client in another language does, and
// returns the reply.
func (r *wireRig) request(subject string, header nats.Header, body []byte) *nats.Msg {
	r.t.Helper()
	m, err := r.nc.RequestMsg(&nats.Msg{Subject: subject, Header: header, Data: body}, 5*time.Second)
	if err != nil {
		r.t.Fatalf("request %s: %v", subject, err)
	}
	return m
}

// noResponders sends a raw request to a subject nobody serves and records
// it and NATS's reply as the requester sees them: NATS answers it to the
// requester alone.
func (r *wireRig) noResponders(subject string, header nats.Header, body []byte) {
	r.t.Helper()
	r.drain()
	inbox := r.nc.NewInbox()
	got := make(chan *nats.Msg, 1) // not SubscribeSync, whose NextMsg turns this reply into an error
	sub, err := r.nc.ChanSubscribe(inbox, got)
	if err != nil {
		r.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	req := &nats.Msg{Subject: subject, Reply: inbox, Header: header, Data: body}
	if err := r.nc.PublishMsg(req); err != nil {
		r.t.Fatal(err)
	}
	var m *nats.Msg
	select {
	case m = <-got:
	case <-time.After(5 * time.Second):
		r.t.Fatalf("no reply to %s", subject)
	}
	const note = "recorded at the requester: NATS answers no responders to it alone"
	r.msgs = append(r.msgs, wireMsg{subject: subject, reply: inbox, header: header, data: body, note: note},
		wireMsg{subject: m.Subject, reply: m.Reply, header: m.Header, data: m.Data, note: note})
}

// goldenRelay stands between a coalescing client (subject prefix "gate")
// and the limiter: it holds each message until the case forwards it, then
// publishes it unchanged (header, body, the client's own reply subject)
// on the limiter's prefix, so the limiter answers the client directly.
type goldenRelay struct {
	nc   *nats.Conn
	held chan *nats.Msg
}

func (r *wireRig) startRelay() *goldenRelay {
	r.t.Helper()
	g := &goldenRelay{nc: connect(r.t, r.url), held: make(chan *nats.Msg, 64)}
	if _, err := g.nc.ChanSubscribe("gate.>", g.held); err != nil {
		r.t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
	r.relay = g
	return g
}

// next returns the next message that reached the relay.
func (g *goldenRelay) next(t *testing.T) *nats.Msg {
	t.Helper()
	select {
	case m := <-g.held:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no message reached the relay")
		return nil
	}
}

// forward passes m on to the limiter.
func (g *goldenRelay) forward(t *testing.T, m *nats.Msg) {
	t.Helper()
	fwd := &nats.Msg{Subject: "ratelimit." + strings.TrimPrefix(m.Subject, "gate."), Reply: m.Reply, Header: m.Header, Data: m.Data}
	if err := g.nc.PublishMsg(fwd); err != nil {
		t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// normalise writes an inbox subject's random parts as placeholders.
func (r *wireRig) normalise(s string) string {
	if !strings.HasPrefix(s, "_INBOX.") {
		return s
	}
	if strings.HasPrefix(s, r.mux) && len(s) == len(r.mux)+8 {
		return "_INBOX.{nuid}.{token}"
	}
	_, rest, _ := strings.Cut(s[len("_INBOX."):], ".")
	if rest == "" {
		return "_INBOX.{nuid}"
	}
	return "_INBOX.{nuid}." + rest
}

// render writes the case's messages in the golden format.
func (r *wireRig) render(name, doc string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n", name)
	for _, l := range strings.Split(doc, "\n") {
		fmt.Fprintf(&b, "# %s\n", l)
	}
	b.WriteString("# Written by TestWireBytesAreGolden (bus/golden_test.go); every byte below is compared.\n")
	msgs := r.ordered()
	if len(msgs) == 0 {
		b.WriteString("\n(no message crossed NATS)\n")
	}
	for i, m := range msgs {
		kind := "request"
		if strings.HasPrefix(m.subject, "_INBOX.") {
			kind = "reply"
		}
		fmt.Fprintf(&b, "\n=== %d %s\n", i+1, kind)
		if m.note != "" {
			fmt.Fprintf(&b, "note: %s\n", m.note)
		}
		fmt.Fprintf(&b, "subject: %s\n", r.normalise(m.subject))
		if m.reply != "" {
			fmt.Fprintf(&b, "reply: %s\n", r.normalise(m.reply))
		}
		keys := make([]string, 0, len(m.header))
		for k := range m.header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			for _, v := range m.header[k] {
				fmt.Fprintf(&b, "header: %s: %s\n", k, v)
			}
		}
		renderBody(&b, m.data)
	}
	return b.Bytes()
}

// bigBody is the size past which a body is written as its length, digest
// and first bytes: only raw requests built to be too large are.
const bigBody = 16 << 10

// renderBody writes a body: printable UTF-8 (JSON) as it is on one line,
// anything else (msgpack) as hex, 32 bytes a line, followed by msgpack's
// JSON reading of it for the reader.
func renderBody(b *bytes.Buffer, data []byte) {
	switch {
	case len(data) == 0:
		b.WriteString("body: empty\n")
	case len(data) > bigBody:
		sum := sha256.Sum256(data)
		fmt.Fprintf(b, "body: %d bytes, sha256 %x, starting\n", len(data), sum)
		renderBody(b, data[:64])
	case printable(data):
		fmt.Fprintf(b, "body: text, %d bytes\n%s\n", len(data), data)
	default:
		fmt.Fprintf(b, "body: hex, %d bytes\n", len(data))
		for p := data; len(p) > 0; {
			n := min(len(p), 32)
			fmt.Fprintf(b, "%x\n", p[:n])
			p = p[n:]
		}
		var j bytes.Buffer
		rest, err := msgp.UnmarshalAsJSON(&j, data)
		switch {
		case err != nil:
			fmt.Fprintf(b, "# msgpack read as JSON: none (%v)\n", err)
		case len(rest) > 0:
			fmt.Fprintf(b, "# msgpack read as JSON: %s, then %d bytes more\n", j.Bytes(), len(rest))
		default:
			fmt.Fprintf(b, "# msgpack read as JSON: %s\n", j.Bytes())
		}
	}
}

// printable reports whether data is UTF-8 text without control characters,
// which a line of the golden file holds exactly.
func printable(data []byte) bool {
	if !utf8.Valid(data) {
		return false
	}
	for _, c := range string(data) {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// goldenCase is one exchange; run drives it.
type goldenCase struct {
	name, doc string
	run       func(t *testing.T, r *wireRig)
}

func TestWireBytesAreGolden(t *testing.T) {
	cases := slices.Concat(clientCases(bus.Msgpack, "msgpack"), clientCases(bus.JSON, "json"), rawCases())
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Fatalf("two cases named %s", c.name)
		}
		seen[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			r := newWireRig(t)
			c.run(t, r)
			r.drain()
			got := r.render(c.name, c.doc)
			path := filepath.Join(goldenDir, filepath.FromSlash(c.name)+".golden")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the wire differs from %s:\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
	// A golden file no case writes is stale (checked when every case ran).
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		return
	}
	_ = filepath.WalkDir(goldenDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := filepath.ToSlash(strings.TrimSuffix(strings.TrimPrefix(path, goldenDir+string(filepath.Separator)), ".golden"))
		if !seen[name] {
			if *updateGolden {
				return os.Remove(path)
			}
			t.Errorf("%s: no case writes it (run with -update to remove it)", path)
		}
		return nil
	})
}

// lineDiff names the first lines where want and got differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 8; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d\n  want: %s\n  got:  %s\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}

// must fails t on a transport error; a limiter's error reply is an
// expected outcome only where want400 says so.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// want400 fails t unless err is a limiter's 400 reply.
func want400(t *testing.T, err error) {
	t.Helper()
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 400 {
		t.Fatalf("got %v, want a 400 reply", err)
	}
}

// clientCases drive the Go client in enc; name is enc's name in the cases'
// names.
func clientCases(enc bus.Encoding, name string) []goldenCase {
	ctx := context.Background()
	// single is a client that sends every Check on its own, with a header.
	single := func(r *wireRig) *bus.Client {
		return r.client(bus.WithEncoding(enc), bus.WithCoalescing(false))
	}
	check := func(t *testing.T, c *bus.Client, ns string, q bus.CheckRequest) bus.CheckResponse {
		t.Helper()
		resp, err := c.Check(ctx, "acme", ns, q)
		must(t, err)
		return resp
	}
	user := func(q bus.CheckRequest) bus.CheckRequest {
		q.Identifier, q.Duration = "user-42", 60_000
		if q.Limit == 0 {
			q.Limit = 100
		}
		return q
	}
	set := func(t *testing.T, c *bus.Client, o bus.Override) {
		t.Helper()
		_, err := c.SetOverride(ctx, "acme", o)
		must(t, err)
	}
	userStar := bus.Override{Namespace: "api", Identifier: "user_*", Limit: 10, Duration: 60_000}
	orgAdmin := bus.Override{Namespace: "api", Identifier: "org:*:admin", Limit: 5, Duration: 60_000, Shadow: true}
	other := bus.Override{Namespace: "web", Identifier: "*", Limit: 1000, Duration: 3_600_000}
	cases := []goldenCase{
		{"check-default-client", "bus.NewClient's defaults (coalescing on): a lone Check leaves at once on the check subject,\nwithout a header, replied to on the client's coalescing inbox.",
			func(t *testing.T, r *wireRig) {
				check(t, r.client(bus.WithEncoding(enc)), "api", user(bus.CheckRequest{}))
			}},
		{"check", "Check without coalescing: a zero Cost sends cost 1; Cost 5; Peek sends cost 0.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				check(t, c, "api", user(bus.CheckRequest{}))
				check(t, c, "api", user(bus.CheckRequest{Cost: 5}))
				check(t, c, "api", user(bus.CheckRequest{Peek: true}))
			}},
		{"check-denied", "Limit 2: two admitted, the third denied with a retry_after; a cost above the limit: retry_after -1.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				for range 3 {
					check(t, c, "api", user(bus.CheckRequest{Limit: 2}))
				}
				check(t, c, "api", user(bus.CheckRequest{Limit: 2, Cost: 3}))
			}},
		{"check-shadow", "Shadow: the first within the limit, the second answered success with shadow_denied.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				check(t, c, "api", user(bus.CheckRequest{Limit: 1, Shadow: true}))
				check(t, c, "api", user(bus.CheckRequest{Limit: 1, Shadow: true}))
			}},
		{"check-override", "A check under an override names its pattern; under a shadow override a denial is shadow_denied.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				set(t, c, userStar)
				set(t, c, orgAdmin)
				check(t, c, "api", bus.CheckRequest{Identifier: "user_42", Limit: 100, Duration: 60_000})
				check(t, c, "api", bus.CheckRequest{Identifier: "org:7:admin", Limit: 100, Duration: 60_000, Cost: 6})
			}},
		{"check-bad-request", "A limit out of range reaches the limiter (the client checks only tokens): a 400.",
			func(t *testing.T, r *wireRig) {
				_, err := single(r).Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "user-42", Limit: -5, Duration: 60_000})
				want400(t, err)
			}},
		{"client-refuses", "What the client refuses before sending: a bad workspace, a bad namespace, a peek with a cost.",
			func(t *testing.T, r *wireRig) {
				c := r.client(bus.WithEncoding(enc))
				var bad *bus.BadRequestError
				for _, err := range []error{
					func() error { _, err := c.Check(ctx, "ac me", "api", user(bus.CheckRequest{})); return err }(),
					func() error { _, err := c.Check(ctx, "acme", "a.b", user(bus.CheckRequest{})); return err }(),
					func() error {
						_, err := c.Check(ctx, "acme", "api", user(bus.CheckRequest{Peek: true, Cost: 1}))
						return err
					}(),
					func() error {
						_, err := c.Batch(ctx, "ac*me", []bus.BatchCheck{{Namespace: "api", CheckRequest: user(bus.CheckRequest{})}})
						return err
					}(),
				} {
					if !errors.As(err, &bad) {
						t.Fatalf("got %v, want a *BadRequestError", err)
					}
				}
			}},
		{"batch", "An admitted batch over two namespaces (a peek among them), then one refused: a check that can never pass.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				_, err := c.Batch(ctx, "acme", []bus.BatchCheck{
					{Namespace: "api", CheckRequest: user(bus.CheckRequest{})},
					{Namespace: "web", CheckRequest: bus.CheckRequest{Identifier: "10.0.0.1", Limit: 10, Duration: 1_000, Cost: 2}},
					{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "user-7", Limit: 5, Duration: 3_600_000, Peek: true, Shadow: true}},
				})
				must(t, err)
				_, err = c.Batch(ctx, "acme", []bus.BatchCheck{
					{Namespace: "api", CheckRequest: user(bus.CheckRequest{})},
					{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "user-8", Limit: 1, Duration: 60_000, Cost: 2}},
				})
				must(t, err)
			}},
		{"batch-bad-request", "A batch whose second check has an empty identifier: a 400, nothing counted.",
			func(t *testing.T, r *wireRig) {
				_, err := single(r).Batch(ctx, "acme", []bus.BatchCheck{
					{Namespace: "api", CheckRequest: user(bus.CheckRequest{})},
					{Namespace: "api", CheckRequest: bus.CheckRequest{Limit: 1, Duration: 60_000}},
				})
				want400(t, err)
			}},
		{"checks-coalesced", "Coalescing (at most 1 message in flight): the first call leaves alone on the check subject;\nfive calls made while it is out leave together in one checks message once it is answered.\nThe client's prefix is \"gate\" and a relay passes each message on unchanged under \"ratelimit\".",
			func(t *testing.T, r *wireRig) {
				g := r.startRelay()
				c := r.client(bus.WithEncoding(enc), bus.WithSubjectPrefix("gate"), bus.WithCoalesceLimits(100, 1))
				type out struct {
					resp bus.CheckResponse
					err  error
				}
				run := func(ns string, q bus.CheckRequest) chan out {
					o := make(chan out, 1)
					go func() {
						resp, err := c.Check(ctx, "acme", ns, q)
						o <- out{resp, err}
					}()
					return o
				}
				first := run("api", user(bus.CheckRequest{}))
				held := g.next(t)
				queued := []struct {
					ns string
					q  bus.CheckRequest
				}{
					{"api", user(bus.CheckRequest{Cost: 3})},
					{"web", bus.CheckRequest{Identifier: "10.0.0.1", Limit: 10, Duration: 1_000, Peek: true}},
					{"api", bus.CheckRequest{Limit: 1, Duration: 60_000}}, // no identifier: an error result
					{"api", bus.CheckRequest{Identifier: "user-9", Limit: 0, Duration: 60_000, Shadow: true}},
					{"api", bus.CheckRequest{Identifier: "user-8", Limit: 1, Duration: 60_000, Cost: 2}},
				}
				var outs []chan out
				for i, q := range queued {
					outs = append(outs, run(q.ns, q.q))
					waitQueued(t, c, i+1) // so the message holds them in this order
				}
				g.forward(t, held)
				if o := <-first; o.err != nil {
					t.Fatal(o.err)
				}
				msg := g.next(t)
				if msg.Subject != "gate.checks.acme" {
					t.Fatalf("the queued calls left on %s, want gate.checks.acme", msg.Subject)
				}
				g.forward(t, msg)
				for i, o := range outs {
					if res := <-o; (res.err != nil) != (i == 2) {
						t.Fatalf("queued call %d: %+v", i, res)
					}
				}
			}},
		{"override-set-get-delete", "Set an override (then one in shadow mode), get it, delete it; get and delete it again: 400s.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				set(t, c, userStar)
				set(t, c, orgAdmin)
				_, err := c.GetOverride(ctx, "acme", "api", "user_*")
				must(t, err)
				must(t, c.DeleteOverride(ctx, "acme", "api", "user_*"))
				_, err = c.GetOverride(ctx, "acme", "api", "user_*")
				want400(t, err)
				want400(t, c.DeleteOverride(ctx, "acme", "api", "user_*"))
			}},
		{"override-set-bad", "A pattern with ** and a limit out of range: 400s.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				_, err := c.SetOverride(ctx, "acme", bus.Override{Namespace: "api", Identifier: "user_**", Limit: 10, Duration: 60_000})
				want400(t, err)
				_, err = c.SetOverride(ctx, "acme", bus.Override{Namespace: "api", Identifier: "user_*", Limit: -1, Duration: 60_000})
				want400(t, err)
			}},
		{"override-list", "ListOverrides of every namespace (an empty body), of one namespace, and of a workspace with none.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				set(t, c, userStar)
				set(t, c, orgAdmin)
				set(t, c, other)
				_, err := c.ListOverrides(ctx, "acme", "")
				must(t, err)
				_, err = c.ListOverrides(ctx, "acme", "web")
				must(t, err)
				_, err = c.ListOverrides(ctx, "globex", "")
				must(t, err)
			}},
		{"override-list-pages", "ListOverridesPage with a limit of 2: a page and its next cursor, then the last page;\nListOverrides with pages of the default size; a bad cursor and a limit out of range: 400s.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				set(t, c, userStar)
				set(t, c, orgAdmin)
				set(t, c, other)
				_, next, err := c.ListOverridesPage(ctx, "acme", "", "", 2)
				must(t, err)
				_, _, err = c.ListOverridesPage(ctx, "acme", "", next, 2)
				must(t, err)
				_, _, err = c.ListOverridesPage(ctx, "acme", "", "not-a-cursor", 0)
				want400(t, err)
				_, _, err = c.ListOverridesPage(ctx, "acme", "api", "", 1001)
				want400(t, err)
			}},
		{"reset", "Reset of one duration, of every duration (0), and with a duration out of range: a 400.",
			func(t *testing.T, r *wireRig) {
				c := single(r)
				check(t, c, "api", user(bus.CheckRequest{}))
				_, err := c.Reset(ctx, "acme", "api", "user-42", 60_000)
				must(t, err)
				check(t, c, "api", user(bus.CheckRequest{}))
				_, err = c.Reset(ctx, "acme", "api", "user-42", 0)
				must(t, err)
				_, err = c.Reset(ctx, "acme", "api", "user-42", 5)
				want400(t, err)
			}},
	}
	for i := range cases {
		cases[i].name = "client-" + name + "/" + cases[i].name
		cases[i].doc = "The Go client (bus.Client), " + name + ".\n" + cases[i].doc
	}
	return cases
}

// The headers raw requests carry.
var (
	noHeader    nats.Header
	jsonHeader  = nats.Header{"Content-Type": {"application/json"}}
	mpackHeader = nats.Header{"Content-Type": {"application/msgpack"}}
)

// mp is a msgpack map written as @msgpack/msgpack (the TypeScript
// example's encoder) writes a JavaScript object: keys in order, strings as
// str, integers in their shortest form (unsigned when not negative).
type mp []any // key, value, key, value, ...

func (m mp) bytes() []byte { return appendMP(nil, m) }

func appendMP(b []byte, v any) []byte {
	switch v := v.(type) {
	case mp:
		b = msgp.AppendMapHeader(b, uint32(len(v)/2))
		for _, x := range v {
			b = appendMP(b, x)
		}
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(v)))
		for _, x := range v {
			b = appendMP(b, x)
		}
	case string:
		b = msgp.AppendString(b, v)
	case int:
		if v >= 0 {
			b = msgp.AppendUint64(b, uint64(v))
		} else {
			b = msgp.AppendInt64(b, int64(v))
		}
	case bool:
		b = msgp.AppendBool(b, v)
	case float64:
		b = msgp.AppendFloat64(b, v)
	case nil:
		b = msgp.AppendNil(b)
	case []byte: // already msgpack
		b = append(b, v...)
	default:
		panic(fmt.Sprintf("appendMP: %T", v))
	}
	return b
}

// rawCases send what a client in another language sends: the README's
// bodies, and the errors the contract names.
func rawCases() []goldenCase {
	const readmeCheck = `{"identifier":"user-42","limit":100,"duration":60000,"cost":1}`
	mpCheck := mp{"identifier", "user-42", "limit", 100, "duration", 60000, "cost", 1}.bytes()
	send := func(subject string, h nats.Header, body string) func(t *testing.T, r *wireRig) {
		return func(t *testing.T, r *wireRig) { r.request(subject, h, []byte(body)) }
	}
	seq := func(steps ...func(t *testing.T, r *wireRig)) func(t *testing.T, r *wireRig) {
		return func(t *testing.T, r *wireRig) {
			for _, s := range steps {
				s(t, r)
			}
		}
	}
	checkSubj := "ratelimit.check.acme.api"
	readmeChecks := `{"checks":[{"namespace":"api","identifier":"user-42","limit":100,"duration":60000},{"namespace":"api","identifier":"","limit":1,"duration":60000}]}`
	mpChecks := mp{"checks", []any{
		mp{"namespace", "api", "identifier", "user-42", "limit", 100, "duration", 60000},
		mp{"namespace", "api", "identifier", "", "limit", 1, "duration", 60000},
		mp{"namespace", "web", "identifier", "10.0.0.1", "limit", 10, "duration", 1000, "cost", 0, "shadow", true},
	}}.bytes()
	batchJSON := `{"checks":[{"namespace":"api","identifier":"user-42","limit":100,"duration":60000,"cost":1},{"namespace":"web","identifier":"10.0.0.1","limit":10,"duration":1000,"cost":2}]}`
	batchRefused := `{"checks":[{"namespace":"api","identifier":"user-42","limit":100,"duration":60000},{"namespace":"api","identifier":"user-8","limit":1,"duration":60000,"cost":2}]}`
	mpBatch := mp{"checks", []any{
		mp{"namespace", "api", "identifier", "user-42", "limit", 100, "duration", 60000, "cost", 1},
		mp{"namespace", "web", "identifier", "10.0.0.1", "limit", 10, "duration", 1000, "cost", 2},
	}}.bytes()
	manyChecks := func(n int, extra string) string {
		var b strings.Builder
		b.WriteString(`{"checks":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"namespace":"api","identifier":"user-%d%s","limit":100,"duration":60000}`, i, extra)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	set := `{"namespace":"api","identifier":"user_*","limit":10,"duration":60000}`
	setShadow := `{"namespace":"api","identifier":"org:*:admin","limit":5,"duration":60000,"shadow":true}`
	admin := func(op string) string { return "ratelimit.admin.acme." + op }
	big := strings.Repeat("x", 4097)

	return []goldenCase{
		// The check.
		{"raw/check-json", "The README's check, as `nats request` sends it: no header; then the same with Content-Type\napplication/json, and with a Content-Type in another case with a parameter.",
			seq(send(checkSubj, noHeader, readmeCheck), send(checkSubj, jsonHeader, readmeCheck),
				send(checkSubj, nats.Header{"Content-Type": {"Application/JSON; charset=utf-8"}}, readmeCheck))},
		{"raw/check-json-fields", "Every field of a check in JSON: a look (cost 0), shadow, a denial, a cost that can never pass.",
			seq(send(checkSubj, noHeader, `{"identifier":"u1","limit":2,"duration":60000,"cost":0}`),
				send(checkSubj, noHeader, `{"identifier":"u1","limit":1,"duration":60000,"shadow":true}`),
				send(checkSubj, noHeader, `{"identifier":"u1","limit":1,"duration":60000,"shadow":true}`),
				send(checkSubj, noHeader, `{"identifier":"u1","limit":1,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"u2","limit":0,"duration":60000}`),
				send(checkSubj, noHeader, ` {"duration":1000,"limit":1000000000000000,"identifier":"u3","cost":1000000000000000}`))},
		{"raw/check-msgpack", "The check in msgpack: Content-Type application/msgpack, x-msgpack, vnd.msgpack, and none.",
			func(t *testing.T, r *wireRig) {
				for _, h := range []nats.Header{mpackHeader, {"Content-Type": {"application/x-msgpack"}}, {"Content-Type": {"application/vnd.msgpack"}}, noHeader} {
					r.request(checkSubj, h, mpCheck)
				}
			}},
		{"raw/check-msgpack-fields", "Every field of a check in msgpack: a look, shadow, a denial, never.",
			func(t *testing.T, r *wireRig) {
				for _, m := range []mp{
					{"identifier", "u1", "limit", 2, "duration", 60000, "cost", 0},
					{"identifier", "u1", "limit", 1, "duration", 60000, "shadow", true},
					{"identifier", "u1", "limit", 1, "duration", 60000, "shadow", true},
					{"identifier", "u1", "limit", 1, "duration", 60000},
					{"identifier", "u2", "limit", 0, "duration", 60000},
				} {
					r.request(checkSubj, mpackHeader, m.bytes())
				}
			}},
		{"raw/check-override", "A check under an override (set in JSON) names the override's pattern.",
			seq(send(admin("override.set"), noHeader, set),
				send(checkSubj, noHeader, `{"identifier":"user_42","limit":100,"duration":60000}`),
				func(t *testing.T, r *wireRig) {
					r.request(checkSubj, mpackHeader, mp{"identifier", "user_42", "limit", 100, "duration", 60000}.bytes())
				})},
		{"raw/check-errors-json", "400s of a JSON check: malformed, unknown field, limit out of range, no identifier,\na fraction, null, a repeated field, trailing bytes, a string for an integer, duration too short.",
			seq(send(checkSubj, noHeader, `{"identifier":"user-42","limit":100,`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":100,"duration":60000,"cots":1}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":-5,"duration":60000}`),
				send(checkSubj, noHeader, `{"limit":100,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":1.5,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":null,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":1,"limit":2,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":1,"duration":60000} x`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":"1","duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":1,"duration":999}`),
				send(checkSubj, jsonHeader, `[]`),
				send(checkSubj, noHeader, ``))},
		{"raw/check-errors-size", "400s for size: an identifier of 600 bytes, a body over 4,096 bytes.",
			seq(send(checkSubj, noHeader, `{"identifier":"`+strings.Repeat("i", 600)+`","limit":1,"duration":60000}`),
				send(checkSubj, noHeader, `{"identifier":"user-42","limit":1,"duration":60000,"pad":"`+big+`"}`))},
		{"raw/check-errors-msgpack", "400s of a msgpack check, answered in msgpack: not msgpack, unknown field, a float, out of range, trailing bytes.",
			func(t *testing.T, r *wireRig) {
				for _, b := range [][]byte{
					{0xc1},
					mp{"identifier", "user-42", "limit", 100, "duration", 60000, "cots", 1}.bytes(),
					mp{"identifier", "user-42", "limit", 1.5, "duration", 60000}.bytes(),
					mp{"identifier", "user-42", "limit", -5, "duration", 60000}.bytes(),
					append(mp{"identifier", "user-42", "limit", 1, "duration", 60000}.bytes(), 0x01),
					mp{"identifier", nil, "limit", 1, "duration", 60000}.bytes(),
				} {
					r.request(checkSubj, mpackHeader, b)
				}
			}},
		{"raw/check-errors-header-subject", "400s from the header and the subject: an unsupported Content-Type (answered in JSON whatever\nthe body), a workspace that is not a token, a workspace of 65 characters, a namespace that is not a token.",
			seq(send(checkSubj, nats.Header{"Content-Type": {"text/plain"}}, readmeCheck),
				func(t *testing.T, r *wireRig) {
					r.request(checkSubj, nats.Header{"Content-Type": {"text/plain"}}, mpCheck)
				},
				send("ratelimit.check.ac!me.api", noHeader, readmeCheck),
				send("ratelimit.check."+strings.Repeat("w", 65)+".api", noHeader, readmeCheck),
				send("ratelimit.check.acme.a+b", mpackHeader, string(mpCheck)))},

		// Many checks in one message.
		{"raw/checks-json", "The README's checks message (the second check's fields are bad), a look and shadow.",
			seq(send("ratelimit.checks.acme", noHeader, readmeChecks),
				send("ratelimit.checks.acme", jsonHeader, `{"checks":[{"namespace":"api","identifier":"user-42","limit":100,"duration":60000,"cost":0},{"namespace":"api","identifier":"user-9","limit":0,"duration":60000,"shadow":true},{"namespace":"a.b","identifier":"x","limit":1,"duration":60000},{"namespace":"api","identifier":"x","limit":1,"duration":60000,"cots":1},"not a map"]}`))},
		{"raw/checks-msgpack", "A checks message in msgpack, with a bad check among them.",
			func(t *testing.T, r *wireRig) { r.request("ratelimit.checks.acme", mpackHeader, mpChecks) }},
		{"raw/checks-errors", "Checks messages refused as a whole: not a map, no checks, an empty list, an unknown key,\nmore than 1000 checks, malformed JSON, a bad workspace; and in msgpack: not msgpack.",
			func(t *testing.T, r *wireRig) {
				for _, body := range []string{`[]`, `{}`, `{"checks":[]}`, `{"checks":[],"x":1}`, manyChecks(1001, ""), `{"checks":[`} {
					r.request("ratelimit.checks.acme", noHeader, []byte(body))
				}
				r.request("ratelimit.checks.ac!me", noHeader, []byte(readmeChecks))
				r.request("ratelimit.checks.acme", mpackHeader, []byte{0xc1})
				r.request("ratelimit.checks.acme", mpackHeader, mp{"checks", 1}.bytes())
			}},

		// Batches.
		{"raw/batch-json", "An admitted batch, then a refused one (the second check can never pass).",
			seq(send("ratelimit.batch.acme", noHeader, batchJSON), send("ratelimit.batch.acme", jsonHeader, batchRefused))},
		{"raw/batch-msgpack", "An admitted batch in msgpack.",
			func(t *testing.T, r *wireRig) { r.request("ratelimit.batch.acme", mpackHeader, mpBatch) }},
		{"raw/batch-errors", "Batches refused: no checks, 101 checks, a bad check, over 128 KiB, not a map; in msgpack: a bad check.",
			func(t *testing.T, r *wireRig) {
				for _, body := range []string{`{"checks":[]}`, manyChecks(101, ""),
					`{"checks":[{"namespace":"api","identifier":"","limit":1,"duration":60000}]}`,
					manyChecks(100, strings.Repeat("p", 1300)), `"checks"`} {
					r.request("ratelimit.batch.acme", noHeader, []byte(body))
				}
				r.request("ratelimit.batch.acme", mpackHeader, mp{"checks", []any{mp{"namespace", "api", "identifier", "u", "limit", -1, "duration", 60000}}}.bytes())
			}},

		// Admin.
		{"raw/admin-json", "The admin operations in JSON as the README writes them: set, set in shadow mode, get, list\n(an empty body, then one namespace with a limit of 1 and its cursor), delete, reset of one duration and of all.",
			func(t *testing.T, r *wireRig) {
				r.request(admin("override.set"), noHeader, []byte(set))
				r.request(admin("override.set"), jsonHeader, []byte(setShadow))
				r.request(admin("override.get"), noHeader, []byte(`{"namespace":"api","identifier":"user_*"}`))
				r.request(admin("override.list"), noHeader, nil)
				m := r.request(admin("override.list"), noHeader, []byte(`{"namespace":"api","limit":1}`))
				next := m.Data[bytes.LastIndex(m.Data, []byte(`"next":"`))+len(`"next":"`):]
				next = next[:bytes.IndexByte(next, '"')]
				r.request(admin("override.list"), noHeader, []byte(`{"namespace":"api","cursor":"`+string(next)+`","limit":1}`))
				r.request(admin("override.delete"), noHeader, []byte(`{"namespace":"api","identifier":"user_*"}`))
				r.request(admin("reset"), noHeader, []byte(`{"namespace":"api","identifier":"user-42","duration":60000}`))
				r.request(admin("reset"), noHeader, []byte(`{"namespace":"api","identifier":"user-42"}`))
			}},
		{"raw/admin-msgpack", "The admin operations in msgpack: set, get, list (an empty map), delete, reset.",
			func(t *testing.T, r *wireRig) {
				r.request(admin("override.set"), mpackHeader, mp{"namespace", "api", "identifier", "user_*", "limit", 10, "duration", 60000, "shadow", false}.bytes())
				r.request(admin("override.get"), mpackHeader, mp{"namespace", "api", "identifier", "user_*"}.bytes())
				r.request(admin("override.list"), mpackHeader, mp{}.bytes())
				r.request(admin("override.list"), mpackHeader, nil)
				r.request(admin("override.delete"), mpackHeader, mp{"namespace", "api", "identifier", "user_*"}.bytes())
				r.request(admin("reset"), mpackHeader, mp{"namespace", "api", "identifier", "user-42", "duration", 60000}.bytes())
			}},
		{"raw/admin-errors", "Admin 400s: a ** pattern, an unknown field, malformed JSON, get and delete of nothing, a list limit\nof 0, a bad cursor, a body over 8 KiB, a bad workspace, an unsupported Content-Type; in msgpack: not msgpack.",
			func(t *testing.T, r *wireRig) {
				r.request(admin("override.set"), noHeader, []byte(`{"namespace":"api","identifier":"user_**","limit":10,"duration":60000}`))
				r.request(admin("override.set"), noHeader, []byte(`{"namespace":"api","identifier":"user_*","limit":10,"duration":60000,"shdow":true}`))
				r.request(admin("override.set"), noHeader, []byte(`{"namespace":"api",`))
				r.request(admin("override.get"), noHeader, []byte(`{"namespace":"api","identifier":"nobody"}`))
				r.request(admin("override.delete"), noHeader, []byte(`{"namespace":"api","identifier":"nobody"}`))
				r.request(admin("override.list"), noHeader, []byte(`{"limit":0}`))
				r.request(admin("override.list"), noHeader, []byte(`{"cursor":"AAAA"}`))
				r.request(admin("reset"), noHeader, []byte(`{"namespace":"api","identifier":"user-42","duration":60000,"pad":"`+strings.Repeat("x", 8192)+`"}`))
				r.request("ratelimit.admin.ac!me.override.get", noHeader, []byte(`{"namespace":"api","identifier":"user_*"}`))
				r.request(admin("override.get"), nats.Header{"Content-Type": {"text/plain"}}, []byte(`{"namespace":"api","identifier":"user_*"}`))
				r.request(admin("override.get"), mpackHeader, []byte{0xc1})
				r.request(admin("reset"), mpackHeader, mp{"namespace", "api", "identifier", "user-42", "duration", 5}.bytes())
			}},
		{"raw/admin-unknown-op", "An operation no limiter serves: NATS itself answers no responders (503), as for any subject.",
			func(t *testing.T, r *wireRig) {
				r.noResponders(admin("override.frob"), noHeader, []byte(`{"namespace":"api","identifier":"user_*"}`))
			}},
	}
}
