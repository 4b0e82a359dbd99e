// Package telemetry exposes a limiter's or a bridge's counters as
// Prometheus metrics and serves them over HTTP with liveness and readiness
// probes. Counters are read from the components' Stats at scrape time, so
// nothing is added to the check path but the latency samples.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
)

// NewRegistry returns a registry with the Go runtime and process collectors.
// Beside the default Go metrics it holds go_gc_heap_live_bytes (the heap
// the last collection found live) and go_gc_gogc_percent: a limiter keeps
// its GC goal a headroom above the live heap (--gc-headroom-mib), so its
// allocated heap (go_memstats_heap_alloc_bytes) runs up to that much above
// what it holds.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/(heap/live:bytes|gogc:percent)$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func counter(reg prometheus.Registerer, name, help string, f func() float64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "sluice", Name: name, Help: help}, f))
}

func gauge(reg prometheus.Registerer, name, help string, f func() float64) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "sluice", Name: name, Help: help}, f))
}

// CheckLatency returns a histogram of check latency, registered on reg, for
// transport.LimiterConfig.ObserveLatency.
func CheckLatency(reg prometheus.Registerer) func(time.Duration) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sluice", Name: "check_duration_seconds",
		Help:    "Time from a check's decode to its reply: every check that waited on the origin, one in 64 answered inline.",
		Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25}})
	reg.MustRegister(h)
	return func(d time.Duration) { h.Observe(d.Seconds()) }
}

// BreakerState is an origin's pair of circuit breakers whose states, and
// how often each opened, can be read (region.Breaker).
type BreakerState interface {
	State(region.Call) gobreaker.State
	Opens(region.Call) int64
}

// TripCounter is an origin whose checks' syncs share round trips
// (region.Redis).
type TripCounter interface {
	TripStats() region.TripStats
}

// RegisterTrips exposes on reg how many round trips the checks' syncs made
// to the origin and how many syncs they carried (their ratio is the batch
// the load produces), and how many syncs first touches decided.
func RegisterTrips(reg prometheus.Registerer, o TripCounter) {
	counter(reg, "origin_trips_total", "Round trips the checks' syncs made to Redis.",
		func() float64 { return float64(o.TripStats().Trips) })
	counter(reg, "origin_trip_syncs_total", "Checks' syncs the round trips to Redis carried (per trip: the batch the load produced).",
		func() float64 { return float64(o.TripStats().Syncs) })
	counter(reg, "origin_first_touches_total", "Syncs of cells no reporter held that Redis took without the sync script (a SET NX and a GET): cold checks decided at a counter's cost.",
		func() float64 { return float64(o.TripStats().FirstTouches) })
}

