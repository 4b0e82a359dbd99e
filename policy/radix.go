package policy

import "slices"

// node is one point of a radix tree: the bytes on the edge into it, what
// ends here, and its children, ordered by the first byte of their labels
// (no two share one). Two kinds of tree are made of nodes:
//
//   - A namespace's tree holds its wildcard patterns by their literal
//     prefix (the bytes before the first '*'): at a node, the prefix
//     pattern whose prefix ends there (val, if has), and in sfx a suffix
//     tree of the globs (the other wildcard patterns) whose literal prefix
//     ends there.
//   - A suffix tree holds globs by their literal suffix (the bytes after
//     the last '*'), read backwards: labels hold the suffix's bytes in
//     reverse, and a node's globs (best first by glob.cmp) are those whose
//     reversed suffix ends there.
//
// A tree is never changed once published: with returns a new root that
// shares every node off the changed path, so any number of goroutines may
// read the old and the new tree while a writer builds the next. Finding
// the longest prefix of an identifier walks one node per prefix on the
// identifier's path and allocates nothing; so does finding the best pattern
// (best), which at each node of that path with globs walks its suffix tree
// along the identifier's end, so the only globs it tries are those whose
// literal prefix and suffix both match.
type node struct {
	label string
	val   applied
	has   bool
	first []byte
	kids  []*node
	sfx   *node
	globs []*glob
}

// with returns a tree in which the node of s (relative to n) is what edit
// makes of a copy of it, copying only the nodes on s's path. When s has no
// node, one is made if grow, else n itself is returned. A node that ends
// up with no pattern and no child is taken out.
func (n *node) with(s string, edit func(*node), grow bool) *node {
	c := *n
	if s == "" {
		edit(&c)
		return &c
	}
	i, found := n.child(s[0])
	if !found {
		if !grow {
			return n
		}
		nk := &node{label: s}
		edit(nk)
		c.first = slices.Concat(n.first[:i], []byte{s[0]}, n.first[i:]) // a copy: n is shared
		c.kids = slices.Concat(n.kids[:i], []*node{nk}, n.kids[i:])
		return &c
	}
	k := n.kids[i]
	l := commonPrefix(k.label, s)
	var nk *node
	if l < len(k.label) {
		if !grow {
			return n // s is not in the tree
		}
		// Split k's edge at l: a new node takes the common part.
		rest := *k
		rest.label = k.label[l:]
		mid := &node{label: k.label[:l], first: []byte{rest.label[0]}, kids: []*node{&rest}}
		nk = mid.with(s[l:], edit, true)
	} else {
		nk = k.with(s[l:], edit, grow)
		if nk == k {
			return n
		}
	}
	if nk.empty() {
		c.first = slices.Concat(n.first[:i], n.first[i+1:])
		c.kids = slices.Concat(n.kids[:i], n.kids[i+1:])
	} else {
		c.kids = append([]*node(nil), n.kids...)
		c.kids[i] = nk
	}
	return &c
}

// child returns the index of n's child whose label starts with b, or where
// one would be inserted.
func (n *node) child(b byte) (int, bool) {
	if len(n.first) <= 16 {
		for i, f := range n.first {
			if f >= b {
				return i, f == b
			}
		}
		return len(n.first), false
	}
	lo, hi := 0, len(n.first)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.first[m] < b {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(n.first) && n.first[lo] == b
}

// longest returns the prefix pattern of the longest prefix of id in the
// tree rooted at n (nil: none), as the node holds it. It ignores globs:
// Match calls it only for namespaces without any.
func (n *node) longest(id string) *applied {
	var best *applied
	if n.has {
		best = &n.val
	}
	for len(id) > 0 {
		i, found := n.child(id[0])
		if !found {
			break
		}
		c := n.kids[i]
		if len(id) < len(c.label) || id[:len(c.label)] != c.label {
			break
		}
		id = id[len(c.label):]
		n = c
		if n.has {
			best = &n.val
		}
	}
	return best
}

// best returns the wildcard pattern of the tree rooted at n that takes
// precedence (ComparePatterns) among those matching id (nil: none), as the
// tree holds it. Only the patterns of the nodes on id's path can match
// (their literal prefix starts id), and of their globs only those of the
// suffix tree's nodes on id's end. A prefix pattern wins over every glob
// with as many literal bytes, so a glob must have more than the deepest
// prefix pattern found. It allocates nothing.
func (n *node) best(id string) *applied {
	var (
		pre    *node // the deepest node on the path with a prefix pattern
		preLen = -1  // its literal bytes; -1: none yet
		win    *glob // the best glob that matches
	)
	rest, depth := id, 0
	for {
		if n.has {
			pre, preLen = n, depth
		}
		if n.sfx != nil {
			win = n.sfx.suffixed(id, win, preLen)
		}
		if len(rest) == 0 {
			break
		}
		i, found := n.child(rest[0])
		if !found {
			break
		}
		c := n.kids[i]
		if len(rest) < len(c.label) || rest[:len(c.label)] != c.label {
			break
		}
		rest = rest[len(c.label):]
		depth += len(c.label)
		n = c
	}
	switch {
	case win != nil && win.literal > preLen:
		return &win.applied
	case pre != nil:
		return &pre.val
	}
	return nil
}

// suffixed returns the best of win and the globs of the suffix tree rooted
// at n that match id and have more than floor literal bytes. It walks the
// nodes whose reversed labels id ends with, trying each node's globs best
// first until one matches or none of the rest can win.
func (n *node) suffixed(id string, win *glob, floor int) *glob {
	rest := id
	for {
		for _, g := range n.globs {
			if g.literal <= floor || win != nil && g.cmp(win) >= 0 {
				break // ordered: no later glob of n wins either
			}
			if g.match(id) {
				win = g
				break
			}
		}
		if len(rest) == 0 {
			return win
		}
		i, found := n.child(rest[len(rest)-1])
		if !found {
			return win
		}
		c := n.kids[i]
		if len(rest) < len(c.label) {
			return win
		}
		for k := 0; k < len(c.label); k++ {
			if c.label[k] != rest[len(rest)-1-k] {
				return win
			}
		}
		rest = rest[:len(rest)-len(c.label)]
		n = c
	}
}

// empty reports whether n holds no pattern and no child.
func (n *node) empty() bool {
	return !n.has && len(n.kids) == 0 && n.sfx == nil && len(n.globs) == 0
}

// reversed returns s's bytes in reverse order.
func reversed(s string) string {
	b := make([]byte, len(s))
	for i := range len(s) {
		b[len(s)-1-i] = s[i]
	}
	return string(b)
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
