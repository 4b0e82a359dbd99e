package policy

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/window"
)

// AllDurations is the Duration of a Mark that resets every duration of its
// identifier.
const AllDurations = 0

// Mark is a reset of one identifier's usage, for one duration or for all
// (AllDurations): usage before Epoch is forgotten. Marks of one
// (workspace, namespace, identifier, duration) merge by max of Epoch.
type Mark struct {
	Workspace  string
	Namespace  string
	Identifier string
	// Duration is the window length reset, in milliseconds, or
	// AllDurations.
	Duration int64
	// Epoch is the unix millisecond at which the reset was accepted, by
	// the accepting process's clock: 1 to window.MaxTime.
	Epoch int64
}

// Validate says what is wrong with m, if anything: tokens by
// window.ValidToken, an identifier of 1 to window.MaxIdentifierLen bytes
// (any bytes: a reset names one identifier, never a pattern), a duration of
// AllDurations or one window.ValidDuration accepts, an epoch of 1
// to window.MaxTime. The error wraps ErrInvalid.
func (m Mark) Validate() error {
	switch {
	case !window.ValidToken(m.Workspace):
		return fmt.Errorf("%w: %w", ErrInvalid, window.TokenError("workspace", m.Workspace))
	case !window.ValidToken(m.Namespace):
		return fmt.Errorf("%w: %w", ErrInvalid, window.TokenError("namespace", m.Namespace))
	case len(m.Identifier) == 0 || len(m.Identifier) > window.MaxIdentifierLen:
		return fmt.Errorf("%w: identifier of %d bytes is not 1 to %d bytes", ErrInvalid, len(m.Identifier), window.MaxIdentifierLen)
	case m.Duration != AllDurations && window.ValidDuration(m.Duration) != nil:
		return fmt.Errorf("%w: duration %d is neither 0 (all) nor %d to %d milliseconds nor a calendar period", ErrInvalid, m.Duration, int64(window.MinDuration), int64(window.MaxDuration))
	case m.Epoch < 1 || m.Epoch > window.MaxTime:
		return fmt.Errorf("%w: epoch %d out of range 1..%d", ErrInvalid, m.Epoch, int64(window.MaxTime))
	}
	return nil
}

// CheckAt is Validate for a mark received from another process at now
// (unix ms, the receiver's clock): it is also refused, with ErrFuture, when
// its epoch is more than skewMs ahead of now.
func (m Mark) CheckAt(now, skewMs int64) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if m.Epoch > now+skewMs {
		return fmt.Errorf("%w: epoch %dms from now (tolerance %dms)", ErrFuture, m.Epoch-now, skewMs)
	}
	return nil
}

// ExpireAt returns when m stops mattering: the end of the window after the
// one holding its epoch, plus graceMs (the cells' expiry grace). From then
// on no decision reads a cell that CellEpoch would give m's epoch. A mark of
// every duration lasts as one of AllDurationsFor does; before it goes,
// each replica turns it into marks of the longer durations whose cells of
// its identifier it holds (Marks.Prune), so that it lasts, for each
// duration, only as long as that duration's cells matter.
func (m Mark) ExpireAt(graceMs int64) int64 {
	d := m.Duration
	if d == AllDurations {
		d = AllDurationsFor
	}
	return window.Following(window.Sequence(m.Epoch, d), d) + graceMs
}

// AllDurationsFor is the duration (milliseconds) whose windows a mark of
// every duration lasts as (ExpireAt): 5 to 10 minutes. So the marks that
// resets of every duration leave follow the rate of resets, never their
// total: a support tool resetting an identifier a second leaves 600 at
// most, and only the identifiers with longer windows in use keep a mark
// of those durations, as long as those windows matter.
const AllDurationsFor = 5 * 60_000

