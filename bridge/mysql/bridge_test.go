package mysql_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bridge/mysql"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/storetest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// waitFor polls cond until it holds, failing the test with what after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBridgeQueueWhileTheStoreIsUnavailableKeepsOnlyLiveEntries runs a
// bridge whose MySQL refuses every connection: what its limiters publish is
// queued for the store, entries that expire meanwhile leave the queue, so it stays bounded by live cells, and
// the live ones are written once MySQL answers.
func TestBridgeQueueWhileTheStoreIsUnavailableKeepsOnlyLiveEntries(t *testing.T) {
	proxy, cfg := mysqltest.BehindProxy(t, mysqltest.Database(t))
	proxy.SetMode(tcpproxy.Refuse)
	store := openLazy(t, cfg.FormatDSN(), mysql.Config{RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond})

	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	start := time.Now()
	var clock atomic.Int64 // the bridge's clock, in ms
	clock.Store(start.UnixMilli())
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	bt := link.NewBridge(nc, wire.Subjects{}, "us", log)
	b, err := bridge.NewBridge(bridge.BridgeConfig{
		Region: "us", Store: store, Transport: bt, Logger: log,
		Now:           func() time.Time { return time.UnixMilli(clock.Load()) },
		BatchInterval: 5 * time.Millisecond, StoreInterval: 10 * time.Millisecond, StoreTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.Start(t.Context())
	if err := bt.Serve(b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = bt.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})

	cell := func(id string) window.Cell {
		return window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 86_400_000, Sequence: start.UnixMilli() / 86_400_000}
	}
	soon, later := start.Add(time.Hour).UnixMilli(), start.Add(10*time.Hour).UnixMilli()
	comps := []global.Component{
		{Cell: cell("short"), Region: "us", Count: 5, ExpireAt: soon},
		{Cell: cell("long"), Region: "us", Count: 6, ExpireAt: later},
		{Cell: cell("short-2"), Region: "us", Count: 10, ExpireAt: soon},
		{Cell: cell("long-2"), Region: "us", Count: 20, ExpireAt: later},
	}
	if err := nc.Publish("ratelimit.gc.us", event.AppendComponents(nil, comps)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "4 entries queued and a failed write", func() bool {
		st := b.Stats()
		return st.StorePending == 4 && st.StoreWriteErrors > 0
	})

	// Two hours on: the short entries have expired; the next failed write
	// drops them from the queue.
	clock.Store(start.Add(2 * time.Hour).UnixMilli())
	errs := b.Stats().StoreWriteErrors
	waitFor(t, 10*time.Second, "two more failed writes", func() bool { return b.Stats().StoreWriteErrors >= errs+2 })
	if got := b.Stats().StorePending; got != 2 {
		t.Fatalf("%d entries queued after the short ones expired, want the 2 live ones", got)
	}

	proxy.SetMode(tcpproxy.Pass)
	waitFor(t, 10*time.Second, "the queue written", func() bool { return b.Stats().StorePending == 0 && store.Ready() == nil })
	// Load from 0: every row written, expired or not.
	gotComps, err := storetest.Components(t.Context(), store, 0)
	slices.SortFunc(gotComps, func(a, b global.Component) int { return cmp.Compare(a.Count, b.Count) })
	if err != nil || len(gotComps) != 2 || gotComps[0] != comps[1] || gotComps[1] != comps[3] {
		t.Fatalf("components in MySQL = %+v, %v; want only the live ones %+v %+v", gotComps, err, comps[1], comps[3])
	}
}

