package region

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// A first touch is how a sync reaches a cell no reporter holds yet without
// the sync script: in the pipeline the script calls would take, one
// "SET <cell> <value> NX PXAT <expiry>" writes the cell as the script would
// leave it after granting every request, and one "GET" reads the cell
// before it (none for a fixed window); one "TIME" a pipeline reads Redis's
// clock. Redis runs two plain commands a cell, as for a counter's INCRBY
// and PEXPIRE, where the script costs it several times that in Lua.
//
// The rule is then applied here, exactly as the script applies it
// (touchResult): if every request fits against everything charged in the
// previous cell, the sync's result is what the script would have returned.
// Otherwise the sync goes to the script with flag 16 in the same Settle,
// which takes the first touch back whole before it decides (so the
// admissions a first touch charged before they were final never stand
// unless they fit), and a sync whose SET found the cell goes to the script
// as it is. So every admission is still charged in Redis before it is
// final, and a first touch only ever adds a charge that the script path
// would also have made, for a moment, towards denial for others.
//
// Only a sync that brings nothing the cell must already hold may take it
// (firstTouchable): no use or claim of its own, no lease asked, no floor,
// no local count, no reserve or debit, not a report or a retirement. The
// reporter's "heard of" time, which the script takes from TIME, is Redis's
// clock as this process last read it (redisClock): at most a round trip
// late, so the reporter is forgotten at most that much later. In a Redis
// Cluster each cell lives on its own node, whose clock TIME cannot name in
// a pipeline: there the script decides every sync.

// firstTouchable reports whether s may take a first touch.
func firstTouchable(s *Sync) bool {
	if s.ReportOnly || s.Retire || s.Used != 0 || s.Claim != 0 || s.Want != 0 || s.Floor != 0 ||
		s.LocalID != "" || s.Local != 0 || len(s.Requests) == 0 || s.Seq <= 0 {
		return false
	}
	for _, q := range s.Requests {
		if q.Reserve || q.Debit || q.Cost <= 0 {
			return false
		}
	}
	return true
}

// redisClock is Redis's clock as this process last read it: the offset of
// Redis's TIME from the local clock when the command was sent, so the
// clock it gives is never ahead of Redis's by more than the time the
// reply took.
type redisClock struct {
	offset atomic.Int64 // Redis's unix ms − local unix ms at sending
	known  atomic.Bool
}

// now returns Redis's unix ms, and false before the clock was ever read.
func (c *redisClock) now() (int64, bool) {
	if !c.known.Load() {
		return 0, false
	}
	return time.Now().UnixMilli() + c.offset.Load(), true
}

// set records Redis's TIME (unix ms) read by a pipeline sent at sentMs
// (local unix ms).
func (c *redisClock) set(redisMs, sentMs int64) {
	c.offset.Store(redisMs - sentMs)
	c.known.Store(true)
}

// reporterID is the name under which the cell keeps reporter's state for
// generation gen, as the sync script builds it.
func reporterID(reporter string, gen int64) string {
	if gen <= 0 {
		return reporter
	}
	return reporter + "/" + strconv.FormatInt(gen, 10)
}

// appendFirstTouch appends the value the sync script leaves in a cell no
// reporter held after granting s's requests whole at Redis time now:
// everything charged and used is their cost, and the reporter's state is
// {Seq, cost, cost, now}, to be forgotten forget ms later.
func appendFirstTouch(dst []byte, id string, s *Sync, now, forget int64) []byte {
	cost := touchCost(s)
	dst = msgp.AppendArrayHeader(dst, 10)
	for _, v := range [8]int64{cost, cost, 0, 0, 0, now + forget, 0, 0} { // t u o g x n b r
		dst = msgp.AppendInt64(dst, v)
	}
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, id)
	dst = msgp.AppendArrayHeader(dst, 4)
	for _, v := range [4]int64{s.Seq, cost, cost, now} {
		dst = msgp.AppendInt64(dst, v)
	}
	return msgp.AppendArrayHeader(dst, 0) // no local counts: an empty Lua table
}

// touchCost is the cost of s's requests together, at most window.MaxCount.
func touchCost(s *Sync) int64 {
	var c int64
	for _, q := range s.Requests {
		c = window.AddCounts(c, clampCount(q.Cost))
	}
	return c
}

// maxExact is 2^53: the Lua numbers the scripts count with are exact
// below it, and a count that reaches it leaves no room.
const maxExact = 1 << 53

// touchResult applies the rule to a first touch of s that Redis accepted,
// given the previous cell's value (prev, present when havePrev) read in
// the same pipeline at Redis time now: the result the script would have
// returned, and whether every request fits. When one does not, the first
// touch is to be taken back (flag 16).
func touchResult(s *Sync, prev RedisCell, havePrev bool, now int64) (SyncResult, bool) {
	var pt, pu, po, pg int64
	if havePrev && !s.Fixed {
		pt = window.AddCounts(prev.Charged, prev.Lost)
		pu = window.AddCounts(prevCount(prev, now), prev.Lost)
		po, pg = prev.Own, prev.Foreign
	}
	forC, forP := clampCount(s.Foreign), max(clampCount(s.ForeignPrevious), pg)
	if s.Fixed {
		forP = 0
	}
	capUp := touchCapacity(s, max(pt, po), forC, forP)
	var charged int64
	for _, q := range s.Requests {
		if charged+clampCount(q.Cost) > capUp {
			return SyncResult{}, false
		}
		charged += clampCount(q.Cost)
	}
	res := SyncResult{
		Charged:      charged,
		Room:         min(capUp-charged, RoomUnknown),
		Current:      CellCounts{Used: charged, Charged: charged},
		Previous:     CellCounts{Used: max(pu, po), Charged: max(pt, po), Foreign: pg},
		Outcomes:     make([]Outcome, len(s.Requests)), // all Granted
		PreviousRead: !s.Fixed,
	}
	return res, true
}

// touchCapacity is the script's capacity: the room the rule leaves below
// s's limit given the previous window's count p (forP added) and the
// current's foreign forC, or -1 when the counts leave none.
func touchCapacity(s *Sync, p, forC, forP int64) int64 {
	p = window.AddCounts(p, forP)
	if p >= maxExact || forC >= maxExact {
		return -1
	}
	room := window.Room(window.Input{Now: window.Start(s.Cell.Sequence, s.Cell.Duration) + s.Elapsed,
		Duration: s.Cell.Duration, Limit: s.Limit, Previous: p, Fixed: s.Fixed})
	if room < 0 {
		return -1
	}
	return room - forC
}

// prevCount is a cell's "u" as tidy leaves it at Redis time now: the
// unused part of every lease no longer live counts as used. (Forgetting
// a reporter changes no count.)
func prevCount(c RedisCell, now int64) int64 {
	u := c.Used
	if c.TidyAt <= 0 || c.TidyAt > now {
		return u // nothing due: the script would not tidy it
	}
	for _, r := range c.Reporters {
		if r.Seq > 0 && r.Claimed > r.Used && r.Until <= now {
			u = window.AddCounts(u, r.Claimed-r.Used)
		}
	}
	return u
}
