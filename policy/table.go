package policy

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
)

// Table holds the overrides of every workspace, with the tombstones of
// deleted ones. Safe for concurrent use; the zero value is not usable, call
// NewTable.
//
// Match reads an immutable view with one atomic load and never waits on a
// writer. Writers (Set, Delete, Merge) serialize on a mutex and publish a
// new view that shares everything they did not change: a change of an exact
// pattern copies one shard of its namespace's map (at most 1/64 of it, or a
// map of fewer than 512 entries), a change of a wildcard pattern copies the
// nodes on the path of its literal prefix in the namespace's radix tree
// (and, for a glob, the nodes on the path of its literal suffix in the
// suffix tree there, with the list of globs of that prefix and suffix). So
// a flood of changes costs each a small part of its namespace, never the
// whole table.
type Table struct {
	view atomic.Pointer[view]
	seed maphash.Seed

	// ledger counts the live entries per workspace; dead counts the
	// tombstones.
	ledger
	nss  map[nsKey]*nsState
	dead map[string]int
	// oldestDead is at most the oldest tombstone's version (MaxInt64: no
	// tombstone; 0 until the first Prune), so Prune has nothing to walk
	// for while its cutoff is not past it.
	oldestDead int64
}

// nsKey names a namespace of a workspace.
type nsKey struct{ ws, ns string }

// nsState is the writers' copy of one namespace: every entry, by pattern,
// how many are live exact patterns and live globs (wildcard patterns other
// than prefixes), and the patterns in byte order for Page (nil until a
// page needs them, and again once a pattern comes or goes; a change of an
// existing pattern's entry keeps it).
type nsState struct {
	entries   map[string]Entry
	liveExact int
	liveGlobs int
	sorted    []string
}

// view is what Match reads: workspace → namespace → overrides. The map of
// workspaces is never changed once published; a change of a workspace
// that stays swaps that workspace's map of namespaces (wsView), so a
// change costs the namespaces of its workspace, never every workspace.
// The view's generation grows with every change.
type view struct {
	ws  map[string]*wsView
	gen uint64
}

// wsView holds the current map of one workspace's namespaces that have a
// live override. A map, once stored, is never changed.
type wsView struct {
	nss atomic.Pointer[map[string]*nsView]
}

// nsView is the live overrides of one namespace: exact patterns in one map,
// or in exactShards maps chosen by a hash of the identifier once there are
// shardFrom of them (nil: none); wildcard patterns in a radix tree by their
// literal prefix (nil: none); globs, whether any of them is a glob (a
// pattern other than a prefix), so that a namespace without one walks the
// tree as for prefixes alone. Never changed once published.
type nsView struct {
	exact []map[string]exactVal
	tree  *node
	globs bool
}

// exactVal is the override of an exact pattern as its map holds it: the
// limit, the duration (negated in shadow mode) and the pattern (the
// entry's string). Packed in 32 bytes, so that Match copies it in
// registers: 40 bytes would go through memory, a measurable cost on the
// check path.
type exactVal struct {
	limit, dur int64
	pattern    string
}

func newExactVal(a applied) exactVal {
	v := exactVal{limit: a.Limit, dur: a.Duration, pattern: a.Pattern}
	if a.Shadow {
		v.dur = -v.dur
	}
	return v
}

func (v exactVal) override() Override {
	if v.dur < 0 {
		return Override{Limit: v.limit, Duration: -v.dur, Shadow: true}
	}
	return Override{Limit: v.limit, Duration: v.dur}
}

const (
	exactShards = 64
	shardFrom   = 512
)

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{seed: maphash.MakeSeed(), ledger: ledger{perWS: make(map[string]int)}, nss: make(map[nsKey]*nsState), dead: make(map[string]int)}
}

// Match returns the override a check of identifier in (workspace,
// namespace) applies and its pattern (the override's identity in the
// namespace, as set; the table's string, which a caller may keep): of the
// namespace's patterns that match identifier, the one that takes
// precedence by ComparePatterns (the exact pattern if there is one;
// otherwise the one with the most literal bytes, so the longest prefix
// among prefixes). ok is false when none matches. The answer depends only
// on the live patterns, never on the order they were set in. It allocates
// nothing and never waits on a writer; a namespace without patterns other
// than exact ones and prefixes is matched as before a '*' could appear
// elsewhere.
func (t *Table) Match(workspace, namespace, identifier string) (o Override, pattern string, ok bool) {
	v := t.view.Load()
	if v == nil {
		return Override{}, "", false
	}
	w, ok := v.ws[workspace]
	if !ok {
		return Override{}, "", false
	}
	n, ok := (*w.nss.Load())[namespace]
	if !ok {
		return Override{}, "", false
	}
	var m map[string]exactVal
	if len(n.exact) > 0 {
		m = n.exact[t.shard(identifier, len(n.exact))]
	}
	if v, ok := m[identifier]; ok {
		return v.override(), v.pattern, true
	}
	var a *applied
	switch {
	case n.tree == nil:
		return Override{}, "", false
	case n.globs:
		a = n.tree.best(identifier)
	default:
		a = n.tree.longest(identifier)
	}
	if a == nil {
		return Override{}, "", false
	}
	return a.Override, a.Pattern, true
}

