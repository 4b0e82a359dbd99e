package rls

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
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
	// Metrics counts decisions per domain and descriptor. Nil: none.
	Metrics *Metrics
	// Charge is how limits whose YAML names no charge charge their hits:
	// window.ChargeAll (the default: a request over any limit counts
	// nothing), window.ChargeDebit (every hit counted, over the limit too,
	// as envoyproxy/ratelimit does, for costs sent once a response is done)
	// or window.ChargeDrain. A limit that debits or drains is charged on its
	// own, before the all-or-nothing ones.
	Charge window.Charge
	// Windows is the kind of window of limits whose YAML names none, and of
	// Envoy's limit overrides: Sliding (the default), Fixed, or Calendar (of
	// Zone), where a limit of one unit from minute to year counts in that
	// calendar period, and any other in a fixed window aligned to the epoch.
	Windows Window
	// Zone is the IANA time zone of the calendar when Windows is Calendar
	// ("" is UTC); NewServer refuses an unknown zone, or one with another kind.
	Zone string
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset of the descriptor closest to its limit (or over it)
	// to every response that has a limit, as envoyproxy/ratelimit does with
	// LIMIT_RESPONSE_HEADERS_ENABLED.
	ResponseHeaders bool
	// CheckTimeout bounds how long a call without a deadline waits on the
	// origin. Default 1s. With one, it decides by half the time left, so
	// the answer arrives in time.
	CheckTimeout time.Duration
	// MaxWaiting bounds the calls waiting on the origin at once, shared
	// fairly between domains (door.Waiting, internal/door.Gate): past
	// its share a call decides from local state, and one decided without
	// waiting (Service.TryCheck) takes no place. Default 1024; ignored when
	// Waiting is set.
	MaxWaiting int
	// Waiting, when set, is the bound the server shares with the other
	// doors of the process (the NATS endpoints).
	Waiting *door.Waiting
	// NearLimitRatio is the share of a limit past which admissions count
	// as near the limit in the metrics. Default 0.8.
	NearLimitRatio float64
	// MaxDescriptors bounds the descriptors of one call (Envoy sends one per
	// rate_limits entry that applies): a call with more is refused with
	// INVALID_ARGUMENT before anything is counted. Default DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor (Envoy sends one per
	// action of the rate_limits entry), refused as MaxDescriptors is.
	// Default DefaultMaxEntries.
	MaxEntries int
	// ReadyWithoutDomains makes the server ready (Ready, and NewGRPC's
	// health) with a configuration of no domain, which answers OK to every
	// call. By default it is not, as envoyproxy/ratelimit with
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
	ReadyWithoutDomains bool
}

// DefaultWorkspace is the default ServerConfig.Workspace.
const DefaultWorkspace = "envoy"

// The default bounds of a call (ServerConfig.MaxDescriptors, MaxEntries).
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 64
)

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
	// calendars holds, by Unit, the code of its calendar period in cfg.Zone
	// when cfg.Windows is Calendar; 0 where there is none.
	calendars [Week + 1]int64
	gate      *door.Gate

	mu       sync.Mutex         // orders SetConfig's notices
	watchers []func(ready bool) // told of readiness at every SetConfig
}

