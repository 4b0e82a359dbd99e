package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// ServerConfig holds what a Server needs; zero fields take the documented
// defaults.
type ServerConfig struct {
	// Service is the limiter's cell table. Required.
	Service *service.Service
	// Workspace is the workspace of every cell the server checks. Default
	// DefaultWorkspace.
	Workspace string
	// Metrics counts decisions per domain and descriptor. Nil counts
	// nothing.
	Metrics *Metrics
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset of the descriptor closest to its limit (or over it)
	// to every response that has a limit, as envoyproxy/ratelimit does with
	// LIMIT_RESPONSE_HEADERS_ENABLED.
	ResponseHeaders bool
	// CheckTimeout bounds how long a call waits on the origin when its
	// caller set no deadline. Default 1s. With a deadline the call decides
	// by half the time left, so the answer arrives in time.
	CheckTimeout time.Duration
	// MaxWaiting bounds the calls waiting on the origin at once, shared
	// fairly between domains (service.Waiting); past a domain's share a
	// call decides from local state at once. Only calls that must wait
	// count: a descriptor the lease or the local counts decide
	// (Service.TryCheck) never takes a place. The gate is the one every
	// door passes (internal/door.Gate). Default 1024; ignored when Waiting
	// is set.
	MaxWaiting int
	// Waiting, when set, is the bound the server shares with the other
	// doors of the process (the NATS endpoints).
	Waiting *service.Waiting
	// NearLimitRatio is the share of a limit past which admissions count
	// as near the limit in the metrics. Default 0.8.
	NearLimitRatio float64
}

// DefaultWorkspace is the default ServerConfig.Workspace.
const DefaultWorkspace = "envoy"

// Header names added with ServerConfig.ResponseHeaders.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// Server answers ShouldRateLimit from a service.Service. It is safe for
// simultaneous use; SetConfig swaps the configuration atomically, and a
// call uses one configuration throughout.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg  ServerConfig
	conf atomic.Pointer[Config]
	gate *door.Gate
}

// NewServer returns a Server answering from conf (nil: every domain is
// unknown until SetConfig).
func NewServer(cfg ServerConfig, conf *Config) (*Server, error) {
	if cfg.Service == nil {
		return nil, errors.New("rls: ServerConfig.Service is required")
	}
	if cfg.Workspace == "" {
		cfg.Workspace = DefaultWorkspace
	}
	if !window.ValidToken(cfg.Workspace) {
		return nil, fmt.Errorf("rls: %w", window.TokenError("workspace", cfg.Workspace))
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	if cfg.NearLimitRatio <= 0 || cfg.NearLimitRatio > 1 {
		cfg.NearLimitRatio = 0.8
	}
	s := &Server{cfg: cfg, gate: door.NewGate(cfg.Service, cfg.Waiting, cfg.MaxWaiting)}
	s.conf.Store(conf)
	return s, nil
}

// SetConfig makes conf the configuration of calls that start after it.
func (s *Server) SetConfig(conf *Config) { s.conf.Store(conf) }

// Config returns the configuration in use.
func (s *Server) Config() *Config { return s.conf.Load() }

// kind is what applies to one descriptor.
type kind uint8

const (
	none      kind = iota // no limit: unknown domain, no match, replaced
	unlimited             // an unlimited rate_limit
	enforced              // a limit whose denial fails the request
	soft                  // shadow_mode or quota_mode: decided apart
)

// item is one descriptor of a request and its limit.
type item struct {
	kind    kind
	limit   *Limit // nil for an override
	current *rlsv3.RateLimitResponse_RateLimit
	q       service.Query
	d       window.Decision
	over    bool
	labels  metricLabels
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// ShouldRateLimit decides a request: each descriptor is matched to a limit
// (or its own override), and the enforced limits are decided together, all
// or nothing: when any is over its limit, none is counted. Shadow-mode and
// quota-mode limits are decided after them, each on its own, and counted
// only when the enforced ones were admitted. Statuses follow the request's
// descriptors in order.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.request(resp, err)
	}
	return resp, err
}

