package rls

import (
	"strings"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// Metrics are the rate limit service's Prometheus metrics: per domain and
// descriptor (the configured path, "key_value.key2" as envoyproxy/ratelimit
// names it; the request's own entries with detailed_metric; "override:" and
// the entries' keys for a limit Envoy sent), the hits, over-limit,
// near-limit, within-limit and shadow-mode hits; per outcome the calls; and
// the configuration loads, the domains loaded and the files a directory
// holds but the configuration skips. Safe for simultaneous use.
type Metrics struct {
	hits, over, near, within, shadow *prometheus.CounterVec
	calls                            *prometheus.CounterVec
	loads                            *prometheus.CounterVec
	loaded                           prometheus.Gauge
	domains                          prometheus.Gauge
	skipped                          *prometheus.GaugeVec
	cache                            sync.Map         // metricLabels -> *limitMetrics
	up                               *upstreamMetrics // nil: sluice_rls_* names only
}

type metricLabels struct{ domain, descriptor string }

// limitMetrics are one descriptor's counters; up* under upstream's names
// (nil without them).
type limitMetrics struct {
	hits, over, near, within, shadow       prometheus.Counter
	upHits, upOver, upNear, upWithin, upSh prometheus.Counter
}

// add adds v to c and, when set, to its upstream twin u.
func add(c, u prometheus.Counter, v float64) {
	c.Add(v)
	if u != nil {
		u.Add(v)
	}
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rls", Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		hits:   vec("hits_total", "Hits (hits_addend summed) checked against a limit, per domain and descriptor.", "domain", "descriptor"),
		over:   vec("over_limit_total", "Hits of descriptors over their limit, per domain and descriptor.", "domain", "descriptor"),
		near:   vec("near_limit_total", "Admitted hits that left less than the near-limit share (20%) of the limit, per domain and descriptor.", "domain", "descriptor"),
		within: vec("within_limit_total", "Hits of descriptors within their limit, per domain and descriptor.", "domain", "descriptor"),
		shadow: vec("shadow_mode_total", "Hits over a limit in shadow mode (shadow_mode, or an override's shadow mode), answered OK, per domain and descriptor.", "domain", "descriptor"),
		calls:  vec("calls_total", "ShouldRateLimit calls by outcome: ok, over_limit, or the gRPC error code.", "outcome"),
		loads:  vec("config_loads_total", "Configuration loads by result: success or error (an invalid configuration is refused and the previous one kept).", "result"),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rls", Name: "config_last_load_success",
			Help: "1 if the last configuration load succeeded, 0 if it was refused."}),
	}
	m.domains = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rls", Name: "config_domains",
		Help: "Domains in the configuration in use (with none, every call is answered OK and the service is not ready)."})
	m.skipped = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rls", Name: "config_skipped_files",
		Help: "1 for each file the configuration directory holds but the configuration skips (hidden, a link to a directory, not a file), by path."}, []string{"path"})
	reg.MustRegister(m.loaded, m.domains, m.skipped)
	for _, r := range []string{"success", "error"} {
		m.loads.WithLabelValues(r)
	}
	for _, o := range []string{"ok", "over_limit"} {
		m.calls.WithLabelValues(o)
	}
	return m
}

// ConfigLoaded counts a configuration load and its result.
func (m *Metrics) ConfigLoaded(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.loads.WithLabelValues("success").Inc()
		m.loaded.Set(1)
		if m.up != nil {
			m.up.loadOK.Inc()
		}
		return
	}
	m.loads.WithLabelValues("error").Inc()
	m.loaded.Set(0)
	if m.up != nil {
		m.up.loadErr.Inc()
	}
}

// domainsLoaded sets the number of domains of the configuration in use.
func (m *Metrics) domainsLoaded(n int) {
	if m != nil {
		m.domains.Set(float64(n))
	}
}

// skippedFiles makes paths the files skipped.
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

func (m *Metrics) of(l metricLabels) *limitMetrics {
	if v, ok := m.cache.Load(l); ok {
		return v.(*limitMetrics)
	}
	d, p := validLabel(l.domain), validLabel(l.descriptor)
	lm := &limitMetrics{
		hits: m.hits.WithLabelValues(d, p), over: m.over.WithLabelValues(d, p),
		near: m.near.WithLabelValues(d, p), within: m.within.WithLabelValues(d, p),
		shadow: m.shadow.WithLabelValues(d, p),
	}
	if m.up != nil {
		lm.upHits, lm.upOver, lm.upNear, lm.upWithin, lm.upSh = m.up.of(d, p)
	}
	v, _ := m.cache.LoadOrStore(l, lm)
	return v.(*limitMetrics)
}

// decision counts one decided item, near its limit by the limit that
// applied (an override's when one did).
func (m *Metrics) decision(it *item, nearRatio float64) {
	lm := m.of(it.labels)
	cost := float64(it.q.Cost)
	add(lm.hits, lm.upHits, cost)
	if it.over {
		add(lm.over, lm.upOver, cost)
		if it.shadow {
			add(lm.shadow, lm.upSh, cost)
		}
		return
	}
	add(lm.within, lm.upWithin, cost)
	if it.d.Admitted && float64(it.d.Limit-it.d.Remaining) > float64(it.d.Limit)*nearRatio {
		add(lm.near, lm.upNear, cost)
	}
}

// labelsOf names a matched limit in the metrics: its configured path, or
// with detailed_metric the request's entries.
func labelsOf(l *Limit, domain string, entries []Entry) metricLabels {
	if !l.DetailedMetric {
		return metricLabels{domain, l.Path}
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
	}
	return metricLabels{domain, b.String()}
}

// overrideLabels names a limit Envoy sent: its keys, never its values, so
// the series stay as few as the keys Envoy sends.
func overrideLabels(domain string, entries []Entry) metricLabels {
	var b strings.Builder
	b.WriteString("override:")
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
	}
	return metricLabels{domain, b.String()}
}

// validLabel makes s a valid label value: gRPC refuses strings that are not
// UTF-8 on the wire, but a Server called directly may get any bytes, and
// Prometheus panics on them.
func validLabel(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
