package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// burstBench measures bursts on one identifier served by three limiters of
// a region sharing one Redis (a queue group of three services, default
// settings): 3× a limit of 10,000 as fast as 256 requests in flight go, on
// a fresh identifier each time, against the same burst far from its limit.
// It alternates the two kinds (rounds of each) so both see the same drift
// of the machine, checks that every near-limit burst admitted exactly the
// limit, and reports checks/s, p50, p99 and Redis commands per admitted
// check of each kind.
func burstBench(ctx context.Context, url string, client *nats.Conn) error {
	var cmds atomic.Int64
	prefix := fmt.Sprintf("sluicebench:burst:%d", time.Now().UnixNano())
	for range 3 {
		rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: prefix})
		if err != nil {
			return err
		}
		rd.Client().AddHook(countingHook{&cmds})
		svc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{})})
		defer svc.Close(ctx)
		stop, err := serveInstances(url, transport.LimiterConfig{Service: svc, Region: "bench", Subjects: wire.Subjects{Prefix: "burst"}})
		if err != nil {
			return err
		}
		defer stop()
	}
	const limit, rounds = 10_000, 6
	var near, far tally
	near.countAdmitted, far.countAdmitted = true, true
	var nearCmds, farCmds int64
	for round := range rounds {
		for _, k := range []struct {
			t     *tally
			cmds  *int64
			limit int64
		}{{&near, &nearCmds, limit}, {&far, &farCmds, window.MaxLimit}} {
			id := fmt.Sprintf("burst-%d-%d-%d", k.limit, round, time.Now().UnixNano())
			body := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: k.limit, Duration: 600_000, Cost: 1})
			before, admittedBefore := cmds.Load(), k.t.admitted
			if err := countLoad(client, "burst.check.bench.api", body, 3*limit, k.t); err != nil {
				return err
			}
			time.Sleep(300 * time.Millisecond) // the last settle rounds (leases given back)
			*k.cmds += cmds.Load() - before
			if got := k.t.admitted - admittedBefore; k.limit == limit && got != limit {
				return fmt.Errorf("a burst of %d on a limit of %d over three limiters admitted %d", 3*limit, limit, got)
			}
		}
	}
	fmt.Printf("\nbursts on one identifier, three limiters sharing Redis: %d rounds of 3 x %d checks, 256 in flight, interleaved:\n", rounds, limit)
	fmt.Printf("%-34s %10s %10s %10s %12s\n", "", "checks/s", "p50", "p99", "cmds/admit")
	for _, k := range []struct {
		name string
		t    *tally
		cmds int64
	}{{fmt.Sprintf("at a limit of %d (exact every time)", limit), &near, nearCmds}, {"far from its limit", &far, farCmds}} {
		r := k.t.result()
		fmt.Printf("%-34s %10.0f %10s %10s %12.4f\n", k.name, r.rate, r.p50, r.p99, float64(k.cmds)/float64(max(k.t.admitted, 1)))
	}
	rn, rf := near.result(), far.result()
	fmt.Printf("near / far: %.2fx checks/s, %.2fx p99\n", rn.rate/rf.rate, float64(rn.p99)/float64(rf.p99))
	return nil
}

// countLoad sends n requests of body to subject with 256 in flight and adds
// what it measured to t.
func countLoad(nc *nats.Conn, subject string, body []byte, n int, t *tally) error {
	const inflight = 256
	inbox := nats.NewInbox()
	sent := make([]time.Time, inflight)
	done := make(chan struct{})
	var (
		mu               sync.Mutex // the first sends race the first replies
		issued, answered int
		failure          error
	)
	start := time.Now()
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		now := time.Now()
		slot, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		t.add(now.Sub(sent[slot]))
		if r, err := wire.DecodeCheckResponse(bus.Msgpack, m.Data); err == nil && r.Success {
			t.admitted++
		} else if err != nil && failure == nil {
			failure = fmt.Errorf("reply: %w", err)
		}
		if answered++; answered == n {
			close(done)
			return
		}
		if issued < n {
			issued++
			sent[slot] = time.Now()
			if err := nc.PublishRequest(subject, m.Subject, body); err != nil && failure == nil {
				failure = err
			}
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}
	cpu := processCPU()
	mu.Lock()
	for slot := range min(inflight, n) {
		issued++
		sent[slot] = time.Now()
		if err := nc.PublishRequest(subject, inbox+"."+strconv.Itoa(slot), body); err != nil {
			mu.Unlock()
			return err
		}
	}
	mu.Unlock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%d of %d burst requests answered in 30s", answered, n)
	}
	mu.Lock()
	defer mu.Unlock()
	t.elapsed += time.Since(start)
	t.cpu += processCPU() - cpu
	return failure
}
