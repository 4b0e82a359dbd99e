package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Store is the durable global store of components, override entries and
// reset marks. Safe for concurrent use.
//
// A store keeps one component per (cell, region), and merges by max:
// writing a lower count or expiry
// never lowers what is kept, so writes are idempotent, commutative and safe
// to retry after any error, including one after which some of the rows were
// written. Rows are kept exactly as given: tokens are case-sensitive and
// identifiers are compared byte for byte.
//
// Writes reject the whole call, writing nothing and touching no breaker, if
// any row is invalid: a workspace, namespace or region that is not 1 to 64
// characters of [A-Za-z0-9_-], an identifier that is not 1 to 512 bytes, a
// duration that is not positive, or a negative count.
type Store interface {
	// UpsertComponents merges components with max (count and expire_at
	// each GREATEST), in bounded chunks sorted by primary key (so two
	// bridges never deadlock each other).
	UpsertComponents(ctx context.Context, cs []global.Component) error
	// LoadChanged returns what was written or raised after since: live
	// components (ExpireAt > now), override entries (a
	// tombstone only while its version is not before
	// policy.TombstoneCutoff(now)) and live reset marks; and the mark to pass to
	// the next call. A zero since, or one the store cannot serve
	// incrementally (its clock went back past it, say), returns all of
	// them with Changes.Full set. Nothing changed after since is left out;
	// a row may come again in the next call, which merging (by max, last
	// writer wins) makes harmless. So the cost of a read follows what
	// changed, not what is kept.
	LoadChanged(ctx context.Context, now int64, since Mark) (Changes, error)
	// DeleteExpired deletes rows with ExpireAt <= now (reset marks too,
	// past policy.Mark.ExpireAt with global.MarkGrace) and override
	// tombstones whose version is before policy.TombstoneCutoff(now), at
	// most batch rows per statement, until none are left or ctx ends; it
	// returns how many rows went. batch must be positive.
	DeleteExpired(ctx context.Context, now int64, batch int) (int64, error)
	// UpsertOverrides merges override entries (policy.Entry, tombstones
	// included): per (workspace, namespace, pattern) the entry
	// policy.Compare orders last is kept, so writes are idempotent,
	// commutative and safe to retry. An invalid entry rejects the call.
	UpsertOverrides(ctx context.Context, es []policy.Entry) error
	// LoadOverrides returns every override entry kept, tombstones
	// included, in no particular order.
	LoadOverrides(ctx context.Context) ([]policy.Entry, error)
	// UpsertMarks merges reset marks: per (workspace, namespace,
	// identifier, duration) the largest epoch is kept, and the mark
	// expires at policy.Mark.ExpireAt(global.MarkGrace) of that epoch, so
	// writes are idempotent, commutative and safe to retry. An invalid mark
	// rejects the call.
	UpsertMarks(ctx context.Context, ms []policy.Mark) error
	// LoadMarks returns every mark kept that has not expired at now (unix
	// ms), in no particular order.
	LoadMarks(ctx context.Context, now int64) ([]policy.Mark, error)
	// Close releases the store's resources. Calls after Close fail.
	Close() error
}

// Reconnecter is implemented by a Store that reaches its server over pooled
// connections, which an outage can leave dead while the server answers again
// (bridge/mysql.Store). A bridge's Close calls it when the store failed last,
// so that its last writes go over fresh connections rather than give up on a
// server that answers (Bridge.Close).
type Reconnecter interface {
	// Reconnect drops the store's idle pooled connections and checks, before
	// ctx ends, that the server answers on a newly dialed one (a store that
	// never connected makes one attempt to). Once it returned nil, the next
	// writes go over fresh connections and are not refused by a circuit
	// breaker that earlier failures opened. Its error says why the server
	// did not answer and wraps ErrStoreUnavailable.
	Reconnect(ctx context.Context) error
}

// Mark is a position in a store's order of changes: LoadChanged returns it
// for the next call to start from. What it counts is the store's own (the
// MySQL store's clock, a memory store's change sequence); the zero Mark is
// before every change.
type Mark int64

// Changes is what LoadChanged returns.
type Changes struct {
	Components []global.Component
	Overrides  []policy.Entry
	Marks      []policy.Mark
	// Next is the mark to pass to the next LoadChanged.
	Next Mark
	// Full reports that every live row was returned.
	Full bool
}

// ErrStoreOpen is wrapped by writes refused while the write breaker is open:
// the store has been failing and is not asked at all.
var ErrStoreOpen = errors.New("global store circuit breaker open")

// errStoreClosed is returned by the calls made to a closed MemoryStore.
var errStoreClosed = errors.New("global store closed")

// ErrStoreUnavailable is wrapped by the calls to a store that is not ready
// (not connected yet, say: see bridge/mysql.OpenLazy) and by its readiness
// check while so. Nothing was asked of the server; the caller keeps what it
// meant to write and tries again later.
var ErrStoreUnavailable = errors.New("global store unavailable")

// ErrInvalidRow is wrapped by the error of a write refused, whole, because a
// row breaks the store's rules; retrying it cannot succeed.
var ErrInvalidRow = errors.New("invalid row")