// RegisterLimiter exposes a limiter process's metrics on reg: its micro
// instances' answers summed, and its service's counters. breaker may be nil
// (no origin).
func RegisterLimiter(reg prometheus.Registerer, lims []*transport.Limiter, svc *service.Service, glink *link.Global, breaker BreakerState) {
	lim := limiters(lims)
	vec(reg, "sluice_decisions_total", "Checks decided, by outcome.", prometheus.CounterValue, []string{"outcome"}, func(emit emitFunc) {
		st := lim.Stats()
		emit(float64(st.Admitted), "admitted")
		emit(float64(st.Denied), "denied")
	})
	vec(reg, "sluice_check_errors_total", "Checks answered with a service error, by code.", prometheus.CounterValue, []string{"code"}, func(emit emitFunc) {
		st := lim.Stats()
		emit(float64(st.BadRequests), "400")
		emit(float64(st.InternalErrors), "500")
		emit(float64(st.Unavailable), "503")
	})
	counter(reg, "batches_total", "Batch checks answered.", func() float64 { return float64(lim.Stats().Batches) })
	vec(reg, "sluice_http_refused_total", "Requests the HTTP door (--http-listen) refused before any endpoint saw them, by status: 400 unreadable body, 401 and 403 admin credentials, 404 no such path, 405 not POST, 413 over the max payload.",
		prometheus.CounterValue, []string{"code"}, func(emit emitFunc) {
			sums := map[int]int64{}
			for _, l := range lims {
				l.HTTPRefusals(func(code int, n int64) bool { sums[code] += n; return true })
			}
			for code, n := range sums {
				emit(float64(n), strconv.Itoa(code))
			}
		})
	counter(reg, "checks_waited_total", "Checks that waited on the origin (answered from their own goroutine).",
		func() float64 { return float64(lim.Stats().AsyncChecks) })
	counter(reg, "checks_not_waited_total", "Checks and batches decided locally at once because --max-waiting-checks were waiting on the origin.",
		func() float64 { return float64(lim.Stats().NotWaited) })
	s := func(f func(service.Stats) int64) func() float64 {
		return func() float64 { return float64(f(svc.Stats())) }
	}
	gauge(reg, "cells", "Identifiers held in memory when scraped.", s(func(st service.Stats) int64 { return st.Cells }))
	counter(reg, "origin_syncs_total", "Origin (Redis) calls checks waited on: checks the lease did not cover, refreshes of cold, stale or strict cells.",
		s(func(st service.Stats) int64 { return st.OriginSyncs }))
	counter(reg, "origin_sync_errors_total", "Origin calls checks waited on that failed (the checks were decided locally).",
		s(func(st service.Stats) int64 { return st.OriginSyncErrors }))
	counter(reg, "origin_sync_seconds_total", "Time checks spent waiting on origin calls.", func() float64 { return svc.Stats().OriginSyncTime.Seconds() })
	counter(reg, "origin_late_calls_total", "Origin calls on the request path not answered within --read-timeout (or not started: another sync of the cell held it that long): their checks were denied and their identifiers stalled for --read-retry; they count in origin_sync_errors_total and towards the breaker.",
		s(func(st service.Stats) int64 { return st.LateCalls }))
	counter(reg, "debits_total", "Checks that debited their cost (charge debit: usage known afterwards, charged whatever the room).",
		s(func(st service.Stats) int64 { return st.Debits }))
	counter(reg, "debits_over_limit_total", "Debits that took the usage past the limit (answered success false, counted all the same).",
		s(func(st service.Stats) int64 { return st.DebitsOver }))
	counter(reg, "debited_cost_total", "Cost charged by debits.", s(func(st service.Stats) int64 { return st.DebitedCost }))
	counter(reg, "drains_total", "Checks denied that charged what the limit had left (charge drain).",
		s(func(st service.Stats) int64 { return st.Drains }))
	counter(reg, "drained_cost_total", "Cost charged by drains.", s(func(st service.Stats) int64 { return st.DrainedCost }))
	counter(reg, "origin_requests_total", "Checks and batch reservations decided by the origin (Redis).", s(func(st service.Stats) int64 { return st.OriginRequests }))
	counter(reg, "origin_denials_total", "Checks and batch reservations the origin denied.", s(func(st service.Stats) int64 { return st.OriginDenials }))
	counter(reg, "origin_waits_total", "Times a check waited for leases other limiters held (near the limit, in a burst).",
		s(func(st service.Stats) int64 { return st.OriginWaits }))
	counter(reg, "origin_waits_denied_total", "Checks and batches denied because their callers gave up while they waited on the origin (it answered, but not in time).",
		s(func(st service.Stats) int64 { return st.WaitsDenied }))
	counter(reg, "admitted_locally_total", "Checks and batch queries admitted without the origin (it failed, or a tenant was past its share of --max-waiting-checks); charged at the origin later.",
		s(func(st service.Stats) int64 { return st.AdmittedLocally }))
	counter(reg, "generations_total", "Cells this limiter reported under a new generation (it had not synced them for half of the origin's ForgetAfter).",
		s(func(st service.Stats) int64 { return st.Generations }))
	counter(reg, "reversals_total", "Times the origin said a lease it had counted as used came back (its holder was late, not dead), lowering this limiter's count of the cell.",
		s(func(st service.Stats) int64 { return st.Reversals }))
	counter(reg, "settle_expired_dropped_total", "Cells dropped from the settle queue because their window had expired at the origin (it was unreachable that long).",
		s(func(st service.Stats) int64 { return st.ExpiredDropped }))
	counter(reg, "locals_raised_total", "Other limiters' local counts (what each admitted while Redis failed) this limiter raised Redis to.",
		s(func(st service.Stats) int64 { return st.LocalsRaised }))
	counter(reg, "local_raise_errors_total", "Calls raising Redis to other limiters' local counts that failed (tried again next settle round).",
		s(func(st service.Stats) int64 { return st.LocalRaiseErrors }))
	gauge(reg, "locals_waiting", "Other limiters' local counts this limiter holds until Redis takes them.",
		s(func(st service.Stats) int64 { return st.LocalsWaiting }))
	counter(reg, "leased_total", "Cost the origin granted as leases, spent locally without asking it.", s(func(st service.Stats) int64 { return st.Leased }))
	counter(reg, "settles_total", "Settle calls to the origin (background: reports, lease renewals and returns).", s(func(st service.Stats) int64 { return st.Settles }))
	counter(reg, "settle_errors_total", "Settle calls that failed (their cells are sent again).", s(func(st service.Stats) int64 { return st.SettleErrors }))
	counter(reg, "settle_cells_total", "Cells carried by settle calls.", s(func(st service.Stats) int64 { return st.SettleCells }))
	gauge(reg, "settle_pending_cells", "Cells with something for the origin: admissions to report, a lease to renew or give back.",
		s(func(st service.Stats) int64 { return st.SettleQueued }))
	counter(reg, "components_published_total", "Regional counts published to the bridge.", s(func(st service.Stats) int64 { return st.ComponentsPublished }))
	counter(reg, "imports_applied_total", "Imports applied from the bridge.", s(func(st service.Stats) int64 { return st.ImportsApplied }))
	counter(reg, "imports_stored_total", "Imports stored in the origin for cells created later.", s(func(st service.Stats) int64 { return st.ImportsStored }))
	counter(reg, "import_store_errors_total", "Calls storing imports in the origin that failed.", s(func(st service.Stats) int64 { return st.ImportStoreErrors }))
	counter(reg, "publish_errors_total", "Publish rounds to the bridge that failed (their components are sent again).",
		s(func(st service.Stats) int64 { return st.PublishErrors }))
	vec(reg, "sluice_imports_refused_total",
		"Imports from the bridge refused, by reason: invalid, future_window (ahead of the clock by more than the clock-skew tolerance), clock_skew (message stamped beyond it).",
		prometheus.CounterValue, []string{"reason"}, func(emit emitFunc) {
			byReason := map[string]int64{"invalid": 0, "future_window": 0, "clock_skew": 0}
			for r, n := range svc.Refused() {
				byReason[r.Reason] += n
			}
			for reason, n := range byReason {
				emit(float64(n), reason)
			}
		})
	if glink != nil {
		counter(reg, "malformed_messages_total", "Internal messages dropped as malformed.", func() float64 { return float64(glink.Dropped()) })
	}
	if breaker != nil {
		vec(reg, "sluice_origin_breaker_state", "Origin circuit breakers by call (read: checks' reads; apply: replays): 0 closed, 1 half-open, 2 open.",
			prometheus.GaugeValue, []string{"call"}, func(emit emitFunc) {
				emit(float64(breaker.State(region.CallRead)), string(region.CallRead))
				emit(float64(breaker.State(region.CallApply)), string(region.CallApply))
			})
		vec(reg, "sluice_origin_breaker_opens_total", "Times each origin circuit breaker opened (read: checks' reads; apply: replays): a Redis that fails, not one that is slow, opens one.",
			prometheus.CounterValue, []string{"call"}, func(emit emitFunc) {
				emit(float64(breaker.Opens(region.CallRead)), string(region.CallRead))
				emit(float64(breaker.Opens(region.CallApply)), string(region.CallApply))
			})
	}
}

