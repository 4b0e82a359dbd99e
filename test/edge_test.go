package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// "One count of a cell" (docs/architecture.md) at every edge. Three limiter processes
// on one Redis at default flags, traffic sent round robin to each of them
// (pinned subject prefixes, so the test knows each one's rate), and a
// SIGKILL at an edge: far from the limit, near it, after a burst, after a
// Redis cut, during one. Once the dust settles (1.5s after the last kill, when no dead
// lease is live; and again after the survivors stopped with SIGTERM) every
// view of the cell says the same count, within what the kills may leave
// unknown:
//
//	(a) region.Redis.Read's Count (a region.NewRedis on the same URL and prefix)
//	(b) the bridge's sweep: region.Redis.ScanCounts as cmd/bridge calls it
//	(c) a look (cost 0) through a freshly started limiter: limit − remaining
//	(d) a look through each surviving limiter
//
// each lies within [admitted, admitted + Σ bound], one bound per kill:
// max(⌈limit/100⌉, ⌈0.2s × r⌉), r the checks/s the killed process was
// admitting on the cell in the second before its kill, measured as the
// limiter measures it (over 100 ms at least: the busiest 100 ms of that
// second, or its average if higher). admitted counts the
// replies the test received with success; every check gets its reply (a
// process is taken out of the rotation, and its checks in flight answered,
// before it is killed). Windows are about 10 minutes and identifiers fresh,
// so the previous cell is empty and a look's remaining is limit − used
// exactly while the limit is not exhausted. No check is admitted over the
// limit.
func TestOneRegionOneCountAtEveryEdge(t *testing.T) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("wall time %v", time.Since(start).Round(time.Millisecond)) })

	// 100,000 per window, 240 checks/s over three limiters (80 each), three
	// SIGKILLs of different limiters 1.5s apart, a new limiter started after
	// each.
	t.Run("far from the limit, three kills and replacements", func(t *testing.T) {
		e := startEdgeRegion(t, redistest.SharedURL(t), "", 100_000)
		stop := e.traffic(240)
		for i := range 3 {
			e.sleepUntil(time.Duration(i+1) * 1500 * time.Millisecond)
			e.kill(e.limiterByName(fmt.Sprint("lim", i)))
			e.add()
		}
		e.sleepUntil(6 * time.Second)
		stop()
		e.settleAndCompare()
	})

	// 600 per window at 200 checks/s, twice the rate that spends it in 6s:
	// exhausted after about 3s. One SIGKILL at 1.5s, while not exhausted;
	// the traffic goes on to 5s over the two survivors.
	t.Run("near the limit, one kill before it is exhausted", func(t *testing.T) {
		e := startEdgeRegion(t, redistest.SharedURL(t), "", 600)
		stop := e.traffic(200)
		e.sleepUntil(1500 * time.Millisecond)
		victim := e.limiterByName("lim0")
		e.kill(victim)
		if got := e.admitted.Load(); got >= e.limit {
			t.Fatalf("the limit was exhausted (%d admitted) before the kill; the case wants it not yet", got)
		}
		e.sleepUntil(5 * time.Second)
		stop()
		if e.denied.Load() == 0 {
			t.Errorf("no check was denied: the traffic (%d admitted) never reached the limit %d", e.admitted.Load(), e.limit)
		}
		e.settleAndCompare()
	})

	// The case: 600 per window, a burst of 100 on one limiter, then
	// 60 checks/s over all three, that limiter SIGKILLed 2s after the
	// burst; the traffic goes on 1.5s over the survivors.
	t.Run("after a burst on the killed limiter", func(t *testing.T) {
		e := startEdgeRegion(t, redistest.SharedURL(t), "", 600)
		victim := e.limiterByName("lim0")
		if got := e.burst(victim, 100, 32); got != 100 {
			t.Fatalf("a burst of 100 at a limit of 600 admitted %d", got)
		}
		burstEnd := time.Since(e.start)
		stop := e.traffic(60)
		e.sleepUntil(burstEnd + 2*time.Second)
		e.kill(victim)
		e.sleepUntil(burstEnd + 3500*time.Millisecond)
		stop()
		e.settleAndCompare()
	})

	// The limiters reach Redis through a proxy the test controls: 10,000 per
	// window, 150 checks/s over three, Redis cut (black-holed) for 2s from
	// 1.5s in, healed, one limiter SIGKILLed 1s after healing; the traffic
	// goes on 1s over the survivors.
	t.Run("after a Redis cut", func(t *testing.T) {
		shared := redistest.SharedURL(t)
		proxy, err := tcpproxy.Start(strings.TrimPrefix(shared, "redis://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		e := startEdgeRegion(t, shared, "redis://"+proxy.Addr(), 10_000)
		stop := e.traffic(150)
		e.sleepUntil(1500 * time.Millisecond)
		proxy.SetMode(tcpproxy.Blackhole)
		before := e.admitted.Load()
		e.sleepUntil(3500 * time.Millisecond)
		proxy.SetMode(tcpproxy.Pass)
		t.Logf("%d admitted while Redis was cut", e.admitted.Load()-before)
		e.sleepUntil(4500 * time.Millisecond)
		e.kill(e.limiterByName("lim0"))
		e.sleepUntil(5500 * time.Millisecond)
		stop()
		e.settleAndCompare()
	})

	// The same proxy, and the region's bridge (in-memory store, sweeping
	// the same Redis directly): 10,000 per window, 150 checks/s over three,
	// Redis refused from 1.5s, one limiter SIGKILLed at 2.5s while Redis is
	// still cut, Redis healed at 3.5s, the traffic goes on to 5s over the
	// two survivors. What the killed limiter admitted while Redis was cut
	// and its lease did not cover never reached Redis; the assertion allows
	// every view to be below admitted by what a restoration from the
	// bridge's own count would miss (what it admitted after its last
	// publication: 1% of the limit or 20ms of its traffic). The limiters'
	// subject prefixes are their own, so a relay joins them to the bridge.
	//
	// Measured (the relay and the bridge log it): in one region the bridge
	// broadcasts no import at all (it takes a cell's import only when
	// another region's component rose; imports_broadcast 0, no "o" or "b"
	// in the hash), and its own component is the greatest count one limiter
	// published, which the survivors' counts exceed: the killed limiter's
	// local admissions are lost whole (23 of 731 in one run, exactly the
	// admissions it made past its lease; the survivors' own are counted
	// once). At this limit that stays within the allowance (102); at a
	// limit of 2,000 the same run loses 30 against an allowance of 21.
	// A 2s Redis cut with a SIGKILL in its middle, limit 2,000 at 150
	// checks/s. While Redis is cut each limiter decides locally from its own
	// count, and publishes its local count of the cell to the region's
	// other limiters before it answers (the limiters' subject prefixes are
	// their own here, so the case relays <name>.local.r1 between them, as
	// one prefix would carry it). Once Redis answers, the survivors raise
	// it to the killed limiter's local count: nothing it admitted is lost,
	// and every view lies within [admitted, admitted + the kill's bound]
	// (docs/architecture.md, "Local counts"). Without them every view
	// ends short by what the killed limiter admitted past its lease while
	// Redis was cut.
	t.Run("during a Redis cut", func(t *testing.T) {
		shared := redistest.SharedURL(t)
		proxy, err := tcpproxy.Start(strings.TrimPrefix(shared, "redis://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		e := startEdgeRegion(t, shared, "redis://"+proxy.Addr(), 2_000)
		stop := e.traffic(150)
		e.sleepUntil(1500 * time.Millisecond)
		proxy.SetMode(tcpproxy.Refuse)
		cutAt := time.Now()
		before := e.admitted.Load()
		e.sleepUntil(2500 * time.Millisecond)
		victim := e.limiterByName("lim0")
		e.kill(victim)
		killedAt := e.lastKillAt()
		e.sleepUntil(3500 * time.Millisecond)
		proxy.SetMode(tcpproxy.Pass)
		healAt := time.Now()
		during := victim.admitsIn(cutAt, killedAt)
		t.Logf("Redis refused from %v to %v: %d admitted meanwhile; %s admitted %d of them before its kill at %v",
			cutAt.Sub(e.start).Round(time.Millisecond), healAt.Sub(e.start).Round(time.Millisecond),
			e.admitted.Load()-before, victim.name, during, killedAt.Sub(e.start).Round(time.Millisecond))
		e.sleepUntil(5 * time.Second)
		stop()
		e.settleViews(5 * time.Second)
		e.settleAndCompare()
	})
}

// admitsIn returns how many of l's admitted replies arrived in [from, to).
func (l *edgeLimiter) admitsIn(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.admits {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// settleViews polls Redis's count of the cell (region.Redis.Read) until it
// lies within [admitted, admitted + Σ bound], has not changed for a
// second and no dead lease can be live (1.5s after the last kill), or
// until within has passed; it logs every value it saw.
func (e *edgeRegion) settleViews(within time.Duration) {
	e.t.Helper()
	admitted := e.admitted.Load()
	e.mu.Lock()
	var slack int64
	for _, k := range e.kills {
		slack += k.bound
	}
	e.mu.Unlock()
	deadline := time.Now().Add(within)
	last, since := int64(-1), time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		cur, _, err := e.direct.Read(ctx, e.cell)
		cancel()
		now := time.Now()
		if err != nil {
			e.t.Logf("settling: read at %v: %v", now.Sub(e.start).Round(time.Millisecond), err)
		} else if cur.Count != last {
			e.t.Logf("settling: at %v Redis says %d used (admitted %d, %+d)", now.Sub(e.start).Round(time.Millisecond),
				cur.Count, admitted, cur.Count-admitted)
			last, since = cur.Count, now
		}
		in := err == nil && cur.Count >= admitted && cur.Count <= admitted+slack
		if in && now.Sub(since) >= time.Second && now.After(e.lastKillAt().Add(1500*time.Millisecond)) {
			e.t.Logf("settled at %v: %d used, admitted %d", now.Sub(e.start).Round(time.Millisecond), cur.Count, admitted)
			return
		}
		if now.After(deadline) {
			e.t.Logf("not settled in range [%d, %d] by %v: Redis says %d", admitted, admitted+slack,
				now.Sub(e.start).Round(time.Millisecond), last)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// edgeRegion is a region of pinned limiter processes on one Redis, the
// traffic the test sends one identifier, and the kills.
type edgeRegion struct {
	t         *testing.T
	natsURL   string
	nc        *nats.Conn
	redisURL  string // what the limiters are given
	directURL string // the same Redis, not through any proxy
	prefix    string
	direct    *region.Redis
	raw       *redis.Client

	id       string
	limit    int64
	duration int64
	cell     window.Cell
	start    time.Time

	mu       sync.Mutex
	alive    []*edgeLimiter // in the rotation
	all      []*edgeLimiter
	kills    []edgeKill
	killedAt time.Time // when the last SIGKILL was sent
	next     int       // number of the next limiter's subject prefix
	nextRaw  int       // number of the next look limiter's subject prefix

	admitted, denied atomic.Int64
	trafficEnd       time.Time
}

// edgeLimiter is one limiter process on its own subject prefix, and what
// it admitted of the test's traffic.
type edgeLimiter struct {
	name     string
	proc     *process
	client   *bus.Client
	inflight atomic.Int64
	dead     bool

	mu     sync.Mutex
	admits []time.Time // when each admitted reply arrived
}

// edgeKill is one SIGKILL and the bound it allows.
type edgeKill struct {
	name  string
	rate  float64 // checks/s the process admitted in the second before
	bound int64
}

// startEdgeRegion starts three limiter processes at default flags on their
// own subject prefixes (lim0, lim1, lim2), given limiterURL for Redis (""
// for directURL), and picks a fresh identifier and a window of 10 minutes
// or a little more with at least 40s left.
func startEdgeRegion(t *testing.T, directURL, limiterURL string, limit int64) *edgeRegion {
	t.Helper()
	if limiterURL == "" {
		limiterURL = directURL
	}
	srv := startServer(t)
	e := &edgeRegion{t: t, natsURL: srv.ClientURL(), redisURL: limiterURL, directURL: directURL,
		prefix: redistest.Prefix(t), limit: limit}
	e.nc = connect(t, e.natsURL)
	var err error
	if e.direct, err = region.NewRedis(region.RedisConfig{URL: directURL, KeyPrefix: e.prefix}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.direct.Close() })
	opt, err := redis.ParseURL(directURL)
	if err != nil {
		t.Fatal(err)
	}
	e.raw = redis.NewClient(opt)
	t.Cleanup(func() { e.raw.Close() })
	e.relayLocals()
	for range 3 {
		e.alive = append(e.alive, e.startLimiter(fmt.Sprint("lim", e.next)))
		e.next++
	}
	waitService(t, e.nc, "ratelimit", 3*instancesPerLimiter)

	e.duration = edgeWindow(t, 40*time.Second)
	e.id = fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	now := time.Now()
	e.cell = window.Cell{Workspace: "acme", Namespace: "api", Identifier: e.id, Duration: e.duration,
		Sequence: window.Sequence(now.UnixMilli(), e.duration)}
	e.start = now
	t.Logf("identifier %s, limit %d per %v, Redis key %s", e.id, limit, time.Duration(e.duration)*time.Millisecond, e.direct.Key(e.cell))
	return e
}

// relayLocals passes each limiter's local counts (<name>.local.r1) on to
// every other limiter of the case, as one subject prefix shared by the
// region's limiters would.
func (e *edgeRegion) relayLocals() {
	e.t.Helper()
	const relayed = "Sluice-Test-Relayed"
	sub, err := e.nc.Subscribe("*.local.r1", func(m *nats.Msg) {
		if m.Header.Get(relayed) != "" {
			return
		}
		from := m.Subject[:strings.IndexByte(m.Subject, '.')]
		e.mu.Lock()
		names := make([]string, 0, len(e.all))
		for _, l := range e.all {
			if l.name != from {
				names = append(names, l.name)
			}
		}
		e.mu.Unlock()
		for _, name := range names {
			h := nats.Header{}
			for k, v := range m.Header {
				h[k] = v
			}
			h.Set(relayed, "1")
			if err := e.nc.PublishMsg(&nats.Msg{Subject: name + ".local.r1", Header: h, Data: m.Data}); err != nil {
				e.t.Errorf("relaying a local count: %v", err)
			}
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// edgeWindow returns a window of 10 to 19 whole minutes whose current
// window has at least room left, so no case straddles two windows and none
// waits for a boundary (one of ten such windows nearly always has room).
func edgeWindow(t *testing.T, room time.Duration) int64 {
	t.Helper()
	for {
		now := time.Now().UnixMilli()
		for j := range int64(10) {
			d := 600_000 + j*60_000
			if left := d - now%d; left >= room.Milliseconds() {
				return d
			}
		}
		time.Sleep(time.Second)
	}
}

// startLimiter starts a limiter process at default flags serving the
// subject prefix name.
func (e *edgeRegion) startLimiter(name string) *edgeLimiter {
	e.t.Helper()
	p := startProcess(e.t, "limiter", "--nats-url", e.natsURL, "--region", "r1", "--redis-url", e.redisURL,
		"--redis-prefix", e.prefix, "--log-level", "warn", "--subject-prefix", name)
	l := &edgeLimiter{name: name, proc: p, client: bus.NewClient(e.nc, bus.WithSubjectPrefix(name))}
	e.mu.Lock()
	e.all = append(e.all, l)
	e.mu.Unlock()
	return l
}

func (e *edgeRegion) limiterByName(name string) *edgeLimiter {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.alive {
		if l.name == name {
			return l
		}
	}
	e.t.Fatalf("no limiter %s in the rotation", name)
	return nil
}

// sleepUntil sleeps until d after the case's start.
func (e *edgeRegion) sleepUntil(d time.Duration) {
	time.Sleep(time.Until(e.start.Add(d)))
}

// check sends one check of cost 1 through l and counts its reply. Every
// check must be answered.
func (e *edgeRegion) check(l *edgeLimiter) {
	defer l.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	resp, err := l.client.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: e.id, Limit: e.limit, Duration: e.duration})
	if err != nil {
		e.t.Errorf("a check through %s: %v", l.name, err)
		return
	}
	if !resp.Success {
		e.denied.Add(1)
		return
	}
	e.admitted.Add(1)
	l.mu.Lock()
	l.admits = append(l.admits, time.Now())
	l.mu.Unlock()
}

// burst sends n checks through l from inflight callers as fast as replies
// come back and returns how many were admitted.
func (e *edgeRegion) burst(l *edgeLimiter, n, inflight int) int64 {
	before := e.admitted.Load()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				l.inflight.Add(1)
				e.check(l)
			}
		})
	}
	wg.Wait()
	return e.admitted.Load() - before
}

// traffic sends rate checks a second, round robin over the limiters in
// the rotation, each without waiting for the ones before it, until the
// returned function is called; that waits for every reply.
func (e *edgeRegion) traffic(rate float64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 512)
	interval := time.Duration(float64(time.Second) / rate)
	begin := time.Now()
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(time.Until(begin.Add(time.Duration(i) * interval))):
			}
			e.mu.Lock()
			l := e.alive[i%len(e.alive)]
			l.inflight.Add(1)
			e.mu.Unlock()
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				e.check(l)
			})
		}
	})
	return func() {
		close(done)
		wg.Wait()
		e.trafficEnd = time.Now()
		e.t.Logf("traffic: %d admitted, %d denied, limit %d", e.admitted.Load(), e.denied.Load(), e.limit)
	}
}