// Generation returns a number that changes whenever what Match answers may
// change (0 before the first change). A caller may cache Match's answer for
// a key with the generation it read before matching, and reuse it while
// Generation returns the same: one atomic load instead of a match.
func (t *Table) Generation() uint64 {
	if v := t.view.Load(); v != nil {
		return v.gen
	}
	return 0
}

// Get returns the live override of k, if any.
func (t *Table) Get(k Key) (Entry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entry(k)
	return e, ok && !e.Deleted
}

// entry returns k's entry, tombstones included. The caller holds t.mu.
func (t *Table) entry(k Key) (Entry, bool) {
	s := t.nss[nsKey{k.Workspace, k.Namespace}]
	if s == nil {
		return Entry{}, false
	}
	e, ok := s.entries[k.Pattern]
	return e, ok
}

// Set sets the override of k to o, as a change accepted at now (unix ms)
// in region origin, and returns the entry to carry to the other replicas.
// Its version is later than any this table holds for k (Version.Next). A
// new pattern is refused with ErrTooMany when the workspace already holds
// MaxOverridesPerWorkspace live overrides; an invalid key, override or
// origin with ErrInvalid. A refused Set changes nothing.
func (t *Table) Set(k Key, o Override, now int64, origin string) (Entry, error) {
	// An invalid k is change's to report, before o.
	if err := o.Validate(); err != nil && k.Validate() == nil {
		return Entry{}, fmt.Errorf("set override: %w", err)
	}
	return t.change("set override", k, func(old Entry, ok bool) (Entry, error) {
		if (!ok || old.Deleted) && t.perWS[k.Workspace] >= MaxOverridesPerWorkspace {
			return Entry{}, fmt.Errorf("%w: workspace %s holds %d overrides, the most allowed: delete some first",
				ErrTooMany, k.Workspace, t.perWS[k.Workspace])
		}
		return Entry{Key: k, Override: o, Version: old.Version.Next(now, origin)}, nil
	})
}

// Delete deletes the override of k, as a change accepted at now in region
// origin, and returns the tombstone to carry to the other replicas. A
// pattern with no live override is refused with ErrNotFound and changes
// nothing.
func (t *Table) Delete(k Key, now int64, origin string) (Entry, error) {
	return t.change("delete override", k, func(old Entry, ok bool) (Entry, error) {
		if !ok || old.Deleted {
			return Entry{}, notFound(k)
		}
		return Entry{Key: k, Deleted: true, Version: old.Version.Next(now, origin)}, nil
	})
}

// notFound is the error for k having no live override.
func notFound(k Key) error {
	return fmt.Errorf("%w: %s/%s pattern %q", ErrNotFound, k.Workspace, k.Namespace, truncate(k.Pattern))
}

