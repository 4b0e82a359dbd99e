package main

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/internal/mysqltest"
)

func TestMigrateAppliesTheSchemaAndIsIdempotent(t *testing.T) {
	dsn := mysqltest.Database(t)
	for range 2 {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"migrate", "--mysql-dsn", dsn}, &out, &errb); code != 0 {
			t.Fatalf("migrate: exit %d: %s", code, errb.String())
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, table := range []string{"sluice_components", "sluice_denials"} {
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
}