// limiters sums the stats of several micro instances.
type limiters []*transport.Limiter

func (ls limiters) Stats() transport.LimiterStats {
	var sum transport.LimiterStats
	for _, l := range ls {
		st := l.Stats()
		sum.Admitted += st.Admitted
		sum.Denied += st.Denied
		sum.BadRequests += st.BadRequests
		sum.InternalErrors += st.InternalErrors
		sum.Unavailable += st.Unavailable
		sum.Batches += st.Batches
		sum.AsyncChecks += st.AsyncChecks
		sum.NotWaited += st.NotWaited
	}
	return sum
}

// BridgeObservers are the histograms a bridge reports into.
type BridgeObservers struct {
	StoreWrite func(time.Duration, int, error)
	Batch      func(forwarded, imports int)
}

// NewBridgeObservers registers a bridge's histograms on reg, for
// bridge.BridgeConfig.ObserveStoreWrite and ObserveBatch.
func NewBridgeObservers(reg prometheus.Registerer) BridgeObservers {
	write := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sluice", Name: "store_write_seconds",
		Help: "MySQL write latency, by result.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"result"})
	rows := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sluice", Name: "store_write_rows",
		Help: "Rows per MySQL write.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)})
	fwd := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sluice", Name: "bridge_batch_forwarded",
		Help: "Components forwarded per bridge batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)})
	imps := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sluice", Name: "bridge_batch_imports",
		Help: "Imports broadcast per bridge batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)})
	reg.MustRegister(write, rows, fwd, imps)
	return BridgeObservers{
		StoreWrite: func(d time.Duration, n int, err error) {
			result := "ok"
			if err != nil {
				result = "error"
			}
			write.WithLabelValues(result).Observe(d.Seconds())
			rows.Observe(float64(n))
		},
		Batch: func(f, i int) {
			if f > 0 {
				fwd.Observe(float64(f))
			}
			if i > 0 {
				imps.Observe(float64(i))
			}
		},
	}
}

