package link

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy"
)

// Read your writes, through whichever limiter of the region the queue
// group picks: three limiters (one whose clock is 50 ms behind) and their
// bridge at its defaults. An override set is found by the get sent right
// after its reply, and deleted by the delete sent right after that, 100
// times in a row; 100 sets of one pattern in a row are each read back as
// set, so the limiter whose clock is behind never stamps a set older than
// the one it replaces; and the region ends with the last one everywhere.
func TestAdminRequestsReadTheirWritesOnAnyLimiterOfTheRegion(t *testing.T) {
	srv := natstest.Server(t)
	br, _ := startPolicyBridge(t, srv, bridge.NewMemoryStore())
	behind := func() time.Time { return time.Now().Add(-50 * time.Millisecond) }
	lims := []*policyLimiter{
		startPolicyLimiterAt(t, srv, time.Now, time.Hour),
		startPolicyLimiterAt(t, srv, time.Now, time.Hour),
		startPolicyLimiterAt(t, srv, behind, time.Hour),
	}
	client := bus.NewClient(natstest.Connect(t, srv))
	ctx := t.Context()

	for i := range 100 {
		pattern := fmt.Sprintf("user-%d", i)
		o := bus.Override{Namespace: "api", Identifier: pattern, Limit: int64(i + 1), Duration: 60_000}
		if _, err := client.SetOverride(ctx, "acme", o); err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
		got, err := client.GetOverride(ctx, "acme", "api", pattern)
		if err != nil || got.Limit != o.Limit {
			t.Fatalf("get %d right after its set: %+v, %v", i, got, err)
		}
		if err := client.DeleteOverride(ctx, "acme", "api", pattern); err != nil {
			t.Fatalf("delete %d right after its set: %v", i, err)
		}
	}

	for i := range 100 {
		o := bus.Override{Namespace: "api", Identifier: "hot", Limit: int64(i + 1), Duration: 60_000}
		if _, err := client.SetOverride(ctx, "acme", o); err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
		got, err := client.GetOverride(ctx, "acme", "api", "hot")
		if err != nil || got.Limit != o.Limit {
			t.Fatalf("set %d of one pattern, read back as %+v (%v): an earlier set won", i, got, err)
		}
	}
	if e, err := br.Policies().Lookup(policy.Key{Workspace: "acme", Namespace: "api", Pattern: "hot"}); err != nil || e.Limit != 100 {
		t.Fatalf("the bridge holds %+v, %v; want the last set", e, err)
	}
	waitFor(t, "the last set in every limiter", func() bool {
		for _, l := range lims {
			if !hasOverride(l.svc.Policies(), "hot", 100) {
				return false
			}
		}
		return true
	})
	// Every limiter answered some of the requests.
	for i, l := range lims {
		if st := l.lim.AdminStats(); st.Sets == 0 || st.Gets == 0 {
			t.Errorf("limiter %d answered %d sets and %d gets; the queue group should spread them", i, st.Sets, st.Gets)
		}
	}
}
