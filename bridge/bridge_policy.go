package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// A bridge's overrides (docs/architecture.md, "Carrying and storing
// policies"): it holds a policy.Table merged from what its region's
// limiters accepted, what the other regions' bridges forward and what the
// store holds, all by the table's last-writer-wins merge, so the order in
// which they arrive does not matter. Whatever changes its table is
// broadcast to its region's limiters and queued for the store; what its own
// region accepted is also forwarded to the other regions. What changed in
// the store is read with the components (Bridge.reload, every
// ReloadInterval, by changed_us), which is how regions converge while
// gateways are down; tombstones older than policy.TombstoneRetention leave
// the table and the store with the cleanup, and reads leave them out, so
// the prune holds. Reset marks
// (policy.Marks) travel the same ways, merged by max of epoch: what the
// region's limiters accepted is forwarded, everything that raised an epoch
// is broadcast and stored, and marks leave with the cleanup once expired
// (policy.Mark.ExpireAt with global.MarkGrace).

// bridgePolicies is the policy state of a bridge.
type bridgePolicies struct {
	table *policy.Table
	mu    sync.Mutex
	// out holds what changed the table since the last batch, to broadcast
	// (and, when this region accepted it, to forward); store what the store
	// still lacks.
	out   mergeQueue[policy.Key, policy.Entry]
	store mergeQueue[policy.Key, policy.Entry]
	// marks are the reset marks; outMarks and storeMarks their queues, as
	// out and store are the overrides'.
	marks      *policy.Marks
	outMarks   mergeQueue[markKey, markOut]
	storeMarks mergeQueue[markKey, policy.Mark]
	// seq numbers the changes of the table and the marks, in the order
	// they were merged (Bridge.PolicySeq).
	seq uint64
}

// newBridgePolicies returns empty policy state.
func newBridgePolicies() bridgePolicies {
	entries := func() mergeQueue[policy.Key, policy.Entry] {
		return newMergeQueue(func(e policy.Entry) policy.Key { return e.Key },
			func(a, b policy.Entry) bool { return policy.Compare(a, b) > 0 })
	}
	return bridgePolicies{table: policy.NewTable(), out: entries(), store: entries(), marks: policy.NewMarks(),
		outMarks: newMergeQueue(func(mo markOut) markKey { return keyOfMark(mo.m) },
			func(a, b markOut) bool { return a.m.Epoch > b.m.Epoch }),
		storeMarks: newMergeQueue(keyOfMark, func(a, b policy.Mark) bool { return a.Epoch > b.Epoch })}
}

// mergeQueue holds, per key, the value the merge keeps until it is taken
// (wins reports whether a wins over b): what is still to go out, or what
// the store still lacks. Its owner's mutex guards it.
type mergeQueue[K comparable, V any] struct {
	m    map[K]V
	key  func(V) K
	wins func(a, b V) bool
}

func newMergeQueue[K comparable, V any](key func(V) K, wins func(a, b V) bool) mergeQueue[K, V] {
	return mergeQueue[K, V]{m: make(map[K]V), key: key, wins: wins}
}

// len returns how many values q holds.
func (q *mergeQueue[K, V]) len() int { return len(q.m) }

// put queues v unless what is queued for its key wins over it.
func (q *mergeQueue[K, V]) put(v V) {
	k := q.key(v)
	if old, ok := q.m[k]; !ok || q.wins(v, old) {
		q.m[k] = v
	}
}

// take empties the queue and returns what it held. After a burst (a first
// load queues every override) the map is replaced, not cleared: Go maps
// never shrink, and every later take would walk the burst's buckets.
func (q *mergeQueue[K, V]) take() []V {
	vs := make([]V, 0, len(q.m))
	for _, v := range q.m {
		vs = append(vs, v)
	}
	q.m = emptied(q.m)
	return vs
}

// writeQueued writes what q holds with write; what fails goes back in q.
func writeQueued[K comparable, V any](ctx context.Context, b *Bridge, q *mergeQueue[K, V], write func(context.Context, []V) error) error {
	b.pol.mu.Lock()
	vs := q.take()
	b.pol.mu.Unlock()
	if len(vs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StoreTimeout)
	defer cancel()
	err := write(ctx, vs)
	if err == nil {
		return nil
	}
	b.pol.mu.Lock()
	for _, v := range vs {
		q.put(v)
	}
	b.pol.mu.Unlock()
	return err
}

// markOut is a mark to broadcast, and whether this region accepted it (to
// forward).
type markOut struct {
	m   policy.Mark
	own bool
}

// Marks returns the bridge's reset marks.
func (b *Bridge) Marks() *policy.Marks { return b.pol.marks }

