package event

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/msgptest"
	"github.com/sluicehq/sluice/window"
)

// --- msgpack builder for events ----------------------------------------------

type (
	evKV  = msgptest.KV
	evMap = msgptest.Map
	evRaw = msgptest.Raw
)

// evMP encodes v apart from the codecs: a non-negative int in its unsigned
// form, as the event encoders write it; every other Go type in its own
// msgpack form.
func evMP(v any) []byte { return msgptest.EncodeUnsigned(v) }

// evSet returns a copy of entry with field i set to v.
func evSet(entry []any, i int, v any) []any {
	out := append([]any(nil), entry...)
	out[i] = v
	return out
}

// --- sample values --------------------------------------------------------------

var (
	evBinaryID = "\x00\xff\x00bin\xff"
	evLongID   = strings.Repeat("\xff", window.MaxIdentifierLen)
	evToken64  = strings.Repeat("aZ0_-", 12) + "abcd"
)

func evCells() []window.Cell {
	return []window.Cell{
		{Workspace: "acme", Namespace: "api", Identifier: "user:1", Duration: 60000, Sequence: 28_333_333},
		{Workspace: "acme", Namespace: "api", Identifier: evBinaryID, Duration: window.MinDuration, Sequence: 0},
		// 30 days: the longest window when testdata/events.txt was written.
		{Workspace: "acme", Namespace: "login-v2", Identifier: evLongID, Duration: 2_592_000_000, Sequence: math.MaxInt64},
		{Workspace: evToken64, Namespace: "A", Identifier: "x", Duration: 1001, Sequence: 1},
		{Workspace: "w_2", Namespace: evToken64, Identifier: "é", Duration: 86_400_000, Sequence: 1 << 40},
	}
}

func evComponents() []global.Component {
	var cs []global.Component
	counts := []int64{0, 1, window.MaxCount, 255, 1 << 32}
	for i, c := range evCells() {
		cs = append(cs, global.Component{Cell: c, Region: []string{"eu-west", "us_east-1", evToken64, "eu-west", "x"}[i],
			Count: counts[i], ExpireAt: []int64{0, 1_700_000_000_000, math.MaxInt64, 127, 128}[i]})
	}
	return cs
}

func evImports() []global.Import {
	var is []global.Import
	for i, c := range evCells() {
		is = append(is, global.Import{Cell: c,
			Foreign:  []int64{0, 7, window.MaxCount, 1 << 31, 300}[i],
			Own:      []int64{0, 3, window.MaxCount, 0, 1 << 33}[i],
			ExpireAt: []int64{0, 1_700_000_120_000, math.MaxInt64, 42, 65536}[i]})
	}
	return is
}

// Valid entries in msgpack form, matching the first sample of each kind.
var (
	evGoodComponentEntry = []any{"acme", "api", []byte("user:1"), 60000, 28_333_333, "eu-west", 5, 1_700_000_120_000}
	evGoodImportEntry    = []any{"acme", "api", []byte("user:1"), 60000, 28_333_333, 40, 5, 1_700_000_120_000}
)

// evEvent returns an event map with the version and list key holding entries.
func evEvent(key string, entries ...any) evMap {
	return evMap{{"v", 1}, {key, entries}}
}

// --- independent checks -------------------------------------------------------

// evCheckToken fails unless s is 1 to 64 characters of [A-Za-z0-9_-]; written
// apart from ValidToken on purpose.
func evCheckToken(t testing.TB, what, s string) {
	t.Helper()
	if len(s) < 1 || len(s) > 64 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
		t.Fatalf("%s %q accepted", what, s)
	}
}

func evCheckRange(t testing.TB, what string, v, min, max int64) {
	t.Helper()
	if v < min || v > max {
		t.Fatalf("%s %d accepted, want %d..%d", what, v, min, max)
	}
}

func evCheckCell(t testing.TB, c window.Cell) {
	t.Helper()
	evCheckToken(t, "workspace", c.Workspace)
	evCheckToken(t, "namespace", c.Namespace)
	if n := len(c.Identifier); n < 1 || n > 512 {
		t.Fatalf("identifier of %d bytes accepted", n)
	}
	evCheckRange(t, "duration", c.Duration, 1000, 31_622_400_000)
	evCheckRange(t, "sequence", c.Sequence, 0, math.MaxInt64)
}

func evCheckComponents(t testing.TB, cs []global.Component) {
	t.Helper()
	for _, c := range cs {
		evCheckCell(t, c.Cell)
		evCheckToken(t, "region", c.Region)
		evCheckRange(t, "count", c.Count, 0, 1<<62)
		evCheckRange(t, "expire_at", c.ExpireAt, 0, math.MaxInt64)
	}
}