// TestBridgeReadsOnlyWhatChangedInTheStore runs a bridge at the default
// intervals over a store that already holds 2000 live components, a quarter
// of them its own region's, 2000 overrides (a quarter of them tombstones)
// and a reset mark: it reads them all once at start, and afterwards only
// the rows that changed, each at most twice (the default ChangeLag
// equals the default reload interval), while the rows that did not change
// are never read again; its own region's rows are not sent anywhere again.
func TestBridgeReadsOnlyWhatChangedInTheStore(t *testing.T) {
	store := openMySQL(t, mysql.Config{})
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	now := time.Now()
	cell := func(i int) window.Cell {
		return window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprintf("id-%d", i),
			Duration: 86_400_000, Sequence: now.UnixMilli() / 86_400_000}
	}
	const live, changed = 2000, 10
	expire := cell(0).Expiry(60_000)
	comps := make([]global.Component, live)
	for i := range comps {
		comps[i] = global.Component{Cell: cell(i), Region: "eu", Count: 1, ExpireAt: expire}
		if i%4 == 0 { // the bridge's own region's rows, as a previous run of it stored them
			comps[i].Region = "us"
		}
	}
	if err := store.UpsertComponents(t.Context(), comps); err != nil {
		t.Fatal(err)
	}
	// As many overrides, a quarter of them tombstones, and a reset mark.
	entry := func(i int, at int64) policy.Entry {
		e := policy.Entry{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: fmt.Sprintf("id-%d", i)},
			Override: policy.Override{Limit: int64(i), Duration: 60_000}, Version: policy.Version{At: at, Origin: "eu"}}
		if i%4 == 0 {
			e.Override, e.Deleted = policy.Override{}, true
		}
		return e
	}
	overrides := make([]policy.Entry, live)
	for i := range overrides {
		overrides[i] = entry(i, now.UnixMilli()-1000)
	}
	if err := store.UpsertOverrides(t.Context(), overrides); err != nil {
		t.Fatal(err)
	}
	mark := policy.Mark{Workspace: "acme", Namespace: "api", Identifier: "id-1", Duration: 60_000, Epoch: now.UnixMilli() - 1000}
	if err := store.UpsertMarks(t.Context(), []policy.Mark{mark}); err != nil {
		t.Fatal(err)
	}
	// Rows written within ChangeLag before a read are read again by the
	// next one, by design; the server's clock cannot be injected, so let it
	// pass the default ChangeLag before the bridge starts.
	time.Sleep(mysql.DefaultChangeLag + 100*time.Millisecond)

	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	bt := link.NewBridge(nc, wire.Subjects{}, "us", log)
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: "us", Store: store, Transport: bt, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	b.Start(t.Context())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	st := b.Stats()
	const stored = 2*live + 1
	if st.StoreFullLoads != 1 || st.StoreRowsLoaded != stored {
		t.Fatalf("at start: %d full loads reading %d rows, want 1 reading %d", st.StoreFullLoads, st.StoreRowsLoaded, stored)
	}
	if n := len(b.Policies().Entries()); n != live {
		t.Fatalf("the bridge holds %d overrides after its first read, want the %d stored", n, live)
	}

	// Another region's bridge raises 10 of the components, and writes one
	// component no higher than it was.
	raised := make([]global.Component, 0, changed+1)
	for i := range changed {
		raised = append(raised, global.Component{Cell: cell(4*i + 1), Region: "eu", Count: 7, ExpireAt: expire})
	}
	raised = append(raised, comps[live-1])
	if err := store.UpsertComponents(t.Context(), raised); err != nil {
		t.Fatal(err)
	}
	// It sets 10 overrides anew (one a delete), writes one no newer than
	// stored, and raises the mark: 21 policy rows change.
	var sets []policy.Entry
	for i := range changed {
		sets = append(sets, entry(4*i+1, now.UnixMilli()))
	}
	sets[0].Override, sets[0].Deleted = policy.Override{}, true
	sets = append(sets, overrides[live-1])
	mark.Epoch++
	if err := store.UpsertOverrides(t.Context(), sets); err != nil {
		t.Fatal(err)
	}
	if err := store.UpsertMarks(t.Context(), []policy.Mark{mark}); err != nil {
		t.Fatal(err)
	}
	const rowsChanged = 2*changed + 1
	loads := b.Stats().StoreLoads
	waitFor(t, 10*time.Second, "three reloads", func() bool { return b.Stats().StoreLoads >= loads+3 })

	st = b.Stats()
	if read := st.StoreRowsLoaded - stored; read < rowsChanged || read > 2*rowsChanged {
		t.Fatalf("three reloads after %d rows changed read %d rows, want %d to %d", rowsChanged, read, rowsChanged, 2*rowsChanged)
	}
	if b.Marks().Epoch("acme", "api", "id-1", 60_000) != mark.Epoch {
		t.Fatal("the raised mark was not read")
	}
	tab := b.Policies()
	if o, _, ok := tab.Match("acme", "api", "id-5"); !ok || o.Limit != 5 {
		t.Fatalf("override id-5 after the reloads: %+v, %v; want the one set anew", o, ok)
	}
	if _, _, ok := tab.Match("acme", "api", "id-1"); ok {
		t.Fatal("override id-1 was deleted in the store, and still applies")
	}
	if st.StoreFullLoads != 1 {
		t.Fatalf("%d full loads, want only the one at start", st.StoreFullLoads)
	}
	for i := range changed {
		if got := importOf(b, cell(4*i+1)).Foreign; got != 7 {
			t.Fatalf("cell %d: foreign %d after the reloads, want the raised 7", 4*i+1, got)
		}
	}
	// The region's own rows it read are neither forwarded nor written back:
	// the store has them, and the other regions read them from it.
	if st.ComponentsForwarded != 0 || st.StoreWrites != 0 {
		t.Fatalf("forwarded %d and wrote %d rows read from the store, want none", st.ComponentsForwarded, st.StoreWrites)
	}
	if got := importOf(b, cell(0)).Own; got != 1 {
		t.Fatalf("own count of a stored own row = %d, want 1", got)
	}
}

// importOf returns the bridge's import of c as its snapshot (what a
// starting limiter loads) holds it: zero counts for a cell it does not hold.
func importOf(b *bridge.Bridge, c window.Cell) global.Import {
	for _, im := range b.Snapshot() {
		if im.Cell == c {
			return im
		}
	}
	return global.Import{Cell: c}
}
