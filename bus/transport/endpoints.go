package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/service"
)

// ServiceName is the micro service name every limiter registers.
const ServiceName = "ratelimit"

// QueueGroup is the queue group of the check and batch endpoints in every
// region: a supercluster prefers local members and fails over to another
// region when a region has none.
const QueueGroup = "ratelimit"

// Version is the version a limiter reports in $SRV.INFO when its
// configuration names none: the commands pass the version they were built as.
const Version = "0.0.0-dev"

// LimiterConfig holds what Serve needs.
type LimiterConfig struct {
	// Service decides the checks. Required.
	Service *service.Service
	// Region is reported in the service metadata.
	Region string
	// Version is the micro service's version in $SRV.INFO, a semantic
	// version (micro refuses anything else, and so Serve does); empty: Version.
	Version string
	// Subjects holds the subject prefix; the zero value uses DefaultPrefix.
	Subjects wire.Subjects
	// Logger receives state changes; nil discards them.
	Logger *slog.Logger
	// CheckTimeout bounds a check that waits on the origin. Default 1s.
	CheckTimeout time.Duration
	// ObserveLatency, if set, receives how long checks took to answer: every
	// check answered from its own goroutine, and one in SampleEvery of those
	// answered inline (reading the clock twice on every inline check would
	// cost a measurable share of throughput). An inline check's time ends
	// when its reply is queued for the replier.
	ObserveLatency func(time.Duration)
	// SampleEvery is the inline sampling period of ObserveLatency. Default 64.
	SampleEvery int
	// Workers is how many goroutines answer checks messages (the checks
	// endpoint): its subscription's callback and Workers-1 helpers. A
	// message goes to a helper only when one is idle, and is otherwise
	// answered by the callback itself, so no message waits behind another
	// while a core is free. Default GOMAXPROCS.
	Workers int
	// PolicyLink, when set, carries the overrides the admin endpoints
	// accept to the region's bridge (a *link.Policy, started before Serve);
	// unset, they stay in this limiter's memory (a nil *link.Policy in it
	// is not unset).
	PolicyLink PolicyCarrier
	// MaxWaiting bounds the checks and batches that wait on the origin at
	// once, each in its own goroutine, shared fairly between workspaces
	// (door.Waiting): past its share, a check that would wait is decided
	// from local state at once (as while the origin fails), so a flood of
	// cold identifiers against a slow origin holds at most this many
	// goroutines and origin reads, no check waits longer than the read
	// timeout, and one workspace's flood leaves room for the others' checks.
	// Only checks that must wait count: those the lease or the local counts
	// decide (Service.TryCheck) never do. The gate is the one every door
	// passes (internal/door.Gate). Default DefaultMaxWaiting. Ignored when
	// Waiting is set.
	MaxWaiting int
	// Waiting, when set, is the bound this limiter shares with the other
	// doors of the process (its other instances, the Envoy rate limit
	// service), so that --max-waiting-checks bounds the process.
	Waiting *door.Waiting
}

// MaxMessageWaiting is how many of one checks message's identifiers wait on
// the origin at once: the others wait their turn within the message, so one
// message of a thousand cold identifiers takes at most this many of
// MaxWaiting's places.
const MaxMessageWaiting = 32

// DefaultMaxWaiting is the default LimiterConfig.MaxWaiting, every door's
// (door.DefaultMaxWaiting). With Redis answering in a millisecond, 50,000
// cold checks a second keep about 50 waiting; the cap only bites when Redis
// is slow, where it keeps the tail of every check's latency near the read
// timeout (docs/operations.md).
const DefaultMaxWaiting = door.DefaultMaxWaiting

// LimiterStats counts a limiter's answers since it started, both endpoints
// together.
type LimiterStats struct {
	Admitted, Denied int64
	BadRequests      int64 // 400
	InternalErrors   int64 // 500
	Unavailable      int64 // 503
	Batches          int64
	AsyncChecks      int64 // answered from their own goroutine
	// NotWaited counts checks and batches that would have waited on the
	// origin but were decided locally because MaxWaiting were waiting.
	NotWaited int64
}

