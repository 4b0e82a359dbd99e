package event

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bus/wire"
)

// evCodecNamed returns the codec of evCodecs named name.
func evCodecNamed(name string) *evCodec {
	for _, c := range evCodecs() {
		if c.name == name {
			return c
		}
	}
	panic("no codec " + name)
}

// evLen returns how many entries v holds.
func evLen(v any) int {
	switch v := v.(type) {
	case SnapshotChunk:
		return len(v.Imports)
	default:
		return reflect.ValueOf(v).Len()
	}
}

// evSeeds returns the seed corpus of codec c: its valid events, the same
// events in forms the encoder does not write, every event of the other
// kinds, and near misses (the malformed table, cut and altered events).
func evSeeds(c *evCodec) [][]byte {
	var seeds [][]byte
	for _, v := range c.samples {
		seeds = append(seeds, c.encode(nil, v))
	}
	// Accepted forms the encoder does not write.
	wide := []any{"acme", "api", "user:1", int64(60000), uint64(28_333_333)}
	for _, f := range c.entry[5:] {
		if i, ok := f.(int); ok {
			f = int64(i)
		}
		wide = append(wide, f)
	}
	seeds = append(seeds,
		evMP(c.event(c.entry)),
		evMP(c.event(append(append([]any(nil), c.entry...), 1_700_000_000_000))), // a reset's cell
		evMP(c.event(wide, c.entry)),
		evMP(append(evMap{{"x", evMap{{"y", []any{1, nil, "z", 2.5}}}}}, c.event(c.entry, c.entry)...)),
		evMP(append(c.event(c.entry), evKV{"future", []any{true}})),
	)
	// Events of the other kinds.
	for _, o := range evCodecs() {
		if o.name != c.name {
			seeds = append(seeds, o.encode(nil, o.samples[len(o.samples)-1]))
		}
	}
	// Near misses.
	for _, bad := range evMalformed(c) {
		seeds = append(seeds, bad.in)
	}
	for _, v := range c.samples {
		b := c.encode(nil, v)
		if len(b) < 12 {
			continue
		}
		seeds = append(seeds, b[:len(b)-1], b[:len(b)/2])
		for _, at := range []int{1, 3, 6, len(b) / 3, len(b) - 2} {
			alt := bytes.Clone(b)
			alt[at] ^= 0x01
			seeds = append(seeds, alt)
		}
	}
	return seeds
}

// evFuzz checks the decoder of codec c on any input: it never panics, an
// error comes with the zero value and a message, and anything accepted
// satisfies every rule, does not alias the input and round-trips: its
// encoding decodes to the same value, which encodes to the same bytes.
func evFuzz(f *testing.F, c *evCodec) {
	for _, s := range evSeeds(c) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		v, err := c.decode(in)
		if err != nil {
			if !reflect.ValueOf(v).IsZero() {
				t.Fatalf("error %q with a non-zero value %+v", err, v)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, c.prefix) || len(msg) == len(c.prefix) {
				t.Fatalf("error %q does not start with %q and say what is wrong", msg, c.prefix)
			}
			if _, ok := err.(*wire.BadRequestError); !ok {
				t.Fatalf("error %q is a %T, not a *wire.BadRequestError", err, err)
			}
			return
		}
		if evIsNil(v) {
			t.Fatalf("decoded a nil list")
		}
		if n := evLen(v); n > MaxEntries {
			t.Fatalf("%d entries accepted", n)
		}
		c.check(t, v)
		enc := c.encode(nil, v)
		v2, err := c.decode(enc)
		if err != nil {
			t.Fatalf("re-encoded %+v as %x, which fails: %v", v, enc, err)
		}
		if !reflect.DeepEqual(v, v2) {
			t.Fatalf("round trip changed\n%+v\ninto\n%+v", v, v2)
		}
		if enc2 := c.encode(nil, v2); !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encoding changed\n%x\ninto\n%x", enc, enc2)
		}
		for i := range in {
			in[i] ^= 0xff
		}
		if !reflect.DeepEqual(v, v2) {
			t.Fatalf("decoded value changed with the input buffer")
		}
	})
}

func FuzzDecodeComponents(f *testing.F) { evFuzz(f, evCodecNamed("components")) }

func FuzzDecodeImports(f *testing.F) { evFuzz(f, evCodecNamed("imports")) }

func FuzzDecodeSnapshotChunk(f *testing.F) { evFuzz(f, evCodecNamed("snapshot chunk")) }
