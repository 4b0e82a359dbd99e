// Package region holds a region's shared store of window-cell counts (the
// origin) that converges the limiter processes of one region: the Origin
// interface and its Redis implementation. (internal/regiontest holds the
// same rules in Go, in memory, for tests.)
//
// The origin is where a region's admissions become final. A limiter admits a
// request only once the origin counts its cost: either the origin charged it
// for that request (Sync with a Request), or it is part of a lease the origin
// charged to the limiter in advance (Sync's Want), which the limiter then
// spends locally without a round trip. The origin charges only what fits the
// rule of package window against everything it has charged, so the region
// never admits beyond the limit; and it refuses a request only when the
// region's admissions alone (leases still live not counted) leave no room for
// it, so the region never denies what one exact limiter would admit. A
// request that fits only if live leases held elsewhere turn out unused waits
// (Pending) until they are used or returned. docs/architecture.md, "Exact in
// a region", argues both.
package region

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Origin is a region's shared store of cell counts. Implementations are safe
// for concurrent use. A cell's key expires on its own after ExpireAt.
type Origin interface {
	// Sync exchanges one reporter's state of one cell with the origin, in
	// one round trip and atomically: it raises the cell's local count of
	// its LocalID to its Local, records what the reporter used and holds
	// (unless a later Sync of the reporter was applied already), then
	// decides its Requests in order and grants a lease (see Sync, Outcome).
	// It is the request path's call.
	Sync(ctx context.Context, reporter string, s Sync) (SyncResult, error)

	// Settle is Sync for many cells in one round trip (each cell atomic on
	// its own), for the background: results in the order of ss. On error any
	// subset may have been applied; the reporter sends its state again with
	// a higher Seq and nothing is lost or counted twice. If a sync of ss
	// has an invalid local count it fails with ErrInvalidLocal before
	// anything is applied.
	Settle(ctx context.Context, reporter string, ss []Sync) ([]SyncResult, error)

	// Import records, for each cell, the other regions' usage and the
	// region's own published count as its bridge reported them, each kept
	// at its maximum, so that a limiter that creates the cell later starts
	// from the global view (Sync); and raises the cells' local counts
	// to Imported.Locals, as a Sync's Local raises its own. A cell Import
	// creates expires at its ExpireAt. Calls are idempotent and may be
	// repeated or reordered. A call with an invalid local count (see
	// LocalCount) fails with ErrInvalidLocal and changes nothing.
	Import(ctx context.Context, imports []Imported) error

	// Close releases the origin's resources. It does not wait for calls in
	// flight to other goroutines.
	Close() error
}

// Totals is what an origin knows of one cell, as (*Redis).Read returns
// it.
type Totals struct {
	// Count is the cell's count (CellCounts.Used).
	Count int64
	// Foreign is the other regions' usage Import recorded.
	Foreign int64
}

// Imported is one cell's global view as the region's bridge sent it.
type Imported struct {
	Cell window.Cell
	// Foreign is the sum of the other regions' counts.
	Foreign int64
	// Own is the region's own count as the bridge last stored it: a lower
	// bound of the regional total.
	Own int64
	// Locals are limiters' Sync.Local counts of the cell as they published
	// them (each published its count before it answered the checks it
	// admitted), to be raised to exactly as a Sync's Local is. So what a
	// limiter admitted without the origin is counted even if it dies
	// before its own sync could carry it.
	Locals []LocalCount
	// ExpireAt is the unix millisecond after which the cell no longer
	// matters.
	ExpireAt int64
}

// LocalCount is one limiter's count of what it admitted in a cell without
// the origin (Sync.Local), under its LocalID. ID must pass CheckLocalID and
// Count must not be negative, or Import fails and changes nothing; a Count
// above window.MaxCount counts as window.MaxCount.
type LocalCount struct {
	ID    string
	Count int64
}

// MaxLocalID is the longest LocalID (and LocalCount.ID), in bytes.
const MaxLocalID = 64

// ErrInvalidLocal is wrapped by the errors of Sync, Settle and Import calls
// refused because a local count is invalid (CheckLocalID, a negative
// count, a Local without a LocalID): the call changed nothing.
var ErrInvalidLocal = errors.New("invalid local count")

// CheckLocalID returns an error wrapping ErrInvalidLocal unless id is a
// valid LocalID: 1 to MaxLocalID bytes of [A-Za-z0-9._-]. The origin keeps
// a local count under it (Redis: a key of the cell's locals), and these
// bytes name it the same in every layer.
func CheckLocalID(id string) error {
	if id == "" || len(id) > MaxLocalID {
		return fmt.Errorf("%w: local ID %q: want 1 to %d bytes", ErrInvalidLocal, id, MaxLocalID)
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("%w: local ID %q: want only [A-Za-z0-9._-]", ErrInvalidLocal, id)
		}
	}
	return nil
}

