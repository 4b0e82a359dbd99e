// Package door holds what every door of a limiter does alike with its
// service.Service: the waiting gate of --max-waiting-checks (Gate, over the
// fair bound Waiting) and the reply to an error of the service
// (ServiceFailure). The doors are the NATS
// endpoints (bus/transport) and Envoy's rate limit service (rls); each
// speaks its own protocol, and none decides these two things its own way.
package door

import (
	"context"
	"errors"
	"strings"

	"github.com/sluicehq/sluice/service"
)

// DefaultMaxWaiting is the number of places of a Gate whose bound is
// neither given nor sized (--max-waiting-checks' default). With Redis
// answering in a millisecond, 50,000 cold checks a second keep about 50
// waiting; the bound only bites when Redis is slow, where it keeps the
// tail of every check's latency near the read timeout (docs/operations.md).
const DefaultMaxWaiting = 1024

// Way says how a check or batch passed a Gate, for the doors' counters.
type Way uint8

const (
	// Decided: the lease or the local counts decided it at once
	// (Service.TryCheck); it took no place.
	Decided Way = iota
	// Waited: it held one of its tenant's places while it waited on the
	// origin.
	Waited
	// NotWaited: it would have waited, but its tenant held its share of
	// the places (or every place was taken), so it was decided from local
	// state at once, as while the origin fails (Service.CheckLocal,
	// Service.BatchLocal).
	NotWaited
)

// Gate is the waiting gate: it bounds the checks and batches of a service
// that wait on the origin at once, shared fairly between tenants (the
// workspaces, the Envoy domains) through a Waiting. A check that
// local state decides never takes a place; one that must wait takes one of
// its tenant's places for as long as it waits, or, with none free, is
// decided from local state at once and counted as not waited.
//
// Check and Batch pass the gate in the caller's goroutine. A door that
// waits in goroutines of its own (bus/transport) passes it in the same
// order in steps: Service.TryCheck first; then Enter before it starts the
// goroutine, which decides with Service.Check or Service.Batch and calls
// Leave; without a place, Service.CheckLocal or Service.BatchLocal at once.
//
// A Gate is safe for concurrent use.
type Gate struct {
	svc    *service.Service
	places *Waiting
}

// NewGate returns the gate of svc's checks through places, the bound every
// door of a process shares; with places nil, through a bound of its own of
// n places (DefaultMaxWaiting when n <= 0).
func NewGate(svc *service.Service, places *Waiting, n int) *Gate {
	if places == nil {
		if n <= 0 {
			n = DefaultMaxWaiting
		}
		places = NewWaiting(n)
	}
	return &Gate{svc: svc, places: places}
}

// Check decides q, a check of tenant: from the lease or the local counts
// when they can (Decided); else, holding one of tenant's places, on the
// origin within the context ctx returns (Waited; ctx is called only then);
// else from local state at once (NotWaited). Errors are the service's
// (ServiceFailure says how to answer them).
func (g *Gate) Check(ctx func() context.Context, tenant string, q service.Query) (service.Decision, Way, error) {
	if d, ok, err := g.svc.TryCheck(q); ok {
		return d, Decided, err
	}
	if !g.Enter(tenant) {
		d, err := g.svc.CheckLocal(q)
		return d, NotWaited, err
	}
	defer g.Leave(tenant)
	d, err := g.svc.Check(ctx(), q)
	return d, Waited, err
}

// Batch decides qs, a batch of tenant, all or nothing: holding one of
// tenant's places, with Service.Batch within the context ctx returns
// (Waited); without one, from local state at once (NotWaited). A batch
// always takes a place to wait: only the service knows whether it will.
func (g *Gate) Batch(ctx func() context.Context, tenant string, qs []service.Query) (bool, []service.Decision, Way, error) {
	if !g.Enter(tenant) {
		ok, ds, err := g.svc.BatchLocal(qs)
		return ok, ds, NotWaited, err
	}
	defer g.Leave(tenant)
	ok, ds, err := g.svc.Batch(ctx(), qs)
	return ok, ds, Waited, err
}

// Enter takes one of tenant's places and reports whether it did: not when
// tenant holds its share already, nor when every place is taken. A place
// taken is given back with Leave.
func (g *Gate) Enter(tenant string) bool { return g.places.Acquire(tenant) }

// Leave gives back a place Enter took for tenant.
func (g *Gate) Leave(tenant string) { g.places.Release(tenant) }

// Len returns how many places are taken, by every door sharing the bound.
func (g *Gate) Len() int { return g.places.Len() }

// ShuttingDown is what a door tells a caller it did not decide because the
// limiter is shutting down (the 503 Failure's Msg): nothing was counted,
// and the request may be sent again to another limiter.
const ShuttingDown = "limiter is shutting down"

// Failure is a door's reply to an error of the service.
type Failure struct {
	// Code is the reply's code, in the numbers of the micro error
	// convention (HTTP's): 400 when the query is outside the bounds of the
	// API (service.ErrInvalidQuery), 503 when the service is closing
	// (service.ErrClosed), 500 for anything else. Nothing was counted for a
	// 400 or a 503.
	Code int
	// Msg is what the caller is told: for a 400, what is wrong with the
	// query (the error's text without its "invalid query: " prefix); for a
	// 503, ShuttingDown; for a 500, "internal error" (the error itself is
	// for the door's log).
	Msg string
}

// ServiceFailure returns the reply to err, an error a service.Service
// returned for a check or a batch. It is the one place that maps the
// service's errors to reply codes: every door answers them through it.
func ServiceFailure(err error) Failure {
	switch {
	case errors.Is(err, service.ErrInvalidQuery):
		return Failure{Code: 400, Msg: strings.TrimPrefix(err.Error(), service.ErrInvalidQuery.Error()+": ")}
	case errors.Is(err, service.ErrClosed):
		return Failure{Code: 503, Msg: ShuttingDown}
	}
	return Failure{Code: 500, Msg: "internal error"}
}
