package link

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// spent reports whether a check of id (limit 2 a minute) on l is denied,
// after spending what it admits.
func spend(t *testing.T, l *policyLimiter, id string) bool {
	t.Helper()
	q := service.Query{Workspace: "acme", Namespace: "api", Identifier: id, Limit: 2, Duration: 60_000, Cost: 1}
	for range 3 {
		d, err := l.svc.Check(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			return true
		}
	}
	return false
}

// A reset taken by one limiter reaches the region's other limiters through
// the bridge, and the store; a limiter that starts later has it before it
// serves; a new bridge that lost it learns it back from the limiters.
func TestResetsReachEveryLimiterOfTheRegion(t *testing.T) {
	srv := natstest.Server(t)
	store := bridge.NewMemoryStore()
	br, oldTr := startPolicyBridge(t, srv, store)
	a := startPolicyLimiter(t, srv, 20*time.Millisecond)
	b := startPolicyLimiter(t, srv, time.Hour)
	if !spend(t, a, "u1") || !spend(t, b, "u1") {
		t.Fatal("limit not spent")
	}
	epoch, err := bus.NewClient(natstest.Connect(t, srv)).Reset(t.Context(), "acme", "api", "u1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if br.Marks().Epoch("acme", "api", "u1", 60_000) != epoch {
		t.Fatal("the bridge lacks a reset it acknowledged")
	}
	waitFor(t, "both limiters", func() bool {
		return a.svc.Marks().Epoch("acme", "api", "u1", 60_000) == epoch && b.svc.Marks().Epoch("acme", "api", "u1", 60_000) == epoch
	})
	for _, l := range []*policyLimiter{a, b} {
		if d := mustAdmit(t, l, "u1"); !d {
			t.Fatal("a limiter of the region denies after the reset")
		}
	}
	waitFor(t, "the store", func() bool {
		ms, _ := store.LoadMarks(t.Context(), time.Now().UnixMilli())
		return len(ms) == 1 && ms[0].Epoch == epoch
	})
	c := startPolicyLimiter(t, srv, time.Hour)
	if c.svc.Marks().Epoch("acme", "api", "u1", 1000) != epoch {
		t.Fatal("a limiter started without the region's resets")
	}

	// The bridge goes, with its memory and its store; the limiters give
	// the next one the mark.
	if err := oldTr.Close(); err != nil {
		t.Fatal(err)
	}
	store2 := bridge.NewMemoryStore()
	bridge2, _ := startPolicyBridge(t, srv, store2)
	waitFor(t, "the new bridge", func() bool { return bridge2.Marks().Epoch("acme", "api", "u1", 60_000) == epoch })
	waitFor(t, "the new bridge's store", func() bool {
		ms, _ := store2.LoadMarks(t.Context(), time.Now().UnixMilli())
		return len(ms) == 1
	})
	// a syncs every 20ms, each bounded by 10ms: one may have failed while
	// the bridges changed; the next ones succeed.
	waitFor(t, "a's link in step with the new bridge", func() bool {
		st := a.link.Stats()
		return !st.Stale && !st.NoBridge && st.Pending == 0
	})
}

func mustAdmit(t *testing.T, l *policyLimiter, id string) bool {
	t.Helper()
	d, err := l.svc.Check(t.Context(), service.Query{Workspace: "acme", Namespace: "api", Identifier: id, Limit: 2, Duration: 60_000, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d.Admitted
}