// CheckSync returns an error wrapping ErrInvalidLocal unless s's local
// count is valid: Local not negative, and a LocalID that passes
// CheckLocalID unless both are empty (Local 0, LocalID ""). An Origin
// refuses a Sync that fails it before it changes anything.
func CheckSync(s *Sync) error {
	if s.Local < 0 {
		return fmt.Errorf("%w: Local %d is negative", ErrInvalidLocal, s.Local)
	}
	if s.LocalID == "" {
		if s.Local != 0 {
			return fmt.Errorf("%w: Local %d without a LocalID", ErrInvalidLocal, s.Local)
		}
		return nil
	}
	return CheckLocalID(s.LocalID)
}

// CheckImports returns an error wrapping ErrInvalidLocal unless every
// local count of imports is valid: an ID that passes CheckLocalID and a
// Count not negative. An Origin refuses an Import that fails it before it
// changes anything.
func CheckImports(imports []Imported) error {
	for _, im := range imports {
		for _, l := range im.Locals {
			if err := CheckLocalID(l.ID); err != nil {
				return err
			}
			if l.Count < 0 {
				return fmt.Errorf("%w: local %q count %d is negative", ErrInvalidLocal, l.ID, l.Count)
			}
		}
	}
	return nil
}

// Sync is one reporter's state of one cell and what it asks of the origin.
type Sync struct {
	Cell window.Cell
	// Seq orders a reporter's syncs: a Sync whose Seq is not above the last
	// one applied for the reporter in the cell changes nothing but the
	// Local raise (below) and is granted nothing (it was overtaken, say by
	// a retry after a lost reply).
	Seq int64
	// Used is the cost the reporter has admitted in the cell so far, or
	// less (a lower bound: it never exceeds what was admitted).
	Used int64
	// Claim is what the origin is to count for the reporter before this
	// call's grants: its admissions plus the unused lease it still holds
	// (at least Used). A grant whose reply was lost is not in it, and so is
	// returned; a lease the reporter gave back is not in it either.
	Claim int64
	// Requests are decided in order, each as one check of its Cost. A
	// Reserve request's cost, once granted, joins the reporter's lease (a
	// batch that may still give it back); any other granted cost counts as
	// used at once.
	Requests []Request
	// Want is lease wanted beyond the requests: cost the reporter expects
	// to admit before its next sync. The origin grants at most a share of
	// what the limit leaves (LeaseShare), and nothing while the cell is
	// contended.
	Want int64
	// Limit, Elapsed (milliseconds of the cell's window elapsed, by the
	// reporter's clock), Foreign and ForeignPrevious (other regions' usage
	// of the cell and of the one before it, as the reporter knows it) give
	// the rule's capacity for the region's count of the cell.
	Limit, Elapsed           int64
	Foreign, ForeignPrevious int64
	// Floor is a lower bound of the region's admissions in Cell that the
	// reporter knows (what the origin last reported used, plus its own
	// admissions since). Above what the origin holds charged, the cell
	// was lost: the difference is counted as lost admissions, as for an
	// Import's Own, until the other reporters send their claims again (each
	// then takes its part back out). So a cell the origin lost is rebuilt
	// by the first sync of any live reporter rather than once every
	// reporter has synced again.
	Floor int64
	// LiveFor is how long (milliseconds, from when the origin applies the
	// sync) a lease the reporter holds after it stays live: the reporter
	// stops spending it earlier, and a request elsewhere that fits only if
	// the lease is unused waits at most that long for it to be returned.
	// Past it an unreturned lease counts as used.
	LiveFor int64
	// ExpireAt is the unix millisecond after which the cell can no longer
	// affect a decision and the origin may forget it.
	ExpireAt int64
	// Local is the cost this process has admitted in the cell without the
	// origin (decided while it failed) since it started, across
	// generations; LocalID names the process for it, and differs from one
	// start to the next ("" when it never decided without the origin).
	// Local is not part of Used or Claim. The origin keeps, per cell and
	// LocalID, the largest Local it has been told, by this reporter's
	// syncs (stale ones included) or by any Import (Imported.Locals):
	// what a raise adds counts as used once, and is taken out of the lost
	// admissions ("b") that another reporter's Floor or an import's Own
	// may have restored with it. So the same admissions told twice, by
	// two paths, count once.
	//
	// LocalID is "" (and Local 0) or passes CheckLocalID; Local is not
	// negative; otherwise Sync and Settle fail (ErrInvalidLocal) and change
	// nothing. A Local above window.MaxCount counts as window.MaxCount.
	Local   int64
	LocalID string
	// Generation tells apart the successive states this reporter keeps in
	// the cell: the origin forgets a reporter it has not heard of for
	// ForgetAfter, so a reporter that has not synced the cell for half of
	// that starts a new generation, reporting from zero what it admitted
	// since. 0 is the first.
	Generation int64
	// Retire says the reporter is done with the cell (it is shutting down):
	// once the sync leaves nothing unused in its claim, the origin folds
	// its part into the cell's totals and forgets it, keeping only a mark
	// that makes later syncs of it change nothing but their Local raise.
	Retire bool
	// ReportOnly says the sync only records the reporter's state (no
	// Requests, no Want): the origin then neither reads the previous cell
	// nor computes the room (Room is RoomUnknown, PreviousRead false),
	// which makes the background's most frequent call cheaper.
	ReportOnly bool
	// Fixed asks for a fixed window (window.Input.Fixed): the cell alone
	// is weighed against Limit, so the origin does not read the previous
	// cell (PreviousRead false) and neither it nor ForeignPrevious takes
	// room. Requests of one Sync share it, as they share Limit.
	Fixed bool
	// PreviousEpoch is the epoch of the cell before Cell whose counts the
	// rule weighs (window.Cell.Epoch; policy.CellEpoch names it): Cell's
	// own epoch, except in the window after a reset's, whose cell of epoch
	// 0 follows the reset window's cell of the reset's epoch. 0 for a cell
	// never reset.
	PreviousEpoch int64
}