func evCheckImports(t testing.TB, is []global.Import) {
	t.Helper()
	for _, im := range is {
		evCheckCell(t, im.Cell)
		evCheckRange(t, "foreign", im.Foreign, 0, 1<<62)
		evCheckRange(t, "own", im.Own, 0, 1<<62)
		evCheckRange(t, "expire_at", im.ExpireAt, 0, math.MaxInt64)
	}
}

// evCodec is one encoder/decoder pair behind a common face, for tables.
type evCodec struct {
	name   string
	prefix string // of every error
	// encode encodes v (the codec's value type) after dst.
	encode func(dst []byte, v any) []byte
	// decode returns the decoded value as an any holding the value type.
	decode func(b []byte) (any, error)
	// check fails unless v satisfies every rule.
	check func(t testing.TB, v any)
	// samples are valid values.
	samples []any
	// key is the list key, entry a valid entry in msgpack form.
	key   string
	entry []any
	chunk bool
}

// evEventFor returns an event of c's kind holding entries, with "m" for a chunk.
func (c *evCodec) event(entries ...any) evMap {
	m := evEvent(c.key, entries...)
	if c.chunk {
		m = append(m, evKV{"m", false})
	}
	return m
}

func evCodecs() []*evCodec {
	return []*evCodec{
		{
			name: "components", prefix: "invalid components event: ", key: "c", entry: evGoodComponentEntry,
			encode: func(dst []byte, v any) []byte { return AppendComponents(dst, v.([]global.Component)) },
			decode: func(b []byte) (any, error) { return DecodeComponents(b) },
			check:  func(t testing.TB, v any) { evCheckComponents(t, v.([]global.Component)) },
			samples: []any{
				[]global.Component(nil), []global.Component{}, evComponents(), evComponents()[2:3],
				[]global.Component{{Cell: evCells()[0], Region: "r", Count: 5, ExpireAt: 1_700_000_120_000}},
			},
		},
		{
			name: "imports", prefix: "invalid imports event: ", key: "i", entry: evGoodImportEntry,
			encode: func(dst []byte, v any) []byte { return AppendImports(dst, v.([]global.Import)) },
			decode: func(b []byte) (any, error) { return DecodeImports(b) },
			check:  func(t testing.TB, v any) { evCheckImports(t, v.([]global.Import)) },
			samples: []any{
				[]global.Import(nil), []global.Import{}, evImports(), evImports()[4:],
			},
		},
		{
			name: "snapshot chunk", prefix: "invalid snapshot chunk: ", key: "i", entry: evGoodImportEntry, chunk: true,
			encode: func(dst []byte, v any) []byte { return AppendSnapshotChunk(dst, v.(SnapshotChunk)) },
			decode: func(b []byte) (any, error) { return DecodeSnapshotChunk(b) },
			check:  func(t testing.TB, v any) { evCheckImports(t, v.(SnapshotChunk).Imports) },
			samples: []any{
				SnapshotChunk{}, SnapshotChunk{More: true}, SnapshotChunk{Imports: []global.Import{}, More: true},
				SnapshotChunk{Imports: evImports(), More: true}, SnapshotChunk{Imports: evImports()[:1]},
			},
		},
	}
}

// evNormalize returns v with a nil list replaced by an empty one: decoders
// always return a non-nil list.
func evNormalize(v any) any {
	switch v := v.(type) {
	case []global.Component:
		if v == nil {
			return []global.Component{}
		}
	case []global.Import:
		if v == nil {
			return []global.Import{}
		}
	case SnapshotChunk:
		if v.Imports == nil {
			v.Imports = []global.Import{}
		}
		return v
	}
	return v
}

// evIsNil reports whether the list inside v is nil.
func evIsNil(v any) bool {
	switch v := v.(type) {
	case []global.Component:
		return v == nil
	case []global.Import:
		return v == nil
	case SnapshotChunk:
		return v.Imports == nil
	}
	panic("evIsNil: unexpected type")
}

// --- round trips ----------------------------------------------------------------

