// Package flood offers a limiter an open-loop flood of checks on
// identifiers it has never seen, and measures how fast they are answered
// and what the process holds meanwhile: test support for the cold-flood
// test and test/coldflood.
package flood

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
)

// Result is what a flood measured.
type Result struct {
	// Sent is how many checks were sent, Answered how many got a reply in
	// time; SendTook how long sending took.
	Sent, Answered int
	SendTook       time.Duration
	// Latency quantiles of the answered checks.
	P50, P99, P999, Max time.Duration
	// Goroutines of the process before the flood and at most during it,
	// and its live heap at most (sampled every 10ms).
	BaseGoroutines, MaxGoroutines int
	MaxHeap                       uint64
}

// Cold sends rate checks a second for d to subject, msgpack-encoded, each
// on a new identifier (cold-0, cold-1, ...) with a limit none reaches,
// without waiting for answers, each with its own reply subject; then waits
// at most wait for the last answers.
func Cold(nc *nats.Conn, subject string, rate int, d, wait time.Duration) (Result, error) {
	n := int(int64(rate) * int64(d) / int64(time.Second))
	sentAt, took := make([]int64, n), make([]atomic.Int64, n)
	var answered atomic.Int64
	inbox := nc.NewRespInbox()
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		i, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil || i < 0 || i >= n {
			return
		}
		if took[i].CompareAndSwap(0, time.Now().UnixNano()-sentAt[i]) {
			answered.Add(1)
		}
	})
	if err != nil {
		return Result{}, fmt.Errorf("flood: %w", err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return Result{}, fmt.Errorf("flood: %w", err)
	}
	res := Result{Sent: n, BaseGoroutines: runtime.NumGoroutine()}
	var maxG atomic.Int64
	var maxHeap atomic.Uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			maxG.Store(max(maxG.Load(), int64(runtime.NumGoroutine())))
			runtime.ReadMemStats(&ms)
			maxHeap.Store(max(maxHeap.Load(), ms.HeapAlloc))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	var body []byte
	start := time.Now()
	for i := 0; i < n; {
		due := int(time.Since(start) * time.Duration(rate) / time.Second)
		for ; i < n && i <= due; i++ {
			body = wire.AppendCheckRequest(body[:0], bus.Msgpack, wire.CheckRequest{
				Identifier: "cold-" + strconv.Itoa(i), Limit: 1_000_000, Duration: 60_000, Cost: 1})
			sentAt[i] = time.Now().UnixNano()
			if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox + "." + strconv.Itoa(i), Data: body}); err != nil {
				close(stop)
				sampler.Wait()
				return Result{}, fmt.Errorf("flood: %w", err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	res.SendTook = time.Since(start)
	deadline := time.Now().Add(wait)
	for answered.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	sampler.Wait()
	_ = sub.Unsubscribe()
	lat := make([]time.Duration, 0, n)
	for i := range took {
		if v := took[i].Load(); v > 0 {
			lat = append(lat, time.Duration(v))
		}
	}
	slices.Sort(lat)
	res.Answered, res.MaxGoroutines, res.MaxHeap = len(lat), int(maxG.Load()), maxHeap.Load()
	if len(lat) > 0 {
		q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		res.P50, res.P99, res.P999, res.Max = q(0.5), q(0.99), q(0.999), lat[len(lat)-1]
	}
	return res, nil
}
