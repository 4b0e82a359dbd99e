package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/window"
)

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runningBridge is a bridge command run in process by a test.
type runningBridge struct {
	base   string // http://host:port of its probes
	stderr *syncBuffer
	nc     *nats.Conn // the test's own connection to the bridge's server
}

// startBridge runs "bridge serve" for region us on an embedded NATS server
// with the given DSN until the test ends, and waits until it says where its
// probes are.
func startBridge(t *testing.T, dsn string) *runningBridge {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	b := &runningBridge{stderr: &syncBuffer{}}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--region", "us", "--metrics-addr", "127.0.0.1:0",
			"--mysql-dsn", dsn, "--shutdown-timeout", "2s"}, pw, b.stderr)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("bridge did not stop within 15s")
		}
		pr.Close()
	})
	lines := bufio.NewScanner(pr)
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			b.base = strings.TrimSuffix(strings.Fields(u)[0], "/metrics")
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if b.base == "" {
		t.Fatalf("the bridge never said where its probes are; stderr:\n%s", b.stderr.String())
	}
	if b.nc, err = nats.Connect(srv.ClientURL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.nc.Close)
	return b
}

// readyz returns the status and body of the bridge's /readyz.
func (b *runningBridge) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get(b.base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// waitReadyz polls /readyz until it answers code with a body containing
// want, failing the test after d.
func (b *runningBridge) waitReadyz(t *testing.T, code int, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got, body := b.readyz(t)
		if got == code && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q after %s, want %d with %q; stderr:\n%s", got, body, d, code, want, b.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishComponent publishes one component of identifier id as a limiter of
// region us does.
func (b *runningBridge) publishComponent(t *testing.T, id string, count int64) {
	t.Helper()
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: id, Duration: 60_000, Sequence: time.Now().UnixMilli() / 60_000}
	comps := []global.Component{{Cell: cell, Region: "us", Count: count, ExpireAt: time.Now().Add(time.Hour).UnixMilli()}}
	if err := b.nc.Publish("ratelimit.gc.us", event.AppendComponents(nil, comps)); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// waitRow polls the database of dsn until it holds the component of id with
// count, failing the test after d.
func waitRow(t *testing.T, dsn, id string, count int64, d time.Duration) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(d)
	for {
		var got int64
		err := db.QueryRowContext(t.Context(), "SELECT `count` FROM sluice_components WHERE identifier = ? AND region = 'us'", []byte(id)).Scan(&got)
		if err == nil && got == count {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("component %s in MySQL: count %d, %v after %s; want %d", id, got, err, d, count)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBridgeStartsWhileMySQLRefusesAndWritesWhenItAnswers starts the bridge
// with MySQL behind a proxy that refuses every connection: the bridge
// serves, forwards over NATS and says on /readyz that MySQL is missing;
// once the proxy passes, the component it queued reaches MySQL and the
// bridge is ready.
func TestBridgeStartsWhileMySQLRefusesAndWritesWhenItAnswers(t *testing.T) {
	dsn := mysqltest.Database(t)
	proxy, cfg := mysqltest.BehindProxy(t, dsn)
	proxy.SetMode(tcpproxy.Refuse)

	b := startBridge(t, cfg.FormatDSN())
	if _, err := b.nc.Request("$SRV.PING."+link.BridgeService, nil, 5*time.Second); err != nil {
		t.Fatalf("the bridge does not answer $SRV.PING.%s while MySQL refuses: %v", link.BridgeService, err)
	}
	b.waitReadyz(t, http.StatusServiceUnavailable, "not ready: mysql: not reachable at "+proxy.Addr()+": ", 10*time.Second)

	forwarded, err := b.nc.SubscribeSync("ratelimit.global.gc.us")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b.publishComponent(t, "while-down", 7)
	for { // heartbeats (empty) may come first
		m, err := forwarded.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("the bridge did not forward the component over NATS while MySQL refuses: %v", err)
		}
		if cs, err := event.DecodeComponents(m.Data); err == nil && len(cs) > 0 {
			break
		}
	}
	if code, body := b.readyz(t); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d %q while MySQL still refuses, want 503", code, body)
	}

	proxy.SetMode(tcpproxy.Pass)
	// The store retries after 1s, 2s, 4s...: within a few seconds.
	waitRow(t, dsn, "while-down", 7, 20*time.Second)
	b.waitReadyz(t, http.StatusOK, "ready", 5*time.Second)
	if n := strings.Count(b.stderr.String(), `msg="global store not reachable; writes are queued and retried"`); n != 1 {
		t.Fatalf("%d lines say MySQL is not reachable, want 1; stderr:\n%s", n, b.stderr.String())
	}
}

// TestBridgeWaitsForItsDatabaseAndMigrateCreatesIt starts the bridge on a
// database that does not exist: it runs, says how to create it, and writes
// once "bridge migrate" has.
func TestBridgeWaitsForItsDatabaseAndMigrateCreatesIt(t *testing.T) {
	dsn := mysqltest.MissingDatabase(t)
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.DBName

	b := startBridge(t, dsn)
	b.waitReadyz(t, http.StatusServiceUnavailable,
		`not ready: mysql: database "`+name+`" does not exist at `+cfg.Addr+`: run "bridge migrate --mysql-dsn `+redact.Conn(dsn)+`" to create it`,
		10*time.Second)
	wantLog := `database \"` + name + `\" does not exist: run \"bridge migrate --mysql-dsn `
	if n := strings.Count(b.stderr.String(), wantLog); n != 1 {
		t.Fatalf("%d log lines say how to create the database, want 1; stderr:\n%s", n, b.stderr.String())
	}
	b.publishComponent(t, "before-migrate", 3)

	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "--mysql-dsn", dsn}, &out, &errb); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, errb.String())
	}
	if got, want := strings.TrimSpace(out.String()), "created database "+name+"; applied migrations 001_components_denials.sql, 002_denial_usage.sql, 003_components_changed.sql, 004_denials_changed.sql, 005_overrides.sql, 006_reset_marks.sql, 007_components_epoch.sql, 008_denials_epoch.sql, 009_overrides_tombstones.sql, 010_drop_denials.sql"; got != want {
		t.Fatalf("migrate said %q, want %q", got, want)
	}
	waitRow(t, dsn, "before-migrate", 3, 20*time.Second)
	b.waitReadyz(t, http.StatusOK, "ready", 5*time.Second)
	b.publishComponent(t, "after-migrate", 4)
	waitRow(t, dsn, "after-migrate", 4, 10*time.Second)
	if n := strings.Count(b.stderr.String(), wantLog); n != 1 {
		t.Fatalf("%d log lines say how to create the database, want 1 however often the bridge retried; stderr:\n%s", n, b.stderr.String())
	}
}

func TestServeRefusesABadDSNWithItsForm(t *testing.T) {
	var errb bytes.Buffer
	code := run(context.Background(), []string{"--mysql-dsn", "root:s3cret@tcp(127.0.0.1:3306", "--nats-url", "nats://127.0.0.1:1"}, io.Discard, &errb)
	msg := errb.String()
	if code != 2 || !strings.Contains(msg, "user:password@tcp(host:port)/database") || strings.Contains(msg, "s3cret") {
		t.Fatalf("bad DSN: exit %d, stderr %q; want 2 and the DSN's form, without the password", code, msg)
	}
	errb.Reset()
	code = run(context.Background(), []string{"migrate", "--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}, io.Discard, &errb)
	if code != 2 || !strings.Contains(errb.String(), "names no database") {
		t.Fatalf("migrate with no database in the DSN: exit %d, stderr %q; want 2 saying it names no database", code, errb.String())
	}
}
