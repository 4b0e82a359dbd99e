package event

import (
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// An entry of a reset's cell carries the cell's epoch as one more, last
// element, and comes back with it; an entry of a cell never reset has its
// fields only (its bytes are the golden ones, TestEventGolden).
func TestEventEpochIsAnOptionalLastElement(t *testing.T) {
	c := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "user:1", Duration: 60000, Sequence: 28_333_333}
	reset := c
	reset.Epoch = 28_333_333*60000 + 1234
	cs := []global.Component{{Cell: reset, Region: "eu", Count: 5, ExpireAt: 9}, {Cell: c, Region: "eu", Count: 6, ExpireAt: 9}}
	is := []global.Import{{Cell: c, Foreign: 1, Own: 2, ExpireAt: 9}, {Cell: reset, Foreign: 3, Own: 4, ExpireAt: 9}}

	b := AppendComponents(nil, cs)
	if got, err := DecodeComponents(b); err != nil || !reflect.DeepEqual(got, cs) {
		t.Fatalf("components: %+v, %v", got, err)
	}
	plain := AppendComponents(nil, cs[1:])
	if got := AppendComponents(nil, []global.Component{cs[1]}); string(got) != string(plain) {
		t.Fatal("a component of a cell never reset changed")
	}
	// The first entry: 9 elements, the epoch last.
	_, rest, _ := msgp.ReadMapHeaderBytes(b)
	for range 3 { // "v", 1, "c"
		rest, _ = msgp.Skip(rest)
	}
	_, rest, _ = msgp.ReadArrayHeaderBytes(rest)
	n, rest, err := msgp.ReadArrayHeaderBytes(rest)
	if err != nil || n != componentFields+1 {
		t.Fatalf("a reset's component has %d elements, %v", n, err)
	}
	for range componentFields {
		rest, _ = msgp.Skip(rest)
	}
	if e, _, err := msgp.ReadUint64Bytes(rest); err != nil || int64(e) != reset.Epoch {
		t.Fatalf("last element %d, %v; want the epoch", e, err)
	}
	if got, err := DecodeImports(AppendImports(nil, is)); err != nil || !reflect.DeepEqual(got, is) {
		t.Fatalf("imports: %+v, %v", got, err)
	}
	chunk := SnapshotChunk{Imports: is, More: true}
	if got, err := DecodeSnapshotChunk(AppendSnapshotChunk(nil, chunk)); err != nil || !reflect.DeepEqual(got, chunk) {
		t.Fatalf("snapshot chunk: %+v, %v", got, err)
	}
}
