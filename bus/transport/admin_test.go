package transport

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// policyRig is a limiter on an embedded NATS server with a client that
// sends every check on its own (the checks message has its own test).
type policyRig struct {
	svc    *service.Service
	lim    *Limiter
	client *bus.Client
	json   *bus.Client
	nc     *nats.Conn
}

func newPolicyRig(t *testing.T) *policyRig {
	t.Helper()
	srv := natstest.Server(t)
	svc := service.New(service.Config{})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	lnc := natstest.Connect(t, srv)
	lim, err := Serve(lnc, LimiterConfig{Service: svc, Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := lnc.Flush(); err != nil { // the endpoints' subscriptions reach the server
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Shutdown(context.Background()) })
	nc := natstest.Connect(t, srv)
	return &policyRig{svc: svc, lim: lim, nc: nc,
		client: bus.NewClient(nc, bus.WithCoalescing(false)),
		json:   bus.NewClient(nc, bus.WithCoalescing(false), bus.WithEncoding(bus.JSON))}
}

func (r *policyRig) check(t *testing.T, ns, id string, limit int64, shadow bool) bus.CheckResponse {
	t.Helper()
	resp, err := r.client.Check(t.Context(), "acme", ns, bus.CheckRequest{Identifier: id, Limit: limit, Duration: 60_000, Shadow: shadow})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (r *policyRig) set(t *testing.T, o bus.Override) {
	t.Helper()
	got, err := r.client.SetOverride(t.Context(), "acme", o)
	if err != nil {
		t.Fatalf("set %+v: %v", o, err)
	}
	if got != o {
		t.Fatalf("set %+v: stored %+v", o, got)
	}
}

// admitted counts the successes of n checks, and the last reply.
func (r *policyRig) admitted(t *testing.T, n int, ns, id string, limit int64) (int, bus.CheckResponse) {
	t.Helper()
	ok := 0
	var last bus.CheckResponse
	for range n {
		last = r.check(t, ns, id, limit, false)
		if last.Success {
			ok++
		}
	}
	return ok, last
}

// Overrides replace the limit and duration checks carry: the exact pattern
// first, then the longest prefix; other namespaces and workspaces are not
// touched; the reply's limit is the one applied; list shows them in order;
// a delete gives the checks their own limit back.
func TestOverridesApplyExactThenLongestPrefix(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "user_*", Limit: 5, Duration: 60_000})
	r.set(t, bus.Override{Namespace: "api", Identifier: "user_vip*", Limit: 7, Duration: 60_000})
	r.set(t, bus.Override{Namespace: "api", Identifier: "user_1", Limit: 2, Duration: 60_000})

	for _, tc := range []struct {
		ns, id string
		want   int64
	}{
		{"api", "user_1", 2},     // exact
		{"api", "user_vip_9", 7}, // the longer prefix
		{"api", "user_2", 5},     // the prefix
		{"api", "org_1", 100},    // no match: the request's limit
		{"other", "user_1", 100}, // another namespace
		{"api", "user_", 5},      // the prefix itself
		{"api", "user_1x", 5},    // the exact pattern is not a prefix
		{"api", "user_vip", 7},   // the longer prefix itself
		{"api", "USER_1", 100},   // bytes, not case
		{"api", "xuser_1", 100},  // prefixes anchor at the start
		{"api", "user_vip*", 7},  // a '*' in an identifier is a byte
		{"api", "user_1\x00", 5}, // any bytes
		{"api", "user_9_*", 5},   // as above
		{"api", "user_vi", 5},    // shorter than the longer prefix
		{"api", "us", 100},       // shorter than every prefix
		{"api", "user_vip_9", 7}, // again: the bucket's cached match
		{"api", "user_1", 2},     // again (denied now: 2 were spent)
		{"other", "user_2", 100}, // again, another namespace
		{"api", "org_1", 100},    // again, no match
	} {
		if got := r.check(t, tc.ns, tc.id, 100, false); got.Limit != tc.want {
			t.Fatalf("%s/%q: limit %d, want %d", tc.ns, tc.id, got.Limit, tc.want)
		}
	}
	// Counted against the override: user_2 had 5, user_1 2.
	if ok, last := r.admitted(t, 10, "api", "user_3", 100); ok != 5 || last.Success || last.Limit != 5 {
		t.Fatalf("user_3 under user_*: %d admitted, last %+v; want 5 and a denial at limit 5", ok, last)
	}

	list, err := r.client.ListOverrides(t.Context(), "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range list {
		names = append(names, o.Namespace+"/"+o.Identifier+"="+strconv.FormatInt(o.Limit, 10))
	}
	if got := strings.Join(names, " "); got != "api/user_*=5 api/user_1=2 api/user_vip*=7" {
		t.Fatalf("list: %s", got)
	}
	if other, err := r.client.ListOverrides(t.Context(), "acme", "other"); err != nil || len(other) != 0 {
		t.Fatalf("list of namespace other: %v, %v", other, err)
	}
	if other, err := r.json.ListOverrides(t.Context(), "globex", ""); err != nil || len(other) != 0 {
		t.Fatalf("another workspace sees %v, %v", other, err)
	}

	if err := r.json.DeleteOverride(t.Context(), "acme", "api", "user_*"); err != nil {
		t.Fatal(err)
	}
	if got := r.check(t, "api", "user_4", 100, false); got.Limit != 100 || !got.Success {
		t.Fatalf("after the delete: %+v, want the request's limit 100", got)
	}
	if got := r.check(t, "api", "user_vip_9", 100, false); got.Limit != 7 {
		t.Fatalf("the other prefix went with the delete: %+v", got)
	}
	err = r.client.DeleteOverride(t.Context(), "acme", "api", "user_*")
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, "no such override") {
		t.Fatalf("second delete: %v, want a 400 saying no such override", err)
	}
}