func TestEventRoundTrip(t *testing.T) {
	for _, c := range evCodecs() {
		t.Run(c.name, func(t *testing.T) {
			for i, v := range c.samples {
				b := c.encode(nil, v)
				got, err := c.decode(b)
				if err != nil {
					t.Fatalf("sample %d: %v", i, err)
				}
				if evIsNil(got) {
					t.Fatalf("sample %d: decoded a nil list", i)
				}
				if want := evNormalize(v); !reflect.DeepEqual(got, want) {
					t.Fatalf("sample %d: decoded\n%+v\nwant\n%+v", i, got, want)
				}
				c.check(t, got)
				// A decoded value re-encodes to the same bytes, after
				// whatever dst held.
				prefix := []byte("prefix")
				if again := c.encode(prefix, got); !bytes.Equal(again[len(prefix):], b) || string(again[:len(prefix)]) != "prefix" {
					t.Fatalf("sample %d: re-encoded to\n%x\nwant\n%x", i, again, b)
				}
				// The result does not alias b.
				for j := range b {
					b[j] = 'x'
				}
				if want := evNormalize(v); !reflect.DeepEqual(got, want) {
					t.Fatalf("sample %d: decoded value changed with the input buffer", i)
				}
			}
		})
	}
}

// TestEventEncodeAnything checks what encoders write for values of every
// size and sign, valid or not (they write them as they are, a negative
// integer as the uint64 of its bits), and that they allocate once when dst
// has no room, copying what dst held, and never into a buffer that an
// earlier encoding of the same event returned.
func TestEventEncodeAnything(t *testing.T) {
	var ints []int64
	for _, v := range []int64{0, 31, 32, 127, 128, 255, 256, 32767, 32768, 65535, 65536, math.MaxInt32, math.MaxUint32, 1 << 32, math.MaxInt64} {
		ints = append(ints, v, -v, -v-1)
	}
	ints = append(ints, math.MinInt64)
	var strs []string
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		strs = append(strs, strings.Repeat("s", n))
	}
	var (
		cs            []global.Component
		is            []global.Import
		wcs, wis, wch []any
	)
	u := func(v int64) uint64 { return uint64(v) }
	for i, v := range ints {
		str := strs[i%len(strs)]
		cell := window.Cell{Workspace: str, Namespace: strs[(i+1)%len(strs)], Identifier: strs[(i+2)%len(strs)], Duration: v, Sequence: -v}
		wcell := []any{cell.Workspace, cell.Namespace, []byte(cell.Identifier), u(v), u(-v)}
		cs = append(cs, global.Component{Cell: cell, Region: strs[(i+3)%len(strs)], Count: v, ExpireAt: ints[(i+1)%len(ints)]})
		wcs = append(wcs, append(wcell[:5:5], strs[(i+3)%len(strs)], u(v), u(ints[(i+1)%len(ints)])))
		is = append(is, global.Import{Cell: cell, Foreign: v, Own: -v, ExpireAt: ints[(i+3)%len(ints)]})
		wis = append(wis, append(wcell[:5:5], u(v), u(-v), u(ints[(i+3)%len(ints)])))
	}
	wch = wis
	check := func(name string, n int, want []byte, enc func(dst []byte) []byte) {
		t.Helper()
		b := enc(nil)
		if !bytes.Equal(b, want) {
			t.Errorf("%s of %d entries: encoded\n%.200x\nwant\n%.200x", name, n, b, want)
		}
		if a := testing.AllocsPerRun(5, func() { _ = enc(nil) }); a != 1 {
			t.Errorf("%s of %d entries: allocates %v times into nil, want 1", name, n, a)
		}
		if a := testing.AllocsPerRun(5, func() { b = enc(b[:0]) }); a != 0 {
			t.Errorf("%s of %d entries: allocates %v times into the buffer it returned", name, n, a)
		}
		prefix := []byte("prefix")
		if a := testing.AllocsPerRun(5, func() { _ = enc(prefix) }); a != 1 {
			t.Errorf("%s of %d entries: allocates %v times after a full prefix, want 1", name, n, a)
		}
		if got := enc(prefix); string(got[:len(prefix)]) != "prefix" || !bytes.Equal(got[len(prefix):], want) {
			t.Errorf("%s of %d entries: encoded after a prefix as %.200x", name, n, got)
		}
	}
	for _, n := range []int{0, 1, 15, 16, len(cs)} {
		check("components", n, evMP(evEvent("c", wcs[:n]...)), func(dst []byte) []byte { return AppendComponents(dst, cs[:n]) })
		check("imports", n, evMP(evEvent("i", wis[:n]...)), func(dst []byte) []byte { return AppendImports(dst, is[:n]) })
		check("chunk", n, evMP(append(evEvent("i", wch[:n]...), evKV{"m", true})), func(dst []byte) []byte {
			return AppendSnapshotChunk(dst, SnapshotChunk{Imports: is[:n], More: true})
		})
	}
	// Lists of 16-bit and 32-bit lengths.
	many := make([]global.Component, 70000)
	zero := []any{"", "", []byte{}, 0, 0, "", 0, 0}
	var wmany []any
	for range many {
		wmany = append(wmany, zero)
	}
	for _, n := range []int{65535, 65536, 70000} {
		check("components", n, evMP(evEvent("c", wmany[:n]...)), func(dst []byte) []byte { return AppendComponents(dst, many[:n]) })
	}
}

