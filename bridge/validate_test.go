package bridge

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// nopTransport drops what a bridge sends: these tests read the bridge's
// state, not its messages.
type nopTransport struct{}

func (nopTransport) Forward(context.Context, []global.Component) error { return nil }
func (nopTransport) Broadcast(context.Context, []global.Import) error  { return nil }
func (nopTransport) ForwardPolicies(context.Context, []policy.Entry, []policy.Mark) error {
	return nil
}
func (nopTransport) BroadcastPolicies(context.Context, []policy.Entry, []policy.Mark, uint64) error {
	return nil
}

func newTestBridge(t *testing.T, store Store, now int64) *Bridge {
	t.Helper()
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{},
		Now: func() time.Time { return time.UnixMilli(now) }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func refusedBy(b *Bridge) map[global.Refusal]int64 { return b.Refused() }

// What reaches a bridge from its limiters, other regions' bridges and the
// store is checked at the bridge's clock: entries beyond the contract's
// bounds, for windows further ahead than the clock-skew tolerance, naming
// another region than their sender, or in a message stamped beyond the
// tolerance are refused, counted by source, region and reason, and change
// nothing.
func TestBridgeRefusesWhatNoSenderWithinTheToleranceCouldSend(t *testing.T) {
	const now = int64(1_700_000_030_000)
	cell := func(id string, seqAhead int64) window.Cell {
		return window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 60_000,
			Sequence: now/60_000 + seqAhead}
	}
	comp := func(id, region string, seqAhead, count int64) global.Component {
		c := cell(id, seqAhead)
		return global.Component{Cell: c, Region: region, Count: count, ExpireAt: c.Expiry(60_000)}
	}
	b := newTestBridge(t, NewMemoryStore(), now)

	b.FromLimiters([]global.Component{
		comp("ok", "us", 0, 5),
		comp("ahead", "us", 1, 5),            // starts 30s from now
		comp("other", "eu", 0, 5),            // limiters publish their own region only
		comp("huge", "us", 0, math.MaxInt64), // beyond window.MaxCount
		{Cell: cell("forever", 0), Region: "us", Count: 1, ExpireAt: math.MaxInt64},
	}, now)
	b.FromLimiters([]global.Component{comp("stamped", "us", 0, 5)}, now+int64(global.DefaultMaxClockSkew/time.Millisecond)+1)
	b.FromRegions("eu", []global.Component{
		comp("eu-ok", "eu", 0, 3),
		comp("eu-claims-ap", "ap", 0, 3),
		comp("eu-second", "eu", 0, 1),
	}, now)
	b.FromRegions("ap", []global.Component{comp("ap-late-clock", "ap", 0, 3)}, now-10_000)

	if got := b.counter.Import(cell("ok", 0)).Own; got != 5 {
		t.Fatalf("the valid own component: own %d, want 5", got)
	}
	if got := b.counter.Import(cell("eu-ok", 0)).Foreign; got != 3 {
		t.Fatalf("the valid foreign component: foreign %d, want 3", got)
	}
	if n := b.counter.Len(); n != 3 {
		t.Fatalf("the bridge holds %d cells, want only the 3 valid ones", n)
	}
	want := map[global.Refusal]int64{
		{Source: "limiters", Region: "us", Reason: "future_window"}: 1,
		{Source: "limiters", Region: "us", Reason: "invalid"}:       3,
		{Source: "limiters", Region: "us", Reason: "clock_skew"}:    1,
		{Source: "regions", Region: "eu", Reason: "invalid"}:        1,
		{Source: "regions", Region: "ap", Reason: "clock_skew"}:     1,
	}
	got := refusedBy(b)
	for k, n := range want {
		if got[k] != n {
			t.Errorf("refused %+v: %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
	// The valid eu components passed.
	if b.Stats().ComponentsFromPeers != 2 {
		t.Errorf("components from regions: %d, want 2", b.Stats().ComponentsFromPeers)
	}
}

// Rows loaded from the store are input too: one for a window beyond the
// tolerance (written by a bridge whose clock ran ahead) is refused at load.
func TestBridgeRefusesStoreRowsAheadOfItsClock(t *testing.T) {
	const now = int64(1_700_000_030_000)
	store := NewMemoryStore()
	ok := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "ok", Duration: 60_000, Sequence: now / 60_000}
	ahead := ok
	ahead.Identifier, ahead.Sequence = "ahead", ok.Sequence+10
	if err := store.UpsertComponents(context.Background(), []global.Component{
		{Cell: ok, Region: "eu", Count: 4, ExpireAt: ok.Expiry(60_000)},
		{Cell: ahead, Region: "eu", Count: 4, ExpireAt: ahead.Expiry(60_000)},
	}); err != nil {
		t.Fatal(err)
	}
	b := newTestBridge(t, store, now)
	if err := b.reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.counter.Len() != 1 || b.counter.Import(ok).Foreign != 4 {
		t.Fatalf("after the load: %d cells, foreign of ok %d; want only ok's 4", b.counter.Len(), b.counter.Import(ok).Foreign)
	}
	if n := refusedBy(b)[global.Refusal{Source: "store", Region: "eu", Reason: "future_window"}]; n != 1 {
		t.Fatalf("store rows refused as ahead: %d, want 1 (%v)", n, refusedBy(b))
	}
}

// The foreign sum of many regions' components saturates at window.MaxCount
// instead of wrapping to a small or negative number.
func TestForeignSumSaturates(t *testing.T) {
	c := NewCounter("us")
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "x", Duration: 60_000, Sequence: 1}
	for _, r := range []string{"eu", "ap", "sa"} {
		c.Merge(global.Component{Cell: cell, Region: r, Count: window.MaxCount})
	}
	if got := c.Import(cell).Foreign; got != window.MaxCount {
		t.Fatalf("foreign sum of three components at MaxCount: %d, want MaxCount", got)
	}
}
