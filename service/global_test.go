package service

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// recordingSink records what the service publishes: a test seam standing
// for the NATS link, not for a server.
type recordingSink struct {
	mu      sync.Mutex
	comps   []global.Component
	denials []global.Denial
}

func (r *recordingSink) Publish(cs []global.Component, ds []global.Denial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.comps = append(r.comps, cs...)
	r.denials = append(r.denials, ds...)
}

func (r *recordingSink) take() ([]global.Component, []global.Denial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, ds := r.comps, r.denials
	r.comps, r.denials = nil, nil
	return cs, ds
}

func newGlobalService(t *testing.T, clk *manualClock) (*Service, *recordingSink) {
	sink := &recordingSink{}
	s := newService(t, Config{Now: clk.Now, Region: "eu", Global: sink, PublishInterval: time.Hour})
	return s, sink
}

func gcell(id string) window.Cell {
	return window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 60_000, Sequence: t0 / 60_000}
}

func TestRegionalCountIsPublishedEveryPercentOfTheLimit(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	for range 9 {
		mustCheck(t, s, query("alice", 1000, 1))
	}
	s.publish()
	if cs, _ := sink.take(); len(cs) != 0 {
		t.Fatalf("published %+v after growth under 1%% of the limit", cs)
	}
	mustCheck(t, s, query("alice", 1000, 1))
	s.publish()
	cs, _ := sink.take()
	if len(cs) != 1 || cs[0].Count != 10 || cs[0].Region != "eu" || cs[0].Cell != gcell("alice") {
		t.Fatalf("published %+v, want alice's 10 from eu", cs)
	}
	if want := gcell("alice").Expiry(60_000); cs[0].ExpireAt != want {
		t.Fatalf("expiry %d, want %d", cs[0].ExpireAt, want)
	}
	s.publish()
	if cs, _ := sink.take(); len(cs) != 0 {
		t.Fatalf("published %+v without growth", cs)
	}
	// A cell another region shares publishes every growth.
	s.ApplyImports([]global.Import{{Cell: gcell("alice"), Foreign: 100}})
	mustCheck(t, s, query("alice", 1000, 1))
	s.publish()
	if cs, _ := sink.take(); len(cs) != 1 || cs[0].Count != 11 {
		t.Fatalf("shared cell published %+v, want its regional 11 (never the import)", cs)
	}
}

func TestImportsCountInDecisionsButAreNeverPublished(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	s.ApplyImports([]global.Import{{Cell: gcell("bob"), Foreign: 7, Own: 2}})
	d := mustCheck(t, s, query("bob", 10, 1))
	if !d.Admitted || d.Remaining != 0 {
		t.Fatalf("check with 7 foreign and 2 own = %+v, want admitted with 0 remaining", d)
	}
	if d := mustCheck(t, s, query("bob", 10, 1)); d.Admitted {
		t.Fatalf("check past the global limit admitted: %+v", d)
	}
	s.publish()
	cs, _ := sink.take()
	if len(cs) != 1 || cs[0].Count != 3 {
		t.Fatalf("published %+v, want the regional 3 (own 2 + 1), not the foreign 7", cs)
	}
	// Stale or smaller imports never lower anything.
	s.ApplyImports([]global.Import{{Cell: gcell("bob"), Foreign: 1}})
	if d := mustCheck(t, s, query("bob", 10, 0)); d.Remaining != 0 {
		t.Fatalf("a smaller import lowered usage: %+v", d)
	}
	// Imports for long-gone windows are ignored.
	old := gcell("carol")
	old.Sequence -= 5
	s.ApplyImports([]global.Import{{Cell: old, Foreign: 1000}})
	if d := mustCheck(t, s, query("carol", 10, 0)); d.Remaining != 10 {
		t.Fatalf("an import for an old window counted: %+v", d)
	}
}

func TestFirstDenialIsPublishedOnceAndRemoteDenialsRaiseTheCell(t *testing.T) {
	clk := newClock(t0)
	s, sink := newGlobalService(t, clk)
	for range 10 {
		mustCheck(t, s, query("dave", 10, 1))
	}
	mustCheck(t, s, query("dave", 10, 1))
	mustCheck(t, s, query("dave", 10, 1))
	s.publish()
	_, ds := sink.take()
	if len(ds) != 1 || ds[0].Cell != gcell("dave") || ds[0].Limit != 10 || ds[0].Region != "eu" {
		t.Fatalf("denials %+v, want one for dave at limit 10", ds)
	}
	// One oversized request on a fresh identifier is not published, nor a
	// request that does not fit in a cell still under its limit.
	mustCheck(t, s, query("erin", 10, 11))
	mustCheck(t, s, query("erin", 10, 6))
	mustCheck(t, s, query("erin", 10, 6))
	s.publish()
	if _, ds := sink.take(); len(ds) != 0 {
		t.Fatalf("denials of a cell under its limit were published: %+v", ds)
	}
	// A denial caused by the previous window's weight is not published either:
	// it says nothing of the new cell.
	clk.Advance(60 * time.Second)
	if d := mustCheck(t, s, query("dave", 10, 1)); d.Admitted {
		t.Fatalf("admitted under a full previous window: %+v", d)
	}
	s.publish()
	if _, ds := sink.take(); len(ds) != 0 {
		t.Fatalf("a denial from the previous window's weight was published: %+v", ds)
	}
	clk.Advance(-60 * time.Second)
	// A remote denial raises the exact cell to its limit and is not re-published.
	s.ApplyImports([]global.Import{{Cell: gcell("frank"), Floor: 10}})
	if d := mustCheck(t, s, query("frank", 10, 1)); d.Admitted {
		t.Fatalf("a cell raised to its limit admitted: %+v", d)
	}
	s.publish()
	if _, ds := sink.take(); len(ds) != 0 {
		t.Fatalf("a received denial was published again: %+v", ds)
	}
	// The next window still feels it through the previous cell's weight.
	clk.Advance(60 * time.Second)
	if d := mustCheck(t, s, query("frank", 10, 1)); d.Admitted {
		t.Fatalf("the window after a remote denial admitted at once: %+v", d)
	}
}
