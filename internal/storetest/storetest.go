// Package storetest holds what every bridge.Store must do, as tests any
// implementation runs (Contract), and the helpers those tests use.
package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Now is the instant the store tests load and expire against.
const Now = int64(1_700_000_000_000)

// Cell returns a cell of the usual workspace and namespace.
func Cell(id string, seq int64) window.Cell {
	return window.Cell{Workspace: "ws", Namespace: "ns", Identifier: id, Duration: 60_000, Sequence: seq}
}

// Component returns a component of c.
func Component(c window.Cell, region string, count, expireAt int64) global.Component {
	return global.Component{Cell: c, Region: region, Count: count, ExpireAt: expireAt}
}

func compareCells(a, b window.Cell) int {
	return cmp.Or(
		cmp.Compare(a.Workspace, b.Workspace),
		cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Identifier, b.Identifier),
		cmp.Compare(a.Duration, b.Duration),
		cmp.Compare(a.Sequence, b.Sequence),
		cmp.Compare(a.Epoch, b.Epoch),
	)
}

func sortedComponents(cs []global.Component) []global.Component {
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b global.Component) int {
		return cmp.Or(compareCells(a.Cell, b.Cell), cmp.Compare(a.Region, b.Region))
	})
	return cs
}

// UpsertComponents writes cs to s, failing the test on error.
func UpsertComponents(t *testing.T, s bridge.Store, cs ...global.Component) {
	t.Helper()
	if err := s.UpsertComponents(t.Context(), cs); err != nil {
		t.Fatalf("UpsertComponents: %v", err)
	}
}

// Components returns the components live at now: those a full
// s.LoadChanged(ctx, now, 0) returns.
func Components(ctx context.Context, s bridge.Store, now int64) ([]global.Component, error) {
	ch, err := s.LoadChanged(ctx, now, 0)
	return ch.Components, err
}

// Load returns the components live at Now.
func Load(t *testing.T, s bridge.Store) []global.Component {
	t.Helper()
	got, err := Components(t.Context(), s, Now)
	if err != nil {
		t.Fatalf("Components: %v", err)
	}
	return sortedComponents(got)
}

// LoadChanged returns what s.LoadChanged(Now, since) returns, failing the
// test on error.
func LoadChanged(t *testing.T, s bridge.Store, since bridge.Mark) bridge.Changes {
	t.Helper()
	ch, err := s.LoadChanged(t.Context(), Now, since)
	if err != nil {
		t.Fatalf("LoadChanged(%d): %v", since, err)
	}
	return ch
}

// WantSame fails unless got and want hold the same rows, in any order.
func WantSame[T comparable](t *testing.T, got []T, want ...T) {
	t.Helper()
	if !sameRows(got, want) {
		t.Fatalf("got %d rows: %s\nwant %d: %s", len(got), brief(got), len(want), brief(want))
	}
}

// WantIncludes fails unless got holds every row of want.
func WantIncludes[T comparable](t *testing.T, got []T, want ...T) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Fatalf("%+v missing from %d rows: %s", w, len(got), brief(got))
		}
	}
}

func sameRows[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			return false
		}
	}
	return true
}

// WantComponents fails unless the components live at at are exactly want.
func WantComponents(t *testing.T, s bridge.Store, at int64, want ...global.Component) {
	t.Helper()
	got, err := Components(t.Context(), s, at)
	if err != nil {
		t.Fatalf("Components: %v", err)
	}
	got, want = sortedComponents(got), sortedComponents(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Components(%d):\n got %d: %s\nwant %d: %s", at, len(got), brief(got), len(want), brief(want))
	}
}

// brief formats at most a few elements of xs.
func brief[T any](xs []T) string {
	if len(xs) > 4 {
		return fmt.Sprintf("%+v ...", xs[:4])
	}
	return fmt.Sprintf("%+v", xs)
}

