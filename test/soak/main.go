// Command soak runs one limiter under sustained load over millions of
// distinct identifiers and watches its memory:
//
//   - an embedded NATS server; in this process, a limiter (service with the
//     region's Redis as origin behind region.NewBreaker, transport.Serve, a
//     link.Global) and a bridge with an in-memory store, so the global path
//     runs too;
//   - a load generator sending msgpack checks over NATS at -rate per second
//     with a bounded number in flight, cycling through -ids identifiers of
//     20 bytes (1-minute windows, a limit no identifier reaches), plus a few
//     hot identifiers (0.5% of the checks, limit 200 a minute) that get
//     denied and so publish components and denials to the bridge.
//
// Every -sample it forces a GC and records checks/s, errors, latency, live
// heap and the active cells: the identifiers touched in the current or the
// previous window (the generator knows which, since it cycles through them
// in order), which is what the limiter's table holds once its janitor has
// swept. At the end it prints the samples, the memory per active cell
// ((heap at the end, under load) - (heap before the load)) / active cells,
// the heap slope once every identifier is active, and the totals; after
// shutdown it checks, for a sample of identifiers, that Redis holds exactly
// what was admitted. It exits 1 if any check failed (timeout, service error,
// no responders) or Redis disagrees.
//
// The generator builds each request in place in one buffer: its memory does
// not grow with -ids, so the heap difference is the limiter's (and the NATS
// server's in-flight buffers, bounded by -inflight).
//
//	go run ./test/soak [-d 1m] [-ids 2000000] [-rate 50000] [-redis-url redis://127.0.0.1:6379]
//
// or `make soak` (SOAK_DURATION, SOAK_IDS).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/bits"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/nats/embedded"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

const (
	regionName = "soak"
	workspace  = "soak"
	namespace  = "api"
	// windowMs is every identifier's window: active cells are those touched
	// in the current or the previous minute.
	windowMs = 60_000
	// mainLimit is never reached: every check of the cycling identifiers is
	// admitted, and none is near its limit (settled at the far cadence).
	mainLimit = 1_000_000
	// Hot identifiers: 1 check in hotEvery goes to one of hotIDs
	// identifiers with a limit of hotLimit a minute, which they exceed.
	hotEvery = 200
	hotIDs   = 4
	hotLimit = 200
	// digits is the width of the number in an identifier: "soak-user-" and
	// 10 digits make the 20-byte identifiers the memory target is stated for.
	digits = 10
	// verifyIDs is how many identifiers are checked in Redis at the end.
	verifyIDs = 1000
)

type config struct {
	dur, sample, timeout time.Duration
	ids, rate, inflight  int
	redisURL, memprofile string
}

