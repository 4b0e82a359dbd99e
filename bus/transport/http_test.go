package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/msgptest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/service"
)

// testToken is the admin token of the doors in these tests.
const testToken = "s3cret-admin-token"

// startDoor serves l's HTTP door with cfg on a loopback port until the end
// of the test, and returns its base URL.
func startDoor(t *testing.T, l *Limiter, cfg HTTPConfig) string {
	t.Helper()
	srv := httptest.NewServer(l.HTTPHandler(cfg))
	t.Cleanup(srv.Close)
	return srv.URL
}

// answer is what a client sees of a reply: the status (200, or the micro
// error code), the error description, the body and, over HTTP, the
// Content-Type.
type answer struct {
	status      int
	description string
	body        string
	contentType string
}

// overNATS sends body on subject with Content-Type ct (none when empty).
func overNATS(t *testing.T, nc *nats.Conn, subject, ct string, body []byte) answer {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = body
	if ct != "" {
		m.Header.Set("Content-Type", ct)
	}
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("%s over NATS: %v", subject, err)
	}
	a := answer{status: 200, description: r.Header.Get(micro.ErrorHeader), body: string(r.Data), contentType: r.Header.Get("Content-Type")}
	if code := r.Header.Get(micro.ErrorCodeHeader); code != "" {
		if a.status, err = strconv.Atoi(code); err != nil {
			t.Fatalf("%s over NATS: error code %q", subject, code)
		}
	}
	return a
}

// overHTTP posts body to url with Content-Type ct (none when empty) and
// the headers in hdr (name, value pairs).
func overHTTP(t *testing.T, client *http.Client, method, url, ct string, body []byte, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, description: resp.Header.Get(micro.ErrorHeader), body: string(b),
		contentType: resp.Header.Get("Content-Type")}
}

// twinLimiters returns two limiters, each on its own NATS server, on
// services built by newService on one fixed clock (so equal requests get
// equal replies, reset and retry_after included), and the NATS connection
// of the first and the HTTP door of the second (its admin token testToken),
// and the second.
func twinLimiters(t *testing.T, newService func(cfg service.Config, twin string) *service.Service) (*nats.Conn, string, *Limiter) {
	t.Helper()
	now := time.UnixMilli(time.Now().UnixMilli())
	clock := func() time.Time { return now }
	natsSrv := natstest.Server(t)
	serveLimiter(t, natsSrv, newService(service.Config{Now: clock}, "nats"))
	httpSide := serveLimiter(t, natstest.Server(t), newService(service.Config{Now: clock}, "http"))
	return natstest.Connect(t, natsSrv), startDoor(t, httpSide, HTTPConfig{AdminToken: testToken}), httpSide
}

// contractCase is one request of the NATS contract: its subject after the
// prefix with '/' for '.', which is also its path after HTTPPathPrefix.
type contractCase struct {
	name, rel, ct string
	body          []byte
	// wantStatus is the status both doors must answer.
	wantStatus int
}