// CellEpoch returns the epoch that is part of the identity of the cell of
// sequence seq and duration d, given the latest reset epoch of its
// identifier (0: never reset): epoch for the window holding the reset and
// every earlier one, 0 for later windows. Later windows began after the
// reset, so all their usage counts and they keep their ordinary identity;
// the window holding the reset mixes usage from before and after it, and
// its cell of this epoch holds only what came after. An earlier window's
// cell of this epoch is written only by a host whose clock is behind the
// reset's, after it learnt of the reset.
func CellEpoch(epoch, d, seq int64) int64 {
	if epoch > 0 && seq <= window.Sequence(epoch, d) {
		return epoch
	}
	return 0
}

// Forgotten reports whether a cell of sequence seq, duration d and epoch
// cellEpoch holds usage that the reset of the given epoch forgot: its epoch
// is below the one CellEpoch names for it. A decision neither reads nor
// counts into a forgotten cell; it stays where it is until it expires.
func Forgotten(epoch, d, seq, cellEpoch int64) bool {
	return cellEpoch < CellEpoch(epoch, d, seq)
}

// Marks holds the reset marks of every workspace. Safe for concurrent use;
// the zero value is not usable, call NewMarks.
type Marks struct {
	// n counts the marks, so that Epoch answers without a lock while there
	// are none.
	n atomic.Int64

	mu      sync.RWMutex
	ids     map[idKey]*markSet
	perWS   map[string]int
	digests Digests
}

// idKey names one identifier of one namespace.
type idKey struct{ ws, ns, id string }

// markSet is the marks of one identifier: for every duration, and for
// each duration reset on its own.
type markSet struct {
	all  int64 // 0: none
	durs []durEpoch
}

type durEpoch struct{ d, epoch int64 }

// NewMarks returns an empty set of marks.
func NewMarks() *Marks {
	return &Marks{ids: make(map[idKey]*markSet), perWS: make(map[string]int)}
}

// Epoch returns the latest reset epoch that applies to the cells of
// (workspace, namespace, identifier, d): the larger of the marks of d and
// of every duration; 0 when there is none. It allocates nothing.
func (ms *Marks) Epoch(workspace, namespace, identifier string, d int64) int64 {
	if ms.n.Load() == 0 {
		return 0
	}
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	s := ms.ids[idKey{workspace, namespace, identifier}]
	if s == nil {
		return 0
	}
	return s.epoch(d)
}

func (s *markSet) epoch(d int64) int64 {
	e := s.all
	for _, de := range s.durs {
		if de.d == d {
			e = max(e, de.epoch)
		}
	}
	return e
}

// own returns the epoch of s's mark of duration d alone (0: none).
func (s *markSet) own(d int64) int64 {
	for _, de := range s.durs {
		if de.d == d {
			return de.epoch
		}
	}
	return 0
}

// latest returns the largest epoch of any duration of s.
func (s *markSet) latest() int64 {
	e := s.all
	for _, de := range s.durs {
		e = max(e, de.epoch)
	}
	return e
}