func main() {
	var c config
	flag.DurationVar(&c.dur, "d", time.Minute, "how long the load runs")
	flag.IntVar(&c.ids, "ids", 2_000_000, "distinct identifiers the load cycles through")
	flag.IntVar(&c.rate, "rate", 50_000, "checks per second to send")
	flag.IntVar(&c.inflight, "inflight", 256, "most checks in flight at once")
	flag.DurationVar(&c.sample, "sample", 5*time.Second, "how often to sample rate, errors, heap and cells")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Second, "a check not answered within this counts as a timeout")
	flag.StringVar(&c.redisURL, "redis-url", defaultRedisURL(), "the region's Redis (also SLUICE_TEST_REDIS_URL)")
	flag.StringVar(&c.memprofile, "memprofile", "", "write a heap profile here at the last sample (under load)")
	flag.Parse()
	if c.ids < 1 || c.ids >= int(math.Pow10(digits)) || c.rate < 1 || c.inflight < 1 || c.sample <= 0 {
		fmt.Fprintln(os.Stderr, "soak: -ids must be 1 to 10^10-1; -rate, -inflight and -sample positive")
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func defaultRedisURL() string {
	if u := os.Getenv("SLUICE_TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379"
}

// system is what runs under load: NATS, a bridge and a limiter.
type system struct {
	srv    *embedded.Server
	conns  []*nats.Conn
	bridge *bridge.Bridge
	tr     *link.Bridge
	link   *link.Global
	svc    *service.Service
	lim    *transport.Limiter
	redis  *region.Redis // a client of its own, for the final check and clean-up
	traced *tracedOrigin // Redis as the breaker sees it
	// the read and apply breakers: how often each opened, and for how long.
	reads, applies openTracker
	prefix         string
	shutdown       bool
}

func start(ctx context.Context, c config) (*system, error) {
	s := &system{prefix: fmt.Sprintf("sluicesoak:%d", time.Now().UnixNano())}
	var err error
	if s.srv, err = natstest.StartServer(ctx); err != nil {
		return s, err
	}
	connect := func(name string) (*nats.Conn, error) {
		nc, err := nats.Connect(s.srv.ClientURL(), nats.Name(name), nats.MaxReconnects(0))
		if err == nil {
			s.conns = append(s.conns, nc)
		}
		return nc, err
	}

	// The bridge, with an in-memory store.
	bnc, err := connect("soak-bridge")
	if err != nil {
		return s, err
	}
	s.tr = link.NewBridge(bnc, wire.Subjects{}, regionName, nil)
	if s.bridge, err = bridge.NewBridge(bridge.BridgeConfig{Region: regionName, Store: bridge.NewMemoryStore(), Transport: s.tr}); err != nil {
		return s, err
	}
	s.bridge.Start(ctx)
	if err := s.tr.Serve(s.bridge); err != nil {
		return s, err
	}

	// The limiter: Redis behind the breaker, the global link, the endpoints.
	if s.redis, err = region.NewRedis(region.RedisConfig{URL: c.redisURL, KeyPrefix: s.prefix}); err != nil {
		return s, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = s.redis.Ping(pctx)
	cancel()
	if err != nil {
		return s, fmt.Errorf("redis at %s: %w (run make services)", c.redisURL, err)
	}
	rd, err := region.NewRedis(region.RedisConfig{URL: c.redisURL, KeyPrefix: s.prefix})
	if err != nil {
		return s, err
	}
	lnc, err := connect("soak-limiter")
	if err != nil {
		return s, err
	}
	s.link = link.NewGlobal(lnc, wire.Subjects{}, regionName, nil)
	s.traced = &tracedOrigin{Origin: rd}
	bk := region.NewBreaker(s.traced, region.BreakerConfig{Name: "redis", OnStateChange: s.breakerChanged})
	// ExpiryGrace keeps every cell of the run in Redis until the comparison
	// after shutdown: with one-minute windows, the first minute's cells would
	// otherwise expire (end of the next window + 60s) during a 3-minute run.
	s.svc = service.New(service.Config{Origin: bk,
		Region: regionName, Global: s.link, ExpiryGrace: 30 * time.Minute})
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = s.link.Attach(actx, s.svc)
	cancel()
	if err != nil {
		return s, err
	}
	if s.lim, err = transport.Serve(lnc, transport.LimiterConfig{Service: s.svc, Region: regionName}); err != nil {
		return s, err
	}
	return s, lnc.Flush()
}

func (s *system) breakerChanged(call region.Call, _, to gobreaker.State) {
	if call == region.CallApply {
		s.applies.changed(to)
	} else {
		s.reads.changed(to)
	}
}

// openTracker follows one breaker: how often it opened, and for how long.
type openTracker struct {
	opens atomic.Int64
	mu    sync.Mutex
	at    time.Time
	total time.Duration
}

func (o *openTracker) changed(to gobreaker.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case to == gobreaker.StateOpen && o.at.IsZero():
		o.opens.Add(1)
		o.at = time.Now()
	case to == gobreaker.StateClosed && !o.at.IsZero():
		o.total += time.Since(o.at)
		o.at = time.Time{}
	}
}

// openFor is how long the breaker was open (or half-open) in all.
func (o *openTracker) openFor() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.total
	if !o.at.IsZero() {
		d += time.Since(o.at)
	}
	return d
}

// tracedOrigin counts the calls that reach Redis through the breaker and
// how they fail: what opens the breaker.
type tracedOrigin struct {
	region.Origin
	reads, readErrs, readDeadline, applies, applyErrs, applyDeadline atomic.Int64
	slowestRead, slowestApply                                        atomic.Int64 // ns
	firstReadErr, firstApplyErr                                      atomic.Value // string
}

func (o *tracedOrigin) note(start time.Time, err error, slowest, errs, deadline *atomic.Int64, first *atomic.Value) {
	took := int64(time.Since(start))
	for {
		old := slowest.Load()
		if took <= old || slowest.CompareAndSwap(old, took) {
			break
		}
	}
	if err != nil {
		errs.Add(1)
		if errors.Is(err, context.DeadlineExceeded) {
			deadline.Add(1)
		}
		first.CompareAndSwap(nil, err.Error())
	}
}

func (o *tracedOrigin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	o.reads.Add(1)
	start := time.Now()
	res, err := o.Origin.Sync(ctx, reporter, s)
	o.note(start, err, &o.slowestRead, &o.readErrs, &o.readDeadline, &o.firstReadErr)
	return res, err
}

func (o *tracedOrigin) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	o.applies.Add(1)
	start := time.Now()
	res, err := o.Origin.Settle(ctx, reporter, ss)
	o.note(start, err, &o.slowestApply, &o.applyErrs, &o.applyDeadline, &o.firstApplyErr)
	return res, err
}

