package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/service"
)

// RegisterPolicies exposes a limiter's overrides and shadow mode on reg:
// the shadow denials by workspace and namespace, the overrides it holds
// and, with a link (nil: none), whether it agrees with its bridge.
func RegisterPolicies(reg prometheus.Registerer, svc *service.Service, plink *link.Policy) {
	vec(reg, "sluice_shadow_denied_total",
		"Checks in shadow mode that enforcement would have denied, answered success: by workspace and namespace (at most 1000 pairs, the rest as _other).",
		prometheus.CounterValue, []string{"workspace", "namespace"}, func(emit emitFunc) {
			svc.ShadowDenials(func(ws, ns string, n int64) bool {
				emit(float64(n), ws, ns)
				return true
			})
		})
	registerSeries(reg, svc)
	gauge(reg, "policy_overrides", "Live overrides this limiter decides by, every workspace together.", func() float64 {
		return float64(svc.Policies().Live())
	})
	if plink == nil {
		return
	}
	gauge(reg, "policy_stale", "1 while the last comparison of this limiter's overrides with its bridge's failed: it decides by the overrides it last had.",
		func() float64 {
			if plink.Stats().Stale {
				return 1
			}
			return 0
		})
	gauge(reg, "policy_synced_timestamp_seconds", "When this limiter last agreed with its bridge on the overrides (unix seconds; 0: never, or no bridge).",
		func() float64 {
			if t := plink.Stats().SyncedAt; !t.IsZero() {
				return float64(t.UnixMilli()) / 1000
			}
			return 0
		})
	gauge(reg, "policy_pending", "Overrides this limiter accepted that its bridge has not acknowledged (sent again every sync).",
		func() float64 { return float64(plink.Stats().Pending) })
}
