package bridge

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// markTransport records the marks a bridge forwards and broadcasts.
type markTransport struct {
	nopTransport
	mu                   sync.Mutex
	forwarded, broadcast []policy.Mark
}

func (m *markTransport) ForwardPolicies(_ context.Context, _ []policy.Entry, ms []policy.Mark) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forwarded = append(m.forwarded, ms...)
	return nil
}

func (m *markTransport) BroadcastPolicies(_ context.Context, _ []policy.Entry, ms []policy.Mark, _ uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.broadcast = append(m.broadcast, ms...)
	return nil
}

// Marks the region's limiters accepted are merged by max, broadcast,
// forwarded and stored; marks of other regions and of the store are
// broadcast, not forwarded; marks from the future are refused; a bridge
// started on the store has the live ones; expired marks go with the
// cleanup.
func TestBridgeCarriesResetMarks(t *testing.T) {
	now := int64(1_700_000_000_000)
	clock := func() time.Time { return time.UnixMilli(now) }
	store := NewMemoryStore()
	tr := &markTransport{}
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: tr, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id string, epoch int64) policy.Mark {
		return policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 60_000, Epoch: epoch}
	}
	if err := b.FromLimiterPolicies(nil, []policy.Mark{mk("own", now), mk("own", now-10)}, now); err != nil {
		t.Fatal(err)
	}
	if err := b.FromRegionPolicies("eu", nil, []policy.Mark{mk("theirs", now-5)}, now); err != nil {
		t.Fatal(err)
	}
	if err := b.FromRegionPolicies("eu", nil, []policy.Mark{mk("future", now+time.Hour.Milliseconds())}, now); !errors.Is(err, policy.ErrFuture) {
		t.Fatalf("a mark from the future: %v", err)
	}
	b.batchPolicies(t.Context())
	if len(tr.forwarded) != 1 || tr.forwarded[0] != mk("own", now) {
		t.Fatalf("forwarded %+v, want only the region's own mark", tr.forwarded)
	}
	if len(tr.broadcast) != 2 {
		t.Fatalf("broadcast %+v, want both marks", tr.broadcast)
	}
	if err := b.writePolicies(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ms, _ := store.LoadMarks(t.Context(), now); len(ms) != 2 {
		t.Fatalf("stored %+v, want both marks", ms)
	}

	tr2 := &markTransport{}
	b2, err := NewBridge(BridgeConfig{Region: "ap", Store: store, Transport: tr2, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b2.Marks().Epoch("ws", "ns", "own", 60_000) != now || b2.PolicyDigests().Total != b.PolicyDigests().Total {
		t.Fatal("a bridge loading the store lacks the marks")
	}
	b2.batchPolicies(t.Context())
	if len(tr2.forwarded) != 0 || len(tr2.broadcast) != 2 {
		t.Fatalf("marks of the store: forwarded %+v, broadcast %+v; want broadcast only", tr2.forwarded, tr2.broadcast)
	}

	now = mk("own", now).ExpireAt(global.MarkGrace.Milliseconds())
	b.cleanup()
	if n := len(b.Marks().All()); n != 0 {
		t.Fatalf("%d marks left after they expired", n)
	}
}

// A reset of every duration lasts minutes as such. When it expires, the
// bridge keeps it as a mark of each longer duration whose cells of the
// identifier its counter holds (any region's), while the reset concerns
// them: those are broadcast, forwarded and stored. An identifier without
// such cells keeps nothing.
func TestBridgeKeepsAResetOfEveryDurationForTheDurationsInUse(t *testing.T) {
	now := int64(1_700_000_000_000)
	clock := func() time.Time { return time.UnixMilli(now) }
	store := NewMemoryStore()
	tr := &markTransport{}
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: tr, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	const day = 86_400_000
	cell := window.Cell{Workspace: "ws", Namespace: "ns", Identifier: "bob", Duration: day, Sequence: now / day}
	b.FromLimiters([]global.Component{{Cell: cell, Region: "us", Count: 40, ExpireAt: window.Start(cell.Sequence+2, day)}}, now)
	short := cell
	short.Identifier, short.Duration, short.Sequence = "carol", 1000, now/1000
	b.FromLimiters([]global.Component{{Cell: short, Region: "us", Count: 3, ExpireAt: window.Start(short.Sequence+2, 1000)}}, now)
	all := func(id string) policy.Mark {
		return policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: policy.AllDurations, Epoch: now}
	}
	if err := b.FromLimiterPolicies(nil, []policy.Mark{all("bob"), all("carol")}, now); err != nil {
		t.Fatal(err)
	}
	b.batchPolicies(t.Context())
	tr.forwarded, tr.broadcast = nil, nil

	want := policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "bob", Duration: day, Epoch: now}
	now = all("bob").ExpireAt(global.MarkGrace.Milliseconds())
	b.cleanup()
	if got := b.Marks().All(); len(got) != 1 || got[0] != want {
		t.Fatalf("marks after the reset of every duration expired: %+v, want only %+v", got, want)
	}
	b.batchPolicies(t.Context())
	if len(tr.broadcast) != 1 || tr.broadcast[0] != want || len(tr.forwarded) != 1 || tr.forwarded[0] != want {
		t.Fatalf("broadcast %+v, forwarded %+v; want %+v both", tr.broadcast, tr.forwarded, want)
	}
	if err := b.writePolicies(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ms, _ := store.LoadMarks(t.Context(), now); len(ms) != 1 || ms[0] != want {
		t.Fatalf("stored %+v, want %+v", ms, want)
	}
}

// budgetStore is a MemoryStore that records the time each LoadChanged was
// given, and refuses a full read given less than full: a store whose
// every live row takes that long to read.
type budgetStore struct {
	*MemoryStore
	full time.Duration
	mu   sync.Mutex
	got  []time.Duration // the budget of each read, by its context's deadline
}

func (s *budgetStore) LoadChanged(ctx context.Context, now int64, since Mark) (Changes, error) {
	d, _ := ctx.Deadline()
	budget := time.Until(d)
	s.mu.Lock()
	s.got = append(s.got, budget)
	s.mu.Unlock()
	if since == 0 && budget < s.full {
		return Changes{}, context.DeadlineExceeded
	}
	return s.MemoryStore.LoadChanged(ctx, now, since)
}

// A bridge's first read of the store returns every live row, which can take
// longer than one store call may: Start waits StoreTimeout, and the reload
// loop then gives the read FullLoadTimeout, so a large store is loaded
// rather than tried again and again for ever. Later reads, of what
// changed, keep StoreTimeout.
func TestTheFirstFullReadGetsItsOwnTime(t *testing.T) {
	store := &budgetStore{MemoryStore: NewMemoryStore(), full: 10 * time.Second}
	if err := store.UpsertOverrides(t.Context(), []policy.Entry{{Key: policy.Key{Workspace: "ws", Namespace: "ns", Pattern: "p"},
		Override: policy.Override{Limit: 5, Duration: 60_000}, Version: policy.Version{At: time.Now().UnixMilli(), Origin: "us"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, StoreTimeout: time.Second, FullLoadTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.reload(t.Context()); err != nil {
		t.Fatalf("the first read, given FullLoadTimeout: %v", err)
	}
	if _, ok := b.pol.table.Get(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: "p"}); !ok {
		t.Fatal("the override was not loaded")
	}
	if err := b.reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.got) != 2 || store.got[0] < 50*time.Second || store.got[1] > time.Second {
		t.Fatalf("budgets %v; want the full read about a minute, the next at most a second", store.got)
	}
	// Start waits no longer than StoreTimeout, whatever the read needs.
	b2, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, StoreTimeout: time.Second, FullLoadTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	store.got = nil
	store.mu.Unlock()
	b2.Start(t.Context())
	b2.Close(t.Context())
	store.mu.Lock()
	if len(store.got) == 0 || store.got[0] > time.Second {
		t.Fatalf("Start's read was given %v, want at most StoreTimeout", store.got)
	}
}

// An expired mark leaves a running bridge within a reload, not at its
// next cleanup (a minute): the limiters prune theirs before each digest
// exchange, and a mark that only one side holds makes its part of the
// digests differ until both forgot it.
func TestARunningBridgeForgetsAnExpiredMarkWithinAReload(t *testing.T) {
	var now atomic.Int64
	now.Store(1_700_000_000_000)
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	b, err := NewBridge(BridgeConfig{Region: "us", Store: NewMemoryStore(), Transport: &markTransport{}, Now: clock,
		ReloadInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := policy.Mark{Workspace: "ws", Namespace: "ns", Identifier: "bob", Duration: 60_000, Epoch: now.Load()}
	if err := b.FromLimiterPolicies(nil, []policy.Mark{m}, now.Load()); err != nil {
		t.Fatal(err)
	}
	b.Start(t.Context())
	defer b.Close(t.Context())
	now.Store(m.ExpireAt(global.MarkGrace.Milliseconds()))
	deadline := time.Now().Add(5 * time.Second)
	for len(b.Marks().All()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the expired mark is still held 5 s on: %v", b.Marks().All())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