// Limits of the stored rows; the MySQL schema holds exactly these.
const (
	storeMaxToken      = window.MaxTokenLen
	storeMaxIdentifier = 512
)

// storeKey is the primary key of a stored component.
type storeKey struct {
	cell   window.Cell
	region string
}

// compareStoreKeys orders keys as the primary key of the MySQL tables does:
// workspace, namespace, identifier (as bytes), duration, sequence, epoch,
// region.
// Tokens are compared byte for byte too, as their ascii_bin collation does.
func compareStoreKeys(a, b storeKey) int {
	return cmp.Or(cmp.Compare(a.cell.Workspace, b.cell.Workspace), cmp.Compare(a.cell.Namespace, b.cell.Namespace),
		cmp.Compare(a.cell.Identifier, b.cell.Identifier), cmp.Compare(a.cell.Duration, b.cell.Duration),
		cmp.Compare(a.cell.Sequence, b.cell.Sequence), cmp.Compare(a.cell.Epoch, b.cell.Epoch), cmp.Compare(a.region, b.region))
}

// validateComponent says what is wrong with c as a row, if anything.
func validateComponent(c global.Component) error {
	switch k := (storeKey{c.Cell, c.Region}); {
	case !window.ValidToken(k.cell.Workspace):
		return window.TokenError("workspace", k.cell.Workspace)
	case !window.ValidToken(k.cell.Namespace):
		return window.TokenError("namespace", k.cell.Namespace)
	case len(k.cell.Identifier) == 0 || len(k.cell.Identifier) > storeMaxIdentifier:
		return fmt.Errorf("identifier of %d bytes is not 1 to %d bytes", len(k.cell.Identifier), storeMaxIdentifier)
	case k.cell.Duration <= 0:
		return fmt.Errorf("duration %d is not positive", k.cell.Duration)
	case k.cell.Epoch < 0:
		return fmt.Errorf("epoch %d is negative", k.cell.Epoch)
	case !window.ValidToken(k.region):
		return window.TokenError("region", k.region)
	case c.Count < 0:
		return fmt.Errorf("count %d is negative", c.Count)
	}
	return nil
}

// rowKind is what the way of one kind of row (components, override
// entries, reset marks) through the bridge's queues, Prepare and
// the memory store needs to know of it: its key and key order, its merge
// rule, its validation and when it stops mattering. The rest of the way is
// the same for the three.
type rowKind[K comparable, V any] struct {
	name string // what an error calls one row
	// invalidRow makes Prepare's error for an invalid row wrap
	// ErrInvalidRow.
	invalidRow bool
	key        func(V) K
	compare    func(a, b K) int // the store's key order
	// merge returns what the store keeps of old and v (of the same key),
	// and whether that differs from old. It is commutative, associative
	// and idempotent.
	merge    func(old, v V) (V, bool)
	validate func(V) error
	// live reports whether v still matters at now (unix ms): the memory
	// store returns only live rows and deletes the others.
	live func(v V, now int64) bool
}

// componentRows merge by max of count and of expiry, each on its own.
var componentRows = rowKind[storeKey, global.Component]{
	name: "component", invalidRow: true,
	key:     func(c global.Component) storeKey { return storeKey{c.Cell, c.Region} },
	compare: compareStoreKeys,
	merge: func(old, c global.Component) (global.Component, bool) {
		raised := c.Count > old.Count || c.ExpireAt > old.ExpireAt
		c.Count, c.ExpireAt = max(c.Count, old.Count), max(c.ExpireAt, old.ExpireAt)
		return c, raised
	},
	validate: validateComponent,
	live:     func(c global.Component, now int64) bool { return c.ExpireAt > now },
}

// prepare validates vs by k and returns a copy sorted by k's key order,
// the rows of each key merged into one: what a Store writes. It returns an
// error, and nothing, if any row is invalid.
func prepare[K comparable, V any](k rowKind[K, V], vs []V) ([]V, error) {
	for i, v := range vs {
		if err := k.validate(v); err != nil {
			err = fmt.Errorf("%s %d: %w", k.name, i, err)
			if k.invalidRow {
				err = fmt.Errorf("%w: %w", ErrInvalidRow, err)
			}
			return nil, err
		}
	}
	out := slices.Clone(vs)
	slices.SortFunc(out, func(a, b V) int { return k.compare(k.key(a), k.key(b)) })
	n := 0
	for i := range out {
		if n > 0 && k.key(out[n-1]) == k.key(out[i]) {
			out[n-1], _ = k.merge(out[n-1], out[i])
			continue
		}
		out[n] = out[i]
		n++
	}
	return out[:n], nil
}

// PrepareComponents validates cs by the Store rules and returns a copy
// sorted by primary key (workspace, namespace, identifier as bytes, duration,
// sequence, epoch, region), components of the same key merged by max: what a
// Store writes, in the order that keeps two writers from deadlocking.
// An invalid row makes it return an error wrapping ErrInvalidRow.
func PrepareComponents(cs []global.Component) ([]global.Component, error) {
	return prepare(componentRows, cs)
}