// PolicyDigest returns the digest of everything the bridge's limiters
// compare with it: the override table's XOR the marks', once the
// tombstones before policy.TombstoneCutoff are pruned (as the limiters
// prune them before they send theirs).
func (b *Bridge) PolicyDigest() uint64 {
	b.pol.table.Prune(policy.TombstoneCutoff(b.now()))
	return b.pol.table.Digest() ^ b.pol.marks.Digest()
}

// MarkSnapshot returns every reset mark the bridge holds: with
// PolicySnapshot, the answer to a limiter's policy snapshot.
func (b *Bridge) MarkSnapshot() []policy.Mark { return b.pol.marks.All() }

// PolicyDigests returns PolicyDigest whole and in parts (policy.Digests:
// the table's parts XOR the marks'), after the same prune.
func (b *Bridge) PolicyDigests() policy.Digests {
	b.pol.table.Prune(policy.TombstoneCutoff(b.now()))
	return b.pol.table.Digests().Xor(b.pol.marks.Digests())
}

// PolicySnapshotIn returns the override entries and reset marks of the
// digest parts that parts names (policy.Table.EntriesIn, policy.Marks.AllIn):
// the answer to a limiter whose digest differs in those parts only.
func (b *Bridge) PolicySnapshotIn(parts policy.Parts) ([]policy.Entry, []policy.Mark) {
	return b.pol.table.EntriesIn(parts), b.pol.marks.AllIn(parts)
}

// FromLimiterMarks merges the reset marks this region's limiters accepted,
// sent at sentAt by the sender's clock (unix ms, 0: unknown). A mark that
// fails its CheckAt at the bridge's clock is refused and counted; the
// others are merged, queued for the store and broadcast, and forwarded to
// the other regions. It returns an error when it refused any, after
// merging the rest.
func (b *Bridge) FromLimiterMarks(ms []policy.Mark, sentAt int64) error {
	return b.mergeMarks(global.Refusal{Source: "limiters", Region: b.cfg.Region}, true, ms, sentAt)
}

// FromRegionMarks merges the reset marks the bridge of region forwarded,
// by the rules of FromLimiterMarks; they are not forwarded again. This
// region's own forwards are ignored.
func (b *Bridge) FromRegionMarks(region string, ms []policy.Mark, sentAt int64) error {
	if region == b.cfg.Region {
		return nil
	}
	return b.mergeMarks(global.Refusal{Source: "regions", Region: region}, false, ms, sentAt)
}

// pruneMarks forgets the reset marks that expired at now. A mark of every
// duration that expires stays as a mark of each duration whose cells of
// its identifier the counter holds (every region's) while the reset still
// concerns them; those marks are stored, broadcast to the limiters and
// forwarded to the other regions, as marks the region's limiters accepted.
// It runs with every reload (and cleanup); it walks the counter's cells
// only when a mark of every duration expires and a duration the counter
// has seen may still be concerned by it (longerDurationsSeen).
func (b *Bridge) pruneMarks(now int64) {
	grace := global.MarkGrace.Milliseconds()
	var inUse func(workspace, namespace, identifier string) []int64
	if exp := b.pol.marks.Expiring(now, grace); len(exp) > 0 && b.longerDurationsSeen(exp, now, grace) {
		want := make(map[[3]string]bool, len(exp))
		for _, m := range exp {
			want[[3]string{m.Workspace, m.Namespace, m.Identifier}] = true
		}
		ds := b.counter.Durations(func(ws, ns, id string) bool { return want[[3]string{ws, ns, id}] })
		inUse = func(ws, ns, id string) []int64 { return ds[[3]string{ws, ns, id}] }
	}
	_, kept := b.pol.marks.Prune(now, grace, inUse)
	if len(kept) == 0 {
		return
	}
	b.pol.mu.Lock()
	b.bumpPolicySeq()
	for _, m := range kept {
		b.pol.outMarks.put(markOut{m: m, own: true})
		b.pol.storeMarks.put(m)
	}
	b.pol.mu.Unlock()
}

// longerDurationsSeen reports whether a duration the counter has seen
// (or may have: more than it lists) could still be concerned by one of the
// expiring marks of every duration exp at now: without one, no mark stays
// of them and the counter's cells need not be walked (which holds its lock
// against merges for as long), as in a deployment of short windows only.
func (b *Bridge) longerDurationsSeen(exp []policy.Mark, now, grace int64) bool {
	ds, all := b.counter.SeenDurations()
	if !all {
		return true
	}
	for _, d := range ds {
		for _, m := range exp {
			if (policy.Mark{Duration: d, Epoch: m.Epoch}).ExpireAt(grace) > now {
				return true
			}
		}
	}
	return false
}