// EndpointStats counts one endpoint's answers since the limiter started:
// the data $SRV.STATS reports under that endpoint (check or batch), in
// snake_case keys. A request counts under the endpoint that received it
// only, so the endpoints' figures add up to the instance's.
type EndpointStats struct {
	// Admitted and Denied count decisions (a batch is one decision).
	Admitted int64 `json:"admitted"`
	Denied   int64 `json:"denied"`
	// BadRequests, InternalErrors and Unavailable count error replies with
	// code 400, 500 and 503.
	BadRequests    int64 `json:"bad_requests"`
	InternalErrors int64 `json:"internal_errors"`
	Unavailable    int64 `json:"unavailable"`
	// Waited counts requests answered from their own goroutine, where they
	// may wait on the origin: checks whose cells were cold, stale or strict,
	// and every batch not decided at once.
	Waited int64 `json:"waited"`
	// NotWaited counts requests that would have waited but were decided
	// locally at once because MaxWaiting were waiting.
	NotWaited int64 `json:"not_waited"`
}

// endpointCounters holds one endpoint's counters.
type endpointCounters struct {
	admitted, denied, bad, internal, unavailable, waited, notWaited atomic.Int64
}

func (c *endpointCounters) stats() EndpointStats {
	return EndpointStats{Admitted: c.admitted.Load(), Denied: c.denied.Load(), BadRequests: c.bad.Load(),
		InternalErrors: c.internal.Load(), Unavailable: c.unavailable.Load(), Waited: c.waited.Load(),
		NotWaited: c.notWaited.Load()}
}

// count records a decision's outcome.
func (c *endpointCounters) count(admitted bool) {
	if admitted {
		c.admitted.Add(1)
	} else {
		c.denied.Add(1)
	}
}

// failed records an error reply of code 400, 503 or (any other) 500.
func (c *endpointCounters) failed(code int) {
	switch code {
	case 400:
		c.bad.Add(1)
	case 503:
		c.unavailable.Add(1)
	default:
		c.internal.Add(1)
	}
}

// Limiter is the NATS side of one limiter process: the micro service
// "ratelimit" with endpoints check, batch and checks (many independent
// checks in one message; checks.go). HTTPHandler serves the same endpoints
// over HTTP (http.go).
//
// Checks that can be decided from warm, fresh local state are answered
// inline by the endpoint's subscription; checks that must wait on the origin
// (cold, stale or strict cells) and batches are answered from their own
// goroutine, so one slow check never holds up checks of other identifiers.
type Limiter struct {
	cfg         LimiterConfig
	httpRefused httpRefusals // the HTTP door's own refusals (http.go)
	nc          *nats.Conn
	svc         micro.Service
	log         *slog.Logger
	closing     atomic.Bool
	// mu orders starting an asynchronous check against Shutdown's wait, so no
	// goroutine starts after the wait has begun.
	mu    sync.Mutex
	async sync.WaitGroup
	// checkPrefix is "<prefix>.check.", computed once for the hot path.
	checkPrefix string
	sampled     int // inline checks since the last latency sample; callback goroutine only
	// sampledShared counts the HTTP door's inline checks for the latency
	// sample, from any goroutine.
	sampledShared atomic.Int64
	// lastSubject, lastWS and lastNS remember the last valid check subject
	// and its tokens: clients tend to send runs of checks on one subject.
	// Callback goroutine only.
	lastSubject, lastWS, lastNS string

	// checks, batches and checksEP count the answers of the check, the
	// batch and the checks endpoint.
	checks, batches, checksEP endpointCounters
	// admin counts the policy endpoints' answers; adminSvc is their
	// service (admin.go).
	admin    adminCounters
	adminSvc micro.Service
	// hooks is nil but in the package's tests, which watch and pace the
	// checks endpoint through it (checks.go).
	hooks checksHooks
	// gate bounds the checks and batches running in their own goroutine.
	gate *door.Gate
	// replies publishes the check endpoint's inline replies.
	replies *replier
	// work hands checks messages to idle helpers (checks.go).
	work        chan micro.Request
	stopWork    chan struct{}
	idleHelpers atomic.Int32 // helpers waiting for a message
	stopOnce    sync.Once
	workersDone sync.WaitGroup
}

// Stats returns the limiter's counters, every endpoint together (a check
// of a checks message counts as a check).
func (l *Limiter) Stats() LimiterStats {
	c, b, m := l.checks.stats(), l.batches.stats(), l.checksEP.stats()
	return LimiterStats{Admitted: c.Admitted + b.Admitted + m.Admitted, Denied: c.Denied + b.Denied + m.Denied,
		BadRequests: c.BadRequests + b.BadRequests + m.BadRequests, InternalErrors: c.InternalErrors + b.InternalErrors + m.InternalErrors,
		Unavailable: c.Unavailable + b.Unavailable + m.Unavailable, Batches: b.Admitted + b.Denied,
		AsyncChecks: c.Waited + m.Waited, NotWaited: c.NotWaited + b.NotWaited + m.NotWaited}
}

