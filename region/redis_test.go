package region

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	return newRedisForget(t, url, 0)
}

// newRedisForget is newRedis with the origin's ForgetAfter (0: default).
func newRedisForget(t *testing.T, url string, forget time.Duration) *Redis {
	t.Helper()
	r, err := NewRedis(RedisConfig{URL: url, KeyPrefix: redistest.Prefix(t), ForgetAfter: forget})
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

func TestRedisClusterOrigin(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	r := newRedisForget(t, url, redisForget)
	exerciseSync(t, redisUnderTest(t, r)) // settle spreads many identifiers over every node
	exerciseImport(t, r)
	exerciseLocal(t, redisUnderTest(t, r), redisUnderTest(t, newRedisForget(t, url, redisForgetShort)))
	exerciseTripViews(t, r, r) // syncs sharing trips, spread over every node
	exerciseValueViews(t, r)
	ctx := testCtx(t)
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
				if !strings.HasSuffix(k, "}:"+fmt.Sprint(seq)) || strings.ContainsAny(tag, "{}") {
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
	for seq := range int64(3) {
		if _, err := r.Sync(ctx, "a", Sync{Cell: c, Seq: seq + 1, Used: seq, Claim: seq, Limit: 10, ExpireAt: exp}); err != nil {
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
	if _, err := r.Sync(ctx, "a", Sync{Cell: cellAt("x", 1), Seq: 1, Used: 1, Claim: 1, Limit: 10, ExpireAt: farFuture()}); err != nil {
		t.Fatal(err)
	}
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Settle(ctx, "a", []Sync{{Cell: cellAt("x", 1), Seq: 2, Used: 2, Claim: 2, Limit: 10, ExpireAt: farFuture()}}); err != nil || res[0].Current.Used != 2 {
		t.Fatalf("settle after the scripts were flushed: %v, %v", res, err)
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
	b := NewBreaker(readsAsSyncs{newRedis(t, "redis://"+proxy.Addr())}, BreakerConfig{
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
		_, err := b.Sync(ctx, "r", Sync{Cell: c})
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
			if got, want := b.Opens(CallRead), int64(len(slices.DeleteFunc(slices.Clone(states), func(s gobreaker.State) bool { return s != gobreaker.StateOpen }))); got != want || got == 0 {
				t.Fatalf("Opens(read) = %d, the breaker opened %d times", got, want)
			}
			if got := b.Opens(CallApply); got != 0 {
				t.Fatalf("Opens(apply) = %d, want 0: no apply failed", got)
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
	if _, err := r.Sync(ctx, "a", Sync{Cell: used, Seq: 1, Used: 1, Claim: 1, Limit: 10, ExpireAt: reported}); err != nil {
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

// The cost of a settle call per cell, 512 cells a call: a report (what the
// settle loop sends most), and a report with a lease renewal.
func BenchmarkRedisSettle(b *testing.B) {
	r, err := NewRedis(RedisConfig{URL: redistest.SharedURL(b), KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	for _, renew := range []bool{false, true} {
		name := "report"
		if renew {
			name = "renew"
		}
		b.Run(name, func(b *testing.B) {
			const n = 512
			ss := make([]Sync, n)
			for i := range ss {
				ss[i] = Sync{Cell: cellAt(fmt.Sprint("bench-", name, i), 1), Limit: window.MaxLimit, LiveFor: 1000,
					ExpireAt: farFuture(), ReportOnly: !renew}
				if renew {
					ss[i].Want = 10
				}
			}
			ctx := context.Background()
			seq := int64(0)
			for b.Loop() {
				seq++
				for i := range ss {
					ss[i].Seq, ss[i].Used, ss[i].Claim = seq, seq*5, seq*5+10
				}
				if _, err := r.Settle(ctx, "a", ss); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/cell")
		})
	}
}

// A call refused for an invalid local count did not reach the origin: it
// opens no breaker.
func TestBreakerIgnoresInvalidLocalCounts(t *testing.T) {
	b := NewBreaker(newRedis(t, redistest.SharedURL(t)), BreakerConfig{Failures: 1})
	ctx := testCtx(t)
	c := cellAt("breaker-local", 1)
	for range 3 {
		if _, err := b.Sync(ctx, "a", Sync{Cell: c, Seq: 1, Limit: 10, LocalID: "a b", Local: 1, ExpireAt: farFuture()}); !errors.Is(err, ErrInvalidLocal) {
			t.Fatalf("sync with an invalid LocalID: %v", err)
		}
		if err := b.Import(ctx, []Imported{{Cell: c, Locals: []LocalCount{{ID: "x:y", Count: 1}}, ExpireAt: farFuture()}}); !errors.Is(err, ErrInvalidLocal) {
			t.Fatalf("import with an invalid local ID: %v", err)
		}
	}
	if b.State(CallRead) != gobreaker.StateClosed || b.State(CallApply) != gobreaker.StateClosed {
		t.Fatalf("breakers %v and %v after refused calls, want both closed", b.State(CallRead), b.State(CallApply))
	}
}

// A cold check's trip to Redis: concurrent syncs of one request each, every
// one on a cell nobody touched (Envoy's limit per client address), against
// the counter upstream ratelimit keeps (INCRBY and PEXPIRE in one
// pipeline) under the same concurrency. redis-µs/call is Redis's own CPU
// (INFO cpu) per call, the figure the cold path is held to.
func BenchmarkRedisCold(b *testing.B) {
	r, err := NewRedis(RedisConfig{URL: redistest.SharedURL(b), KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	client := r.Client()
	for _, inFlight := range []int{16, 64, 256} {
		for _, kind := range []string{"counter", "sync"} {
			b.Run(fmt.Sprintf("%s/%d", kind, inFlight), func(b *testing.B) {
				var next atomic.Int64
				run := fmt.Sprint(time.Now().UnixNano())
				cpu0 := redisServerCPU(b, client)
				b.SetParallelism(max(1, inFlight/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := fmt.Sprint(run, "-", next.Add(1))
						if kind == "counter" {
							pipe := client.Pipeline()
							key := r.Key(cellAt(id, 1))
							pipe.IncrBy(ctx, key, 1)
							pipe.PExpire(ctx, key, 2*time.Second)
							if _, err := pipe.Exec(ctx); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						c := window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 1000, Sequence: 1}
						res, err := r.Sync(ctx, "a", Sync{Cell: c, Seq: 1, Limit: 1000, LiveFor: 1100,
							ExpireAt: time.Now().Add(2 * time.Second).UnixMilli(), Requests: []Request{{Cost: 1}}})
						if err != nil || res.Outcomes[0] != Granted {
							b.Errorf("cold sync: %+v, %v", res, err)
							return
						}
					}
				})
				cpu := redisServerCPU(b, client) - cpu0
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "redis-µs/call")
			})
		}
	}
}

// redisServerCPU returns the Redis server's CPU time (redistest.ServerCPU).
func redisServerCPU(b *testing.B, c redis.UniversalClient) time.Duration {
	b.Helper()
	d, err := redistest.ServerCPU(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