func (o *tracedOrigin) summary() string {
	first := func(v *atomic.Value) string {
		if s, ok := v.Load().(string); ok {
			return " (first: " + s + ")"
		}
		return ""
	}
	return fmt.Sprintf("syncs %d, %d failed (%d past their deadline)%s, slowest %v; settle calls %d, %d failed (%d past their deadline)%s, slowest %v",
		o.reads.Load(), o.readErrs.Load(), o.readDeadline.Load(), first(&o.firstReadErr), time.Duration(o.slowestRead.Load()).Round(time.Millisecond),
		o.applies.Load(), o.applyErrs.Load(), o.applyDeadline.Load(), first(&o.firstApplyErr), time.Duration(o.slowestApply.Load()).Round(time.Millisecond))
}

// stop shuts the limiter down gracefully (everything settled), then the rest.
func (s *system) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if s.lim != nil {
		errs = append(errs, s.lim.Shutdown(ctx))
	}
	if s.svc != nil {
		errs = append(errs, s.svc.Close(ctx))
	}
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	if s.tr != nil {
		errs = append(errs, s.tr.Close())
	}
	if s.bridge != nil {
		errs = append(errs, s.bridge.Close(ctx))
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	if s.srv != nil {
		s.srv.Shutdown()
	}
	s.shutdown = true
	return errors.Join(errs...)
}

// cleanup deletes the run's keys from the shared Redis (they would expire
// within minutes anyway).
func (s *system) cleanup() {
	if s.redis == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := s.redis.Client()
	iter := cl.Scan(ctx, 0, s.prefix+"*", 10_000).Iterator()
	batch := make([]string, 0, 1000)
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == cap(batch) {
			cl.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		cl.Unlink(ctx, batch...)
	}
	s.redis.Close()
}

// template is a msgpack check request whose identifier ends in digits that
// are rewritten in place for each request.
type template struct {
	body []byte
	at   int // offset of the digits
}

func newTemplate(prefix string, limit int64) template {
	id := prefix + string(bytes.Repeat([]byte("0"), digits))
	body := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: limit, Duration: windowMs, Cost: 1})
	return template{body: body, at: bytes.Index(body, []byte(id)) + len(prefix)}
}

// with writes n into the digits and returns the body.
func (t template) with(n int) []byte {
	for i := t.at + digits - 1; i >= t.at; i-- {
		t.body[i] = byte('0' + n%10)
		n /= 10
	}
	return t.body
}

func mainID(n int) string { return fmt.Sprintf("soak-user-%0*d", digits, n) }

// hist is a log-linear latency histogram (8 buckets per power of two of
// microseconds, so within 12.5%), updated and read atomically.
type hist [512]atomic.Int64

func histBucket(us uint64) int {
	if us < 8 {
		return int(us)
	}
	e := bits.Len64(us) - 4
	return min(8*e+int(us>>e), len(hist{})-1)
}

// histUpper is the upper bound, in microseconds, of bucket i.
func histUpper(i int) time.Duration {
	if i < 8 {
		return time.Duration(i+1) * time.Microsecond
	}
	e := i/8 - 1
	m := i%8 + 8
	return time.Duration((m+1)<<e) * time.Microsecond
}

func (h *hist) snapshot() (out [512]int64) {
	for i := range h {
		out[i] = h[i].Load()
	}
	return out
}