// An override's duration replaces the request's: its cells are those of
// the override's window, whatever duration the requests carry, so requests
// sent with different durations count together.
func TestAnOverridesDurationIsTheWindow(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "k", Limit: 3, Duration: 3_600_000})
	now := r.svc.Now().UnixMilli()
	admitted := 0
	for i, d := range []int64{1000, 60_000, 5000, 60_000, 1000} {
		resp, err := r.client.Check(t.Context(), "acme", "api", bus.CheckRequest{Identifier: "k", Limit: 100, Duration: d})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Limit != 3 {
			t.Fatalf("check %d: limit %d, want 3", i, resp.Limit)
		}
		if want := (now/3_600_000 + 1) * 3_600_000; resp.Reset != want && resp.Reset != want+3_600_000 {
			t.Fatalf("check %d: reset %d, want the end of the hour window %d", i, resp.Reset, want)
		}
		if resp.Success {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d admitted across durations, want 3 (one window)", admitted)
	}
}

// Shadow mode, per override and per request: counted exactly as if
// enforced, never denied; where enforcement would deny, success with
// shadow_denied and retry_after 0, counted by workspace and namespace.
func TestShadowModeCountsAsEnforcedAndNeverDenies(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "s", Limit: 3, Duration: 60_000, Shadow: true})
	for i := range 10 {
		got := r.check(t, "api", "s", 100, false)
		if !got.Success || got.Limit != 3 || got.RetryAfter != 0 {
			t.Fatalf("shadow check %d: %+v", i, got)
		}
		if want := i >= 3; got.ShadowDenied != want {
			t.Fatalf("shadow check %d: shadow_denied %v, want %v", i, got.ShadowDenied, want)
		}
		if want := max(0, 2-int64(i)); got.Remaining != want {
			t.Fatalf("shadow check %d: remaining %d, want %d", i, got.Remaining, want)
		}
	}
	// Enforced again: what shadow mode admitted was counted, nothing more.
	r.set(t, bus.Override{Namespace: "api", Identifier: "s", Limit: 4, Duration: 60_000})
	if ok, last := r.admitted(t, 3, "api", "s", 100); ok != 1 || last.Success || last.ShadowDenied {
		t.Fatalf("enforced after shadow: %d admitted (want 1 of 4 left), last %+v", ok, last)
	}

	// Per request, in JSON too.
	for i := range 4 {
		resp, err := r.json.Check(t.Context(), "acme", "web", bus.CheckRequest{Identifier: "q", Limit: 2, Duration: 60_000, Shadow: true})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Success || resp.ShadowDenied != (i >= 2) {
			t.Fatalf("request shadow %d: %+v", i, resp)
		}
	}
	if got := r.check(t, "api", "other", 1, true); !got.Success || got.ShadowDenied {
		t.Fatalf("a shadow check within its limit: %+v", got)
	}
	counts := map[string]int64{}
	r.svc.ShadowDenials(func(ws, ns string, n int64) bool { counts[ws+"/"+ns] = n; return true })
	if counts["acme/api"] != 7 || counts["acme/web"] != 2 || len(counts) != 2 {
		t.Fatalf("shadow denials %v, want acme/api 7 and acme/web 2", counts)
	}
	if st := r.lim.Stats(); st.Denied != 2 {
		t.Fatalf("limiter counted %d denials, want the 2 enforced ones (shadow denials answer success)", st.Denied)
	}
}

// A batch that only shadow checks' denials refuse answers success, counts
// nothing (as enforcement refuses it), and says shadow_denied for each
// check; an enforced denial refuses it as before.
func TestABatchRefusedOnlyByShadowChecksAnswersSuccess(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "full", Limit: 0, Duration: 60_000, Shadow: true})
	batch := []bus.BatchCheck{
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "full", Limit: 10, Duration: 60_000}},
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "free", Limit: 10, Duration: 60_000}},
	}
	resp, err := r.client.Batch(t.Context(), "acme", batch)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Success || !resp.Results[0].ShadowDenied || !resp.Results[1].ShadowDenied || resp.Results[0].Limit != 0 {
		t.Fatalf("batch refused only by a shadow check: %+v", resp)
	}
	if got := r.check(t, "api", "free", 10, false); got.Remaining != 9 {
		t.Fatalf("the batch counted something: free has %d left after one check, want 9", got.Remaining)
	}
	batch[1].CheckRequest.Limit = 1 // free is full now: an enforced denial
	resp, err = r.client.Batch(t.Context(), "acme", batch)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Success || resp.Results[1].Success || resp.Results[1].ShadowDenied || !resp.Results[0].ShadowDenied {
		t.Fatalf("batch with an enforced denial: %+v", resp)
	}
}