// EndpointStats returns the counters of the endpoint "check", "batch" or
// "checks", and false for any other name. The checks endpoint counts each
// check of a message (decisions, 400 and 503 results) and each message
// refused as a whole.
func (l *Limiter) EndpointStats(endpoint string) (EndpointStats, bool) {
	switch endpoint {
	case "check":
		return l.checks.stats(), true
	case "batch":
		return l.batches.stats(), true
	case "checks":
		return l.checksEP.stats(), true
	}
	return EndpointStats{}, false
}

// Serve registers the limiter's micro service on nc and starts answering.
func Serve(nc *nats.Conn, cfg LimiterConfig) (*Limiter, error) {
	if cfg.Service == nil {
		return nil, errors.New("bus: LimiterConfig.Service is required")
	}
	if cfg.Subjects.Prefix != "" {
		if err := wire.CheckPrefix(cfg.Subjects.Prefix); err != nil {
			return nil, fmt.Errorf("bus: %w", err)
		}
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = 64
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.Version == "" {
		cfg.Version = Version
	}
	l := &Limiter{cfg: cfg, nc: nc, log: cfg.Logger, gate: door.NewGate(cfg.Service, cfg.Waiting, cfg.MaxWaiting),
		checkPrefix: cfg.Subjects.Base() + ".check."}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.replies = startReplier(nc.Publish, l.log)
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     cfg.Version,
		Description: "Sluice rate limiter: sliding-window checks from local memory",
		QueueGroup:  QueueGroup,
		Metadata:    map[string]string{"region": cfg.Region},
		// $SRV.STATS carries each endpoint's own answers in its data; the
		// process-wide counters (cells, replays, origin), which every
		// instance of a process shares, are in /metrics.
		StatsHandler: func(e *micro.Endpoint) any {
			if st, ok := l.EndpointStats(e.Name); ok {
				return st
			}
			return nil
		},
	})
	if err != nil {
		_ = l.replies.close(context.Background())
		return nil, fmt.Errorf("bus: add micro service: %w", err)
	}
	l.startWorkers()
	abort := func(err error) (*Limiter, error) {
		_ = svc.Stop()
		l.stopWorkers()
		_ = l.replies.close(context.Background())
		return nil, err
	}
	for _, ep := range []struct {
		name, subject, shown string
		handle               micro.HandlerFunc
	}{
		{"check", cfg.Subjects.CheckWildcard(), cfg.Subjects.Check("<workspace>", "<namespace>"), l.handleCheck},
		{"batch", cfg.Subjects.BatchWildcard(), cfg.Subjects.Batch("<workspace>"), l.handleBatch},
		{"checks", cfg.Subjects.ChecksWildcard(), cfg.Subjects.Checks("<workspace>"), l.handleChecksMsg},
	} {
		if err := svc.AddEndpoint(ep.name, ep.handle, micro.WithEndpointSubject(ep.subject),
			micro.WithEndpointMetadata(map[string]string{"subject": ep.shown})); err != nil {
			return abort(fmt.Errorf("bus: add %s endpoint: %w", ep.name, err))
		}
	}
	adminSvc, err := l.addAdmin()
	if err != nil {
		return abort(err)
	}
	l.svc, l.adminSvc = svc, adminSvc
	return l, nil
}

// Info returns the micro service's identity and endpoints.
func (l *Limiter) Info() micro.Info { return l.svc.Info() }

// Shutdown stops taking requests: what still arrives is answered 503, the
// endpoints' subscriptions are drained, replies already decided are handed
// to the connection, and checks in flight are finished (until ctx ends). It
// does not close the Service or the connection; the caller does that
// afterwards, draining the connection so that every reply reaches NATS.
func (l *Limiter) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.closing.Store(true)
	l.mu.Unlock()
	err := errors.Join(l.svc.Stop(), l.adminSvc.Stop())
	l.stopWorkers()
	if rerr := l.replies.close(ctx); rerr != nil {
		err = errors.Join(err, fmt.Errorf("bus: %w", rerr))
	}
	done := make(chan struct{})
	go func() { l.async.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("bus: checks still in flight: %w", ctx.Err()))
	}
	return err
}

// handleCheck answers one check: the check endpoint's callback.
func (l *Limiter) handleCheck(req micro.Request) { l.check(req, true) }

