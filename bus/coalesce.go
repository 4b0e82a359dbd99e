package bus

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
)

// Coalescing: concurrent Check calls to one workspace share messages.
//
// Each workspace has a lane. A call that finds no message of the lane in
// flight is sent at once, alone, on the single check subject: a lone caller
// waits for nothing and costs what an uncoalesced call costs. A call that
// finds a message in flight waits in the lane's queue; the queue leaves as
// one checks message (README, "Many checks in one message", up to maxChecks), whose results go
// back to their callers, when
//
//   - a reply arrives (the usual case: under load the lane alternates
//     between a message in flight and the calls gathering behind it);
//   - the queue holds a full message (nothing to gain by waiting);
//   - the newest message in flight is late: out longer than spillFactor
//     times the lane's usual round trip (at least minSpill), so a message
//     held up by a slow check (a cold cell read from Redis, a check waiting
//     on leases) does not hold up the calls behind it.
//
// At most maxInFlight messages of a lane are in flight. No call ever waits
// on a timer that a faster path would not beat: the lateness timer only
// sends earlier than a reply would.
//
// A caller whose context ends while its call waits in the queue takes it
// out (nothing was sent, nothing is counted); one whose call was sent stops
// waiting, and the message's slot frees when its reply arrives or when
// every caller it carries has stopped waiting (a lost reply). A 503 for a
// whole message, or a 503 result for some of its checks, sends those checks
// again (through the queue, after the retry pause), as the client's one
// retry policy says for each (retry).

// Defaults of coalescing.
const (
	// DefaultMaxCoalesced is how many checks one message carries at most.
	DefaultMaxCoalesced = 256
	// DefaultMaxInFlight is how many messages of one workspace's checks
	// may be in flight at once: the first, and those sent beside it
	// because the ones before were late.
	DefaultMaxInFlight = 4
)

// When the newest message in flight counts as late: out longer than
// spillFactor times the lane's usual round trip (an average of recent
// replies, each counted at most twice the average so that one slow reply
// moves it little), and never sooner than minSpill.
const (
	spillFactor = 4
	minSpill    = 250 * time.Microsecond
)

// WithCoalescing turns the coalescing of concurrent Check calls on (the
// default) or off. Off, every Check is a request of its own on the check
// subject. Batch is never coalesced.
func WithCoalescing(on bool) ClientOption { return func(c *Client) { c.coalesce = on } }

// WithCoalesceLimits sets how many checks one coalesced message carries at
// most (1 to wire.MaxChecks; default DefaultMaxCoalesced) and how many
// messages of one workspace may be in flight at once (default
// DefaultMaxInFlight; with 1, calls behind a slow message wait for its
// reply). Values out of range take the default.
func WithCoalesceLimits(maxChecks, maxInFlight int) ClientOption {
	return func(c *Client) {
		if maxChecks >= 1 && maxChecks <= wire.MaxChecks {
			c.maxChecks = maxChecks
		}
		if maxInFlight >= 1 {
			c.maxInFlight = maxInFlight
		}
	}
}

// call is one Check waiting for its result. Its fields after done are
// guarded by the lane's mutex.
type call struct {
	check    wire.BatchCheck
	result   chan callResult // buffered: the result is never waited for by its sender
	state    callState
	msg      *outMsg // the message carrying it, in state callSent
	retry    retry
	deadline time.Time // when its caller stops waiting; zero: no deadline
}

type callState uint8

const (
	callQueued   callState = iota // in the lane's queue
	callSent                      // in msg, in flight
	callRetrying                  // waiting for its retry pause
	callDone                      // answered or abandoned
)

type callResult struct {
	resp CheckResponse
	err  error
}

// outMsg is one message in flight. left and finished are guarded by the
// lane's mutex.
type outMsg struct {
	lane     *lane
	calls    []*call
	left     int  // calls still waiting for its reply
	finished bool // its slot is free again
	sent     time.Time
	timer    *time.Timer
	reply    string // its reply subject, its key in the client's replies; set by send under replies.mu
}

// calls recycles the calls answered.
var calls = sync.Pool{New: func() any { return &call{result: make(chan callResult, 1)} }}

// sendBuf is what send encodes a message with, pooled: the checks of a
// coalesced message and its body.
type sendBuf struct {
	checks []wire.BatchCheck
	body   []byte
}

// maxPooledBody bounds the bodies kept for reuse.
const maxPooledBody = 256 << 10

var sendBufs = sync.Pool{New: func() any { return new(sendBuf) }}