// percentile of the counts between two snapshots.
func percentile(before, after *[512]int64, p float64) time.Duration {
	var total int64
	for i := range after {
		total += after[i] - before[i]
	}
	if total == 0 {
		return 0
	}
	want := int64(math.Ceil(p * float64(total)))
	var acc int64
	for i := range after {
		if acc += after[i] - before[i]; acc >= want {
			return histUpper(i)
		}
	}
	return histUpper(len(after) - 1)
}

// load is the generator.
type load struct {
	c        config
	nc       *nats.Conn
	subject  string
	inbox    string
	replyTo  []string
	sentAt   []atomic.Int64 // per slot: unix ns the request was sent, 0 when free
	free     chan int
	main     template
	hot      template
	lat      hist
	stopping chan struct{} // closed: stop sending
	done     chan struct{} // closed by pace when it stopped sending
	reaped   chan struct{} // closed: stop reaping (everything answered or timed out)

	sent, answered, admitted, denied  atomic.Int64
	mainDenied, hotAdmitted, hotDenie atomic.Int64
	timeouts, serviceErrs, noResp     atomic.Int64
	badReplies, late                  atomic.Int64
	firstErr                          atomic.Value // string

	// mainSent counts checks of the cycling identifiers: the n-th goes to
	// identifier n mod ids. windows records, per window sequence, mainSent
	// when the window's first check was sent.
	mainSent atomic.Int64
	winMu    sync.Mutex
	windows  map[int64]int64
}

func newLoad(c config, nc *nats.Conn) *load {
	l := &load{c: c, nc: nc, subject: wire.Subjects{}.Check(workspace, namespace), inbox: nats.NewInbox(),
		sentAt: make([]atomic.Int64, c.inflight), free: make(chan int, c.inflight),
		main: newTemplate("soak-user-", mainLimit), hot: newTemplate("soak-hot0-", hotLimit),
		stopping: make(chan struct{}), done: make(chan struct{}), reaped: make(chan struct{}), windows: map[int64]int64{}}
	for i := range c.inflight {
		l.replyTo = append(l.replyTo, l.inbox+"."+strconv.Itoa(i))
		l.free <- i
	}
	return l
}

func (l *load) fail(format string, args ...any) {
	l.firstErr.CompareAndSwap(nil, fmt.Sprintf(format, args...))
}

// onReply handles one reply (the subscription's callback: one at a time).
func (l *load) onReply(m *nats.Msg) {
	slot, err := strconv.Atoi(m.Subject[len(l.inbox)+1:])
	if err != nil || slot < 0 || slot >= len(l.sentAt) {
		l.badReplies.Add(1)
		return
	}
	at := l.sentAt[slot].Swap(0)
	if at == 0 {
		l.late.Add(1) // already counted as a timeout
		return
	}
	us := (time.Now().UnixNano() - at) / 1000
	l.lat[histBucket(uint64(max(us, 0)))].Add(1)
	l.answered.Add(1)
	defer func() { l.free <- slot }()
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		l.noResp.Add(1)
		l.fail("no responders")
		return
	}
	if err := bus.ReplyError(m); err != nil {
		l.serviceErrs.Add(1)
		l.fail("%v", err)
		return
	}
	resp, err := wire.DecodeCheckResponse(bus.Msgpack, m.Data)
	if err != nil {
		l.badReplies.Add(1)
		l.fail("%v", err)
		return
	}
	hot := resp.Limit == hotLimit
	switch {
	case resp.Success:
		l.admitted.Add(1)
		if hot {
			l.hotAdmitted.Add(1)
		}
	default:
		l.denied.Add(1)
		if hot {
			l.hotDenie.Add(1)
		} else {
			l.mainDenied.Add(1)
		}
	}
}

// reap counts requests unanswered after the timeout as failed and frees
// their slots.
func (l *load) reap() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-l.reaped:
			return
		case <-t.C:
		}
		limit := time.Now().Add(-l.c.timeout).UnixNano()
		for i := range l.sentAt {
			if at := l.sentAt[i].Load(); at != 0 && at < limit && l.sentAt[i].CompareAndSwap(at, 0) {
				l.timeouts.Add(1)
				l.fail("a check was not answered within %v", l.c.timeout)
				l.free <- i
			}
		}
	}
}

