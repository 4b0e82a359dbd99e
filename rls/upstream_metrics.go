package rls

import "github.com/prometheus/client_golang/prometheus"

// upstreamMetrics are the same counts as Metrics under the names of
// envoyproxy/ratelimit's Prometheus mapping, so its dashboards and alerts
// work: ratelimit_service_rate_limit_total_hits{domain, key1, key2} and
// siblings, the descriptor path split at its first dot as the statsd
// segments are, and ratelimit_service_config_load_success and _error.
type upstreamMetrics struct {
	counts
	loadOK, loadErr prometheus.Counter
}

// WithUpstreamNames registers on reg the counts of m under
// envoyproxy/ratelimit's metric names too (--rls-upstream-metrics), from
// now on. Call it before the service serves.
func (m *Metrics) WithUpstreamNames(reg prometheus.Registerer) {
	vec := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name,
			Help: help + " (envoyproxy/ratelimit's name; sluice_rls_* holds the same)."}, []string{"domain", "key1", "key2"})
		reg.MustRegister(v)
		return v
	}
	u := &upstreamMetrics{
		counts: counts{
			hits:   vec("total_hits", "Hits checked against a limit"),
			over:   vec("over_limit", "Hits over their limit"),
			near:   vec("near_limit", "Admitted hits near their limit"),
			within: vec("within_limit", "Hits within their limit"),
			shadow: vec("shadow_mode", "Hits over a shadow_mode limit, answered OK"),
		},
		loadOK: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success",
			Help: "Configuration loads that succeeded (envoyproxy/ratelimit's name)."}),
		loadErr: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error",
			Help: "Configuration loads refused (envoyproxy/ratelimit's name)."}),
	}
	reg.MustRegister(u.loadOK, u.loadErr)
	m.up = u
}
