package region

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/window"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newRedis(t *testing.T, url string) *Redis {
	t.Helper()
	r, err := NewRedis(RedisConfig{URL: url, KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func cellAt(id string, seq int64) window.Cell {
	return window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 60_000, Sequence: seq}
}

func farFuture() int64 { return time.Now().Add(time.Hour).UnixMilli() }

// exerciseOrigin checks the Origin contract against o.
func exerciseOrigin(t *testing.T, o Origin) {
	ctx := testCtx(t)
	const seq = 1000
	c := cellAt("user-1", seq)
	exp := farFuture()
	totals, err := o.Apply(ctx, "a", []Report{{Cell: c, Own: 3, ExpireAt: exp}, {Cell: cellAt("user-1", seq-1), Own: 7, ExpireAt: exp}})
	if err != nil || totals[0] != 3 || totals[1] != 7 {
		t.Fatalf("first apply = %v, %v", totals, err)
	}
	// A second reporter adds; a repeated or stale report adds nothing.
	for _, step := range []struct {
		reporter string
		own      int64
		want     int64
	}{{"b", 5, 8}, {"a", 3, 8}, {"a", 2, 8}, {"a", 4, 9}, {"b", 5, 9}} {
		totals, err := o.Apply(ctx, step.reporter, []Report{{Cell: c, Own: step.own, ExpireAt: exp}})
		if err != nil || totals[0] != step.want {
			t.Fatalf("apply %s=%d: total %v, %v; want %d", step.reporter, step.own, totals, err, step.want)
		}
	}
	cur, prev, err := o.Read(ctx, c)
	if err != nil || cur.Count != 9 || prev.Count != 7 {
		t.Fatalf("read = %d, %d, %v; want 9 and 7", cur, prev, err)
	}
	cur, prev, err = o.Read(ctx, cellAt("nobody", seq))
	if err != nil || cur.Count != 0 || prev.Count != 0 {
		t.Fatalf("read of unknown cells = %+v, %+v, %v; want zeros", cur, prev, err)
	}
	exerciseImport(t, o)
	exerciseAdmit(t, o)
}

// exerciseImport checks Import against o: the foreign usage and the own
// lower bound come back with the totals of the same read, each kept at its
// maximum; the lower bound raises the total only while it is higher; a cell
// only imported is created, and expires at the import's expiry.
func exerciseImport(t *testing.T, o Origin) {
	ctx := testCtx(t)
	const seq = 2000
	used, remote := cellAt("imported-used", seq), cellAt("imported-only", seq)
	exp := farFuture()
	if _, err := o.Apply(ctx, "a", []Report{{Cell: used, Own: 4, ExpireAt: exp}}); err != nil {
		t.Fatal(err)
	}
	for _, imports := range [][]Imported{
		{{Cell: used, Foreign: 6, Own: 2, ExpireAt: exp}, {Cell: remote, Foreign: 9, Own: 0, ExpireAt: exp}},
		{{Cell: used, Foreign: 5, Own: 1, ExpireAt: exp}, {Cell: remote, Foreign: 3, ExpireAt: exp}}, // lower: changes nothing
	} {
		if err := o.Import(ctx, imports); err != nil {
			t.Fatal(err)
		}
		cur, _, err := o.Read(ctx, used)
		if err != nil || cur != (Totals{Count: 4, Foreign: 6}) {
			t.Fatalf("read of a used cell after imports = %+v, %v; want count 4 (above the lower bound 2), foreign 6", cur, err)
		}
		cur, _, err = o.Read(ctx, remote)
		if err != nil || cur != (Totals{Count: 0, Foreign: 9}) {
			t.Fatalf("read of an imported cell = %+v, %v; want foreign 9", cur, err)
		}
	}
	// A lower bound above the total raises what Read returns (the origin
	// lost counts the bridge still has); the reporters' totals are left.
	if err := o.Import(ctx, []Imported{{Cell: used, Foreign: 6, Own: 11, ExpireAt: exp}}); err != nil {
		t.Fatal(err)
	}
	if cur, _, err := o.Read(ctx, used); err != nil || cur != (Totals{Count: 11, Foreign: 6}) {
		t.Fatalf("read after a higher own lower bound = %+v, %v; want count 11", cur, err)
	}
	if totals, err := o.Apply(ctx, "a", []Report{{Cell: used, Own: 5, ExpireAt: exp}}); err != nil || totals[0] != 5 {
		t.Fatalf("apply after imports = %v, %v; want the reporters' total 5", totals, err)
	}
}

// exerciseAdmit checks Admit and Release against o: the threshold is exact,
// the reporter's unreported admissions are recorded first and replays stay
// idempotent, counts above 10^14 (where Lua writes numbers in exponent
// notation) stay exact.
func exerciseAdmit(t *testing.T, o Origin) {
	ctx := testCtx(t)
	c := cellAt("admit", 2000)
	exp := farFuture()
	// a admits 3 into an empty cell.
	res, err := o.Admit(ctx, "a", Admission{Cell: c, Own: 0, Cost: 3, Max: 0, ExpireAt: exp})
	if err != nil || res != (AdmitResult{Admitted: true, Total: 3, Reported: 3}) {
		t.Fatalf("admit into an empty cell: %+v, %v", res, err)
	}
	// b has admitted 2 locally: they are recorded, then 1 fits while the
	// total (5) is at most 5, and no longer once it is 6.
	res, err = o.Admit(ctx, "b", Admission{Cell: c, Own: 2, Cost: 1, Max: 5, ExpireAt: exp})
	if err != nil || res != (AdmitResult{Admitted: true, Total: 6, Reported: 3}) {
		t.Fatalf("admit with unreported cost at the threshold: %+v, %v", res, err)
	}
	res, err = o.Admit(ctx, "b", Admission{Cell: c, Own: 3, Cost: 1, Max: 5, ExpireAt: exp})
	if err != nil || res != (AdmitResult{Admitted: false, Total: 6, Reported: 3}) {
		t.Fatalf("admit above the threshold: %+v, %v", res, err)
	}
	// A replay of what b has (3) counts nothing twice; a later one adds.
	if totals, err := o.Apply(ctx, "b", []Report{{Cell: c, Own: 3, ExpireAt: exp}}); err != nil || totals[0] != 6 {
		t.Fatalf("replay after admit: %v, %v; want 6", totals, err)
	}
	if totals, err := o.Apply(ctx, "b", []Report{{Cell: c, Own: 4, ExpireAt: exp}}); err != nil || totals[0] != 7 {
		t.Fatalf("replay of a later local admission: %v, %v; want 7", totals, err)
	}
	// Release takes a reservation back.
	res, err = o.Admit(ctx, "a", Admission{Cell: c, Own: 3, Cost: 2, Max: 100, ExpireAt: exp})
	if err != nil || !res.Admitted || res.Total != 9 {
		t.Fatalf("admit before release: %+v, %v", res, err)
	}
	if err := o.Release(ctx, "a", c, 2); err != nil {
		t.Fatal(err)
	}
	if cur, _, err := o.Read(ctx, c); err != nil || cur.Count != 7 {
		t.Fatalf("total after release %d, %v; want 7", cur, err)
	}
	// Large counts stay exact.
	big := cellAt("admit-big", 2000)
	const own, cost = 123_456_789_012_345, 987_654_321_012
	res, err = o.Admit(ctx, "a", Admission{Cell: big, Own: own, Cost: cost, Max: own, ExpireAt: exp})
	if err != nil || res != (AdmitResult{Admitted: true, Total: own + cost, Reported: own + cost}) {
		t.Fatalf("admit of large counts: %+v, %v", res, err)
	}
}

func TestMemoryOrigin(t *testing.T) { exerciseOrigin(t, NewMemory(nil)) }

func TestRedisOrigin(t *testing.T) { exerciseOrigin(t, newRedis(t, redistest.SharedURL(t))) }

func TestRedisClusterOrigin(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	r := newRedis(t, url)
	exerciseOrigin(t, r)

	// Many identifiers spread over every node in one pipeline.
	ctx := testCtx(t)
	var reports []Report
	for i := range 300 {
		reports = append(reports, Report{Cell: cellAt(fmt.Sprint("spread-", i), 5), Own: int64(i + 1), ExpireAt: farFuture()})
	}
	totals, err := r.Apply(ctx, "a", reports)
	if err != nil {
		t.Fatal(err)
	}
	for i, tot := range totals {
		if tot != int64(i+1) {
			t.Fatalf("cell %d total %d, want %d", i, tot, i+1)
		}
	}
	// The current and previous cell of any identifier share a slot.
	client := r.Client()
	for _, id := range []string{"user-1", "{brace}", "a}b{c", "dots.and.more", "\x00\xff binary"} {
		cur, prev := r.Key(cellAt(id, 99)), r.Key(cellAt(id, 98))
		s1, err1 := client.ClusterKeySlot(ctx, cur).Result()
		s2, err2 := client.ClusterKeySlot(ctx, prev).Result()
		if err1 != nil || err2 != nil || s1 != s2 {
			t.Fatalf("%q: slots %d (%v) and %d (%v) differ", id, s1, err1, s2, err2)
		}
	}
}

func TestRedisKeysAreUnambiguous(t *testing.T) {
	r := &Redis{prefix: "p"}
	seen := map[string]window.Cell{}
	rnd := rand.New(rand.NewPCG(7, 7))
	ids := []string{"a", "a.b", "a}", "{a}", "", "\x00", "é"}
	for range 2000 {
		b := make([]byte, rnd.IntN(6))
		for i := range b {
			b[i] = ".{}a\x00\xff"[rnd.IntN(6)]
		}
		ids = append(ids, string(b))
	}
	for _, id := range ids {
		for _, ws := range []string{"a", "a-b"} {
			for _, seq := range []int64{1, 11} {
				c := window.Cell{Workspace: ws, Namespace: "n", Identifier: id, Duration: 1000, Sequence: seq}
				k := r.Key(c)
				if other, ok := seen[k]; ok && other != c {
					t.Fatalf("cells %+v and %+v share key %q", other, c, k)
				}
				seen[k] = c
				tag := k[strings.IndexByte(k, '{')+1 : strings.IndexByte(k, '}')]
				if !strings.HasSuffix(k, "}."+fmt.Sprint(seq)) || strings.ContainsAny(tag, "{}") {
					t.Fatalf("key %q: the hash tag must hold everything but the sequence", k)
				}
			}
		}
	}
}

func TestRedisExpiryIsAbsoluteAndIdempotent(t *testing.T) {
	r := newRedis(t, redistest.SharedURL(t))
	ctx := testCtx(t)
	c := cellAt("expiring", 1)
	exp := time.Now().Add(90 * time.Second).UnixMilli()
	for own := range int64(3) {
		if _, err := r.Apply(ctx, "a", []Report{{Cell: c, Own: own + 1, ExpireAt: exp}}); err != nil {
			t.Fatal(err)
		}
	}
	at, err := r.Client().PExpireTime(ctx, r.Key(c)).Result()
	if err != nil || at.Milliseconds() != exp {
		t.Fatalf("expire time %v (%v), want %d", at, err, exp)
	}
}

func TestRedisReloadsScriptsItLost(t *testing.T) {
	r := newRedis(t, "redis://"+redistest.StartServer(t))
	ctx := testCtx(t)
	if _, err := r.Apply(ctx, "a", []Report{{Cell: cellAt("x", 1), Own: 1, ExpireAt: farFuture()}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if totals, err := r.Apply(ctx, "a", []Report{{Cell: cellAt("x", 1), Own: 2, ExpireAt: farFuture()}}); err != nil || totals[0] != 2 {
		t.Fatalf("apply after the scripts were flushed: %v, %v", totals, err)
	}
	if cur, _, err := r.Read(ctx, cellAt("x", 1)); err != nil || cur.Count != 2 {
		t.Fatalf("read after the scripts were flushed: %d, %v", cur, err)
	}
}

func TestRedisURLForms(t *testing.T) {
	for _, bad := range []string{"127.0.0.1:6379", "http://127.0.0.1:6379", "redis://127.0.0.1:6379?bogus=1"} {
		if _, err := NewRedis(RedisConfig{URL: bad}); err == nil {
			t.Fatalf("NewRedis(%q) accepted a bad URL", bad)
		}
	}
	if _, err := NewRedis(RedisConfig{URL: "redis://127.0.0.1:6379", KeyPrefix: "a{b"}); err == nil {
		t.Fatal("a prefix with a brace was accepted")
	}
	for _, good := range []string{"redis://127.0.0.1:6379/2", "rediss://u:p@127.0.0.1:6380", "redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001"} {
		r, err := NewRedis(RedisConfig{URL: good})
		if err != nil {
			t.Fatalf("NewRedis(%q): %v", good, err)
		}
		r.Close()
	}
}

// A URL that does not parse is refused without quoting its password: the
// error reaches the limiter's log.
func TestNewRedisErrorsHideThePassword(t *testing.T) {
	for _, bad := range []string{"redis://:s3cr%zz@127.0.0.1:6379", "redis+cluster://u:s3cr%zz@127.0.0.1:7000", "u:s3cr%zz@127.0.0.1:6379", "redis://u:s3cr%zz@127.0.0.1:6379/x"} {
		_, err := NewRedis(RedisConfig{URL: bad})
		if err == nil {
			t.Fatalf("NewRedis(%q) accepted a bad URL", bad)
		}
		if strings.Contains(err.Error(), "s3cr") {
			t.Errorf("NewRedis(%q): error %q shows the password", bad, err)
		}
	}
}

// The breaker opens after consecutive failures (refused or black-holed
// Redis), refuses at once while open, and closes when Redis answers again.
func TestBreakerOpensOnFailuresAndClosesOnRecovery(t *testing.T) {
	shared := redistest.SharedURL(t)
	target := strings.TrimPrefix(shared, "redis://")
	proxy, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var states []gobreaker.State
	b := NewBreaker(newRedis(t, "redis://"+proxy.Addr()), BreakerConfig{
		Failures: 3, OpenFor: 200 * time.Millisecond,
		OnStateChange: func(call Call, _, to gobreaker.State) {
			if call == CallRead {
				states = append(states, to)
			}
		},
	})
	c := cellAt("breaker", 1)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, _, err := b.Read(ctx, c)
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []tcpproxy.Mode{tcpproxy.Refuse, tcpproxy.Blackhole} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			proxy.SetMode(mode)
			for range 3 {
				if err := call(); err == nil {
					t.Fatal("a call through a failing proxy succeeded")
				}
			}
			if b.State(CallRead) != gobreaker.StateOpen {
				t.Fatalf("state after 3 failures = %v, want open", b.State(CallRead))
			}
			start := time.Now()
			if err := call(); !errors.Is(err, ErrOriginOpen) || time.Since(start) > 10*time.Millisecond {
				t.Fatalf("call while open: %v after %v; want ErrOriginOpen at once", err, time.Since(start))
			}
			proxy.SetMode(tcpproxy.Pass)
			deadline := time.Now().Add(5 * time.Second)
			for call() != nil {
				if time.Now().After(deadline) {
					t.Fatal("breaker never closed after Redis came back")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if b.State(CallRead) != gobreaker.StateClosed {
				t.Fatalf("state after recovery = %v", b.State(CallRead))
			}
		})
	}
	if len(states) < 6 {
		t.Fatalf("state changes %v, want open, half-open, closed twice", states)
	}
}

// A cell that only Import created expires at the import's expiry; a cell
// that reports created keeps the expiry its reports set.
func TestRedisImportExpiresTheCellsItCreates(t *testing.T) {
	ctx := testCtx(t)
	r := newRedis(t, redistest.SharedURL(t))
	only, used := cellAt("expiry-imported", 3000), cellAt("expiry-used", 3000)
	reported, imported := time.Now().Add(time.Hour).UnixMilli(), time.Now().Add(2*time.Hour).UnixMilli()
	if _, err := r.Apply(ctx, "a", []Report{{Cell: used, Own: 1, ExpireAt: reported}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Import(ctx, []Imported{{Cell: only, Foreign: 2, ExpireAt: imported}, {Cell: used, Foreign: 2, ExpireAt: imported}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cell window.Cell
		want int64
	}{{only, imported}, {used, reported}} {
		got, err := r.Client().PExpireTime(ctx, r.Key(c.cell)).Result()
		if err != nil || got.Milliseconds() != c.want {
			t.Fatalf("%s expires at %v (%v), want %d", c.cell.Identifier, got.Milliseconds(), err, c.want)
		}
	}
}

// The cost of recording imports in Redis, per cell, 1000 cells a call (8
// script calls of 128 cells in one pipeline).
func BenchmarkRedisImport(b *testing.B) {
	r, err := NewRedis(RedisConfig{URL: redistest.SharedURL(b), KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	const n = 1000
	is := make([]Imported, n)
	for i := range is {
		is[i] = Imported{Cell: cellAt(fmt.Sprint("bench-", i), 1), Foreign: 5, ExpireAt: farFuture()}
	}
	ctx := context.Background()
	for b.Loop() {
		is[0].Foreign++ // one cell raised, as in steady traffic
		if err := r.Import(ctx, is); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/import")
}
