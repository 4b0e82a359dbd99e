package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

func TestCheckOverNATSInJSONAndMsgpack(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	nc := connect(t, srv.ClientURL())

	// JSON by first byte, no header: the reply is JSON.
	reply, err := nc.Request("ratelimit.check.acme.api", []byte(` {"identifier":"u1","limit":3,"duration":60000}`), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(reply.Data, &j); err != nil {
		t.Fatalf("reply to a JSON request is not JSON: %q", reply.Data)
	}
	if j["success"] != true || j["limit"] != 3.0 || j["remaining"] != 2.0 || j["retry_after"] != 0.0 {
		t.Fatalf("JSON reply = %v", j)
	}
	if reset := int64(j["reset"].(float64)); reset%60000 != 0 || reset <= time.Now().UnixMilli() {
		t.Fatalf("reset %d is not the end of the current minute", reset)
	}

	// msgpack, no header: the reply is msgpack and sees the JSON check's cost.
	body := msgp.AppendMapHeader(nil, 4)
	body = msgp.AppendString(body, "identifier")
	body = msgp.AppendString(body, "u1")
	body = msgp.AppendString(body, "limit")
	body = msgp.AppendInt64(body, 3)
	body = msgp.AppendString(body, "duration")
	body = msgp.AppendInt64(body, 60000)
	body = msgp.AppendString(body, "cost")
	body = msgp.AppendInt64(body, 2)
	reply, err = nc.Request("ratelimit.check.acme.api", body, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wire.DecodeCheckResponse(bus.Msgpack, reply.Data)
	if err != nil {
		t.Fatalf("reply to a msgpack request: %v (%q)", err, reply.Data)
	}
	if !resp.Success || resp.Remaining != 0 {
		t.Fatalf("msgpack reply = %+v, want admitted with 0 remaining", resp)
	}

	// The Go client, both encodings: a denial is a normal reply.
	for _, enc := range []bus.Encoding{bus.JSON, bus.Msgpack} {
		c := bus.NewClient(nc, bus.WithEncoding(enc))
		resp, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "u1", Limit: 3, Duration: 60000, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Success || resp.RetryAfter <= 0 || resp.Limit != 3 {
			t.Fatalf("%v: check over the limit = %+v, want a denial with retry_after", enc, resp)
		}
	}
	// Workspaces and namespaces are separate counters.
	c := bus.NewClient(nc)
	for _, sub := range [][2]string{{"acme", "web"}, {"other", "api"}} {
		resp, err := c.Check(context.Background(), sub[0], sub[1], bus.CheckRequest{Identifier: "u1", Limit: 3, Duration: 60000, Cost: 1})
		if err != nil || !resp.Success || resp.Remaining != 2 {
			t.Fatalf("%v: %+v %v, want a fresh counter", sub, resp, err)
		}
	}
}

func TestBadInputGets400AndCountsNothing(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	nc := connect(t, srv.ClientURL())

	mp := func(kv ...any) []byte {
		b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
		for i := 0; i < len(kv); i += 2 {
			b = msgp.AppendString(b, kv[i].(string))
			b, _ = msgp.AppendIntf(b, kv[i+1])
		}
		return b
	}
	long := strings.Repeat("x", 513)
	tests := []struct {
		name, subject, contentType string
		body                       []byte
		want                       string
	}{
		{"missing identifier", "ratelimit.check.acme.api", "", []byte(`{"limit":1,"duration":60000}`), "identifier is required"},
		{"missing limit", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","duration":60000}`), "limit is required"},
		{"missing duration", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1}`), "duration is required"},
		{"identifier not a string", "ratelimit.check.acme.api", "", []byte(`{"identifier":5,"limit":1,"duration":60000}`), "identifier must be a string"},
		{"limit a string", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":"1","duration":60000}`), "limit must be an integer"},
		{"limit fractional", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1.5,"duration":60000}`), "limit must be an integer"},
		{"negative limit", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":-1,"duration":60000}`), "limit must be between 0 and 1000000000000000"},
		{"limit too large", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1000000000000001,"duration":60000}`), "limit must be between"},
		{"duration too short", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,"duration":999}`), "duration must be between 1000 and 31622400000"},
		{"duration too long", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,"duration":31622400001}`), "duration must be between"},
		{"negative cost", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,"duration":60000,"cost":-1}`), "cost must be between"},
		{"empty identifier", "ratelimit.check.acme.api", "", []byte(`{"identifier":"","limit":1,"duration":60000}`), "identifier must be 1 to 512 bytes"},
		{"long identifier", "ratelimit.check.acme.api", "", []byte(`{"identifier":"` + long + `","limit":1,"duration":60000}`), "identifier must be 1 to 512 bytes, got 513"},
		{"unknown field", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,"duration":60000,"cots":1}`), `unknown field "cots"`},
		{"malformed JSON", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,`), "malformed JSON"},
		{"JSON not an object", "ratelimit.check.acme.api", "application/json", []byte(`[1,2]`), "body must be a JSON object"},
		{"malformed msgpack", "ratelimit.check.acme.api", "", []byte{0x84, 0xa1}, "malformed msgpack"},
		{"msgpack not a map", "ratelimit.check.acme.api", "", msgp.AppendInt64(nil, 7), "body must be a msgpack map"},
		{"msgpack float limit", "ratelimit.check.acme.api", "", mp("identifier", "victim", "limit", 1.5, "duration", 60000), "limit must be an integer"},
		{"msgpack missing duration", "ratelimit.check.acme.api", "", mp("identifier", "victim", "limit", 1), "duration is required"},
		{"unknown encoding", "ratelimit.check.acme.api", "text/plain", []byte(`identifier=victim`), "unsupported Content-Type"},
		{"empty body", "ratelimit.check.acme.api", "", nil, "empty request body"},
		{"oversized body", "ratelimit.check.acme.api", "", []byte(`{"identifier":"victim","limit":1,"duration":60000,"pad":"` + strings.Repeat("p", 5000) + `"}`), "exceeds the limit"},
		{"bad workspace", "ratelimit.check.ac$me.api", "", []byte(`{"identifier":"victim","limit":1,"duration":60000}`), "workspace must be 1 to 64 characters"},
		{"long namespace", "ratelimit.check.acme." + strings.Repeat("n", 65), "", []byte(`{"identifier":"victim","limit":1,"duration":60000}`), "namespace must be 1 to 64 characters"},
		{"batch without checks", "ratelimit.batch.acme", "", []byte(`{"checks":[]}`), "checks must hold 1 to 100 checks, got 0"},
		{"batch with a bad check", "ratelimit.batch.acme", "", []byte(`{"checks":[{"namespace":"api","identifier":"victim","limit":1,"duration":60000},{"namespace":"a.b","identifier":"victim","limit":1,"duration":60000}]}`), "checks[1]: namespace must be"},
		{"batch bad workspace", "ratelimit.batch.a%b", "", []byte(`{"checks":[{"namespace":"api","identifier":"victim","limit":1,"duration":60000}]}`), "workspace must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := nats.NewMsg(tt.subject)
			msg.Data = tt.body
			if tt.contentType != "" {
				msg.Header.Set("Content-Type", tt.contentType)
			}
			reply, err := nc.RequestMsg(msg, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if code := reply.Header.Get(micro.ErrorCodeHeader); code != "400" {
				t.Fatalf("error code header = %q, want 400 (body %q)", code, reply.Data)
			}
			desc := reply.Header.Get(micro.ErrorHeader)
			if !strings.Contains(desc, tt.want) {
				t.Fatalf("error = %q, want it to say %q", desc, tt.want)
			}
			enc := bus.Msgpack
			if len(tt.body) > 0 && tt.body[0] == '{' || tt.contentType != "" {
				enc = bus.JSON
			}
			if msg, err := wire.DecodeError(enc, reply.Data); err != nil || msg != desc {
				t.Fatalf("error body %q decodes to %q, %v; want %q", reply.Data, msg, err, desc)
			}
		})
	}
	// Nothing was counted for the identifier any of them named.
	resp, err := bus.NewClient(nc).Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "victim", Limit: 1, Duration: 60000, Peek: true})
	if err != nil || resp.Remaining != 1 {
		t.Fatalf("after bad requests: %+v %v, want nothing counted", resp, err)
	}
}