// RegisterBridge exposes a bridge's counters on reg.
func RegisterBridge(reg prometheus.Registerer, b *bridge.Bridge, tr *link.Bridge) {
	st := func(f func(bridge.BridgeStats) int64) func() float64 {
		return func() float64 { return float64(f(b.Stats())) }
	}
	gauge(reg, "bridge_cells", "Cells the bridge holds components of.", st(func(s bridge.BridgeStats) int64 { return int64(s.Cells) }))
	gauge(reg, "bridge_policy_overrides", "Live overrides the bridge holds.", func() float64 { return float64(b.Policies().Live()) })
	gauge(reg, "bridge_policy_pending", "Overrides not yet written to the store.", func() float64 { return float64(b.PolicyStoreQueued()) })
	counter(reg, "bridge_components_in_total", "Components received from the region's limiters.", st(func(s bridge.BridgeStats) int64 { return s.ComponentsIn }))
	counter(reg, "bridge_components_forwarded_total", "Components forwarded to other regions.", st(func(s bridge.BridgeStats) int64 { return s.ComponentsForwarded }))
	counter(reg, "bridge_components_imported_total", "Components received from other regions.", st(func(s bridge.BridgeStats) int64 { return s.ComponentsFromPeers }))
	counter(reg, "bridge_imports_broadcast_total", "Imports broadcast to the region's limiters.", st(func(s bridge.BridgeStats) int64 { return s.ImportsBroadcast }))
	counter(reg, "store_writes_total", "Rows written to MySQL.", st(func(s bridge.BridgeStats) int64 { return s.StoreWrites }))
	counter(reg, "store_write_errors_total", "MySQL writes that failed (retried).", st(func(s bridge.BridgeStats) int64 { return s.StoreWriteErrors }))
	counter(reg, "store_loads_total", "Reads of the components, overrides and reset marks that changed in MySQL since the last read.", st(func(s bridge.BridgeStats) int64 { return s.StoreLoads }))
	counter(reg, "store_full_loads_total", "Reads of every live row from MySQL (at start, or when the server's clock went back).", st(func(s bridge.BridgeStats) int64 { return s.StoreFullLoads }))
	counter(reg, "store_rows_loaded_total", "Rows read from MySQL by the bridge's loads.", st(func(s bridge.BridgeStats) int64 { return s.StoreRowsLoaded }))
	counter(reg, "store_load_errors_total", "Reloads that failed.", st(func(s bridge.BridgeStats) int64 { return s.StoreLoadErrors }))
	gauge(reg, "store_pending_rows", "Rows waiting to be written to MySQL.", st(func(s bridge.BridgeStats) int64 { return int64(s.StorePending) }))
	counter(reg, "bridge_forward_errors_total", "Forwards to other regions that failed.", st(func(s bridge.BridgeStats) int64 { return s.ForwardErrors }))
	counter(reg, "bridge_sweeps_total", "Sweeps of the region's counts from Redis (at start, when MySQL answers again, every --sweep-interval, at shutdown).", st(func(s bridge.BridgeStats) int64 { return s.Sweeps }))
	counter(reg, "bridge_sweep_errors_total", "Sweeps that failed (Redis unreachable); the next interval sweeps again.", st(func(s bridge.BridgeStats) int64 { return s.SweepErrors }))
	counter(reg, "bridge_sweep_cells_total", "Cells read by sweeps.", st(func(s bridge.BridgeStats) int64 { return s.SweepCells }))
	counter(reg, "bridge_sweep_raised_total", "Components that sweeps raised above what the bridge held: counts no limiter publication brought to this bridge, now forwarded and stored.", st(func(s bridge.BridgeStats) int64 { return s.SweepRaised }))
	gauge(reg, "bridge_sweep_last_seconds", "How long the last sweep took.", func() float64 { return float64(b.Stats().SweepLastMs) / 1000 })
	counter(reg, "malformed_messages_total", "Internal messages dropped as malformed.", func() float64 { return float64(tr.Dropped()) })
	vec(reg, "sluice_bridge_region_lag_seconds",
		"Seconds since the last message from another region's bridge (since this bridge started, if none came), for every region of --regions, heard from or in the store: how stale this region's view of it may be.",
		prometheus.GaugeValue, []string{"peer_region"}, func(emit emitFunc) {
			for r, d := range b.RegionLags() {
				emit(d.Seconds(), r)
			}
		})
	vec(reg, "sluice_bridge_peer_clock_offset_seconds",
		"How far ahead of this bridge's clock another region's bridge stamped its last message (negative: behind, or delayed).",
		prometheus.GaugeValue, []string{"peer_region"}, func(emit emitFunc) {
			for r, d := range b.ClockOffsets() {
				emit(d.Seconds(), r)
			}
		})
	vec(reg, "sluice_bridge_refused_total",
		"Entries refused, by source (limiters, regions, store), sending region and reason (invalid, future_window, clock_skew).",
		prometheus.CounterValue, []string{"source", "region", "reason"}, func(emit emitFunc) {
			for r, n := range b.Refused() {
				emit(float64(n), r.Source, r.Region, r.Reason)
			}
		})
}

