package test

import (
	"debug/elf"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// `make build` links static binaries with the version it is given, which
// --version prints and each micro service reports (as a semantic version).
func TestMakeBuildStampsTheVersionAndLinksStatically(t *testing.T) {
	bin := t.TempDir()
	const version = "v1.2.3-test.1"
	out, err := exec.Command("make", "-C", "..", "build", "VERSION="+version, "BIN="+bin).CombinedOutput()
	if err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, name := range []string{"limiter", "bridge"} {
		path := filepath.Join(bin, name)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a program interpreter: not static", name)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s links shared libraries %v", name, libs)
		}
		f.Close()
		got, err := exec.Command(path, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", name, err)
		}
		if want := name + " " + version + "\n"; string(got) != want {
			t.Errorf("%s --version printed %q, want %q", name, got, want)
		}
	}

	srv := startServer(t)
	nc := connect(t, srv.ClientURL())
	for _, p := range []struct{ name, service string }{{"limiter", "ratelimit"}, {"bridge", "ratelimit-bridge"}} {
		cmd := exec.Command(filepath.Join(bin, p.name), "--nats-url", srv.ClientURL(), "--region", "us")
		cmd.Stdout, cmd.Stderr = testWriter{t, p.name}, testWriter{t, p.name}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		waitService(t, nc, p.service, 1)
		msg, err := nc.Request("$SRV.INFO."+p.service, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("$SRV.INFO.%s: %v", p.service, err)
		}
		var info micro.Info
		if err := json.Unmarshal(msg.Data, &info); err != nil {
			t.Fatal(err)
		}
		if want := strings.TrimPrefix(version, "v"); info.Version != want {
			t.Errorf("%s reports version %q in $SRV.INFO, want %q", p.service, info.Version, want)
		}
	}
}
