package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/adminwire"
	"github.com/sluicehq/sluice/service"
)

// bigPattern returns a pattern of about 400 bytes, distinct for i, that
// sorts apart from i's order; a third of its bytes are '<', which JSON
// writes as 6 bytes (\u003c), so JSON pages end by bytes before their
// limit.
func bigPattern(i int) string {
	return fmt.Sprintf("%08x-%05d-", uint32(i)*2654435761, i) + strings.Repeat("ab<", 128)
}

// fill merges n overrides of ns in workspace acme straight into the
// limiter's table (one batch: the endpoint's per-request path is tested
// elsewhere) and returns their patterns in byte order.
func fill(t *testing.T, tbl *policy.Table, ns string, n int, pattern func(int) string) []string {
	t.Helper()
	entries := make([]policy.Entry, n)
	patterns := make([]string, n)
	for i := range n {
		patterns[i] = pattern(i)
		entries[i] = policy.Entry{Key: policy.Key{Workspace: "acme", Namespace: ns, Pattern: patterns[i]},
			Override: policy.Override{Limit: int64(i), Duration: 60_000, Shadow: i%7 == 0},
			Version:  policy.Version{At: time.Now().UnixMilli(), Origin: "r1"}}
	}
	if got, err := tbl.Merge(entries...); err != nil || got != n {
		t.Fatalf("merge %d overrides: %d, %v", n, got, err)
	}
	slices.Sort(patterns)
	return patterns
}

// page asks for one page of override.list on nc in enc and returns the
// reply's body, decoded, its size, and its size with headers.
func page(t *testing.T, nc *nats.Conn, enc adminwire.Encoding, req adminwire.ListRequest) (adminwire.ListResponse, int, int) {
	t.Helper()
	msg := nats.NewMsg("ratelimit.admin.acme.override.list")
	msg.Data = req.Append(nil, enc)
	msg.Header.Set("Content-Type", enc.ContentType())
	resp, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("list %+v: %v", req, err)
	}
	if err := bus.ReplyError(resp); err != nil {
		t.Fatalf("list %+v: %v", req, err)
	}
	l, err := adminwire.DecodeListResponse(resp.Data, enc)
	if err != nil {
		t.Fatalf("list %+v: %v", req, err)
	}
	size := len(resp.Data) + len("NATS/1.0\r\n\r\n")
	for k, vs := range resp.Header {
		for _, v := range vs {
			size += len(k) + len(": \r\n") + len(v)
		}
	}
	return l, len(resp.Data), size
}