// storeContract is what every Store guarantees; each test gets a fresh,
// empty store.
var storeContract = []struct {
	name string
	run  func(t *testing.T, s bridge.Store)
}{
	{"OverridesKeepTheLastWriterInAnyOrder", func(t *testing.T, s bridge.Store) {
		ctx := t.Context()
		k := policy.Key{Workspace: "ws", Namespace: "api", Pattern: "user_*"}
		v := func(at int64, origin string, limit int64, deleted bool) policy.Entry {
			e := policy.Entry{Key: k, Version: policy.Version{At: at, Origin: origin}, Deleted: deleted}
			if !deleted {
				e.Override = policy.Override{Limit: limit, Duration: 60_000}
			}
			return e
		}
		other := policy.Entry{Key: policy.Key{Workspace: "ws", Namespace: "api", Pattern: "\x00\xffbin"},
			Override: policy.Override{Limit: 1, Duration: 1000, Shadow: true}, Version: policy.Version{At: 5, Origin: "eu"}}
		steps := []struct {
			in   []policy.Entry
			want policy.Entry
		}{
			{[]policy.Entry{v(10, "us", 5, false)}, v(10, "us", 5, false)},
			{[]policy.Entry{v(9, "zz", 7, false)}, v(10, "us", 5, false)},  // older: kept out
			{[]policy.Entry{v(10, "eu", 7, false)}, v(10, "us", 5, false)}, // same time, smaller origin
			{[]policy.Entry{v(10, "us", 6, false)}, v(10, "us", 6, false)}, // same version, larger content
			{[]policy.Entry{v(11, "eu", 0, true)}, v(11, "eu", 0, true)},   // a delete wins and stays
			{[]policy.Entry{v(10, "zz", 9, false)}, v(11, "eu", 0, true)},  // an older set cannot come back
			{[]policy.Entry{v(12, "ap", 3, false), v(13, "ap", 4, false)}, v(13, "ap", 4, false)},
			{[]policy.Entry{v(13, "ap", 4, false), other}, v(13, "ap", 4, false)}, // idempotent
		}
		for i, st := range steps {
			if err := s.UpsertOverrides(ctx, st.in); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			got, err := s.LoadOverrides(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var found bool
			for _, e := range got {
				if e.Key == k {
					found = true
					if e != st.want {
						t.Fatalf("step %d: kept %+v, want %+v", i, e, st.want)
					}
				}
			}
			if !found {
				t.Fatalf("step %d: nothing kept", i)
			}
		}
		got, _ := s.LoadOverrides(ctx)
		if len(got) != 2 || !slices.Contains(got, other) {
			t.Fatalf("load: %+v, want the two keys, bytes kept", got)
		}
		bad := v(20, "us", 1, false)
		bad.Duration = 10 // below the minimum
		if err := s.UpsertOverrides(ctx, []policy.Entry{v(19, "us", 8, false), bad}); err == nil {
			t.Fatal("an invalid entry was accepted")
		}
		if got, _ := s.LoadOverrides(ctx); !slices.Contains(got, v(13, "ap", 4, false)) {
			t.Fatalf("a refused call wrote: %+v", got)
		}
	}},
	{"MarksKeepTheLatestEpochAndExpire", func(t *testing.T, s bridge.Store) {
		ctx := t.Context()
		mk := func(id string, d, epoch int64) policy.Mark {
			return policy.Mark{Workspace: "ws", Namespace: "api", Identifier: id, Duration: d, Epoch: epoch}
		}
		sorted := func(ms []policy.Mark) []policy.Mark {
			ms = slices.Clone(ms)
			slices.SortFunc(ms, func(a, b policy.Mark) int {
				return cmp.Or(cmp.Compare(a.Identifier, b.Identifier), cmp.Compare(a.Duration, b.Duration))
			})
			return ms
		}
		for i, step := range []struct{ in, want []policy.Mark }{
			{[]policy.Mark{mk("u", 0, Now)}, []policy.Mark{mk("u", 0, Now)}},
			{[]policy.Mark{mk("u", 0, Now-5)}, []policy.Mark{mk("u", 0, Now)}}, // older: kept out
			{[]policy.Mark{mk("u", 0, Now+7), mk("u", 0, Now+3), mk("u", 60_000, Now+1)},
				[]policy.Mark{mk("u", 0, Now+7), mk("u", 60_000, Now+1)}},
			{[]policy.Mark{mk("\x00\xff*", 1000, Now)}, []policy.Mark{mk("\x00\xff*", 1000, Now), mk("u", 0, Now+7), mk("u", 60_000, Now+1)}},
			{[]policy.Mark{mk("u", 0, Now+7)}, []policy.Mark{mk("\x00\xff*", 1000, Now), mk("u", 0, Now+7), mk("u", 60_000, Now+1)}}, // idempotent
		} {
			if err := s.UpsertMarks(ctx, step.in); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			got, err := s.LoadMarks(ctx, Now)
			if err != nil {
				t.Fatal(err)
			}
			if got := sorted(got); !slices.Equal(got, step.want) {
				t.Fatalf("step %d: %+v, want %+v", i, got, step.want)
			}
		}
		if err := s.UpsertMarks(ctx, []policy.Mark{mk("v", 0, Now), mk("", 0, Now)}); err == nil {
			t.Fatal("an invalid mark was accepted")
		}
		// A mark of one minute expires at the end of the window after its
		// epoch's, plus the grace; one of every duration lasts as the
		// longest duration's.
		minute := mk("u", 60_000, Now+1)
		end := minute.ExpireAt(global.MarkGrace.Milliseconds())
		for _, tc := range []struct {
			now  int64
			want []policy.Mark
		}{
			{end - 1, []policy.Mark{mk("u", 0, Now+7), mk("u", 60_000, Now+1)}}, // the mark of 1s has gone
			{end, []policy.Mark{mk("u", 0, Now+7)}},
		} {
			got, err := s.LoadMarks(ctx, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if got := sorted(got); !slices.Equal(got, tc.want) {
				t.Fatalf("at %d: %+v, want %+v", tc.now, got, tc.want)
			}
		}
		// The cleanup deletes the marks that expired, and only those.
		if n, err := s.DeleteExpired(ctx, end, 1000); err != nil || n != 2 {
			t.Fatalf("delete expired: %d rows, %v; want the two expired marks", n, err)
		}
		if got, _ := s.LoadMarks(ctx, Now); len(got) != 1 || got[0] != mk("u", 0, Now+7) {
			t.Fatalf("after the cleanup: %+v", got)
		}
	}},
	{"AResetsEpochIsACellOfItsOwn", func(t *testing.T, s bridge.Store) {
		ctx := t.Context()
		c := Cell("user-1", 7)
		reset := c
		reset.Epoch = 7*60_000 + 5
		if err := s.UpsertComponents(ctx, []global.Component{Component(c, "us", 10, Now+1), Component(reset, "us", 2, Now+1)}); err != nil {
			t.Fatal(err)
		}
		if err := s.UpsertComponents(ctx, []global.Component{Component(reset, "us", 3, Now+1)}); err != nil {
			t.Fatal(err)
		}
		cs, err := Components(ctx, s, Now)
		if err != nil {
			t.Fatal(err)
		}
		if want := []global.Component{Component(c, "us", 10, Now+1), Component(reset, "us", 3, Now+1)}; !slices.Equal(sortedComponents(cs), want) {
			t.Fatalf("components %+v, want %+v: the reset's cell apart, merged by max", cs, want)
		}
		ch, err := s.LoadChanged(ctx, Now, 0)
		if err != nil || len(ch.Components) != 2 {
			t.Fatalf("load changed: %+v, %v", ch, err)
		}
	}},
	{"UpsertKeepsTheMaxCountAndExpiry", func(t *testing.T, s bridge.Store) {
		c := Cell("user-1", 7)
		steps := []struct {
			count, expireAt         int64
			wantCount, wantExpireAt int64
		}{
			{5, Now + 1000, 5, Now + 1000},
			{3, Now + 2000, 5, Now + 2000}, // a lower count keeps the count
			{7, Now + 500, 7, Now + 2000},  // an earlier expiry keeps the expiry
			{1, Now + 1, 7, Now + 2000},    // lower both: nothing changes
			{7, Now + 2000, 7, Now + 2000}, // equal: nothing changes
			{8, Now + 3000, 8, Now + 3000},
		}
		for i, st := range steps {
			UpsertComponents(t, s, Component(c, "eu", st.count, st.expireAt))
			if got := Load(t, s); !slices.Equal(got, []global.Component{Component(c, "eu", st.wantCount, st.wantExpireAt)}) {
				t.Fatalf("step %d: after count %d expiry %d, got %+v, want count %d expiry %d",
					i, st.count, st.expireAt, got, st.wantCount, st.wantExpireAt)
			}
		}
	}},
	{"DuplicatesInOneCallMergeByMax", func(t *testing.T, s bridge.Store) {
		c := Cell("user-1", 7)
		UpsertComponents(t, s,
			Component(c, "eu", 3, Now+10),
			Component(c, "eu", 9, Now+5),
			Component(c, "us", 1, Now+5),
			Component(c, "eu", 4, Now+20),
		)
		WantComponents(t, s, Now, Component(c, "eu", 9, Now+20), Component(c, "us", 1, Now+5))
	}},
	{"RegionsOfOneCellAreKeptApart", func(t *testing.T, s bridge.Store) {
		c := Cell("user-1", 7)
		cs := []global.Component{
			Component(c, "eu-west", 1, Now+100),
			Component(c, "us_east", 2, Now+200),
			Component(c, "ap", 3, Now+300),
			Component(c, "AP", 4, Now+400), // regions are case-sensitive
		}
		UpsertComponents(t, s, cs...)
		UpsertComponents(t, s, Component(c, "us_east", 20, Now+200))
		cs[1].Count = 20
		WantComponents(t, s, Now, cs...)
	}},
	{"KeysDifferingInAnyColumnAreKeptApart", func(t *testing.T, s bridge.Store) {
		base := Cell("id", 7)
		vary := []func(*window.Cell){
			func(*window.Cell) {},
			func(c *window.Cell) { c.Workspace = "WS" },
			func(c *window.Cell) { c.Workspace = "ws-2" },
			func(c *window.Cell) { c.Namespace = "NS" },
			func(c *window.Cell) { c.Namespace = "ns_2" },
			func(c *window.Cell) { c.Identifier = "ID" },
			func(c *window.Cell) { c.Identifier = "id " }, // no trailing-space padding
			func(c *window.Cell) { c.Identifier = "id\x00" },
			func(c *window.Cell) { c.Duration = 1000 },
			func(c *window.Cell) { c.Duration = 31_622_400_000 },
			func(c *window.Cell) { c.Sequence = 8 },
			func(c *window.Cell) { c.Sequence = 0 },
		}
		var cs []global.Component
		for i, f := range vary {
			c := base
			f(&c)
			cs = append(cs, Component(c, "eu", int64(i+1), Now+int64(i+1)))
		}
		UpsertComponents(t, s, cs...)
		WantComponents(t, s, Now, cs...)
	}},
	{"IdentifiersRoundTripByteForByte", func(t *testing.T, s bridge.Store) {
		ids := []string{
			"\x00",
			"\xff",
			"\x00\xff\x00",
			"a\x00b",
			strings.Repeat("\xff", 512),
			strings.Repeat("x", 511) + "\x00",
			"{user}",
			"{",
			"}",
			"'; DROP TABLE sluice_components; --",
			"\\N",
			"é",
			"\xc3", // half of é: not valid UTF-8
			"\xf0\x9f\x98\x80",
			"trailing ",
			"trailing",
			"Trailing",
		}
		var cs []global.Component
		for i, id := range ids {
			cs = append(cs, Component(Cell(id, 1), "eu", int64(i+1), Now+1000))
		}
		UpsertComponents(t, s, cs...)
		WantComponents(t, s, Now, cs...)
		// Upserting again finds the same rows rather than adding some.
		for i := range cs {
			cs[i].Count += 100
		}
		UpsertComponents(t, s, cs...)
		WantComponents(t, s, Now, cs...)
	}},
	{"LoadsSkipExpiredRows", func(t *testing.T, s bridge.Store) {
		past := Component(Cell("past", 1), "eu", 1, Now-1)
		edge := Component(Cell("edge", 1), "eu", 2, Now) // ExpireAt == Now: expired
		live := Component(Cell("live", 1), "eu", 3, Now+1)
		UpsertComponents(t, s, past, edge, live)
		WantComponents(t, s, Now, live)
		WantComponents(t, s, Now-2, past, edge, live)
	}},
	{"DeleteExpiredRemovesOnlyExpiredRows", func(t *testing.T, s bridge.Store) {
		var expiredC, liveC []global.Component
		for i := range 23 {
			expiredC = append(expiredC, Component(Cell(fmt.Sprint("old-", i), 1), "eu", 1, Now-int64(i))) // i == 0: exactly Now
		}
		for i := range 5 {
			liveC = append(liveC, Component(Cell(fmt.Sprint("new-", i), 1), "eu", 1, Now+1+int64(i)))
		}
		UpsertComponents(t, s, append(slices.Clone(expiredC), liveC...)...)

		n, err := s.DeleteExpired(t.Context(), Now, 4)
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		if want := int64(len(expiredC)); n != want {
			t.Fatalf("DeleteExpired deleted %d rows, want %d", n, want)
		}
		// Loading as of long ago would show any expired row still there.
		WantComponents(t, s, 0, liveC...)

		n, err = s.DeleteExpired(t.Context(), Now, 4)
		if err != nil || n != 0 {
			t.Fatalf("DeleteExpired again = %d, %v; want 0, nil", n, err)
		}
	}},
	{"ChunkedUpsertOf1200ComponentsWorks", func(t *testing.T, s bridge.Store) {
		cs := make([]global.Component, 1200)
		for i := range cs {
			cs[i] = Component(Cell(fmt.Sprintf("id-%04d", i), int64(i%3)), []string{"eu", "us"}[i%2], int64(i), Now+int64(i)+1)
		}
		rand.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		UpsertComponents(t, s, cs...)
		WantComponents(t, s, Now, cs...)
		for i := range cs {
			if i%2 == 0 {
				cs[i].Count += 1000
			}
		}
		UpsertComponents(t, s, cs...)
		WantComponents(t, s, Now, cs...)
	}},
	{"ConcurrentOverlappingUpsertsNeverFail", func(t *testing.T, s bridge.Store) {
		const rounds, ids = 20, 300
		want := make(map[string]global.Component)
		for round := range rounds {
			sets := make([][]global.Component, 2)
			for g := range sets {
				// Goroutine 0 writes ids [0, 200), goroutine 1 [100, 300),
				// in an order of their own, each new rows and old ones.
				for i := g * ids / 3; i < g*ids/3+2*ids/3; i++ {
					c := Component(Cell(fmt.Sprint("id-", i), int64(round/5)), "eu", int64(round*10+g+i%7), Now+int64(round)+1)
					sets[g] = append(sets[g], c)
					k := fmt.Sprintf("%q/%d", c.Cell.Identifier, c.Cell.Sequence)
					old := want[k]
					want[k] = Component(c.Cell, "eu", max(old.Count, c.Count), max(old.ExpireAt, c.ExpireAt))
				}
				rand.Shuffle(len(sets[g]), func(i, j int) { sets[g][i], sets[g][j] = sets[g][j], sets[g][i] })
			}
			var wg sync.WaitGroup
			errs := make([]error, len(sets))
			start := make(chan struct{})
			for g, set := range sets {
				wg.Go(func() {
					<-start
					errs[g] = s.UpsertComponents(t.Context(), set)
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		WantComponents(t, s, Now, slices.Collect(maps.Values(want))...)
	}},
	{"InvalidRowsAreRejectedWholesale", func(t *testing.T, s bridge.Store) {
		ok := Component(Cell("ok", 1), "eu", 1, Now+1)
		tooLong := strings.Repeat("w", 65)
		invalid := []struct {
			name string
			edit func(*global.Component)
		}{
			{"empty workspace", func(c *global.Component) { c.Cell.Workspace = "" }},
			{"long workspace", func(c *global.Component) { c.Cell.Workspace = tooLong }},
			{"workspace with a dot", func(c *global.Component) { c.Cell.Workspace = "a.b" }},
			{"non-ASCII namespace", func(c *global.Component) { c.Cell.Namespace = "é" }},
			{"empty identifier", func(c *global.Component) { c.Cell.Identifier = "" }},
			{"identifier of 513 bytes", func(c *global.Component) { c.Cell.Identifier = strings.Repeat("i", 513) }},
			{"zero duration", func(c *global.Component) { c.Cell.Duration = 0 }},
			{"empty region", func(c *global.Component) { c.Region = "" }},
			{"region with a space", func(c *global.Component) { c.Region = "eu west" }},
			{"negative count", func(c *global.Component) { c.Count = -1 }},
		}
		for _, tc := range invalid {
			bad := ok
			tc.edit(&bad)
			if err := s.UpsertComponents(t.Context(), []global.Component{ok, bad}); err == nil {
				t.Errorf("%s: UpsertComponents succeeded", tc.name)
			}
		}
		WantComponents(t, s, 0)
	}},
	{"LoadChangedFromZeroReadsEveryLiveRow", func(t *testing.T, s bridge.Store) {
		a, b := Cell("a", 1), Cell("b", 1)
		UpsertComponents(t, s, Component(a, "us", 3, Now+1000), Component(b, "eu", 4, Now-1))
		ch := LoadChanged(t, s, 0)
		if !ch.Full || ch.Next == 0 {
			t.Fatalf("Full %v, Next %d: want a full read and a mark", ch.Full, ch.Next)
		}
		WantSame(t, ch.Components, Component(a, "us", 3, Now+1000))
	}},
	{"LoadChangedReturnsEveryRowRaisedOrWrittenSince", func(t *testing.T, s bridge.Store) {
		a, b, c := Cell("a", 1), Cell("b", 1), Cell("c", 1)
		UpsertComponents(t, s, Component(a, "us", 3, Now+1000), Component(b, "us", 5, Now+1000))
		mark := LoadChanged(t, s, 0).Next
		UpsertComponents(t, s,
			Component(a, "us", 4, Now+1000), // raised
			Component(b, "us", 1, Now+1000), // lower: changes nothing
			Component(c, "eu", 7, Now+1000), // new
			Component(c, "us", 7, Now-1))    // new but expired
		ch := LoadChanged(t, s, mark)
		if ch.Full {
			t.Fatal("an incremental read was full")
		}
		// The store may return a row again (b here) but must not leave out a
		// change, and returns rows as they are now.
		WantIncludes(t, ch.Components, Component(a, "us", 4, Now+1000), Component(c, "eu", 7, Now+1000))
		for _, got := range ch.Components {
			if got.ExpireAt <= Now {
				t.Fatalf("expired row %+v returned", got)
			}
			if got.Cell == b && got.Count != 5 {
				t.Fatalf("b returned with count %d, want the stored 5", got.Count)
			}
		}
		if next := LoadChanged(t, s, ch.Next).Next; next < ch.Next {
			t.Fatalf("mark went back from %d to %d", ch.Next, next)
		}
	}},
	{"LoadChangedFromAMarkItCannotServeReadsEverything", func(t *testing.T, s bridge.Store) {
		a := Cell("a", 1)
		UpsertComponents(t, s, Component(a, "us", 3, Now+1000))
		// A mark far ahead of anything the store has seen: its clock went
		// back, or the mark is another store's.
		ch := LoadChanged(t, s, bridge.Mark(1)<<60)
		if !ch.Full {
			t.Fatal("a read from a mark ahead of the store was not full")
		}
		WantSame(t, ch.Components, Component(a, "us", 3, Now+1000))
	}},
	{"LoadChangedCarriesPoliciesAndTombstonesEnd", func(t *testing.T, s bridge.Store) {
		ctx := t.Context()
		cutoff := policy.TombstoneCutoff(Now)
		entry := func(pattern string, at int64, deleted bool) policy.Entry {
			e := policy.Entry{Key: policy.Key{Workspace: "ws", Namespace: "api", Pattern: pattern},
				Version: policy.Version{At: at, Origin: "us"}, Deleted: deleted}
			if !deleted {
				e.Override = policy.Override{Limit: 5, Duration: 60_000}
			}
			return e
		}
		live, young, old := entry("live", cutoff-1, false), entry("young", cutoff, true), entry("old", cutoff-1, true)
		if err := s.UpsertOverrides(ctx, []policy.Entry{live, young, old}); err != nil {
			t.Fatal(err)
		}
		mark := policy.Mark{Workspace: "ws", Namespace: "api", Identifier: "u", Duration: 60_000, Epoch: Now}
		gone := policy.Mark{Workspace: "ws", Namespace: "api", Identifier: "v", Duration: 1000, Epoch: Now - 3_600_000}
		if err := s.UpsertMarks(ctx, []policy.Mark{mark, gone}); err != nil {
			t.Fatal(err)
		}
		// A full read: every override but the tombstone past its
		// retention (a read must not bring back what the cleanup prunes),
		// every live mark.
		ch := LoadChanged(t, s, 0)
		WantSame(t, ch.Overrides, live, young)
		WantSame(t, ch.Marks, mark)
		// What changes next comes in the next read, which is not full.
		newer := entry("live", Now, false)
		newer.Limit = 9
		raised := mark
		raised.Epoch++
		if err := s.UpsertOverrides(ctx, []policy.Entry{newer}); err != nil {
			t.Fatal(err)
		}
		if err := s.UpsertMarks(ctx, []policy.Mark{raised}); err != nil {
			t.Fatal(err)
		}
		next := LoadChanged(t, s, ch.Next)
		if next.Full {
			t.Fatal("an incremental read was full")
		}
		WantIncludes(t, next.Overrides, newer)
		WantIncludes(t, next.Marks, raised)
		// The cleanup deletes the old tombstone (and the expired mark),
		// and only those.
		if n, err := s.DeleteExpired(ctx, Now, 1000); err != nil || n != 2 {
			t.Fatalf("delete expired: %d rows, %v; want the old tombstone and the expired mark", n, err)
		}
		got, err := s.LoadOverrides(ctx)
		if err != nil {
			t.Fatal(err)
		}
		WantSame(t, got, newer, young)
	}},
	{"EmptyWritesSucceed", func(t *testing.T, s bridge.Store) {
		UpsertComponents(t, s)
		WantComponents(t, s, 0)
	}},
	{"DeleteExpiredRejectsANonPositiveBatch", func(t *testing.T, s bridge.Store) {
		UpsertComponents(t, s, Component(Cell("old", 1), "eu", 1, Now-1))
		for _, batch := range []int{0, -1} {
			if _, err := s.DeleteExpired(t.Context(), Now, batch); err == nil {
				t.Errorf("DeleteExpired(batch %d) succeeded", batch)
			}
		}
		WantComponents(t, s, 0, Component(Cell("old", 1), "eu", 1, Now-1))
	}},
	{"CallsAfterCloseFail", func(t *testing.T, s bridge.Store) {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		ctx := t.Context()
		if err := s.UpsertComponents(ctx, []global.Component{Component(Cell("a", 1), "eu", 1, Now+1)}); err == nil {
			t.Error("UpsertComponents after Close succeeded")
		}
		if _, err := Components(ctx, s, Now); err == nil {
			t.Error("LoadChanged after Close succeeded")
		}
		if _, err := s.DeleteExpired(ctx, Now, 10); err == nil {
			t.Error("DeleteExpired after Close succeeded")
		}
	}},
}

// Contract runs every test of the Store contract, each on a fresh, empty
// store that open returns.
func Contract(t *testing.T, open func(t *testing.T) bridge.Store) {
	for _, tc := range storeContract {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
}