// TestEventWireShape pins the wire form of each kind of event.
func TestEventWireShape(t *testing.T) {
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "user:1", Duration: 60000, Sequence: 28_333_333}
	cases := []struct {
		name string
		got  []byte
		want evMap
	}{
		{
			"components",
			AppendComponents(nil, []global.Component{{Cell: cell, Region: "eu-west", Count: 5, ExpireAt: 1_700_000_120_000}}),
			evEvent("c", evGoodComponentEntry),
		},
		{
			"imports",
			AppendImports(nil, []global.Import{{Cell: cell, Foreign: 40, Own: 5, ExpireAt: 1_700_000_120_000}}),
			evEvent("i", evGoodImportEntry),
		},
		{
			"snapshot chunk",
			AppendSnapshotChunk(nil, SnapshotChunk{Imports: []global.Import{{Cell: cell, Foreign: 40, Own: 5, ExpireAt: 1_700_000_120_000}}, More: true}),
			append(evEvent("i", evGoodImportEntry), evKV{"m", true}),
		},
		{"empty components", AppendComponents(nil, nil), evEvent("c")},
		{"empty imports", AppendImports(nil, nil), evEvent("i")},
		{"empty chunk", AppendSnapshotChunk(nil, SnapshotChunk{}), append(evEvent("i"), evKV{"m", false})},
	}
	for _, tc := range cases {
		if want := evMP(tc.want); !bytes.Equal(tc.got, want) {
			t.Errorf("%s: encoded\n%x\nwant\n%x", tc.name, tc.got, want)
		}
	}
	// The smallest event: fixmap, "v", 1, "c", empty fixarray.
	if got, want := AppendComponents(nil, nil), []byte{0x82, 0xa1, 'v', 0x01, 0xa1, 'c', 0x90}; !bytes.Equal(got, want) {
		t.Errorf("empty components: %x, want %x", got, want)
	}
	// The version really is Version.
	if Version != 1 {
		t.Errorf("Version = %d", Version)
	}
}