// kill takes l out of the rotation, waits for its checks in flight to be
// answered, and SIGKILLs it, recording the rate it was admitting at.
func (e *edgeRegion) kill(l *edgeLimiter) {
	e.t.Helper()
	e.mu.Lock()
	e.alive = slices.DeleteFunc(e.alive, func(x *edgeLimiter) bool { return x == l })
	e.mu.Unlock()
	out := time.Now()
	for deadline := out.Add(15 * time.Second); l.inflight.Load() > 0; {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s still has %d checks in flight 15s after it left the rotation", l.name, l.inflight.Load())
		}
		time.Sleep(time.Millisecond)
	}
	l.mu.Lock()
	var last []time.Time // its admissions in the second before, in order
	for _, at := range l.admits {
		if at.After(out.Add(-time.Second)) {
			last = append(last, at)
		}
	}
	total := len(l.admits)
	l.mu.Unlock()
	recent := len(last)
	// A limiter measures its rate over 100 ms at least (docs/architecture.md,
	// "Leases"), so a lease may follow the busiest 100 ms of that second, not
	// its average: the most admissions the test saw in 100 ms, plus one for a
	// reply seen a little after its admission.
	peak := 0
	for i := range last {
		j := i
		for j < len(last) && last[j].Sub(last[i]) < 100*time.Millisecond {
			j++
		}
		peak = max(peak, j-i)
	}
	l.dead = true
	if code := l.proc.stop(e.t, syscall.SIGKILL, 5*time.Second); code != -1 {
		e.t.Fatalf("a SIGKILLed limiter exited %d", code)
	}
	rate := max(float64(recent), float64(10*(peak+1)))
	bound := max(ceilDiv64(e.limit, 100), int64(ceilF(0.2*rate)))
	e.mu.Lock()
	e.kills = append(e.kills, edgeKill{name: l.name, rate: rate, bound: bound})
	e.killedAt = time.Now()
	e.mu.Unlock()
	e.t.Logf("SIGKILLed %s at %v: it admitted %d, %d in the second before, at most %d in 100 ms (bound %d); the region had admitted %d",
		l.name, time.Since(e.start).Round(time.Millisecond), total, recent, peak, bound, e.admitted.Load())
}

