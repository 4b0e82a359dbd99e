package policy

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
	return int(fnvStr(fnvStr(fnvStr(fnvOffset, k.Workspace), k.Namespace), k.Pattern) % DigestShards)
}

// MarkShard returns the part of a digest a reset mark of (workspace,
// namespace, identifier), of any duration, counts in.
func MarkShard(workspace, namespace, identifier string) int {
	return int(fnvStr(fnvStr(fnvStr(fnvOffset, workspace), namespace), identifier) % DigestShards)
}
