package region

import (
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// exerciseValueViews holds a cold grant and a lease-carrying grant to one
// count: the cell's value as the scripts wrote it (Cell), Read, the
// bridge's sweep (ScanCounts) and the sync's own reply say the same, while
// the lease is live and once it ended.
func exerciseValueViews(t *testing.T, r *Redis) {
	ctx := testCtx(t)
	run := time.Now().UnixNano()
	views := func(c window.Cell, want int64) {
		t.Helper()
		cur, _, err := r.Read(ctx, c)
		if err != nil || cur.Count != want {
			t.Fatalf("Read = %+v, %v; want %d", cur, err, want)
		}
		swept, _ := scanAll(t, r)
		if got := swept[c].Count; got != want {
			t.Fatalf("the sweep counts %d, want %d", got, want)
		}
	}

	// A cold grant: the first check of a cell nobody holds.
	cold := cellAt("cold-"+time.Unix(0, run).Format("150405.000000000"), 7)
	a := &syncer{t: t, o: r, reporter: "a"}
	res := a.sync(Sync{Cell: cold, Limit: 1000, LiveFor: 200, Requests: reqs(1)})
	if res.Outcomes[0] != Granted || res.Lease != 0 || res.Current.Used != 1 || res.Current.Charged != 1 {
		t.Fatalf("cold grant: %+v", res)
	}
	if typ, err := r.Client().Type(ctx, r.Key(cold)).Result(); err != nil || typ != "string" {
		t.Fatalf("the cold cell's key is a %q (%v), want one string", typ, err)
	}
	v, ok, err := r.Cell(ctx, cold)
	if err != nil || !ok {
		t.Fatalf("cold cell's value: %v, %v", ok, err)
	}
	rep := v.Reporters["a"]
	if v.Charged != 1 || v.Used != 1 || v.Lost != 0 || v.Own != 0 || len(v.Reporters) != 1 ||
		rep.Seq != 1 || rep.Used != 1 || rep.Claimed != 1 || len(v.Locals) != 0 {
		t.Fatalf("cold cell's value: %+v", v)
	}
	views(cold, 1)

	// A grant that carries a lease: charged 105, used 5.
	leased := cellAt("leased-"+time.Unix(0, run).Format("150405.000000000"), 7)
	res = a.sync(Sync{Cell: leased, Limit: 1000, Want: 100, LiveFor: 200, Requests: reqs(5)})
	if res.Lease != 100 || res.Current.Used != 5 || res.Current.Charged != 105 {
		t.Fatalf("lease grant: %+v", res)
	}
	v, _, err = r.Cell(ctx, leased)
	rep = v.Reporters["a"]
	if err != nil || v.Charged != 105 || v.Used != 5 || rep.Used != 5 || rep.Claimed != 105 || rep.Until <= 0 || v.TidyAt != rep.Until {
		t.Fatalf("leased cell's value: %+v, %v", v, err)
	}
	views(leased, 5) // the lease is live: only what was used counts
	time.Sleep(300 * time.Millisecond)
	views(leased, 105) // it ended unreported: its unused part counts as used
	if v, _, err = r.Cell(ctx, leased); err != nil || v.Used != 105 || v.Charged != 105 || v.Reporters["a"].Used != 105 {
		t.Fatalf("leased cell's value once tidied: %+v, %v", v, err)
	}
	b := &syncer{t: t, o: r, reporter: "b"}
	if res := b.sync(Sync{Cell: leased, Limit: 1000, Requests: reqs(1)}); res.Current.Used != 106 || res.Current.Charged != 106 {
		t.Fatalf("another reporter's sync after the lease ended: %+v; want 106, as every view", res)
	}
}

// ParseRedisCell reads what Redis holds, input like any other: it returns
// a cell or an error, never panics, and a cell it returns has its maps.
func FuzzParseRedisCell(f *testing.F) {
	cell := func(reporters, locals map[string][]int64) []byte {
		b := msgp.AppendArrayHeader(nil, 10)
		for _, v := range []int64{105, 5, 0, 0, 0, 1_800_000_000_000, 0, 0} {
			b = msgp.AppendInt64(b, v)
		}
		for _, m := range []map[string][]int64{reporters, locals} {
			if len(m) == 0 {
				b = msgp.AppendArrayHeader(b, 0) // Lua writes an empty table as an array
				continue
			}
			b = msgp.AppendMapHeader(b, uint32(len(m)))
			for k, vs := range m {
				b = msgp.AppendString(b, k)
				if len(vs) > 1 {
					b = msgp.AppendArrayHeader(b, uint32(len(vs)))
				}
				for _, v := range vs {
					b = msgp.AppendFloat64(b, float64(v))
				}
			}
		}
		return b
	}
	f.Add(cell(nil, nil))
	f.Add(cell(map[string][]int64{"a": {1, 5, 105, 1_800_000_000_200}, "b/2": {-1_800_000_000_000, 0, 0, 0}}, map[string][]int64{"a.1": {50}}))
	f.Add([]byte{})
	f.Add([]byte("1"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := ParseRedisCell(raw)
		if err != nil {
			return
		}
		if c.Reporters == nil || c.Locals == nil {
			t.Fatalf("%x parsed without its maps: %+v", raw, c)
		}
		for _, n := range []int64{c.Charged, c.Used, c.Own, c.Foreign, c.Lost} {
			if n > window.MaxCount || n < -window.MaxCount {
				t.Fatalf("%x: a count %d out of range", raw, n)
			}
		}
	})
}
