package region

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/window"
)

// lookingOrigin is an Origin that can also be looked at without a sync:
// Redis (its Read) and internal/regiontest's Memory.
type lookingOrigin interface {
	Origin
	Read(ctx context.Context, c window.Cell) (current, previous Totals, err error)
}

// originUnderTest is an Origin with a way to let its clock pass: a manual
// clock for Memory, a sleep for Redis (whose clock is its own).
type originUnderTest struct {
	lookingOrigin
	pass func(ms int64)
	// forget is the origin's ForgetAfter in milliseconds.
	forget int64
	// reporters returns how many reporters (retirement marks included)
	// the origin keeps for a cell.
	reporters func(window.Cell) int
	// local returns the local count the origin keeps for a cell's LocalID
	// (Redis: the cell's locals), and whether it keeps one.
	local func(c window.Cell, id string) (int64, bool)
	// expireAt returns the unix ms at which the origin drops a cell.
	expireAt func(window.Cell) int64
	// now is the origin's clock, in unix ms.
	now func() int64
}

// syncer sends one reporter's syncs with increasing Seq.
type syncer struct {
	t        *testing.T
	o        Origin
	reporter string
	seq      int64
}

func (s *syncer) sync(x Sync) SyncResult {
	s.t.Helper()
	s.seq++
	x.Seq = s.seq
	if x.Limit == 0 {
		x.Limit = 10
	}
	if x.LiveFor == 0 {
		x.LiveFor = 60_000
	}
	x.ExpireAt = farFuture()
	res, err := s.o.Sync(testCtx(s.t), s.reporter, x)
	if err != nil {
		s.t.Fatalf("%s sync: %v", s.reporter, err)
	}
	return res
}

func reqs(costs ...int64) []Request {
	out := make([]Request, len(costs))
	for i, c := range costs {
		out[i] = Request{Cost: c}
	}
	return out
}

func outcomes(os ...Outcome) string { return fmt.Sprint(os) }