func TestBatchIsAllOrNothingOverTheWire(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	c := bus.NewClient(connect(t, srv.ClientURL()), bus.WithEncoding(bus.JSON))
	ctx := context.Background()
	checks := []bus.BatchCheck{
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "a", Limit: 10, Duration: 60000, Cost: 4}},
		{Namespace: "web", CheckRequest: bus.CheckRequest{Identifier: "b", Limit: 5, Duration: 60000, Cost: 3}},
	}
	resp, err := c.Batch(ctx, "acme", checks)
	if err != nil || !resp.Success || len(resp.Results) != 2 || resp.Results[0].Remaining != 6 || resp.Results[1].Remaining != 2 {
		t.Fatalf("first batch = %+v %v", resp, err)
	}
	resp, err = c.Batch(ctx, "acme", checks) // b would need 6 of 5
	if err != nil || resp.Success || resp.Results[0].Success || resp.Results[1].Success || resp.Results[1].RetryAfter == 0 {
		t.Fatalf("second batch = %+v %v, want refused", resp, err)
	}
	for _, ch := range checks {
		r, err := c.Check(ctx, "acme", ch.Namespace, bus.CheckRequest{Identifier: ch.Identifier, Limit: ch.Limit, Duration: ch.Duration, Peek: true})
		if err != nil || r.Remaining != ch.Limit-ch.Cost {
			t.Fatalf("%s after a refused batch: %+v %v, want only the first batch counted", ch.Identifier, r, err)
		}
	}
}

