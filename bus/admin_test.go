package bus_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/policy"
)

// ListOverrides follows the limiter's pages to the end: all 10,000
// overrides of a workspace at its bound, with ~400-byte patterns (far more
// than one NATS message holds), in order, in both encodings.
func TestListOverridesReturnsAllTenThousand(t *testing.T) {
	url := startNATS(t)
	l := startLimiter(t, url)
	entries := make([]policy.Entry, policy.MaxOverridesPerWorkspace)
	for i := range entries {
		// Straight into the limiter's table: the endpoint's own path has
		// its tests in package transport.
		entries[i] = policy.Entry{Key: policy.Key{Workspace: "acme", Namespace: []string{"api", "web"}[i%2],
			Pattern: fmt.Sprintf("%05d-", (i*7919)%policy.MaxOverridesPerWorkspace) + strings.Repeat("x\"", 197)},
			Override: policy.Override{Limit: int64(i), Duration: 60_000},
			Version:  policy.Version{At: time.Now().UnixMilli(), Origin: "local"}}
	}
	if _, err := l.svc.Policies().Merge(entries...); err != nil {
		t.Fatal(err)
	}
	nc := connect(t, url)
	for _, enc := range []bus.Encoding{bus.Msgpack, bus.JSON} {
		list, err := bus.NewClient(nc, bus.WithEncoding(enc)).ListOverrides(t.Context(), "acme", "")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != len(entries) {
			t.Fatalf("enc %v: %d overrides, want %d", enc, len(list), len(entries))
		}
		for i, o := range list {
			ns := "api"
			if i >= len(entries)/2 {
				ns = "web"
			}
			if o.Namespace != ns || i > 0 && o.Namespace == list[i-1].Namespace && o.Identifier <= list[i-1].Identifier {
				t.Fatalf("enc %v: override %d is %s/%.8s after %s/%.8s", enc, i, o.Namespace, o.Identifier, list[max(i, 1)-1].Namespace, list[max(i, 1)-1].Identifier)
			}
		}
	}
}

// ListOverridesPage returns at most limit overrides and the cursor of the
// rest; GetOverride returns one pattern as stored, and a 400 for a
// pattern without an override.
func TestListOverridesPageAndGetOverride(t *testing.T) {
	url := startNATS(t)
	startLimiter(t, url)
	c := bus.NewClient(connect(t, url))
	want := []bus.Override{
		{Namespace: "api", Identifier: "a", Limit: 1, Duration: 1000},
		{Namespace: "api", Identifier: "b*", Limit: 2, Duration: 2000, Shadow: true},
		{Namespace: "web", Identifier: "c", Limit: 3, Duration: 3000},
	}
	for _, o := range want {
		if _, err := c.SetOverride(t.Context(), "acme", o); err != nil {
			t.Fatal(err)
		}
	}
	var got []bus.Override
	cursor := ""
	for range want {
		page, next, err := c.ListOverridesPage(t.Context(), "acme", "", cursor, 1)
		if err != nil || len(page) != 1 {
			t.Fatalf("page after %q: %+v, %v", cursor, page, err)
		}
		got = append(got, page...)
		cursor = next
	}
	if cursor != "" || len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("pages of 1: %+v, last next %q", got, cursor)
	}
	if page, next, err := c.ListOverridesPage(t.Context(), "acme", "api", "", 0); err != nil || len(page) != 2 || next != "" {
		t.Fatalf("namespace api, default limit: %+v, next %q, %v", page, next, err)
	}
	if o, err := c.GetOverride(t.Context(), "acme", "api", "b*"); err != nil || o != want[1] {
		t.Fatalf("get b*: %+v, %v", o, err)
	}
	_, err := c.GetOverride(t.Context(), "acme", "api", "bob")
	var se *bus.ServiceError
	if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, "no such override") {
		t.Fatalf("get bob (only matched by b*): %v, want a 400 saying no such override", err)
	}
	if _, err := c.GetOverride(t.Context(), "bad.ws", "api", "a"); err == nil {
		t.Fatal("get in an invalid workspace: no error")
	}
}