// lane holds one workspace's coalescing state.
type lane struct {
	c         *Client
	workspace string
	mu        sync.Mutex
	inFlight  int
	queue     []*call
	newest    time.Time     // when the newest message in flight left
	rtt       time.Duration // the usual round trip of a reply
	spill     *time.Timer   // sends the queue once the newest message is late
	spilling  bool          // spill is set
	perMsg    int           // checks a message carries at most, as of the last one sent
}

// replies routes the replies of coalesced messages, which arrive on one
// subscription of the client's own.
type replies struct {
	once   sync.Once
	err    error
	prefix string // "<inbox>."
	next   atomic.Uint64
	mu     sync.Mutex
	msgs   map[string]*outMsg
}

// laneFor returns workspace's lane, creating it. The lane used last is
// found without the map: most clients check one workspace, and the map's
// lookup (an interface hash) cost 2 % of the coalescing load's CPU.
func (c *Client) laneFor(workspace string) *lane {
	if l := c.lastLane.Load(); l != nil && l.workspace == workspace {
		return l
	}
	v, ok := c.lanes.Load(workspace)
	if !ok {
		v, _ = c.lanes.LoadOrStore(workspace, &lane{c: c, workspace: workspace, perMsg: c.checksPerMessage()})
	}
	l := v.(*lane)
	c.lastLane.Store(l)
	return l
}

// subscribe starts the client's reply subscription, once.
func (c *Client) subscribe() error {
	r := &c.replies
	r.once.Do(func() {
		r.msgs = make(map[string]*outMsg)
		inbox := c.nc.NewInbox()
		r.prefix = inbox + "."
		sub, err := c.nc.Subscribe(inbox+".*", c.onReply)
		if err == nil {
			err = sub.SetPendingLimits(-1, -1)
		}
		if err != nil {
			r.err = fmt.Errorf("subscribe to replies: %w", err)
		}
	})
	return r.err
}

// checkCoalesced is Check with coalescing: wr is valid.
func (c *Client) checkCoalesced(ctx context.Context, workspace, namespace string, wr wire.CheckRequest) (CheckResponse, error) {
	if err := c.subscribe(); err != nil {
		return CheckResponse{}, err
	}
	// A call without a deadline of its own is bounded by its message's
	// timer (the client's timeout), not by a timer of its own.
	cl := calls.Get().(*call)
	cl.check = wire.BatchCheck{Namespace: namespace, CheckRequest: wr}
	cl.retry = firstSend()
	cl.deadline, _ = ctx.Deadline()
	l := c.laneFor(workspace)
	l.mu.Lock()
	if l.inFlight == 0 {
		// Alone: nothing to wait for.
		m := l.newMsgLocked([]*call{cl})
		l.mu.Unlock()
		l.send(m)
	} else {
		// Wait for a reply, unless the queue holds a full message; the
		// first to wait sets the lateness timer.
		cl.state = callQueued
		l.queue = append(l.queue, cl)
		var m *outMsg
		if len(l.queue) >= l.perMsg {
			m = l.nextLocked()
		} else if !l.spilling {
			m = l.spillLocked(time.Now())
		}
		l.mu.Unlock()
		if m != nil {
			l.send(m)
		}
	}
	done := ctx.Done()
	if done == nil { // a context that never ends: only the result
		r := <-cl.result
		calls.Put(cl) // answered: nothing refers to it any more
		return r.resp, r.err
	}
	select {
	case r := <-cl.result:
		calls.Put(cl)
		return r.resp, r.err
	case <-done:
	}
	l.abandon(cl)
	// The result may have arrived meanwhile.
	select {
	case r := <-cl.result:
		return r.resp, r.err
	default:
	}
	return CheckResponse{}, fmt.Errorf("check %s/%s: %w", workspace, namespace, ctx.Err())
}

// abandon stops waiting for cl, whose caller gave up.
func (l *lane) abandon(cl *call) {
	l.mu.Lock()
	var next *outMsg
	switch cl.state {
	case callQueued:
		if i := slices.Index(l.queue, cl); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
		}
	case callSent:
		m := cl.msg
		if m.left--; m.left == 0 && !m.finished {
			// Nobody waits for this message any more: its reply is lost
			// or late, and its slot is free.
			l.c.replies.forget(m)
			next = l.finishLocked(m)
		}
	}
	cl.state, cl.msg = callDone, nil
	l.mu.Unlock()
	if next != nil {
		l.send(next)
	}
}

// lateAfter is how long a message is out before it is late, given the
// lane's usual round trip.
func lateAfter(usual time.Duration) time.Duration {
	return max(spillFactor*usual, minSpill)
}

