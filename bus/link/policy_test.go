package link

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/service"
)

// A Policy is what the doors' admin endpoints carry their changes with,
// and a Bridge what a bridge.Bridge sends through.
var (
	_ transport.PolicyCarrier = (*Policy)(nil)
	_ bridge.Transport        = (*Bridge)(nil)
)

// A bridge and a limiter given no version report the same one.
func TestABridgeAndALimiterDefaultToOneVersion(t *testing.T) {
	if Version != transport.Version {
		t.Fatalf("a bridge defaults to version %q, a limiter to %q", Version, transport.Version)
	}
}

// policyLimiter is a limiter with its policy link, on srv.
type policyLimiter struct {
	svc  *service.Service
	link *Policy
	lim  *transport.Limiter
}

func startPolicyLimiter(t *testing.T, srv *embedded.Server, interval time.Duration) *policyLimiter {
	t.Helper()
	return startPolicyLimiterAt(t, srv, time.Now, interval)
}

// startPolicyLimiterAt is startPolicyLimiter on the clock now: the
// service's, which its admin endpoint stamps changes with, and the link's.
func startPolicyLimiterAt(t *testing.T, srv *embedded.Server, now func() time.Time, interval time.Duration) *policyLimiter {
	t.Helper()
	return startPolicyLimiterOf(t, srv, now, interval, nil)
}

// startPolicyLimiterWith is startPolicyLimiter with a table that seed
// fills before the link starts.
func startPolicyLimiterWith(t *testing.T, srv *embedded.Server, interval time.Duration, seed func(*policy.Table)) *policyLimiter {
	t.Helper()
	return startPolicyLimiterOf(t, srv, time.Now, interval, seed)
}

func startPolicyLimiterOf(t *testing.T, srv *embedded.Server, now func() time.Time, interval time.Duration, seed func(*policy.Table)) *policyLimiter {
	t.Helper()
	svc := service.New(service.Config{Now: now})
	if seed != nil {
		seed(svc.Policies())
	}
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	nc := natstest.Connect(t, srv)
	link, err := NewPolicy(nc, PolicyConfig{Region: "r1", Table: svc.Policies(), Resets: svc, Now: now, SyncInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	if err := link.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close(context.Background()) })
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "r1", PolicyLink: link})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Shutdown(context.Background()) })
	if err := nc.Flush(); err != nil { // the endpoints' subscriptions reach the server
		t.Fatal(err)
	}
	return &policyLimiter{svc: svc, link: link, lim: lim}
}

// startPolicyBridge starts a bridge of region r1 on store.
func startPolicyBridge(t *testing.T, srv *embedded.Server, store bridge.Store) (*bridge.Bridge, *Bridge) {
	t.Helper()
	return startPolicyBridgeOn(t, natstest.Connect(t, srv), store)
}

// startPolicyBridgeOn starts a bridge of region r1 on nc.
func startPolicyBridgeOn(t *testing.T, nc *nats.Conn, store bridge.Store) (*bridge.Bridge, *Bridge) {
	t.Helper()
	tr := NewBridge(nc, wire.Subjects{}, "r1", nil)
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: "r1", Store: store, Transport: tr,
		StoreInterval: 10 * time.Millisecond, ReloadInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b.Start(t.Context())
	if err := tr.Serve(b); err != nil {
		t.Fatal(err)
	}
	return b, tr
}

// waitFor polls cond every millisecond until it holds or 5s pass.
func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

func hasOverride(tbl *policy.Table, pattern string, limit int64) bool {
	o, _, ok := tbl.Match("acme", "api", pattern)
	return ok && o.Limit == limit
}

