package global

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// A bridge's overrides (docs/architecture.md, "Carrying and storing
// policies"): it holds a policy.Table merged from what its region's
// limiters accepted, what the other regions' bridges forward and what the
// store holds, all by the table's last-writer-wins merge, so the order in
// which they arrive does not matter. Whatever changes its table is
// broadcast to its region's limiters and queued for the store; what its own
// region accepted is also forwarded to the other regions. The store is
// read in full every PolicyReloadInterval, which is how regions converge
// while gateways are down, and tombstones older than
// policy.TombstoneRetention leave the table with the cleanup.

// DefaultPolicyReloadInterval is how often a bridge reads every override
// from the store by default.
const DefaultPolicyReloadInterval = 2 * time.Second

// bridgePolicies is the policy state of a bridge.
type bridgePolicies struct {
	table *policy.Table
	mu    sync.Mutex
	// out holds what changed the table since the last batch, to broadcast
	// (and, when this region accepted it, to forward); store what the store
	// still lacks.
	out   map[policy.Key]policy.Entry
	store map[policy.Key]policy.Entry
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
	return b.mergePolicies(Refusal{Source: "limiters", Region: b.cfg.Region}, b.cfg.Region, es, sentAt)
}

// FromRegionPolicies merges the override entries the bridge of region
// forwarded, by the rules of FromLimiterPolicies: each must be region's own.
// This region's own forwards, which come back on the same subject, are
// ignored.
func (b *Bridge) FromRegionPolicies(region string, es []policy.Entry, sentAt int64) error {
	if region == b.cfg.Region {
		return nil
	}
	return b.mergePolicies(Refusal{Source: "regions", Region: region}, region, es, sentAt)
}

// mergePolicies merges es, each of which must have origin as its origin
// (any origin when origin is empty: the store's rows).
func (b *Bridge) mergePolicies(from Refusal, origin string, es []policy.Entry, sentAt int64) error {
	now := b.now()
	skew := b.cfg.MaxClockSkew.Milliseconds()
	if sentAt != 0 {
		if err := CheckSentAt(sentAt, now, b.cfg.MaxClockSkew); err != nil {
			b.refuse(from, len(es), err)
			return err
		}
	}
	var errs []error
	var changed []policy.Entry
	for _, e := range es {
		err := e.CheckAt(now, skew)
		if err == nil && origin != "" && e.Version.Origin != origin {
			err = fmt.Errorf("%w: an override accepted in region %q came from %s %q", ErrInvalid, e.Version.Origin, from.Source, from.Region)
		}
		if err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
			continue
		}
		n, err := b.pol.table.Merge(e)
		if err != nil {
			b.refuse(from, 1, err)
			errs = append(errs, err)
			continue
		}
		if n > 0 {
			changed = append(changed, e)
		}
	}
	if len(changed) > 0 {
		b.pol.mu.Lock()
		for _, e := range changed {
			b.pol.out[e.Key] = keepWinner(b.pol.out, e)
			if from.Source != "store" {
				b.pol.store[e.Key] = keepWinner(b.pol.store, e)
			}
		}
		b.pol.mu.Unlock()
	}
	return errors.Join(errs...)
}

// keepWinner returns e, or what m holds for e's key when that wins over e.
func keepWinner(m map[policy.Key]policy.Entry, e policy.Entry) policy.Entry {
	if old, ok := m[e.Key]; ok && policy.Compare(old, e) > 0 {
		return old
	}
	return e
}

// batchPolicies broadcasts what changed the table to this region's
// limiters and forwards this region's own changes to the other regions.
// What fails to go out is not retried here: limiters repair by digest, and
// other regions by reading the store.
func (b *Bridge) batchPolicies(ctx context.Context) {
	b.pol.mu.Lock()
	if len(b.pol.out) == 0 {
		b.pol.mu.Unlock()
		return
	}
	out := make([]policy.Entry, 0, len(b.pol.out))
	for _, e := range b.pol.out {
		out = append(out, e)
	}
	clear(b.pol.out)
	b.pol.mu.Unlock()
	var own []policy.Entry
	for _, e := range out {
		if e.Version.Origin == b.cfg.Region {
			own = append(own, e)
		}
	}
	if len(own) > 0 {
		if err := b.cfg.Transport.ForwardPolicies(ctx, own); err != nil {
			b.log.Debug("forwarding overrides failed; the store carries them", "error", err)
		}
	}
	if err := b.cfg.Transport.BroadcastPolicies(ctx, out); err != nil {
		b.log.Debug("broadcasting overrides failed; limiters repair by digest", "error", err)
	}
}

// writePolicies writes the queued overrides to the store; what fails stays
// queued.
func (b *Bridge) writePolicies(ctx context.Context) error {
	b.pol.mu.Lock()
	if len(b.pol.store) == 0 {
		b.pol.mu.Unlock()
		return nil
	}
	es := make([]policy.Entry, 0, len(b.pol.store))
	for _, e := range b.pol.store {
		es = append(es, e)
	}
	clear(b.pol.store)
	b.pol.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StoreTimeout)
	defer cancel()
	err := b.cfg.Store.UpsertOverrides(ctx, es)
	if err == nil {
		return nil
	}
	b.pol.mu.Lock()
	for _, e := range es {
		b.pol.store[e.Key] = keepWinner(b.pol.store, e)
	}
	b.pol.mu.Unlock()
	return fmt.Errorf("store overrides: %w", err)
}

// reloadPolicies merges every override the store holds.
func (b *Bridge) reloadPolicies(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StoreTimeout)
	defer cancel()
	es, err := b.cfg.Store.LoadOverrides(ctx)
	if err != nil {
		return fmt.Errorf("store load overrides: %w", err)
	}
	// Rows are input too; every origin may be there.
	_ = b.mergePolicies(Refusal{Source: "store", Region: "store"}, "", es, 0)
	return nil
}

// PolicyStoreQueued returns how many overrides wait to be written to the
// store.
func (b *Bridge) PolicyStoreQueued() int {
	b.pol.mu.Lock()
	defer b.pol.mu.Unlock()
	return len(b.pol.store)
}

// closePolicies writes the queued overrides once at Close. Those it cannot
// write are not lost: the region's limiters hold every override they
// accepted and give them to the region's next bridge (their digest differs
// from its, and they send what they hold).
func (b *Bridge) closePolicies(ctx context.Context) {
	if err := b.writePolicies(ctx); err != nil {
		b.log.Warn("stopping with overrides not yet durable in MySQL: the region's limiters hold them and give them to the next bridge",
			"not_durable", b.PolicyStoreQueued(), "error", err)
	}
}