// Overrides and shadow mode apply to the checks of a checks message as to
// checks sent alone.
func TestOverridesApplyToChecksMessages(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "m*", Limit: 2, Duration: 60_000})
	coalescing := bus.NewClient(r.nc, bus.WithCoalesceLimits(64, 1))
	// One call in flight at a time makes the rest wait and go together.
	results := make([]bus.CheckResponse, 24)
	errs := make([]error, len(results))
	done := make(chan int)
	for i := range results {
		go func() {
			results[i], errs[i] = coalescing.Check(context.Background(), "acme", "api",
				bus.CheckRequest{Identifier: "m" + strconv.Itoa(i%3), Limit: 50, Duration: 60_000, Shadow: i%3 == 2})
			done <- i
		}()
	}
	for range results {
		<-done
	}
	admitted := map[int]int{}
	shadowDenied := 0
	for i, res := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if res.Limit != 2 {
			t.Fatalf("check %d: limit %d, want the override's 2", i, res.Limit)
		}
		if res.Success && !res.ShadowDenied {
			admitted[i%3]++
		}
		if res.ShadowDenied {
			shadowDenied++
		}
		if !res.Success && i%3 == 2 {
			t.Fatalf("a shadow check was denied: %+v", res)
		}
	}
	if admitted[0] != 2 || admitted[1] != 2 || admitted[2] != 2 || shadowDenied != 6 {
		t.Fatalf("admitted %v, shadow denied %d; want 2 per identifier and 6", admitted, shadowDenied)
	}
}

// Bad admin requests get a 400 that says what to fix and change nothing;
// a workspace holds at most policy.MaxOverridesPerWorkspace overrides, and
// one more is refused while replacing one is not.
func TestAdminRefusesBadRequestsAndBoundsAWorkspace(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "keep", Limit: 1, Duration: 60_000})
	for _, tc := range []struct {
		name, subject, body, want string
	}{
		{"not JSON", "ratelimit.admin.acme.override.set", `{"namespace":`, "JSON"},
		{"unknown field", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"x","limit":1,"duration":60000,"colour":1}`, "colour"},
		{"missing limit", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"x","duration":60000}`, "limit"},
		{"limit too big", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"x","limit":1000000000000001,"duration":60000}`, "limit"},
		{"duration too short", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"x","limit":1,"duration":999}`, "duration"},
		{"two adjacent stars", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"a**b","limit":1,"duration":60000}`, "two adjacent *"},
		{"float", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"x","limit":1.5,"duration":60000}`, "limit"},
		{"bad namespace", "ratelimit.admin.acme.override.set", `{"namespace":"a.b","identifier":"x","limit":1,"duration":60000}`, "namespace"},
		{"oversized", "ratelimit.admin.acme.override.set", `{"namespace":"api","identifier":"` + strings.Repeat("x", 9000) + `","limit":1,"duration":60000}`, "bytes"},
		{"delete of nothing", "ratelimit.admin.acme.override.delete", `{"namespace":"api","identifier":"nothing"}`, "no such override"},
		{"list with a pattern", "ratelimit.admin.acme.override.list", `{"namespace":"api","identifier":"x"}`, "identifier"},
	} {
		msg, err := r.nc.RequestWithContext(t.Context(), tc.subject, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err = bus.ReplyError(msg)
		var se *bus.ServiceError
		if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, tc.want) {
			t.Fatalf("%s: %v, want a 400 mentioning %q", tc.name, err, tc.want)
		}
	}
	if list, err := r.client.ListOverrides(t.Context(), "acme", ""); err != nil || len(list) != 1 || list[0].Identifier != "keep" {
		t.Fatalf("bad requests changed the overrides: %+v, %v", list, err)
	}

	// The bound: fill the workspace through the table (fast), then ask
	// the endpoint for one more.
	tbl := r.svc.Policies()
	now := r.svc.Now().UnixMilli()
	for i := tbl.Len("acme"); i < policy.MaxOverridesPerWorkspace; i++ {
		if _, err := tbl.Set(policy.Key{Workspace: "acme", Namespace: "api", Pattern: "p" + strconv.Itoa(i)},
			policy.Override{Limit: 1, Duration: 60_000}, now, "r1"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r.client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "one-more", Limit: 1, Duration: 60_000})
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, "delete some first") {
		t.Fatalf("one override past the bound: %v, want a 400", err)
	}
	r.set(t, bus.Override{Namespace: "api", Identifier: "keep", Limit: 9, Duration: 60_000})
	if got := r.check(t, "api", "one-more", window.MaxLimit, false); got.Limit != window.MaxLimit {
		t.Fatalf("the refused override applies: %+v", got)
	}
	if st := r.lim.AdminStats(); st.BadRequests != 12 {
		t.Fatalf("admin stats %+v, want 12 bad requests", st)
	}
}