// check answers one check, on the check endpoint's callback or, when not
// onCallback, on a goroutine of the HTTP door (http.go), which must not
// touch what only the callback may (the last subject, the inline sample).
func (l *Limiter) check(req micro.Request, onCallback bool) {
	ec := &l.checks
	enc, ws, ns, ok := l.open(ec, req, routeCheck, onCallback, false)
	if !ok {
		return
	}
	var cr wire.CheckRequest
	if err := wire.DecodeCheckRequestView(enc, req.Data(), &cr); err != nil {
		l.fail(ec, req, enc, 400, err.Error(), false)
		return
	}
	q := queryOf(ws, ns, &cr)
	var start time.Time
	if l.cfg.ObserveLatency != nil && l.sample(onCallback) {
		start = time.Now()
	}
	d, ok, err := l.cfg.Service.TryCheck(q)
	if ok {
		if l.replyInline(ec, req, enc, d, err) && !start.IsZero() {
			l.cfg.ObserveLatency(time.Since(start))
		}
		return
	}
	began := time.Now()
	l.decideAsync(ec, req, enc, ws, func() {
		d, err := l.cfg.Service.CheckLocal(q)
		l.replyInline(ec, req, enc, d, err)
	}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.CheckTimeout)
		defer cancel()
		d, err := l.cfg.Service.Check(ctx, q)
		if err != nil {
			l.failService(ec, req, enc, err, true)
			return
		}
		ec.count(d.Reply().Success)
		l.respond(req, wire.AppendCheckResponse(make([]byte, 0, 64), enc, checkResponse(d)))
		if l.cfg.ObserveLatency != nil {
			l.cfg.ObserveLatency(time.Since(began))
		}
	})
}

// decideAsync decides a check or batch of workspace ws that must wait on
// the origin: wait runs on a goroutine of its own, holding a waiting place
// (counted as waited in ec); without a place for ws, local decides it at
// once from local state (counted as not waited); once shutdown began, it
// is answered 503.
func (l *Limiter) decideAsync(ec *endpointCounters, req micro.Request, enc wire.Encoding, ws string, local, wait func()) {
	switch l.startAsync(ws) {
	case asyncClosing:
		l.fail(ec, req, enc, 503, door.ShuttingDown, false)
	case asyncFull:
		ec.notWaited.Add(1)
		local()
	default:
		ec.waited.Add(1)
		go func() {
			defer l.endAsync(ws)
			wait()
		}()
	}
}

// open reads what every endpoint reads before the body: its encoding,
// whether shutdown has begun, and the workspace (and a check's namespace)
// of the subject of route. A request that fails one is answered here, 400
// or 503, counted in ec, and ok is false; direct as for fail. onCallback
// is parseCheck's.
func (l *Limiter) open(ec *endpointCounters, req micro.Request, route int, onCallback, direct bool) (enc wire.Encoding, ws, ns string, ok bool) {
	enc, err := requestEncoding(req)
	if err == nil && l.closing.Load() {
		l.fail(ec, req, enc, 503, door.ShuttingDown, direct)
		return enc, "", "", false
	}
	if err == nil {
		switch route {
		case routeCheck:
			ws, ns, err = l.parseCheck(req.Subject(), onCallback)
		case routeBatch:
			ws, err = l.cfg.Subjects.ParseBatch(req.Subject())
		default:
			ws, err = l.cfg.Subjects.ParseChecks(req.Subject())
		}
	}
	if err != nil {
		l.fail(ec, req, enc, 400, err.Error(), direct)
		return enc, "", "", false
	}
	return enc, ws, ns, true
}

// parseCheck returns the tokens of a check subject. On the check
// endpoint's callback (onCallback) it keeps the last subject, which only
// the callback reads.
func (l *Limiter) parseCheck(subject string, onCallback bool) (workspace, namespace string, err error) {
	if onCallback && subject == l.lastSubject {
		return l.lastWS, l.lastNS, nil
	}
	if rest, ok := strings.CutPrefix(subject, l.checkPrefix); ok {
		workspace, namespace, err = wire.ParseCheckTokens(rest)
	} else {
		workspace, namespace, err = l.cfg.Subjects.ParseCheck(subject)
	}
	if err == nil && onCallback {
		l.lastSubject, l.lastWS, l.lastNS = subject, workspace, namespace
	}
	return workspace, namespace, err
}

