package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/adminwire"
)

// The policy endpoints (README, "Overrides and shadow mode"): a micro service of their own,
// AdminServiceName, beside the limiter's, so that NATS permissions grant
// them apart from checks. Every limiter serves them in the queue group
// AdminQueueGroup; a change is applied to the limiter's override table
// (the service's, so the checks that follow it on this limiter see it)
// before the reply leaves.

// AdminServiceName is the name of the micro service of the policy
// endpoints.
const AdminServiceName = "ratelimit-admin"

// AdminQueueGroup is the queue group of the policy endpoints.
const AdminQueueGroup = "ratelimit-admin"

// PolicyCarrier is what the admin endpoints need of a limiter's policy
// replication, *link.Policy (bus/link): they hand it the changes they
// accept and wait on it to read their writes. An interface, so that the
// doors import neither bus/link nor the bridge.
type PolicyCarrier interface {
	// Barrier returns once the limiter holds every override and reset mark
	// its region's bridge had merged when Barrier was called, or once it
	// gave up (within a second): the admin request is then served from
	// what the limiter holds.
	Barrier(ctx context.Context)
	// Accept sends an override the admin endpoint applied to the region's
	// bridge, again until acknowledged; it never fails the change.
	Accept(ctx context.Context, e policy.Entry)
	// AcceptMark sends a reset mark the reset endpoint applied as Accept
	// sends an override.
	AcceptMark(ctx context.Context, m policy.Mark)
}

// AdminStats counts the policy endpoints' answers since the limiter
// started.
type AdminStats struct {
	// Sets, Gets, Deletes, Lists (pages) and Resets count the requests
	// that succeeded.
	Sets    int64 `json:"sets"`
	Gets    int64 `json:"gets"`
	Deletes int64 `json:"deletes"`
	Lists   int64 `json:"lists"`
	Resets  int64 `json:"resets"`
	// BadRequests counts 400 replies (nothing was changed), Unavailable
	// 503 replies (shutting down).
	BadRequests int64 `json:"bad_requests"`
	Unavailable int64 `json:"unavailable"`
}

type adminCounters struct {
	sets, gets, deletes, lists, resets, bad, unavailable atomic.Int64
}

// failed records an error reply: 400 or 503 (nothing else is counted).
func (c *adminCounters) failed(code int) {
	switch code {
	case 400:
		c.bad.Add(1)
	case 503:
		c.unavailable.Add(1)
	}
}

func (c *adminCounters) stats() AdminStats {
	return AdminStats{Sets: c.sets.Load(), Gets: c.gets.Load(), Deletes: c.deletes.Load(), Lists: c.lists.Load(), Resets: c.resets.Load(),
		BadRequests: c.bad.Load(), Unavailable: c.unavailable.Load()}
}

// AdminStats returns the policy endpoints' counters.
func (l *Limiter) AdminStats() AdminStats { return l.admin.stats() }

// addAdmin registers the ratelimit-admin service and its endpoints.
func (l *Limiter) addAdmin() (micro.Service, error) {
	cfg := l.cfg
	prefix := cfg.Subjects.Base()
	svc, err := micro.AddService(l.nc, micro.Config{
		Name:         AdminServiceName,
		Version:      cfg.Version,
		Description:  "Sluice policies: overrides of the limits checks carry, shadow mode, reset",
		QueueGroup:   AdminQueueGroup,
		Metadata:     map[string]string{"region": cfg.Region},
		StatsHandler: func(*micro.Endpoint) any { return l.admin.stats() },
	})
	if err != nil {
		return nil, fmt.Errorf("bus: add micro service %s: %w", AdminServiceName, err)
	}
	for _, op := range adminwire.Ops() {
		name := strings.ReplaceAll(string(op), ".", "-") // override-set, ..., reset
		if err := svc.AddEndpoint(name, micro.HandlerFunc(l.handleAdmin),
			micro.WithEndpointSubject(prefix+".admin.*."+string(op)),
			micro.WithEndpointMetadata(map[string]string{"subject": adminwire.Subject(prefix, "<workspace>", op)})); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("bus: add %s endpoint: %w", name, err)
		}
	}
	return svc, nil
}

// handleAdmin answers one request of a policy endpoint.
func (l *Limiter) handleAdmin(req micro.Request) {
	enc, err := adminEncoding(req)
	if err != nil {
		l.fail(&l.admin, req, adminwire.JSON, 400, err.Error(), false)
		return
	}
	if l.closing.Load() {
		l.fail(&l.admin, req, enc, 503, door.ShuttingDown, false)
		return
	}
	ws, op, err := adminwire.ParseSubject(l.cfg.Subjects.Base(), req.Subject())
	if err != nil {
		l.fail(&l.admin, req, enc, 400, err.Error(), false)
		return
	}
	if l.cfg.PolicyLink != nil {
		// Read your writes: hold every change the region's bridge has
		// acknowledged before answering (or deciding whether a delete
		// finds its override, or stamping a set above the one it replaces).
		l.cfg.PolicyLink.Barrier(context.Background())
	}
	body, err := l.adminOp(op, ws, enc, req.Data())
	if err != nil {
		l.fail(&l.admin, req, enc, 400, err.Error(), false)
		return
	}
	if err := req.Respond(body, micro.WithHeaders(micro.Headers{"Content-Type": {enc.ContentType()}})); err != nil {
		l.log.Warn("admin reply failed", "subject", req.Subject(), "error", err)
	}
}

