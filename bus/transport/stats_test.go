package transport

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// $SRV.STATS reports, under each endpoint, that endpoint's own answers in
// snake_case keys: checks under check, batches under batch, nothing twice.
func TestMicroStatsArePerEndpointInSnakeCase(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	client := natstest.Connect(t, srv)
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	l, err := Serve(nc, LimiterConfig{Service: svc, Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := bus.NewClient(client)
	ctx := context.Background()
	// Checks: one admitted, one denied, one refused as a bad request.
	for range 2 {
		if _, err := c.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: "a", Limit: 1, Duration: 60_000, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := client.Request("ratelimit.check.acme.api", []byte(`{"identifier":"a"}`), time.Second); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "400" {
		t.Fatalf("bad check: %v, header %v", err, m)
	}
	// Batches: two admitted, one denied.
	for range 3 {
		if _, err := c.Batch(ctx, "acme", []bus.BatchCheck{{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "b", Limit: 2, Duration: 60_000, Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
	}

	// A checks message: one admitted, one bad check.
	if m, err := client.Request("ratelimit.checks.acme", []byte(`{"checks":[{"namespace":"api","identifier":"c","limit":1,"duration":60000},{"namespace":"api"}]}`), time.Second); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("checks message: %v, %v", err, m)
	}

	m, err := client.Request("$SRV.STATS."+ServiceName+"."+l.Info().ID, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st micro.Stats
	if err := json.Unmarshal(m.Data, &st); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]float64{
		"check":  {"admitted": 1, "denied": 1, "bad_requests": 1, "internal_errors": 0, "unavailable": 0, "waited": 0, "not_waited": 0},
		"batch":  {"admitted": 2, "denied": 1, "bad_requests": 0, "internal_errors": 0, "unavailable": 0, "waited": 3, "not_waited": 0},
		"checks": {"admitted": 1, "denied": 0, "bad_requests": 1, "internal_errors": 0, "unavailable": 0, "waited": 0, "not_waited": 0},
	}
	if len(st.Endpoints) != len(want) {
		t.Fatalf("%d endpoints in the stats, want %d", len(st.Endpoints), len(want))
	}
	for _, e := range st.Endpoints {
		var got map[string]float64
		if err := json.Unmarshal(e.Data, &got); err != nil {
			t.Fatalf("endpoint %s data %s: %v", e.Name, e.Data, err)
		}
		if !maps.Equal(got, want[e.Name]) {
			t.Errorf("endpoint %s data = %s, want the keys %v with %v", e.Name, e.Data, slices.Sorted(maps.Keys(want[e.Name])), want[e.Name])
		}
	}
}