// Reset records a reset of (workspace, namespace, identifier) for duration
// d (AllDurations: all), accepted at now (unix ms), and returns the mark to
// carry to the other replicas. Its epoch is now, or one more than the epoch
// any check of the reset durations uses at present if the clock has not
// passed it, so a reset always forgets what came before it here. A new mark
// is refused with ErrTooMany when the workspace already holds
// MaxMarksPerWorkspace; an invalid one with ErrInvalid. A refused Reset
// changes nothing.
func (ms *Marks) Reset(workspace, namespace, identifier string, d, now int64) (Mark, error) {
	m := Mark{Workspace: workspace, Namespace: namespace, Identifier: identifier, Duration: d, Epoch: max(now, 1)}
	if err := m.Validate(); err != nil {
		return Mark{}, fmt.Errorf("reset: %w", err)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s := ms.ids[idKey{workspace, namespace, identifier}]
	if s != nil {
		cur := s.latest()
		if d != AllDurations {
			cur = s.epoch(d)
		}
		m.Epoch = max(m.Epoch, cur+1)
	}
	if err := m.Validate(); err != nil {
		return Mark{}, fmt.Errorf("reset: %w", err)
	}
	if !s.has(d) && ms.perWS[workspace] >= MaxMarksPerWorkspace {
		return Mark{}, fmt.Errorf("reset: %w: workspace %s holds %d reset marks, the most allowed until some expire",
			ErrTooMany, workspace, ms.perWS[workspace])
	}
	ms.merge(m)
	return m, nil
}

// has reports whether s holds a mark of duration d.
func (s *markSet) has(d int64) bool {
	if s == nil {
		return false
	}
	if d == AllDurations {
		return s.all != 0
	}
	for _, de := range s.durs {
		if de.d == d {
			return true
		}
	}
	return false
}

// Merge folds marks from other replicas (or the store) in by max of epoch
// and returns how many raised an epoch. Merging the same marks in any
// order, any number of times, leaves the same set. If any mark is invalid,
// nothing is merged and the error (wrapping ErrInvalid) names it. Merge does
// not refuse marks beyond the workspace's bound: replicas must converge on
// what other regions accepted.
func (ms *Marks) Merge(marks ...Mark) (int, error) {
	for i, m := range marks {
		if err := m.Validate(); err != nil {
			return 0, fmt.Errorf("merge reset mark %d: %w", i, err)
		}
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	n := 0
	for _, m := range marks {
		if ms.merge(m) {
			n++
		}
	}
	return n, nil
}

// merge folds one valid mark in. The caller holds ms.mu.
func (ms *Marks) merge(m Mark) bool {
	k := idKey{m.Workspace, m.Namespace, m.Identifier}
	s := ms.ids[k]
	if s == nil {
		s = &markSet{}
		ms.ids[k] = s
	}
	if m.Duration == AllDurations {
		if m.Epoch <= s.all {
			return false
		}
		if s.all == 0 {
			ms.count(m.Workspace, 1)
		} else {
			ms.flip(Mark{m.Workspace, m.Namespace, m.Identifier, AllDurations, s.all})
		}
		s.all = m.Epoch
		ms.flip(m)
		return true
	}
	for i := range s.durs {
		if s.durs[i].d == m.Duration {
			if m.Epoch <= s.durs[i].epoch {
				return false
			}
			ms.flip(Mark{m.Workspace, m.Namespace, m.Identifier, m.Duration, s.durs[i].epoch})
			ms.flip(m)
			s.durs[i].epoch = m.Epoch
			return true
		}
	}
	s.durs = append(s.durs, durEpoch{m.Duration, m.Epoch})
	ms.flip(m)
	ms.count(m.Workspace, 1)
	return true
}

// count adds delta to the marks of workspace. The caller holds ms.mu.
func (ms *Marks) count(workspace string, delta int) {
	ms.n.Add(int64(delta))
	if ms.perWS[workspace] += delta; ms.perWS[workspace] <= 0 {
		delete(ms.perWS, workspace)
	}
}

// Prune forgets the marks that no longer matter at now (ExpireAt with
// graceMs at or before now) and returns how many went. A mark of every
// duration that goes is first turned into a mark of each duration inUse
// names for its identifier (the durations whose cells this replica holds;
// nil: none) whose cells the reset still concerns at now, unless a mark
// of that duration holds its epoch already: those are returned, for the
// replica to pass on to the others, which may not hold those cells. inUse
// is called with ms locked: it must not call ms's methods.
func (ms *Marks) Prune(now, graceMs int64, inUse func(workspace, namespace, identifier string) []int64) (n int, kept []Mark) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for k, s := range ms.ids {
		if s.all != 0 {
			if m := (Mark{k.ws, k.ns, k.id, AllDurations, s.all}); m.ExpireAt(graceMs) <= now {
				if inUse != nil {
					for _, d := range inUse(k.ws, k.ns, k.id) {
						if dm := (Mark{k.ws, k.ns, k.id, d, s.all}); d != AllDurations && s.own(d) < s.all &&
							dm.ExpireAt(graceMs) > now && ms.merge(dm) {
							kept = append(kept, dm)
						}
					}
				}
				ms.flip(m)
				s.all = 0
				ms.count(k.ws, -1)
				n++
			}
		}
		pruned := s.durs[:0]
		for _, de := range s.durs {
			if m := (Mark{k.ws, k.ns, k.id, de.d, de.epoch}); m.ExpireAt(graceMs) <= now {
				ms.flip(m)
				ms.count(k.ws, -1)
				n++
				continue
			}
			pruned = append(pruned, de)
		}
		s.durs = pruned
		if s.all == 0 && len(s.durs) == 0 {
			delete(ms.ids, k)
		}
	}
	return n, kept
}

// Expiring returns the marks of every duration that Prune(now, graceMs,
// ...) would end: the identifiers whose durations in use it will ask.
func (ms *Marks) Expiring(now, graceMs int64) []Mark {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	var out []Mark
	for k, s := range ms.ids {
		if m := (Mark{k.ws, k.ns, k.id, AllDurations, s.all}); s.all != 0 && m.ExpireAt(graceMs) <= now {
			out = append(out, m)
		}
	}
	return out
}

// All returns every mark, ordered by workspace, namespace, identifier and
// duration: what a replica sends another that needs all of them.
func (ms *Marks) All() []Mark {
	ms.mu.RLock()
	var out []Mark
	for k, s := range ms.ids {
		if s.all != 0 {
			out = append(out, Mark{k.ws, k.ns, k.id, AllDurations, s.all})
		}
		for _, de := range s.durs {
			out = append(out, Mark{k.ws, k.ns, k.id, de.d, de.epoch})
		}
	}
	ms.mu.RUnlock()
	slices.SortFunc(out, func(a, b Mark) int {
		if c := cmp.Compare(a.Workspace, b.Workspace); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Identifier, b.Identifier); c != 0 {
			return c
		}
		return cmp.Compare(a.Duration, b.Duration)
	})
	return out
}