// NewServer returns a Server answering from conf (nil: no domain until
// SetConfig).
func NewServer(cfg ServerConfig, conf *Config) (*Server, error) {
	if cfg.Service == nil {
		return nil, errors.New("rls: ServerConfig.Service is required")
	}
	cfg.Workspace = cmp.Or(cfg.Workspace, DefaultWorkspace)
	if !window.ValidToken(cfg.Workspace) {
		return nil, fmt.Errorf("rls: %w", window.TokenError("workspace", cfg.Workspace))
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	if cfg.NearLimitRatio <= 0 || cfg.NearLimitRatio > 1 {
		cfg.NearLimitRatio = 0.8
	}
	if cfg.MaxDescriptors <= 0 {
		cfg.MaxDescriptors = DefaultMaxDescriptors
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	s := &Server{cfg: cfg, gate: door.NewGate(cfg.Service, cfg.Waiting, cfg.MaxWaiting)}
	switch {
	case cfg.Windows == Calendar:
		if _, err := window.Calendar(window.Day, cfg.Zone); err != nil {
			return nil, fmt.Errorf("rls: ServerConfig.Zone: %w", err)
		}
		for u := range s.calendars {
			if code, err := calendarCode(Unit(u), cfg.Zone); err == nil {
				s.calendars[u] = code
			}
		}
	case cfg.Zone != "":
		return nil, fmt.Errorf("rls: ServerConfig.Zone %q needs Windows Calendar", cfg.Zone)
	}
	s.SetConfig(conf)
	return s, nil
}

// SetConfig makes conf the configuration of calls that start after it,
// and the readiness of the server and the metric of its domains
// (sluice_rls_config_domains) follow it, whoever sets it: a file reload or
// xDS.
func (s *Server) SetConfig(conf *Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conf.Store(conf)
	s.cfg.Metrics.domainsLoaded(len(conf.Domains()))
	ready := s.Ready() == nil
	for _, w := range s.watchers {
		w(ready)
	}
}

// Config returns the configuration in use.
func (s *Server) Config() *Config { return s.conf.Load() }

// ErrNoDomain is Ready's error while the configuration has no domain.
var ErrNoDomain = errors.New("rls: no domain loaded: every call would be answered OK")

// Ready reports whether the server is ready to serve: its configuration has
// at least one domain, or ServerConfig.ReadyWithoutDomains is set. Calls
// are answered either way; readiness is for health checks and probes.
func (s *Server) Ready() error {
	if c := s.conf.Load(); s.cfg.ReadyWithoutDomains || (c != nil && len(c.domains) > 0) {
		return nil
	}
	return ErrNoDomain
}

// watchReady calls f with the server's readiness now and at every
// SetConfig from then on.
func (s *Server) watchReady(f func(ready bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, f)
	f(s.Ready() == nil)
}

// kind is what applies to one descriptor.
type kind uint8

const (
	none      kind = iota // no limit: unknown domain, no match, replaced
	unlimited             // an unlimited rate_limit
	enforced              // a limit whose denial fails the request
	quota                 // quota_mode: fails the request only when every quota does
	shadowed              // shadow_mode: decided apart, never fails the request
	charged               // debits or drains its hits: charged on its own first, fails the request when over
)

// item is one descriptor of a request and its limit.
type item struct {
	kind    kind
	limit   *Limit // nil for an override
	current *rlsv3.RateLimitResponse_RateLimit
	q       service.Query
	d       service.Decision
	over    bool // over its limit on its own
	shadow  bool // answered OK although over: shadow_mode, or an override's shadow mode
	labels  metricLabels
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// ShouldRateLimit decides a request: each descriptor is matched to a limit
// (or its own override). Enforced and quota-mode limits are decided all or
// nothing: the request is refused when any enforced limit is over, or every
// quota-mode limit is, and then nothing is counted; when admitted, every
// enforced limit counts it, and every quota-mode limit it fits. A limit in
// shadow mode (shadow_mode, or an override's, as policy.ShadowReply) never
// refuses: over it, its status is OK and it counts nothing; shadow_mode
// limits are decided after the others, counted only if the request was
// admitted. Statuses follow the descriptors in order, each with the limit
// that applied (an override's when one did). A call with more descriptors
// than ServerConfig.MaxDescriptors, or a descriptor with more entries than
// MaxEntries, is refused with INVALID_ARGUMENT, counting nothing.
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
	if len(descs) > s.cfg.MaxDescriptors {
		return nil, invalid("%d descriptors in one call: at most %d are accepted", len(descs), s.cfg.MaxDescriptors)
	}
	for i, d := range descs {
		if n := len(d.GetEntries()); n > s.cfg.MaxEntries {
			return nil, invalid("descriptor %d has %d entries: at most %d are accepted", i, n, s.cfg.MaxEntries)
		}
	}
	conf := s.conf.Load()
	domain := req.GetDomain()
	known := conf.Known(domain)
	items := make([]item, len(descs))
	var replaced map[string]bool
	var buf []byte
	var entries []Entry
	quotas := 0
	for i, d := range descs {
		it := &items[i]
		cost := max(1, uint64(req.GetHitsAddend()))
		if h := d.GetHitsAddend(); h != nil {
			cost = h.GetValue()
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
			if err := it.override(i, o, domain, entries, s); err != nil {
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
			if it.q.Charge = s.cfg.Charge; m.Limit.Charge != nil {
				it.q.Charge = *m.Limit.Charge
			}
			switch {
			case m.Limit.ShadowMode:
				it.kind = shadowed
			case m.Limit.QuotaMode:
				it.kind, it.q.Charge = quota, window.ChargeAll // quotas stay all or nothing together
			case it.q.Charge != window.ChargeAll:
				it.kind = charged
			default:
				it.kind = enforced
			}
			it.current = rateLimit(m.Limit.Name, m.Limit.RequestsPerUnit, m.Limit.Unit, m.Limit.UnitMultiplier)
			it.q.Limit = int64(m.Limit.RequestsPerUnit)
			it.q.Duration, it.q.Fixed = s.period(m.Limit.Window, m.Limit.calendar, m.Limit.Unit, int64(m.Limit.UnitMultiplier))
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
	// waitCtx bounds the decisions as ServerConfig.CheckTimeout says, made
	// only when one waits.
	var cancel context.CancelFunc
	waitCtx := func() context.Context {
		if cancel == nil {
			wait := s.cfg.CheckTimeout
			if dl, ok := ctx.Deadline(); ok {
				wait = time.Until(dl) / 2
			}
			ctx, cancel = context.WithTimeout(ctx, wait)
		}
		return ctx
	}
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()

	// Replaced limits drop out; an unlimited one stays unlimited (as
	// upstream). Limits that debit or drain are charged first, each on its
	// own: one over its limit refuses the request, and the all-or-nothing
	// ones then count nothing.
	admitted := true
	for i := range items {
		it := &items[i]
		if l := it.limit; l != nil && l.Name != "" && replaced[l.Name] && it.kind != unlimited {
			it.kind = none
		}
		if it.kind == quota {
			quotas++
		}
		if it.kind != charged {
			continue
		}
		d, _, err := s.gate.Check(waitCtx, domain, it.q)
		if err != nil {
			return nil, serviceError(err)
		}
		it.d, it.over = d, !d.Admitted
		switch {
		case it.over && d.Shadow:
			it.shadow = true
		case it.over:
			admitted = false
		}
	}
	var active []int
	for i := range items {
		it := &items[i]
		switch k := it.kind; {
		case (k == enforced || k == quota) && admitted:
			active = append(active, i)
		case k == enforced || k == quota:
			// Refused by a charged limit: a look, for the status.
			q := it.q
			q.Cost = 0
			d, _, err := s.gate.Check(waitCtx, domain, q)
			if err != nil {
				return nil, serviceError(err)
			}
			it.d = d
		}
	}
	// The enforced and quota limits, all or nothing, in rounds: a round
	// refused only by limits that cannot refuse the request (shadow mode,
	// or quotas while another fits) drops those, uncounted, and decides the
	// rest again. Each round drops at least one limit.
	quotasOver := 0
	var qs []service.Query
	for len(active) > 0 {
		qs = qs[:0]
		for _, i := range active {
			qs = append(qs, items[i].q)
		}
		var ok bool
		var ds []service.Decision
		if len(qs) == 1 {
			d, _, err := s.gate.Check(waitCtx, domain, qs[0])
			if err != nil {
				return nil, serviceError(err)
			}
			ok, ds = d.Admitted, []service.Decision{d}
		} else {
			var err error
			if ok, ds, _, err = s.gate.Batch(waitCtx, domain, qs); err != nil {
				return nil, serviceError(err)
			}
		}
		for j, i := range active {
			items[i].d = ds[j]
		}
		if ok {
			break
		}
		refused, kept := false, active[:0]
		for j, i := range active {
			it := &items[i]
			// In a refused batch, a limit that would have fit on its own
			// has RetryAfter 0 and room for its cost: it is not over.
			it.over = len(qs) == 1 || ds[j].RetryAfter != 0 || qs[j].Cost > ds[j].Remaining
			switch {
			case !it.over:
				kept = append(kept, i)
			case ds[j].Shadow:
				it.shadow = true
			case it.kind == quota:
				quotasOver++
			default:
				refused = true
			}
		}
		switch {
		case refused, quotas > 0 && quotasOver == quotas:
			admitted = false
		case len(kept) == len(active):
			// Refused with nothing over: cannot happen by Batch's
			// contract; never answer OK for a refused batch.
			items[active[0]].over = true
			admitted = false
		}
		if !admitted {
			break
		}
		active = kept
	}

	// Shadow-mode limits: counted only when the request is admitted.
	for i := range items {
		it := &items[i]
		if it.kind != shadowed {
			continue
		}
		q := it.q
		if !admitted {
			q.Cost = 0
		}
		d, _, err := s.gate.Check(waitCtx, domain, q)
		if err != nil {
			return nil, serviceError(err)
		}
		it.d, it.over, it.shadow = d, !d.Admitted, true
	}

	return s.respond(items, admitted), nil
}

// override makes it the limit Envoy sent with the descriptor, counted in
// the server's kind of window (ServerConfig.Windows).
func (it *item) override(i int, o *rlv3.RateLimitDescriptor_RateLimitOverride, domain string, entries []Entry, s *Server) error {
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
	it.current = rateLimit("", o.GetRequestsPerUnit(), u, uint32(mult))
	it.q.Limit = int64(o.GetRequestsPerUnit())
	it.q.Duration, it.q.Fixed = s.period(WindowDefault, 0, u, mult)
	it.labels = overrideLabels(domain, entries)
	return nil
}

// period returns the Duration of the checks of a limit of mult units u in
// window kind w (WindowDefault: the server's), whose own Calendar code is
// calendar, and whether the window is fixed. The server's Calendar counts
// what is not a calendar period in a fixed window aligned to the epoch.
func (s *Server) period(w Window, calendar int64, u Unit, mult int64) (duration int64, fixed bool) {
	switch {
	case w == Calendar:
		return calendar, true
	case w == WindowDefault && s.cfg.Windows == Calendar:
		if u >= 0 && int(u) < len(s.calendars) && mult == 1 && s.calendars[u] != 0 {
			return s.calendars[u], true
		}
		return u.Millis() * mult, true
	case w == WindowDefault:
		w = s.cfg.Windows
	}
	return u.Millis() * mult, w == Fixed
}

// serviceError is the gRPC status of an error of the service, as
// door.ServiceFailure classes it; a 400 or a 500 carries the error's own
// text, for the operators' proxy logs.
func serviceError(err error) error {
	switch door.ServiceFailure(err).Code {
	case 400:
		return status.Error(codes.InvalidArgument, err.Error())
	case 503:
		return status.Error(codes.Unavailable, door.ShuttingDown)
	}
	return status.Error(codes.Internal, err.Error())
}

// applied returns the limit that decided it: the configured one (or
// Envoy's), or the policy override that applied in its place, its window
// spelt as the largest whole unit times unit_multiplier. The unit is
// UNKNOWN for a window of no whole second, or an override changed since.
func (s *Server) applied(it *item) *rlsv3.RateLimitResponse_RateLimit {
	d := &it.d
	if d.Override == "" {
		return it.current
	}
	rpu := uint32(min(d.Limit, math.MaxUint32))
	o, pattern, ok := s.cfg.Service.Policies().Match(it.q.Workspace, it.q.Namespace, it.q.Identifier)
	if ok && pattern == d.Override && o.Limit == d.Limit {
		for _, u := range []Unit{Year, Month, Week, Day, Hour, Minute, Second} {
			if ms := u.Millis(); o.Duration%ms == 0 {
				return rateLimit(it.current.GetName(), rpu, u, uint32(o.Duration/ms))
			}
		}
	}
	return rateLimit(it.current.GetName(), rpu, UnitUnknown, 1)
}

// rateLimit is the RateLimit of a status: rpu per mult units u.
func rateLimit(name string, rpu uint32, u Unit, mult uint32) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(u)}
	if mult > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return rl
}

// respond builds the response of decided items and counts them.
func (s *Server) respond(items []item, admitted bool) *rlsv3.RateLimitResponse {
	nowMs := s.cfg.Service.Now().UnixMilli()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	if !admitted {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	closestRemaining := uint32(math.MaxUint32)
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
		st.CurrentLimit = s.applied(it)
		st.LimitRemaining = uint32(min(it.d.Remaining, math.MaxUint32))
		untilReset := it.d.Reset - nowMs
		if it.over && it.d.RetryAfter > 0 {
			untilReset = it.d.RetryAfter
		}
		st.DurationUntilReset = durationpb.New(time.Duration(max(untilReset, 0)) * time.Millisecond)
		if it.over && !it.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && it.kind != quota {
			closest, closestRemaining = st, 0
		} else if st.LimitRemaining < closestRemaining || closest == nil {
			closest, closestRemaining = st, st.LimitRemaining
		}
		if m := s.cfg.Metrics; m != nil {
			m.decision(it, s.cfg.NearLimitRatio)
		}
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
