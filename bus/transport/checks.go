package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/door"
	"github.com/sluicehq/sluice/service"
)

// The checks endpoint (README, "Many checks in one message"): many independent checks of one
// workspace in one message, each decided exactly as if it had been sent
// alone, one reply with a result per check in request order.
//
// The endpoint's callback decodes the message and decides, in order, every
// check that local state can decide at once (TryCheck, as the check
// endpoint does). A check that must wait on the origin goes to a goroutine
// of its own, together with the later checks of the same identifier (same
// namespace, identifier and duration), which it decides in request order
// with Check, so the identifier sees the message's checks in the order a
// client sending them one by one would have. Checks of other identifiers
// are not held up: they are decided on the callback, and the callback goes
// on to the next message at once. The reply leaves when the last waiting
// group has decided; whoever finishes last publishes it.
//
// A message received after shutdown began is answered 503 as a whole. A
// check the callback reaches after shutdown began (the message arrived
// before), or one the service refuses because it is closing, gets a 503
// result of its own; the others keep their decisions, so a client resends
// only the 503 ones and nothing is counted twice.

// checksHooks lets the package's tests watch and pace the checks endpoint
// (export_test.go). Outside them a Limiter's hooks are nil: the endpoint
// reads one nil interface a message, and one a check that waits.
type checksHooks interface {
	// beforeCheck runs before the check of index i of a message, which
	// names identifier, is decided.
	beforeCheck(identifier string, i int)
	// waitDeadline receives the deadline of each check of a checks message
	// that waits in its identifier's group.
	waitDeadline(identifier string, deadline time.Time)
}

// checksMsg is one checks message being answered, pooled.
type checksMsg struct {
	l       *Limiter
	req     micro.Request
	enc     wire.Encoding
	ws      string
	items   []wire.ChecksItem
	results []wire.ChecksResult
	// groups holds, per identifier that waits, the indices of its checks
	// in request order; groupOf maps the identifier to its group.
	groups  [][]int
	groupOf map[groupKey]int
	// left counts the goroutines still deciding groups plus one for the
	// callback; whoever takes it to zero replies. next is the next group
	// one of them takes.
	left atomic.Int32
	next atomic.Int32
	buf  []byte
}

// groupKey names an identifier's bucket within a workspace.
type groupKey struct {
	namespace, identifier string
	duration              int64
}

var checksMsgs = sync.Pool{New: func() any { return new(checksMsg) }}

// maxPooledChecks bounds the slices a pooled checksMsg keeps.
const maxPooledChecks = wire.MaxChecks

func (m *checksMsg) release() {
	clear(m.items)
	clear(m.results)
	for i := range m.groups {
		m.groups[i] = m.groups[i][:0]
	}
	m.groups = m.groups[:0]
	clear(m.groupOf)
	m.req, m.l, m.ws = nil, nil, ""
	if cap(m.buf) > 64<<10 {
		m.buf = nil
	}
	if cap(m.items) > maxPooledChecks {
		m.items, m.results = nil, nil
	}
	checksMsgs.Put(m)
}

// startWorkers starts the Workers-1 helpers of the checks endpoint.
func (l *Limiter) startWorkers() {
	l.work, l.stopWork = make(chan micro.Request), make(chan struct{})
	for range l.cfg.Workers - 1 {
		l.workersDone.Add(1)
		go func() {
			defer l.workersDone.Done()
			for {
				l.idleHelpers.Add(1)
				select {
				case req := <-l.work:
					l.idleHelpers.Add(-1)
					l.handleChecks(req, false)
				case <-l.stopWork:
					return
				}
			}
		}()
	}
}

// stopWorkers stops the helpers once the endpoint's callback has stopped;
// a message a helper took is answered first.
func (l *Limiter) stopWorkers() {
	l.stopOnce.Do(func() { close(l.stopWork) })
	l.workersDone.Wait()
}

// handleChecksMsg is the checks endpoint's callback: it hands the message
// to a helper that is idle (the channel is unbuffered, so the send succeeds
// only then) and otherwise answers it itself.
func (l *Limiter) handleChecksMsg(req micro.Request) {
	select {
	case l.work <- req:
	default:
		l.handleChecks(req, true)
	}
}

// handleChecks answers one checks message, on the endpoint's callback or,
// when not onCallback, on a helper: there an error reply is published
// directly, since micro reads what req.Error records once the callback has
// returned.
func (l *Limiter) handleChecks(req micro.Request, onCallback bool) {
	ec := &l.checksEP
	enc, ws, _, ok := l.open(ec, req, routeChecks, onCallback, !onCallback)
	if !ok {
		return
	}
	m := checksMsgs.Get().(*checksMsg)
	var err error
	m.items, err = wire.DecodeChecksRequestView(enc, req.Data(), m.items)
	if err != nil {
		m.release()
		l.fail(ec, req, enc, 400, err.Error(), !onCallback)
		return
	}
	m.l, m.req, m.enc, m.ws = l, req, enc, ws
	if cap(m.results) < len(m.items) {
		m.results = make([]wire.ChecksResult, len(m.items))
	}
	m.results = m.results[:len(m.items)]
	m.left.Store(1)

	closing := false
	hooks := l.hooks
	var admitted, denied int64 // counted once a message: the counters are shared
	for i := range m.items {
		it := &m.items[i]
		if it.Err != nil {
			ec.bad.Add(1)
			m.results[i] = wire.ChecksResult{Error: it.Err.Error(), Code: 400}
			continue
		}
		if hooks != nil {
			hooks.beforeCheck(it.Identifier, i)
		}
		if !closing && l.closing.Load() {
			closing = true
		}
		if closing {
			m.unavailable(i)
			continue
		}
		q := m.query(i)
		if m.groupOf != nil {
			if g, ok := m.groupOf[groupKey{q.Namespace, q.Identifier, q.Duration}]; ok {
				m.groups[g] = append(m.groups[g], i)
				continue
			}
		}
		d, ok, err := l.cfg.Service.TryCheck(q)
		if !ok {
			m.wait(i, q)
			continue
		}
		if err != nil {
			m.serviceError(i, err)
			continue
		}
		if d.Reply().Success {
			admitted++
		} else {
			denied++
		}
		m.results[i] = wire.ChecksResult{CheckResponse: checkResponse(d)}
	}
	ec.admitted.Add(admitted)
	ec.denied.Add(denied)
	m.startGroups()
	m.done()
}

