package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	marks *policy.Marks
	// store and storeMarks are what the store lacks of the overrides and
	// the marks.
	store      *storeQueue[policy.Key, policy.Entry]
	storeMarks *storeQueue[policy.Mark, policy.Mark]
	mu         sync.Mutex
	// out and outMarks hold what changed the table and the marks since the
	// last batch, to broadcast; the entries of out this region accepted, and
	// ownMarks (the marks its limiters accepted or its prune kept), are
	// forwarded too.
	out                mergeQueue[policy.Key, policy.Entry]
	outMarks, ownMarks mergeQueue[policy.Mark, policy.Mark]
	// seq numbers the changes of the table and the marks, in the order
	// they were merged (Bridge.PolicySeq).
	seq uint64
}

// newBridgePolicies returns empty policy state, stored in s.
func newBridgePolicies(s Store) bridgePolicies {
	return bridgePolicies{table: policy.NewTable(), marks: policy.NewMarks(),
		store:      newStoreQueue(overrideRows, s.UpsertOverrides, nil),
		storeMarks: newStoreQueue(markRows, s.UpsertMarks, nil),
		out:        newMergeQueue(overrideRows.key, overrideRows.merge),
		outMarks:   newMergeQueue(markRows.key, markRows.merge),
		ownMarks:   newMergeQueue(markRows.key, markRows.merge)}
}

// Marks returns the bridge's reset marks.
func (b *Bridge) Marks() *policy.Marks { return b.pol.marks }

// PolicyDigests returns the digests of everything the bridge's limiters
// compare with it, whole and in parts: the override table's XOR the
// marks' (policy.Digests), once the tombstones before
// policy.TombstoneCutoff are pruned (as the limiters prune them before
// they send theirs).
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
		ds := b.counter.Durations(want)
		inUse = func(ws, ns, id string) []int64 { return ds[[3]string{ws, ns, id}] }
	}
	_, kept := b.pol.marks.Prune(now, grace, inUse)
	b.queuePolicies(nil, kept, true, true)
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

// queuePolicies gives the changes es and ms the next policy sequence and
// queues them to go out (the marks to forward too when own) and, when
// store, for the store.
func (b *Bridge) queuePolicies(es []policy.Entry, ms []policy.Mark, own, store bool) {
	if len(es)+len(ms) == 0 {
		return
	}
	b.pol.mu.Lock()
	b.pol.seq = max(b.pol.seq+1, uint64(max(b.cfg.Now().UnixMicro(), 0))) // the next (PolicySeq)
	for _, e := range es {
		b.pol.out.put(e)
	}
	for _, m := range ms {
		b.pol.outMarks.put(m)
		if own {
			b.pol.ownMarks.put(m)
		}
	}
	b.pol.mu.Unlock()
	if store {
		b.pol.store.put(es...)
		b.pol.storeMarks.put(ms...)
	}
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

// Policies returns the bridge's override table.
func (b *Bridge) Policies() *policy.Table { return b.pol.table }

// PolicySnapshot returns every override entry the bridge holds,
// tombstones included, and every reset mark: the answer to a limiter's
// policy snapshot.
func (b *Bridge) PolicySnapshot() ([]policy.Entry, []policy.Mark) {
	return b.pol.table.Entries(), b.pol.marks.All()
}

// FromLimiterPolicies merges the override entries and reset marks this
// region's limiters accepted, sent at sentAt by the sender's clock (unix
// ms, 0: unknown). An entry or mark that fails its CheckAt at the bridge's
// clock, or an entry that names another region as its origin, is refused
// and counted; the others are merged, queued for the store and broadcast,
// and forwarded to the other regions. It returns an error when it refused
// any, after merging the rest.
func (b *Bridge) FromLimiterPolicies(es []policy.Entry, ms []policy.Mark, sentAt int64) error {
	return b.mergePolicies(global.Refusal{Source: "limiters", Region: b.cfg.Region}, b.cfg.Region, es, ms, sentAt)
}

// FromRegionPolicies merges the override entries and reset marks the
// bridge of region forwarded, by the rules of FromLimiterPolicies: each
// entry must be region's own, and neither is forwarded again. This
// region's own forwards, which come back on the same subject, are ignored.
func (b *Bridge) FromRegionPolicies(region string, es []policy.Entry, ms []policy.Mark, sentAt int64) error {
	if region == b.cfg.Region {
		return nil
	}
	return b.mergePolicies(global.Refusal{Source: "regions", Region: region}, region, es, ms, sentAt)
}

// mergePolicies merges es, each of which must have origin as its origin
// (any origin when origin is empty: the store's rows), and ms. The marks
// from this region's limiters are forwarded; everything but the store's
// rows is queued for the store.
func (b *Bridge) mergePolicies(from global.Refusal, origin string, es []policy.Entry, ms []policy.Mark, sentAt int64) error {
	now := b.now()
	if err := b.stamped(from, sentAt, now, len(es)+len(ms)); err != nil {
		return err
	}
	skew := b.cfg.MaxClockSkew.Milliseconds()
	ok := make([]policy.Entry, 0, len(es))
	pruned := policy.TombstoneCutoff(now)
	errs := takeEach(b, from, es, func(e policy.Entry) error {
		if e.Deleted && e.Version.At < pruned {
			// A tombstone the cleanup prunes (a limiter still holding it,
			// say): merging it would bring it back until the next cleanup.
			return nil
		}
		err := e.CheckAt(now, skew)
		if err == nil && origin != "" && e.Version.Origin != origin {
			err = fmt.Errorf("%w: an override accepted in region %q came from %s %q", global.ErrInvalid, e.Version.Origin, from.Source, from.Region)
		}
		if err == nil {
			ok = append(ok, e)
		}
		return err
	})
	// One merge, one view published, for all of them: a store's full read
	// of many rows costs one publish, not one per row.
	changed, err := b.pol.table.MergeChanged(ok...)
	if err != nil { // each entry was checked above
		b.refuse(from, len(ok), err)
		errs, changed = append(errs, err), nil
	}
	var marks []policy.Mark
	errs = append(errs, takeEach(b, from, ms, func(m policy.Mark) error {
		if err := m.CheckAt(now, skew); err != nil {
			return err
		}
		n, err := b.pol.marks.Merge(m)
		if err == nil && n > 0 {
			marks = append(marks, m)
		}
		return err
	})...)
	b.queuePolicies(changed, marks, from.Source == "limiters", from.Source != "store")
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
	out, outMarks, ownMarks := b.pol.out.take(), b.pol.outMarks.take(), b.pol.ownMarks.take()
	b.pol.mu.Unlock()
	own := slices.DeleteFunc(slices.Clone(out), func(e policy.Entry) bool { return e.Version.Origin != b.cfg.Region })
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
	_, errOverrides := flush(ctx, b, b.pol.store, "store overrides")
	_, errMarks := flush(ctx, b, b.pol.storeMarks, "store reset marks")
	return errors.Join(errOverrides, errMarks)
}

// PolicyStoreQueued returns how many overrides and reset marks wait to be
// written to the store.
func (b *Bridge) PolicyStoreQueued() int {
	return b.pol.store.queued() + b.pol.storeMarks.queued()
}

// logPoliciesNotDurable says, in one line, how many overrides and reset
// marks a stopping bridge could not write, if any, why (err), and what its
// last try was.
func (b *Bridge) logPoliciesNotDurable(err error, last lastTry) {
	b.logNotDurable("overrides", b.PolicyStoreQueued(), err, last, "the region's limiters hold them and give them to the next bridge")
}
