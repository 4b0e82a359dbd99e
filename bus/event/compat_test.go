package event

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/events.txt, the golden events of TestEventGolden")

// goldenEventsFile holds the golden events: one per line, codec name,
// sample index and hex, tab-separated.
const goldenEventsFile = "testdata/events.txt"

// goldenEventsHeader opens goldenEventsFile.
const goldenEventsHeader = `# The golden events of TestEventGolden: each sample of evCodecs encoded, one
# per line: codec, sample index, hex. Each must decode to the sample and
# re-encode to the same bytes. go test ./bus/event -run TestEventGolden
# -update writes the file again (read the diff before committing it).
`

// TestEventGolden pins the bytes of every kind of event: each sample of
// evCodecs encodes to its line of testdata/events.txt, and that line
// decodes to the sample, so a change to what processes send each other
// fails it. Run it with -update to write the file again.
func TestEventGolden(t *testing.T) {
	var out strings.Builder
	out.WriteString(goldenEventsHeader)
	for _, c := range evCodecs() {
		for i, v := range c.samples {
			b := c.encode(nil, v)
			fmt.Fprintf(&out, "%s\t%d\t%x\n", c.name, i, b)
			got, err := c.decode(b)
			if err != nil {
				t.Errorf("%s sample %d: %v", c.name, i, err)
			} else if !reflect.DeepEqual(got, evNormalize(v)) {
				t.Errorf("%s sample %d: decoded %+v", c.name, i, got)
			}
		}
	}
	for i, p := range evGoldenPolicies() {
		b := AppendPolicies(nil, p)
		fmt.Fprintf(&out, "policies\t%d\t%x\n", i, b)
		if got, err := DecodePolicies(b); err != nil || !reflect.DeepEqual(got, p) {
			t.Errorf("policies sample %d: decoded %+v, %v", i, got, err)
		}
	}
	if *updateGolden {
		if err := os.WriteFile(goldenEventsFile, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenEventsFile)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	wantLines, gotLines := strings.Split(string(want), "\n"), strings.Split(out.String(), "\n")
	for i := range max(len(wantLines), len(gotLines)) {
		var w, g string
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if i < len(gotLines) {
			g = gotLines[i]
		}
		if w != g {
			t.Errorf("%s line %d: encoded\n%.300s\ngolden\n%.300s", goldenEventsFile, i+1, g, w)
		}
	}
}

// evGoldenPolicies returns the policies events of TestEventGolden.
func evGoldenPolicies() []Policies {
	full := samplePolicies()
	full.Seq = 1_795_000_000_000_123
	full.Shards = make([]uint64, policy.DigestShards)
	for i := range full.Shards {
		full.Shards[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	noMarks := samplePolicies()
	noMarks.Marks = nil
	return []Policies{
		{Overrides: []policy.Entry{}},
		samplePolicies(),
		noMarks,
		{Overrides: []policy.Entry{}, Marks: samplePolicies().Marks},
		{Overrides: samplePolicies().Overrides[2:], Seq: 1},
		full,
	}
}

// TestEventHostileHeaders checks that a list header announcing more entries
// than the message holds makes no decoder allocate for them.
func TestEventHostileHeaders(t *testing.T) {
	for _, c := range evCodecs() {
		for _, n := range []int{16, 1000, MaxEntries, MaxEntries + 1, 1<<32 - 1} {
			t.Run(fmt.Sprintf("%s announcing %d", c.name, n), func(t *testing.T) {
				head := evRaw{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
				// One valid entry follows: the header still announces more
				// than the bytes can hold.
				m := evMap{{"v", 1}, {c.key, append(head, evMP(c.entry)...)}}
				if c.chunk {
					m = append(m, evKV{"m", false})
				}
				in := evMP(m)
				if v, err := c.decode(in); err == nil {
					t.Fatalf("accepted %+v", v)
				}
				// What the decoder allocates (its error, about 300 bytes),
				// averaged over many runs so that nothing else the process
				// does meanwhile can reach the bound: a list sized by the
				// header would take a kilobyte and more on every run, and
				// for the largest headers gigabytes.
				const runs = 500
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for range runs {
					_, _ = c.decode(in)
				}
				runtime.ReadMemStats(&after)
				if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 1024 {
					t.Errorf("allocated %d bytes a run", per)
				}
			})
		}
	}
}

// TestListSizes checks that the lists' Msgsize is the sum of the generated
// Msgsize of their entries, which the codecs compute from string lengths
// alone (and an epoch's room for an entry of a reset's cell): less would
// make an encoder grow its buffer a second time.
func TestListSizes(t *testing.T) {
	cs, is := evComponents(), evImports()
	cs = append(cs, global.Component{Cell: window.Cell{Identifier: strings.Repeat("x", 70000)}, Region: strings.Repeat("r", 300)})
	want := msgp.ArrayHeaderSize
	for i := range cs {
		w := toWireComponent(&cs[i])
		want += w.Msgsize()
		if cs[i].Cell.Epoch != 0 {
			want += msgp.Uint64Size
		}
	}
	if got := componentList(cs).Msgsize(); got != want {
		t.Errorf("components: Msgsize %d, entries' %d", got, want)
	}
	want = msgp.ArrayHeaderSize
	for i := range is {
		w := toWireImport(&is[i])
		want += w.Msgsize()
		if is[i].Cell.Epoch != 0 {
			want += msgp.Uint64Size
		}
	}
	if got := importList(is).Msgsize(); got != want {
		t.Errorf("imports: Msgsize %d, entries' %d", got, want)
	}
	es, ms := samplePolicies().Overrides, samplePolicies().Marks
	want = msgp.ArrayHeaderSize
	for i := range es {
		w := toWireOverride(&es[i])
		want += w.Msgsize()
	}
	if got := overrideList(es).Msgsize(); got != want {
		t.Errorf("overrides: Msgsize %d, entries' %d", got, want)
	}
	want = msgp.ArrayHeaderSize
	for i := range ms {
		w := toWireMark(&ms[i])
		want += w.Msgsize()
	}
	if got := markList(ms).Msgsize(); got != want {
		t.Errorf("reset marks: Msgsize %d, entries' %d", got, want)
	}
}

// TestEntriesAsGenerated checks that the hand-written encoders of the
// entries write what the generated encoders of their tuples (msg.go) write,
// for entries of every kind, an epoch's element aside.
func TestEntriesAsGenerated(t *testing.T) {
	check := func(kind string, i int, got []byte, w msgp.Marshaler) {
		t.Helper()
		want, _ := w.MarshalMsg(nil)
		if !bytes.Equal(got, want) {
			t.Errorf("%s %d: wrote\n%x\ngenerated\n%x", kind, i, got, want)
		}
	}
	var ints []int64
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, 1 << 32, math.MaxInt64} {
		ints = append(ints, v, -v)
	}
	var strs []string
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		strs = append(strs, strings.Repeat("s", n))
	}
	for i, v := range ints {
		s := func(j int) string { return strs[(i+j)%len(strs)] }
		cell := window.Cell{Workspace: s(0), Namespace: s(1), Identifier: s(2), Duration: v, Sequence: -v}
		c := global.Component{Cell: cell, Region: s(3), Count: v, ExpireAt: ints[(i+1)%len(ints)]}
		w := toWireComponent(&c)
		check("component", i, componentCodec{}.appendEntry(nil, &c), &w)
		im := global.Import{Cell: cell, Foreign: v, Own: -v, ExpireAt: ints[(i+2)%len(ints)]}
		wi := toWireImport(&im)
		check("import", i, importCodec{}.appendEntry(nil, &im), &wi)
		e := policy.Entry{Key: policy.Key{Workspace: s(0), Namespace: s(1), Pattern: s(2)},
			Override: policy.Override{Limit: v, Duration: -v, Shadow: i%2 == 0}, Deleted: i%3 == 0,
			Version: policy.Version{At: ints[(i+1)%len(ints)], Origin: s(3)}}
		wo := toWireOverride(&e)
		check("override", i, overrideCodec{}.appendEntry(nil, &e), &wo)
		m := policy.Mark{Workspace: s(0), Namespace: s(1), Identifier: s(2), Duration: v, Epoch: -v}
		wm := toWireMark(&m)
		check("reset mark", i, markCodec{}.appendEntry(nil, &m), &wm)
	}
}

// The wire structs of entries, for the generated encoders and sizes the
// tests compare the hand-written ones with.

func toWireCell(c *window.Cell) wireCell {
	return wireCell{Workspace: token(c.Workspace), Namespace: token(c.Namespace), Identifier: identifier(c.Identifier),
		Duration: uint64(c.Duration), Sequence: uint64(c.Sequence)}
}

func toWireComponent(c *global.Component) wireComponent {
	return wireComponent{wireCell: toWireCell(&c.Cell), Region: token(c.Region), Count: uint64(c.Count), ExpireAt: uint64(c.ExpireAt)}
}

func toWireImport(im *global.Import) wireImport {
	return wireImport{wireCell: toWireCell(&im.Cell), Foreign: uint64(im.Foreign), Own: uint64(im.Own), ExpireAt: uint64(im.ExpireAt)}
}

func toWireOverride(e *policy.Entry) wireOverride {
	var flags uint64
	if e.Shadow {
		flags |= flagShadow
	}
	if e.Deleted {
		flags |= flagDeleted
	}
	return wireOverride{Workspace: token(e.Workspace), Namespace: token(e.Namespace), Pattern: identifier(e.Pattern),
		Limit: uint64(max(e.Limit, 0)), Duration: uint64(max(e.Duration, 0)), Flags: flags,
		At: uint64(max(e.Version.At, 0)), Origin: token(e.Version.Origin)}
}

func toWireMark(m *policy.Mark) wireMark {
	return wireMark{Workspace: token(m.Workspace), Namespace: token(m.Namespace), Identifier: identifier(m.Identifier),
		Duration: uint64(max(m.Duration, 0)), Epoch: uint64(max(m.Epoch, 0))}
}