// pace sends checks at the configured rate until stopping is closed. It may
// fall behind by at most 100ms of checks (when every slot is in flight);
// what it could not send then is dropped, and the achieved rate shows it.
func (l *load) pace() {
	defer close(l.done)
	rate := float64(l.c.rate)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	budget := 0.0
	k := 0
	curSeq := int64(-1)
	for {
		var now time.Time
		select {
		case <-l.stopping:
			return
		case now = <-tick.C:
		}
		budget = min(budget+now.Sub(last).Seconds()*rate, rate/10)
		last = now
		seq := now.UnixMilli() / windowMs
		for ; budget >= 1; budget-- {
			var slot int
			select {
			case slot = <-l.free:
			case <-l.stopping:
				return
			}
			var body []byte
			if k++; k%hotEvery == 0 {
				body = l.hot.with(k / hotEvery % hotIDs)
			} else {
				n := l.mainSent.Load()
				if seq != curSeq {
					l.winMu.Lock()
					l.windows[seq] = n
					l.winMu.Unlock()
					curSeq = seq
				}
				body = l.main.with(int(n % int64(l.c.ids)))
				l.mainSent.Store(n + 1)
			}
			l.sentAt[slot].Store(time.Now().UnixNano())
			if err := l.nc.PublishRequest(l.subject, l.replyTo[slot], body); err != nil {
				l.sentAt[slot].Store(0)
				l.free <- slot
				l.fail("publish: %v", err)
				continue
			}
			l.sent.Add(1)
		}
	}
}

// active returns, at time now, how many identifiers were touched in the
// current or previous window (the limiter's live table entries, each with
// its current and previous cell) and how many (identifier, window) cells
// hold a count.
func (l *load) active(now time.Time) (ids, cells int64) {
	n := l.mainSent.Load()
	seq := now.UnixMilli() / windowMs
	l.winMu.Lock()
	defer l.winMu.Unlock()
	N := int64(l.c.ids)
	touched := func(s int64) int64 {
		start, ok := l.windows[s]
		if !ok {
			return 0
		}
		end := n
		if next, ok := l.windows[s+1]; ok {
			end = next
		}
		return min(N, end-start)
	}
	cells = touched(seq) + touched(seq-1)
	from, ok := l.windows[seq-1]
	if !ok {
		from, ok = l.windows[seq]
	}
	if ok {
		ids = min(N, n-from)
	}
	return ids, cells
}

// expected is how many checks of identifier i were sent over the run.
func (l *load) expected(i int) int64 {
	n, N := l.mainSent.Load(), int64(l.c.ids)
	e := n / N
	if int64(i) < n%N {
		e++
	}
	return e
}

