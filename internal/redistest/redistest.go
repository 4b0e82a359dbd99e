// Package redistest gives tests real Redis servers: standalone servers and
// Redis Clusters run as redis-server child processes of the test, and the
// shared Redis of the development environment.
//
// Each process listens on a random loopback port, keeps its data in memory
// only, and is stopped when the test that started it ends. A missing
// redis-server binary or an unreachable shared Redis fails the test rather
// than skipping it: the services are part of the test environment, and
// `make services` provides them.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sluicehq/sluice/internal/redact"
)

// SharedURLEnv names the environment variable that overrides the URL of the
// shared Redis.
const SharedURLEnv = "SLUICE_TEST_REDIS_URL"

// DefaultSharedURL is the shared Redis that `make services` provides.
const DefaultSharedURL = "redis://127.0.0.1:6379"

const (
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds how long StartCluster waits for the nodes to
	// agree, once they are all up.
	clusterTimeout = 20 * time.Second
	// sharedTimeout bounds how long SharedURL waits for a PONG.
	sharedTimeout = 2 * time.Second
	// adminTimeout bounds each administrative command.
	adminTimeout = 2 * time.Second
	// pollInterval is how often readiness is polled.
	pollInterval = 20 * time.Millisecond
)

// StartServer starts a standalone redis-server on a random free port of
// 127.0.0.1 and returns its "host:port" address once it answers PING. The
// server persists nothing (--save "" --appendonly no), works in a temporary
// directory of its own, and is stopped at t.Cleanup. It fails the test if
// redis-server is not in PATH or does not come up within 10s.
func StartServer(t testing.TB) (addr string) {
	t.Helper()
	return startServer(t, false).addr
}

// StartCluster starts a Redis Cluster of n master nodes, n >= 3, each a
// redis-server on a random free port P of 127.0.0.1 with its cluster bus on
// P+10000, and returns the node addresses in slot order: node i serves the
// i-th of n even ranges of the 16384 slots. It returns only once every node
// reports cluster_state:ok, sees all n nodes connected and all slots served,
// so a cluster client can be used at once. The nodes are stopped at
// t.Cleanup. It fails the test if n < 3, if redis-server is not in PATH, or
// if the cluster does not form within 20s of the nodes coming up.
func StartCluster(t testing.TB, n int) (addrs []string) {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: StartCluster(%d): a cluster needs at least 3 masters", n)
	}
	addrs = make([]string, n)
	for i := range addrs {
		addrs[i] = startServer(t, true).addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := formCluster(ctx, addrs); err != nil {
		t.Fatalf("redistest: form a cluster of %d nodes %v: %v", n, addrs, err)
	}
	return addrs
}

// SharedURL returns the URL of the shared Redis, the value of
// SLUICE_TEST_REDIS_URL or else DefaultSharedURL, once a server there has
// answered PING. It fails the test, pointing at `make services`, if the URL
// is malformed or nothing answers within 2s. Tests on the shared Redis must
// keep to keys under their own Prefix, and must not flush or reconfigure it.
func SharedURL(t testing.TB) string {
	t.Helper()
	raw := os.Getenv(SharedURLEnv)
	if raw == "" {
		raw = DefaultSharedURL
	}
	shown := redact.Conn(raw)
	opt, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("redistest: %s=%q: %v", SharedURLEnv, shown, redact.Error(err, raw))
	}
	opt.DialTimeout = 500 * time.Millisecond
	opt.ReadTimeout = 500 * time.Millisecond
	opt.WriteTimeout = 500 * time.Millisecond
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	opt.DisableIdentity = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClient(opt)
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	// Poll the port first: go-redis logs and backs off on dial errors.
	err = poll(ctx, func() error { return dialOnce(ctx, opt.Network, opt.Addr) })
	if err == nil {
		err = poll(ctx, func() error { return c.Ping(ctx).Err() })
	}
	if err != nil {
		t.Fatalf("redistest: no Redis answers PING at %s within %v (%v): run `make services`, or set %s",
			shown, sharedTimeout, err, SharedURLEnv)
	}
	return raw
}

