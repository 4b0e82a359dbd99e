package bus

import (
	"runtime"
	"sync"
	"testing"
)

// BenchmarkCoalescingCeiling measures the most calls per second that 256
// goroutines, each blocking on its own call as Check does, can complete on
// this machine when their calls are batched by one dispatcher goroutine
// and answered over a channel each, with no encoding, no NATS and no
// limiter: the park and wake of a caller and the dispatcher's hand-offs
// only. Coalesced Check calls cannot go faster than this; `make bench`
// compares the coalescing client's checks/s with it (docs/performance.md).
func BenchmarkCoalescingCeiling(b *testing.B) {
	const callers = 256
	type call struct{ done chan struct{} }
	var (
		mu     sync.Mutex
		queue  []*call
		wakeup = make(chan struct{}, 1)
		stop   = make(chan struct{})
	)
	go func() { // the dispatcher: takes every call waiting, answers them
		var batch []*call
		for {
			select {
			case <-stop:
				return
			case <-wakeup:
			}
			mu.Lock()
			batch, queue = queue, batch[:0]
			mu.Unlock()
			for _, c := range batch {
				c.done <- struct{}{}
			}
		}
	}()
	b.SetParallelism(callers / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := &call{done: make(chan struct{}, 1)}
		for pb.Next() {
			mu.Lock()
			queue = append(queue, c)
			mu.Unlock()
			select {
			case wakeup <- struct{}{}:
			default:
			}
			<-c.done
		}
	})
	close(stop)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}