// change applies the entry that next makes of k's current entry (ok: k
// has one, maybe a tombstone), once k and that entry are valid, and
// returns it; every error, prefixed by op, changes nothing.
func (t *Table) change(op string, k Key, next func(old Entry, ok bool) (Entry, error)) (Entry, error) {
	if err := k.Validate(); err != nil {
		return Entry{}, fmt.Errorf("%s: %w", op, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := next(t.entry(k))
	if err == nil {
		err = e.Validate()
	}
	if err != nil {
		return Entry{}, fmt.Errorf("%s: %w", op, err)
	}
	t.apply([]Entry{e})
	return e, nil
}

// Merge folds entries from other replicas (or the store) into the table:
// each replaces the entry of its key if it wins by Compare, and is dropped
// otherwise. It returns how many entries changed the table. Merging the same
// entries in any order, any number of times, leaves the same table (while
// no workspace holds more than MaxOverridesPerWorkspace tombstones, past
// which the oldest are forgotten). If any entry is invalid, nothing is
// merged and the error (wrapping ErrInvalid) names it. Merge does not refuse
// live entries beyond the workspace's bound: replicas must converge on what
// other regions accepted.
func (t *Table) Merge(entries ...Entry) (int, error) {
	changed, err := t.MergeChanged(entries...)
	return len(changed), err
}

// MergeChanged is Merge, returning the entries that changed the table, in
// the order given, rather than their number: one view is published for
// them all, so merging a store's or a snapshot's rows costs one publish,
// not one per row.
func (t *Table) MergeChanged(entries ...Entry) ([]Entry, error) {
	if err := validateAll("merge override", entries); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.apply(entries), nil
}

// Live returns how many live overrides the table holds, in every
// workspace, without copying them.
func (t *Table) Live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.perWS {
		n += c
	}
	return n
}

// changes lists the patterns of one namespace that a write changed, by the
// part of the view they live in: the exact maps or the tree.
type changes struct {
	exact, tree map[string]struct{}
}

// apply merges valid entries, bounds the tombstones of the workspaces they
// touch, publishes a new view if anything changed, and returns the entries
// that changed the table, in order. The caller holds t.mu.
func (t *Table) apply(entries []Entry) []Entry {
	dirty := make(map[nsKey]*changes)
	var changed []Entry
	for _, e := range entries {
		nk := nsKey{e.Workspace, e.Namespace}
		s := t.nss[nk]
		if s == nil {
			s = &nsState{entries: make(map[string]Entry)}
			t.nss[nk] = s
		}
		old, ok := s.entries[e.Pattern]
		if ok && Compare(e, old) <= 0 {
			continue
		}
		if ok {
			t.forget(s, old)
		} else {
			s.sorted = nil // a new pattern
		}
		t.keep(s, e)
		ch := dirty[nk]
		if ch == nil {
			ch = &changes{exact: make(map[string]struct{}), tree: make(map[string]struct{})}
			dirty[nk] = ch
		}
		if e.IsExact() {
			ch.exact[e.Pattern] = struct{}{}
		} else {
			ch.tree[e.Pattern] = struct{}{}
		}
		changed = append(changed, e)
	}
	if len(changed) == 0 {
		return nil
	}
	for nk := range dirty {
		if t.dead[nk.ws] > MaxOverridesPerWorkspace {
			t.dropOldestTombstones(nk.ws)
		}
	}
	t.publish(dirty)
	return changed
}

// keep records e in s. The caller holds t.mu.
func (t *Table) keep(s *nsState, e Entry) {
	s.entries[e.Pattern] = e
	t.count(s, e, 1)
	if e.Deleted && t.oldestDead > e.Version.At {
		t.oldestDead = e.Version.At
	}
}

// forget removes e's counts and hash from s (not the entry itself). The
// caller holds t.mu.
func (t *Table) forget(s *nsState, e Entry) { t.count(s, e, -1) }

// count adds e's hash to the digests, or takes it out, and adds delta (1
// or -1) to the counts of e's kind in s and its workspace. The caller
// holds t.mu.
func (t *Table) count(s *nsState, e Entry, delta int) {
	t.digests.flip(KeyShard(e.Key), entryHash(e))
	if e.Deleted {
		tally(t.dead, e.Workspace, delta)
		return
	}
	s.liveExact += delta * b2i(e.IsExact())
	s.liveGlobs += delta * b2i(e.isGlob())
	tally(t.perWS, e.Workspace, delta)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dropOldestTombstones forgets the oldest tombstones of ws (by version,
// then key) until it holds a tenth fewer than the bound, so that a flood of
// deletes sorts them once per thousand. Tombstones are not in the view, so
// nothing is published. The caller holds t.mu.
func (t *Table) dropOldestTombstones(ws string) {
	var dead []Entry
	for nk, s := range t.nss {
		if nk.ws != ws {
			continue
		}
		for _, e := range s.entries {
			if e.Deleted {
				dead = append(dead, e)
			}
		}
	}
	slices.SortFunc(dead, func(a, b Entry) int { return cmp.Or(compareVersions(a.Version, b.Version), CompareKeys(a.Key, b.Key)) })
	for _, e := range dead[:max(0, len(dead)-(MaxOverridesPerWorkspace-MaxOverridesPerWorkspace/10))] {
		t.remove(e)
	}
}

// remove deletes e's key from the table. The caller holds t.mu.
func (t *Table) remove(e Entry) {
	nk := nsKey{e.Workspace, e.Namespace}
	s := t.nss[nk]
	t.forget(s, e)
	delete(s.entries, e.Pattern)
	s.sorted = nil
	if len(s.entries) == 0 {
		delete(t.nss, nk)
	}
}

// Prune forgets the tombstones whose version is older than before (unix
// ms; pass TombstoneCutoff(now)) and returns how many went. It walks the
// table only when before has passed the oldest tombstone, so calling it
// before every digest exchange costs a comparison while nothing expires.
func (t *Table) Prune(before int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if before <= t.oldestDead {
		return 0
	}
	n := 0
	oldest := int64(math.MaxInt64)
	for e := range t.each {
		switch {
		case !e.Deleted:
		case e.Version.At < before:
			t.remove(e)
			n++
		default:
			oldest = min(oldest, e.Version.At)
		}
	}
	t.oldestDead = oldest
	return n
}

// publish builds a new view in which the changed patterns are applied to
// copies of the parts they live in, and everything else is shared with the
// current view. The caller holds t.mu.
func (t *Table) publish(dirty map[nsKey]*changes) {
	old := t.view.Load()
	next := &view{gen: 1}
	if old != nil {
		next.ws, next.gen = old.ws, old.gen+1
	}
	// The changed workspaces' namespace maps, copied and changed.
	changed := make(map[string]map[string]*nsView)
	for nk, ch := range dirty {
		nss, ok := changed[nk.ws]
		if !ok {
			if w := next.ws[nk.ws]; w != nil {
				nss = maps.Clone(*w.nss.Load())
			} else {
				nss = make(map[string]*nsView)
			}
			changed[nk.ws] = nss
		}
		if v := t.buildNS(nk, nss[nk.ns], ch); v != nil {
			nss[nk.ns] = v
		} else {
			delete(nss, nk.ns)
		}
	}
	// A workspace that comes or goes changes the map of workspaces: it is
	// copied, once.
	copyWS := next.ws == nil
	for ws, nss := range changed {
		if _, held := next.ws[ws]; held != (len(nss) > 0) {
			copyWS = true
		}
	}
	if copyWS {
		next.ws = maps.Clone(next.ws)
		if next.ws == nil {
			next.ws = make(map[string]*wsView)
		}
	}
	for ws, nss := range changed {
		w := next.ws[ws]
		switch {
		case len(nss) == 0:
			delete(next.ws, ws)
		case w == nil:
			w = &wsView{}
			w.nss.Store(&nss)
			next.ws[ws] = w
		default:
			// Shared with older views: a reader of one sees the new
			// namespaces, stored before the new generation is.
			w.nss.Store(&nss)
		}
	}
	t.view.Store(next)
}

// buildNS returns the view of one namespace after the changes ch, made from
// old (nil: none), or nil when it has no live override. The caller holds
// t.mu.
func (t *Table) buildNS(nk nsKey, old *nsView, ch *changes) *nsView {
	s := t.nss[nk]
	v := &nsView{}
	if old != nil {
		*v = *old
	}
	live := func(p string) (applied, bool) {
		if s == nil {
			return applied{}, false
		}
		e, ok := s.entries[p]
		if !ok || e.Deleted {
			return applied{}, false
		}
		// The entry's own string, which the table owns: Match hands it out.
		return applied{Override: e.Override, Pattern: e.Pattern}, true
	}
	if len(ch.exact) > 0 {
		v.exact = t.exactAfter(s, v.exact, ch.exact, live)
	}
	for p := range ch.tree {
		a, ok := live(p)
		k := Key{Pattern: p}
		edit := func(n *node) { n.val, n.has = a, ok }
		if !k.IsPrefix() {
			edit = func(n *node) { n.sfx = globTreeWith(n.sfx, p, a, ok) }
		}
		v.tree = treeWith(v.tree, k.Prefix(), edit, ok)
	}
	v.globs = s != nil && s.liveGlobs > 0
	if v.exact == nil && v.tree == nil {
		return nil
	}
	return v
}

// globTreeWith returns the suffix tree root (nil: empty) after glob
// pattern p is set to a (ok) or taken out (!ok), copying only the nodes on
// the path of p's reversed literal suffix.
func globTreeWith(root *node, p string, a applied, ok bool) *node {
	var g *glob
	if ok {
		g = newGlob(a)
	}
	suffix := p[strings.LastIndexByte(p, '*')+1:]
	return treeWith(root, reversed(suffix), func(n *node) { n.globs = globsWith(n.globs, p, g) }, ok)
}

// treeWith is root.with for a tree that may be empty: root nil is the
// empty tree, and nil is returned for one.
func treeWith(root *node, s string, edit func(*node), grow bool) *node {
	if root == nil {
		root = &node{}
	}
	if root = root.with(s, edit, grow); root.empty() {
		return nil
	}
	return root
}

// exactAfter returns the exact maps of a namespace after the changed
// patterns: copies of the shards they fall in, or maps built anew from
// every entry when the namespace crosses shardFrom either way.
func (t *Table) exactAfter(s *nsState, cur []map[string]exactVal, changed map[string]struct{}, live func(string) (applied, bool)) []map[string]exactVal {
	count := 0
	if s != nil {
		count = s.liveExact
	}
	want := 1
	if count >= shardFrom {
		want = exactShards
	}
	if count == 0 {
		return nil
	}
	patterns := maps.Keys(changed)
	if len(cur) != want {
		// With no maps yet, only the changed patterns can be live; across
		// shardFrom, every live exact pattern moves to new maps.
		if len(cur) != 0 {
			patterns = maps.Keys(s.entries)
		}
		cur = make([]map[string]exactVal, want)
	}
	out := slices.Clone(cur)
	cloned := make([]bool, want)
	for p := range patterns {
		if !(Key{Pattern: p}).IsExact() {
			continue
		}
		i := t.shard(p, want)
		if !cloned[i] {
			out[i] = maps.Clone(out[i])
			if out[i] == nil {
				out[i] = make(map[string]exactVal)
			}
			cloned[i] = true
		}
		if a, ok := live(p); ok {
			out[i][p] = newExactVal(a)
		} else {
			delete(out[i], p)
		}
	}
	return out
}

// shard returns the exact map of n maps that identifier p lives in.
func (t *Table) shard(p string, n int) int {
	if n == 1 {
		return 0
	}
	return int(maphash.String(t.seed, p) & (exactShards - 1))
}

// List returns the live overrides of workspace, of one namespace or of all
// (namespace ""), ordered by namespace and pattern: one Page of them all.
func (t *Table) List(workspace, namespace string) []Entry {
	all, _ := t.Page(workspace, namespace, Position{}, math.MaxInt, nil)
	return all
}

// Entries returns every entry, tombstones included, ordered by key: what a
// replica sends another that needs all of them.
func (t *Table) Entries() []Entry {
	return snapshot(&t.ledger, t.each, compareEntries)
}

// EntriesIn returns the entries whose keys fall in the parts of Digests
// that parts names, part by part (by key within a part), as inParts
// orders them.
func (t *Table) EntriesIn(parts Parts) []Entry {
	return inParts(&t.ledger, t.each, parts, func(e Entry) int { return KeyShard(e.Key) }, compareEntries)
}

// each yields every entry, tombstones included, in no order. The caller
// holds t.mu.
func (t *Table) each(yield func(Entry) bool) {
	for _, s := range t.nss {
		for _, e := range s.entries {
			if !yield(e) {
				return
			}
		}
	}
}

func compareEntries(a, b Entry) int { return CompareKeys(a.Key, b.Key) }

// CompareKeys orders keys by workspace, namespace and pattern, each in
// byte order: the order of Entries, and of a store's primary key.
func CompareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Workspace, b.Workspace), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pattern, b.Pattern))
}