// usualRTT moves the usual round trip an eighth of the way towards a
// reply's; a reply slower than twice the usual counts as twice the usual,
// so one slow check moves it little. The first reply sets it.
func usualRTT(usual, reply time.Duration) time.Duration {
	if usual == 0 {
		return reply
	}
	return usual + (min(reply, 2*usual)-usual)/8
}

// spillLocked sends the queue if the newest message in flight is late at
// now, or sets the timer for when it will be. l.mu is held.
func (l *lane) spillLocked(now time.Time) *outMsg {
	wait := l.newest.Add(lateAfter(l.rtt)).Sub(now)
	if wait <= 0 {
		return l.nextLocked()
	}
	l.spilling = true
	if l.spill == nil {
		l.spill = time.AfterFunc(wait, l.onSpill)
	} else {
		l.spill.Reset(wait)
	}
	return nil
}

// onSpill is the lateness timer: the queue leaves if the newest message in
// flight is still late (a reply may have sent it meanwhile, or a later
// message be the newest now).
func (l *lane) onSpill() {
	l.mu.Lock()
	l.spilling = false
	var m *outMsg
	if len(l.queue) > 0 && l.inFlight > 0 {
		m = l.spillLocked(time.Now())
	}
	l.mu.Unlock()
	if m != nil {
		l.send(m)
	}
}

// finishLocked frees m's slot and returns the next message to send, made
// of the calls waiting, or nil. l.mu is held.
func (l *lane) finishLocked(m *outMsg) *outMsg {
	m.finished = true
	m.timer.Stop()
	l.inFlight--
	return l.nextLocked()
}

// nextLocked takes the calls waiting into a message when a slot is free.
func (l *lane) nextLocked() *outMsg {
	if len(l.queue) == 0 || l.inFlight >= l.c.maxInFlight {
		return nil
	}
	l.perMsg = l.c.checksPerMessage()
	n := min(len(l.queue), l.perMsg)
	batch := slices.Clone(l.queue[:n])
	l.queue = slices.Delete(l.queue, 0, n)
	return l.newMsgLocked(batch)
}

// The most bytes one check takes in a checks request body: a maximal
// namespace and identifier, every integer at its widest, the keys; in JSON
// each identifier byte may take six (\u00XX).
const (
	maxCheckBytesMsgpack = 1 + 10 + 2 + 64 + 11 + 3 + wire.MaxIdentifierLen + 3*9 + 4*9
	maxCheckBytesJSON    = 96 + 64 + 6*wire.MaxIdentifierLen
)

// checksPerMessage is how many checks one message may carry: maxChecks, and
// no more than the server's max_payload holds however long the checks.
func (c *Client) checksPerMessage() int {
	per := maxCheckBytesMsgpack
	if c.enc == JSON {
		per = maxCheckBytesJSON
	}
	if mp := c.nc.MaxPayload(); mp > 0 {
		return max(1, min(c.maxChecks, int(mp-64)/per))
	}
	return c.maxChecks
}

// newMsgLocked makes a message of batch, taking a slot: its timer ends it
// if no reply arrives within the client's timeout.
func (l *lane) newMsgLocked(batch []*call) *outMsg {
	m := &outMsg{lane: l, calls: batch, left: len(batch), sent: time.Now()}
	l.newest = m.sent
	for _, cl := range batch {
		cl.state, cl.msg = callSent, m
	}
	l.inFlight++
	timeout := l.c.timeout
	m.timer = time.AfterFunc(timeout, func() {
		l.c.replies.forget(m)
		l.answer(m, 0, func(int) callResult {
			return callResult{err: fmt.Errorf("no reply within %v: %w", timeout, context.DeadlineExceeded)}
		})
	})
	return m
}

// send publishes m: alone on the check subject, else as a checks message.
func (l *lane) send(m *outMsg) {
	c := l.c
	r := &c.replies
	reply := r.prefix + strconv.FormatUint(r.next.Add(1), 10)
	r.mu.Lock()
	m.reply = reply
	r.msgs[reply] = m
	r.mu.Unlock()
	var subject string
	buf := sendBufs.Get().(*sendBuf)
	defer sendBufs.Put(buf)
	if len(m.calls) == 1 {
		ch := m.calls[0].check
		subject = c.subjects.Check(l.workspace, ch.Namespace)
		buf.body = wire.AppendCheckRequest(buf.body[:0], c.enc, ch.CheckRequest)
	} else {
		buf.checks = buf.checks[:0]
		for _, cl := range m.calls {
			buf.checks = append(buf.checks, cl.check)
		}
		subject = c.subjects.Checks(l.workspace)
		buf.body = wire.AppendChecksRequest(buf.body[:0], c.enc, buf.checks)
		clear(buf.checks)
	}
	body := buf.body
	if cap(buf.body) > maxPooledBody {
		buf.body = nil
	}
	// The body's first byte tells the limiter its encoding: no header.
	// PublishRequest copies it, so the buffer goes back to its pool.
	if err := c.nc.PublishRequest(subject, reply, body); err != nil {
		r.forget(m)
		l.answer(m, 0, func(int) callResult {
			return callResult{err: fmt.Errorf("request %s: %w", subject, err)}
		})
	}
}

