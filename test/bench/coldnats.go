package main

// The cold checks over NATS scenario (-cold-nats): every check names an
// identifier nobody checked before, far from its limit, so a limiter
// process on Redis reads Redis before it answers each one. It runs next to
// a bare NATS echo on the same NATS server, at 64 and at 256 requests in
// flight on one connection, the two targets' slices interleaved, and
// reports the ratio limiter/echo of each level from the one run.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
)

var coldNATSOnly = flag.Bool("cold-nats", false,
	"run only cold checks over NATS: every check a fresh identifier (limit 1000, 1000 ms windows, cost 1) against a limiter process "+
		"on a redis-server of its own, next to a bare echo on the same NATS server, at 64 and 256 in flight, -d a target and level; "+
		"reports req/s, p50/p99, the limiter's and Redis's CPU a check, breaker openings and the ratios limiter/echo")

// The cold checks' window: far from its limit at one check an identifier.
const (
	coldNATSLimit    = 1000
	coldNATSDuration = 1000 // ms
	coldNATSDigits   = 12   // the counter's digits in each identifier
	// coldNATSSettle is how long the bench idles after each limiter slice:
	// the limiter settles its new cells with Redis after its load, and that
	// must not fall into the echo's next slice.
	coldNATSSettle = 200 * time.Millisecond
)