// 10,000 overrides of ~400-byte patterns (the workspace's bound), listed
// in pages in both encodings: every reply within the byte budget, so under
// the connection's max payload; every override exactly once, as stored, in
// (namespace, pattern) order; JSON pages end by bytes, msgpack ones by the
// limit; a namespace's listing holds only it, the workspace's every one.
func TestOverrideListPagesTenThousandOverridesUnderTheMaxPayload(t *testing.T) {
	r := newPolicyRig(t)
	tbl := r.svc.Policies()
	want := fill(t, tbl, "api", policy.MaxOverridesPerWorkspace-2, bigPattern)
	if _, err := tbl.Set(policy.Key{Workspace: "acme", Namespace: "web", Pattern: "w*"}, policy.Override{Limit: 1, Duration: 1000}, time.Now().UnixMilli(), "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Set(policy.Key{Workspace: "acme", Namespace: "aaa", Pattern: "a"}, policy.Override{Limit: 1, Duration: 1000}, time.Now().UnixMilli(), "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Set(policy.Key{Workspace: "globex", Namespace: "api", Pattern: "g"}, policy.Override{Limit: 1, Duration: 1000}, time.Now().UnixMilli(), "r1"); err != nil {
		t.Fatal(err)
	}
	maxPayload := int(r.nc.MaxPayload())
	budget := adminListBudget(r.lim.nc.MaxPayload())
	if budget != maxPayload/2 || maxPayload < 1<<20 {
		t.Fatalf("budget %d with max payload %d", budget, maxPayload)
	}
	for _, tc := range []struct {
		enc       adminwire.Encoding
		ns        string
		limit     int
		wantPages int // 0: more than 10 and fewer than 1000 a page
	}{
		{adminwire.Msgpack, "api", 0, 10},
		{adminwire.JSON, "api", 0, 0},
		{adminwire.Msgpack, "", 700, 15},
	} {
		var got []adminwire.Override
		req := adminwire.ListRequest{Namespace: tc.ns, Limit: tc.limit}
		pages := 0
		for {
			l, body, size := page(t, r.nc, tc.enc, req)
			pages++
			if size > maxPayload || body > budget {
				t.Fatalf("enc %d page %d: %d bytes (%d with headers), budget %d, max payload %d", tc.enc, pages, body, size, budget, maxPayload)
			}
			if len(l.Overrides) > req.PageLimit() || len(l.Overrides) == 0 {
				t.Fatalf("enc %d page %d: %d overrides, limit %d", tc.enc, pages, len(l.Overrides), req.PageLimit())
			}
			got = append(got, l.Overrides...)
			if l.Next == "" {
				break
			}
			req.Cursor = l.Next
			if pages > 100 {
				t.Fatal("no end")
			}
		}
		wantKeys := want
		if tc.ns == "" {
			wantKeys = append(append([]string{"aaa/a"}, want...), "web/w*")
		}
		if len(got) != len(wantKeys) {
			t.Fatalf("enc %d namespace %q: %d overrides in %d pages, want %d", tc.enc, tc.ns, len(got), pages, len(wantKeys))
		}
		for i, o := range got {
			k := o.Identifier
			if tc.ns == "" && o.Namespace != "api" {
				k = o.Namespace + "/" + o.Identifier
			}
			if k != wantKeys[i] {
				t.Fatalf("enc %d namespace %q: override %d is %s/%.20q, want %.20q", tc.enc, tc.ns, i, o.Namespace, o.Identifier, wantKeys[i])
			}
			e, ok := tbl.Get(policy.Key{Workspace: "acme", Namespace: o.Namespace, Pattern: o.Identifier})
			if !ok || adminwire.FromEntry(e) != o {
				t.Fatalf("override %d listed as %+v, stored %+v", i, o, e)
			}
		}
		if tc.wantPages != 0 && pages != tc.wantPages || tc.wantPages == 0 && (pages <= 10 || pages >= 1000) {
			t.Fatalf("enc %d namespace %q limit %d: %d pages", tc.enc, tc.ns, tc.limit, pages)
		}
	}
}

// The budget follows the connection's max payload: on a server whose
// max_payload is 64 KiB, pages of 1000 ~400-byte overrides would not fit,
// and every reply stays within half of it.
func TestOverrideListPagesFitASmallMaxPayload(t *testing.T) {
	srv := natstest.StartSecuredServer(t, &server.Options{MaxPayload: 64 << 10})
	svc := service.New(service.Config{})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	lnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lnc.Close)
	lim, err := Serve(lnc, LimiterConfig{Service: svc, Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Shutdown(context.Background()) })
	if err := lnc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	want := fill(t, svc.Policies(), "api", 1000, bigPattern)
	for _, enc := range []adminwire.Encoding{adminwire.JSON, adminwire.Msgpack} {
		var got []string
		var req adminwire.ListRequest
		pages := 0
		for {
			l, body, size := page(t, nc, enc, req)
			pages++
			if body > adminListBudget(64<<10) || size > 64<<10 {
				t.Fatalf("enc %d page %d: %d bytes (%d with headers), over half of 64 KiB", enc, pages, body, size)
			}
			for _, o := range l.Overrides {
				got = append(got, o.Identifier)
			}
			if req.Cursor = l.Next; l.Next == "" {
				break
			}
		}
		if !slices.Equal(got, want) || pages < 14 {
			t.Fatalf("enc %d: %d overrides in %d pages, want the %d in order", enc, len(got), pages, len(want))
		}
	}
	// Through the Go client, which follows the pages.
	list, err := bus.NewClient(nc, bus.WithEncoding(bus.JSON)).ListOverrides(t.Context(), "acme", "api")
	if err != nil || len(list) != len(want) {
		t.Fatalf("client: %d overrides, %v", len(list), err)
	}
}