// mergeMarks merges ms; own marks (this region's limiters accepted them)
// are forwarded.
func (b *Bridge) mergeMarks(from global.Refusal, own bool, ms []policy.Mark, sentAt int64) error {
	if len(ms) == 0 {
		return nil
	}
	now := b.now()
	skew := b.cfg.MaxClockSkew.Milliseconds()
	if err := global.CheckSentAt(sentAt, now, b.cfg.MaxClockSkew); err != nil { // 0: not stamped
		b.refuse(from, len(ms), err)
		return err
	}
	var errs []error
	var changed []policy.Mark
	for _, m := range ms {
		if err := m.CheckAt(now, skew); err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
			continue
		}
		if n, err := b.pol.marks.Merge(m); err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
			continue
		} else if n > 0 {
			changed = append(changed, m)
		}
	}
	if len(changed) > 0 {
		b.pol.mu.Lock()
		b.bumpPolicySeq()
		for _, m := range changed {
			b.pol.outMarks.put(markOut{m: m, own: own})
			if from.Source != "store" {
				b.pol.storeMarks.put(m)
			}
		}
		b.pol.mu.Unlock()
	}
	return errors.Join(errs...)
}

// PolicySeq returns the sequence of the last change of the bridge's
// overrides and reset marks. Each change merged (from its limiters, other
// regions or the store) takes the next one, above every earlier and at
// least the bridge's clock in µs, so a bridge that restarts carries on
// above its predecessor while clocks are sane. Every change acknowledged
// to a limiter before PolicySeq was read is at or below it; a broadcast of
// changes carries the sequence that covers them, and a limiter that has
// applied a broadcast or snapshot of sequence s holds every change up to s
// (the barrier of docs/architecture.md, "Read your writes").
func (b *Bridge) PolicySeq() uint64 {
	b.pol.mu.Lock()
	defer b.pol.mu.Unlock()
	return b.pol.seq
}

// bumpPolicySeq gives the changes being queued the next sequence. The
// caller holds b.pol.mu.
func (b *Bridge) bumpPolicySeq() {
	b.pol.seq = max(b.pol.seq+1, uint64(max(b.cfg.Now().UnixMicro(), 0)))
}

// Policies returns the bridge's override table.
func (b *Bridge) Policies() *policy.Table { return b.pol.table }

// PolicySnapshot returns every override entry the bridge holds,
// tombstones included: the answer to a limiter's policy snapshot.
func (b *Bridge) PolicySnapshot() []policy.Entry { return b.pol.table.Entries() }

// FromLimiterPolicies merges the override entries this region's limiters
// accepted, sent at sentAt by the sender's clock (unix ms, 0: unknown). An
// entry that fails its CheckAt at the bridge's clock or names another
// region as its origin is refused and counted; the others are merged. It
// returns an error when it refused any, after merging the rest.
func (b *Bridge) FromLimiterPolicies(es []policy.Entry, sentAt int64) error {
	return b.mergePolicies(global.Refusal{Source: "limiters", Region: b.cfg.Region}, b.cfg.Region, es, sentAt)
}

// FromRegionPolicies merges the override entries the bridge of region
// forwarded, by the rules of FromLimiterPolicies: each must be region's own.
// This region's own forwards, which come back on the same subject, are
// ignored.
func (b *Bridge) FromRegionPolicies(region string, es []policy.Entry, sentAt int64) error {
	if region == b.cfg.Region {
		return nil
	}
	return b.mergePolicies(global.Refusal{Source: "regions", Region: region}, region, es, sentAt)
}

// mergePolicies merges es, each of which must have origin as its origin
// (any origin when origin is empty: the store's rows).
func (b *Bridge) mergePolicies(from global.Refusal, origin string, es []policy.Entry, sentAt int64) error {
	now := b.now()
	skew := b.cfg.MaxClockSkew.Milliseconds()
	if err := global.CheckSentAt(sentAt, now, b.cfg.MaxClockSkew); err != nil { // 0: not stamped
		b.refuse(from, len(es), err)
		return err
	}
	var errs []error
	ok := make([]policy.Entry, 0, len(es))
	pruned := policy.TombstoneCutoff(now)
	for _, e := range es {
		if e.Deleted && e.Version.At < pruned {
			// A tombstone the cleanup prunes (a limiter still holding it,
			// say): merging it would bring it back until the next cleanup.
			continue
		}
		err := e.CheckAt(now, skew)
		if err == nil && origin != "" && e.Version.Origin != origin {
			err = fmt.Errorf("%w: an override accepted in region %q came from %s %q", global.ErrInvalid, e.Version.Origin, from.Source, from.Region)
		}
		if err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
			continue
		}
		ok = append(ok, e)
	}
	// One merge, one view published, for all of them: a store's full read
	// of many rows costs one publish, not one per row.
	changed, err := b.pol.table.MergeChanged(ok...)
	if err != nil { // each entry was checked above
		b.refuse(from, len(ok), err)
		return errors.Join(append(errs, err)...)
	}
	if len(changed) > 0 {
		b.pol.mu.Lock()
		b.bumpPolicySeq()
		for _, e := range changed {
			b.pol.out.put(e)
			if from.Source != "store" {
				b.pol.store.put(e)
			}
		}
		b.pol.mu.Unlock()
	}
	return errors.Join(errs...)
}