// sample reports whether the latency of this inline check is observed: one
// in SampleEvery, counted apart on the callback (onCallback) and on the
// HTTP door's goroutines.
func (l *Limiter) sample(onCallback bool) bool {
	if !onCallback {
		return l.sampledShared.Add(1)%int64(l.cfg.SampleEvery) == 0
	}
	if l.sampled++; l.sampled >= l.cfg.SampleEvery {
		l.sampled = 0
		return true
	}
	return false
}

// replyInline answers a check decided on the goroutine that received it,
// d or the service's error err, and counts it in ec: over NATS through the
// replier, to the HTTP door at once. It reports whether d was answered.
func (l *Limiter) replyInline(ec *endpointCounters, req micro.Request, enc wire.Encoding, d service.Decision, err error) bool {
	if err != nil {
		l.failService(ec, req, enc, err, false)
		return false
	}
	ec.count(d.Reply().Success)
	if h, ok := req.(*httpRequest); ok {
		h.answer(200, nil, wire.AppendCheckResponse(make([]byte, 0, 96), enc, checkResponse(d)))
	} else if reply := req.Reply(); reply != "" {
		l.replies.add(reply, enc, checkResponse(d))
	}
	return true
}

// handleBatch answers one batch check, from its own goroutine.
func (l *Limiter) handleBatch(req micro.Request) {
	ec := &l.batches
	enc, ws, _, ok := l.open(ec, req, routeBatch, true, false)
	if !ok {
		return
	}
	br, err := wire.DecodeBatchRequest(enc, req.Data())
	if err != nil {
		l.fail(ec, req, enc, 400, err.Error(), false)
		return
	}
	qs := make([]service.Query, len(br.Checks))
	for i := range br.Checks {
		qs[i] = queryOf(ws, br.Checks[i].Namespace, &br.Checks[i].CheckRequest)
	}
	l.decideAsync(ec, req, enc, ws, func() {
		// Decide at once, in this goroutine: a batch never waits here.
		l.answerBatch(req, enc, qs, func(_ context.Context, qs []service.Query) (bool, []service.Decision, error) {
			return l.cfg.Service.BatchLocal(qs)
		}, false)
	}, func() { l.answerBatch(req, enc, qs, l.cfg.Service.Batch, true) })
}

// answerBatch decides a batch with decide and answers it, an error with
// failService (direct off the endpoint's callback).
func (l *Limiter) answerBatch(req micro.Request, enc wire.Encoding, qs []service.Query,
	decide func(context.Context, []service.Query) (bool, []service.Decision, error), direct bool) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.CheckTimeout)
	defer cancel()
	ok, ds, err := decide(ctx, qs)
	if err != nil {
		l.failService(&l.batches, req, enc, err, direct)
		return
	}
	resp := batchResponse(ok, ds)
	l.batches.count(resp.Success)
	l.respond(req, wire.AppendBatchResponse(nil, enc, resp))
}

// batchResponse answers a batch that Service.Batch decided ok, ds. Shadow
// mode changes the reply only: when every check that enforcement denied on
// its own is in shadow mode, the batch, refused and counted as enforcement
// refuses it, answers success, and each of its checks that the refusal
// denied answers success with shadow_denied (docs/architecture.md,
// "Shadow mode").
func batchResponse(ok bool, ds []service.Decision) wire.BatchResponse {
	resp := wire.BatchResponse{Success: ok, Results: make([]wire.CheckResponse, len(ds))}
	shadowOnly := !ok
	for _, d := range ds {
		// A denial on its own carries its wait; one the refusal of the
		// others denied has none.
		if !d.Admitted && d.RetryAfter != 0 && !d.Shadow {
			shadowOnly = false
		}
	}
	for i, d := range ds {
		if shadowOnly {
			d.Shadow = true
		}
		resp.Results[i] = checkResponse(d)
	}
	if shadowOnly {
		resp.Success = true
	}
	return resp
}

// The outcomes of startAsync.
const (
	asyncStarted = iota
	asyncClosing // shutdown has begun
	asyncFull    // workspace ws holds its share of MaxWaiting, or all are taken
)

// startAsync counts a check or batch of workspace ws that will answer from
// its own goroutine, unless shutdown has begun or the waiting bound has no
// place for ws.
func (l *Limiter) startAsync(ws string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing.Load() {
		return asyncClosing
	}
	if !l.gate.Enter(ws) {
		return asyncFull
	}
	l.async.Add(1)
	return asyncStarted
}