// A listing in small pages while another client sets and deletes other
// patterns (new ones, replaced ones, deleted and set again) returns no
// override twice, in strictly increasing order, and every override that
// lived throughout.
func TestOverrideListUnderConcurrentSetsAndDeletes(t *testing.T) {
	r := newPolicyRig(t)
	stable := fill(t, r.svc.Policies(), "api", 3000, func(i int) string { return fmt.Sprintf("s%05d", i*2) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var churned sync.Map
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Odd numbers, interleaved with the stable ones, and
				// patterns before and after them all.
				p := []string{"s%05d", "a%05d", "z%05d"}[rnd.IntN(3)]
				p = fmt.Sprintf(p, 2*rnd.IntN(1000)+1) // at most 3000 more: within the bound
				var err error
				if rnd.IntN(3) == 0 {
					err = r.client.DeleteOverride(context.Background(), "acme", "api", p)
				} else {
					_, err = r.client.SetOverride(context.Background(), "acme", bus.Override{Namespace: "api", Identifier: p, Limit: rnd.Int64N(100), Duration: 60_000})
				}
				var se *bus.ServiceError
				if err != nil && !(errors.As(err, &se) && strings.Contains(se.Description, "no such override")) {
					t.Error(err)
					return
				}
				churned.Store(p, true)
			}
		}()
	}
	seen := map[string]bool{}
	pages := 0
	for _, cl := range []*bus.Client{r.client, r.json} {
		clear(seen)
		last, cursor := "", ""
		for {
			page, next, err := cl.ListOverridesPage(t.Context(), "acme", "api", cursor, 37)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, o := range page {
				if o.Identifier <= last || seen[o.Identifier] {
					t.Fatalf("%q listed after %q (seen before: %v)", o.Identifier, last, seen[o.Identifier])
				}
				seen[o.Identifier], last = true, o.Identifier
			}
			if next == "" {
				break
			}
			cursor = next
		}
		for _, p := range stable {
			if !seen[p] {
				t.Fatalf("%q, live throughout, missed", p)
			}
		}
	}
	close(stop)
	wg.Wait()
	n := 0
	churned.Range(func(any, any) bool { n++; return true })
	if n < 20 || pages < 160 {
		t.Fatalf("%d patterns churned over %d pages: the listing was not interleaved with changes", n, pages)
	}
}