// Prefix returns a key prefix unique to this call, of the form
// "sluicetest:<16 hex digits>:<test name>", where the test name has every
// character other than ASCII letters, digits and "_-./" replaced by '_' and
// is cut to 64 bytes. It has no '{' or '}', so a caller may use it inside or
// outside a hash tag. It does not end with ':'.
func Prefix(t testing.TB) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return "sluicetest:" + hex.EncodeToString(b[:]) + ":" + sanitize(t.Name(), 64)
}

// sanitize replaces in name every byte that is not an ASCII letter, digit or
// one of "_-./" by '_', and cuts the result to max bytes.
func sanitize(name string, max int) string {
	b := []byte(name)
	if len(b) > max {
		b = b[:max]
	}
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '_', c == '-', c == '.', c == '/':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// adminClient returns a client for administrative commands to one server,
// each bounded by timeout.
func adminClient(addr string, timeout time.Duration) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		DialTimeout:              timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		MaxRetries:               -1,
		DialerRetries:            1,
		PoolSize:                 2,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// poll calls f until it returns nil or ctx is done, and then returns the
// last error of f.
func poll(ctx context.Context, f func() error) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// formCluster makes the nodes at addrs, started in cluster mode and knowing
// no other node, one cluster with the slots in len(addrs) even ranges, and
// returns once every node sees the whole, healthy cluster.
func formCluster(ctx context.Context, addrs []string) error {
	n := len(addrs)
	clients := make([]*redis.Client, n)
	for i, addr := range addrs {
		clients[i] = adminClient(addr, adminTimeout)
		defer clients[i].Close()
	}

	for i, c := range clients {
		// Distinct config epochs spare the nodes resolving collisions,
		// as redis-cli --cluster create does.
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", addrs[i], err)
		}
		lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n-1
		if err := c.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, addrs[i], err)
		}
	}
	for _, addr := range addrs[1:] {
		host, port, err := splitAddr(addr)
		if err != nil {
			return err
		}
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s from %s: %w", addr, addrs[0], err)
		}
	}

	err := poll(ctx, func() error {
		for i, c := range clients {
			if err := checkNode(ctx, c, n); err != nil {
				return fmt.Errorf("node %s: %w", addrs[i], err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cluster not ready: %w", err)
	}
	return nil
}

// checkNode returns nil if the node c talks to reports cluster_state:ok with
// every slot served, and lists n nodes, each with an address, connected and
// not failing; and otherwise an error that says what is missing.
func checkNode(ctx context.Context, c *redis.Client, n int) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER INFO: %w", err)
	}
	fields := make(map[string]string)
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_known_nodes":    strconv.Itoa(n),
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
	}
	for k, v := range want {
		if fields[k] != v {
			return fmt.Errorf("CLUSTER INFO has %s:%s, want %s", k, fields[k], v)
		}
	}

	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER NODES: %w", err)
	}
	count := 0
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		count++
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv>
		// <config-epoch> <link-state> <slot> ...
		if len(f) < 8 {
			return fmt.Errorf("CLUSTER NODES line %q is short", line)
		}
		if strings.HasPrefix(f[1], ":") {
			return fmt.Errorf("node %s has no address yet", f[0])
		}
		for flag := range strings.SplitSeq(f[2], ",") {
			switch flag {
			case "handshake", "fail", "fail?", "noaddr":
				return fmt.Errorf("node %s (%s) is flagged %s", f[0], f[1], flag)
			}
		}
		if f[7] != "connected" {
			return fmt.Errorf("node %s (%s) is %s", f[0], f[1], f[7])
		}
	}
	if count != n {
		return fmt.Errorf("CLUSTER NODES lists %d nodes, want %d", count, n)
	}
	return nil
}

// ServerCPU returns the CPU time (user and system) the Redis server behind c
// has used, from INFO cpu: the difference of two readings is what the
// commands between them cost Redis, for benchmarks.
func ServerCPU(ctx context.Context, c redis.UniversalClient) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("redis INFO cpu %s: %w", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}
