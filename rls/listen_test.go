package rls

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/service"
)

// The reloader swaps in a changed, valid configuration; it refuses an
// invalid or unreadable one once per distinct content, with a log line and
// a metric, and keeps the previous one.
func TestReloaderKeepsTheLastGoodConfiguration(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	write := func(text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: one\n")
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	srv, err := NewServer(ServerConfig{Service: svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	r := &Reloader{Path: dir, Server: srv, Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := r.Load(); err != nil {
		t.Fatal(err)
	}
	domains := func() string { return strings.Join(srv.Config().Domains(), ",") }
	if domains() != "one" {
		t.Fatalf("domains %s", domains())
	}
	r.check() // unchanged: nothing happens
	write("domain: two\n")
	r.check()
	if domains() != "two" || !strings.Contains(logs.String(), "rls configuration reloaded") {
		t.Fatalf("after a valid change: %s\n%s", domains(), logs.String())
	}
	write("domain: [three]\n")
	r.check()
	r.check() // the same bad content: refused once
	if domains() != "two" || strings.Count(logs.String(), "rls configuration refused") != 1 ||
		!strings.Contains(logs.String(), "domain must be a string") {
		t.Fatalf("after an invalid change: %s\n%s", domains(), logs.String())
	}
	if v := testutil.ToFloat64(m.loads.WithLabelValues("error")); v != 1 {
		t.Errorf("config_loads_total{result=error} %v", v)
	}
	if v := testutil.ToFloat64(m.loaded); v != 0 {
		t.Errorf("config_last_load_success %v", v)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	r.check()
	if domains() != "two" || !strings.Contains(logs.String(), "rls configuration unreadable") {
		t.Fatalf("after the directory went away: %s\n%s", domains(), logs.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("domain: four\n")
	r.check()
	if domains() != "four" || testutil.ToFloat64(m.loaded) != 1 || testutil.ToFloat64(m.loads.WithLabelValues("success")) != 3 {
		t.Fatalf("back: %s, metrics %v %v", domains(), testutil.ToFloat64(m.loaded), testutil.ToFloat64(m.loads.WithLabelValues("success")))
	}
}

func TestTLSFilesAreChecked(t *testing.T) {
	if (TLSFiles{}).Enabled() {
		t.Error("no files, enabled")
	}
	for _, f := range []TLSFiles{{Cert: "c"}, {Key: "k"}, {ClientCA: "ca"}} {
		if _, err := f.Config(); err == nil || !strings.Contains(err.Error(), "both a certificate and a key") {
			t.Errorf("%+v: %v", f, err)
		}
	}
	if _, err := (TLSFiles{Cert: "missing.pem", Key: "missing-key.pem"}).Config(); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("missing files: %v", err)
	}
}
