package bridge

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// downStore is a MemoryStore whose every call fails while down is set.
type downStore struct {
	*MemoryStore
	down atomic.Bool
}

var errDown = errors.New("store down")

func (s *downStore) UpsertComponents(ctx context.Context, cs []global.Component) error {
	if s.down.Load() {
		return errDown
	}
	return s.MemoryStore.UpsertComponents(ctx, cs)
}

func (s *downStore) LoadChanged(ctx context.Context, now int64, since Mark) (Changes, error) {
	if s.down.Load() {
		return Changes{}, errDown
	}
	return s.MemoryStore.LoadChanged(ctx, now, since)
}

// redisCounts is a region's counts as its Redis would hold them, swept by
// the bridge: the pure-logic stand-in for region.Redis.ScanCounts (which
// its own tests hold to real Redis).
type redisCounts struct {
	mu     sync.Mutex
	comps  []global.Component
	sweeps atomic.Int64
}

func (r *redisCounts) set(cs ...global.Component) {
	r.mu.Lock()
	r.comps = cs
	r.mu.Unlock()
}

func (r *redisCounts) sweep(ctx context.Context, yield func([]global.Component) error) error {
	r.sweeps.Add(1)
	r.mu.Lock()
	cs := append([]global.Component(nil), r.comps...)
	r.mu.Unlock()
	return yield(cs)
}

func sweepCell(id string) window.Cell {
	now := time.Now().UnixMilli()
	return window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 600_000,
		Sequence: window.Sequence(now, 600_000)}
}

// storedCount returns the store's row of cell for region us (0: none).
func storedCount(t *testing.T, s Store, cell window.Cell) int64 {
	t.Helper()
	ch, err := s.LoadChanged(context.Background(), time.Now().UnixMilli(), 0)
	cs := ch.Components
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Cell == cell && c.Region == "us" {
			return c.Count
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A bridge that starts sweeps: the store gets the region's counts that no
// limiter published to this bridge (they went to a bridge that died). A
// store that answers again after failures is swept at once, without waiting
// for the interval (an hour here), and what the region counted meanwhile
// reaches it. Sweeping again writes nothing new.
func TestSweepsWriteTheRegionsCountsAtStartAndWhenTheStoreIsBack(t *testing.T) {
	store := &downStore{MemoryStore: NewMemoryStore()}
	a, b := sweepCell("a"), sweepCell("b")
	counts := &redisCounts{}
	counts.set(global.Component{Cell: a, Region: "us", Count: 30, ExpireAt: a.Expiry(60_000)})
	br, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, Sweep: counts.sweep,
		SweepInterval: time.Hour, StoreInterval: 10 * time.Millisecond, ReloadInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background())
	t.Cleanup(func() { _ = br.Close(context.Background()) })
	waitFor(t, "the start sweep's count in the store", func() bool { return storedCount(t, store, a) == 30 })

	store.down.Store(true)
	waitFor(t, "the store's failure to be seen", func() bool { _, err := br.Backlog(); return err != nil })
	counts.set(global.Component{Cell: a, Region: "us", Count: 45, ExpireAt: a.Expiry(60_000)},
		global.Component{Cell: b, Region: "us", Count: 7, ExpireAt: b.Expiry(60_000)})
	before := counts.sweeps.Load()
	store.down.Store(false)
	waitFor(t, "a sweep once the store answers", func() bool { return counts.sweeps.Load() > before })
	waitFor(t, "the counts of the outage in the store", func() bool {
		return storedCount(t, store, a) == 45 && storedCount(t, store, b) == 7
	})
	if st := br.Stats(); st.SweepRaised != 3 || st.Sweeps < 2 {
		t.Fatalf("stats %+v: want 3 components raised by sweeps (a at start, a and b after the outage)", st)
	}
}

// Entries a sweep yields pass the checks of everything a bridge takes in:
// another region's, or a malformed one, is refused and counted, the rest
// merged.
func TestSweepRefusesEntriesOfAnotherRegionOrMalformed(t *testing.T) {
	a := sweepCell("a")
	counts := &redisCounts{}
	counts.set(global.Component{Cell: a, Region: "eu", Count: 5, ExpireAt: a.Expiry(60_000)},
		global.Component{Cell: a, Region: "us", Count: -1, ExpireAt: a.Expiry(60_000)},
		global.Component{Cell: sweepCell("b"), Region: "us", Count: 4, ExpireAt: a.Expiry(60_000)})
	br, err := NewBridge(BridgeConfig{Region: "us", Store: NewMemoryStore(), Transport: nopTransport{}, Sweep: counts.sweep})
	if err != nil {
		t.Fatal(err)
	}
	if err := br.sweep(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	if n := br.Refused()[global.Refusal{Source: "redis", Region: "us", Reason: "invalid"}]; n != 2 {
		t.Fatalf("refused %v, want 2 invalid entries from redis", br.Refused())
	}
	if got := br.counter.Import(sweepCell("b")).Own; got != 4 {
		t.Fatalf("own count of b = %d, want 4", got)
	}
}

// SIGTERM during a store outage, with a sweep: Close does not wait for the
// store (it holds nothing that can be lost), returns nil at once, and says
// in one line how many rows the store lacks.
func TestCloseDuringAStoreOutageReturnsAtOnceNamingTheBacklog(t *testing.T) {
	store := &downStore{MemoryStore: NewMemoryStore()}
	store.down.Store(true)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	counts := &redisCounts{}
	br, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, Sweep: counts.sweep,
		Logger: log, StoreInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background())
	var cs []global.Component
	for _, id := range []string{"a", "b", "c"} {
		c := sweepCell(id)
		cs = append(cs, global.Component{Cell: c, Region: "us", Count: 10, ExpireAt: c.Expiry(60_000)})
	}
	br.FromLimiters(cs, 0)
	waitFor(t, "a failed write", func() bool { n, err := br.Backlog(); return n == 3 && err != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := br.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("close took %v with the store down", took)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if n := strings.Count(out, "not yet durable"); n != 1 || !strings.Contains(out, "not_durable=3") {
		t.Fatalf("want one line naming 3 rows not durable; log:\n%s", out)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A sweep that fails (Redis not answering when the bridge starts) is tried
// again after a second, not after the interval (an hour here).
func TestAFailedSweepIsRetriedSoon(t *testing.T) {
	store := NewMemoryStore()
	a := sweepCell("a")
	var calls atomic.Int64
	sweep := func(ctx context.Context, yield func([]global.Component) error) error {
		if calls.Add(1) == 1 {
			return errors.New("redis: connection refused")
		}
		return yield([]global.Component{{Cell: a, Region: "us", Count: 12, ExpireAt: a.Expiry(60_000)}})
	}
	br, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: nopTransport{}, Sweep: sweep,
		SweepInterval: time.Hour, StoreInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background())
	t.Cleanup(func() { _ = br.Close(context.Background()) })
	waitFor(t, "the count of the retried sweep in the store", func() bool { return storedCount(t, store, a) == 12 })
	if st := br.Stats(); st.SweepErrors != 1 {
		t.Fatalf("stats %+v: want one failed sweep", st)
	}
}