// adminOp applies op of workspace ws to the limiter with the request
// body data in enc, and returns the reply's body, or the error a 400
// answers (nothing was changed then).
func (l *Limiter) adminOp(op adminwire.Op, ws string, enc wire.Encoding, data []byte) ([]byte, error) {
	table := l.cfg.Service.Policies()
	switch op {
	case adminwire.OpSet:
		return adminApply(data, enc, adminwire.DecodeSet, func(r adminwire.SetRequest) ([]byte, error) {
			e, err := table.Set(r.Key(ws), r.Override(), l.cfg.Service.Now().UnixMilli(), l.cfg.Region)
			if err != nil {
				return nil, err
			}
			l.accepted(e)
			l.admin.sets.Add(1)
			l.log.Info("override set", "workspace", ws, "namespace", e.Namespace, "pattern", e.Pattern,
				"limit", e.Limit, "duration_ms", e.Duration, "shadow", e.Shadow)
			return adminwire.AppendOverride(nil, enc, adminwire.FromEntry(e)), nil
		})
	case adminwire.OpGet:
		return adminApply(data, enc, adminwire.DecodeGet, func(r adminwire.GetRequest) ([]byte, error) {
			e, err := table.Lookup(r.Key(ws))
			if err != nil {
				return nil, err
			}
			l.admin.gets.Add(1)
			return adminwire.AppendOverride(nil, enc, adminwire.FromEntry(e)), nil
		})
	case adminwire.OpDelete:
		return adminApply(data, enc, adminwire.DecodeDelete, func(r adminwire.DeleteRequest) ([]byte, error) {
			e, err := table.Delete(r.Key(ws), l.cfg.Service.Now().UnixMilli(), l.cfg.Region)
			if err != nil {
				return nil, err
			}
			l.accepted(e)
			l.admin.deletes.Add(1)
			l.log.Info("override deleted", "workspace", ws, "namespace", e.Namespace, "pattern", e.Pattern)
			return adminwire.AppendDelete(nil, enc, adminwire.DeleteResponse{Deleted: true}), nil
		})
	case adminwire.OpList:
		return adminApply(data, enc, adminwire.DecodeList, func(r adminwire.ListRequest) ([]byte, error) {
			body := listPage(table, ws, r, enc, adminListBudget(l.nc.MaxPayload()))
			l.admin.lists.Add(1)
			return body, nil
		})
	case adminwire.OpReset:
		return adminApply(data, enc, adminwire.DecodeReset, func(r adminwire.ResetRequest) ([]byte, error) {
			m, err := l.cfg.Service.Reset(ws, r.Namespace, r.Identifier, r.Duration)
			if err != nil {
				return nil, err
			}
			if l.cfg.PolicyLink != nil {
				l.cfg.PolicyLink.AcceptMark(context.Background(), m)
			}
			l.admin.resets.Add(1)
			l.log.Info("reset", "workspace", ws, "namespace", m.Namespace, "duration_ms", m.Duration, "epoch", m.Epoch)
			return adminwire.AppendReset(nil, enc, adminwire.ResetResponse{Namespace: m.Namespace,
				Identifier: m.Identifier, Duration: m.Duration, Reset: m.Epoch}), nil
		})
	}
	return nil, errors.New("operation " + strconv.Quote(string(op)) + " is not served yet")
}

// adminApply decodes the request body data in enc with decode and returns
// what apply answers the request with; a body decode refuses is answered
// with its error.
func adminApply[R any](data []byte, enc wire.Encoding, decode func([]byte, wire.Encoding) (R, error), apply func(R) ([]byte, error)) ([]byte, error) {
	r, err := decode(data, enc)
	if err != nil {
		return nil, err
	}
	return apply(r)
}

// adminListBudget is the most bytes a page of override.list takes (unless
// one override alone is larger, which takes a max_payload below 8 KiB):
// half the connection's max payload (maxPayload, as the server announced
// it; 1 MiB, NATS's default, before it did), which leaves the other half
// for the reply's headers, so that every reply can be published.
func adminListBudget(maxPayload int64) int {
	if maxPayload <= 0 {
		maxPayload = 1 << 20
	}
	return int(maxPayload / 2)
}

// listPage returns the reply of one page of override.list in enc: the live
// overrides of ws (of r's namespace only, if it names one) after r's
// cursor, in (namespace, pattern) order, at most r's limit of them and
// fewer when the next would take the reply past budget bytes, with the
// cursor of the last one as next when more follow.
func listPage(table *policy.Table, ws string, r adminwire.ListRequest, enc adminwire.Encoding, budget int) []byte {
	w := adminwire.NewListWriter(enc, budget)
	page, more := table.Page(ws, r.Namespace, r.Start(), r.PageLimit(), func(e policy.Entry) bool {
		return w.Add(adminwire.FromEntry(e))
	})
	next := ""
	if more && len(page) > 0 { // a writer takes the first override whatever its size
		next = adminwire.EncodeCursor(policy.PositionOf(page[len(page)-1]))
	}
	return w.Append(nil, next)
}

// adminEncoding tells the body's encoding by the rule of the README's "The request"; an
// empty body (override.list of every namespace) is JSON.
func adminEncoding(req micro.Request) (wire.Encoding, error) {
	if len(req.Data()) == 0 && req.Headers().Get("Content-Type") == "" {
		return wire.JSON, nil
	}
	return requestEncoding(req) // JSON on error
}

// accepted hands a change the table took to the region's bridge, which
// carries it to the region's other limiters, the other regions and MySQL;
// the reply waits for the bridge's acknowledgement (a second at most).
func (l *Limiter) accepted(e policy.Entry) {
	if l.cfg.PolicyLink != nil {
		l.cfg.PolicyLink.Accept(context.Background(), e)
	}
}
