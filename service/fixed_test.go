package service

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/window"
)

// A fixed window gives the whole limit back when it ends, where the sliding
// window still weighs the full window before: over three limiters sharing
// one origin, bursts of three times the limit in each of three windows admit
// exactly the limit a window (the window after a full one included, which
// the sliding rule denies at its start), every reply's Reset is the window's
// end and a denial's RetryAfter ends there, and the origin counts the limit
// in each cell.
func TestFixedWindowsAdmitTheLimitEachWindowOverLimiters(t *testing.T) {
	r := newTestRegion(t, 3, Config{})
	const limit = 100
	q := Query{Workspace: "ws", Namespace: "ns", Identifier: "fixed", Limit: limit, Duration: 60_000, Cost: 1, Fixed: true}
	start := r.clk.Now().UnixMilli()
	for w := range 3 {
		if w > 0 {
			// To 1 ms into the next window: the previous cell weighs all
			// but 1/60,000 of itself under the sliding rule.
			now := r.clk.Now().UnixMilli()
			r.tick(time.Duration(((now/q.Duration)+1)*q.Duration+1-now) * time.Millisecond)
			sliding := q
			sliding.Fixed = false
			var d window.Decision
			r.do(func() { d = mustCheck(t, r.svcs[w%3], sliding) })
			if d.Admitted {
				t.Fatalf("window %d: a sliding check 1 ms after a full window admitted: %+v", w, d)
			}
		}
		now := r.clk.Now().UnixMilli()
		end := (now/q.Duration + 1) * q.Duration
		var admitted atomic.Int64
		var bad sync.Once
		r.do(func() {
			var wg sync.WaitGroup
			for i := range 3 * limit {
				wg.Go(func() {
					d := mustCheck(t, r.svcs[i%3], q)
					switch {
					case d.Reset != end:
						bad.Do(func() { t.Errorf("window %d: Reset %d, want the window's end %d", w, d.Reset, end) })
					case !d.Admitted && (d.RetryAfter <= 0 || now+d.RetryAfter > end):
						// Decided at now or later, a denial waits until the
						// window's end, not past it (the sliding rule's wait
						// for the full window to decay).
						bad.Do(func() { t.Errorf("window %d: denied with RetryAfter %d, past the window's end", w, d.RetryAfter) })
					}
					if d.Admitted {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
		})
		if got := admitted.Load(); got != limit {
			t.Errorf("window %d: admitted %d of %d checks, want the limit %d", w, got, 3*limit, limit)
		}
	}
	r.tick(time.Second) // the settle rounds report what the leases held
	for w := range int64(3) {
		c := window.Cell{Workspace: q.Workspace, Namespace: q.Namespace, Identifier: q.Identifier, Duration: q.Duration,
			Sequence: start/q.Duration + w}
		if got := counts(t, r.mem, c); got.Used != limit {
			t.Errorf("%s: the origin counts %d used, want %d", fmt.Sprint("window ", w), got.Used, limit)
		}
	}
}
