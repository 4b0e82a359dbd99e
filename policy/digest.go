package policy

import (
	"cmp"
	"iter"
	"slices"
	"sync"
)

// DigestShards is how many parts a digest is split into (Digests): two
// replicas whose digests differ need exchange only the entries and marks
// of the parts that differ, not everything they hold. At a million
// overrides a part holds about a thousand.
const DigestShards = 1024

// Parts names parts of a digest, one bit each (bit i: part i).
type Parts [DigestShards / 64]uint64

// AllParts names every part.
func AllParts() Parts {
	var p Parts
	for i := range p {
		p[i] = ^uint64(0)
	}
	return p
}

// Has reports whether p names part i.
func (p *Parts) Has(i int) bool { return p[i/64]&(1<<(i%64)) != 0 }

// Add names part i.
func (p *Parts) Add(i int) { p[i/64] |= 1 << (i % 64) }

// Digests is a hash of a set of entries (or marks) that does not depend on
// the order they arrived in, whole and in DigestShards parts: an entry
// counts in the part its key falls in (KeyShard, MarkShard), and Total is
// the XOR of the parts.
type Digests struct {
	Total  uint64
	Shards [DigestShards]uint64
}

// flip adds or removes the hash h of an entry of shard.
func (d *Digests) flip(shard int, h uint64) {
	d.Total ^= h
	d.Shards[shard] ^= h
}

// Xor returns the digests of the union of two disjoint sets (a table's
// entries and its marks): part by part, d XOR o.
func (d Digests) Xor(o Digests) Digests {
	d.Total ^= o.Total
	for i := range d.Shards {
		d.Shards[i] ^= o.Shards[i]
	}
	return d
}

// Differ returns the parts in which d and another replica's parts differ,
// and all of them when theirs does not hold DigestShards parts (a replica
// that sends none).
func (d *Digests) Differ(theirs []uint64) Parts {
	if len(theirs) != DigestShards {
		return AllParts()
	}
	var p Parts
	for i, h := range theirs {
		if d.Shards[i] != h {
			p.Add(i)
		}
	}
	return p
}

// KeyShard returns the part of a digest an override entry of k counts in.
func KeyShard(k Key) int {
	return MarkShard(k.Workspace, k.Namespace, k.Pattern)
}

// MarkShard returns the part of a digest a reset mark of (workspace,
// namespace, identifier), of any duration, counts in; an override entry
// of that pattern counts in the same part (KeyShard).
func MarkShard(workspace, namespace, identifier string) int {
	return int(fnvName(workspace, namespace, identifier) % DigestShards)
}

// fnvName is the FNV-1a hash of a (workspace, namespace, pattern or
// identifier) name, each string preceded by its length: where both the
// part and the hash of an entry or a mark begin.
func fnvName(workspace, namespace, name string) uint64 {
	return fnvStr(fnvStr(fnvStr(fnvOffset, workspace), namespace), name)
}

// ledger is what a Table and Marks keep alike: the lock their writers
// hold, how many live overrides or marks each workspace holds, and the
// digests of everything held.
type ledger struct {
	mu      sync.RWMutex
	perWS   map[string]int
	digests Digests
}

// Len returns how many live overrides (Table) or marks (Marks) workspace
// holds.
func (l *ledger) Len(workspace string) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.perWS[workspace]
}

// Digest returns a hash of every entry (tombstones included) or mark held
// that does not depend on the order they arrived in: two tables, or two
// sets of marks, holding the same have the same digest.
func (l *ledger) Digest() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.digests.Total
}

// Digests returns Digest whole and in parts (KeyShard for a table's
// entries, MarkShard for marks).
func (l *ledger) Digests() Digests {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.digests
}

// tally adds delta to m[k], deleting k once it counts nothing.
func tally(m map[string]int, k string, delta int) {
	if m[k] += delta; m[k] <= 0 {
		delete(m, k)
	}
}

// snapshot returns the items of all, read under l's read lock, then
// sorted by compare.
func snapshot[T any](l *ledger, all iter.Seq[T], compare func(a, b T) int) []T {
	l.mu.RLock()
	out := slices.Collect(all)
	l.mu.RUnlock()
	slices.SortFunc(out, compare)
	return out
}

// inParts returns the items of all whose part (shard) parts names, read
// under l's read lock, ordered by part and then by compare: a replica that
// receives only the first of them holds whole parts, which its next
// exchange need not ask for again.
func inParts[T any](l *ledger, all iter.Seq[T], parts Parts, shard func(T) int, compare func(a, b T) int) []T {
	type sharded struct {
		v     T
		shard int
	}
	in := snapshot(l, func(yield func(sharded) bool) {
		for v := range all {
			if sh := shard(v); parts.Has(sh) && !yield(sharded{v, sh}) {
				return
			}
		}
	}, func(a, b sharded) int { return cmp.Or(cmp.Compare(a.shard, b.shard), compare(a.v, b.v)) })
	out := make([]T, len(in))
	for i := range in {
		out[i] = in[i].v
	}
	return out
}
