package buildinfo

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/internal/natstest"
)

func TestVersionPrefersTheStampedVersion(t *testing.T) {
	if got := Version("v1.2.3"); got != "v1.2.3" {
		t.Fatalf("Version(v1.2.3) = %q", got)
	}
	// A test binary records no module version: nothing stamped gives Dev.
	if got := Version(""); got != Dev {
		t.Fatalf("Version(\"\") = %q, want %q", got, Dev)
	}
}

var semverCases = []struct{ in, want string }{
	{"dev", "0.0.0-dev"},
	{"", "0.0.0-dev"},
	{"v1.2.3", "1.2.3"},
	{"1.2.3", "1.2.3"},
	{"v1.2.3-rc.1+linux.amd64", "1.2.3-rc.1+linux.amd64"},
	{"v0.0.0-20261122175401-2633de2abcde", "0.0.0-20261122175401-2633de2abcde"},
	{"v0.0.0-20261122175401-2633de2abcde+dirty", "0.0.0-20261122175401-2633de2abcde+dirty"},
	{"v1.2.3-4-g2633de2-dirty", "1.2.3-4-g2633de2-dirty"},
	{"2633de2", "0.0.0-dev+2633de2"},
	{"0123456-dirty", "0.0.0-dev+0123456-dirty"},
	{"v1.2", "0.0.0-dev+v1.2"},
	{"release/2026 11..x_y", "0.0.0-dev+release-2026-11.x-y"},
	{"...", "0.0.0-dev"},
	{"v01.2.3", "0.0.0-dev+v01.2.3"},
}

func TestSemverMapsVersionsToSemanticVersions(t *testing.T) {
	for _, c := range semverCases {
		if got := Semver(c.in); got != c.want {
			t.Errorf("Semver(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestMicroAcceptsEverySemver registers a micro service with each mapped
// version on a real NATS server: micro refuses a version it cannot parse.
func TestMicroAcceptsEverySemver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := natstest.StartServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The raw inputs that are not semantic versions must be refused, or
	// this test would not show that the mapping matters.
	if _, err := micro.AddService(nc, micro.Config{Name: "raw", Version: "dev"}); err == nil {
		t.Fatal("micro accepted version \"dev\"; the mapping is not needed")
	}
	for _, c := range semverCases {
		svc, err := micro.AddService(nc, micro.Config{Name: "v", Version: Semver(c.in)})
		if err != nil {
			t.Errorf("micro refused Semver(%q) = %q: %v", c.in, Semver(c.in), err)
			continue
		}
		if got := svc.Info().Version; got != Semver(c.in) {
			t.Errorf("micro reports version %q, want %q", got, Semver(c.in))
		}
		_ = svc.Stop()
	}
}