// coldNATSBench runs the -cold-nats scenario, each target for dur at each
// level in slices of slice, and prints its figures.
func coldNATSBench(dur, slice time.Duration) error {
	dir, err := os.MkdirTemp("", "sluice-bench-coldnats-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	rURL, stopRedis, err := startColdRedis(dir)
	if err != nil {
		return err
	}
	defer stopRedis()
	bin, err := buildLimiter(dir)
	if err != nil {
		return err
	}

	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		return fmt.Errorf("start the NATS server: %w", err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	echoConn, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect the echo: %w", err)
	}
	defer echoConn.Close()
	if _, err := echoConn.QueueSubscribe("echo.>", "echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return fmt.Errorf("subscribe the echo: %w", err)
	}
	if err := echoConn.Flush(); err != nil {
		return fmt.Errorf("subscribe the echo: %w", err)
	}

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	ids, err := newColdNATSIDs(run)
	if err != nil {
		return err
	}
	metricsAddr := freeAddr()
	cmd := exec.Command(bin, "--nats-url", url, "--redis-url", rURL, "--redis-prefix", "sluicebench:coldnats:"+run,
		"--metrics-addr", metricsAddr, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the limiter: %w", err)
	}
	defer stopProcess(cmd)

	client, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect the client: %w", err)
	}
	defer client.Close()
	const subject = "ratelimit.check.bench.api"
	if err := awaitColdNATSLimiter(client, subject, ids); err != nil {
		return err
	}
	opt, err := redis.ParseURL(rURL)
	if err != nil {
		return fmt.Errorf("redis URL %s: %w", rURL, err)
	}
	rc := redis.NewClient(opt)
	defer rc.Close()

	targets := []coldNATSTarget{{name: "echo", subject: "echo.bench.api"},
		{name: "limiter", subject: subject, checks: true, settle: coldNATSSettle}}
	// One slice of each at 256 in flight, not counted: connections, scripts
	// and the limiter's first cells.
	for _, tg := range targets {
		var t tally
		if err := coldNATSLoad(client, tg.subject, ids, 256, slice, &t, tg.counts(&coldNATSCounts{})); err != nil {
			return fmt.Errorf("warm-up, %s: %w", tg.name, err)
		}
		time.Sleep(tg.settle)
	}

	nslices := max(1, int(dur/slice))
	fmt.Printf("\ncold checks over NATS: every check a fresh identifier (limit %d, %d ms windows, cost 1), one connection; "+
		"a limiter process on a dedicated Redis next to a bare echo on the same NATS server; %d slices of %v a target and level, "+
		"interleaved, %v idle after each limiter slice\n",
		coldNATSLimit, coldNATSDuration, nslices, slice, coldNATSSettle)
	fmt.Printf("bodies: built on the fly, each a copy of one encoded check whose identifier's %d-digit counter is rewritten in place (echo and limiter alike)\n",
		coldNATSDigits)
	fmt.Printf("CPU a check: the limiter's and Redis's CPU time over the level's whole interleaved run (settling included) / the limiter's checks answered\n")
	fmt.Printf("%-10s %-8s %10s %9s %9s %13s %11s %10s %8s %8s %7s\n", "in flight", "target", "req/s", "p50", "p99",
		"limiter/check", "Redis/check", "admitted", "denied", "errors", "opens")
	allAdmitted := true
	for _, inflight := range []int{64, 256} {
		opens0, err := breakerOpens(metricsAddr)
		if err != nil {
			return err
		}
		cpu0, err := pidCPU(cmd.Process.Pid)
		if err != nil {
			return fmt.Errorf("the limiter's CPU time: %w", err)
		}
		rcpu0, err := redisCPU(rc)
		if err != nil {
			return err
		}
		tallies := make([]tally, len(targets))
		counts := make([]coldNATSCounts, len(targets))
		for i := range nslices {
			for j := range targets {
				k := (i + j) % len(targets) // rotate which target goes first
				if err := coldNATSLoad(client, targets[k].subject, ids, inflight, slice, &tallies[k], targets[k].counts(&counts[k])); err != nil {
					return fmt.Errorf("%d in flight, %s: %w", inflight, targets[k].name, err)
				}
				time.Sleep(targets[k].settle)
			}
		}
		opens1, err := breakerOpens(metricsAddr)
		if err != nil {
			return err
		}
		cpu1, err := pidCPU(cmd.Process.Pid)
		if err != nil {
			return fmt.Errorf("the limiter's CPU time: %w", err)
		}
		rcpu1, err := redisCPU(rc)
		if err != nil {
			return err
		}
		e, l, lc := tallies[0].result(), tallies[1].result(), counts[1]
		perCheck := func(d time.Duration) string {
			return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1000/float64(max(1, tallies[1].n)))
		}
		fmt.Printf("%-10d %-8s %10.0f %9s %9s\n", inflight, "echo", e.rate, e.p50, e.p99)
		fmt.Printf("%-10d %-8s %10.0f %9s %9s %13s %11s %10d %8d %8d %7d\n", inflight, "limiter", l.rate, l.p50, l.p99,
			perCheck(cpu1-cpu0), perCheck(rcpu1-rcpu0), lc.admitted, lc.denied, lc.errors, opens1-opens0)
		fmt.Printf("%-10d %-8s %9.2fx %9s %8.2fx   limiter / echo (req/s, p99)\n", inflight, "ratio", l.rate/e.rate, "",
			float64(l.p99)/float64(e.p99))
		if lc.denied > 0 || lc.errors > 0 {
			allAdmitted = false
			fmt.Printf("%-10d %-8s NOT all admitted: %d denied (first: %s), %d errors (first: %s)\n", inflight, "limiter",
				lc.denied, lc.firstDenial, lc.errors, lc.firstError)
		}
	}
	if allAdmitted {
		fmt.Println("every limiter check admitted, as a fresh identifier far from its limit must be")
	}
	return nil
}

// coldNATSTarget is a responder the -cold-nats loads measure.
type coldNATSTarget struct {
	name, subject string
	checks        bool          // it answers checks: its replies are decoded and counted
	settle        time.Duration // idle time after each of its slices
}

// counts returns c where tg answers checks, else nil: an echo's replies
// are not counted.
func (tg coldNATSTarget) counts(c *coldNATSCounts) *coldNATSCounts {
	if tg.checks {
		return c
	}
	return nil
}

// coldNATSIDs hands out check bodies of fresh identifiers: copies of one
// encoded check whose identifier ends in a fixed-width decimal counter,
// the counter rewritten in place for each request (no encoding, no
// allocation on the load's path).
type coldNATSIDs struct {
	template []byte
	at       int // offset of the counter's digits in template
	n        atomic.Uint64
}

