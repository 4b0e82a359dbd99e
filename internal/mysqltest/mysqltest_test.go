package mysqltest_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/internal/mysqltest"
)

// exists reports whether the server of dsn has database name.
func exists(t *testing.T, dsn, name string) bool {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestDatabaseIsFreshSelectedAndDroppedAtCleanup(t *testing.T) {
	var dsn, name string
	t.Run("use", func(t *testing.T) {
		dsn = mysqltest.Database(t)
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		name = cfg.DBName
		if !strings.HasPrefix(name, mysqltest.DatabasePrefix) || len(name) != len(mysqltest.DatabasePrefix)+16 {
			t.Fatalf("database name %q, want %s and 16 hex digits", name, mysqltest.DatabasePrefix)
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := t.Context()
		var selected string
		if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&selected); err != nil {
			t.Fatal(err)
		}
		if selected != name {
			t.Fatalf("DSN selects %q, want %q", selected, name)
		}
		var tables int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", name).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("fresh database has %d tables", tables)
		}
		if !exists(t, dsn, name) {
			t.Fatalf("database %s does not exist during the test", name)
		}
	})
	if exists(t, dsn, name) {
		t.Fatalf("database %s still exists after the test ended", name)
	}
}

func TestMissingDatabaseDoesNotExistAndIsDroppedOnceCreated(t *testing.T) {
	var dsn, name string
	t.Run("use", func(t *testing.T) {
		dsn = mysqltest.MissingDatabase(t)
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		name = cfg.DBName
		if !strings.HasPrefix(name, mysqltest.DatabasePrefix) || len(name) != len(mysqltest.DatabasePrefix)+16 {
			t.Fatalf("database name %q, want %s and 16 hex digits", name, mysqltest.DatabasePrefix)
		}
		if exists(t, dsn, name) {
			t.Fatalf("database %s exists already", name)
		}
		cfg.DBName = ""
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.ExecContext(t.Context(), "CREATE DATABASE `"+name+"`"); err != nil {
			t.Fatal(err)
		}
	})
	if exists(t, dsn, name) {
		t.Fatalf("database %s, created by the test, still exists after it ended", name)
	}
}

func TestDatabaseNamesDiffer(t *testing.T) {
	a, b := mysqltest.Database(t), mysqltest.Database(t)
	if a == b {
		t.Fatalf("two databases share the DSN %q", a)
	}
}

func TestDSNDefaultsToLocalServer(t *testing.T) {
	t.Setenv(mysqltest.DSNEnv, "")
	if got := mysqltest.DSN(t); got != mysqltest.DefaultDSN {
		t.Fatalf("DSN() = %q, want %q", got, mysqltest.DefaultDSN)
	}
}

// fatalTB records the first Fatalf and ends its goroutine, as testing does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestDSNFailsRatherThanSkipsWhenTheServerIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	t.Setenv(mysqltest.DSNEnv, "root@tcp("+addr+")/")

	fake := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		mysqltest.DSN(fake)
		t.Error("DSN returned for a server that is down")
	}()
	<-done
	if !strings.Contains(fake.msg, "run make services") {
		t.Fatalf("DSN failed with %q, want it to say run make services", fake.msg)
	}
}
