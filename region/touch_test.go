package region_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// A sync that reaches a cell no reporter holds takes a first touch (a SET
// NX of the cell and a GET of the one before it, the rule applied by the
// limiter): its result, and every view of the cells after it, are what
// the sync script decides, as the Go model of the script (Memory) says,
// whether its requests all fit (the touch stands), some do not (it is
// taken back and the script decides) or the cell was there (the script
// decides). Random scenarios, each on fresh cells: a previous window's
// usage by other reporters (reports, grants, live leases), maybe a sync of
// the current cell by another reporter first, then the touchable sync, on
// sliding and fixed windows.
func TestFirstTouchDecidesAsTheScript(t *testing.T) {
	r, err := region.NewRedis(region.RedisConfig{URL: redistest.SharedURL(t), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	m := regiontest.NewMemory(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := time.Now().UnixNano()
	// The first sync reads Redis's clock; first touches follow.
	prime := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint(run, "-prime"), Duration: 1000, Sequence: 1}
	if _, err := r.Sync(ctx, "z", region.Sync{Cell: prime, Seq: 1, Limit: 10, LiveFor: 1000, ExpireAt: time.Now().Add(time.Minute).UnixMilli(),
		Requests: []region.Request{{Cost: 1}}}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(run), 7))
	seq := int64(10)
	var touched, undone, found int
	for i := range 300 {
		const d = 60_000
		now := time.Now().UnixMilli()
		c := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint(run, "-", i), Duration: d, Sequence: now / d}
		limit := 1 + rng.Int64N(50)
		fixed := rng.IntN(4) == 0
		base := region.Sync{Limit: limit, LiveFor: 600_000, ExpireAt: now + 10*d, Fixed: fixed,
			Elapsed: rng.Int64N(d), Foreign: rng.Int64N(3), ForeignPrevious: rng.Int64N(3)}
		both := func(reporter string, s region.Sync) (region.SyncResult, region.SyncResult) {
			t.Helper()
			seq++
			s.Seq = seq
			got, err := r.Sync(ctx, reporter, s)
			if err != nil {
				t.Fatalf("scenario %d: redis sync %+v: %v", i, s, err)
			}
			want, err := m.Sync(ctx, reporter, s)
			if err != nil {
				t.Fatal(err)
			}
			return got, want
		}
		// The previous window: other reporters' reports, grants and live leases.
		for k := range rng.IntN(3) {
			s := base
			s.Cell = c
			s.Cell.Sequence--
			s.Fixed = false
			s.Used = rng.Int64N(limit)
			s.Claim = s.Used + rng.Int64N(4)
			s.Requests = []region.Request{{Cost: 1 + rng.Int64N(3)}}
			both(fmt.Sprint("p", k), s)
		}
		cellThere := rng.IntN(4) == 0
		if cellThere {
			s := base
			s.Cell = c
			s.Requests = []region.Request{{Cost: 1}}
			both("other", s)
		}
		s := base
		s.Cell = c
		for range 1 + rng.IntN(3) {
			s.Requests = append(s.Requests, region.Request{Cost: 1 + rng.Int64N(limit)})
		}
		before := r.FirstTouches()
		got, want := both("me", s)
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("scenario %d (%+v, cell there %v): redis %+v, the script's model %+v", i, s, cellThere, got, want)
		}
		allGranted := true
		for _, o := range want.Outcomes {
			allGranted = allGranted && o == region.Granted
		}
		switch tookTouch := r.FirstTouches() > before; {
		case cellThere:
			found++
			if tookTouch {
				t.Fatalf("scenario %d: a first touch stood on a cell that was there", i)
			}
		case allGranted:
			touched++
			if !tookTouch {
				t.Fatalf("scenario %d: a fresh cell whose requests all fit did not take a first touch", i)
			}
		default:
			undone++
			if tookTouch {
				t.Fatalf("scenario %d: a first touch stood though a request did not fit: %+v", i, got)
			}
		}
		// Every view of both cells agrees with the model's.
		prevCell := c
		prevCell.Sequence--
		for _, cell := range []window.Cell{c, prevCell} {
			gc, gp, err := r.Read(ctx, cell)
			if err != nil {
				t.Fatal(err)
			}
			wc, wp, _ := m.Read(ctx, cell)
			if gc != wc || gp != wp {
				t.Fatalf("scenario %d: Read(%v) = %+v, %+v; the model %+v, %+v", i, cell, gc, gp, wc, wp)
			}
		}
	}
	t.Logf("%d first touches stood, %d taken back, %d found the cell", touched, undone, found)
	if touched < 50 || undone < 20 || found < 20 {
		t.Fatalf("scenarios reached too few paths: %d stood, %d taken back, %d found the cell", touched, undone, found)
	}
}