// override.get answers the override of one pattern as stored, in both
// encodings; a pattern with no live override (never set, deleted, or only
// matched by a prefix) is a 400 saying no such override, as for delete; a
// bad body is a 400 saying what to fix. It is an endpoint of
// ratelimit-admin, counted in its stats.
func TestOverrideGetAnswersOnePatternAsStored(t *testing.T) {
	r := newPolicyRig(t)
	o := bus.Override{Namespace: "api", Identifier: "user_*", Limit: 5, Duration: 60_000, Shadow: true}
	r.set(t, o)
	r.set(t, bus.Override{Namespace: "api", Identifier: "gone", Limit: 1, Duration: 60_000})
	if err := r.client.DeleteOverride(t.Context(), "acme", "api", "gone"); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*bus.Client{r.client, r.json} {
		if got, err := cl.GetOverride(t.Context(), "acme", "api", "user_*"); err != nil || got != o {
			t.Fatalf("get: %+v, %v; want %+v", got, err, o)
		}
		for _, tc := range []struct{ ws, ns, pattern string }{
			{"acme", "api", "gone"}, {"acme", "api", "user_1"}, {"acme", "web", "user_*"}, {"globex", "api", "user_*"},
		} {
			_, err := cl.GetOverride(t.Context(), tc.ws, tc.ns, tc.pattern)
			var se *bus.ServiceError
			want := "get override: no such override: " + tc.ws + "/" + tc.ns + ` pattern "` + tc.pattern + `"`
			if !errors.As(err, &se) || se.Code != 400 || se.Description != want {
				t.Fatalf("get %+v: %v, want a 400 %q", tc, err, want)
			}
		}
	}
	// delete's message is worded alike.
	err := r.client.DeleteOverride(t.Context(), "acme", "api", "gone")
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Description != `delete override: no such override: acme/api pattern "gone"` {
		t.Fatalf("delete of a deleted pattern: %v", err)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"namespace":"api"}`, `missing field "identifier"`},
		{`{"namespace":"api","identifier":"a**b"}`, `pattern "a**b" has two adjacent *; one * already matches any run of bytes`},
		{`{"namespace":"api","identifier":"x","limit":1}`, `unknown field "limit"`},
		{`{"namespace":"a.b","identifier":"x"}`, "namespace"},
		{``, "JSON"},
		{`{"namespace":`, "JSON"},
	} {
		msg, err := r.nc.RequestWithContext(t.Context(), "ratelimit.admin.acme.override.get", []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var se *bus.ServiceError
		if err := bus.ReplyError(msg); !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, tc.want) {
			t.Fatalf("get %s: %v, want a 400 mentioning %q", tc.body, err, tc.want)
		}
	}
	if st := r.lim.AdminStats(); st.Gets != 2 || st.BadRequests != 8+1+6 {
		t.Fatalf("admin stats %+v, want 2 gets and 15 bad requests", st)
	}

	msg, err := r.nc.Request("$SRV.INFO."+AdminServiceName, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, e := range info.Endpoints {
		subjects = append(subjects, e.Name+"="+e.Subject)
	}
	if got := strings.Join(subjects, " "); !strings.Contains(got, "override-get=ratelimit.admin.*.override.get") || len(subjects) != 5 {
		t.Fatalf("ratelimit-admin endpoints: %s", got)
	}
}

// A bad cursor or limit is a 400 that says so, in either encoding, and
// changes nothing; a good cursor sent with another namespace is a bad one.
func TestOverrideListRefusesBadCursorsAndLimits(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "a", Limit: 1, Duration: 60_000})
	r.set(t, bus.Override{Namespace: "api", Identifier: "b", Limit: 1, Duration: 60_000})
	first, next, err := r.client.ListOverridesPage(t.Context(), "acme", "api", "", 1)
	if err != nil || len(first) != 1 || first[0].Identifier != "a" || next == "" {
		t.Fatalf("first page of 1: %+v, next %q, %v", first, next, err)
	}
	for _, cl := range []*bus.Client{r.client, r.json} {
		for _, tc := range []struct {
			ns, cursor string
			limit      int
			want       string
		}{
			{"api", "%%%", 0, "cursor is not one this service wrote (not base64url"},
			{"api", "AgNhcGkBYQ", 0, "(version 2, want 1)"},
			{"api", adminwire.EncodeCursor(policy.Position{Namespace: "api", Pattern: "a"})[:6], 0, "cursor is not one this service wrote"},
			{"web", next, 0, `cursor continues a listing of namespace "api", not of "web"`},
			{"api", next, 1001, "limit 1001 out of range 1..1000"},
			{"api", "", -1, "limit -1 out of range"},
		} {
			_, _, err := cl.ListOverridesPage(t.Context(), "acme", tc.ns, tc.cursor, tc.limit)
			var se *bus.ServiceError
			if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, tc.want) {
				t.Fatalf("list %+v: %v, want a 400 mentioning %q", tc, err, tc.want)
			}
		}
	}
	rest, end, err := r.json.ListOverridesPage(t.Context(), "acme", "", next, 0)
	if err != nil || len(rest) != 1 || rest[0].Identifier != "b" || end != "" {
		t.Fatalf("second page, every namespace: %+v, next %q, %v", rest, end, err)
	}
	if all, err := r.client.ListOverrides(t.Context(), "acme", ""); err != nil || len(all) != 2 {
		t.Fatalf("after the refusals: %+v, %v", all, err)
	}
}
