package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// A limiter without Redis that starts after a reset takes the reset marks
// from its bridge before the bridge's imports: the imports of the reset's
// cell (another region's usage since the reset) reach the cell of the
// reset's epoch, and those of the cell the reset forgot count nowhere. Were
// the imports applied first, each would go to the cell of epoch 0 the
// limiter makes without the marks, where the reset cell's are dropped (not
// of that cell's epoch), and the marks then forget that cell: the limiter
// would admit what another region spent after the reset.
func TestALimiterTakesTheResetMarksBeforeTheImports(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown) // cleanups run last in first out: the limiter stops first
	url := srv.ClientURL()

	// A day's window; the limiter runs on the system's clock, so a run
	// that would begin in the day's last 10 s waits for the next day.
	const d, limit = int64(86_400_000), int64(10)
	now := time.Now().UnixMilli()
	if left := d - now%d; left < 10_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
		now = time.Now().UnixMilli()
	}
	mark := policy.Mark{Workspace: "acme", Namespace: "api", Identifier: "yan", Duration: d, Epoch: now}
	old := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "yan", Duration: d, Sequence: now / d}
	reset := old
	reset.Epoch = mark.Epoch
	// What the region's bridge found in the store: the reset, and region
	// us's usage of the identifier, the limit before the reset and all of it
	// but 2 since.
	store := bridge.NewMemoryStore()
	if err := store.UpsertMarks(t.Context(), []policy.Mark{mark}); err != nil {
		t.Fatal(err)
	}
	if err := store.UpsertComponents(t.Context(), []global.Component{
		{Cell: old, Region: "us", Count: limit, ExpireAt: old.Expiry(60_000)},
		{Cell: reset, Region: "us", Count: limit - 2, ExpireAt: reset.Expiry(60_000)},
	}); err != nil {
		t.Fatal(err)
	}
	bnc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bnc.Close)
	tr := link.NewBridge(bnc, wire.Subjects{}, "eu", nil)
	br, err := bridge.NewBridge(bridge.BridgeConfig{Region: "eu", Regions: []string{"eu", "us"}, Store: store,
		Transport: tr, ReloadInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(t.Context())
	t.Cleanup(func() { _ = br.Close(context.Background()) })
	if err := tr.Serve(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if n := len(br.Snapshot()); n != 2 {
		t.Fatalf("the bridge holds %d imports for eu, want 2 (us's cells of both epochs)", n)
	}

	serveInBackground(t, io.Discard, "--nats-url", url, "--region", "eu")
	waitServing(t, url)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body := fmt.Sprintf(`{"identifier":"yan","limit":%d,"duration":%d}`, limit, d)
	m, err := nc.Request(wire.Subjects{}.Check("acme", "api"), []byte(body), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply struct {
		Success   bool  `json:"success"`
		Remaining int64 `json:"remaining"`
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	if !reply.Success || reply.Remaining != 1 {
		t.Fatalf("first check after the start: %s; want admitted with 1 left: us's %d since the reset count, its %d before do not",
			m.Data, limit-2, limit)
	}
}