// newColdNATSIDs encodes the template check of run's identifiers and makes
// sure a rewritten body decodes to the identifier it should.
func newColdNATSIDs(run string) (*coldNATSIDs, error) {
	prefix := "cold-" + run + "-"
	id := prefix + strings.Repeat("0", coldNATSDigits)
	tmpl := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: coldNATSLimit, Duration: coldNATSDuration, Cost: 1})
	i := bytes.Index(tmpl, []byte(id))
	if i < 0 {
		return nil, errors.New("cold check template: the identifier is not in its encoding")
	}
	g := &coldNATSIDs{template: tmpl, at: i + len(prefix)}
	b := g.buffer()
	g.fill(b)
	got, err := wire.DecodeCheckRequest(bus.Msgpack, b)
	if err != nil {
		return nil, fmt.Errorf("cold check template: %w", err)
	}
	if want := prefix + fmt.Sprintf("%0*d", coldNATSDigits, 1); got.Identifier != want || got.Limit != coldNATSLimit ||
		got.Duration != coldNATSDuration || got.Cost != 1 {
		return nil, fmt.Errorf("cold check template: decodes to %+v, not identifier %s", got, want)
	}
	return g, nil
}

// buffer returns a copy of the template for one slot of a load.
func (g *coldNATSIDs) buffer() []byte { return bytes.Clone(g.template) }

// fill writes the next fresh identifier into b, a buffer from buffer.
func (g *coldNATSIDs) fill(b []byte) {
	n := g.n.Add(1)
	for i := g.at + coldNATSDigits - 1; i >= g.at; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
}

// coldNATSCounts sorts a limiter's replies: admitted, denied, or errors
// (a service error, or a body that is no check response).
type coldNATSCounts struct {
	admitted, denied, errors int
	firstDenial, firstError  string
}

// count decodes m as a check reply and counts it.
func (c *coldNATSCounts) count(m *nats.Msg) {
	if err := bus.ReplyError(m); err != nil {
		c.error(err)
		return
	}
	r, err := wire.DecodeCheckResponse(bus.Msgpack, m.Data)
	switch {
	case err != nil:
		c.error(fmt.Errorf("%w (headers %v)", err, m.Header))
	case r.Success:
		c.admitted++
	default:
		if c.denied++; c.denied == 1 {
			c.firstDenial = fmt.Sprintf("%+v", r)
		}
	}
}

// error counts an error reply, keeping the first one's message.
func (c *coldNATSCounts) error(err error) {
	if c.errors++; c.errors == 1 {
		c.firstError = err.Error()
	}
}

// coldNATSLoad keeps inflight requests in flight on nc for dur, each reply
// sending the next request of its slot, every request a check of a fresh
// identifier from ids. It adds each reply's latency and the elapsed time to
// t, and, unless c is nil, decodes each reply and counts it in c.
func coldNATSLoad(nc *nats.Conn, subject string, ids *coldNATSIDs, inflight int, dur time.Duration, t *tally, c *coldNATSCounts) error {
	bodies := make([][]byte, inflight)
	for i := range bodies {
		bodies[i] = ids.buffer()
	}
	next := func(slot int) []byte { ids.fill(bodies[slot]); return bodies[slot] }
	return slotLoad(nc, subject, inflight, dur, next, func(m *nats.Msg, d time.Duration) error {
		t.add(d)
		if c != nil {
			c.count(m)
		}
		return nil
	}, t)
}

// awaitColdNATSLimiter waits, 15 s at most, until a limiter answers a
// fresh identifier's check on subject.
func awaitColdNATSLimiter(nc *nats.Conn, subject string, ids *coldNATSIDs) error {
	body := ids.buffer()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ids.fill(body)
		m, err := nc.Request(subject, body, time.Second)
		if err == nil {
			var c coldNATSCounts
			if c.count(m); c.admitted == 1 {
				return nil
			}
			err = fmt.Errorf("a fresh identifier's check not admitted: denied %d (%s), errors %d (%s)",
				c.denied, c.firstDenial, c.errors, c.firstError)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the limiter process never answered on %s: %w", subject, err)
		}
	}
}
