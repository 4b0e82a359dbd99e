package policy

import (
	"cmp"
	"slices"
	"strings"
)

// applied is an override as the view keeps it for Match: its values and
// the pattern it was set under (the entry's own string), which names it.
type applied struct {
	Override
	Pattern string
}

// ComparePatterns orders valid patterns by precedence: negative when a wins
// over b for an identifier that both match, positive when b wins, 0 only
// when a == b. It is a total order: more literal (non-'*') bytes first;
// then fewer '*'; then the longer literal prefix (the bytes before the
// first '*'); then byte order of the patterns. An exact pattern, when it
// matches, has as many literal bytes as the identifier and no '*', so it
// always wins; among prefix patterns ("user_*") the longest wins, as it
// did before '*' could appear elsewhere; and a prefix pattern wins over
// any other pattern with as many literal bytes.
func ComparePatterns(a, b string) int {
	ga, gb := newGlob(applied{Pattern: a}), newGlob(applied{Pattern: b})
	return ga.cmp(gb)
}

// MatchPattern reports whether valid pattern p matches identifier id:
// literally, where each '*' of p matches any run of bytes (possibly
// empty).
func MatchPattern(p, id string) bool {
	return newGlob(applied{Pattern: p}).match(id)
}

// glob is a pattern with a '*' somewhere other than (only) at its end, as
// the tree keeps it under its literal prefix. Never changed once made.
type glob struct {
	applied
	// segs are the literal runs of the pattern around its '*'s, in order:
	// segs[0] before the first, segs[len(segs)-1] after the last (either
	// may be empty); len(segs)-1 is the number of '*'.
	segs []string
	// literal is how many bytes of the pattern are not '*'.
	literal int
}

func newGlob(a applied) *glob {
	segs := strings.Split(a.Pattern, "*")
	return &glob{applied: a, segs: segs, literal: len(a.Pattern) - (len(segs) - 1)}
}

// match reports whether id matches g: it starts with the first run, ends
// with the last, and holds the runs between in order, without overlap.
// Taking each inner run at its leftmost place is enough: a '*' matches any
// bytes, so leaving more room to the right never hurts. It allocates
// nothing.
func (g *glob) match(id string) bool {
	if len(id) < g.literal {
		return false
	}
	first, last := g.segs[0], g.segs[len(g.segs)-1]
	if len(g.segs) == 1 {
		return id == first
	}
	if !strings.HasPrefix(id, first) || !strings.HasSuffix(id, last) {
		return false
	}
	// len(id) >= g.literal >= len(first)+len(last): the ends do not overlap.
	mid := id[len(first) : len(id)-len(last)]
	for _, s := range g.segs[1 : len(g.segs)-1] {
		i := strings.Index(mid, s)
		if i < 0 {
			return false
		}
		mid = mid[i+len(s):]
	}
	return true
}

// cmp is ComparePatterns of g's and h's patterns.
func (g *glob) cmp(h *glob) int {
	if c := cmp.Compare(h.literal, g.literal); c != 0 {
		return c
	}
	if c := cmp.Compare(len(g.segs), len(h.segs)); c != 0 {
		return c
	}
	if c := cmp.Compare(len(h.segs[0]), len(g.segs[0])); c != 0 {
		return c
	}
	return strings.Compare(g.Pattern, h.Pattern)
}

// globsWith returns a copy of gs (ordered by cmp, best first) without the
// glob of pattern p, and with g in its place when g is not nil.
func globsWith(gs []*glob, p string, g *glob) []*glob {
	out := make([]*glob, 0, len(gs)+1)
	for _, x := range gs {
		if x.Pattern != p {
			out = append(out, x)
		}
	}
	if g == nil {
		if len(out) == 0 {
			return nil
		}
		return out
	}
	i, _ := slices.BinarySearchFunc(out, g, (*glob).cmp)
	return slices.Insert(out, i, g)
}
