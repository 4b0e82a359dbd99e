package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
)

// globalBench measures, on a three-region supercluster with one limiter and
// one bridge per region (no Redis, in-memory stores): how long a regional
// count published in one region takes to be counted in another, and how many
// cross-region messages each active cell costs.
func globalBench(ctx context.Context, dur time.Duration) error {
	regions := []string{"us", "eu", "ap"}
	sc, err := natstest.StartSupercluster(ctx, regions...)
	if err != nil {
		return err
	}
	defer sc.Shutdown()
	clients := map[string]*nats.Conn{}
	for _, r := range regions {
		nc, err := nats.Connect(sc.ClientURL(r))
		if err != nil {
			return err
		}
		defer nc.Close()
		tr := link.NewBridge(nc, wire.Subjects{}, r, nil)
		b, err := bridge.NewBridge(bridge.BridgeConfig{Region: r, Store: bridge.NewMemoryStore(), Transport: tr})
		if err != nil {
			return err
		}
		b.Start(ctx)
		defer b.Close(ctx)
		if err := tr.Serve(b); err != nil {
			return err
		}
		defer tr.Close()
		glink := link.NewGlobal(nc, wire.Subjects{}, r, nil)
		svc := service.New(service.Config{Region: r, Global: glink})
		defer svc.Close(ctx)
		if err := glink.Attach(ctx, svc); err != nil {
			return err
		}
		lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: r})
		if err != nil {
			return err
		}
		defer lim.Shutdown(ctx)
		cn, err := nats.Connect(sc.ClientURL(r))
		if err != nil {
			return err
		}
		defer cn.Close()
		clients[r] = cn
	}
	// Let cross-region interest settle.
	time.Sleep(500 * time.Millisecond)

	// Convergence: a check in us makes a cell near its limit; time until eu's
	// limiters receive the import that counts it.
	probe := clients["eu"]
	arrived := map[string]chan time.Time{}
	var mu sync.Mutex
	sub, err := probe.Subscribe("ratelimit.import.eu", func(m *nats.Msg) {
		now := time.Now()
		is, err := event.DecodeImports(m.Data)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, imp := range is {
			if ch, ok := arrived[imp.Cell.Identifier]; ok && imp.Foreign > 0 {
				select {
				case ch <- now:
				default:
				}
			}
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := probe.Flush(); err != nil {
		return err
	}
	var lat []time.Duration
	for i := range 320 {
		id := "conv_" + strconv.Itoa(i)
		ch := make(chan time.Time, 1)
		mu.Lock()
		arrived[id] = ch
		mu.Unlock()
		body := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: id, Limit: 100, Duration: 60_000, Cost: 60})
		if _, err := clients["us"].Request("ratelimit.check.bench.api", body, time.Second); err != nil {
			return err
		}
		sent := time.Now()
		select {
		case at := <-ch:
			if i >= 20 { // the first ones wait for interest to settle across gateways
				lat = append(lat, at.Sub(sent))
			}
		case <-time.After(2 * time.Second):
			return fmt.Errorf("eu never imported %s", id)
		}
	}
	slices.Sort(lat)
	fmt.Printf("\ncross-region convergence (check admitted in us -> counted by eu's limiters), 300 cells: p50 %v, p99 %v (target p99 <= 250ms)\n",
		lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond))

	// Messages: 100 active cells in us, each checked 50 times a second at a
	// limit of 1000 a minute; count what crosses to other regions.
	var msgs, comps atomic.Int64
	gsub, err := clients["ap"].Subscribe("ratelimit.global.gc.us", func(m *nats.Msg) {
		msgs.Add(1)
		if cs, err := event.DecodeComponents(m.Data); err == nil {
			comps.Add(int64(len(cs)))
		}
	})
	if err != nil {
		return err
	}
	defer gsub.Unsubscribe()
	if err := clients["ap"].Flush(); err != nil {
		return err
	}
	const cells, rate = 100, 50
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		<-tick.C
		for c := range cells {
			body := wire.AppendCheckRequest(nil, bus.Msgpack, wire.CheckRequest{Identifier: "active_" + strconv.Itoa(c),
				Limit: 1000, Duration: 60_000, Cost: 1})
			if err := clients["us"].Publish("ratelimit.check.bench.api", body); err != nil {
				return err
			}
		}
	}
	time.Sleep(100 * time.Millisecond)
	secs := dur.Seconds()
	fmt.Printf("cross-region traffic, %d active cells at %d checks/s each (limit 1000/min): %.2f messages/s per active cell, %.2f components/s per active cell\n",
		cells, rate, float64(msgs.Load())/secs/cells, float64(comps.Load())/secs/cells)
	return nil
}