// Len returns how many marks workspace holds.
func (ms *Marks) Len(workspace string) int {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	return ms.perWS[workspace]
}

// Digest returns a hash of every mark held that does not depend on the
// order they arrived in: two sets holding the same marks have the same
// digest.
func (ms *Marks) Digest() uint64 {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	return ms.digests.Total
}

// Digests returns Digest whole and in parts (MarkShard).
func (ms *Marks) Digests() Digests {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	return ms.digests
}

// AllIn returns the marks whose identifiers fall in the parts of Digests
// that parts names, part by part (in All's order within a part),
// as Table.EntriesIn does.
func (ms *Marks) AllIn(parts Parts) []Mark {
	all := ms.All()
	out := all[:0]
	for _, m := range all {
		if parts.Has(MarkShard(m.Workspace, m.Namespace, m.Identifier)) {
			out = append(out, m)
		}
	}
	slices.SortStableFunc(out, func(a, b Mark) int {
		return cmp.Compare(MarkShard(a.Workspace, a.Namespace, a.Identifier), MarkShard(b.Workspace, b.Namespace, b.Identifier))
	})
	return out
}

// flip adds m's hash to the digests, or takes it out. The caller holds
// ms.mu.
func (ms *Marks) flip(m Mark) {
	ms.digests.flip(MarkShard(m.Workspace, m.Namespace, m.Identifier), markHash(m))
}

func markHash(m Mark) uint64 {
	h := fnvStr(fnvOffset, m.Workspace)
	h = fnvStr(h, m.Namespace)
	h = fnvStr(h, m.Identifier)
	h = fnvNum(h, m.Duration)
	return fnvNum(h, m.Epoch)
}