func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, invalid("rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, invalid("rate limit descriptor list must not be empty")
	}
	conf := s.conf.Load()
	domain := req.GetDomain()
	known := conf.Known(domain)
	items := make([]item, len(descs))
	var replaced map[string]bool
	var buf []byte
	var entries []Entry
	for i, d := range descs {
		it := &items[i]
		var cost uint64
		if h := d.GetHitsAddend(); h != nil {
			cost = h.GetValue()
		} else {
			cost = max(1, uint64(req.GetHitsAddend()))
		}
		if !known || len(d.GetEntries()) == 0 {
			continue
		}
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		var shared []string
		if o := d.GetLimit(); o != nil {
			if err := it.override(i, o, domain, entries); err != nil {
				return nil, err
			}
		} else {
			m := conf.Match(domain, entries)
			if m.Limit == nil {
				continue
			}
			shared = m.Shared
			it.limit = m.Limit
			for _, r := range m.Limit.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
			it.labels = labelsOf(m.Limit, domain, entries)
			if m.Limit.Unlimited {
				it.kind = unlimited
				continue
			}
			it.kind = enforced
			if m.Limit.ShadowMode || m.Limit.QuotaMode {
				it.kind = soft
			}
			it.current = &rlsv3.RateLimitResponse_RateLimit{Name: m.Limit.Name, RequestsPerUnit: m.Limit.RequestsPerUnit,
				Unit: rlsv3.RateLimitResponse_RateLimit_Unit(m.Limit.Unit)}
			it.q.Limit = int64(m.Limit.RequestsPerUnit)
			it.q.Duration = m.Limit.Unit.Millis()
		}
		// Only a descriptor with a limit is held to the bounds of a check.
		if cost > window.MaxCost {
			return nil, invalid("descriptor %d: hits_addend %d is over %d", i, cost, uint64(window.MaxCost))
		}
		if d.GetIsNegativeHits() {
			return nil, invalid("descriptor %d: is_negative_hits is not supported: Sluice never takes back what it counted", i)
		}
		it.q.Workspace = s.cfg.Workspace
		it.q.Namespace, it.q.Identifier, buf = cellName(domain, entries, shared, buf)
		it.q.Cost = int64(cost)
	}
	// Replaced limits drop out; an unlimited one stays unlimited (as upstream).
	for i := range items {
		if l := items[i].limit; l != nil && l.Name != "" && replaced[l.Name] && items[i].kind != unlimited {
			items[i].kind = none
		}
	}

	// The context a decision may wait within, made only when one waits.
	var cancel context.CancelFunc
	waitCtx := func() context.Context {
		if cancel == nil {
			ctx, cancel = s.deadline(ctx)
		}
		return ctx
	}
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()
	// A decision takes a waiting place only when it must wait on the
	// origin; with none free for the domain, it is decided locally.
	check := func(q service.Query) (window.Decision, error) {
		d, _, err := s.gate.Check(waitCtx, domain, q)
		return d.Decision, err
	}

	// The enforced limits, all or nothing.
	var qs []service.Query
	var idx []int
	for i := range items {
		if items[i].kind == enforced {
			qs = append(qs, items[i].q)
			idx = append(idx, i)
		}
	}
	admitted := true
	switch len(qs) {
	case 0:
	case 1:
		d, err := check(qs[0])
		if err != nil {
			return nil, serviceError(err)
		}
		items[idx[0]].d, admitted = d, d.Admitted
		items[idx[0]].over = !d.Admitted
	default:
		ok, ds, _, err := s.gate.Batch(waitCtx, domain, qs)
		if err != nil {
			return nil, serviceError(err)
		}
		admitted = ok
		anyOver := false
		for j, i := range idx {
			items[i].d = ds[j].Decision
			// In a refused batch, a limit that would have fit on its own
			// has RetryAfter 0: it is not over; nothing was counted.
			items[i].over = !ok && (ds[j].RetryAfter != 0 || qs[j].Cost > ds[j].Remaining)
			anyOver = anyOver || items[i].over
		}
		if !ok && !anyOver { // cannot happen by Batch's contract; never answer OK for a refused batch
			items[idx[0]].over = true
		}
	}

	// Shadow and quota limits: counted only when the request is admitted.
	for i := range items {
		it := &items[i]
		if it.kind != soft {
			continue
		}
		q := it.q
		if !admitted {
			q.Cost = 0
		}
		d, err := check(q)
		if err != nil {
			return nil, serviceError(err)
		}
		it.d, it.over = d, !d.Admitted
	}

	return s.respond(items), nil
}