// TestEventDecodeAlternatives checks forms the encoders do not write but the
// decoders accept: identifiers as str, integers in signed or wide forms, keys
// in another order or as bin, and unknown keys.
func TestEventDecodeAlternatives(t *testing.T) {
	want := []global.Component{{
		Cell:   window.Cell{Workspace: "acme", Namespace: "api", Identifier: "user:1", Duration: 60000, Sequence: 28_333_333},
		Region: "eu-west", Count: 5, ExpireAt: 1_700_000_120_000,
	}}
	wide := []any{"acme", "api", "user:1", int64(60000), uint64(28_333_333), "eu-west", int64(5), int64(1_700_000_120_000)}
	// Integers as 64-bit forms, whatever their value.
	wide64 := append(evRaw(nil), msgp.AppendArrayHeader(nil, 8)...)
	wide64 = append(wide64, evMP("acme")...)
	wide64 = append(wide64, evMP("api")...)
	wide64 = append(wide64, evMP([]byte("user:1"))...)
	for _, v := range []int64{60000, 28_333_333} {
		wide64 = append(wide64, 0xd3, 0, 0, 0, 0, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	wide64 = append(wide64, evMP("eu-west")...)
	wide64 = append(wide64, 0xcf, 0, 0, 0, 0, 0, 0, 0, 5)
	wide64 = append(wide64, evMP(int64(1_700_000_120_000))...)
	cases := []struct {
		name string
		in   evMap
	}{
		{"canonical", evEvent("c", evGoodComponentEntry)},
		{"str identifier and signed ints", evEvent("c", wide)},
		{"64-bit ints", evEvent("c", wide64)},
		{"list first", evMap{{"c", []any{evGoodComponentEntry}}, {"v", 1}}},
		{"version as int64", evMap{{"v", int64(1)}, {"c", []any{evGoodComponentEntry}}}},
		{"bin keys", evMap{{[]byte("v"), 1}, {[]byte("c"), []any{evGoodComponentEntry}}}},
		{"unknown keys", evMap{
			{"x", evMap{{"nested", []any{1, "two", nil, 3.5, evMap{{"deep", true}}}}}},
			{"v", 1},
			{"d", []any{"not", "denials"}},
			{"m", true},
			{"c", []any{evGoodComponentEntry}},
			{"zzz", nil},
		}},
		{"many unknown keys", evManyKeys(evEvent("c", evGoodComponentEntry), 40)},
	}
	for _, tc := range cases {
		got, err := DecodeComponents(evMP(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, want %+v", tc.name, got, want)
		}
	}
	// A chunk ignores lists of other kinds; imports ignore "m".
	chunk, err := DecodeSnapshotChunk(evMP(evMap{{"v", 1}, {"m", true}, {"c", []any{1}}, {"i", []any{}}}))
	if err != nil || !chunk.More || chunk.Imports == nil || len(chunk.Imports) != 0 {
		t.Errorf("chunk: %+v, %v", chunk, err)
	}
	is, err := DecodeImports(evMP(evMap{{"v", 1}, {"i", []any{evGoodImportEntry}}, {"m", "anything"}}))
	if err != nil || len(is) != 1 || is[0].Own != 5 {
		t.Errorf("imports with m: %+v, %v", is, err)
	}
}

// evManyKeys returns m with n unknown keys added.
func evManyKeys(m evMap, n int) evMap {
	out := append(evMap(nil), m...)
	for i := range n {
		out = append(out, evKV{"x" + strconv.Itoa(i), i})
	}
	return out
}

// TestEventTokensShared checks that equal tokens of consecutive entries share
// one string and that identifiers are copies.
func TestEventTokensShared(t *testing.T) {
	cs := evComponents()
	cs[1].Region = cs[0].Region
	got, err := DecodeComponents(AppendComponents(nil, cs))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cs) {
		t.Fatalf("decoded %+v", got)
	}
	if !evSameString(got[0].Cell.Workspace, got[1].Cell.Workspace) || !evSameString(got[0].Region, got[1].Region) {
		t.Errorf("equal tokens of consecutive entries are not shared")
	}
}

// evSameString reports whether a and b share their bytes.
func evSameString(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

// --- malformed input --------------------------------------------------------------

type evBad struct {
	name string
	in   []byte
	want string // the error after the codec's prefix
}

// evMalformed returns the malformed inputs of codec c and what each must say.
func evMalformed(c *evCodec) []evBad {
	entry := c.entry
	ev := func(entries ...any) []byte { return evMP(c.event(entries...)) }
	list := c.name
	if c.chunk {
		list = "imports"
	}
	good := ev(entry)
	// The position of the fields that follow the cell.
	tail := []string{"region", "count", "expire_at"}
	switch c.name {
	case "imports", "snapshot chunk":
		tail = []string{"foreign", "own", "expire_at"}
	}
	at := func(i int) string { return list + "[" + string(rune('0'+i)) + "]: " }
	cases := []evBad{
		{"empty", nil, "empty message"},
		{"not a map", evMP([]any{1, []any{entry}}), "event must be a msgpack map"},
		{"a string", evMP("v"), "event must be a msgpack map"},
		{"invalid prefix", []byte{0xc1}, "malformed msgpack: unrecognized type prefix 0xc1"},
		{"truncated map header", []byte{0xde, 0x00}, "malformed msgpack: unexpected end of data"},
		{"trailing byte", append(append([]byte(nil), good...), 0xc0), "malformed msgpack: 1 trailing bytes after the map"},
		{"second event", append(append([]byte(nil), good...), good...), "malformed msgpack: " + strconv.Itoa(len(good)) + " trailing bytes after the map"},
		{"int key", evMP(evMap{{1, 1}, {c.key, []any{}}}), "msgpack map keys must be strings"},
		{"missing version", evMP(evMap{{c.key, []any{entry}}, {"m", true}}), `missing version "v"`},
		{"version 2", evMP(evMap{{"v", 2}, {c.key, []any{entry}}, {"m", true}}), "unsupported version 2, want 1"},
		{"version 0", evMP(evMap{{"v", 0}, {c.key, []any{entry}}, {"m", true}}), "unsupported version 0, want 1"},
		{"version -1", evMP(evMap{{"v", -1}, {c.key, []any{entry}}, {"m", true}}), "unsupported version -1, want 1"},
		{"huge version", evMP(evMap{{"v", uint64(math.MaxUint64)}, {c.key, []any{}}}), `version "v" does not fit in 64 bits, got 18446744073709551615`},
		{"version as string", evMP(evMap{{"v", "1"}, {c.key, []any{entry}}}), `version "v" must be an integer`},
		{"version as float", evMP(evMap{{"v", 1.0}, {c.key, []any{entry}}}), `version "v" must be an integer`},
		{"duplicate version", evMP(evMap{{"v", 1}, {"v", 1}, {c.key, []any{entry}}}), `duplicate field "v"`},
		{"missing list", evMP(evMap{{"v", 1}, {"m", false}}), `missing entry list "` + c.key + `"`},
		{"list of another kind", evMP(evMap{{"v", 1}, {"m", false}, {"x" + c.key, []any{}}}), `missing entry list "` + c.key + `"`},
		{"nil list", evMP(evMap{{"v", 1}, {c.key, nil}}), `entry list "` + c.key + `" must be an array`},
		{"map list", evMP(evMap{{"v", 1}, {c.key, evMap{}}}), `entry list "` + c.key + `" must be an array`},
		{"duplicate list", evMP(evMap{{"v", 1}, {c.key, []any{}}, {c.key, []any{}}}), `duplicate field "` + c.key + `"`},
		{"too many entries", evMP(evMap{{"v", 1}, {c.key, evRaw{0xdd, 0x00, 0x01, 0x86, 0xa1}}}), `entry list "` + c.key + `" holds 100001 entries, more than 100000`},
		{"most entries announced", evMP(evMap{{"v", 1}, {c.key, evRaw{0xdd, 0x00, 0x01, 0x86, 0xa0}}}), `malformed msgpack: entry list "` + c.key + `" announces 100000 entries but only 0 bytes follow`},
		{"missing entries", evMP(evMap{{"v", 1}, {c.key, append(evRaw{0x9f}, evMP(entry)...)}}), "malformed msgpack: entry list \"" + c.key + "\" announces 15 entries but only " + strconv.Itoa(len(evMP(entry))) + " bytes follow"},
		{"truncated entry list", evMP(evMap{{"v", 1}, {c.key, append(evRaw{0x92}, evMP(entry)...)}}), at(1) + "malformed msgpack: unexpected end of data"},
		{"unknown key truncated", append(evMP(evMap{{"v", 1}, {c.key, []any{}}, {"x", nil}})[:len(evMP(evMap{{"v", 1}, {c.key, []any{}}, {"x", nil}}))-1], 0xdc, 0x00), "malformed msgpack: unexpected end of data"},
		{"entry not an array", ev(entry, evMap{{"a", 1}}), at(1) + "entry must be an array"},
		{"entry nil", ev(entry, nil), at(1) + "entry must be an array"},
		{"short entry", ev(entry[:len(entry)-1]), at(0) + "entry must be an array of " + strconv.Itoa(len(entry)) + " fields, got " + strconv.Itoa(len(entry)-1)},
		{"long entry", ev(append(append([]any(nil), entry...), 1, 2)), at(0) + "entry must be an array of " + strconv.Itoa(len(entry)) + " fields, got " + strconv.Itoa(len(entry)+2)},
		// The cell's epoch, an optional last element.
		{"epoch before the cell's window", ev(append(append([]any(nil), entry...), 1)), at(0) + "epoch 1 is neither 0 nor in range 1699999980000..1700000159999"},
		{"epoch 0 written", ev(append(append([]any(nil), entry...), 0)), at(0) + "epoch 0 is written: a cell never reset carries no epoch"},
		{"epoch not an integer", ev(append(append([]any(nil), entry...), "x")), at(0) + "epoch must be an integer from 1 to 4503599627370496"},
		{"epoch negative", ev(append(append([]any(nil), entry...), -5)), at(0) + "epoch must be an integer from 1 to 4503599627370496"},
		{"empty entry", ev(entry, []any{}), at(1) + "entry must be an array of " + strconv.Itoa(len(entry)) + " fields, got 0"},
		// The cell.
		{"empty workspace", ev(entry, evSet(entry, 0, "")), at(1) + `workspace "" is not 1 to 64 characters of [A-Za-z0-9_-]`},
		{"bad workspace", ev(evSet(entry, 0, "a.b")), at(0) + `workspace "a.b" is not 1 to 64 characters of [A-Za-z0-9_-]`},
		{"long workspace", ev(evSet(entry, 0, evToken64+"x")), at(0) + `workspace "` + evToken64 + `"... is not 1 to 64 characters of [A-Za-z0-9_-]`},
		{"workspace as bin", ev(evSet(entry, 0, []byte("acme"))), at(0) + "workspace must be a string"},
		{"workspace as int", ev(evSet(entry, 0, 7)), at(0) + "workspace must be a string"},
		{"bad namespace", ev(evSet(entry, 1, "api\x00")), at(0) + `namespace "api\x00" is not 1 to 64 characters of [A-Za-z0-9_-]`},
		{"namespace nil", ev(evSet(entry, 1, nil)), at(0) + "namespace must be a string"},
		{"empty identifier", ev(evSet(entry, 2, []byte{})), at(0) + "identifier must be 1 to 512 bytes, got 0"},
		{"empty str identifier", ev(evSet(entry, 2, "")), at(0) + "identifier must be 1 to 512 bytes, got 0"},
		{"long identifier", ev(evSet(entry, 2, []byte(evLongID+"x"))), at(0) + "identifier must be 1 to 512 bytes, got 513"},
		{"identifier as int", ev(evSet(entry, 2, 12)), at(0) + "identifier must be a string"},
		{"duration too short", ev(entry, entry, entry, evSet(entry, 3, 10)), at(3) + "duration 10 out of range 1000..31622400000"},
		{"duration 999", ev(evSet(entry, 3, 999)), at(0) + "duration 999 out of range 1000..31622400000"},
		{"duration too long", ev(evSet(entry, 3, 31_622_400_001)), at(0) + "duration 31622400001 out of range 1000..31622400000"},
		{"negative duration", ev(evSet(entry, 3, -60000)), at(0) + "duration -60000 out of range 1000..31622400000"},
		{"duration as float", ev(evSet(entry, 3, 60000.0)), at(0) + "duration must be an integer"},
		{"duration as string", ev(evSet(entry, 3, "60000")), at(0) + "duration must be an integer"},
		{"negative sequence", ev(evSet(entry, 4, -1)), at(0) + "sequence -1 out of range 0..9223372036854775807"},
		{"huge sequence", ev(evSet(entry, 4, uint64(1<<63))), at(0) + "sequence 9223372036854775808 out of range 0..9223372036854775807"},
		{"sequence nil", ev(evSet(entry, 4, nil)), at(0) + "sequence must be an integer"},
	}
	// An entry cut in the middle of an integer.
	cut := evMP(evSet(entry, 4, uint64(1<<40)))
	cut = cut[:bytes.IndexByte(cut, 0xcf)+3]
	cases = append(cases, evBad{"cut integer", evMP(evMap{{"v", 1}, {c.key, append(evRaw{0x91}, cut...)}}), at(0) + "malformed msgpack: unexpected end of data"})
	// The fields after the cell.
	for j, name := range tail {
		i := 5 + j
		switch name {
		case "region":
			cases = append(cases,
				evBad{"empty region", ev(evSet(entry, i, "")), at(0) + `region "" is not 1 to 64 characters of [A-Za-z0-9_-]`},
				evBad{"bad region", ev(evSet(entry, i, "eu west")), at(0) + `region "eu west" is not 1 to 64 characters of [A-Za-z0-9_-]`},
				evBad{"region as bool", ev(evSet(entry, i, true)), at(0) + "region must be a string"},
			)
		case "expire_at":
			cases = append(cases,
				evBad{"negative expire_at", ev(evSet(entry, i, -1)), at(0) + "expire_at -1 out of range 0..9223372036854775807"},
				evBad{"min expire_at", ev(evSet(entry, i, int64(math.MinInt64))), at(0) + "expire_at -9223372036854775808 out of range 0..9223372036854775807"},
				evBad{"huge expire_at", ev(evSet(entry, i, uint64(math.MaxUint64))), at(0) + "expire_at 18446744073709551615 out of range 0..9223372036854775807"},
				evBad{"expire_at as string", ev(evSet(entry, i, "soon")), at(0) + "expire_at must be an integer"},
			)
		default:
			cases = append(cases,
				evBad{"negative " + name, ev(entry, evSet(entry, i, -5)), at(1) + name + " -5 out of range 0..4611686018427387904"},
				evBad{"too large " + name, ev(evSet(entry, i, uint64(1<<62+1))), at(0) + name + " 4611686018427387905 out of range 0..4611686018427387904"},
				evBad{"huge " + name, ev(evSet(entry, i, uint64(math.MaxUint64))), at(0) + name + " 18446744073709551615 out of range 0..4611686018427387904"},
				evBad{name + " as bool", ev(evSet(entry, i, false)), at(0) + name + " must be an integer"},
				evBad{name + " as array", ev(evSet(entry, i, []any{1})), at(0) + name + " must be an integer"},
			)
		}
	}
	if c.chunk {
		cases = append(cases,
			evBad{"missing more", evMP(evEvent(c.key, entry)), `missing more "m"`},
			evBad{"more as int", evMP(append(evEvent(c.key, entry), evKV{"m", 1})), `more "m" must be a boolean`},
			evBad{"more nil", evMP(append(evEvent(c.key, entry), evKV{"m", nil})), `more "m" must be a boolean`},
			evBad{"duplicate more", evMP(append(evEvent(c.key, entry), evKV{"m", true}, evKV{"m", true})), `duplicate field "m"`},
		)
	}
	return cases
}

func TestEventDecodeErrors(t *testing.T) {
	for _, c := range evCodecs() {
		t.Run(c.name, func(t *testing.T) {
			for _, tc := range evMalformed(c) {
				got, err := c.decode(tc.in)
				if err == nil {
					t.Errorf("%s: accepted %x as %+v", tc.name, tc.in, got)
					continue
				}
				if want := c.prefix + tc.want; err.Error() != want {
					t.Errorf("%s: error\n%q\nwant\n%q", tc.name, err, want)
				}
				if errors.Unwrap(err) != nil {
					t.Errorf("%s: error wraps %v", tc.name, errors.Unwrap(err))
				}
				if _, ok := err.(*wire.BadRequestError); !ok {
					t.Errorf("%s: error is a %T, not a *wire.BadRequestError", tc.name, err)
				}
				if !reflect.ValueOf(got).IsZero() {
					t.Errorf("%s: error with a non-zero value %+v", tc.name, got)
				}
			}
		})
	}
}

// TestEventDecodeTruncated checks that every strict prefix of valid events is
// rejected.
func TestEventDecodeTruncated(t *testing.T) {
	for _, c := range evCodecs() {
		for _, v := range c.samples {
			b := c.encode(nil, v)
			for n := 0; n < len(b); n++ {
				if got, err := c.decode(b[:n:n]); err == nil {
					t.Fatalf("%s: %d of %d bytes accepted as %+v", c.name, n, len(b), got)
				}
			}
		}
	}
}

// TestEventDecodeBoundaries checks the extreme valid values of every field,
// written in every integer form that holds them.
func TestEventDecodeBoundaries(t *testing.T) {
	entry := []any{evToken64, "a", []byte(evLongID), int64(window.MaxDuration), int64(math.MaxInt64), "Z", int64(window.MaxCount), uint64(math.MaxInt64)}
	cs, err := DecodeComponents(evMP(evEvent("c", entry, evSet(evSet(evSet(entry, 2, "\x00"), 3, int64(window.MinDuration)), 4, 0))))
	if err != nil {
		t.Fatal(err)
	}
	want := []global.Component{
		{Cell: window.Cell{Workspace: evToken64, Namespace: "a", Identifier: evLongID, Duration: window.MaxDuration, Sequence: math.MaxInt64}, Region: "Z", Count: window.MaxCount, ExpireAt: math.MaxInt64},
		{Cell: window.Cell{Workspace: evToken64, Namespace: "a", Identifier: "\x00", Duration: window.MinDuration, Sequence: 0}, Region: "Z", Count: window.MaxCount, ExpireAt: math.MaxInt64},
	}
	if !reflect.DeepEqual(cs, want) {
		t.Fatalf("decoded %+v", cs)
	}
}

// TestEventAllocations checks that encoders allocate only to grow dst and
// that decoders allocate the list and the strings, sharing repeated tokens.
func TestEventAllocations(t *testing.T) {
	cs := evBenchComponents(100)
	buf := AppendComponents(nil, cs)
	if n := testing.AllocsPerRun(50, func() { buf = AppendComponents(buf[:0], cs) }); n != 0 {
		t.Errorf("AppendComponents allocates %v times", n)
	}
	if n := testing.AllocsPerRun(50, func() { _ = AppendComponents(nil, cs) }); n != 1 {
		t.Errorf("AppendComponents(nil) allocates %v times, want 1", n)
	}
	body := AppendComponents(nil, cs)
	// The list and 100 identifiers: equal tokens of consecutive entries
	// share a string, and the others are interned.
	if n := testing.AllocsPerRun(50, func() { _, _ = DecodeComponents(body) }); n != 1+100 {
		t.Errorf("DecodeComponents allocates %v times, want %d", n, 1+100)
	}
	is := evImports()
	ib := AppendSnapshotChunk(nil, SnapshotChunk{Imports: is, More: true})
	if n := testing.AllocsPerRun(50, func() { ib = AppendSnapshotChunk(ib[:0], SnapshotChunk{Imports: is, More: true}) }); n != 0 {
		t.Errorf("AppendSnapshotChunk allocates %v times", n)
	}
}
