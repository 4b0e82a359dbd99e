package rls

import (
	"context"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/service"
)

const testConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: open
  - key: year
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: gold
    rate_limit: {name: gold, unlimited: true}
  - key: promo
    rate_limit: {unit: second, requests_per_unit: 2, replaces: [{name: gold}, {name: route_limit}]}
---
domain: "example 7 / with spaces"
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`

type harness struct {
	now    atomic.Int64
	svc    *service.Service
	srv    *Server
	client rlsv3.RateLimitServiceClient
	reg    *prometheus.Registry
}

func newHarness(t *testing.T, headers bool) *harness {
	t.Helper()
	return newHarnessOf(t, testConfig, ServerConfig{ResponseHeaders: headers})
}

// newHarnessOf is newHarness on the configuration conf, with cfg's fields
// (its Service and Metrics are the harness's).
func newHarnessOf(t *testing.T, conf string, cfg ServerConfig) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry()}
	h.now.Store(1_800_000_000_000) // a whole second, minute and hour
	h.svc = service.New(service.Config{Now: func() time.Time { return time.UnixMilli(h.now.Load()) }})
	t.Cleanup(func() { _ = h.svc.Close(context.Background()) })
	parsed, err := Parse(File{Name: "test.yaml", Data: []byte(conf)})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Service, cfg.Metrics = h.svc, NewMetrics(h.reg)
	h.srv, err = NewServer(cfg, parsed)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPC(h.srv, nil, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(context.Background()) })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	h.client = rlsv3.NewRateLimitServiceClient(cc)
	return h
}

// desc builds a descriptor from "key=value" entries.
func desc(kvs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, e := range ent(kvs...) {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
	}
	return d
}

func (h *harness) call(t *testing.T, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// codes returns the overall code and each status's code, remaining.
func summary(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, s := range r.Statuses {
		b.WriteString(" ")
		b.WriteString(s.Code.String())
		switch {
		case s.LimitRemaining == math.MaxUint32:
			b.WriteString("/max")
		case s.CurrentLimit != nil:
			b.WriteString("/" + strconv.FormatUint(uint64(s.LimitRemaining), 10))
		}
	}
	return b.String()
}

func TestLimitCountsUpToItAndSaysWhenToRetry(t *testing.T) {
	h := newHarness(t, false)
	for i, want := range []string{"OK OK/2", "OK OK/1", "OK OK/0", "OVER_LIMIT OVER_LIMIT/0"} {
		if got := summary(h.call(t, "api", 0, desc("user=alice"))); got != want {
			t.Fatalf("call %d: %s, want %s", i, got, want)
		}
	}
	h.now.Add(250)
	r := h.call(t, "api", 0, desc("user=alice"))
	st := r.Statuses[0]
	if st.CurrentLimit.RequestsPerUnit != 3 || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Errorf("current_limit %v", st.CurrentLimit)
	}
	// Sliding window: 3 used in this second; the next one fits once the
	// second is over and its 3 weigh no more than 2, a third of the way into
	// the next: 750 + 334 ms from now.
	if d := st.DurationUntilReset.AsDuration(); d != 1084*time.Millisecond {
		t.Errorf("duration_until_reset %v, want 1.084s", d)
	}
	// Another identifier has its own cell.
	if got := summary(h.call(t, "api", 0, desc("user=bob"))); got != "OK OK/2" {
		t.Errorf("bob: %s", got)
	}
	// An admitted status's reset is the end of the current window.
	h.now.Add(1000)
	r = h.call(t, "api", 0, desc("user=carol"))
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d != 750*time.Millisecond {
		t.Errorf("admitted duration_until_reset %v, want 750ms", d)
	}
}

// Statuses follow the descriptors; nothing is counted when any is over.
func TestStatusesInOrderAndNothingCountedWhenOneIsOver(t *testing.T) {
	h := newHarness(t, false)
	h.call(t, "api", 3, desc("user=alice")) // exhaust alice
	r := h.call(t, "api", 0, desc("route=/a"), desc("nomatch=x"), desc("user=alice"), desc("free=1"), desc("open=1"))
	if got, want := summary(r), "OVER_LIMIT OK/10 OK OVER_LIMIT/0 OK/max OK"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if r.Statuses[0].CurrentLimit == nil || r.Statuses[1].CurrentLimit != nil || r.Statuses[4].CurrentLimit != nil {
		t.Errorf("current_limit present on the wrong statuses: %v", r.Statuses)
	}
	// route=/a was not counted.
	if got := summary(h.call(t, "api", 0, desc("route=/a"))); got != "OK OK/9" {
		t.Errorf("route after the refused request: %s, want OK OK/9", got)
	}
	// Unknown domain: OK, no limits.
	if got := summary(h.call(t, "nope", 0, desc("user=alice"))); got != "OK OK" {
		t.Errorf("unknown domain: %s", got)
	}
}

func TestHitsAddend(t *testing.T) {
	h := newHarness(t, false)
	// Request-level hits 2, then a per-descriptor 0 only looks.
	if got := summary(h.call(t, "api", 2, desc("user=a"))); got != "OK OK/1" {
		t.Fatalf("hits 2: %s", got)
	}
	look := desc("user=a")
	look.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		if got := summary(h.call(t, "api", 0, look)); got != "OK OK/1" {
			t.Fatalf("look: %s", got)
		}
	}
	// Per-descriptor hits override the request's.
	two := desc("user=a")
	two.HitsAddend = wrapperspb.UInt64(2)
	if got := summary(h.call(t, "api", 1, two)); got != "OVER_LIMIT OVER_LIMIT/1" {
		t.Fatalf("2 more of 1 left: %s", got)
	}
	if got := summary(h.call(t, "api", 1, desc("user=a"))); got != "OK OK/0" {
		t.Fatalf("1 of 1 left: %s", got)
	}
	// A look at an exhausted limit is OK (the count is not over it).
	if got := summary(h.call(t, "api", 0, look)); got != "OK OK/0" {
		t.Fatalf("look at the limit: %s", got)
	}
}

func TestOverrideReplacesTheConfiguredLimit(t *testing.T) {
	h := newHarness(t, false)
	d := desc("user=o")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	r := h.call(t, "api", 0, d)
	if got := summary(r); got != "OK OK/0" {
		t.Fatalf("override: %s", got)
	}
	if cl := r.Statuses[0].CurrentLimit; cl.RequestsPerUnit != 1 || cl.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("current_limit %v", cl)
	}
	if got := summary(h.call(t, "api", 0, d)); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Fatalf("override exhausted: %s", got)
	}
	// A descriptor no rule matches takes its override too; an unknown
	// domain takes none (as upstream).
	u := desc("unmatched=1")
	u.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}
	if got := summary(h.call(t, "api", 0, u)); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Errorf("override of an unmatched descriptor: %s", got)
	}
	if got := summary(h.call(t, "nope", 0, u)); got != "OK OK" {
		t.Errorf("override in an unknown domain: %s", got)
	}
	// A multiplier: 2 per 2 minutes.
	m := desc("user=m")
	m.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)}
	r = h.call(t, "api", 0, m)
	if r.Statuses[0].CurrentLimit.GetUnitMultiplier().GetValue() != 2 || r.Statuses[0].DurationUntilReset.AsDuration() > 2*time.Minute ||
		r.Statuses[0].DurationUntilReset.AsDuration() <= time.Minute {
		t.Errorf("multiplied override: %v", r.Statuses[0])
	}
}

func TestShadowModeAnswersOKAndCounts(t *testing.T) {
	h := newHarness(t, false)
	h.call(t, "api", 0, desc("shadow=s"))
	r := h.call(t, "api", 0, desc("shadow=s"), desc("route=/r"))
	if got := summary(r); got != "OK OK/0 OK/9" {
		t.Fatalf("shadow over its limit: %s", got)
	}
	// The enforced route was counted although the shadow limit was over.
	if got := summary(h.call(t, "api", 0, desc("route=/r"))); got != "OK OK/8" {
		t.Errorf("route: %s", got)
	}
	if v := testutil.ToFloat64(h.srv.cfg.Metrics.shadow.WithLabelValues("api", "shadow")); v != 1 {
		t.Errorf("shadow_mode_total %v, want 1", v)
	}
	if v := testutil.ToFloat64(h.srv.cfg.Metrics.hits.WithLabelValues("api", "route")); v != 2 {
		t.Errorf("hits_total of route %v, want 2", v)
	}
	// A request refused by an enforced limit does not count in shadow limits.
	h.call(t, "api", 3, desc("user=x"))
	if got := summary(h.call(t, "api", 0, desc("user=x"), desc("shadow=t"))); got != "OVER_LIMIT OVER_LIMIT/0 OK/1" {
		t.Fatalf("refused with a shadow limit: %s", got)
	}
	if got := summary(h.call(t, "api", 0, desc("shadow=t"))); got != "OK OK/0" {
		t.Errorf("shadow=t counted by the refused request: %s", got)
	}
}

// A request is over its quota_mode limits only when every one of them is
// over; a request they refuse counts nothing, anywhere (its enforced
// limits included), and an admitted one counts its enforced limits and the
// quotas it fits, never a quota it is over.
func TestQuotaModeIsOverOnlyWhenEveryQuotaIs(t *testing.T) {
	h := newHarness(t, false)
	h.call(t, "api", 0, desc("quota=q")) // q holds 1 a second: spent
	if got := summary(h.call(t, "api", 0, desc("quota=q"), desc("route=/q"))); got != "OVER_LIMIT OVER_LIMIT/0 OK/10" {
		t.Fatalf("the only quota over: %s", got)
	}
	if got := summary(h.call(t, "api", 0, desc("route=/q"))); got != "OK OK/9" {
		t.Fatalf("route after the request its quota refused: %s, want OK OK/9 (the refusal counted nothing)", got)
	}
	if got := summary(h.call(t, "api", 0, desc("quota=q"), desc("quota=other"), desc("route=/q"))); got != "OK OVER_LIMIT/0 OK/0 OK/8" {
		t.Fatalf("one quota of two over: %s", got)
	}
	// The quota that fitted was counted, the route too, the other not.
	if got := summary(h.call(t, "api", 0, desc("quota=other"))); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Fatalf("quota=other after it fitted: %s", got)
	}
	if got := summary(h.call(t, "api", 0, desc("route=/q"))); got != "OK OK/7" {
		t.Fatalf("route after the admitted request: %s", got)
	}
	// An enforced limit over refuses the request whatever its quotas say,
	// and nothing is counted: quota=fresh still has its 1.
	h.call(t, "api", 3, desc("user=quota"))
	if got := summary(h.call(t, "api", 0, desc("quota=fresh"), desc("user=quota"))); got != "OVER_LIMIT OK/1 OVER_LIMIT/0" {
		t.Fatalf("an enforced limit over with a quota that fits: %s", got)
	}
	if got := summary(h.call(t, "api", 0, desc("quota=fresh"))); got != "OK OK/0" {
		t.Fatalf("quota=fresh after the refused request: %s, want OK OK/0 (not counted by it)", got)
	}
}

// An override in shadow mode on the RLS's workspace is honoured as every
// door honours it: a check enforcement would deny is answered OK (and not
// counted, policy.ShadowReply's rule), the request passes, so its other
// enforced limits count it. Every status reports the limit that applied,
// an override's when one did, in current_limit and the response headers,
// and limit_remaining is against that limit.
func TestShadowOverrideAnswersOKAndTheAppliedLimitIsReported(t *testing.T) {
	h := newHarness(t, true)
	set := func(id string, limit int64, shadow bool) {
		t.Helper()
		if _, err := h.svc.Policies().Set(policy.Key{Workspace: DefaultWorkspace, Namespace: "api", Pattern: id},
			policy.Override{Limit: limit, Duration: 60_000, Shadow: shadow}, h.now.Load(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	headers := func(r *rlsv3.RateLimitResponse) string {
		hs := map[string]string{}
		for _, hv := range r.ResponseHeadersToAdd {
			hs[hv.Key] = hv.Value
		}
		return hs[HeaderLimit] + "/" + hs[HeaderRemaining]
	}
	set("user=alice", 1, true)
	r := h.call(t, "api", 0, desc("user=alice"))
	if got := summary(r); got != "OK OK/0" {
		t.Fatalf("first call under a shadow override of 1: %s", got)
	}
	// Enforcement would deny the second: shadow mode answers OK.
	r = h.call(t, "api", 0, desc("user=alice"), desc("route=/s"))
	if got := summary(r); got != "OK OK/0 OK/9" {
		t.Fatalf("over a shadow override: %s, want OK OK/0 OK/9", got)
	}
	if cl := r.Statuses[0].CurrentLimit; cl.GetRequestsPerUnit() != 1 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || cl.GetUnitMultiplier() != nil {
		t.Errorf("current_limit %v, want the override's 1 per MINUTE", cl)
	}
	if got := headers(r); got != "1/0" {
		t.Errorf("RateLimit-Limit/Remaining %s, want 1/0", got)
	}
	// The request passed: the route counted it.
	if got := summary(h.call(t, "api", 0, desc("route=/s"))); got != "OK OK/8" {
		t.Errorf("route after the shadow denial: %s, want OK OK/8", got)
	}
	if v := testutil.ToFloat64(h.srv.cfg.Metrics.shadow.WithLabelValues("api", "user")); v != 1 {
		t.Errorf("shadow_mode_total of user %v, want 1", v)
	}
	// Alone: OK too, through the single-check path.
	if got := summary(h.call(t, "api", 0, desc("user=alice"))); got != "OK OK/0" {
		t.Errorf("alone over a shadow override: %s", got)
	}
	// An enforced override: its limit reported, and enforced.
	set("user=bob", 2, false)
	r = h.call(t, "api", 0, desc("user=bob"))
	if cl := r.Statuses[0].CurrentLimit; summary(r) != "OK OK/1" || cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("under an override of 2 a minute: %s, current_limit %v", summary(r), cl)
	}
	if got := headers(r); got != "2/1" {
		t.Errorf("RateLimit-Limit/Remaining %s, want 2/1", got)
	}
	h.call(t, "api", 0, desc("user=bob"))
	if got := summary(h.call(t, "api", 0, desc("user=bob"))); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Errorf("third under an enforced override of 2: %s", got)
	}
	// Overrides of durations no single unit spells: a multiplier, or the
	// unit left UNKNOWN where no whole number of seconds is.
	for _, c := range []struct {
		duration int64
		unit     rlsv3.RateLimitResponse_RateLimit_Unit
		mult     uint32
	}{
		{90_000, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{7 * 24 * 3600_000, rlsv3.RateLimitResponse_RateLimit_WEEK, 0},
		{2 * 3600_000, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{1500, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
	} {
		id := "user=d" + strconv.FormatInt(c.duration, 10)
		if _, err := h.svc.Policies().Set(policy.Key{Workspace: DefaultWorkspace, Namespace: "api", Pattern: id},
			policy.Override{Limit: 5, Duration: c.duration}, h.now.Load(), "test"); err != nil {
			t.Fatal(err)
		}
		cl := h.call(t, "api", 0, desc(id)).Statuses[0].CurrentLimit
		if cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != c.unit || cl.GetUnitMultiplier().GetValue() != c.mult {
			t.Errorf("override of %d ms: current_limit %v, want 5 per %v × %d", c.duration, cl, c.unit, c.mult)
		}
	}
}

// More descriptors in one call than ServerConfig.MaxDescriptors, or more
// entries in one descriptor than MaxEntries (64 each by default), are refused with INVALID_ARGUMENT before
// anything is counted.
func TestOversizedRequestsAreRefusedBeforeAnythingIsCounted(t *testing.T) {
	h := newHarness(t, false)
	many := make([]*rlv3.RateLimitDescriptor, 65) // the default bound is 64
	for i := range many {
		many[i] = desc("route=/" + strconv.Itoa(i))
	}
	_, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "65 descriptors in one call: at most 64") {
		t.Fatalf("%d descriptors: %v, want InvalidArgument saying how many are accepted", len(many), err)
	}
	if got := summary(h.call(t, "api", 0, desc("route=/0"))); got != "OK OK/9" {
		t.Fatalf("route=/0 after the refused call: %s, want OK OK/9 (nothing counted)", got)
	}
	// At the bound, served.
	if r := h.call(t, "api", 0, many[1:]...); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%d descriptors: %v", len(many)-1, r.OverallCode)
	}
	long := desc("user=l")
	for i := range 64 { // 65 entries with user=l; the default bound is 64
		long.Entries = append(long.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(i), Value: "v"})
	}
	_, err = h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*rlv3.RateLimitDescriptor{desc("user=l"), long}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1 has 65 entries: at most 64") {
		t.Fatalf("a descriptor of %d entries: %v", len(long.Entries), err)
	}
	if got := summary(h.call(t, "api", 0, desc("user=l"))); got != "OK OK/2" {
		t.Fatalf("user=l after the refused call: %s, want OK OK/2", got)
	}
}

// Example 7 of upstream's README: (key_1, user) is replaced when
// (key_2, user) matches in the same request, and keeps its own count.
func TestReplaces(t *testing.T) {
	h := newHarness(t, false)
	const d = "example 7 / with spaces"
	r := h.call(t, d, 0, desc("key_1=value_1", "user=bkthomps"), desc("key_2=value_2", "user=bkthomps"))
	if got := summary(r); got != "OK OK OK/9" {
		t.Fatalf("replaced: %s", got)
	}
	if got := summary(h.call(t, d, 0, desc("key_1=value_1", "user=bkthomps"))); got != "OK OK/4" {
		t.Fatalf("the replaced limit alone: %s (its count must be untouched)", got)
	}
}

// An unlimited limit is never replaced (as upstream): its status stays
// unlimited when a replacing limit matches in the same request.
func TestUnlimitedIsNotReplaced(t *testing.T) {
	h := newHarness(t, false)
	if got := summary(h.call(t, "api", 0, desc("gold=g"), desc("promo=p"))); got != "OK OK/max OK/1" {
		t.Errorf("unlimited with a replacing limit: %s", got)
	}
}

func TestYearUnitIsOneSlidingWindowOf365Days(t *testing.T) {
	h := newHarness(t, false)
	r := h.call(t, "api", 0, desc("year=y"))
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 365*24*time.Hour {
		t.Errorf("year reset %v", d)
	}
	h.call(t, "api", 0, desc("year=y"))
	if got := summary(h.call(t, "api", 0, desc("year=y"))); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Errorf("third in a year of 2: %s", got)
	}
}

func TestResponseHeadersNameTheClosestLimit(t *testing.T) {
	h := newHarness(t, true)
	r := h.call(t, "api", 0, desc("route=/h"), desc("user=h"), desc("free=1"))
	hs := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		hs[hv.Key] = hv.Value
	}
	if hs[HeaderLimit] != "3" || hs[HeaderRemaining] != "2" || hs[HeaderReset] != "1" {
		t.Errorf("headers %v, want the user limit's: 3, 2, 1", hs)
	}
	if r := h.call(t, "api", 0, desc("open=1")); len(r.ResponseHeadersToAdd) != 0 {
		t.Errorf("headers without a limit: %v", r.ResponseHeadersToAdd)
	}
}

func TestInvalidRequestsAreRefused(t *testing.T) {
	h := newHarness(t, false)
	neg := desc("user=n")
	neg.IsNegativeHits = true
	week := desc("user=w")
	week.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_UNKNOWN}
	long := desc("user=l")
	long.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(2)}
	huge := desc("user=h")
	huge.HitsAddend = wrapperspb.UInt64(1 << 62)
	cases := []struct {
		req *rlsv3.RateLimitRequest
		msg string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a=b")}}, "domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "api"}, "descriptor list must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{neg}}, "is_negative_hits"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("a=b"), week}}, "descriptor 1: limit override has unit UNKNOWN"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{long}}, "not 1 second to 366 days"},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{huge}}, "hits_addend"},
	}
	for _, tc := range cases {
		_, err := h.client.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: error %v, want InvalidArgument saying %q", tc.req, err, tc.msg)
		}
	}
	// Descriptors without a limit are not held to a check's bounds.
	free := desc("nomatch=x")
	free.IsNegativeHits = true
	free.HitsAddend = wrapperspb.UInt64(1 << 62)
	if got := summary(h.call(t, "api", 0, free)); got != "OK OK" {
		t.Errorf("an unmatched descriptor with negative or huge hits: %s", got)
	}
	// The server keeps serving, and nothing was counted.
	if got := summary(h.call(t, "api", 0, desc("user=h"))); got != "OK OK/2" {
		t.Errorf("after invalid requests: %s", got)
	}
	if v := testutil.ToFloat64(h.srv.cfg.Metrics.calls.WithLabelValues("invalidargument")); v != float64(len(cases)) {
		t.Errorf("calls_total{outcome=invalidargument} %v", v)
	}
}

// A caller's deadline is met: the call decides before it, even when the
// decision cannot wait on anything (here the service has no origin, so
// this checks that the deadline is passed on and honoured, not exceeded).
func TestSetConfigSwapsForLaterCalls(t *testing.T) {
	h := newHarness(t, false)
	c, err := Parse(File{Name: "new.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n")})
	if err != nil {
		t.Fatal(err)
	}
	h.srv.SetConfig(c)
	if got := summary(h.call(t, "api", 0, desc("user=s"))); got != "OK OK/99" {
		t.Errorf("after SetConfig: %s", got)
	}
	if got := summary(h.call(t, "api", 0, desc("route=/x"))); got != "OK OK" {
		t.Errorf("a rule the new configuration dropped: %s", got)
	}
}

// The rate limit service and the NATS checks are doors onto the same cells:
// a check of the documented cell name sees what ShouldRateLimit counted,
// and the other way round.
func TestNATSChecksShareTheDocumentedCell(t *testing.T) {
	h := newHarness(t, false)
	h.call(t, "api", 2, desc("user=alice"))
	q := service.Query{Workspace: "envoy", Namespace: "api", Identifier: "user=alice", Limit: 3, Duration: 1000, Cost: 1}
	d, err := h.svc.Check(context.Background(), q)
	if err != nil || !d.Admitted || d.Remaining != 0 {
		t.Fatalf("the NATS side's check: %+v %v, want admitted with 0 left", d, err)
	}
	if got := summary(h.call(t, "api", 0, desc("user=alice"))); got != "OVER_LIMIT OVER_LIMIT/0" {
		t.Errorf("after the NATS side spent the last: %s", got)
	}
}

// Any request is answered without panicking: an error, or one status per
// descriptor in order, OVER_LIMIT overall exactly when an enforced status
// is, and never more remaining than the limit.
func FuzzShouldRateLimit(f *testing.F) {
	svc := service.New(service.Config{})
	f.Cleanup(func() { _ = svc.Close(context.Background()) })
	conf, err := Parse(File{Name: "test.yaml", Data: []byte(testConfig)})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: svc, Metrics: NewMetrics(prometheus.NewRegistry()), ResponseHeaders: true}, conf)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("api", "user", "alice", "route", "/x", uint32(1), uint64(2), uint32(3), uint32(2), false)
	f.Add("example 7 / with spaces", "key_1", "value_1", "user", "bkthomps", uint32(0), uint64(0), uint32(0), uint32(0), true)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint32, hits2 uint64, rpu, unit uint32, nested bool) {
		d1 := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k1, Value: v1}}}
		if nested {
			d1.Entries = append(d1.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k2, Value: v2})
		}
		d2 := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k2, Value: v2}}, HitsAddend: wrapperspb.UInt64(hits2)}
		if rpu > 0 {
			d2.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit(unit % 8)}
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d1, d2, d1}, HitsAddend: hits}
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(resp.Statuses) != 3 {
			t.Fatalf("%d statuses", len(resp.Statuses))
		}
		over := false
		for _, st := range resp.Statuses {
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				over = true
			}
			if cl := st.CurrentLimit; cl != nil && st.LimitRemaining > cl.RequestsPerUnit {
				t.Fatalf("remaining %d over the limit %d", st.LimitRemaining, cl.RequestsPerUnit)
			}
		}
		if (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) != over {
			t.Fatalf("overall %v, statuses %v", resp.OverallCode, resp.Statuses)
		}
	})
}

// The domains gauge follows the configuration in use whoever sets it: a
// file reload, or xDS, which calls SetConfig alone.
func TestSetConfigSetsTheDomainsGauge(t *testing.T) {
	svc := service.New(service.Config{})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	m := NewMetrics(prometheus.NewRegistry())
	srv, err := NewServer(ServerConfig{Service: svc, Metrics: m}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(m.domains); v != 0 {
		t.Fatalf("domains with no configuration: %v, want 0", v)
	}
	conf, err := Parse(File{Name: "test.yaml", Data: []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(conf)
	if v, want := testutil.ToFloat64(m.domains), float64(len(conf.Domains())); v != want || want == 0 {
		t.Fatalf("domains after SetConfig: %v, want %v", v, want)
	}
	srv.SetConfig(nil)
	if v := testutil.ToFloat64(m.domains); v != 0 {
		t.Fatalf("domains after SetConfig(nil): %v, want 0", v)
	}
}
