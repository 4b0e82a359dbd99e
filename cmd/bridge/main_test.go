package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/mysqltest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/window"
)

func TestMigrateAppliesTheSchemaAndIsIdempotent(t *testing.T) {
	dsn := mysqltest.Database(t)
	for _, want := range []string{"applied migrations 001_components_denials.sql, 002_denial_usage.sql, 003_components_changed.sql, 004_denials_changed.sql, 005_overrides.sql, 006_reset_marks.sql, 007_components_epoch.sql, 008_denials_epoch.sql, 009_overrides_tombstones.sql, 010_drop_denials.sql", "schema is up to date"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"migrate", "--mysql-dsn", dsn}, &out, &errb); code != 0 {
			t.Fatalf("migrate: exit %d: %s", code, errb.String())
		}
		if got := strings.TrimSpace(out.String()); got != want {
			t.Fatalf("migrate said %q, want %q", got, want)
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, table := range []string{"sluice_components", "sluice_overrides", "sluice_reset_marks"} {
		if _, err := db.Exec("SELECT 1 FROM " + table + " LIMIT 1"); err != nil {
			t.Fatalf("table %s after migrate: %v", table, err)
		}
	}
}

func TestMigrateNeedsADSN(t *testing.T) {
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"migrate"}, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), "--mysql-dsn is required") {
		t.Fatalf("migrate without a DSN: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"migrate", "--mysql-dsn", "root@tcp(127.0.0.1:1)/nope?timeout=1s"}, io.Discard, &errb); code != 1 {
		t.Fatalf("migrate against nothing: exit %d, %q", code, errb.String())
	}
}

func TestServeRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-level", "loud"}, {"--subject-prefix", "a b"}, {"--region", "a.b", "--nats-url", "nats://127.0.0.1:1"}} {
		var errb bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errb); code == 0 {
			t.Fatalf("%v: exit 0, want an error", args)
		}
	}
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"--regions", "us,ap south"}, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), `"ap south"`) {
		t.Fatalf("--regions us,ap south: exit %d, %q; want 2 and the bad name", code, errb.String())
	}
	// A --redis-url that does not parse stops the bridge at once, naming the
	// flag and hiding the password, before it connects to anything.
	for _, url := range []string{"bogus://127.0.0.1:6379", "redis://:" + redisPassword + "@127.0.0.1:notaport", "redis://127.0.0.1:1/?x={"} {
		errb.Reset()
		code := run(context.Background(), []string{"--redis-url", url, "--nats-url", "nats://127.0.0.1:1"}, io.Discard, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--redis-url") || strings.Contains(errb.String(), redisPassword) {
			t.Fatalf("--redis-url %s: exit %d, %q; want 2, the flag named and no password", url, code, errb.String())
		}
	}
	errb.Reset()
	if code := run(context.Background(), []string{"--redis-url", "redis://127.0.0.1:1", "--redis-prefix", "a{b", "--nats-url", "nats://127.0.0.1:1"}, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), "braces") {
		t.Fatalf("--redis-prefix a{b: exit %d, %q; want 2 and why", code, errb.String())
	}
}

func TestBridgeMetricsMove(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--region", "us", "--regions", "us, eu", "--metrics-addr", "127.0.0.1:0"}, pw, io.Discard)
	}()
	defer func() { cancel(); <-done; pr.Close() }()
	lines := bufio.NewScanner(pr)
	var base string
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "metrics on "); ok {
			base = strings.TrimSuffix(strings.Fields(u)[0], "/metrics")
			break
		}
	}
	go io.Copy(io.Discard, pr)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "u", Duration: 60_000, Sequence: time.Now().UnixMilli() / 60_000}
	comps := []global.Component{{Cell: cell, Region: "us", Count: 5, ExpireAt: time.Now().Add(time.Hour).UnixMilli()}}
	if err := nc.Publish("ratelimit.gc.us", event.AppendComponents(nil, comps)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("ratelimit.gc.us", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		page := scrape(t, base+"/metrics")
		if strings.Contains(page, "sluice_bridge_components_in_total 1\n") && strings.Contains(page, "sluice_malformed_messages_total 1\n") &&
			strings.Contains(page, "sluice_store_writes_total 1\n") &&
			strings.Contains(page, `sluice_bridge_region_lag_seconds{peer_region="eu"} `) { // eu never sent: its lag counts from the start
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridge metrics did not move:\n%s", grepSluice(page))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, err := http.Get(base + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v", resp, err)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepSluice(page string) string {
	var out []string
	for line := range strings.SplitSeq(page, "\n") {
		if strings.HasPrefix(line, "sluice_") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
