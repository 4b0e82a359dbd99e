package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/service"
)

// registerSeries exposes svc's decisions by workspace and namespace (at
// most service.MaxSeries pairs, the rest under "_other").
func registerSeries(reg prometheus.Registerer, svc *service.Service) {
	vec(reg, "sluice_namespace_decisions_total",
		"Checks decided, by workspace, namespace and outcome (admitted, denied, shadow_denied); at most 1000 pairs, the rest as _other.",
		prometheus.CounterValue, []string{"workspace", "namespace", "outcome"}, func(emit emitFunc) {
			svc.Decisions(func(r service.SeriesDecisions) bool {
				emit(float64(r.Admitted), r.Workspace, r.Namespace, "admitted")
				emit(float64(r.Denied), r.Workspace, r.Namespace, "denied")
				emit(float64(r.ShadowDenied), r.Workspace, r.Namespace, "shadow_denied")
				return true
			})
		})
}

// RegisterDecisionStream exposes what the decision stream published,
// dropped (its queue full: the connection lagged) and failed to publish.
func RegisterDecisionStream(reg prometheus.Registerer, s *transport.DecisionStream) {
	counter(reg, "decision_events_published_total", "Decision events handed to NATS (--decision-events).",
		func() float64 { return float64(s.Published()) })
	counter(reg, "decision_events_dropped_total", "Decision events dropped because the NATS connection lagged and the queue (--decision-events-buffer) was full; checks never wait for the stream.",
		func() float64 { return float64(s.Dropped()) })
	counter(reg, "decision_events_failed_total", "Decision events the NATS connection refused (closed).",
		func() float64 { return float64(s.Failed()) })
}