// Previous returns the cell before s.Cell whose counts the rule weighs:
// sequence one less, epoch PreviousEpoch.
func (s *Sync) Previous() window.Cell {
	p := s.Cell
	p.Sequence--
	p.Epoch = s.PreviousEpoch
	return p
}

// Previous returns the cell before c of c's epoch, the one (*Redis).Read
// reads with it.
func Previous(c window.Cell) window.Cell {
	c.Sequence--
	return c
}

// RoomUnknown is the Room of a ReportOnly sync: 2^53, far above any limit.
const RoomUnknown = 1 << 53

// Request is one check waiting on the origin.
type Request struct {
	Cost int64
	// Reserve leases the cost to the reporter rather than counting it used.
	Reserve bool
	// Debit charges the cost as used whatever the room: usage known after
	// the fact, which counts even past the limit (the outcome is Granted
	// unless the sync is stale). Later requests find the room it took.
	// Never with Reserve.
	Debit bool
}

// Outcome is what the origin decided for a Request.
type Outcome uint8

const (
	// Granted: the cost is charged (used, or leased for a Reserve request).
	Granted Outcome = iota
	// Denied: the region's admissions alone leave no room for the cost.
	Denied
	// Pending: the cost fits only if live leases held by reporters turn
	// out unused; ask again (after at most WaitMs).
	Pending
)

// LeaseShare is the largest share of what the limit leaves that one lease
// takes: each grant beyond the requests is at most 1/LeaseShare of the
// room, so leases shrink as the cell fills and vanish near the limit.
const LeaseShare = 8

// ContendFor is how long (milliseconds) a cell stays contended after a
// request had to wait on other reporters' leases: no lease beyond the
// requests is granted meanwhile, and holders return what they hold.
const ContendFor = 1000

// SyncResult is the origin's answer to a Sync.
type SyncResult struct {
	// Stale is set when a later sync of the reporter was applied already:
	// nothing changed but the Local raise, nothing was granted, and
	// Charged is what the origin holds for the reporter.
	Stale bool
	// Outcomes holds one Outcome per Request, in order.
	Outcomes []Outcome
	// Lease is the cost granted beyond the requests, to spend locally.
	Lease int64
	// Charged is what the origin counts for the reporter after the call:
	// Claim plus every grant.
	Charged int64
	// Contended reports that a request had to wait on leases within
	// ContendFor: a holder should return what it does not need.
	Contended bool
	// Room is what the limit leaves in the cell after the call, against
	// everything charged (negative: nothing).
	Room int64
	// WaitMs is, when a request is Pending, how long at most until the
	// origin next counts an ended lease as used (a hint: the wait is
	// over sooner when the holders return what they hold).
	WaitMs int64
	// Reversals counts, for the cell, the leases that were counted as used
	// once they ended and that their holder then gave back (it was late,
	// not dead): the cell's count went down. A limiter that sees it grow
	// forgets the higher count it held.
	Reversals int64
	// Local is what the origin counts for the Sync's LocalID in the cell
	// after the call: at least Sync.Local, more if an Import raised it
	// past what this Sync carried; 0 without a LocalID.
	Local int64
	// Current and Previous are the cell's and the previous cell's counts
	// after the call; Previous only when PreviousRead (neither ReportOnly
	// nor Fixed).
	Current, Previous CellCounts
	PreviousRead      bool
}

// CellCounts is what an origin holds of one cell.
type CellCounts struct {
	// Used is the cell's count, the one every view of the cell reads
	// ((*Redis).Read, the bridge's sweep, a limiter's looks and denials):
	// what reporters reported admitted, with the unused part of every lease
	// that is no longer live counted as used (its holder died, or is late
	// to give it back), plus the admissions the cell lost, and at least the
	// own count Import recorded. It never counts the unused part of a live
	// lease; it never misses an admission of a holder whose lease ended.
	Used int64
	// Charged is everything charged: Used plus the unused part of live
	// leases and reservations (or the own lower bound, if higher): never
	// less than was admitted.
	Charged int64
	// Foreign is the other regions' usage Import recorded.
	Foreign int64
}

// ForgetAfter is how long after a reporter was last heard of, holding
// nothing unused, the origin forgets it: its part stays in the cell's
// totals, its own entry goes. So a cell's state holds only the reporters of
// the last ForgetAfter, whatever the number of limiters that ever synced
// it. A reporter that has not synced a cell for half of it starts a new
// Generation.
const ForgetAfter = 10 * time.Second