// add starts a new limiter and puts it in the rotation once it answers.
func (e *edgeRegion) add() {
	e.t.Helper()
	l := e.startLimiter(fmt.Sprint("lim", e.next))
	e.next++
	e.mu.Lock()
	n := len(e.alive) + 1
	e.mu.Unlock()
	waitService(e.t, e.nc, "ratelimit", n*instancesPerLimiter)
	e.mu.Lock()
	e.alive = append(e.alive, l)
	e.mu.Unlock()
}

// settleAndCompare waits until the dust settles (1.5s after the last kill,
// so no dead lease is live, and 2s after the traffic stopped, twice the
// survivors' report interval far from a limit), compares every view of the
// cell with what was admitted, then stops the survivors with SIGTERM and
// compares the views again.
func (e *edgeRegion) settleAndCompare() {
	e.t.Helper()
	e.mu.Lock()
	survivors := slices.Clone(e.alive)
	e.mu.Unlock()
	wait := e.trafficEnd.Add(2 * time.Second)
	if k := e.lastKillAt(); k.Add(1500 * time.Millisecond).After(wait) {
		wait = k.Add(1500 * time.Millisecond)
	}
	time.Sleep(time.Until(wait))
	admitted := e.admitted.Load()
	if admitted > e.limit {
		e.t.Errorf("the region admitted %d, over the limit %d", admitted, e.limit)
	}
	e.compare("survivors running", admitted, survivors)

	for _, l := range e.all {
		if !l.dead && !l.proc.hasExited() {
			if code := l.proc.stop(e.t, syscall.SIGTERM, 15*time.Second); code != 0 {
				e.t.Errorf("%s exited %d after SIGTERM, want 0", l.name, code)
			}
		}
	}
	e.compare("survivors stopped (SIGTERM)", admitted, nil)
	if got := time.Now().UnixMilli() / e.duration; got != e.cell.Sequence {
		e.t.Fatalf("the case ran into the next window (%d, started in %d): its numbers are blurred", got, e.cell.Sequence)
	}
}

