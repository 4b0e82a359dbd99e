package policy

// DigestShards is how many parts a digest is split into (Digests): two
// replicas whose digests differ need exchange only the entries and marks
// of the parts that differ, not everything they hold.
const DigestShards = 64

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
// one bit each (bit i: part i), and all of them when theirs does not hold
// DigestShards parts (a replica that sends none).
func (d *Digests) Differ(theirs []uint64) uint64 {
	if len(theirs) != DigestShards {
		return ^uint64(0)
	}
	var mask uint64
	for i, h := range theirs {
		if d.Shards[i] != h {
			mask |= 1 << i
		}
	}
	return mask
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

// inMask reports whether mask names shard.
func inMask(mask uint64, shard int) bool { return mask&(1<<shard) != 0 }
