package region

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/window"
)

// scanAll returns every cell ScanCounts yields, by cell, failing on a cell
// yielded twice with different counts.
func scanAll(t *testing.T, r *Redis) (map[window.Cell]CellCount, ScanReport) {
	t.Helper()
	var mu sync.Mutex
	got := make(map[window.Cell]CellCount)
	rep, err := r.ScanCounts(testCtx(t), func(cs []CellCount) error {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cs {
			if old, ok := got[c.Cell]; ok && old.Count != c.Count {
				t.Errorf("cell %v yielded twice: %d and %d", c.Cell, old.Count, c.Count)
			}
			got[c.Cell] = c
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, rep
}

// The count the scan recovers is the region's count as Read and the sync
// script count it, for every kind of cell: leases given back, a live lease
// partly used (its unused part is not usage), a lease no longer live (all
// of it counts, as denials count it), a cell only the bridge's import wrote
// (its own count), a cell that lost admissions (restored as "b"), cells
// whose local counts a sync and imports raised. Keys that
// are not cells, and cells of other prefixes (one that starts with this one,
// one that is a glob pattern matching it), are not read.
func TestScanCountsAgreesWithReadForEveryKindOfCell(t *testing.T) {
	url := redistest.SharedURL(t)
	prefix := redistest.Prefix(t)
	r, err := NewRedis(RedisConfig{URL: url, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := testCtx(t)
	const seq = 3000
	exp := farFuture()

	given := cellAt("given-back", seq)
	a := &syncer{t: t, o: r, reporter: "a"}
	a.sync(Sync{Cell: given, Used: 7, Claim: 7})

	// b is granted 3 and a lease; it then reports 10 used of claim 3+lease:
	// the rest of its lease is live and unused.
	leased := cellAt("leased", seq)
	b := &syncer{t: t, o: r, reporter: "b"}
	res := b.sync(Sync{Cell: leased, Limit: 1000, Requests: reqs(3), Want: 40})
	if res.Lease < 20 {
		t.Fatalf("lease %d, want at least 20 to spend", res.Lease)
	}
	b.sync(Sync{Cell: leased, Limit: 1000, Used: 10, Claim: 3 + res.Lease, ReportOnly: true})

	// c is granted 2 and a lease live for 1 ms: once it is no longer live,
	// all of it counts.
	dead := cellAt("dead-lease", seq)
	c := &syncer{t: t, o: r, reporter: "c"}
	resC := c.sync(Sync{Cell: dead, Limit: 1000, Requests: reqs(2), Want: 40, LiveFor: 1})
	if resC.Lease == 0 {
		t.Fatal("no lease granted")
	}

	imported := cellAt("imported-only", seq)
	lost := cellAt("lost", seq)
	a.sync(Sync{Cell: lost, Used: 5, Claim: 5})
	if err := r.Import(ctx, []Imported{
		{Cell: imported, Foreign: 4, Own: 9, ExpireAt: exp},
		{Cell: lost, Foreign: 1, Own: 50, ExpireAt: exp}, // Redis lost 45 of the region's 50
	}); err != nil {
		t.Fatal(err)
	}
	// Local counts: one told by a sync (5 used, 20 local) and raised by an
	// import (another LocalID's 10), one told by an import alone.
	raised, localOnly := cellAt("local-raised", seq), cellAt("local-only", seq)
	a.sync(Sync{Cell: raised, Used: 5, Claim: 5, LocalID: "a.1", Local: 20})
	if err := r.Import(ctx, []Imported{
		{Cell: raised, Locals: []LocalCount{{ID: "a.1", Count: 20}, {ID: "b.1", Count: 10}}, ExpireAt: exp},
		{Cell: localOnly, Locals: []LocalCount{{ID: "b.1", Count: 6}}, ExpireAt: exp},
	}); err != nil {
		t.Fatal(err)
	}
	// Not cells: a key of the form with an invalid cell, and keys that only
	// share the prefix.
	client := r.Client()
	for _, k := range []string{prefix + "{a.b.0.eA}:1", prefix + "{junk}:x", prefix + "-notes"} {
		if err := client.Set(ctx, k, "1", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Cells under other prefixes: one that extends this one, one whose
	// glob characters would match this one's keys if SCAN took it as a
	// pattern.
	for _, other := range []string{prefix + "-other", prefix + "*"} {
		o, err := NewRedis(RedisConfig{URL: url, KeyPrefix: other})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		(&syncer{t: t, o: o, reporter: "x"}).sync(Sync{Cell: cellAt("elsewhere", seq), Used: 99, Claim: 99})
		got, _ := scanAll(t, o)
		if len(got) != 1 {
			t.Fatalf("prefix %q: scan found %d cells, want its own 1: %v", other, len(got), got)
		}
	}

	want := map[window.Cell]int64{given: 7, leased: 10, dead: 2 + resC.Lease, imported: 9, lost: 50, raised: 35, localOnly: 6}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, rep := scanAll(t, r)
		if got[dead].Count != want[dead] && time.Now().Before(deadline) {
			// Redis's clock decides when c's lease stops being live.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if len(got) != len(want) || rep.Cells != len(want) {
			t.Fatalf("scan found %d cells (report %+v), want %d: %v", len(got), rep, len(want), got)
		}
		if rep.Skipped != 2 {
			t.Errorf("skipped %d keys, want the 2 of the form that are not cells", rep.Skipped)
		}
		for cell, n := range want {
			cc := got[cell]
			if cc.Count != n {
				t.Errorf("%s: scanned count %d, want %d", cell.Identifier, cc.Count, n)
			}
			if d := cc.ExpireAt - exp; d < -5000 || d > 5000 {
				t.Errorf("%s: expiry %d, want about %d (what the syncs set)", cell.Identifier, cc.ExpireAt, exp)
			}
			cur, _, err := r.Read(ctx, cell)
			if err != nil {
				t.Fatal(err)
			}
			if cur.Count != cc.Count {
				t.Errorf("%s: scan says %d, Read says %d: the two definitions drifted", cell.Identifier, cc.Count, cur.Count)
			}
		}
		return
	}
}

// In a Redis Cluster the scan reads every master, and the counts of cells
// spread over the slots are each the cell's own.
func TestScanCountsReadsEveryNodeOfACluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	r := newRedis(t, "redis+cluster://"+addrs[0]+"?addr="+strings.Join(addrs[1:], "&addr="))
	const n = 60
	var ss []Sync
	for i := range n {
		ss = append(ss, Sync{Cell: cellAt(fmt.Sprintf("user-%d", i), 4000), Seq: 1, Used: int64(i + 1), Claim: int64(i + 1),
			Limit: 1000, LiveFor: 60_000, ExpireAt: farFuture(), ReportOnly: true})
	}
	if _, err := r.Settle(testCtx(t), "a", ss); err != nil {
		t.Fatal(err)
	}
	got, rep := scanAll(t, r)
	if len(got) != n || rep.Skipped != 0 {
		t.Fatalf("scan found %d cells (report %+v), want %d", len(got), rep, n)
	}
	for _, s := range ss {
		if got[s.Cell].Count != s.Used {
			t.Errorf("%s: count %d, want %d", s.Cell.Identifier, got[s.Cell].Count, s.Used)
		}
	}
}

// A yield error ends the scan and is returned.
func TestScanCountsStopsAtTheFirstYieldError(t *testing.T) {
	r := newRedis(t, redistest.SharedURL(t))
	(&syncer{t: t, o: r, reporter: "a"}).sync(Sync{Cell: cellAt("one", 5000), Used: 1, Claim: 1})
	stop := fmt.Errorf("enough")
	if _, err := r.ScanCounts(testCtx(t), func([]CellCount) error { return stop }); err == nil || !strings.Contains(err.Error(), "enough") {
		t.Fatalf("err %v, want the yield's", err)
	}
}

// BenchmarkScanCounts measures a sweep of 20,000 cells, with leases given
// back, and with every cell holding a live lease (its count reads the
// whole hash): ns/cell end to end, and Redis's own CPU per cell from INFO
// (the shared server may serve others meanwhile: an upper bound).
func BenchmarkScanCounts(b *testing.B) {
	b.Run("given-back", func(b *testing.B) { benchScan(b, false) })
	b.Run("leased", func(b *testing.B) { benchScan(b, true) })
}

func benchScan(b *testing.B, leased bool) {
	r, err := NewRedis(RedisConfig{URL: redistest.SharedURL(b), KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	const n = 20_000
	ss := make([]Sync, n)
	for i := range ss {
		ss[i] = Sync{Cell: cellAt(fmt.Sprint("sweep-", i), 1), Seq: 1, Used: 5, Claim: 5, Limit: window.MaxLimit,
			LiveFor: 3_600_000, ExpireAt: time.Now().Add(10 * time.Minute).UnixMilli(), ReportOnly: true}
		if leased {
			ss[i].Claim = 50 // a live lease, 45 of it unused
		}
	}
	ctx := context.Background()
	for start := 0; start < n; start += 512 {
		if _, err := r.Settle(ctx, "a", ss[start:min(start+512, n)]); err != nil {
			b.Fatal(err)
		}
	}
	cpu := func() float64 {
		info, err := r.Client().Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(line, f); ok {
					var x float64
					fmt.Sscan(v, &x)
					total += x
				}
			}
		}
		return total
	}
	before := cpu()
	for b.Loop() {
		seen := 0
		if _, err := r.ScanCounts(ctx, func(cs []CellCount) error { seen += len(cs); return nil }); err != nil {
			b.Fatal(err)
		}
		if seen < n {
			b.Fatalf("scan saw %d of %d cells", seen, n)
		}
	}
	cells := float64(b.N * n)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/cells, "ns/cell")
	b.ReportMetric((cpu()-before)*1e9/cells, "redis-cpu-ns/cell")
}

// epochCell is a cell of a reset's epoch (the epoch lies in its window).
var epochCell = window.Cell{Workspace: "acme", Namespace: "api", Identifier: "user-1", Duration: 60_000, Sequence: 7, Epoch: 7*60_000 + 1234}

// A cell of a reset's epoch has its epoch-0 key followed by :epoch, the
// same hash tag, and parses back with its epoch; the epoch-0 key is
// unchanged.
func TestResetCellKeysParseBack(t *testing.T) {
	r := &Redis{prefix: "sluice"}
	plain := epochCell
	plain.Epoch = 0
	if got, want := r.Key(epochCell), r.Key(plain)+":421234"; got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
	if got := r.Key(plain); got != "sluice{acme.api.60000.dXNlci0x}:7" {
		t.Fatalf("epoch-0 key changed: %q", got)
	}
	for _, c := range []window.Cell{epochCell, plain} {
		if back, ok := r.ParseKey(r.Key(c)); !ok || back != c {
			t.Fatalf("%+v parsed back as %+v, %v", c, back, ok)
		}
	}
}

// ParseKey reads keys found in Redis: any string is refused or parsed into
// the one cell whose key it is, and every valid cell's key parses back.
func FuzzParseKey(f *testing.F) {
	r := &Redis{prefix: "sluice"}
	for _, k := range []string{r.Key(cellAt("user-1", 7)), r.Key(cellAt("\x00\xff{}.", 0)), "sluice{a.b.1000.}:1",
		r.Key(epochCell), "sluice{a.b.1000.eA}:1:0", "sluice{a.b.1000.eA}:1:x", "sluice{a.b.1000.eA}:-1", "sluice{a.b.c.d.e}:1", "sluice{junk}:x", "other{a.b.1000.eA}:1", "sluice{a.b.1000.eA}.1", ""} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		c, ok := r.ParseKey(key)
		if !ok {
			return
		}
		if c.Validate() != nil || r.Key(c) != key {
			t.Fatalf("%q parsed into %+v, whose key is %q", key, c, r.Key(c))
		}
		if back, ok := r.ParseKey(r.Key(c)); !ok || back != c {
			t.Fatalf("%+v does not parse back: %+v, %v", c, back, ok)
		}
	})
}
