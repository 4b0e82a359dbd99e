package event

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// TestEventGolden checks the events the hand-written encoders of bus/wire
// wrote before the codecs were generated (testdata/events.txt, made from
// evCodecs' samples at commit a183374): each decodes to its sample, and the
// sample encodes to the same bytes, so processes of both versions talk.
func TestEventGolden(t *testing.T) {
	f, err := os.Open("testdata/events.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	codecs := map[string]*evCodec{}
	for _, c := range evCodecs() {
		codecs[c.name] = c
	}
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cols := strings.Split(line, "\t")
		c := codecs[cols[0]]
		i, err := strconv.Atoi(cols[1])
		if c == nil || err != nil || len(cols) != 3 || i >= len(c.samples) {
			t.Fatalf("bad line %.80q", line)
		}
		want, err := hex.DecodeString(cols[2])
		if err != nil {
			t.Fatal(err)
		}
		if got := c.encode(nil, c.samples[i]); !bytes.Equal(got, want) {
			t.Errorf("%s sample %d: encoded\n%x\nthe hand-written encoder wrote\n%x", c.name, i, got, want)
		}
		v, err := c.decode(want)
		if err != nil {
			t.Errorf("%s sample %d: %v", c.name, i, err)
		} else if !reflect.DeepEqual(v, evNormalize(c.samples[i])) {
			t.Errorf("%s sample %d: decoded %+v", c.name, i, v)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, c := range evCodecs() {
		want += len(c.samples)
	}
	if n != want {
		t.Errorf("testdata/events.txt holds %d events, want one per sample (%d)", n, want)
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
// Msgsize of their entries, which the lists compute from string lengths
// alone (and an epoch's room for an entry of a reset's cell): less would
// make an encoder grow its buffer a second time.
func TestListSizes(t *testing.T) {
	cs, ds, is := evComponents(), evDenials(), evImports()
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
	for i := range ds {
		w := toWireDenial(&ds[i])
		want += w.Msgsize()
		if ds[i].Cell.Epoch != 0 {
			want += msgp.Uint64Size
		}
	}
	if got := denialList(ds).Msgsize(); got != want {
		t.Errorf("denials: Msgsize %d, entries' %d", got, want)
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
}
