package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartServer(t *testing.T) {
	t.Parallel()
	addr := StartServer(t)
	c := adminClient(addr, adminTimeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	// Nothing is persisted.
	cfg, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatalf("CONFIG GET save: %v", err)
	}
	if cfg["save"] != "" {
		t.Errorf("save = %q, want \"\"", cfg["save"])
	}
}

func TestStartServerTwice(t *testing.T) {
	t.Parallel()
	a, b := StartServer(t), StartServer(t)
	if a == b {
		t.Fatalf("two servers on %s", a)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	addrs := StartCluster(t, 3)
	if len(addrs) != 3 {
		t.Fatalf("StartCluster returned %d addresses, want 3", len(addrs))
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// 100 keys, over slots served by every node.
	const n = 100
	owners := make(map[string]int)
	for i := range n {
		key := fmt.Sprintf("key:%d", i)
		if err := c.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		owners[addrs[int(slot)*len(addrs)/clusterSlots]]++
	}
	for i := range n {
		key := fmt.Sprintf("key:%d", i)
		got, err := c.Get(ctx, key).Int()
		if err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
		}
	}
	if len(owners) != len(addrs) {
		t.Errorf("keys landed on %d nodes, want %d: %v", len(owners), len(addrs), owners)
	}
	// Each node holds the keys of its own slots.
	for _, addr := range addrs {
		node := adminClient(addr, adminTimeout)
		size, err := node.DBSize(ctx).Result()
		node.Close()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", addr, err)
		}
		if int(size) != owners[addr] {
			t.Errorf("node %s holds %d keys, want %d", addr, size, owners[addr])
		}
	}

	// Keys with one hash tag share a slot.
	var slots []int64
	for _, key := range []string{"{x}", "{x}a", "{x}:b", "c{x}"} {
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		slots = append(slots, slot)
	}
	for _, s := range slots[1:] {
		if s != slots[0] {
			t.Fatalf("slots of keys tagged {x}: %v, want all equal", slots)
		}
	}
	// A multi-key command on one tag works.
	if err := c.MSet(ctx, "{x}1", "a", "{x}2", "b").Err(); err != nil {
		t.Fatalf("MSET on one hash tag: %v", err)
	}
}

func TestStartClusterTooSmall(t *testing.T) {
	t.Parallel()
	msg, failed := runFailing(t, func(tb testing.TB) { StartCluster(tb, 2) })
	if !failed || !strings.Contains(msg, "at least 3") {
		t.Fatalf("StartCluster(2): failed %v with %q", failed, msg)
	}
}

func TestSharedURL(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(SharedURL(t))
	if err != nil {
		t.Fatalf("ParseURL: %v", err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := Prefix(t) + ":k"
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	defer c.Del(context.Background(), key)
	if got, err := c.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("GET %s = %q, %v; want \"v\"", key, got, err)
	}
}

func TestSharedURLDown(t *testing.T) {
	// Port 1 on loopback refuses connections.
	t.Setenv(SharedURLEnv, "redis://:secret@127.0.0.1:1")
	start := time.Now()
	msg, failed := runFailing(t, func(tb testing.TB) { SharedURL(tb) })
	if !failed {
		t.Fatal("SharedURL did not fail")
	}
	if !strings.Contains(msg, "make services") {
		t.Errorf("message %q does not mention make services", msg)
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("message %q shows the password", msg)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("SharedURL took %v to fail", d)
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		prefixes []string
	)
	for _, name := range []string{"a", "a", "with {braces} and: colons"} {
		t.Run(name, func(t *testing.T) {
			p := Prefix(t)
			if strings.ContainsAny(p, "{}") {
				t.Errorf("Prefix = %q, has braces", p)
			}
			if !strings.HasPrefix(p, "sluicetest:") {
				t.Errorf("Prefix = %q, want it to start with sluicetest:", p)
			}
			if strings.Count(p, ":") != 2 {
				t.Errorf("Prefix = %q, want exactly two colons", p)
			}
			mu.Lock()
			prefixes = append(prefixes, p)
			mu.Unlock()
		})
	}
	seen := make(map[string]bool)
	for _, p := range prefixes {
		if seen[p] {
			t.Errorf("Prefix %q returned twice", p)
		}
		seen[p] = true
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"TestX/sub_1", "TestX/sub_1"},
		{"a{b}c d:e", "a_b_c_d_e"},
		{"é", "__"},
		{strings.Repeat("x", 100), strings.Repeat("x", 64)},
	} {
		if got := sanitize(tc.in, 64); got != tc.want {
			t.Errorf("sanitize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// failTB is a testing.TB whose failures are recorded rather than reported.
// Its Fatal methods end the calling goroutine, as testing's do.
type failTB struct {
	testing.TB
	mu     sync.Mutex
	msg    string
	failed bool
}

func (f *failTB) fail(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failed {
		f.msg, f.failed = msg, true
	}
}

func (f *failTB) Fatal(args ...any) {
	f.fail(fmt.Sprint(args...))
	runtime.Goexit()
}

func (f *failTB) Fatalf(format string, args ...any) {
	f.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (f *failTB) Errorf(format string, args ...any) { f.fail(fmt.Sprintf(format, args...)) }

// runFailing runs fn with a testing.TB that records the first failure, and
// returns its message and whether there was one.
func runFailing(t *testing.T, fn func(testing.TB)) (msg string, failed bool) {
	t.Helper()
	f := &failTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg, f.failed
}

func TestPortTaken(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	s, err := launch(t.TempDir(), port, false)
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	defer s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	start := time.Now()
	err = s.waitReady(ctx)
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("waitReady on a taken port: %v, want errPortTaken", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("waitReady took %v to notice: %v", d, err)
	}
}

// ServerCPU reads the server's CPU time: positive, and not lower after the
// server did work.
func TestServerCPU(t *testing.T) {
	opt, err := redis.ParseURL(SharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	before, err := ServerCPU(ctx, c)
	if err != nil || before <= 0 {
		t.Fatalf("ServerCPU: %v, %v; want a positive duration", before, err)
	}
	for range 1000 {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if after, err := ServerCPU(ctx, c); err != nil || after < before {
		t.Fatalf("ServerCPU after 1000 pings: %v, %v; want at least %v", after, err, before)
	}
}