type sample struct {
	at                 time.Duration
	rate               float64
	p50, p99           time.Duration
	errors             int64
	heap               uint64
	ids, cells         int64
	svcCells           int64
	allActive          bool
	goroutines, queued int64
	// per second, from the service's stats
	settled, settleErrs, reads, readErrs float64
	readOpens, applyOpens                int64
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func run(c config) (err error) {
	ctx := context.Background()
	s, err := start(ctx, c)
	defer func() {
		if !s.shutdown {
			err = errors.Join(err, s.stop())
		}
		s.cleanup()
	}()
	if err != nil {
		return err
	}
	cnc, err := nats.Connect(s.srv.ClientURL(), nats.Name("soak-load"), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	s.conns = append(s.conns, cnc)
	l := newLoad(c, cnc)
	sub, err := cnc.Subscribe(l.inbox+".*", l.onReply)
	if err != nil {
		return err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}
	if err := cnc.Flush(); err != nil {
		return err
	}
	// One check answered end to end before measuring anything.
	if _, err := cnc.Request(l.subject, l.hot.with(hotIDs), 5*time.Second); err != nil {
		return fmt.Errorf("first check: %w", err)
	}

	fmt.Printf("soak: %v, %d identifiers (20 bytes, 1-minute windows), %d checks/s, %d in flight, Redis %s prefix %s\n",
		c.dur, c.ids, c.rate, c.inflight, c.redisURL, s.prefix)
	liveHeap()
	base := liveHeap()
	fmt.Printf("live heap before the load: %.1f MB\n\n", float64(base)/1e6)

	startAt := time.Now()
	go l.reap()
	go l.pace()
	var samples []sample
	prevH := l.lat.snapshot()
	prevN, prevT := int64(0), startAt
	// rates are the service's counters shown per second: cells settled,
	// settle errors, origin syncs and their errors.
	rates := func(st service.Stats) []int64 {
		return []int64{st.SettleCells, st.SettleErrors, st.OriginSyncs, st.OriginSyncErrors}
	}
	prevStats := rates(s.svc.Stats())
	// fullAt is when every identifier had been sent once.
	var fullAt time.Time
	fmt.Printf("%6s %9s %9s %9s %6s %8s %10s %10s %10s %8s %10s %9s %8s %9s %10s %7s\n",
		"t", "checks/s", "p50", "p99", "errors", "heap MB", "active ids", "cells", "svc ids", "queued",
		"settled/s", "failed/s", "reads/s", "failed/s", "opens r/a", "gorout.")
	endAt := startAt.Add(c.dur)
	for k, last := 1, false; !last; k++ {
		next := startAt.Add(time.Duration(k) * c.sample)
		if endAt.Sub(next) < c.sample/2 { // the last interval takes up a short remainder
			next, last = endAt, true
		}
		time.Sleep(time.Until(next))
		now := time.Now()
		if fullAt.IsZero() && l.mainSent.Load() >= int64(c.ids) {
			fullAt = now
		}
		h := l.lat.snapshot()
		answered := l.answered.Load()
		sm := sample{at: now.Sub(startAt).Round(time.Second),
			rate: float64(answered-prevN) / now.Sub(prevT).Seconds(),
			p50:  percentile(&prevH, &h, 0.50), p99: percentile(&prevH, &h, 0.99),
			errors:     l.timeouts.Load() + l.serviceErrs.Load() + l.noResp.Load() + l.badReplies.Load(),
			goroutines: int64(runtime.NumGoroutine()),
			allActive:  !fullAt.IsZero()}
		st := s.svc.Stats()
		for i, v := range rates(st) {
			out := []*float64{&sm.settled, &sm.settleErrs, &sm.reads, &sm.readErrs}[i]
			*out, prevStats[i] = float64(v-prevStats[i])/now.Sub(prevT).Seconds(), v
		}
		sm.readOpens, sm.applyOpens = s.reads.opens.Load(), s.applies.opens.Load()
		prevH, prevN, prevT = h, answered, now
		sm.ids, sm.cells = l.active(now)
		sm.heap = liveHeap()
		sm.svcCells, sm.queued = st.Cells, st.SettleQueued
		samples = append(samples, sm)
		fmt.Printf("%6v %9.0f %9v %9v %6d %8.1f %10d %10d %10d %8d %10.0f %9.0f %8.0f %9.0f %10s %7d\n", sm.at, sm.rate, sm.p50, sm.p99,
			sm.errors, float64(sm.heap)/1e6, sm.ids, sm.cells, sm.svcCells, sm.queued,
			sm.settled, sm.settleErrs, sm.reads, sm.readErrs, fmt.Sprintf("%d/%d", sm.readOpens, sm.applyOpens), sm.goroutines)
	}
	if c.memprofile != "" {
		if err := writeHeapProfile(c.memprofile); err != nil {
			return err
		}
	}
	close(l.stopping)
	<-l.done
	// Let what is in flight come back (or time out).
	for wait := time.Now().Add(c.timeout + time.Second); time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
		if len(l.free) == c.inflight {
			break
		}
	}
	close(l.reaped)
	elapsed := time.Since(startAt)

	end := samples[len(samples)-1]
	fmt.Println()
	fmt.Printf("checks: %d sent, %d answered (%.0f/s), %d admitted, %d denied (hot identifiers: %d admitted, %d denied; cycling identifiers denied: %d)\n",
		l.sent.Load(), l.answered.Load(), float64(l.answered.Load())/elapsed.Seconds(), l.admitted.Load(), l.denied.Load(),
		l.hotAdmitted.Load(), l.hotDenie.Load(), l.mainDenied.Load())
	errs := l.timeouts.Load() + l.serviceErrs.Load() + l.noResp.Load() + l.badReplies.Load()
	fmt.Printf("errors: %d (timeouts %d, service errors %d, no responders %d, malformed replies %d; late replies %d)\n",
		errs, l.timeouts.Load(), l.serviceErrs.Load(), l.noResp.Load(), l.badReplies.Load(), l.late.Load())
	if e, ok := l.firstErr.Load().(string); ok {
		fmt.Printf("first error: %s\n", e)
	}
	grown := float64(end.heap) - float64(base)
	fmt.Printf("live heap: %.1f MB before the load, %.1f MB at the end under load: +%.1f MB\n",
		float64(base)/1e6, float64(end.heap)/1e6, grown/1e6)
	if end.ids > 0 {
		// A window cell is (workspace, namespace, identifier, duration,
		// sequence); an identifier in steady traffic has two live: the current
		// and the previous window's.
		fmt.Printf("memory per active cell: %.0f bytes (%d identifiers touched in the last two windows, 2 window cells each; target <= 256)\n",
			grown/float64(2*end.ids), end.ids)
		fmt.Printf("  per active identifier: %.0f bytes; %d cells hold a count\n", grown/float64(end.ids), end.cells)
	}
	fmt.Printf("  the service's own count (as of its last janitor sweep): %d identifiers\n", end.svcCells)
	// Heap stability: the slope over the samples taken once every
	// identifier had been sent (least squares).
	var xs, ys []float64
	for _, sm := range samples {
		if sm.allActive {
			xs = append(xs, sm.at.Seconds())
			ys = append(ys, float64(sm.heap))
		}
	}
	if len(xs) >= 3 {
		slope := leastSquares(xs, ys)
		fmt.Printf("heap slope once every identifier was active (%d samples, %v to %v): %+.2f MB/min (%+.2f%% of the end heap per minute)\n",
			len(xs), samples[len(samples)-len(xs)].at, end.at, slope*60/1e6, 100*slope*60/float64(end.heap))
	} else {
		fmt.Printf("heap slope: n/a (only %d samples after every identifier was active: run longer or use fewer -ids)\n", len(xs))
	}
	fmt.Printf("Redis read breaker: opened %d times, open %v in all (checks decide locally meanwhile)\n",
		s.reads.opens.Load(), s.reads.openFor().Round(time.Millisecond))
	fmt.Printf("Redis apply breaker: opened %d times, open %v in all (settles wait meanwhile)\n",
		s.applies.opens.Load(), s.applies.openFor().Round(time.Millisecond))
	fmt.Printf("calls that reached Redis: %s\n", s.traced.summary())
	bst := s.bridge.Stats()
	fmt.Printf("global path: bridge holds %d cells; %d components in from the limiter, %d store writes\n",
		bst.Cells, bst.ComponentsIn, bst.StoreWrites)

	// Shut down (everything settled), then compare Redis with what was admitted.
	if err := s.stop(); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	var verr error
	if errs == 0 && l.mainDenied.Load() == 0 {
		verr = verify(s.redis, l, startAt, time.Now())
	} else {
		fmt.Println("Redis totals: not checked (some checks failed or were denied)")
	}
	if errs > 0 {
		return fmt.Errorf("%d checks failed", errs)
	}
	return verr
}

// verify reads, for verifyIDs identifiers spread over the set, every window
// the run touched, and compares the sum with the checks sent for it (all of
// them admitted).
func verify(rd *region.Redis, l *load, from, to time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, last := from.UnixMilli()/windowMs, to.UnixMilli()/windowMs
	step := max(1, l.c.ids/verifyIDs)
	checked, wrong := 0, 0
	var firstWrong string
	for i := 0; i < l.c.ids; i += step {
		var total int64
		for seq := last + 1; seq >= first; seq -= 2 {
			cur, prev, err := rd.Read(ctx, window.Cell{Workspace: workspace, Namespace: namespace, Identifier: mainID(i), Duration: windowMs, Sequence: seq})
			if err != nil {
				return fmt.Errorf("read Redis: %w", err)
			}
			total += cur.Count + prev.Count
		}
		checked++
		if want := l.expected(i); total != want {
			if wrong++; wrong == 1 {
				firstWrong = fmt.Sprintf("%s: Redis %d, admitted %d", mainID(i), total, want)
			}
		}
	}
	if wrong > 0 {
		return fmt.Errorf("Redis totals differ from what was admitted for %d of %d identifiers (first: %s)", wrong, checked, firstWrong)
	}
	fmt.Printf("Redis totals after shutdown: exactly what was admitted for all %d identifiers checked\n", checked)
	return nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// leastSquares returns the slope of the best line through (xs, ys).
func leastSquares(xs, ys []float64) float64 {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(ys))
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}