// An override set through one limiter reaches the region's other limiters
// through the bridge, and the store; a limiter that starts later has it
// before it serves; a delete goes the same way.
func TestOverridesReachEveryLimiterOfTheRegion(t *testing.T) {
	srv := natstest.Server(t)
	store := bridge.NewMemoryStore()
	br, _ := startPolicyBridge(t, srv, store)
	a := startPolicyLimiter(t, srv, time.Hour)
	b := startPolicyLimiter(t, srv, time.Hour)
	client := bus.NewClient(natstest.Connect(t, srv))

	if _, err := client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "vip_*", Limit: 3, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	// The admin endpoint answered after the bridge acknowledged: the
	// bridge has it, and both limiters within a batch.
	if !hasOverride(br.Policies(), "vip_1", 3) {
		t.Fatal("the bridge lacks an override it acknowledged")
	}
	d := waitFor(t, "both limiters", func() bool {
		return hasOverride(a.svc.Policies(), "vip_1", 3) && hasOverride(b.svc.Policies(), "vip_1", 3)
	})
	t.Logf("in every limiter of the region %v after the reply", d)
	waitFor(t, "the store", func() bool {
		es, _ := store.LoadOverrides(t.Context())
		return len(es) == 1 && es[0].Limit == 3
	})

	c := startPolicyLimiter(t, srv, time.Hour)
	if !hasOverride(c.svc.Policies(), "vip_1", 3) {
		t.Fatal("a limiter started without the region's overrides")
	}

	if err := client.DeleteOverride(t.Context(), "acme", "api", "vip_*"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delete in every limiter", func() bool {
		for _, l := range []*policyLimiter{a, b, c} {
			if _, _, ok := l.svc.Policies().Match("acme", "api", "vip_1"); ok {
				return false
			}
		}
		return true
	})
}

// A bridge that lost what it acknowledged (killed before its store write,
// its store down) gets it back from the region's limiters, which hold every
// override they accepted: their digests differ from the new bridge's, and
// they send theirs.
func TestANewBridgeLearnsTheOverridesItsPredecessorLost(t *testing.T) {
	srv := natstest.Server(t)
	_, oldTr := startPolicyBridge(t, srv, bridge.NewMemoryStore())
	a := startPolicyLimiter(t, srv, 20*time.Millisecond)
	client := bus.NewClient(natstest.Connect(t, srv))
	if _, err := client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "kept", Limit: 7, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	// The bridge goes, with its memory and its store.
	if err := oldTr.Close(); err != nil {
		t.Fatal(err)
	}
	store := bridge.NewMemoryStore()
	br, _ := startPolicyBridge(t, srv, store)
	waitFor(t, "the new bridge", func() bool { return hasOverride(br.Policies(), "kept", 7) })
	waitFor(t, "the new bridge's store", func() bool {
		es, _ := store.LoadOverrides(t.Context())
		return len(es) == 1
	})
	if !hasOverride(a.svc.Policies(), "kept", 7) {
		t.Fatal("the limiter lost its override")
	}
	if st := a.link.Stats(); st.Stale || st.NoBridge || st.Pending != 0 {
		t.Fatalf("link stats %+v", st)
	}
}

// With no bridge (the embedded default), an override lives in the
// limiter's memory and applies there; the link says there is no bridge.
func TestWithoutABridgeOverridesStayInTheLimiter(t *testing.T) {
	srv := natstest.Server(t)
	a := startPolicyLimiter(t, srv, time.Hour)
	client := bus.NewClient(natstest.Connect(t, srv), bus.WithCoalescing(false))
	if _, err := client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "x", Limit: 1, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	resp, err := client.Check(t.Context(), "acme", "api", bus.CheckRequest{Identifier: "x", Limit: 100, Duration: 1000})
	if err != nil || resp.Limit != 1 {
		t.Fatalf("check: %+v, %v", resp, err)
	}
	if st := a.link.Stats(); !st.NoBridge || st.Pending != 0 {
		t.Fatalf("link stats %+v, want no bridge and nothing pending", st)
	}
}