// exerciseSync checks the Sync contract against o.
func exerciseSync(t *testing.T, o originUnderTest) {
	t.Run("requests are granted exactly up to the limit", func(t *testing.T) {
		c := cellAt("exact", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		res := a.sync(Sync{Cell: c, Requests: reqs(3)})
		if outcomes(res.Outcomes...) != outcomes(Granted) || res.Charged != 3 || res.Room != 7 ||
			res.Current.Used != 3 || res.Current.Charged != 3 {
			t.Fatalf("a's 3 into an empty cell: %+v", res)
		}
		// b: 4 fits, the next 4 does not, and with no lease live anywhere
		// that is final.
		res = b.sync(Sync{Cell: c, Requests: reqs(4, 4)})
		if outcomes(res.Outcomes...) != outcomes(Granted, Denied) || res.Charged != 4 || res.Current.Used != 7 || res.Room != 3 {
			t.Fatalf("b's 4 and 4: %+v", res)
		}
		res = b.sync(Sync{Cell: c, Used: 4, Claim: 4, Requests: reqs(3, 1)})
		if outcomes(res.Outcomes...) != outcomes(Granted, Denied) || res.Room != 0 || res.Current.Used != 10 {
			t.Fatalf("b's 3 and 1 at 7 of 10: %+v", res)
		}
		// A sync overtaken by a later one changes nothing.
		b.seq -= 2
		res = b.sync(Sync{Cell: c, Used: 100, Claim: 100, Requests: reqs(1)})
		if !res.Stale || outcomes(res.Outcomes...) != outcomes(Pending) || res.Current.Used != 10 || res.Charged != 7 {
			t.Fatalf("a stale sync: %+v", res)
		}
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 10 {
			t.Fatalf("read %+v, %v; want 10", cur, err)
		}
	})

	t.Run("a debit is charged whatever the room, and later requests find it", func(t *testing.T) {
		c := cellAt("debit", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		// b holds a lease of the room; a's debit of 25 against a limit of 10
		// is charged all the same, beside a request that no longer fits.
		res := b.sync(Sync{Cell: c, Want: 4})
		if res.Lease == 0 {
			t.Fatalf("b's lease: %+v", res)
		}
		lease := res.Lease
		debit := []Request{{Cost: 1}, {Cost: 25, Debit: true}, {Cost: 1}}
		res = a.sync(Sync{Cell: c, Requests: debit})
		if outcomes(res.Outcomes...) != outcomes(Granted, Granted, Denied) || res.Current.Used != 26 ||
			res.Current.Charged != 26+lease || res.Room >= 0 {
			t.Fatalf("a's 1, debit of 25 and 1 beside b's lease of %d: %+v", lease, res)
		}
		// Every view counts the debit: a read, b's next sync, a look.
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 26 {
			t.Fatalf("read %+v, %v; want 26", cur, err)
		}
		res = b.sync(Sync{Cell: c, Claim: lease, Requests: reqs(1)})
		if outcomes(res.Outcomes...) != outcomes(Denied) || res.Current.Used != 26 {
			t.Fatalf("b's 1 after the debit: %+v", res)
		}
		// A debit sent again in a stale sync counts nothing.
		a.seq -= 2
		res = a.sync(Sync{Cell: c, Used: 26, Claim: 26, Requests: []Request{{Cost: 5, Debit: true}}})
		if !res.Stale || outcomes(res.Outcomes...) != outcomes(Pending) || res.Current.Used != 26 {
			t.Fatalf("a stale debit: %+v", res)
		}
	})

	t.Run("a lease is a share of the room, and waits make holders return it", func(t *testing.T) {
		c := cellAt("lease", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		res := a.sync(Sync{Cell: c, Limit: 1000, Want: 500})
		if res.Lease != 1000/LeaseShare || res.Charged != 125 || res.Current.Used != 0 || res.Current.Charged != 125 {
			t.Fatalf("a lease on an empty cell: %+v", res)
		}
		// 900 fits only if a's lease is unused: it waits.
		res = b.sync(Sync{Cell: c, Limit: 1000, Requests: reqs(900)})
		if outcomes(res.Outcomes...) != outcomes(Pending) || !res.Contended || res.WaitMs <= 0 || res.Current.Used != 0 {
			t.Fatalf("900 against a live lease of 125: %+v", res)
		}
		// While contended, no lease beyond the requests.
		res = a.sync(Sync{Cell: c, Limit: 1000, Used: 20, Claim: 125, Want: 100})
		if res.Lease != 0 || !res.Contended || res.Current.Used != 20 {
			t.Fatalf("a lease while contended: %+v", res)
		}
		// a returns what it did not use; b's 900 fits.
		res = a.sync(Sync{Cell: c, Limit: 1000, Used: 20, Claim: 20})
		if res.Charged != 20 || res.Current.Charged != 20 {
			t.Fatalf("a returns its lease: %+v", res)
		}
		res = b.sync(Sync{Cell: c, Limit: 1000, Requests: reqs(900, 81)})
		if outcomes(res.Outcomes...) != outcomes(Granted, Denied) || res.Current.Used != 920 {
			t.Fatalf("900 and 81 once the lease is back: %+v", res)
		}
	})

	t.Run("a grant whose reply was lost is returned by the next claim", func(t *testing.T) {
		c := cellAt("lost", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		if res := a.sync(Sync{Cell: c, Limit: 1000, Want: 50}); res.Lease != 50 {
			t.Fatalf("lease: %+v", res)
		}
		res := a.sync(Sync{Cell: c, Limit: 1000}) // claims nothing: it never got the 50
		if res.Charged != 0 || res.Current.Charged != 0 {
			t.Fatalf("after the lost grant: %+v", res)
		}
	})

	t.Run("a lease no longer live counts as used", func(t *testing.T) {
		c := cellAt("dead", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		if res := a.sync(Sync{Cell: c, Limit: 800, Want: 100, LiveFor: 100}); res.Lease != 100 {
			t.Fatalf("lease: %+v", res)
		}
		if res := b.sync(Sync{Cell: c, Limit: 800, Requests: reqs(750)}); outcomes(res.Outcomes...) != outcomes(Pending) {
			t.Fatalf("750 against a live lease of 100 of 800: %+v", res)
		}
		o.pass(150) // a died: its lease is no longer live
		res := b.sync(Sync{Cell: c, Limit: 800, Requests: reqs(750, 700)})
		if outcomes(res.Outcomes...) != outcomes(Denied, Granted) || res.Current.Used != 800 {
			t.Fatalf("750 and 700 after a's lease ended: %+v", res)
		}
	})

	t.Run("every view counts an ended lease as used, and a late holder's return lowers it", func(t *testing.T) {
		c := cellAt("one-count", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		// a: 30 granted and a lease of 100, of which it spends 40 without
		// reporting them.
		res := a.sync(Sync{Cell: c, Limit: 1000, Requests: reqs(30), Want: 100, LiveFor: 100})
		if res.Lease != 100 || res.Current.Used != 30 || res.Current.Charged != 130 {
			t.Fatalf("a's grant and lease: %+v", res)
		}
		// While the lease is live, the count holds only what was reported.
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 30 {
			t.Fatalf("read while a's lease is live = %+v, %v; want 30", cur, err)
		}
		o.pass(150) // a's lease ended: a died, or it is late
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 130 {
			t.Fatalf("read once a's lease ended = %+v, %v; want 130: its unused part counts as used", cur, err)
		}
		res = b.sync(Sync{Cell: c, Limit: 1000, Requests: reqs(1)})
		if res.Current.Used != 131 || res.Current.Charged != 131 || res.Reversals != 0 {
			t.Fatalf("b's sync once a's lease ended: %+v; want the count 131, as Read says", res)
		}
		// a was late, not dead: it gives back the 60 it did not use. The
		// count comes down, and says so.
		res = a.sync(Sync{Cell: c, Limit: 1000, Used: 70, Claim: 70})
		if res.Current.Used != 71 || res.Reversals != 1 || res.Charged != 70 {
			t.Fatalf("a's late return: %+v; want the count 71 (30 + 40 + 1) and one reversal", res)
		}
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 71 {
			t.Fatalf("read after a's return = %+v, %v; want 71", cur, err)
		}
	})

	t.Run("a reporter's unused holding stays within its share of the room", func(t *testing.T) {
		c := cellAt("holding", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		// Each top-up asks for 100 more while nothing is used: the holding
		// stops at an eighth of the room counting itself (125), however
		// often it asks.
		var held int64
		for i, want := range []int64{100, 25, 0, 0} {
			res := a.sync(Sync{Cell: c, Limit: 1000, Claim: held, Want: 100})
			if res.Lease != want {
				t.Fatalf("top-up %d holding %d: lease %d, want %d (%+v)", i, held, res.Lease, want, res)
			}
			held += res.Lease
		}
	})

	t.Run("a local count raised takes what the lost admissions hold of it", func(t *testing.T) {
		// The origin failed; a admitted 50 alone (Local 50, not in its
		// Used) and published its count (150), which reached b, whose
		// floor carries it: b's floor above what is charged (100) is kept
		// as lost admissions, 50. a's raise of 50 is counted as used (100
		// + 50) and taken out of the lost 50 (none left): 150, not 200.
		c := cellAt("local-lost-floor", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		a.sync(Sync{Cell: c, Limit: 1000, Used: 100, Claim: 100})
		if res := b.sync(Sync{Cell: c, Limit: 1000, Floor: 150}); res.Current.Used != 150 {
			t.Fatalf("b's floor of 150: %+v", res)
		}
		res := a.sync(Sync{Cell: c, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: 50})
		if res.Current.Used != 150 || res.Current.Charged != 150 || res.Local != 50 || res.Charged != 100 {
			t.Fatalf("a reports the 50 it admitted alone: %+v; want 150 used and charged (100 + 50, the lost 50 taken), not 200", res)
		}
		// 30 more alone: no lost admissions left to take them from.
		if res := a.sync(Sync{Cell: c, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: 80}); res.Current.Used != 180 {
			t.Fatalf("a's local count raised to 80: %+v; want 180", res)
		}
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 180 {
			t.Fatalf("read = %+v, %v; want 180", cur, err)
		}

		// The same through the bridge's own count, 170: 70 lost (o 170, t
		// 100). A raise to 50 takes 50 of them: u 150, b 20, the count
		// max(u+b, o) = 170; to 70, the last 20: u 170, b 0, still 170;
		// to 90, nothing left to take: u 190, above o, 190.
		d := cellAt("local-lost-own", 1000)
		a.sync(Sync{Cell: d, Limit: 1000, Used: 100, Claim: 100})
		if err := o.Import(testCtx(t), []Imported{{Cell: d, Own: 170, ExpireAt: farFuture()}}); err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct{ local, want int64 }{{50, 170}, {70, 170}, {90, 190}} {
			res := a.sync(Sync{Cell: d, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: step.local})
			if res.Current.Used != step.want || res.Current.Charged != step.want || res.Local != step.local {
				t.Fatalf("a's local count raised to %d under an own count of 170: %+v; want %d", step.local, res, step.want)
			}
			if cur, _, err := o.Read(testCtx(t), d); err != nil || cur.Count != step.want {
				t.Fatalf("read after local %d = %+v, %v; want %d", step.local, cur, err, step.want)
			}
		}
	})

	t.Run("a retired reporter folds into the totals, and its sync sent again changes nothing", func(t *testing.T) {
		c := cellAt("retire", 1000)
		a, b := &syncer{t: t, o: o, reporter: "a"}, &syncer{t: t, o: o, reporter: "b"}
		b.sync(Sync{Cell: c, Limit: 1000, Used: 5, Claim: 5, LiveFor: 1})
		a.sync(Sync{Cell: c, Limit: 1000, Used: 10, Claim: 30})
		for range 2 { // the second: a retry after a lost reply
			res := a.sync(Sync{Cell: c, Limit: 1000, Used: 10, Claim: 10, Retire: true})
			if res.Stale || res.Current.Used != 15 || res.Current.Charged != 15 {
				t.Fatalf("a retires: %+v; want 15 used and charged", res)
			}
		}
		o.pass(o.forget + 50)
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 15 {
			t.Fatalf("read after the retirement mark aged = %+v, %v; want 15", cur, err)
		}
		if n := o.reporters(c); n != 0 {
			t.Fatalf("%d reporters kept, want none: a retired and b was unheard of for ForgetAfter", n)
		}
	})

	t.Run("reporters unheard of for ForgetAfter are forgotten and their parts stay", func(t *testing.T) {
		c := cellAt("forget", 1000)
		for i := range 100 {
			r := &syncer{t: t, o: o, reporter: fmt.Sprint("gone-", i)}
			r.sync(Sync{Cell: c, Limit: 1000, Used: 1, Claim: 1, LiveFor: 1})
		}
		if n := o.reporters(c); n != 100 {
			t.Fatalf("%d reporters, want 100", n)
		}
		o.pass(o.forget + 50)
		last := &syncer{t: t, o: o, reporter: "last"}
		if res := last.sync(Sync{Cell: c, Limit: 1000, Requests: reqs(1)}); res.Current.Used != 101 {
			t.Fatalf("the count once 100 reporters were forgotten: %+v; want 101", res)
		}
		if n := o.reporters(c); n != 1 {
			t.Fatalf("%d reporters kept, want only the last one", n)
		}
		// One of them comes back under a new generation: it reports what it
		// admitted since, and nothing counts twice.
		back := &syncer{t: t, o: o, reporter: "gone-7"}
		if res := back.sync(Sync{Cell: c, Limit: 1000, Used: 2, Claim: 2, Generation: 1}); res.Current.Used != 103 {
			t.Fatalf("a new generation of a forgotten reporter: %+v; want 103", res)
		}
	})

	t.Run("a reserved cost joins the lease and can be returned", func(t *testing.T) {
		c := cellAt("reserve", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		res := a.sync(Sync{Cell: c, Requests: []Request{{Cost: 5, Reserve: true}}})
		if outcomes(res.Outcomes...) != outcomes(Granted) || res.Charged != 5 || res.Current.Used != 0 || res.Current.Charged != 5 {
			t.Fatalf("reserve 5: %+v", res)
		}
		if res := a.sync(Sync{Cell: c}); res.Current.Charged != 0 {
			t.Fatalf("after returning the reservation: %+v", res)
		}
	})

	t.Run("the previous cell weighs by the exact rule", func(t *testing.T) {
		rnd := rand.New(rand.NewPCG(1, 2))
		z := &syncer{t: t, o: o, reporter: "z"}
		q := &syncer{t: t, o: o, reporter: "q"}
		for i := range 200 {
			d := []int64{window.MinDuration, 60_000, 86_400_000, window.MaxDuration, 1000 + rnd.Int64N(window.MaxDuration-1000)}[i%5]
			seq := int64(10 + i*2)
			limit := 1 + rnd.Int64N(window.MaxLimit)
			prev := rnd.Int64N(1 << (1 + rnd.IntN(51)))
			elapsed := []int64{0, d - 1, rnd.Int64N(d)}[i%3]
			fc, fp := int64(0), int64(0)
			if i%4 == 0 {
				fc, fp = rnd.Int64N(1<<20), rnd.Int64N(1<<40)
			}
			cur := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint("rule-", i), Duration: d, Sequence: seq}
			p := cur
			p.Sequence--
			z.sync(Sync{Cell: p, Used: prev, Claim: prev})
			res := q.sync(Sync{Cell: cur, Limit: limit, Elapsed: elapsed, Foreign: fc, ForeignPrevious: fp})
			want := window.Room(window.Input{Now: seq*d + elapsed, Duration: d, Limit: limit, Previous: prev + fp})
			if want >= 0 {
				want -= fc
			}
			if res.Room != want {
				t.Fatalf("case %d (limit %d, duration %d, elapsed %d, previous %d, foreign %d/%d): room %d, window.Room %d",
					i, limit, d, elapsed, prev, fc, fp, res.Room, want)
			}
		}
	})

	t.Run("a fixed window weighs the cell alone, on the same counts", func(t *testing.T) {
		rnd := rand.New(rand.NewPCG(3, 4))
		z := &syncer{t: t, o: o, reporter: "z"}
		q := &syncer{t: t, o: o, reporter: "q"}
		for i := range 60 {
			d := []int64{window.MinDuration, 60_000, 86_400_000, 1000 + rnd.Int64N(window.MaxDuration-1000)}[i%4]
			seq := int64(10 + i*2)
			limit := 2 + rnd.Int64N(1000)
			prev := limit + rnd.Int64N(limit) // the previous window is full
			elapsed := []int64{0, d - 1, rnd.Int64N(d)}[i%3]
			fc, fp := int64(0), int64(0)
			if i%2 == 0 {
				fc, fp = rnd.Int64N(limit/2), rnd.Int64N(limit)
			}
			cur := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint("fixed-", i), Duration: d, Sequence: seq}
			p := cur
			p.Sequence--
			z.sync(Sync{Cell: p, Used: prev, Claim: prev})
			in := window.Input{Now: seq*d + elapsed, Duration: d, Limit: limit, Previous: prev + fp, Fixed: true}
			want := window.Room(in) - fc // limit - fc: the previous cell takes nothing
			res := q.sync(Sync{Cell: cur, Limit: limit, Elapsed: elapsed, Foreign: fc, ForeignPrevious: fp, Fixed: true,
				Requests: reqs(want, 1)})
			if res.Room != 0 || res.PreviousRead || outcomes(res.Outcomes...) != outcomes(Granted, Denied) {
				t.Fatalf("case %d (limit %d, previous %d, foreign %d/%d): fixed sync of %d then 1: room %d, previous read %v, outcomes %v",
					i, limit, prev, fc, fp, want, res.Room, res.PreviousRead, res.Outcomes)
			}
			// The same cell under the sliding rule: the previous cell weighs
			// again, and the count is the one the fixed sync left.
			in.Fixed = false
			slide := window.Room(in)
			if slide >= 0 {
				slide -= fc
			}
			res = q.sync(Sync{Cell: cur, Limit: limit, Elapsed: elapsed, Foreign: fc, ForeignPrevious: fp, Used: want, Claim: want})
			roomOK := res.Room == slide-want
			if slide < want {
				roomOK = res.Room < 0 // the previous cell leaves less than is used
			}
			if res.Current.Used != want || !res.PreviousRead || !roomOK {
				t.Fatalf("case %d: sliding sync after the fixed one: used %d (want %d), previous read %v, room %d (sliding room %d)",
					i, res.Current.Used, want, res.PreviousRead, res.Room, slide)
			}
		}
	})

	t.Run("a calendar period's cell is a fixed window under its code", func(t *testing.T) {
		q := &syncer{t: t, o: o, reporter: "q"}
		now := time.Now().UnixMilli()
		for i, period := range []string{"month@Europe/Berlin", "day@Asia/Kolkata", "hour@America/St_Johns", "year", "week@Pacific/Apia"} {
			d, _, err := window.ParseCalendar(period)
			if err != nil {
				t.Fatal(err)
			}
			seq := window.Sequence(now, d)
			cur := window.Cell{Workspace: "acme", Namespace: "api", Identifier: fmt.Sprint("calendar-", i), Duration: d, Sequence: seq}
			limit, fc := int64(100+i), int64(i)
			res := q.sync(Sync{Cell: cur, Limit: limit, Elapsed: now - window.Start(seq, d), Foreign: fc, ForeignPrevious: 50, Fixed: true,
				ExpireAt: cur.Expiry(60_000), Requests: reqs(limit-fc, 1)})
			if res.Room != 0 || res.PreviousRead || outcomes(res.Outcomes...) != outcomes(Granted, Denied) || res.Current.Used != limit-fc {
				t.Fatalf("%s: sync of %d then 1 against %d (foreign %d): room %d, previous read %v, outcomes %v, used %d",
					period, limit-fc, limit, fc, res.Room, res.PreviousRead, res.Outcomes, res.Current.Used)
			}
		}
	})

	t.Run("large counts stay exact", func(t *testing.T) {
		c := cellAt("big", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		const used, cost = 123_456_789_012_345, 987_654_321_012
		res := a.sync(Sync{Cell: c, Limit: window.MaxLimit, Used: used, Claim: used, Requests: reqs(cost)})
		if outcomes(res.Outcomes...) != outcomes(Granted) || res.Charged != used+cost || res.Current.Used != used+cost {
			t.Fatalf("large counts: %+v", res)
		}
	})

	t.Run("a report only records the reporter's state", func(t *testing.T) {
		c := cellAt("report", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		p := c
		p.Sequence--
		a.sync(Sync{Cell: p, Used: 7, Claim: 7})
		res := a.sync(Sync{Cell: c, Used: 3, Claim: 5, ReportOnly: true})
		if res.PreviousRead || res.Previous.Used != 0 || res.Room != RoomUnknown-5 || res.Current.Used != 3 || res.Current.Charged != 5 {
			t.Fatalf("a report: %+v", res)
		}
		res = a.sync(Sync{Cell: c, Used: 3, Claim: 5})
		if !res.PreviousRead || res.Previous.Used != 7 || res.Room != 10-5-7 {
			t.Fatalf("a sync: %+v", res)
		}
	})

	t.Run("a lost cell is rebuilt by the first live reporter's floor", func(t *testing.T) {
		// The origin lost the cell (it holds nothing) while three live
		// reporters had admitted 300 each and knew of 900 in all. The
		// first to sync again carries its claim (300) and its floor (900):
		// only the 100 the limit leaves are granted, before the two others
		// have sent their claims again; when they do, nothing counts twice.
		c := cellAt("lost-floor", 1000)
		a := &syncer{t: t, o: o, reporter: "a", seq: 10}
		res := a.sync(Sync{Cell: c, Limit: 1000, Used: 300, Claim: 300, Floor: 900, Requests: reqs(101, 100, 1)})
		if outcomes(res.Outcomes...) != outcomes(Denied, Granted, Denied) || res.Current.Used != 1000 {
			t.Fatalf("a's requests on a lost cell, floor 900 of 1000: %+v", res)
		}
		for _, who := range []string{"b", "c"} {
			r := &syncer{t: t, o: o, reporter: who, seq: 10}
			r.sync(Sync{Cell: c, Limit: 1000, Used: 300, Claim: 300, Floor: 900})
		}
		if cur, _, err := o.Read(testCtx(t), c); err != nil || cur.Count != 1000 {
			t.Fatalf("read after every reporter synced again = %+v, %v; want 1000", cur, err)
		}
		// A floor below what is charged changes nothing.
		res = a.sync(Sync{Cell: c, Limit: 1000, Used: 400, Claim: 400, Floor: 10, Requests: reqs(1)})
		if outcomes(res.Outcomes...) != outcomes(Denied) || res.Current.Used != 1000 {
			t.Fatalf("a low floor: %+v", res)
		}
	})

	t.Run("settle carries many cells", func(t *testing.T) {
		var ss []Sync
		for i := range 300 {
			ss = append(ss, Sync{Cell: cellAt(fmt.Sprint("settle-", i), 5), Seq: 1, Used: int64(i + 1), Claim: int64(i + 1),
				Limit: 1000, LiveFor: 1000, ExpireAt: farFuture()})
		}
		res, err := o.Settle(testCtx(t), "a", ss)
		if err != nil || len(res) != len(ss) {
			t.Fatalf("settle: %d results, %v", len(res), err)
		}
		for i, r := range res {
			if r.Current.Used != int64(i+1) {
				t.Fatalf("cell %d used %d, want %d", i, r.Current.Used, i+1)
			}
		}
	})
}

// exerciseImport checks Import against o: the foreign usage and the own
// lower bound come back with the totals of the same read, each kept at its
// maximum; the lower bound raises the count only while it is higher, and
// counts in what the rule leaves; a cell only imported is created.
func exerciseImport(t *testing.T, o lookingOrigin) {
	ctx := testCtx(t)
	const seq = 2000
	used, remote := cellAt("imported-used", seq), cellAt("imported-only", seq)
	exp := farFuture()
	a := &syncer{t: t, o: o, reporter: "a"}
	a.sync(Sync{Cell: used, Used: 4, Claim: 4})
	for _, imports := range [][]Imported{
		{{Cell: used, Foreign: 6, Own: 2, ExpireAt: exp}, {Cell: remote, Foreign: 9, Own: 0, ExpireAt: exp}},
		{{Cell: used, Foreign: 5, Own: 1, ExpireAt: exp}, {Cell: remote, Foreign: 3, ExpireAt: exp}}, // lower: changes nothing
	} {
		if err := o.Import(ctx, imports); err != nil {
			t.Fatal(err)
		}
		cur, _, err := o.Read(ctx, used)
		if err != nil || cur != (Totals{Count: 4, Foreign: 6}) {
			t.Fatalf("read of a used cell after imports = %+v, %v; want count 4 (above the lower bound 2), foreign 6", cur, err)
		}
		cur, _, err = o.Read(ctx, remote)
		if err != nil || cur != (Totals{Count: 0, Foreign: 9}) {
			t.Fatalf("read of an imported cell = %+v, %v; want foreign 9", cur, err)
		}
	}
	// A lower bound above what is charged (the origin lost admissions the
	// bridge still counts) raises what Read returns, and what Sync decides
	// against: the region used 11, the other regions 6, so 3 of 20 fit and 4
	// do not, and the region has used 14.
	if err := o.Import(ctx, []Imported{{Cell: used, Foreign: 6, Own: 11, ExpireAt: exp}}); err != nil {
		t.Fatal(err)
	}
	if cur, _, err := o.Read(ctx, used); err != nil || cur != (Totals{Count: 11, Foreign: 6}) {
		t.Fatalf("read after a higher own lower bound = %+v, %v; want count 11", cur, err)
	}
	res := a.sync(Sync{Cell: used, Limit: 20, Used: 4, Claim: 4, Requests: reqs(4, 3)})
	if outcomes(res.Outcomes...) != outcomes(Denied, Granted) || res.Current.Used != 14 || res.Current.Foreign != 6 {
		t.Fatalf("sync against the lower bound: %+v", res)
	}

	// A cell the origin lost (it holds nothing of the region's admissions)
	// that the bridge restores with the region's count, 900: that count is
	// what admissions add to. A reporter that held 300 of it sends its
	// claim again; it is in the 900 already, so it does not count twice.
	lost := cellAt("imported-lost", seq)
	if err := o.Import(ctx, []Imported{{Cell: lost, Own: 900, ExpireAt: exp}}); err != nil {
		t.Fatal(err)
	}
	if cur, _, err := o.Read(ctx, lost); err != nil || cur.Count != 900 {
		t.Fatalf("read of a restored cell = %+v, %v; want 900", cur, err)
	}
	back := &syncer{t: t, o: o, reporter: "back", seq: 10}
	if res := back.sync(Sync{Cell: lost, Limit: 1000, Used: 300, Claim: 300}); res.Current.Used != 900 || res.Current.Charged != 900 {
		t.Fatalf("a reporter sending its claim again into a restored cell: %+v; want 900 used and charged", res)
	}
	res = (&syncer{t: t, o: o, reporter: "new"}).sync(Sync{Cell: lost, Limit: 1000, Requests: reqs(101, 100, 1)})
	if outcomes(res.Outcomes...) != outcomes(Denied, Granted, Denied) || res.Current.Used != 1000 {
		t.Fatalf("requests on a restored cell of 900 of 1000: %+v", res)
	}
	// The same when a reporter charged the lost cell from zero before the
	// bridge's count arrived.
	early := cellAt("imported-lost-late", seq)
	(&syncer{t: t, o: o, reporter: "early"}).sync(Sync{Cell: early, Limit: 1000, Used: 200, Claim: 250})
	if err := o.Import(ctx, []Imported{{Cell: early, Own: 900, ExpireAt: exp}}); err != nil {
		t.Fatal(err)
	}
	res = (&syncer{t: t, o: o, reporter: "new"}).sync(Sync{Cell: early, Limit: 1000, Requests: reqs(101, 100)})
	if outcomes(res.Outcomes...) != outcomes(Denied, Granted) || res.Current.Charged != 1000 {
		t.Fatalf("requests on a cell restored after a reporter charged it anew: %+v", res)
	}
}

// exerciseLocal checks local counts (Sync.Local, Imported.Locals) against
// o: each LocalID's count is kept at its maximum, what a raise adds counts
// once whichever path (a sync, stale or not, or an import) tells it, and it
// stays after its reporter is forgotten. short is an origin on the same
// store whose ForgetAfter passes quickly.
func exerciseLocal(t *testing.T, o, short originUnderTest) {
	read := func(t *testing.T, o lookingOrigin, c window.Cell) Totals {
		t.Helper()
		cur, _, err := o.Read(testCtx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		return cur
	}
	imp := func(t *testing.T, o Origin, ims ...Imported) {
		t.Helper()
		if err := o.Import(testCtx(t), ims); err != nil {
			t.Fatal(err)
		}
	}
	locals := func(c window.Cell, id string, n int64) Imported {
		return Imported{Cell: c, Locals: []LocalCount{{ID: id, Count: n}}, ExpireAt: farFuture()}
	}

	t.Run("a sync's local count is counted once", func(t *testing.T) {
		c := cellAt("local-once", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		// Used and Claim leave the local count out: 100 + 50.
		for i, step := range []struct{ local, want int64 }{{50, 150}, {50, 150}, {70, 170}} {
			res := a.sync(Sync{Cell: c, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: step.local})
			if res.Current.Used != step.want || res.Current.Charged != step.want || res.Local != step.local ||
				res.Charged != 100 || res.Room != 1000-step.want {
				t.Fatalf("sync %d with local %d: %+v; want the count %d and Local %d", i, step.local, res, step.want, step.local)
			}
			if cur := read(t, o, c); cur.Count != step.want {
				t.Fatalf("read after local %d = %+v; want %d", step.local, cur, step.want)
			}
		}
		// The raise comes before the requests: at 180 (local 80), 820 of
		// 1000 are left, so 821 is denied and 820 granted.
		res := a.sync(Sync{Cell: c, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: 80, Requests: reqs(821, 820)})
		if outcomes(res.Outcomes...) != outcomes(Denied, Granted) || res.Current.Used != 1000 || res.Local != 80 {
			t.Fatalf("821 and 820 with the local count raised to 80: %+v", res)
		}
		// Without a LocalID nothing is raised and Local is 0.
		if res := a.sync(Sync{Cell: c, Limit: 1000, Used: 920, Claim: 920}); res.Local != 0 || res.Current.Used != 1000 {
			t.Fatalf("a sync without a LocalID: %+v", res)
		}
	})

	t.Run("a local count told by an import and by a sync counts once", func(t *testing.T) {
		a := &syncer{t: t, o: o, reporter: "a"}
		// The import first, then the sync.
		c := cellAt("local-import-first", 1000)
		imp(t, o, locals(c, "a.1", 30))
		if cur := read(t, o, c); cur.Count != 30 {
			t.Fatalf("read after the import of local 30 = %+v; want 30", cur)
		}
		res := a.sync(Sync{Cell: c, Limit: 1000, Used: 10, Claim: 10, LocalID: "a.1", Local: 30})
		if res.Current.Used != 40 || res.Local != 30 {
			t.Fatalf("sync of local 30 after its import: %+v; want 40 (10 + 30)", res)
		}
		// The sync first, then the import (twice: calls repeat).
		d := cellAt("local-sync-first", 1000)
		if res := a.sync(Sync{Cell: d, Limit: 1000, Used: 10, Claim: 10, LocalID: "a.1", Local: 30}); res.Current.Used != 40 {
			t.Fatalf("sync of local 30: %+v; want 40", res)
		}
		for range 2 {
			imp(t, o, locals(d, "a.1", 30))
			if cur := read(t, o, d); cur.Count != 40 {
				t.Fatalf("read after the import of local 30 after its sync = %+v; want 40", cur)
			}
		}
		// An import above what the sync told raises it; a lower one (late)
		// and the sync told again change nothing, and the sync learns the
		// origin's count.
		imp(t, o, locals(d, "a.1", 40))
		imp(t, o, locals(d, "a.1", 35))
		if cur := read(t, o, d); cur.Count != 50 {
			t.Fatalf("read after imports of local 40 and 35 = %+v; want 50 (10 + 40)", cur)
		}
		res = a.sync(Sync{Cell: d, Limit: 1000, Used: 10, Claim: 10, LocalID: "a.1", Local: 30})
		if res.Current.Used != 50 || res.Local != 40 {
			t.Fatalf("sync of local 30 after an import of 40: %+v; want 50 and Local 40", res)
		}
		// An import's raise takes from the lost admissions as a sync's does:
		// an own count of 150 over 100 charged leaves 50 lost; the import
		// of local 50 counts it as used (150) and takes the 50 out (none
		// left), so the count stays 150, not 200; a's sync telling it
		// again adds nothing.
		e := cellAt("local-import-lost", 1000)
		a.sync(Sync{Cell: e, Limit: 1000, Used: 100, Claim: 100})
		imp(t, o, Imported{Cell: e, Own: 150, ExpireAt: farFuture()})
		imp(t, o, locals(e, "a.1", 50))
		if cur := read(t, o, e); cur.Count != 150 {
			t.Fatalf("read after an import of local 50 under an own count of 150 = %+v; want 150", cur)
		}
		res = a.sync(Sync{Cell: e, Limit: 1000, Used: 110, Claim: 110, LocalID: "a.1", Local: 50})
		if res.Current.Used != 160 || res.Current.Charged != 160 || res.Local != 50 {
			t.Fatalf("a's sync of local 50 and 10 more used: %+v; want 160 (110 + 50, nothing lost left)", res)
		}
		// Two LocalIDs count apart, and one import carries both.
		imp(t, o, Imported{Cell: d, Locals: []LocalCount{{ID: "a.1", Count: 40}, {ID: "b.2", Count: 5}, {ID: "b.2", Count: 7}}, ExpireAt: farFuture()})
		if cur := read(t, o, d); cur.Count != 57 {
			t.Fatalf("read after b.2's local 7 = %+v; want 57", cur)
		}
		if n, ok := o.local(d, "b.2"); !ok || n != 7 {
			t.Fatalf("b.2's local count kept: %d, %v; want 7", n, ok)
		}
	})

	t.Run("a stale sync and a retired reporter's sync still raise the local count", func(t *testing.T) {
		c := cellAt("local-stale", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		a.sync(Sync{Cell: c, Limit: 1000, Used: 10, Claim: 10})
		a.sync(Sync{Cell: c, Limit: 1000, Used: 20, Claim: 20})
		a.seq = 0 // the next sync's Seq (1) is not above the last applied (2)
		res := a.sync(Sync{Cell: c, Limit: 1000, Used: 99, Claim: 99, LocalID: "a.1", Local: 15, Requests: reqs(1)})
		if !res.Stale || outcomes(res.Outcomes...) != outcomes(Pending) || res.Current.Used != 35 || res.Charged != 20 || res.Local != 15 {
			t.Fatalf("a stale sync with local 15: %+v; want stale, the count 35 (20 + 15)", res)
		}
		if cur := read(t, o, c); cur.Count != 35 {
			t.Fatalf("read after the stale sync = %+v; want 35", cur)
		}
		a.seq = 2
		if res := a.sync(Sync{Cell: c, Limit: 1000, Used: 20, Claim: 20, Retire: true}); res.Current.Used != 35 {
			t.Fatalf("a retires: %+v; want 35", res)
		}
		res = a.sync(Sync{Cell: c, Limit: 1000, Used: 20, Claim: 20, LocalID: "a.1", Local: 25})
		if res.Current.Used != 45 || res.Local != 25 {
			t.Fatalf("a retired reporter's sync with local 25: %+v; want the count 45", res)
		}
		if cur := read(t, o, c); cur.Count != 45 {
			t.Fatalf("read after the retired reporter's sync = %+v; want 45", cur)
		}

		// A stale raise takes from the lost admissions too, and writes
		// them: an own count of 150 over 100 charged leaves 50 lost; a's
		// stale raise of 50 moves them into its count (150, lost 0), so
		// a's next applied sync finds nothing lost to count on top.
		d := cellAt("local-stale-lost", 1000)
		a = &syncer{t: t, o: o, reporter: "a"}
		a.sync(Sync{Cell: d, Limit: 1000, Used: 100, Claim: 100})
		a.sync(Sync{Cell: d, Limit: 1000, Used: 100, Claim: 100})
		imp(t, o, Imported{Cell: d, Own: 150, ExpireAt: farFuture()})
		a.seq = 0
		if res := a.sync(Sync{Cell: d, Limit: 1000, Used: 100, Claim: 100, LocalID: "a.1", Local: 50}); !res.Stale || res.Current.Used != 150 {
			t.Fatalf("a stale sync with local 50 under an own count of 150: %+v; want 150", res)
		}
		a.seq = 2
		if res := a.sync(Sync{Cell: d, Limit: 1000, Used: 110, Claim: 110}); res.Stale || res.Current.Used != 160 {
			t.Fatalf("a's next sync, 10 more used: %+v; want 160 (100 + 50 + 10, nothing lost left)", res)
		}
	})

	t.Run("a local count stays after its reporter is forgotten", func(t *testing.T) {
		o := short
		c := cellAt("local-forgotten", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		if res := a.sync(Sync{Cell: c, Limit: 1000, Used: 10, Claim: 10, LiveFor: 1, LocalID: "a.1", Local: 30}); res.Current.Used != 40 {
			t.Fatalf("a's sync with local 30: %+v; want 40", res)
		}
		o.pass(o.forget + 50)
		if cur := read(t, o, c); cur.Count != 40 { // the read tidies: a is forgotten
			t.Fatalf("read once a is forgotten = %+v; want 40", cur)
		}
		if n := o.reporters(c); n != 0 {
			t.Fatalf("%d reporters kept, want none: a was unheard of for ForgetAfter", n)
		}
		imp(t, o, locals(c, "a.1", 30))
		if cur := read(t, o, c); cur.Count != 40 {
			t.Fatalf("read after an import of the forgotten reporter's local 30 = %+v; want 40", cur)
		}
		if n, ok := o.local(c, "a.1"); !ok || n != 30 {
			t.Fatalf("a.1's local count: %d, %v; want 30 kept", n, ok)
		}
		// a comes back under a new generation, telling the same local count.
		res := a.sync(Sync{Cell: c, Limit: 1000, Generation: 1, LocalID: "a.1", Local: 30})
		if res.Current.Used != 40 || res.Local != 30 {
			t.Fatalf("a's new generation with local 30: %+v; want 40", res)
		}
	})

	t.Run("an invalid local count is refused and changes nothing", func(t *testing.T) {
		c, other := cellAt("local-bad", 1000), cellAt("local-bad-other", 1000)
		a := &syncer{t: t, o: o, reporter: "a"}
		a.sync(Sync{Cell: c, Limit: 1000, Used: 5, Claim: 5})
		unchanged := func(what string) {
			t.Helper()
			if cur := read(t, o, c); cur != (Totals{Count: 5}) {
				t.Fatalf("%s: read %+v; want the count 5 untouched", what, cur)
			}
			if cur := read(t, o, other); cur != (Totals{}) {
				t.Fatalf("%s: the other cell reads %+v; want nothing", what, cur)
			}
			if n, ok := o.local(c, "ok"); ok {
				t.Fatalf("%s: the valid local count beside it was kept (%d)", what, n)
			}
		}
		bad := []LocalCount{{ID: ""}, {ID: "a b", Count: 1}, {ID: "x:y", Count: 1}, {ID: strings.Repeat("a", MaxLocalID+1), Count: 1},
			{ID: "é", Count: 1}, {ID: "a\x00", Count: 1}, {ID: "a}", Count: 1}, {ID: "ok", Count: -1}}
		for _, l := range bad {
			err := o.Import(testCtx(t), []Imported{
				{Cell: other, Foreign: 7, Own: 3, Locals: []LocalCount{{ID: "ok", Count: 1}}, ExpireAt: farFuture()},
				{Cell: c, Own: 100, Locals: []LocalCount{{ID: "ok", Count: 3}, l}, ExpireAt: farFuture()},
			})
			if !errors.Is(err, ErrInvalidLocal) {
				t.Fatalf("import of local %+v: %v; want ErrInvalidLocal", l, err)
			}
			unchanged(fmt.Sprintf("import of local %+v", l))
		}
		for _, s := range []Sync{
			{LocalID: "a b", Local: 3}, {LocalID: "x:y", Local: 3}, {LocalID: "ok", Local: -1}, {Local: 3},
		} {
			s.Cell, s.Seq, s.Limit, s.Used, s.Claim, s.ExpireAt = c, 100, 1000, 50, 50, farFuture()
			if _, err := o.Sync(testCtx(t), "a", s); !errors.Is(err, ErrInvalidLocal) {
				t.Fatalf("sync with LocalID %q, Local %d: %v; want ErrInvalidLocal", s.LocalID, s.Local, err)
			}
			good := Sync{Cell: other, Seq: 1, Limit: 1000, Used: 9, Claim: 9, ExpireAt: farFuture()}
			if _, err := o.Settle(testCtx(t), "a", []Sync{good, s}); !errors.Is(err, ErrInvalidLocal) {
				t.Fatalf("settle with LocalID %q, Local %d: %v; want ErrInvalidLocal", s.LocalID, s.Local, err)
			}
			unchanged(fmt.Sprintf("sync with LocalID %q, Local %d", s.LocalID, s.Local))
		}
		// The longest ID of every allowed byte is taken.
		long := strings.Repeat("Az09._-", MaxLocalID/7) + strings.Repeat("z", MaxLocalID%7)
		imp(t, o, locals(c, long, 4))
		if cur := read(t, o, c); cur.Count != 9 {
			t.Fatalf("read after an import of local 4 under a %d-byte ID = %+v; want 9", len(long), cur)
		}
	})

	t.Run("an import of local counts alone creates the cell, which expires", func(t *testing.T) {
		c, brief := cellAt("local-only", 1000), cellAt("local-only-brief", 1000)
		exp, briefExp := farFuture(), o.now()+300
		imp(t, o, Imported{Cell: c, Locals: []LocalCount{{ID: "b.2", Count: 12}}, ExpireAt: exp},
			Imported{Cell: brief, Locals: []LocalCount{{ID: "b.2", Count: 8}}, ExpireAt: briefExp})
		if cur := read(t, o, c); cur != (Totals{Count: 12}) {
			t.Fatalf("read of a cell only local counts created = %+v; want the count 12", cur)
		}
		for _, x := range []struct {
			c    window.Cell
			want int64
		}{{c, exp}, {brief, briefExp}} {
			if at := o.expireAt(x.c); at != x.want {
				t.Fatalf("%s expires at %d, want %d (the import's ExpireAt)", x.c.Identifier, at, x.want)
			}
		}
		// A later sync counts on top, and the cell keeps what the sync sets.
		a := &syncer{t: t, o: o, reporter: "a"}
		if res := a.sync(Sync{Cell: c, Limit: 1000, Used: 3, Claim: 3, LocalID: "b.2", Local: 12}); res.Current.Used != 15 || res.Local != 12 {
			t.Fatalf("a sync into the imported cell: %+v; want 15", res)
		}
		o.pass(400)
		if cur := read(t, o, brief); cur != (Totals{}) {
			t.Fatalf("read past the import's ExpireAt = %+v; want nothing", cur)
		}
	})
}

// redisForget is the ForgetAfter of the Redis origins under test: short,
// since their clock passes for real, and long enough that no other subtest
// sees a reporter forgotten on a loaded machine.
const redisForget = 3 * time.Second

func TestRedisOrigin(t *testing.T) {
	url := redistest.SharedURL(t)
	r := newRedisForget(t, url, redisForget)
	exerciseSync(t, redisUnderTest(t, r))
	exerciseImport(t, r)
	exerciseLocal(t, redisUnderTest(t, r), redisUnderTest(t, newRedisForget(t, url, redisForgetShort)))
	exerciseValueViews(t, r)
}

// redisForgetShort is the ForgetAfter of a Redis origin a test uses only to
// see a reporter forgotten, without waiting redisForget.
const redisForgetShort = 300 * time.Millisecond

// redisUnderTest is r with real time passing and its reporters and local
// counts read from the cell's value.
func redisUnderTest(t *testing.T, r *Redis) originUnderTest {
	return originUnderTest{lookingOrigin: r, pass: sleepMs, forget: r.forgetMs,
		reporters: func(c window.Cell) int {
			v, _, err := r.Cell(testCtx(t), c)
			if err != nil {
				t.Fatal(err)
			}
			return len(v.Reporters)
		},
		local: func(c window.Cell, id string) (int64, bool) {
			v, _, err := r.Cell(testCtx(t), c)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := v.Locals[id]
			return n, ok
		},
		expireAt: func(c window.Cell) int64 {
			at, err := r.Client().PExpireTime(testCtx(t), r.Key(c)).Result()
			if err != nil {
				t.Fatal(err)
			}
			return at.Milliseconds()
		},
		now: func() int64 { return time.Now().UnixMilli() },
	}
}

// sleepMs lets Redis's own clock pass.
func sleepMs(ms int64) { time.Sleep(time.Duration(ms) * time.Millisecond) }