func TestDiscoveryListsServiceAndEndpoints(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "eu-west", service.Config{})
	nc := connect(t, srv.ClientURL())
	if _, err := nc.Request("$SRV.PING.ratelimit", nil, time.Second); err != nil {
		t.Fatalf("$SRV.PING.ratelimit: %v", err)
	}
	reply, err := nc.Request("$SRV.INFO.ratelimit", nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(reply.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != "ratelimit" || info.Metadata["region"] != "eu-west" {
		t.Fatalf("info = %+v", info)
	}
	subjects := map[string]string{}
	for _, e := range info.Endpoints {
		subjects[e.Name] = e.Subject
		if e.QueueGroup != transport.QueueGroup {
			t.Fatalf("endpoint %s queue group %q", e.Name, e.QueueGroup)
		}
	}
	if subjects["check"] != "ratelimit.check.*.*" || subjects["batch"] != "ratelimit.batch.*" || subjects["checks"] != "ratelimit.checks.*" {
		t.Fatalf("endpoints = %v", subjects)
	}
	// $SRV.STATS carries each endpoint's answers; the check endpoint is first.
	c := bus.NewClient(nc)
	for range 2 {
		if _, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "s", Limit: 1, Duration: 60000, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	reply, err = nc.Request("$SRV.STATS.ratelimit", nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st micro.Stats
	if err := json.Unmarshal(reply.Data, &st); err != nil {
		t.Fatal(err)
	}
	var summary struct {
		Admitted int64 `json:"admitted"`
		Denied   int64 `json:"denied"`
	}
	if err := json.Unmarshal(st.Endpoints[0].Data, &summary); err != nil || summary.Admitted != 1 || summary.Denied != 1 {
		t.Fatalf("stats summary %s (%v), want 1 admitted and 1 denied", st.Endpoints[0].Data, err)
	}
}

// checkStats returns the number of check and checks requests each limiter
// instance served.
func checkStats(t *testing.T, nc *nats.Conn, ids ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, id := range ids {
		reply, err := nc.Request("$SRV.STATS.ratelimit."+id, nil, time.Second)
		if err != nil {
			t.Fatalf("stats of %s: %v", id, err)
		}
		var st micro.Stats
		if err := json.Unmarshal(reply.Data, &st); err != nil {
			t.Fatal(err)
		}
		for _, e := range st.Endpoints {
			// The Go client coalesces concurrent checks into checks
			// messages: both endpoints serve checks.
			if e.Name == "check" || e.Name == "checks" {
				out[id] += e.NumRequests
			}
		}
	}
	return out
}

func TestTwoLimitersShareTheQueueGroup(t *testing.T) {
	srv := startServer(t)
	a := startLimiter(t, srv.ClientURL(), "local", service.Config{})
	b := startLimiter(t, srv.ClientURL(), "local", service.Config{})
	nc := connect(t, srv.ClientURL())
	c := bus.NewClient(nc)
	for i := range 200 {
		if _, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: fmt.Sprint("u", i), Limit: 5, Duration: 60000, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ida, idb := a.lim.Info().ID, b.lim.Info().ID
	st := checkStats(t, nc, ida, idb)
	if st[ida]+st[idb] != 200 || st[ida] < 40 || st[idb] < 40 {
		t.Fatalf("requests served: %v, want 200 split between both members", st)
	}
}

func TestSuperclusterServesLocallyAndFailsOver(t *testing.T) {
	sc := startSupercluster(t, "us", "eu", "ap")
	us := startLimiter(t, sc.ClientURL("us"), "us", service.Config{})
	eu := startLimiter(t, sc.ClientURL("eu"), "eu", service.Config{})
	ctx := testContext(t)
	euClient := bus.NewClient(connect(t, sc.ClientURL("eu")))
	apClient := bus.NewClient(connect(t, sc.ClientURL("ap")))
	req := bus.CheckRequest{Identifier: "u", Limit: 1_000_000, Duration: 60000, Cost: 1}
	checkUntil(ctx, t, apClient, "acme", "api", req) // ap has no limiter: another region answers

	mon := connect(t, sc.ClientURL("us"))
	before := checkStats(t, mon, us.lim.Info().ID, eu.lim.Info().ID)
	for range 100 {
		if _, err := euClient.Check(ctx, "acme", "api", req); err != nil {
			t.Fatal(err)
		}
	}
	after := checkStats(t, mon, us.lim.Info().ID, eu.lim.Info().ID)
	if got := after[eu.lim.Info().ID] - before[eu.lim.Info().ID]; got != 100 {
		t.Fatalf("eu's limiter served %d of 100 checks from an eu client, want all (us served %d)",
			got, after[us.lim.Info().ID]-before[us.lim.Info().ID])
	}

	eu.stop(t)
	usBefore := checkStats(t, mon, us.lim.Info().ID)[us.lim.Info().ID]
	resp := checkUntil(ctx, t, euClient, "acme", "api", req)
	if !resp.Success {
		t.Fatalf("failover answer = %+v", resp)
	}
	for range 20 {
		if _, err := euClient.Check(ctx, "acme", "api", req); err != nil {
			t.Fatalf("check after eu's limiter stopped: %v", err)
		}
	}
	if got := checkStats(t, mon, us.lim.Info().ID)[us.lim.Info().ID] - usBefore; got < 21 {
		t.Fatalf("us served %d checks after eu's limiter stopped, want the eu client's 21", got)
	}
}

// blockingOrigin holds the request-path syncs of one identifier until
// released: a test seam to make one check slow, not a stand-in for a
// server.
type blockingOrigin struct {
	*regiontest.Memory
	slow    string
	release chan struct{}
}

func (o *blockingOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if s.Cell.Identifier == o.slow {
		select {
		case <-o.release:
		case <-ctx.Done():
			return region.SyncResult{}, ctx.Err()
		}
	}
	return o.Memory.Sync(ctx, reporter, s)
}

func TestSlowCheckDoesNotHoldUpOtherIdentifiers(t *testing.T) {
	srv := startServer(t)
	o := &blockingOrigin{Memory: regiontest.NewMemory(nil), slow: "slow", release: make(chan struct{})}
	// ReadTimeout 10s, not the default 50ms: the slow check must still be
	// waiting on its sync while the others are answered.
	startLimiter(t, srv.ClientURL(), "local", service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	// One check per message: this is about the limiter. A coalescing
	// client may carry the slow check in one message with fast ones, and a
	// message is answered when its slowest check is decided (README, "when
	// coalescing helps").
	c := bus.NewClient(connect(t, srv.ClientURL()), bus.WithCoalescing(false))
	ctx := testContext(t)

	slowDone := make(chan error, 1)
	go func() {
		_, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "slow", Limit: 10, Duration: 60000, Cost: 1})
		slowDone <- err
	}()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if _, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: fmt.Sprint("fast-", i%5), Limit: 10, Duration: 60000, Cost: 1}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-slowDone:
		t.Fatalf("the slow check finished before its sync was released: %v", err)
	default:
	}
	close(o.release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
}

func TestNoLimiterIsErrNoResponders(t *testing.T) {
	srv := startServer(t)
	c := bus.NewClient(connect(t, srv.ClientURL()))
	_, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60000, Cost: 1})
	if !errors.Is(err, bus.ErrNoResponders) || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("err = %v, want ErrNoResponders", err)
	}
	var bad *bus.BadRequestError
	if _, err := c.Check(context.Background(), "a.b", "api", bus.CheckRequest{Identifier: "u", Limit: 1, Duration: 60000}); !errors.As(err, &bad) {
		t.Fatalf("invalid workspace: err = %v, want a BadRequestError before sending", err)
	}
}

func TestServiceErrorIsTyped(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	c := bus.NewClient(connect(t, srv.ClientURL()))
	_, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "u", Limit: -1, Duration: 60000, Cost: 1})
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, "limit must be between") {
		t.Fatalf("err = %v, want a 400 ServiceError about the limit", err)
	}
}

// 64 concurrent clients over NATS on one identifier get exactly the limit.
func TestConcurrentClientsOverNATSGetExactlyTheLimit(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	c := bus.NewClient(connect(t, srv.ClientURL()))
	const limit = 500
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 2 * limit / 64 {
				resp, err := c.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "hot", Limit: limit, Duration: 3_600_000, Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Success {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if admitted != limit {
		t.Fatalf("admitted %d, want exactly %d", admitted, limit)
	}
}
