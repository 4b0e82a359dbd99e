package policy

// node is one point of a radix tree of the prefix patterns of one
// namespace: the bytes on the edge into it, the override of the prefix that
// ends here (if has), and its children, ordered by the first byte of their
// labels (no two share one). A tree is never changed once published: with
// returns a new root that shares every node off the changed path, so any
// number of goroutines may read the old and the new tree while a writer
// builds the next. Finding the longest prefix of an identifier walks one
// node per prefix on the identifier's path and allocates nothing.
type node struct {
	label string
	val   Override
	has   bool
	first []byte
	kids  []*node
}

// with returns a tree in which prefix s (relative to n) has override o
// (has) or none (!has), copying only the nodes on s's path.
func (n *node) with(s string, o Override, has bool) *node {
	c := *n
	if s == "" {
		c.val, c.has = o, has
		if !has {
			c.val = Override{}
		}
		return &c
	}
	i, found := n.child(s[0])
	if !found {
		if !has {
			return n
		}
		c.first = insertAt(n.first, i, s[0])
		c.kids = insertAt(n.kids, i, &node{label: s, val: o, has: true})
		return &c
	}
	k := n.kids[i]
	l := commonPrefix(k.label, s)
	var nk *node
	if l < len(k.label) {
		if !has {
			return n // s is not in the tree
		}
		// Split k's edge at l: a new node takes the common part.
		rest := *k
		rest.label = k.label[l:]
		mid := &node{label: k.label[:l], first: []byte{rest.label[0]}, kids: []*node{&rest}}
		nk = mid.with(s[l:], o, true)
	} else {
		nk = k.with(s[l:], o, has)
		if nk == k {
			return n
		}
	}
	c.first, c.kids = n.first, n.kids
	if !nk.has && len(nk.kids) == 0 {
		c.first = removeAt(n.first, i)
		c.kids = removeAt(n.kids, i)
	} else {
		c.kids = append([]*node(nil), n.kids...)
		c.kids[i] = nk
	}
	return &c
}

// insertAt returns a copy of xs with v inserted at i.
func insertAt[T any](xs []T, i int, v T) []T {
	out := make([]T, 0, len(xs)+1)
	out = append(out, xs[:i]...)
	out = append(out, v)
	return append(out, xs[i:]...)
}

// removeAt returns a copy of xs without its element i.
func removeAt[T any](xs []T, i int) []T {
	out := make([]T, 0, len(xs)-1)
	out = append(out, xs[:i]...)
	return append(out, xs[i+1:]...)
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

// longest returns the override of the longest prefix of id in the tree
// rooted at n.
func (n *node) longest(id string) (Override, bool) {
	best, ok := n.val, n.has
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
			best, ok = n.val, true
		}
	}
	return best, ok
}

// empty reports whether the tree rooted at n holds no prefix.
func (n *node) empty() bool { return !n.has && len(n.kids) == 0 }

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
