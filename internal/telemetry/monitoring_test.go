package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/service"
)

// The files monitoring/ ships, relative to this package.
const (
	alertsFile    = "../../monitoring/alerts.yml"
	dashboardFile = "../../monitoring/dashboard.json"
)

// recorder is a Registerer that also records the name of every metric its
// collectors describe; a histogram's series names (_bucket, _sum, _count)
// count as well.
type recorder struct {
	prometheus.Registerer
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	_, histogram := c.(prometheus.Histogram)
	if _, ok := c.(*prometheus.HistogramVec); ok {
		histogram = true
	}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("no name in %s", d)
		}
		r.names[m[1]] = true
		if histogram {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				r.names[m[1]+suffix] = true
			}
		}
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// registryNames returns every metric name the limiter's and the bridge's
// registries hold when built as cmd/limiter and cmd/bridge build them, with
// every optional part present (metrics address, Redis breaker, global link).
func registryNames(t *testing.T) map[string]bool {
	t.Helper()
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	names := map[string]bool{}

	// The limiter, as cmd/limiter's serve wires it.
	lreg := &recorder{Registerer: NewRegistry(), names: names}
	breaker := region.NewBreaker(regiontest.NewMemory(time.Now), region.BreakerConfig{})
	glink := link.NewGlobal(nc, wire.Subjects{}, "us", nil)
	svc := service.New(service.Config{Origin: breaker, Global: glink, Region: "us"})
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: "us", ObserveLatency: CheckLatency(lreg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Shutdown(context.Background()) })
	RegisterLimiter(lreg, []*transport.Limiter{lim}, svc, glink, breaker)
	RegisterTrips(lreg, fixedTrips{})
	RegisterPolicies(lreg, svc, nil)
	events := transport.NewDecisionStream(nc, transport.DecisionStreamConfig{})
	t.Cleanup(func() { _ = events.Close(context.Background()) })
	RegisterDecisionStream(lreg, events) // with --decision-events
	rls.NewMetrics(lreg)                 // with --rls-listen

	// The bridge, as cmd/bridge's serve wires it.
	breg := &recorder{Registerer: NewRegistry(), names: names}
	bt := link.NewBridge(nc, wire.Subjects{}, "us", nil)
	obs := NewBridgeObservers(breg)
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: "us", Store: bridge.NewMemoryStore(), Transport: bt,
		ObserveStoreWrite: obs.StoreWrite, ObserveBatch: obs.Batch})
	if err != nil {
		t.Fatal(err)
	}
	RegisterBridge(breg, b, bt)
	return names
}

// sluiceName matches a metric name of ours in a PromQL expression or text.
var sluiceName = regexp.MustCompile(`\bsluice_[a-zA-Z0-9_]+`)

// alertNames returns, per alert of the rules file, the sluice_* names its
// expression and annotations use.
func alertNames(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	out := map[string][]string{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Fatalf("%s: a rule without alert or expr: %+v", alertsFile, r)
			}
			names := sluiceName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Fatalf("%s: alert %s uses no sluice_ metric: %s", alertsFile, r.Alert, r.Expr)
			}
			for _, text := range r.Annotations {
				names = append(names, sluiceName.FindAllString(text, -1)...)
			}
			out[r.Alert] = names
		}
	}
	return out
}

// dashboardNames returns, per panel title (or variable), the sluice_* names
// the dashboard's queries use.
func dashboardNames(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], sluiceName.FindAllString(tg.Expr, -1)...)
		}
		if len(out[p.Title]) == 0 {
			t.Fatalf("%s: panel %q queries no sluice_ metric", dashboardFile, p.Title)
		}
	}
	for _, v := range dash.Templating.List {
		if names := sluiceName.FindAllString(v.Definition, -1); len(names) > 0 {
			out["variable "+v.Name] = names
		}
	}
	return out
}

// Every metric the alert rules and the dashboard query exists in the
// limiter's or the bridge's registry: a renamed or removed metric fails
// here, not silently in production. The registries are built by the
// constructors cmd/limiter and cmd/bridge call.
func TestAlertsAndDashboardUseOnlyMetricsTheRegistriesHold(t *testing.T) {
	have := registryNames(t)
	for file, uses := range map[string]map[string][]string{alertsFile: alertNames(t), dashboardFile: dashboardNames(t)} {
		if len(uses) < 10 {
			t.Fatalf("%s: only %d alerts or panels found", file, len(uses))
		}
		for where, names := range uses {
			for _, n := range names {
				if !have[n] {
					t.Errorf("%s: %s uses %s, which neither registry holds", file, where, n)
				}
			}
		}
	}
}

// The check above is only as good as the registries it reads: they hold the
// metrics the alerts are about, the labelled and the histogram ones too.
func TestRegistryNamesIncludeEveryKind(t *testing.T) {
	have := registryNames(t)
	for _, n := range []string{"sluice_origin_breaker_state", "sluice_origin_breaker_opens_total", "sluice_origin_trips_total",
		"sluice_origin_trip_syncs_total", "sluice_bridge_region_lag_seconds",
		"sluice_check_duration_seconds_bucket", "sluice_store_write_seconds_count", "sluice_imports_refused_total",
		"sluice_bridge_refused_total", "sluice_cells"} {
		if !have[n] {
			t.Errorf("the registries lack %s; they hold %v", n, slices.Sorted(func(yield func(string) bool) {
				for k := range have {
					if !yield(k) {
						return
					}
				}
			}))
		}
	}
	if have["sluice_cells_bucket"] {
		t.Error("a gauge got histogram suffixes")
	}
}

// fixedTrips is a TripCounter that always says the same.
type fixedTrips struct{}

func (fixedTrips) TripStats() region.TripStats {
	return region.TripStats{Trips: 3, Syncs: 12, FirstTouches: 7}
}

// The round trips' counters say what the origin's TripStats say.
func TestRegisterTripsExposesTheOriginsCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterTrips(reg, fixedTrips{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	if got["sluice_origin_trips_total"] != 3 || got["sluice_origin_trip_syncs_total"] != 12 || got["sluice_origin_first_touches_total"] != 7 {
		t.Fatalf("trip counters %v, want 3 trips carrying 12 syncs, 7 first touches", got)
	}
}