// batchPolicies broadcasts what changed the table to this region's
// limiters and forwards this region's own changes to the other regions.
// What fails to go out is not retried here: limiters repair by digest, and
// other regions by reading the store.
func (b *Bridge) batchPolicies(ctx context.Context) {
	b.pol.mu.Lock()
	if b.pol.out.len() == 0 && b.pol.outMarks.len() == 0 {
		b.pol.mu.Unlock()
		return
	}
	seq := b.pol.seq // covers everything queued
	out := b.pol.out.take()
	var outMarks, ownMarks []policy.Mark
	for _, mo := range b.pol.outMarks.take() {
		outMarks = append(outMarks, mo.m)
		if mo.own {
			ownMarks = append(ownMarks, mo.m)
		}
	}
	b.pol.mu.Unlock()
	var own []policy.Entry
	for _, e := range out {
		if e.Version.Origin == b.cfg.Region {
			own = append(own, e)
		}
	}
	if len(own) > 0 || len(ownMarks) > 0 {
		if err := b.cfg.Transport.ForwardPolicies(ctx, own, ownMarks); err != nil {
			b.log.Debug("forwarding overrides failed; the store carries them", "error", err)
		}
	}
	if err := b.cfg.Transport.BroadcastPolicies(ctx, out, outMarks, seq); err != nil {
		b.log.Debug("broadcasting overrides failed; limiters repair by digest", "error", err)
	}
}

// writePolicies writes the queued overrides and reset marks to the store;
// what fails stays queued.
func (b *Bridge) writePolicies(ctx context.Context) error {
	return errors.Join(b.writeOverrides(ctx), b.writeMarks(ctx))
}

// writeMarks writes the queued reset marks to the store; what fails stays
// queued.
func (b *Bridge) writeMarks(ctx context.Context) error {
	if err := writeQueued(ctx, b, &b.pol.storeMarks, b.cfg.Store.UpsertMarks); err != nil {
		return fmt.Errorf("store reset marks: %w", err)
	}
	return nil
}

// writeOverrides writes the queued overrides to the store; what fails
// stays queued.
func (b *Bridge) writeOverrides(ctx context.Context) error {
	if err := writeQueued(ctx, b, &b.pol.store, b.cfg.Store.UpsertOverrides); err != nil {
		return fmt.Errorf("store overrides: %w", err)
	}
	return nil
}

// PolicyStoreQueued returns how many overrides and reset marks wait to be
// written to the store.
func (b *Bridge) PolicyStoreQueued() int {
	b.pol.mu.Lock()
	defer b.pol.mu.Unlock()
	return b.pol.store.len() + b.pol.storeMarks.len()
}

// closePolicies writes the queued overrides and reset marks at Close: once,
// and if that fails once more over fresh connections (lastTry). Those it
// cannot write are not lost: the region's limiters hold every override they
// accepted and give them to the region's next bridge (their digest differs
// from its, and they send what they hold).
func (b *Bridge) closePolicies(ctx context.Context) {
	err := b.writePolicies(ctx)
	var last lastTry
	if err != nil {
		last = b.lastTry(ctx, b.writePolicies)
		err = last.err
	}
	b.logPoliciesNotDurable(err, last)
}

// logPoliciesNotDurable says, in one line, how many overrides and reset
// marks a stopping bridge could not write, if any, why (err), and what its
// last try was.
func (b *Bridge) logPoliciesNotDurable(err error, last lastTry) {
	n := b.PolicyStoreQueued()
	if n == 0 {
		return
	}
	b.log.Warn("stopping with overrides not yet durable in MySQL"+last.how()+": the region's limiters hold them and give them to the next bridge",
		append(last.attrs(), "not_durable", n, "error", err)...)
}
