package policy

import (
	"cmp"
	"fmt"
	"slices"
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
	if err := validScope(m.Workspace, m.Namespace); err != nil {
		return err
	}
	switch {
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
	return checkAt(m.Validate(), "epoch", m.Epoch, now, skewMs)
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

	ledger
	ids map[idKey]*markSet
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
	return &Marks{ledger: ledger{perWS: make(map[string]int)}, ids: make(map[idKey]*markSet)}
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
	return ms.ids[idKey{workspace, namespace, identifier}].epoch(d)
}

// epoch is Epoch for the marks s (maybe nil) of one identifier.
func (s *markSet) epoch(d int64) int64 {
	return max(s.own(AllDurations), s.own(d))
}

// own returns the epoch of s's mark of duration d alone (AllDurations: of
// every duration); 0 when s (maybe nil) holds none.
func (s *markSet) own(d int64) int64 {
	if p := s.slot(d); p != nil {
		return *p
	}
	return 0
}

// slot returns where s (maybe nil) holds the epoch of its mark of duration
// d (AllDurations: of every duration), nil when it has no place for one.
func (s *markSet) slot(d int64) *int64 {
	switch {
	case s == nil:
		return nil
	case d == AllDurations:
		return &s.all
	}
	for i := range s.durs {
		if s.durs[i].d == d {
			return &s.durs[i].epoch
		}
	}
	return nil
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
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s := ms.ids[idKey{workspace, namespace, identifier}]
	cur := s.epoch(d)
	if d == AllDurations && s != nil {
		cur = s.latest()
	}
	m.Epoch = max(m.Epoch, cur+1)
	// Validated once its epoch is known: no other check reads the epoch.
	if err := m.Validate(); err != nil {
		return Mark{}, fmt.Errorf("reset: %w", err)
	}
	if s.own(d) == 0 && ms.perWS[workspace] >= MaxMarksPerWorkspace {
		return Mark{}, fmt.Errorf("reset: %w: workspace %s holds %d reset marks, the most allowed until some expire",
			ErrTooMany, workspace, ms.perWS[workspace])
	}
	ms.merge(m)
	return m, nil
}

// Merge folds marks from other replicas (or the store) in by max of epoch
// and returns how many raised an epoch. Merging the same marks in any
// order, any number of times, leaves the same set. If any mark is invalid,
// nothing is merged and the error (wrapping ErrInvalid) names it. Merge does
// not refuse marks beyond the workspace's bound: replicas must converge on
// what other regions accepted.
func (ms *Marks) Merge(marks ...Mark) (int, error) {
	if err := validateAll("merge reset mark", marks); err != nil {
		return 0, err
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
	p := s.slot(m.Duration)
	if p == nil { // a duration s has no mark of yet: epoch 0 until now
		s.durs = append(s.durs, durEpoch{d: m.Duration})
		p = &s.durs[len(s.durs)-1].epoch
	}
	if m.Epoch <= *p {
		return false
	}
	if *p == 0 {
		ms.count(m.Workspace, 1)
	} else {
		ms.flip(Mark{m.Workspace, m.Namespace, m.Identifier, m.Duration, *p})
	}
	*p = m.Epoch
	ms.flip(m)
	return true
}

// count adds delta to the marks of workspace. The caller holds ms.mu.
func (ms *Marks) count(workspace string, delta int) {
	ms.n.Add(int64(delta))
	tally(ms.perWS, workspace, delta)
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
	// expired takes m out if it no longer matters at now, and says so.
	expired := func(m Mark) bool {
		if m.ExpireAt(graceMs) > now {
			return false
		}
		ms.flip(m)
		ms.count(m.Workspace, -1)
		n++
		return true
	}
	for k, s := range ms.ids {
		if s.all != 0 && expired(Mark{k.ws, k.ns, k.id, AllDurations, s.all}) {
			if inUse != nil {
				for _, d := range inUse(k.ws, k.ns, k.id) {
					if dm := (Mark{k.ws, k.ns, k.id, d, s.all}); d != AllDurations && s.own(d) < s.all &&
						dm.ExpireAt(graceMs) > now && ms.merge(dm) {
						kept = append(kept, dm)
					}
				}
			}
			s.all = 0
		}
		s.durs = slices.DeleteFunc(s.durs, func(de durEpoch) bool { return expired(Mark{k.ws, k.ns, k.id, de.d, de.epoch}) })
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
	return snapshot(&ms.ledger, ms.each, CompareMarks)
}

// AllIn returns the marks whose identifiers fall in the parts of Digests
// that parts names, part by part (in All's order within a part), as
// Table.EntriesIn does.
func (ms *Marks) AllIn(parts Parts) []Mark {
	return inParts(&ms.ledger, ms.each, parts, markShard, CompareMarks)
}

// each yields every mark, in no order. The caller holds ms.mu.
func (ms *Marks) each(yield func(Mark) bool) {
	for k, s := range ms.ids {
		if s.all != 0 && !yield(Mark{k.ws, k.ns, k.id, AllDurations, s.all}) {
			return
		}
		for _, de := range s.durs {
			if !yield(Mark{k.ws, k.ns, k.id, de.d, de.epoch}) {
				return
			}
		}
	}
}

// CompareMarks orders marks by workspace, namespace, identifier (as
// CompareKeys orders keys) and duration, never by epoch: the order of All,
// and of a store's primary key.
func CompareMarks(a, b Mark) int {
	return cmp.Or(CompareKeys(Key{a.Workspace, a.Namespace, a.Identifier}, Key{b.Workspace, b.Namespace, b.Identifier}),
		cmp.Compare(a.Duration, b.Duration))
}

func markShard(m Mark) int { return MarkShard(m.Workspace, m.Namespace, m.Identifier) }

// flip adds m's hash to the digests, or takes it out. The caller holds
// ms.mu.
func (ms *Marks) flip(m Mark) {
	ms.digests.flip(markShard(m), markHash(m))
}

func markHash(m Mark) uint64 {
	return fnvNum(fnvNum(fnvName(m.Workspace, m.Namespace, m.Identifier), m.Duration), m.Epoch)
}