// emitFunc sends one series of a vec's metric: its value and label values.
type emitFunc func(v float64, labelValues ...string)

// vec registers on reg the metric name, of type t and labelled by labels,
// whose series each sends through emit at every scrape.
func vec(reg prometheus.Registerer, name, help string, t prometheus.ValueType, labels []string, each func(emit emitFunc)) {
	reg.MustRegister(collectorFunc{desc: prometheus.NewDesc(name, help, labels, nil), t: t, each: each})
}

// collectorFunc is the collector of one metric that vec registers.
type collectorFunc struct {
	desc *prometheus.Desc
	t    prometheus.ValueType
	each func(emit emitFunc)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) {
	c.each(func(v float64, labelValues ...string) {
		ch <- prometheus.MustNewConstMetric(c.desc, c.t, v, labelValues...)
	})
}

// Serve serves /metrics from reg, /healthz (live: the process answers) and
// /readyz (ready reports nil) on addr until the returned server is shut
// down. It returns the address it listens on.
func Serve(addr string, reg *prometheus.Registry, ready func() error, log *slog.Logger) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return ServeProbe("--metrics-addr", addr, mux, log, "metrics server stopped")
}

// ServeProbe serves h on addr, the value of flag (which its error names),
// until the returned server is shut down; an end of serving for any other
// reason is logged as stopped. It returns the address it listens on. A
// probe's requests are small: a client gets 5s to send the headers.
func ServeProbe(flag, addr string, h http.Handler, log *slog.Logger, stopped string) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", flag, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(stopped, "error", err)
		}
	}()
	return srv, ln.Addr().String(), nil
}

// Shutdown stops srv, if any.
func Shutdown(ctx context.Context, srv *http.Server) error {
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}