// forget drops m from the reply routes.
func (r *replies) forget(m *outMsg) {
	r.mu.Lock()
	delete(r.msgs, m.reply)
	r.mu.Unlock()
}

// onReply answers the calls of the message a reply is for.
func (c *Client) onReply(msg *nats.Msg) {
	r := &c.replies
	r.mu.Lock()
	m, ok := r.msgs[msg.Subject]
	delete(r.msgs, msg.Subject)
	r.mu.Unlock()
	if !ok {
		return // every caller gave up
	}
	single := len(m.calls) == 1
	rtt := max(time.Since(m.sent), 1)
	// A status 503 with no body: no limiter serves the subject.
	if msg.Header.Get("Status") == "503" && len(msg.Data) == 0 {
		m.lane.answer(m, 0, func(int) callResult { return callResult{err: ErrNoResponders} })
		return
	}
	if err := ReplyError(msg); err != nil {
		m.lane.answer(m, rtt, func(int) callResult { return callResult{err: err} })
		return
	}
	if single {
		resp, err := wire.DecodeCheckResponse(c.enc, msg.Data)
		if err != nil {
			err = fmt.Errorf("decode check response: %w", err)
		}
		m.lane.answer(m, rtt, func(int) callResult { return callResult{resp: resp, err: err} })
		return
	}
	resp, err := wire.DecodeChecksResponse(c.enc, msg.Data)
	if err == nil && len(resp.Results) != len(m.calls) {
		err = fmt.Errorf("invalid checks response: %d results for %d checks", len(resp.Results), len(m.calls))
	}
	if err != nil {
		err = fmt.Errorf("decode checks response: %w", err)
		m.lane.answer(m, rtt, func(int) callResult { return callResult{err: err} })
		return
	}
	m.lane.answer(m, rtt, func(i int) callResult {
		res := &resp.Results[i]
		if res.Error != "" {
			return callResult{err: &ServiceError{Code: res.Code, Description: res.Error}}
		}
		return callResult{resp: res.CheckResponse}
	})
}

// answer gives each call of m still waiting its result, or queues it again
// after its pause where the retry policy says so, and frees m's slot.
func (l *lane) answer(m *outMsg, rtt time.Duration, result func(i int) callResult) {
	var retries []*call
	var pause time.Duration // the longest of the retries'
	// Results are handed over once the lane is unlocked: a caller woken by
	// its result calls again at once, and would find the lane locked.
	type delivery struct {
		cl  *call
		res callResult
	}
	deliveries := make([]delivery, 0, len(m.calls))
	l.mu.Lock()
	if m.finished && m.left == 0 {
		l.mu.Unlock()
		return
	}
	if rtt > 0 {
		l.rtt = usualRTT(l.rtt, rtt)
	}
	for i, cl := range m.calls {
		if cl.state != callSent || cl.msg != m {
			continue // its caller gave up
		}
		res := result(i)
		if p, ok := cl.retry.again(res.err, l.c.attempts, cl.deadline); ok {
			cl.state, cl.msg = callRetrying, nil
			pause = max(pause, p)
			retries = append(retries, cl)
			continue
		}
		cl.state, cl.msg = callDone, nil
		deliveries = append(deliveries, delivery{cl, res})
	}
	m.left = 0
	var next *outMsg
	if !m.finished {
		next = l.finishLocked(m)
	}
	l.mu.Unlock()
	if next != nil {
		l.send(next)
	}
	for _, d := range deliveries {
		d.cl.result <- d.res // buffered, and sent once: never blocks
	}
	if len(retries) > 0 {
		// A limiter shutting down counted nothing for these: ask again
		// after a pause (the longest of theirs), together; its queue
		// peers take them.
		time.AfterFunc(pause, func() { l.requeue(retries) })
	}
}

// requeue puts the calls back from their retry pause in the queue, except
// those whose callers gave up meanwhile.
func (l *lane) requeue(calls []*call) {
	l.mu.Lock()
	for _, cl := range calls {
		if cl.state == callRetrying {
			cl.state = callQueued
			l.queue = append(l.queue, cl)
		}
	}
	next := l.nextLocked()
	l.mu.Unlock()
	if next != nil {
		l.send(next)
	}
}