// lastKillAt is when the last SIGKILL was sent (the zero time if none).
func (e *edgeRegion) lastKillAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.killedAt
}

// compare reads every view of the cell and fails for each outside
// [admitted, admitted + Σ bound].
func (e *edgeRegion) compare(phase string, admitted int64, survivors []*edgeLimiter) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e.mu.Lock()
	kills := slices.Clone(e.kills)
	e.mu.Unlock()
	var slack int64
	for _, k := range kills {
		slack += k.bound
	}
	type view struct {
		name string
		used int64
	}
	var views []view
	cur, _, err := e.direct.Read(ctx, e.cell)
	if err != nil {
		e.t.Fatalf("%s: read: %v", phase, err)
	}
	views = append(views, view{"(a) region.Redis.Read", cur.Count})

	// The bridge's sweep, called as cmd/bridge calls it.
	swept := int64(-1)
	if _, err := e.direct.ScanCounts(ctx, func(cs []region.CellCount) error {
		for _, c := range cs {
			if c.Cell.Workspace == e.cell.Workspace && c.Cell.Namespace == e.cell.Namespace &&
				c.Cell.Identifier == e.cell.Identifier && c.Cell.Duration == e.cell.Duration &&
				c.Cell.Sequence == e.cell.Sequence && c.Cell.Epoch == 0 {
				swept = c.Count
			}
		}
		return nil
	}); err != nil {
		e.t.Fatalf("%s: sweep: %v", phase, err)
	}
	if swept < 0 {
		swept = 0 // a cell holding nothing is left out of the sweep
	}
	views = append(views, view{"(b) the bridge's sweep (ScanCounts)", swept})

	fresh := e.startLookLimiter(len(survivors))
	views = append(views, view{"(c) a look through a fresh limiter", e.look(ctx, fresh)})
	for _, l := range survivors {
		views = append(views, view{"(d) a look through surviving " + l.name, e.look(ctx, l)})
	}

	failed := false
	for _, v := range views {
		over := v.used - admitted
		perKill := ""
		if len(kills) > 0 {
			perKill = fmt.Sprintf(", %+.1f per kill", float64(over)/float64(len(kills)))
		}
		if v.used < admitted || v.used > admitted+slack {
			failed = true
			e.t.Errorf("%s: %s says %d used; the region admitted %d, %d kills allow %d..%d: off by %+d%s",
				phase, v.name, v.used, admitted, len(kills), admitted, admitted+slack, over, perKill)
		} else {
			e.t.Logf("%s: %s says %d used; admitted %d: over-count %+d%s (allowed %d..%d)",
				phase, v.name, v.used, admitted, over, perKill, 0, slack)
		}
	}
	if failed {
		v, ok, err := e.direct.Cell(ctx, e.cell)
		e.t.Logf("%s: Redis's value of the cell (present %v): %+v (%v)", phase, ok, v, err)
	}
}

// startLookLimiter starts a limiter on a subject prefix of its own, for
// looks, once running more instances than the others.
func (e *edgeRegion) startLookLimiter(others int) *edgeLimiter {
	e.t.Helper()
	l := e.startLimiter(fmt.Sprint("look", e.nextRaw))
	e.nextRaw++
	waitService(e.t, e.nc, "ratelimit", (others+1)*instancesPerLimiter)
	return l
}

// look sends a look (cost 0) through l and returns what it says is used:
// limit − remaining.
func (e *edgeRegion) look(ctx context.Context, l *edgeLimiter) int64 {
	e.t.Helper()
	for {
		resp, err := l.client.Check(ctx, "acme", "api", bus.CheckRequest{Identifier: e.id, Limit: e.limit,
			Duration: e.duration, Peek: true})
		if err == nil {
			return e.limit - resp.Remaining
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("a look through %s: %v", l.name, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func ceilDiv64(a, b int64) int64 { return (a + b - 1) / b }

func ceilF(x float64) float64 {
	n := float64(int64(x))
	if n < x {
		return n + 1
	}
	return n
}
