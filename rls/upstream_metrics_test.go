package rls

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// With upstream's names on, every hit counted under sluice_rls_* is
// counted under envoyproxy/ratelimit's name too, its descriptor path split
// into key1 and key2; configuration loads likewise.
func TestUpstreamMetricNamesCountWhatSluicesDo(t *testing.T) {
	h := newHarness(t, false)
	h.srv.cfg.Metrics.WithUpstreamNames(h.reg)
	for range 5 { // limit 3 a second: 3 within, 2 over
		h.call(t, "api", 1, desc("user=alice"))
	}
	for range 2 { // the nested limit of 5: within
		h.call(t, "example 7 / with spaces", 1, desc("key_1=value_1", "user=bkthomps"))
	}
	m, up := h.srv.cfg.Metrics, h.srv.cfg.Metrics.up
	for _, c := range []struct {
		name     string
		sluice   float64
		upstream float64
		want     float64
	}{
		{"hits", testutil.ToFloat64(m.hits.WithLabelValues("api", "user")), testutil.ToFloat64(up.hits.WithLabelValues("api", "user", "")), 5},
		{"within", testutil.ToFloat64(m.within.WithLabelValues("api", "user")), testutil.ToFloat64(up.within.WithLabelValues("api", "user", "")), 3},
		{"over", testutil.ToFloat64(m.over.WithLabelValues("api", "user")), testutil.ToFloat64(up.over.WithLabelValues("api", "user", "")), 2},
		{"nested hits", testutil.ToFloat64(m.hits.WithLabelValues("example 7 / with spaces", "key_1_value_1.user_bkthomps")),
			testutil.ToFloat64(up.hits.WithLabelValues("example 7 / with spaces", "key_1_value_1", "user_bkthomps")), 2},
	} {
		if c.sluice != c.want || c.upstream != c.want {
			t.Errorf("%s: sluice_rls %v, upstream's name %v; want %v both", c.name, c.sluice, c.upstream, c.want)
		}
	}
	m.ConfigLoaded(true)
	m.ConfigLoaded(false)
	if ok, bad := testutil.ToFloat64(up.loadOK), testutil.ToFloat64(up.loadErr); ok != 1 || bad != 1 {
		t.Errorf("config loads under upstream's names: success %v, error %v; want 1 and 1", ok, bad)
	}
}
