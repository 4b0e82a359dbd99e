package event

import (
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// evBenchComponents returns n components of one region, namespace and
// window, as a limiter publishes them.
func evBenchComponents(n int) []global.Component {
	cs := make([]global.Component, n)
	for i := range cs {
		cs[i] = global.Component{
			Cell: window.Cell{
				Workspace: "acme", Namespace: "api", Identifier: "user:" + strconv.Itoa(100000+i),
				Duration: 60000, Sequence: 28_333_333,
			},
			Region: "eu-west-1", Count: int64(i * 37), ExpireAt: 1_700_000_120_000,
		}
	}
	return cs
}

// The benchmarks use 1000 entries, the most a limiter or a bridge puts in
// one message.

func BenchmarkAppendComponents(b *testing.B) {
	cs := evBenchComponents(1000)
	buf := AppendComponents(nil, cs)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendComponents(buf[:0], cs)
	}
}

// BenchmarkAppendComponentsNew encodes into a new buffer each time, as the
// transport does.
func BenchmarkAppendComponentsNew(b *testing.B) {
	cs := evBenchComponents(1000)
	b.SetBytes(int64(len(AppendComponents(nil, cs))))
	b.ReportAllocs()
	for b.Loop() {
		_ = AppendComponents(nil, cs)
	}
}

func BenchmarkDecodeComponents(b *testing.B) {
	body := AppendComponents(nil, evBenchComponents(1000))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeComponents(body); err != nil {
			b.Fatal(err)
		}
	}
}

// evBenchPolicies returns a policies event of n overrides and n reset marks
// of one namespace, as a bridge's snapshot chunk carries them.
func evBenchPolicies(n int) Policies {
	p := Policies{Overrides: make([]policy.Entry, n), Marks: make([]policy.Mark, n), More: true, Digest: 0xdeadbeef, Seq: 42}
	for i := range n {
		p.Overrides[i] = policy.Entry{
			Key:      policy.Key{Workspace: "acme", Namespace: "api", Pattern: "user:" + strconv.Itoa(100000+i) + "*"},
			Override: policy.Override{Limit: int64(100 + i), Duration: 60000},
			Version:  policy.Version{At: 1_700_000_000_000 + int64(i), Origin: "eu-west-1"},
		}
		p.Marks[i] = policy.Mark{Workspace: "acme", Namespace: "api", Identifier: "user:" + strconv.Itoa(100000+i),
			Duration: 60000, Epoch: 1_700_000_000_000 + int64(i)}
	}
	return p
}

func BenchmarkAppendPolicies(b *testing.B) {
	p := evBenchPolicies(1000)
	buf := AppendPolicies(nil, p)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPolicies(buf[:0], p)
	}
}

func BenchmarkDecodePolicies(b *testing.B) {
	body := AppendPolicies(nil, evBenchPolicies(1000))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodePolicies(body); err != nil {
			b.Fatal(err)
		}
	}
}