// query returns check i as a service query.
func (m *checksMsg) query(i int) service.Query {
	return queryOf(m.ws, m.items[i].Namespace, &m.items[i].CheckRequest)
}

// wait puts check i, which must wait on the origin, in a new group.
func (m *checksMsg) wait(i int, q service.Query) {
	if m.groupOf == nil {
		m.groupOf = make(map[groupKey]int)
	}
	m.groupOf[groupKey{q.Namespace, q.Identifier, q.Duration}] = len(m.groups)
	if len(m.groups) < cap(m.groups) {
		m.groups = m.groups[:len(m.groups)+1]
		m.groups[len(m.groups)-1] = append(m.groups[len(m.groups)-1][:0], i)
	} else {
		m.groups = append(m.groups, []int{i})
	}
}

// startGroups decides the groups that wait: up to MaxMessageWaiting
// goroutines, each holding one of the workspace's waiting places, take them
// in turn, so one message never holds more places than that and its later
// groups wait their turn rather than being decided without the origin. If
// no place is free for the workspace, every group is decided from local
// state at once (as while the origin fails); once shutdown began, 503.
func (m *checksMsg) startGroups() {
	if len(m.groups) == 0 {
		return
	}
	l := m.l
	ec := &l.checksEP
	m.next.Store(0)
	started := 0
	outcome := asyncStarted
	for started < min(len(m.groups), MaxMessageWaiting) {
		if outcome = l.startAsync(m.ws); outcome != asyncStarted {
			break
		}
		started++
		m.left.Add(1)
		go m.work()
	}
	if started > 0 {
		return
	}
	for _, g := range m.groups {
		for _, i := range g {
			if outcome == asyncClosing {
				m.unavailable(i)
				continue
			}
			ec.notWaited.Add(1)
			m.decide(i, func(q service.Query) (service.Decision, error) { return l.cfg.Service.CheckLocal(q) })
		}
	}
}

// work decides groups in turn until none is left, then gives back its
// waiting place and ends its share of the message.
func (m *checksMsg) work() {
	l := m.l
	defer l.endAsync(m.ws)
	for {
		g := int(m.next.Add(1)) - 1
		if g >= len(m.groups) {
			break
		}
		l.checksEP.waited.Add(int64(len(m.groups[g])))
		for _, i := range m.groups[g] {
			// Each check its own CheckTimeout, from when it is decided, as
			// if it had been sent alone: with one deadline for the group,
			// the checks decided after it passed would find their wait over
			// before it began, and be refused what was left.
			m.decide(i, func(q service.Query) (service.Decision, error) {
				ctx, cancel := context.WithTimeout(context.Background(), l.cfg.CheckTimeout)
				defer cancel()
				if h := l.hooks; h != nil {
					dl, _ := ctx.Deadline()
					h.waitDeadline(q.Identifier, dl)
				}
				return l.cfg.Service.Check(ctx, q)
			})
		}
	}
	m.done()
}

// decide answers check i with what decide says.
func (m *checksMsg) decide(i int, decide func(service.Query) (service.Decision, error)) {
	q := m.query(i)
	d, err := decide(q)
	if err != nil {
		m.serviceError(i, err)
		return
	}
	m.l.checksEP.count(d.Reply().Success)
	m.results[i] = wire.ChecksResult{CheckResponse: checkResponse(d)}
}

// unavailable answers check i 503: the limiter did not decide it.
func (m *checksMsg) unavailable(i int) {
	m.fail(i, door.Failure{Code: 503, Msg: door.ShuttingDown})
}

// serviceError answers check i with the result the service's err calls
// for, as failService does for a whole message.
func (m *checksMsg) serviceError(i int, err error) {
	m.fail(i, m.l.serviceFailure(m.req, err))
}

// fail answers check i with the error result f and counts it.
func (m *checksMsg) fail(i int, f door.Failure) {
	m.l.checksEP.failed(f.Code)
	m.results[i] = wire.ChecksResult{Error: f.Msg, Code: f.Code}
}

// done ends one share of the message; the last one replies and releases it.
func (m *checksMsg) done() {
	if m.left.Add(-1) != 0 {
		return
	}
	m.buf = wire.AppendChecksResponse(m.buf[:0], m.enc, wire.ChecksResponse{Results: m.results})
	m.l.respond(m.req, m.buf)
	m.release()
}
