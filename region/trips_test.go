package region

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/window"
)

// slowRedis returns an origin on the shared Redis (at its defaults, and
// options appended to its URL) through a proxy that delays every chunk by
// delay each way.
func slowRedis(t *testing.T, delay time.Duration, options string) (*Redis, *tcpproxy.Proxy) {
	t.Helper()
	addr := redistest.SharedURL(t)[len("redis://"):]
	p, err := tcpproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetDelay(delay)
	r, err := NewRedis(RedisConfig{URL: "redis://" + p.Addr() + options, KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, p
}

// fillTrips starts as many syncs of one request as r keeps round trips in
// flight, each on a cell of its own (name-0, name-1, ...), and returns once
// every one has left, so that the next sync queues; their errors arrive on
// the channel when they land.
func fillTrips(t *testing.T, r *Redis, name string) <-chan error {
	t.Helper()
	errs := make(chan error, r.trips.max)
	for i := range r.trips.max {
		go func() {
			_, err := r.Sync(testCtx(t), "a", Sync{Cell: cellAt(fmt.Sprint(name, "-", i), 1), Seq: 1, Limit: 10, LiveFor: 1000,
				ExpireAt: farFuture(), Requests: reqs(1)})
			errs <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		r.trips.mu.Lock()
		left := r.trips.flying == r.trips.max && len(r.trips.queue) == 0
		r.trips.mu.Unlock()
		if left {
			return errs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %d syncs that fill the trips never left", r.trips.max)
		}
	}
}

// Syncs that find every round trip taken leave together with the next,
// each cell still answered as if it had gone alone: 64 concurrent syncs
// make at most four trips (two at once), not 64; and cold
// grants and lease-carrying grants among them leave cells every view reads
// alike.
func TestConcurrentSyncsShareRoundTrips(t *testing.T) {
	r, _ := slowRedis(t, 50*time.Millisecond, "")
	direct, err := NewRedis(RedisConfig{URL: redistest.SharedURL(t), KeyPrefix: r.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	exerciseTripViews(t, r, direct)
	if st := r.TripStats(); st.Syncs != 64 || st.Trips > 4 {
		t.Errorf("64 concurrent syncs made %d trips carrying %d, want at most 4 carrying 64", st.Trips, st.Syncs)
	}
}

// exerciseTripViews syncs 64 fresh cells at once through r: a third cold
// grants (one request, no lease wanted: what a check of a client address
// sends), a third grants with a live lease, a third grants with a lease
// that ends at once. It checks each answer, then that Read, ScanCounts and
// another reporter's sync (through views, an origin on the same keys) count
// each cell alike: its grant, plus the lease once it ended (its unused part
// then counts as used), not while it is live.
func exerciseTripViews(t *testing.T, r, views *Redis) {
	t.Helper()
	const n = 64
	seq := time.Now().UnixMilli() / 60_000
	run := fmt.Sprint(time.Now().UnixNano())
	cells := make([]window.Cell, n)
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		leases = make([]int64, n)
	)
	for i := range n {
		cells[i] = window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint(run, "-", i), Duration: 60_000, Sequence: seq}
		wg.Go(func() {
			<-start
			s := Sync{Cell: cells[i], Seq: 1, Limit: 1000, LiveFor: 60_000, ExpireAt: farFuture(), Requests: reqs(int64(i + 1))}
			switch i % 3 {
			case 1:
				s.Want = 5
			case 2:
				s.Want, s.LiveFor = 5, 1
			}
			res, err := r.Sync(testCtx(t), "a", s)
			if err != nil {
				t.Errorf("sync %d: %v", i, err)
				return
			}
			if res.Outcomes[0] != Granted || res.Current.Used != int64(i+1) || res.Current.Charged != int64(i+1)+res.Lease {
				t.Errorf("sync %d (cost %d): %+v, want its own cell's grant", i, i+1, res)
			}
			if want := s.Want; res.Lease != want {
				t.Errorf("sync %d: lease %d, want %d", i, res.Lease, want)
			}
			leases[i] = res.Lease
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	// Redis's clock ends the 1ms leases (no clock to advance there): wait
	// until it counts one as used.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		cur, _, err := views.Read(testCtx(t), cells[2])
		if err != nil {
			t.Fatal(err)
		}
		if cur.Count == 3+leases[2] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease of cell 2 never ended: Read %d", cur.Count)
		}
	}
	scanned, _ := scanAll(t, views)
	other := &syncer{t: t, o: views, reporter: "b"}
	for i, c := range cells {
		want := int64(i + 1)
		if i%3 == 2 {
			want += leases[i]
		}
		cur, _, err := views.Read(testCtx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		look := other.sync(Sync{Cell: c, Limit: 1000})
		if cur.Count != want || scanned[c].Count != want || look.Current.Used != want {
			t.Errorf("cell %d (lease %d): Read %d, scan %d, a sync %d; want %d in every view",
				i, leases[i], cur.Count, scanned[c].Count, look.Current.Used, want)
		}
	}
}

// A sync whose deadline passes while it waits for a round trip is never
// sent: its error wraps ErrNotSent and the deadline, Redis never counts it,
// and no breaker counts it as a failure: the caller's budget was short,
// Redis did not fail.
func TestASyncThatNeverLeftIsNotSentAndOpensNoBreaker(t *testing.T) {
	r, _ := slowRedis(t, 100*time.Millisecond, "")
	b := NewBreaker(r, BreakerConfig{Failures: 1})
	done := fillTrips(t, r, "trip-first")
	late := cellAt("trip-late", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := b.Sync(ctx, "a", Sync{Cell: late, Seq: 2, Limit: 10, LiveFor: 1000, ExpireAt: farFuture(), Requests: reqs(1)})
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a sync whose deadline passed in the queue: %v, want ErrNotSent and the deadline", err)
	}
	if waited := time.Since(began); waited >= 150*time.Millisecond {
		t.Errorf("it returned after %v: it waited for the trip ahead (at least 200ms) instead of its deadline", waited)
	}
	for range r.trips.max {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if st := b.State(CallRead); st != gobreaker.StateClosed {
		t.Errorf("read breaker %v after a call that was never sent, want closed", st)
	}
	for _, c := range []window.Cell{cellAt("trip-first-0", 1), cellAt("trip-first-1", 1), late} {
		cur, _, err := r.Read(testCtx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(1)
		if c == late {
			want = 0
		}
		if cur.Count != want {
			t.Errorf("%s: Redis counts %d, want %d", c.Identifier, cur.Count, want)
		}
	}
}

// A call that waited for a connection past the pool's timeout (every
// connection busy: load) wraps ErrNotSent and opens no breaker; a call
// Redis left unanswered past its deadline is a failure and opens it.
func TestPoolWaitsOpenNoBreakerAndTimeoutsDo(t *testing.T) {
	// One connection for pipelines and one more for what spills over.
	r, p := slowRedis(t, 100*time.Millisecond, "?pool_size=1&pipeline_pool_size=1&pool_timeout=20ms")
	b := NewBreaker(readsAsSyncs{r}, BreakerConfig{Failures: 1})
	c := cellAt("pool-wait", 1)
	done := make(chan error, 2)
	for range 2 {
		go func() { _, err := b.Sync(testCtx(t), "r", Sync{Cell: c}); done <- err }()
	}
	for deadline := time.Now().Add(5 * time.Second); p.Conns() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first reads never connected")
		}
	}
	time.Sleep(20 * time.Millisecond) // the read is on its way: its connection is taken
	_, err := b.Sync(testCtx(t), "r", Sync{Cell: c})
	if !errors.Is(err, ErrNotSent) {
		t.Fatalf("a read that found no free connection: %v, want ErrNotSent", err)
	}
	if st := b.State(CallRead); st != gobreaker.StateClosed {
		t.Errorf("read breaker %v after a pool wait, want closed", st)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = b.Sync(ctx, "r", Sync{Cell: c})
	var ne net.Error
	if timedOut := errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout(); !timedOut || errors.Is(err, ErrNotSent) {
		t.Fatalf("a read Redis did not answer in time: %v, want a timeout of a call sent", err)
	}
	if st := b.State(CallRead); st != gobreaker.StateOpen {
		t.Errorf("read breaker %v after a timeout, want open", st)
	}
}

// Closing the origin answers the syncs still waiting for a round trip as
// not sent, at once, and ends its fliers.
func TestCloseAnswersQueuedSyncsAsNotSent(t *testing.T) {
	r, _ := slowRedis(t, 200*time.Millisecond, "")
	first := fillTrips(t, r, "close-first")
	queued := make(chan error, 1)
	go func() {
		_, err := r.Sync(testCtx(t), "a", Sync{Cell: cellAt("close-queued", 1), Seq: 2, Limit: 10, LiveFor: 1000,
			ExpireAt: farFuture(), Requests: reqs(1)})
		queued <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		r.trips.mu.Lock()
		n := len(r.trips.queue)
		r.trips.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second sync never queued")
		}
	}
	r.Close()
	if err := <-queued; !errors.Is(err, ErrNotSent) {
		t.Fatalf("a sync queued when the origin closed: %v, want ErrNotSent", err)
	}
	for range r.trips.max {
		<-first // answered or failed by the closed connection; either way they return
	}
	if _, err := r.Sync(testCtx(t), "a", Sync{Cell: cellAt("close-after", 1), Seq: 3, Limit: 10, ExpireAt: farFuture()}); !errors.Is(err, ErrNotSent) {
		t.Fatalf("a sync after Close: %v, want ErrNotSent", err)
	}
}

// readsAsSyncs is a Redis whose Sync is a Read: one command on the pool, as
// a breaker test of reads needs, where a real Sync would queue for a round
// trip (trips) instead of waiting for a connection. The read breaker
// guards it as it guards every Sync.
type readsAsSyncs struct{ *Redis }

func (r readsAsSyncs) Sync(ctx context.Context, _ string, s Sync) (SyncResult, error) {
	_, _, err := r.Read(ctx, s.Cell)
	return SyncResult{}, err
}
