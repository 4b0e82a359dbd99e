package transport

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/service"
)

// The reset endpoint, through the Go client in msgpack and JSON: an
// identifier spent to its limit is admitted again with the whole limit
// left; the reply's epoch is the limiter's clock; a reset of another
// duration leaves this one; bad requests get a 400 that says what to fix
// and reset nothing.
func TestResetEndpointForgetsAnIdentifiersUsage(t *testing.T) {
	r := newPolicyRig(t)
	for i, c := range []*bus.Client{r.client, r.json} {
		id := []string{"msgpack-user", "json-user"}[i]
		if n, last := r.admitted(t, 12, "api", id, 10); n != 10 || last.Success {
			t.Fatalf("%s: admitted %d of 12 at limit 10", id, n)
		}
		before := r.svc.Now().UnixMilli()
		epoch, err := c.Reset(t.Context(), "acme", "api", id, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if resp := r.check(t, "api", id, 10, false); resp.Success {
			t.Fatalf("%s: a reset of 1s freed the minute: %+v", id, resp)
		}
		epoch, err = c.Reset(t.Context(), "acme", "api", id, 0)
		if err != nil {
			t.Fatal(err)
		}
		if epoch < before || epoch > r.svc.Now().UnixMilli()+1 {
			t.Fatalf("%s: epoch %d, want the limiter's clock (about %d)", id, epoch, before)
		}
		if resp := r.check(t, "api", id, 10, false); !resp.Success || resp.Remaining != 9 {
			t.Fatalf("%s after the reset: %+v, want admitted with 9 left", id, resp)
		}
	}
	if got := r.lim.AdminStats().Resets; got != 4 {
		t.Fatalf("AdminStats().Resets = %d, want 4", got)
	}

	r.admitted(t, 10, "api", "kept", 10)
	for _, tc := range []struct{ name, body, want string }{
		{"no identifier", `{"namespace":"api"}`, "identifier"},
		{"duration too short", `{"namespace":"api","identifier":"kept","duration":999}`, "duration"},
		{"unknown field", `{"namespace":"api","identifier":"kept","limit":1}`, "limit"},
		{"bad namespace", `{"namespace":"a.b","identifier":"kept"}`, "namespace"},
	} {
		msg, err := r.nc.RequestWithContext(t.Context(), "ratelimit.admin.acme.reset", []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var se *bus.ServiceError
		if err := bus.ReplyError(msg); !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, tc.want) {
			t.Fatalf("%s: %v, want a 400 mentioning %q", tc.name, err, tc.want)
		}
	}
	if resp := r.check(t, "api", "kept", 10, false); resp.Success {
		t.Fatalf("bad reset requests reset something: %+v", resp)
	}
	if n := r.svc.Marks().Len("acme"); n != 4 {
		t.Fatalf("%d marks held, want 4 (of 1s and of every duration, for two identifiers)", n)
	}
}

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
	srv := testServer(t)
	store := bridge.NewMemoryStore()
	br, oldTr := startPolicyBridge(t, srv, store)
	a := startPolicyLimiter(t, srv, 20*time.Millisecond)
	b := startPolicyLimiter(t, srv, time.Hour)
	if !spend(t, a, "u1") || !spend(t, b, "u1") {
		t.Fatal("limit not spent")
	}
	epoch, err := bus.NewClient(testConn(t, srv)).Reset(t.Context(), "acme", "api", "u1", 0)
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
