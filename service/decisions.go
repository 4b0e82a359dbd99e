package service

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"
)

// MaxSeries bounds the (workspace, namespace) pairs whose decisions are
// counted apart (Service.Decisions, Service.ShadowDenials); past it they
// are counted under workspace "_other" and namespace "_other", so a
// tenant that invents namespaces cannot grow the process's memory or its
// metrics without bound.
const MaxSeries = 1000

// OtherSeries is the workspace and namespace the pairs past MaxSeries are
// counted under.
const OtherSeries = "_other"

// DecisionSink receives the decisions of checks as they are made
// (Config.Decisions). Decided runs on the check's path: it must return at
// once, never wait, and not keep q's strings past the call (they may
// alias a request's buffer); copy what it keeps.
type DecisionSink interface {
	Decided(q Query, d Decision)
}

// seriesStripes is how many stripes a pair's counts are spread over, by
// the identifier's hash: checks of different identifiers of one namespace
// on different cores add to different cache lines.
const seriesStripes = 8

// seriesStripe is one stripe of a pair's counts, a cache line of its own.
type seriesStripe struct {
	admitted, denied, shadow atomic.Int64
	_                        [40]byte
}

// seriesCount counts one pair's decisions.
type seriesCount struct {
	stripes [seriesStripes]seriesStripe
}

// stripe returns the stripe of an identifier whose bucket hash is h.
func (n *seriesCount) stripe(h uint64) *seriesStripe { return &n.stripes[h%seriesStripes] }

// totals sums the stripes.
func (n *seriesCount) totals() (admitted, denied, shadow int64) {
	for i := range n.stripes {
		st := &n.stripes[i]
		admitted += st.admitted.Load()
		denied += st.denied.Load()
		shadow += st.shadow.Load()
	}
	return admitted, denied, shadow
}

// seriesCounts counts decisions by workspace and namespace. Lookups read a
// map that is copied on each new pair (at most MaxSeries copies), and a
// bucket keeps its pair's counts once found, so a warm check pays an
// atomic load and an atomic add on its identifier's stripe, never a lock.
type seriesCounts struct {
	by    atomic.Pointer[map[[2]string]*seriesCount]
	mu    sync.Mutex // serialises new pairs
	other seriesCount
}

func (c *seriesCounts) get(ws, ns string) *seriesCount {
	k := [2]string{ws, ns}
	if m := c.by.Load(); m != nil {
		if n := (*m)[k]; n != nil {
			return n
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[[2]string]*seriesCount
	if m := c.by.Load(); m != nil {
		old = *m
	}
	if n := old[k]; n != nil {
		return n
	}
	if len(old) >= MaxSeries {
		return &c.other
	}
	m := make(map[[2]string]*seriesCount, len(old)+1)
	maps.Copy(m, old)
	n := new(seriesCount)
	m[[2]string{strings.Clone(ws), strings.Clone(ns)}] = n
	c.by.Store(&m)
	return n
}

// of returns the counts of b's workspace and namespace, kept in b after
// the first lookup.
func (c *seriesCounts) of(b *bucket) *seriesCount {
	if n := b.series.Load(); n != nil {
		return n
	}
	n := c.get(b.key.workspace, b.key.namespace)
	b.series.Store(n)
	return n
}

// SeriesDecisions is what one (workspace, namespace) pair's checks were
// answered since the process started.
type SeriesDecisions struct {
	Workspace, Namespace string
	// Admitted counts checks admitted; Denied checks denied and answered
	// as denied; ShadowDenied checks shadow mode answered as a success
	// where enforcement would have denied them.
	Admitted, Denied, ShadowDenied int64
}

// Decisions calls yield with each (workspace, namespace) pair's counts of
// decisions, at most MaxSeries pairs and then the rest under OtherSeries,
// until yield returns false. A look counts as the decision it answered.
func (s *Service) Decisions(yield func(SeriesDecisions) bool) {
	c := &s.series
	var rows []SeriesDecisions
	if m := c.by.Load(); m != nil {
		rows = make([]SeriesDecisions, 0, len(*m)+1)
		for k, n := range *m {
			a, d, sh := n.totals()
			rows = append(rows, SeriesDecisions{k[0], k[1], a, d, sh})
		}
	}
	a, d, sh := c.other.totals()
	if a+d+sh > 0 {
		rows = append(rows, SeriesDecisions{OtherSeries, OtherSeries, a, d, sh})
	}
	for _, r := range rows {
		if !yield(r) {
			return
		}
	}
}

// ShadowDenials calls yield with the number of checks shadow mode
// answered as a success where enforcement would have denied them, by
// workspace and namespace (at most MaxSeries pairs, the rest under
// OtherSeries), until yield returns false. Pairs with none are left out.
func (s *Service) ShadowDenials(yield func(workspace, namespace string, n int64) bool) {
	for r := range s.Decisions {
		if r.ShadowDenied == 0 {
			continue
		}
		if !yield(r.Workspace, r.Namespace, r.ShadowDenied) {
			return
		}
	}
}
