package global

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/window"
)

// A region whose rows the bridge loads from the store is expected like a
// configured one: it gets a lag from the bridge's start even though its
// bridge never sent over NATS (a gateway down since then), and the bridge's
// own rows add nothing.
func TestRegionLagsIncludeRegionsFoundInTheStore(t *testing.T) {
	now := int64(1_700_000_030_000)
	clock := func() time.Time { return time.UnixMilli(now) }
	store := NewMemoryStore()
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "a", Duration: 60_000,
		Sequence: window.Sequence(now, 60_000)}
	rows := []Component{
		{Cell: cell, Region: "eu", Count: 3, ExpireAt: cell.Expiry(60_000)},
		{Cell: cell, Region: "us", Count: 4, ExpireAt: cell.Expiry(60_000)},
	}
	if err := store.UpsertComponents(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.RegionLags(); len(got) != 0 {
		t.Fatalf("lags before any load = %v, want none", got)
	}
	now += 10_000
	b.Start(context.Background()) // loads the store before it returns
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if got, want := b.RegionLags(), map[string]time.Duration{"eu": 10 * time.Second}; !maps.Equal(got, want) {
		t.Fatalf("lags after starting on eu's and us's rows = %v, want %v", got, want)
	}
}

// A bad name in Regions is refused with an error naming it, and no bridge
// is made.
func TestNewBridgeRefusesAnInvalidExpectedRegion(t *testing.T) {
	b, err := NewBridge(BridgeConfig{Region: "us", Regions: []string{"eu", "ap south"}, Store: NewMemoryStore(),
		Transport: nopTransport{}})
	if err == nil || b != nil || !strings.Contains(err.Error(), `"ap south"`) {
		t.Fatalf("NewBridge with region \"ap south\" = %v, %v; want an error naming it", b, err)
	}
}