// endAsync ends what startAsync began for ws.
func (l *Limiter) endAsync(ws string) {
	l.gate.Leave(ws)
	l.async.Done()
}

// respond publishes a successful reply from a check's or batch's own
// goroutine. It publishes on the connection directly rather than through
// micro's Respond, which allocates a message per reply; micro still counts
// the request in its stats. A request of the HTTP door takes the reply
// itself.
func (l *Limiter) respond(req micro.Request, body []byte) {
	if h, ok := req.(*httpRequest); ok { // the HTTP door: body may be reused once this returns
		h.answer(200, nil, bytes.Clone(body))
		return
	}
	reply := req.Reply()
	if reply == "" {
		return // a request nobody waits for
	}
	if err := l.nc.Publish(reply, body); err != nil {
		l.log.Debug("respond failed", "subject", req.Subject(), "error", err)
	}
}

// failService answers an error from the service as door.ServiceFailure
// says (400 the query's fault, 503 shutting down, 500 internal, logged),
// and counts it in ec; direct as for fail.
func (l *Limiter) failService(ec *endpointCounters, req micro.Request, enc wire.Encoding, err error, direct bool) {
	f := l.serviceFailure(req, err)
	l.fail(ec, req, enc, f.Code, f.Msg, direct)
}

// serviceFailure is door.ServiceFailure, logging an internal error (500)
// of a request on subject req.Subject().
func (l *Limiter) serviceFailure(req micro.Request, err error) door.Failure {
	f := door.ServiceFailure(err)
	if f.Code == 500 {
		l.log.Error("check failed", "subject", req.Subject(), "error", err)
	}
	return f
}

// failCounter counts an endpoint's error replies by code.
type failCounter interface{ failed(code int) }

// fail answers a micro service error, code and msg with a body in the
// request's encoding, and counts it in ec. With direct, on a goroutine
// other than the endpoint's callback, a NATS request's error reply
// (headers Nats-Service-Error-Code and Nats-Service-Error) is published
// here rather than through req.Error, whose record micro reads once the
// callback has returned; a request of the HTTP door takes its answer from
// any goroutine.
func (l *Limiter) fail(ec failCounter, req micro.Request, enc wire.Encoding, code int, msg string, direct bool) {
	ec.failed(code)
	body := wire.AppendError(nil, enc, msg)
	var err error
	if _, isHTTP := req.(*httpRequest); !direct || isHTTP {
		err = req.Error(strconv.Itoa(code), msg, body)
	} else if reply := req.Reply(); reply != "" {
		err = l.nc.PublishMsg(&nats.Msg{Subject: reply, Data: body, Header: nats.Header{
			micro.ErrorHeader: []string{msg}, micro.ErrorCodeHeader: []string{strconv.Itoa(code)}}})
	}
	if err != nil {
		l.log.Debug("error reply failed", "subject", req.Subject(), "error", err)
	}
}

// requestEncoding detects the body encoding from the Content-Type header
// (matched case-insensitively) or the body itself. On error it returns JSON,
// the encoding of the error reply.
func requestEncoding(req micro.Request) (wire.Encoding, error) {
	h := req.Headers()
	if len(h) == 0 { // the common case: detect from the body
		if body := req.Data(); len(body) > 0 && body[0] != '{' && body[0] > ' ' {
			return wire.Msgpack, nil
		}
		return wire.DetectEncoding("", req.Data())
	}
	ct := h.Get("Content-Type")
	if ct == "" {
		for k, v := range h {
			if strings.EqualFold(k, "Content-Type") && len(v) > 0 {
				ct = v[0]
				break
			}
		}
	}
	enc, err := wire.DetectEncoding(ct, req.Data())
	if err != nil {
		return wire.JSON, err
	}
	return enc, nil
}

// queryOf is the service's query of check c of namespace ns in workspace
// ws.
func queryOf(ws, ns string, c *wire.CheckRequest) service.Query {
	return service.Query{Workspace: ws, Namespace: ns, Identifier: c.Identifier,
		Limit: c.Limit, Duration: c.Duration, Cost: c.Cost, Shadow: c.Shadow, Fixed: c.Fixed, Charge: c.Charge}
}

func checkResponse(d service.Decision) wire.CheckResponse {
	r := d.Reply()
	return wire.CheckResponse{Success: r.Success, Limit: d.Limit, Remaining: d.Remaining, Reset: d.Reset,
		RetryAfter: r.RetryAfter, ShadowDenied: r.ShadowDenied, Override: d.Override}
}
