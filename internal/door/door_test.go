package door_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

func TestServiceFailure(t *testing.T) {
	bad := service.Query{Workspace: "acme", Namespace: "api", Identifier: "u", Limit: -1, Duration: 60_000, Cost: 1}
	invalid := bad.Validate()
	for _, tc := range []struct {
		err  error
		want door.Failure
	}{
		{invalid, door.Failure{Code: 400, Msg: strings.TrimPrefix(invalid.Error(), "invalid query: ")}},
		{fmt.Errorf("check: %w", service.ErrClosed), door.Failure{Code: 503, Msg: door.ShuttingDown}},
		{errors.New("disk on fire"), door.Failure{Code: 500, Msg: "internal error"}},
	} {
		if got := door.ServiceFailure(tc.err); got != tc.want {
			t.Errorf("ServiceFailure(%v) = %+v, want %+v", tc.err, got, tc.want)
		}
	}
	if got := door.ServiceFailure(invalid).Msg; got != "limit must be between 0 and 1000000000000000, got -1" {
		t.Errorf("a 400 says %q", got)
	}
}

// heldOrigin holds the request path's calls (syncs) until
// release is closed.
type heldOrigin struct {
	*regiontest.Memory
	release chan struct{}
}

func (o *heldOrigin) hold(ctx context.Context) error {
	select {
	case <-o.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *heldOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if !s.ReportOnly {
		if err := o.hold(ctx); err != nil {
			return region.SyncResult{}, err
		}
	}
	return o.Memory.Sync(ctx, reporter, s)
}

// A check that must wait holds one of its tenant's places while it waits;
// a tenant alone takes at most three quarters of the places, so another
// tenant still finds one; with every place taken a check or batch is
// decided locally at once. Local state decides without a place.
func TestGateWaitsWithinTheTenantsShare(t *testing.T) {
	o := &heldOrigin{Memory: regiontest.NewMemory(nil), release: make(chan struct{})}
	svc := service.New(service.Config{Origin: o, ReadTimeout: 10 * time.Second})
	defer svc.Close(context.Background())
	g := door.NewGate(svc, nil, 4)
	ctx := func() context.Context { return context.Background() }
	q := func(ws, id string) service.Query {
		return service.Query{Workspace: ws, Namespace: "api", Identifier: id, Limit: 10, Duration: 60_000, Cost: 1}
	}

	var wg sync.WaitGroup
	ways := make(chan door.Way, 4)
	for i := range 3 {
		wg.Go(func() {
			_, way, err := g.Check(ctx, "acme", q("acme", fmt.Sprint("cold-", i)))
			if err != nil {
				t.Error(err)
			}
			ways <- way
		})
	}
	taken := func(n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); g.Len() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				close(o.release)
				t.Fatalf("%d places taken after 10s, want %d: %s", g.Len(), n, what)
			}
		}
	}
	taken(3, "three of acme's checks wait")
	wg.Go(func() {
		_, _, way, err := g.Batch(ctx, "globex", []service.Query{q("globex", "cold")})
		if err != nil {
			t.Error(err)
		}
		ways <- way
	})
	taken(4, "globex's batch waits beside acme's three checks")
	if d, way, err := g.Check(ctx, "acme", q("acme", "cold-3")); err != nil || way != door.NotWaited || !d.Admitted {
		t.Fatalf("acme past its share: %+v %v %v, want admitted locally, not waited", d, way, err)
	}
	if ok, _, way, err := g.Batch(ctx, "acme", []service.Query{q("acme", "cold-4")}); err != nil || way != door.NotWaited || !ok {
		t.Fatalf("acme's batch past its share: %v %v %v, want admitted locally, not waited", ok, way, err)
	}
	close(o.release)
	wg.Wait()
	close(ways)
	for way := range ways {
		if way != door.Waited {
			t.Errorf("a check that waited on the origin passed %v, want Waited", way)
		}
	}
	if n := g.Len(); n != 0 {
		t.Errorf("%d places still taken once every check was decided", n)
	}

	local := door.NewGate(service.New(service.Config{}), nil, 0)
	if d, way, err := local.Check(ctx, "acme", q("acme", "u")); err != nil || way != door.Decided || !d.Admitted || local.Len() != 0 {
		t.Fatalf("a local-only service: %+v %v %v (%d places), want decided at once without a place", d, way, err, local.Len())
	}
}