// A limiter whose bridge stops answering (its connection blackholed) keeps
// the overrides it has, decides by them, and says so (Stats().Stale, which
// the sluice_policy_stale gauge reads) until the bridge answers again.
func TestALimiterWhoseBridgeIsUnreachableKeepsItsOverridesAndSaysSo(t *testing.T) {
	srv := natstest.Server(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(srv.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	bnc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bnc.Close)
	startPolicyBridgeOn(t, bnc, bridge.NewMemoryStore())
	a := startPolicyLimiter(t, srv, 50*time.Millisecond)
	client := bus.NewClient(natstest.Connect(t, srv), bus.WithCoalescing(false))
	if _, err := client.SetOverride(t.Context(), "acme", bus.Override{Namespace: "api", Identifier: "k", Limit: 2, Duration: 60_000}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a sync with the bridge", func() bool { return !a.link.Stats().SyncedAt.IsZero() })

	proxy.SetMode(tcpproxy.Blackhole)
	waitFor(t, "the link to say stale", func() bool { return a.link.Stats().Stale })
	resp, err := client.Check(t.Context(), "acme", "api", bus.CheckRequest{Identifier: "k", Limit: 100, Duration: 60_000})
	if err != nil || resp.Limit != 2 {
		t.Fatalf("while the bridge is unreachable: %+v, %v; want the override's limit 2", resp, err)
	}

	proxy.SetMode(tcpproxy.Pass)
	waitFor(t, "the link to agree with the bridge again", func() bool { return !a.link.Stats().Stale })
}

// A limiter whose overrides differ from its bridge's in one entry gets, in
// the digest exchange, only the entries of the digest part that entry
// falls in, not the bridge's whole table.
func TestADigestMismatchSendsOnlyThePartsThatDiffer(t *testing.T) {
	srv := natstest.Server(t)
	store := bridge.NewMemoryStore()
	const n = 2_000
	es := make([]policy.Entry, n)
	at := time.Now().UnixMilli()
	for i := range es {
		es[i] = policy.Entry{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: fmt.Sprint("user_", i)},
			Override: policy.Override{Limit: int64(i + 1), Duration: 60_000}, Version: policy.Version{At: at, Origin: "r1"}}
	}
	if err := store.UpsertOverrides(t.Context(), es); err != nil {
		t.Fatal(err)
	}
	br, _ := startPolicyBridge(t, srv, store)
	a := startPolicyLimiter(t, srv, 20*time.Millisecond)
	waitFor(t, "the limiter's first snapshot", func() bool { return hasOverride(a.svc.Policies(), fmt.Sprint("user_", n-1), n) })

	// Count what the bridge's snapshot replies carry from here on.
	watch := natstest.Connect(t, srv)
	var mu sync.Mutex
	sent := 0
	sub, err := watch.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if pm, err := event.DecodePolicies(m.Data); err == nil {
			mu.Lock()
			sent += len(pm.Overrides)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	// A limiter that starts holding half of the parts whole (as one whose
	// first snapshot ended halfway through: the bridge sends part by part)
	// is sent only the other half.
	half := startPolicyLimiterWith(t, srv, 20*time.Millisecond, func(tbl *policy.Table) {
		var some []policy.Entry
		for _, e := range es {
			if policy.KeyShard(e.Key) < policy.DigestShards/2 {
				some = append(some, e)
			}
		}
		if _, err := tbl.Merge(some...); err != nil {
			t.Fatal(err)
		}
	})
	// counted waits until the watch has counted the replies it was sent
	// (they reach it on its own connection, maybe after the limiter got
	// them): at least one, and none still pending.
	counted := func(what string) {
		t.Helper()
		waitFor(t, what, func() bool {
			_ = watch.Flush()
			msgs, _, _ := sub.Pending()
			mu.Lock()
			defer mu.Unlock()
			return sent > 0 && msgs == 0
		})
	}
	waitFor(t, "the second limiter's snapshot", func() bool { return half.svc.Policies().Digest() == br.Policies().Digest() })
	counted("the second limiter's snapshot counted")
	mu.Lock()
	if sent == 0 || sent > n*6/10 {
		mu.Unlock()
		t.Fatalf("a limiter holding half the parts was sent %d entries of %d; want about half", sent, n)
	}
	sent = 0
	mu.Unlock()

	// The bridge learns an entry the limiter lacks, without a broadcast.
	if _, err := br.Policies().Set(policy.Key{Workspace: "acme", Namespace: "api", Pattern: "late"},
		policy.Override{Limit: 99, Duration: 60_000}, at+1, "r1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the entry the limiter lacked", func() bool { return hasOverride(a.svc.Policies(), "late", 99) })
	counted("the repair counted")
	mu.Lock()
	defer mu.Unlock()
	if sent == 0 || sent > n/8 {
		t.Fatalf("the bridge sent %d entries for one that differed among %d; want the entries of one part (about %d)",
			sent, n+1, n/policy.DigestShards)
	}
}
