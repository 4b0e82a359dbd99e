package rls

import (
	"strings"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// Metrics are the rate limit service's Prometheus metrics: per domain and
// descriptor (Limit.Path; the request's entries with detailed_metric;
// "override:" and the keys for a limit Envoy sent), the hits, over-limit,
// near-limit, within-limit and shadow-mode hits; the calls by outcome; the
// configuration loads, domains and skipped files. Safe for simultaneous use.
type Metrics struct {
	counts
	calls   *prometheus.CounterVec
	loads   *prometheus.CounterVec
	loaded  prometheus.Gauge
	domains prometheus.Gauge
	skipped *prometheus.GaugeVec
	cache   sync.Map         // metricLabels -> []limitCounts
	up      *upstreamMetrics // nil: sluice_rls_* names only
}

type metricLabels struct{ domain, descriptor string }

// counts are the counters of every limit, by the labels of one.
type counts struct{ hits, over, near, within, shadow *prometheus.CounterVec }

// limitCounts are the counters of one limit.
type limitCounts struct{ hits, over, near, within, shadow prometheus.Counter }

func (c *counts) with(labels ...string) limitCounts {
	return limitCounts{c.hits.WithLabelValues(labels...), c.over.WithLabelValues(labels...),
		c.near.WithLabelValues(labels...), c.within.WithLabelValues(labels...), c.shadow.WithLabelValues(labels...)}
}

// count counts one decided item, near its limit by the limit that applied
// (an override's when one did).
func (c limitCounts) count(it *item, nearRatio float64) {
	cost := float64(it.q.Cost)
	c.hits.Add(cost)
	if it.over {
		c.over.Add(cost)
		if it.shadow {
			c.shadow.Add(cost)
		}
		return
	}
	c.within.Add(cost)
	if it.d.Admitted && float64(it.d.Limit-it.d.Remaining) > float64(it.d.Limit)*nearRatio {
		c.near.Add(cost)
	}
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "sluice", Subsystem: "rls", Name: name, Help: help}
	}
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		counts: counts{
			hits:   vec("hits_total", "Hits (hits_addend summed) checked against a limit, per domain and descriptor.", "domain", "descriptor"),
			over:   vec("over_limit_total", "Hits of descriptors over their limit, per domain and descriptor.", "domain", "descriptor"),
			near:   vec("near_limit_total", "Admitted hits that left less than the near-limit share (20%) of the limit, per domain and descriptor.", "domain", "descriptor"),
			within: vec("within_limit_total", "Hits of descriptors within their limit, per domain and descriptor.", "domain", "descriptor"),
			shadow: vec("shadow_mode_total", "Hits over a limit in shadow mode (shadow_mode, or an override's shadow mode), answered OK, per domain and descriptor.", "domain", "descriptor"),
		},
		calls: vec("calls_total", "ShouldRateLimit calls by outcome: ok, over_limit, or the gRPC error code.", "outcome"),
		loads: vec("config_loads_total", "Configuration loads by result: success or error (an invalid configuration is refused and the previous one kept).", "result"),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts(opts("config_last_load_success",
			"1 if the last configuration load succeeded, 0 if it was refused."))),
		domains: prometheus.NewGauge(prometheus.GaugeOpts(opts("config_domains",
			"Domains in the configuration in use (with none, every call is answered OK and the service is not ready)."))),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("config_skipped_files",
			"1 for each file the configuration directory holds but the configuration skips (hidden, a link to a directory, not a file), by path.")), []string{"path"}),
	}
	reg.MustRegister(m.loaded, m.domains, m.skipped)
	m.loads.WithLabelValues("success")
	m.loads.WithLabelValues("error")
	m.calls.WithLabelValues("ok")
	m.calls.WithLabelValues("over_limit")
	return m
}

// ConfigLoaded counts a configuration load and its result.
func (m *Metrics) ConfigLoaded(ok bool) {
	if m == nil {
		return
	}
	result, loaded := "error", 0.0
	if ok {
		result, loaded = "success", 1
	}
	m.loads.WithLabelValues(result).Inc()
	m.loaded.Set(loaded)
	switch {
	case m.up != nil && ok:
		m.up.loadOK.Inc()
	case m.up != nil:
		m.up.loadErr.Inc()
	}
}

func (m *Metrics) domainsLoaded(n int) {
	if m != nil {
		m.domains.Set(float64(n))
	}
}

func (m *Metrics) skippedFiles(paths []string) {
	if m == nil {
		return
	}
	m.skipped.Reset()
	for _, p := range paths {
		m.skipped.WithLabelValues(validLabel(p)).Set(1)
	}
}

func (m *Metrics) request(resp *rlsv3.RateLimitResponse, err error) {
	switch {
	case err != nil:
		m.calls.WithLabelValues(strings.ToLower(status.Code(err).String())).Inc()
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		m.calls.WithLabelValues("over_limit").Inc()
	default:
		m.calls.WithLabelValues("ok").Inc()
	}
}

// of returns the counters of a limit: its own, and those under upstream's
// names when they are on.
func (m *Metrics) of(l metricLabels) []limitCounts {
	if v, ok := m.cache.Load(l); ok {
		return v.([]limitCounts)
	}
	d, p := validLabel(l.domain), validLabel(l.descriptor)
	lc := []limitCounts{m.with(d, p)}
	if m.up != nil {
		key1, key2, _ := strings.Cut(p, ".")
		lc = append(lc, m.up.with(d, key1, key2))
	}
	v, _ := m.cache.LoadOrStore(l, lc)
	return v.([]limitCounts)
}

func (m *Metrics) decision(it *item, nearRatio float64) {
	for _, c := range m.of(it.labels) {
		c.count(it, nearRatio)
	}
}

// labelsOf names a matched limit in the metrics: its configured path, or
// with detailed_metric the request's entries.
func labelsOf(l *Limit, domain string, entries []Entry) metricLabels {
	if !l.DetailedMetric {
		return metricLabels{domain, l.Path}
	}
	return metricLabels{domain, entryPath("", entries, true)}
}

// overrideLabels names a limit Envoy sent: its keys, never its values, so
// the series stay as few as the keys Envoy sends.
func overrideLabels(domain string, entries []Entry) metricLabels {
	return metricLabels{domain, entryPath("override:", entries, false)}
}

// entryPath is prefix and the entries' keys, each with '_' and its value
// when values is set, joined by '.'.
func entryPath(prefix string, entries []Entry, values bool) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if values {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// validLabel makes s a valid label value: gRPC refuses strings that are not
// UTF-8 on the wire, but a Server called directly may get any bytes, and
// Prometheus panics on them.
func validLabel(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
