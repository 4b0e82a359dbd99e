package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// recordSink keeps every decision handed to it.
type recordSink struct {
	mu  sync.Mutex
	got []string
}

func (r *recordSink) Decided(q Query, d Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%s/%s/%s admitted=%v shadow=%v limit=%d", q.Workspace, q.Namespace, q.Identifier, d.Admitted, d.Shadow, d.Limit))
}

func seriesOf(s *Service) map[string]SeriesDecisions {
	out := map[string]SeriesDecisions{}
	for r := range s.Decisions {
		out[r.Workspace+"/"+r.Namespace] = r
	}
	return out
}

// Every way into the service (a check, a try, a local check, a batch, a
// shadow check) counts its decisions by workspace and namespace and hands
// each to the sink, once.
func TestEveryDecisionIsCountedByNamespaceAndHandedToTheSink(t *testing.T) {
	sink := &recordSink{}
	s := newService(t, Config{Decisions: sink})
	ctx := context.Background()
	q := query("a", 2, 1)
	for range 3 {
		mustCheck(t, s, q) // admitted, admitted, denied
	}
	if _, ok, err := s.TryCheck(q); !ok || err != nil {
		t.Fatalf("TryCheck: ok %v err %v", ok, err)
	}
	if _, err := s.CheckLocal(q); err != nil {
		t.Fatal(err)
	}
	other := Query{Workspace: "ws", Namespace: "other", Identifier: "b", Limit: 1, Duration: 60_000, Cost: 1}
	if _, _, err := s.Batch(ctx, []Query{other, other}); err != nil { // a batch over its limit: both denied
		t.Fatal(err)
	}
	sh := query("c", 0, 1)
	sh.Shadow = true
	mustCheck(t, s, sh)

	got := seriesOf(s)
	if want := (SeriesDecisions{"ws", "ns", 2, 3, 1}); got["ws/ns"] != want {
		t.Errorf("ws/ns counted %+v, want %+v", got["ws/ns"], want)
	}
	if want := (SeriesDecisions{"ws", "other", 0, 2, 0}); got["ws/other"] != want {
		t.Errorf("ws/other counted %+v, want %+v", got["ws/other"], want)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.got) != 8 {
		t.Fatalf("the sink received %d decisions, want 8: %q", len(sink.got), sink.got)
	}
	if want := "ws/ns/c admitted=false shadow=true limit=0"; sink.got[7] != want {
		t.Errorf("the shadow decision reached the sink as %q, want %q", sink.got[7], want)
	}
	var shadow int64
	s.ShadowDenials(func(ws, ns string, n int64) bool { shadow += n; return true })
	if shadow != 1 {
		t.Errorf("ShadowDenials counted %d, want 1", shadow)
	}
}

// Past MaxSeries pairs, decisions are counted under OtherSeries: a tenant
// inventing namespaces cannot grow the counts without bound.
func TestDecisionCountsAreBounded(t *testing.T) {
	s := newService(t, Config{})
	for i := range MaxSeries + 10 {
		q := Query{Workspace: "ws", Namespace: fmt.Sprint("n", i), Identifier: "x", Limit: 10, Duration: 60_000, Cost: 1}
		mustCheck(t, s, q)
	}
	got := seriesOf(s)
	if len(got) != MaxSeries+1 {
		t.Fatalf("%d series, want %d and %s", len(got), MaxSeries, OtherSeries)
	}
	if o := got[OtherSeries+"/"+OtherSeries]; o.Admitted != 10 {
		t.Errorf("%s counted %d admissions, want 10", OtherSeries, o.Admitted)
	}
}

// A warm check stays free of allocations with the counts (and without a
// sink).
func TestAWarmCheckAllocatesNothingWithTheCounts(t *testing.T) {
	s := newService(t, Config{})
	q := query("warm", 1<<40, 1)
	mustCheck(t, s, q)
	if n := testing.AllocsPerRun(100, func() {
		if _, ok, err := s.TryCheck(q); !ok || err != nil {
			t.Fatalf("TryCheck: ok %v err %v", ok, err)
		}
	}); n != 0 {
		t.Errorf("a warm check allocates %v times", n)
	}
}
