package bridge

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
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
	rows := []global.Component{
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

// A message under the global subjects from a name that is no
// region token is refused whole and leaves no series; one from a region the
// bridge does not expect, stamped beyond the clock-skew tolerance, is
// refused and leaves no lag series, and only the first maxNamedRefusals such
// names are counted and offset under their own name (so an operator sees
// which region's clock is off); a known region's skewed message records its
// offset but not a sighting.
func TestFromRegionsKeepsNoSeriesForWhatItRefuses(t *testing.T) {
	now := int64(1_700_000_030_000)
	clock := func() time.Time { return time.UnixMilli(now) }
	b, err := NewBridge(BridgeConfig{Region: "us", Regions: []string{"eu"}, Store: NewMemoryStore(),
		Transport: nopTransport{}, Now: clock, MaxClockSkew: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "a", Duration: 60_000,
		Sequence: window.Sequence(now, 60_000)}
	comp := func(region string) []global.Component {
		return []global.Component{{Cell: cell, Region: region, Count: 1, ExpireAt: cell.Expiry(60_000)}}
	}
	for _, bad := range []string{"", "a.b", "ap south", "*", ">", strings.Repeat("x", 1000)} {
		b.FromRegions(bad, comp(bad), now)
	}
	const skewed = maxNamedRefusals + 10
	for i := range skewed { // valid names, unknown regions, clocks a minute ahead
		r := fmt.Sprint("far", i)
		b.FromRegions(r, comp(r), now+60_000)
	}
	b.FromRegions("eu", comp("eu"), now-5_000) // the known region, skewed
	if got, want := b.RegionLags(), map[string]time.Duration{"eu": 0}; !maps.Equal(got, want) {
		t.Fatalf("lags after refused messages = %v, want only the configured eu, never heard from", got)
	}
	offsets := b.ClockOffsets()
	if len(offsets) != maxNamedRefusals+1 || offsets["eu"] != -5*time.Second || offsets["far0"] != time.Minute {
		t.Fatalf("clock offsets = %v, want eu's and the first %d skewed names'", offsets, maxNamedRefusals)
	}
	refused := refusedBy(b)
	var total int64
	labels := map[string]bool{}
	for r, n := range refused {
		labels[r.Region] = true
		total += n
	}
	if !labels["invalid"] || !labels["unknown"] || !labels["far0"] || labels["far"+fmt.Sprint(skewed-1)] ||
		len(labels) != maxNamedRefusals+3 {
		t.Fatalf("refusals labelled %v: want invalid, unknown, eu and %d names", labels, maxNamedRefusals)
	}
	if want := int64(6 + skewed + 1); total != want {
		t.Fatalf("refused %d entries (%v), want all %d", total, refused, want)
	}
	if got := len(b.Snapshot()); got != 0 {
		t.Fatalf("%d imports after refused messages, want none", got)
	}
	now += 2_000
	b.FromRegions("eu", comp("eu"), now) // eu in time: now it is seen
	if got, want := b.RegionLags(), map[string]time.Duration{"eu": 0}; !maps.Equal(got, want) {
		t.Fatalf("lags after eu's good message = %v, want %v", got, want)
	}
	if got := len(b.Snapshot()); got != 1 {
		t.Fatalf("%d imports after eu's good message, want 1", got)
	}
}
