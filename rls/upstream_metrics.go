package rls

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// upstreamMetrics are the same counts as Metrics under the names
// envoyproxy/ratelimit's Prometheus mapping gives them
// (ratelimit_service_rate_limit_total_hits{domain, key1, key2} and its
// over_limit, near_limit, within_limit and shadow_mode siblings;
// ratelimit_service_config_load_success and _error), so dashboards and
// alerts written for it keep working. A descriptor's path splits at its
// first dot into key1 and key2, as the mapping's statsd segments do.
type upstreamMetrics struct {
	hits, over, near, within, shadow *prometheus.CounterVec
	loadOK, loadErr                  prometheus.Counter
}

func newUpstreamMetrics(reg prometheus.Registerer) *upstreamMetrics {
	vec := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name,
			Help: help + " (envoyproxy/ratelimit's name; sluice_rls_* holds the same)."}, []string{"domain", "key1", "key2"})
		reg.MustRegister(v)
		return v
	}
	u := &upstreamMetrics{
		hits:   vec("total_hits", "Hits checked against a limit"),
		over:   vec("over_limit", "Hits over their limit"),
		near:   vec("near_limit", "Admitted hits near their limit"),
		within: vec("within_limit", "Hits within their limit"),
		shadow: vec("shadow_mode", "Hits over a shadow_mode limit, answered OK"),
		loadOK: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success",
			Help: "Configuration loads that succeeded (envoyproxy/ratelimit's name)."}),
		loadErr: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error",
			Help: "Configuration loads refused (envoyproxy/ratelimit's name)."}),
	}
	reg.MustRegister(u.loadOK, u.loadErr)
	return u
}

// of returns the counters of one domain and descriptor path.
func (u *upstreamMetrics) of(domain, path string) (hits, over, near, within, shadow prometheus.Counter) {
	key1, key2, _ := strings.Cut(path, ".")
	return u.hits.WithLabelValues(domain, key1, key2), u.over.WithLabelValues(domain, key1, key2),
		u.near.WithLabelValues(domain, key1, key2), u.within.WithLabelValues(domain, key1, key2),
		u.shadow.WithLabelValues(domain, key1, key2)
}

// WithUpstreamNames registers on reg the counts of m under
// envoyproxy/ratelimit's metric names too (--rls-upstream-metrics), from
// now on. Call it before the service serves.
func (m *Metrics) WithUpstreamNames(reg prometheus.Registerer) {
	m.up = newUpstreamMetrics(reg)
}