// override makes it the limit Envoy sent with the descriptor.
func (it *item) override(i int, o *rlv3.RateLimitDescriptor_RateLimitOverride, domain string, entries []Entry) error {
	u := Unit(o.GetUnit())
	ms := u.Millis()
	if ms == 0 || u == Week {
		return invalid("descriptor %d: limit override has unit %s (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", i, o.GetUnit())
	}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = int64(m.GetValue())
	}
	if mult < 1 || ms*mult > window.MaxDuration {
		return invalid("descriptor %d: limit override of %d × %s is not 1 second to 366 days", i, mult, o.GetUnit())
	}
	it.kind = enforced
	it.current = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(),
		Unit: rlsv3.RateLimitResponse_RateLimit_Unit(u)}
	if mult > 1 {
		it.current.UnitMultiplier = wrapperspb.UInt32(uint32(mult))
	}
	it.q.Limit = int64(o.GetRequestsPerUnit())
	it.q.Duration = ms * mult
	it.labels = overrideLabels(domain, entries)
	return nil
}

// deadline returns the context a call decides within: three quarters of
// the caller's time left, or CheckTimeout without a deadline.
func (s *Server) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		return context.WithTimeout(ctx, left/2)
	}
	return context.WithTimeout(ctx, s.cfg.CheckTimeout)
}

// serviceError is the gRPC status of an error of the service, as
// door.ServiceFailure classes it. Envoy's callers are operators' proxies:
// a 400 or a 500 carries the error's own text, for their logs.
func serviceError(err error) error {
	switch door.ServiceFailure(err).Code {
	case 400:
		return status.Error(codes.InvalidArgument, err.Error())
	case 503:
		return status.Error(codes.Unavailable, door.ShuttingDown)
	}
	return status.Error(codes.Internal, err.Error())
}

// respond builds the response of decided items and counts them.
func (s *Server) respond(items []item) *rlsv3.RateLimitResponse {
	nowMs := s.cfg.Service.Now().UnixMilli()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	closestRemaining := uint32(math.MaxUint32)
	quotas, quotasOver := 0, 0
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch it.kind {
		case none:
			continue
		case unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		st.CurrentLimit = it.current
		st.LimitRemaining = uint32(min(it.d.Remaining, math.MaxUint32))
		untilReset := it.d.Reset - nowMs
		if it.over && it.d.RetryAfter > 0 {
			untilReset = it.d.RetryAfter
		}
		st.DurationUntilReset = durationpb.New(time.Duration(max(untilReset, 0)) * time.Millisecond)
		shadow := it.limit != nil && it.limit.ShadowMode
		quota := it.limit != nil && it.limit.QuotaMode
		if it.over {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if shadow {
				st.Code = rlsv3.RateLimitResponse_OK
			}
		}
		if quota {
			quotas++
			if it.over {
				quotasOver++
			}
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !quota {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			closest, closestRemaining = st, 0
		} else if st.LimitRemaining < closestRemaining || closest == nil {
			closest, closestRemaining = st, st.LimitRemaining
		}
		if m := s.cfg.Metrics; m != nil {
			m.decision(it, shadow, s.cfg.NearLimitRatio)
		}
	}
	if quotas > 0 && quotas == quotasOver {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.cfg.ResponseHeaders && closest != nil {
		reset := (closest.GetDurationUntilReset().AsDuration() + time.Second - 1) / time.Second
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: HeaderLimit, Value: strconv.FormatUint(uint64(closest.CurrentLimit.GetRequestsPerUnit()), 10)},
			{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: HeaderReset, Value: strconv.FormatInt(int64(reset), 10)},
		}
	}
	return resp
}