// entryHash is a 64-bit FNV-1a hash of everything in e, each string
// preceded by its length so that no two entries write the same bytes.
func entryHash(e Entry) uint64 {
	h := fnvNum(fnvName(e.Workspace, e.Namespace, e.Pattern), e.Limit)
	h = fnvNum(h, e.Duration)
	h = fnvNum(h, int64(b2i(e.Shadow)|b2i(e.Deleted)<<1)) // the flags: 1 shadow, 2 deleted
	h = fnvNum(h, e.Version.At)
	return fnvStr(h, e.Version.Origin)
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvNum(h uint64, v int64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= uint64(byte(v >> (8 * i)))
		h *= fnvPrime
	}
	return h
}

func fnvStr(h uint64, s string) uint64 {
	h = fnvNum(h, int64(len(s)))
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// String describes e for logs.
func (e Entry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s %q", e.Workspace, e.Namespace, truncate(e.Pattern))
	if e.Deleted {
		b.WriteString(" deleted")
	} else {
		fmt.Fprintf(&b, " limit %d per %dms", e.Limit, e.Duration)
		if e.Shadow {
			b.WriteString(" shadow")
		}
	}
	fmt.Fprintf(&b, " @%d %s", e.Version.At, e.Version.Origin)
	return b.String()
}