// contractCases returns a table of the requests the NATS door's contract
// tests send (test.TestBadInputGets400AndCountsNothing,
// TestChecksBodyUnreadableAsAWholeIs400, the policy endpoints' tests), in an
// order whose decisions depend on the ones before: admissions, denials,
// looks, overrides, resets, and the 400s of hostile bodies.
func contractCases() []contractCase {
	const minute = 60_000
	chk := func(id string, limit, cost int64) []byte {
		return fmt.Appendf(nil, `{"identifier":%q,"limit":%d,"duration":%d,"cost":%d}`, id, limit, minute, cost)
	}
	mp := func(kv ...any) []byte {
		var m msgptest.Map
		for i := 0; i+1 < len(kv); i += 2 {
			m = append(m, msgptest.KV{kv[i], kv[i+1]})
		}
		return msgptest.Encode(m)
	}
	check := func(id string, limit, cost int64) wire.BatchCheck {
		return wire.BatchCheck{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: id, Limit: limit, Duration: minute, Cost: cost}}
	}
	batch := wire.AppendBatchRequest(nil, wire.JSON, wire.BatchRequest{Checks: []wire.BatchCheck{check("b1", 5, 2), check("b2", 3, 3)}})
	checks := wire.AppendChecksRequest(nil, wire.Msgpack, []wire.BatchCheck{
		check("m1", 2, 1), check("m1", 2, 1), check("m1", 2, 1), check("m2", 1, 5),
		{Namespace: "a.b", CheckRequest: wire.CheckRequest{Identifier: "x", Limit: 1, Duration: minute, Cost: 1}},
		check("", 1, 1), check("m3", 10, 0)})
	good := `{"namespace":"api","identifier":"u","limit":10,"duration":60000}`
	const json, msgpack = "application/json", "application/msgpack"
	return []contractCase{
		// Decisions, in both encodings, by Content-Type and by first byte.
		{"admitted", "check/acme/api", json, chk("u1", 3, 1), 200},
		{"admitted, JSON by first byte", "check/acme/api", "", []byte(` {"identifier":"u1","limit":3,"duration":60000}`), 200},
		{"admitted, msgpack by first byte", "check/acme/api", "", wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: "u1", Limit: 3, Duration: minute, Cost: 1}), 200},
		{"denied", "check/acme/api", "application/JSON; charset=utf-8", chk("u1", 3, 1), 200},
		{"denied, msgpack", "check/acme/api", msgpack, wire.AppendCheckRequest(nil, wire.Msgpack, wire.CheckRequest{Identifier: "u1", Limit: 3, Duration: minute, Cost: 1}), 200},
		{"a look", "check/acme/api", json, chk("u1", 3, 0), 200},
		{"never", "check/acme/api", json, chk("u2", 3, 4), 200},
		{"shadow", "check/acme/web", json, []byte(`{"identifier":"s","limit":0,"duration":60000,"shadow":true}`), 200},
		{"other workspace", "check/other/api", json, chk("u1", 3, 1), 200},
		// Hostile check bodies: the NATS door's 400s, word for word.
		{"missing identifier", "check/acme/api", "", []byte(`{"limit":1,"duration":60000}`), 400},
		{"identifier not a string", "check/acme/api", "", []byte(`{"identifier":5,"limit":1,"duration":60000}`), 400},
		{"limit a string", "check/acme/api", "", []byte(`{"identifier":"v","limit":"1","duration":60000}`), 400},
		{"limit fractional", "check/acme/api", "", []byte(`{"identifier":"v","limit":1.5,"duration":60000}`), 400},
		{"limit null", "check/acme/api", json, []byte(`{"identifier":"v","limit":null,"duration":60000}`), 400},
		{"negative cost", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,"duration":60000,"cost":-1}`), 400},
		{"duration too short", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,"duration":999}`), 400},
		{"unknown field", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,"duration":60000,"cots":1}`), 400},
		{"duplicate field", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,"limit":2,"duration":60000}`), 400},
		{"trailing garbage", "check/acme/api", json, []byte(`{"identifier":"v","limit":1,"duration":60000} x`), 400},
		{"two objects", "check/acme/api", json, []byte(`{"identifier":"v","limit":1,"duration":60000}{}`), 400},
		{"malformed JSON", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,`), 400},
		{"JSON not an object", "check/acme/api", json, []byte(`[1,2]`), 400},
		{"malformed msgpack", "check/acme/api", "", []byte{0x84, 0xa1}, 400},
		{"msgpack trailing bytes", "check/acme/api", msgpack, append(mp("identifier", "v", "limit", 1, "duration", minute), 0xc0), 400},
		{"msgpack float limit", "check/acme/api", "", mp("identifier", "v", "limit", 1.5, "duration", minute), 400},
		{"unsupported Content-Type", "check/acme/api", "text/plain", []byte(`identifier=v`), 400},
		{"form Content-Type (curl -d without -H)", "check/acme/api", "application/x-www-form-urlencoded", chk("v", 1, 1), 400},
		{"empty body", "check/acme/api", "", nil, 400},
		{"body over 4 KiB", "check/acme/api", "", []byte(`{"identifier":"v","limit":1,"duration":60000,"pad":"` + strings.Repeat("p", 5000) + `"}`), 400},
		{"bad workspace", "check/ac$me/api", "", chk("v", 1, 1), 400},
		{"long namespace", "check/acme/" + strings.Repeat("n", 65), "", chk("v", 1, 1), 400},
		// Batches.
		{"batch admitted", "batch/acme", json, batch, 200},
		{"batch refused", "batch/acme", json, batch, 200},
		{"batch without checks", "batch/acme", "", []byte(`{"checks":[]}`), 400},
		{"batch with a bad check", "batch/acme", "", []byte(`{"checks":[` + good + `,{"namespace":"a.b","identifier":"v","limit":1,"duration":60000}]}`), 400},
		{"batch bad workspace", "batch/a$b", "", []byte(`{"checks":[` + good + `]}`), 400},
		// Checks messages: results one by one, and 400s of the whole.
		{"checks", "checks/acme", "", checks, 200},
		{"checks again", "checks/acme", msgpack, checks, 200},
		{"checks not an object", "checks/acme", json, []byte(`[` + good + `]`), 400},
		{"checks unknown field", "checks/acme", json, []byte(`{"checks":[` + good + `],"x":1}`), 400},
		{"checks missing", "checks/acme", json, []byte(`{}`), 400},
		{"checks truncated", "checks/acme", json, []byte(`{"checks":[` + good + `,`), 400},
		{"checks empty", "checks/acme", json, []byte(`{"checks":[]}`), 400},
		// The policy endpoints.
		{"override set", "admin/acme/override/set", json, []byte(`{"namespace":"api","identifier":"vip_*","limit":7,"duration":60000}`), 200},
		{"override set, msgpack", "admin/acme/override/set", "", mp("namespace", "api", "identifier", "u1", "limit", 100, "duration", minute, "shadow", true), 200},
		{"override applied", "check/acme/api", json, chk("vip_1", 3, 1), 200},
		{"override get", "admin/acme/override/get", json, []byte(`{"namespace":"api","identifier":"vip_*"}`), 200},
		{"override list, empty body", "admin/acme/override/list", "", nil, 200},
		{"override list of a namespace", "admin/acme/override/list", json, []byte(`{"namespace":"api","limit":1}`), 200},
		{"override delete", "admin/acme/override/delete", json, []byte(`{"namespace":"api","identifier":"vip_*"}`), 200},
		{"override get, gone", "admin/acme/override/get", json, []byte(`{"namespace":"api","identifier":"vip_*"}`), 400},
		{"override set, unknown field", "admin/acme/override/set", json, []byte(`{"namespace":"api","identifier":"x","limit":7,"duration":60000,"ttl":1}`), 400},
		{"override set, trailing bytes", "admin/acme/override/set", json, []byte(`{"namespace":"api","identifier":"x","limit":7,"duration":60000}]`), 400},
		{"override set, limit a string", "admin/acme/override/set", json, []byte(`{"namespace":"api","identifier":"x","limit":"7","duration":60000}`), 400},
		{"admin bad workspace", "admin/a$b/override/list", "", nil, 400},
		{"reset", "admin/acme/reset", json, []byte(`{"namespace":"api","identifier":"u1"}`), 200},
		{"after the reset", "check/acme/api", json, chk("u1", 3, 1), 200},
		{"reset, bad body", "admin/acme/reset", json, []byte(`{"namespace":"api"}`), 400},
	}
}

// The HTTP door answers every request of the NATS contract with the NATS
// door's reply, byte for byte: decisions in both encodings, batches,
// checks messages, the policy endpoints, and the 400 of every hostile body
// with the same description; the status is the micro error code (200 when
// none) and Content-Type names the reply's encoding. Run on the in-memory
// origin (every check decided inline) and on the real Redis (cold checks,
// batches and checks messages answered from their own goroutines).
func TestHTTPDoorAnswersAsTheNATSSubjects(t *testing.T) {
	origins := []struct {
		name       string
		waits      bool // cold checks wait on the origin
		newService func(cfg service.Config, twin string) *service.Service
	}{
		{"memory", false, func(cfg service.Config, _ string) *service.Service { return startService(t, cfg) }},
		{"redis", true, func(cfg service.Config, twin string) *service.Service {
			cfg.Origin = sharedRedis(t, redistest.Prefix(t)+":"+twin)
			cfg.ReadTimeout = 10 * time.Second // decided by Redis, never by a slow call
			return startService(t, cfg)
		}},
	}
	for _, o := range origins {
		t.Run(o.name, func(t *testing.T) {
			nc, door, l := twinLimiters(t, o.newService)
			client := &http.Client{}
			for _, c := range contractCases() {
				want := overNATS(t, nc, "ratelimit."+strings.ReplaceAll(c.rel, "/", "."), c.ct, c.body)
				got := overHTTP(t, client, http.MethodPost, door+HTTPPathPrefix+c.rel, c.ct, c.body, "Authorization", "Bearer "+testToken)
				if want.status != c.wantStatus {
					t.Fatalf("%s: over NATS %d %q %q, want %d", c.name, want.status, want.description, want.body, c.wantStatus)
				}
				if got.status != want.status || got.description != want.description || got.body != want.body {
					t.Errorf("%s:\n over HTTP %d %q %q\n over NATS %d %q %q", c.name, got.status, got.description, got.body,
						want.status, want.description, want.body)
				}
				// Content-Type names the reply's encoding (the policy
				// endpoints name it over NATS too).
				wantCT := "application/msgpack"
				if strings.HasPrefix(want.body, "{") {
					wantCT = "application/json"
				}
				if got.contentType != wantCT || want.contentType != "" && want.contentType != wantCT {
					t.Errorf("%s: Content-Type %q, want %q", c.name, got.contentType, wantCT)
				}
				if testing.Verbose() {
					t.Logf("%s: %d %q", c.name, got.status, got.body)
				}
			}
			check, _ := l.EndpointStats("check")
			checks, _ := l.EndpointStats("checks")
			if o.waits && (check.Waited == 0 || checks.Waited == 0) {
				t.Errorf("no check waited on Redis: check %+v, checks %+v", check, checks)
			}
		})
	}
}

// The door's own refusals: a path no endpoint serves 404, a method other
// than POST 405 (with Allow), a body over the NATS max payload 413 (with or
// without Content-Length), an admin request without credentials 401 (with
// a Bearer challenge), with a wrong token or another scheme's 403 or 401,
// and on a door given no token 403. None reaches an endpoint or is
// counted; the door goes on serving.
func TestHTTPDoorRefusesWhatNoEndpointWouldTake(t *testing.T) {
	srv := natstest.Server(t)
	l := serveLimiter(t, srv, startService(t, service.Config{}))
	door := startDoor(t, l, HTTPConfig{AdminToken: testToken})
	open := startDoor(t, l, HTTPConfig{})
	client := &http.Client{}
	good := []byte(`{"identifier":"u","limit":10,"duration":60000}`)
	maxPayload := int(natstest.Connect(t, srv).MaxPayload())
	over := append(append([]byte(`{"identifier":"`), bytes.Repeat([]byte("x"), maxPayload)...), `"}`...)
	list := []byte(`{"namespace":"api"}`)
	cases := []struct {
		name, method, url, ct string
		body                  []byte
		hdr                   []string
		status                int
		want                  string // in the error body
	}{
		{"no such endpoint", "POST", door + "/ratelimit/check/acme", "", good, nil, 404, "no endpoint at"},
		{"extra segment", "POST", door + "/ratelimit/check/acme/api/x", "", good, nil, 404, "no endpoint at"},
		{"empty segment", "POST", door + "/ratelimit/check//api", "", good, nil, 404, "no endpoint at"},
		{"a dot in a segment", "POST", door + "/ratelimit/check/a.b/api", "", good, nil, 404, "no endpoint at"},
		{"another prefix", "POST", door + "/v1/check/acme/api", "", good, nil, 404, "no endpoint at"},
		{"root", "GET", door + "/", "", nil, nil, 404, "no endpoint at"},
		{"unknown operation", "POST", door + "/ratelimit/admin/acme/override/put", "", list, nil, 404, "no endpoint at"},
		{"GET a check", "GET", door + "/ratelimit/check/acme/api", "", nil, nil, 405, "use POST"},
		{"PUT a batch", "PUT", door + "/ratelimit/batch/acme", "", good, nil, 405, "use POST"},
		{"over the max payload", "POST", door + "/ratelimit/check/acme/api", "application/json", over, nil, 413, "over the limit"},
		{"admin without a token", "POST", door + "/ratelimit/admin/acme/override/list", "", list, nil, 401, "Authorization: Bearer"},
		{"admin, another scheme", "POST", door + "/ratelimit/admin/acme/override/list", "", list,
			[]string{"Authorization", "Basic " + testToken}, 401, "Authorization: Bearer"},
		{"admin, wrong token", "POST", door + "/ratelimit/admin/acme/override/list", "", list,
			[]string{"Authorization", "Bearer " + testToken + "x"}, 403, "wrong token"},
		{"admin, a token's prefix", "POST", door + "/ratelimit/admin/acme/reset", "", list,
			[]string{"Authorization", "Bearer " + testToken[:4]}, 403, "wrong token"},
		{"admin on a door without a token", "POST", open + "/ratelimit/admin/acme/override/list", "", list,
			[]string{"Authorization", "Bearer " + testToken}, 403, "need a client certificate"},
	}
	for _, c := range cases {
		got := overHTTP(t, client, c.method, c.url, c.ct, c.body, c.hdr...)
		msg, err := wire.DecodeError(wire.JSON, []byte(got.body))
		if got.status != c.status || err != nil || !strings.Contains(msg, c.want) || got.contentType != "application/json" {
			t.Errorf("%s: %d %q (%s), want %d saying %q", c.name, got.status, got.body, got.contentType, c.status, c.want)
		}
	}
	// The headers that say what to do instead.
	resp, err := client.Get(door + "/ratelimit/check/acme/api")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if allow := resp.Header.Get("Allow"); allow != "POST" {
		t.Errorf("405 with Allow %q, want POST", allow)
	}
	resp, err = client.Post(door+"/ratelimit/admin/acme/override/list", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ch := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer ") {
		t.Errorf("401 with WWW-Authenticate %q, want a Bearer challenge", ch)
	}
	// A body without Content-Length over the max payload: read up to it.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(over)
		pw.Close()
	}()
	req, err := http.NewRequest("POST", door+"/ratelimit/checks/acme", pr) // no length: chunked
	if err != nil {
		t.Fatal(err)
	}
	if resp, err = client.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("a chunked body over the max payload: %d, want 413", resp.StatusCode)
	}
	for _, ep := range []string{"check", "batch", "checks"} {
		if st, _ := l.EndpointStats(ep); st != (EndpointStats{}) {
			t.Errorf("%s endpoint counted refusals of the door: %+v", ep, st)
		}
	}
	if st := l.AdminStats(); st != (AdminStats{}) {
		t.Errorf("admin endpoints counted refusals of the door: %+v", st)
	}
	// The door counted each refusal by status (the table, the two header
	// checks and the chunked body).
	refused := map[int]int64{}
	l.HTTPRefusals(func(code int, n int64) bool { refused[code] = n; return true })
	if want := map[int]int64{400: 0, 401: 3, 403: 3, 404: 7, 405: 3, 413: 2}; !maps.Equal(refused, want) {
		t.Errorf("refusals counted %v, want %v", refused, want)
	}
	// Still serving, and counting what reaches the endpoints.
	if got := overHTTP(t, client, "POST", door+"/ratelimit/check/acme/api", "", good); got.status != 200 ||
		!strings.Contains(got.body, `"success":true`) {
		t.Fatalf("a good check after the refusals: %d %s", got.status, got.body)
	}
	if got := overHTTP(t, client, "POST", door+"/ratelimit/admin/acme/override/list", "", nil, "authorization", "bearer "+testToken); got.status != 200 {
		t.Fatalf("override list with the token: %d %s", got.status, got.body)
	}
	if st, _ := l.EndpointStats("check"); st.Admitted != 1 {
		t.Fatalf("check endpoint stats %+v, want 1 admitted", st)
	}
	if st := l.AdminStats(); st.Lists != 1 {
		t.Fatalf("admin stats %+v, want 1 list", st)
	}
}

// Checks over HTTP pass the limiter's one waiting gate with its NATS
// checks: with MaxWaiting 4, of which a workspace alone takes three
// quarters, two cold checks over HTTP and one over NATS wait on Redis
// (held), and the next cold check over HTTP is decided at once without
// waiting (NotWaited). A client that gives up while its check
// waits gets nothing and breaks nothing; the others get their decisions
// when Redis answers, each once.
func TestHTTPDoorSharesTheWaitingGate(t *testing.T) {
	srv := natstest.Server(t)
	o := &holdingOrigin{Redis: sharedRedis(t, redistest.Prefix(t)), hold: "slow", release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(o.release) }) }
	defer release()
	svc := startService(t, service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	nc := natstest.Connect(t, srv)
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r", MaxWaiting: 4, CheckTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Shutdown(context.Background()) })
	door := startDoor(t, l, HTTPConfig{})
	client := &http.Client{}
	body := func(id string) []byte { return fmt.Appendf(nil, `{"identifier":%q,"limit":5,"duration":60000}`, id) }

	type result struct {
		a   answer
		err error
	}
	post := func(ctx context.Context, id string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", door+"/ratelimit/check/slow/api", bytes.NewReader(body(id)))
			resp, err := client.Do(req)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			ch <- result{a: answer{status: resp.StatusCode, body: string(b)}, err: err}
		}()
		return ch
	}
	gone, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := []<-chan result{post(gone, "a"), post(context.Background(), "b")}
	natsReply := make(chan *nats.Msg, 1)
	go func() {
		m, err := natstest.Connect(t, srv).Request("ratelimit.check.slow.api", body("c"), 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		natsReply <- m
	}()
	for deadline := time.Now().Add(10 * time.Second); o.held.Load() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d checks wait on Redis, want 3", o.held.Load())
		}
	}
	select {
	case r := <-post(context.Background(), "d"):
		if r.err != nil || r.a.status != 200 {
			t.Fatalf("the check past the gate: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check past the gate waited")
	}
	if st, _ := l.EndpointStats("check"); st.Waited != 3 || st.NotWaited != 1 {
		t.Fatalf("check endpoint %+v, want 3 waited (2 over HTTP, 1 over NATS) and 1 not waited", st)
	}
	cancel()
	if r := <-waiting[0]; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the client that gave up: %+v", r)
	}
	release()
	if r := <-waiting[1]; r.err != nil || r.a.status != 200 || !strings.Contains(r.a.body, `"success":true`) {
		t.Fatalf("a waiting check over HTTP after Redis answered: %+v", r)
	}
	if m := <-natsReply; m == nil || !strings.Contains(string(m.Data), `"success":true`) {
		t.Fatalf("the waiting check over NATS: %+v", m)
	}
	// Every check decided was counted once, the abandoned one included.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st, _ := l.EndpointStats("check")
		if st.Admitted+st.Denied == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("check endpoint %+v, want 4 decisions", st)
		}
	}
}

// Many clients over HTTP on one identifier of the real Redis, checks
// answered inline and from their own goroutines, get exactly the limit
// admitted, each request one reply.
func TestHTTPDoorAdmitsExactlyTheLimit(t *testing.T) {
	srv := natstest.Server(t)
	l := serveLimiter(t, srv, redisService(t, redistest.Prefix(t)))
	door := startDoor(t, l, HTTPConfig{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	const clients, each, limit = 64, 6, 100
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range each {
				resp, err := client.Post(door+"/ratelimit/check/acme/api", "application/json",
					strings.NewReader(`{"identifier":"shared","limit":100,"duration":3600000}`))
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				r, err := wire.DecodeCheckResponse(wire.JSON, b)
				switch {
				case resp.StatusCode != 200 || err != nil:
					t.Errorf("%d %q: %v", resp.StatusCode, b, err)
				case r.Success:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != limit || denied.Load() != clients*each-limit {
		t.Fatalf("%d admitted and %d denied of %d, want exactly the limit %d admitted", admitted.Load(), denied.Load(), clients*each, limit)
	}
	if s := l.Stats(); s.Admitted != limit {
		t.Fatalf("limiter stats %+v, want %d admitted", s, limit)
	}
}

// Shutting the HTTP server down, then the limiter, under load from many
// clients loses no decision: every check the limiter counted was answered
// to its client (http.Server.Shutdown waits for the door's handlers, which
// wait for their one answer), and what arrives later is refused, never
// counted.
func TestHTTPDoorShutdownAnswersEveryCheckItCounted(t *testing.T) {
	srv := natstest.Server(t)
	svc := redisService(t, redistest.Prefix(t))
	nc := natstest.Connect(t, srv)
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: l.HTTPHandler(HTTPConfig{}), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/ratelimit/check/acme/api"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var decided, admitted, refused atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// A fresh identifier each: every check waits on Redis, and
				// many do when shutdown begins.
				resp, err := client.Post(url, "application/json", strings.NewReader(
					fmt.Sprintf(`{"identifier":"u-%d-%d","limit":1000000,"duration":60000}`, g, i)))
				if err != nil {
					refused.Add(1) // the listener is closed: nothing was read
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					decided.Add(1)
					if strings.Contains(string(b), `"success":true`) {
						admitted.Add(1)
					}
				case 503:
				default:
					t.Errorf("%d %s", resp.StatusCode, b)
				}
			}
		})
	}
	for decided.Load() < 500 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for refused.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Admitted != admitted.Load() || s.Admitted+s.Denied != decided.Load() {
		t.Fatalf("the limiter decided %d (%d admitted); its clients got %d decisions (%d admitted)",
			s.Admitted+s.Denied, s.Admitted, decided.Load(), admitted.Load())
	}
	t.Logf("%d decided, then the listener refused", decided.Load())
}

// An httpRequest keeps its first answer, from whichever goroutine gives
// it, and refuses the others; the micro error code becomes the status.
func TestHTTPRequestKeepsItsFirstAnswer(t *testing.T) {
	r := &httpRequest{subject: "ratelimit.check.acme.api", done: make(chan struct{})}
	var wg sync.WaitGroup
	var won atomic.Int64
	for i := range 8 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				err = r.Error("503", "shutting down", []byte(`{"error":"shutting down"}`))
			} else {
				err = r.Respond([]byte(`{}`))
			}
			if err == nil {
				won.Add(1)
			} else if !errors.Is(err, errAnswered) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	<-r.done
	if won.Load() != 1 {
		t.Fatalf("%d answers kept, want 1", won.Load())
	}
	if r.status == 503 && (r.header.Get(micro.ErrorCodeHeader) != "503" || r.header.Get(micro.ErrorHeader) != "shutting down") {
		t.Fatalf("error answer headers %v", r.header)
	}
	for code, status := range map[string]int{"400": 400, "413": 413, "429": 429, "500": 500, "x": 500, "200": 500} {
		r := &httpRequest{done: make(chan struct{})}
		if err := r.Error(code, "d", nil); err != nil || r.status != status {
			t.Errorf("code %q: status %d (%v), want %d", code, r.status, err, status)
		}
	}
	if err := (&httpRequest{done: make(chan struct{})}).Error("", "d", nil); !errors.Is(err, micro.ErrArgRequired) {
		t.Errorf("no code: %v", err)
	}
}

// Whatever path a client sends, the door names at most one endpoint, and
// the subject it hands that endpoint has the endpoint's shape: the
// default prefix, the endpoint's word, and non-empty tokens without a dot
// (the endpoint checks what the tokens hold).
func FuzzHTTPDoorRoute(f *testing.F) {
	for _, p := range []string{"/ratelimit/check/acme/api", "/ratelimit/batch/acme", "/ratelimit/checks/acme",
		"/ratelimit/admin/acme/override/set", "/ratelimit/admin/acme/reset", "/ratelimit/check//api", "/ratelimit/check/a.b/c", "/", ""} {
		f.Add(p)
	}
	d := &httpDoor{l: &Limiter{}}
	f.Fuzz(func(t *testing.T, path string) {
		route, subject := d.route(path)
		if route == 0 {
			if subject != "" {
				t.Fatalf("no route for %q, but subject %q", path, subject)
			}
			return
		}
		toks := strings.Split(subject, ".")
		want := map[int][]int{routeCheck: {4}, routeBatch: {3}, routeChecks: {3}, routeAdmin: {4, 5}}[route]
		if toks[0] != "ratelimit" || !slices.Contains(want, len(toks)) || slices.Contains(toks, "") {
			t.Fatalf("%q routed to %d with subject %q", path, route, subject)
		}
	})
}
