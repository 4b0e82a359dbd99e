package region

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/window"
)

// DefaultKeyPrefix starts every Redis key Sluice writes.
const DefaultKeyPrefix = "sluice"

// RedisConfig configures a Redis origin.
type RedisConfig struct {
	// URL is the region's Redis:
	//   redis://[user:password@]host:port[/db][?options]     one server
	//   rediss://...                                          one server over TLS
	//   redis+cluster://[user:password@]host:port[?addr=host2:port&addr=...]
	//   rediss+cluster://...                                  Redis Cluster (over TLS)
	// Options are go-redis option names in snake case (dial_timeout=1s,
	// pool_size=32, ...). For a cluster, one reachable node is enough; the
	// others are discovered.
	URL string
	// KeyPrefix starts every key; default DefaultKeyPrefix. Limiters of one
	// region must share it; tests give each run its own.
	KeyPrefix string
	// ForgetAfter is how long after a reporter was last heard of, holding
	// nothing unused, the origin forgets it; default ForgetAfter. The
	// limiters of the region must start a new Generation within half of it
	// (service.Config.ForgetAfter); tests shorten both.
	ForgetAfter time.Duration
	// Trips is how many round trips of checks' syncs (Sync) are in flight
	// at most; default DefaultTrips. Syncs that find them all taken leave
	// together with the next.
	Trips int
}

// Redis is an Origin on a Redis server or Redis Cluster. A cell is one
// string key (docs/architecture.md, "Redis") holding a MessagePack array
// (cellLua): "t" everything charged, "u" the cell's count
// (CellCounts.Used: admissions reported, ended leases counted as used),
// "o" and "g" the own lower bound and the foreign usage Import recorded,
// "x" until when the cell is contended, "n" when its reporters are next to
// be tidied (an ended lease counted as used, a reporter forgotten), "r"
// how many leases counted as used came back, "b" admissions the cell lost
// (what the bridge restored into a cell Redis no longer had, less what its
// reporters and local counts sent again); a map of reporters, each {its
// last sync's Seq, what it used, what it claimed, until when its lease is
// live (or when it was last heard of)}; and a map of the largest local
// count (Sync.Local, Imported.Locals) the cell was told per LocalID, kept
// until the key expires, whose raises "t" and "u" hold. A cell is read in
// one GET and written in one SET, whatever it holds: two commands, as a
// counter's INCRBY and PEXPIRE; a first touch (touch.go) sends them
// without the script. The current and previous cell of an identifier share
// a hash tag and so a cluster slot: the sync script reads both in one MGET
// on one node.
type Redis struct {
	client   redis.UniversalClient
	cluster  bool
	prefix   string
	forgetMs int64
	sync     *redis.Script
	read     *redis.Script
	imp      *redis.Script
	count    *redis.Script
	trips    *trips
	clock    redisClock
	touches  atomic.Int64 // syncs decided by a first touch
}

// cellLua defines a cell's value and tidy. A cell is the MessagePack
// (cmsgpack) of the array {t, u, o, g, x, n, b, r, reporters, locals}:
// reporters maps a reporter's ID to {s, u, c, e} (its last Seq, negative:
// retired at that unix ms; what it used; what it claimed; until when its
// lease is live, or when it was last heard of if it holds none), locals
// maps a LocalID to its largest local count. load returns nil for a
// missing key; fresh is an empty cell; save writes a cell with the
// absolute expiry at (unix ms), keep writes it keeping the key's expiry.
//
// tidy(c, now, forget, keep) is the one place where a cell's reporters
// age: the unused part of a lease that ended (its e passed) counts as used
// from then on (the reporter's u becomes its claim c, and the cell's "u"
// grows by the difference); a reporter holding nothing unused that was
// last heard of forget ms ago is forgotten (its part stays in "t" and
// "u"), and so is a retirement mark that old; "n" becomes when the next of
// these is due (0: none). The local counts are neither read nor removed:
// they stay until the key expires, so a local count told again after its
// reporter was forgotten does not count twice. keep names a reporter
// never forgotten here (the caller's). Every script that reads a cell's
// count runs it first when "n" is due (due), so the sync script, Read and
// the bridge's sweep count a cell the same way.
const cellLua = `
local T, U, O, G, X, N, B, R, REP, LOC = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
local function fresh() return {0, 0, 0, 0, 0, 0, 0, 0, {}, {}} end
local function load(raw)
  if not raw then return nil end
  local c = cmsgpack.unpack(raw)
  if type(c) ~= 'table' or type(c[REP]) ~= 'table' or type(c[LOC]) ~= 'table' then
    return error('sluice: cell value is not a cell')
  end
  return c
end
local function save(key, c, at) redis.call('SET', key, cmsgpack.pack(c), 'PXAT', math.max(at, 1)) end
local function keep(key, c) redis.call('SET', key, cmsgpack.pack(c), 'KEEPTTL') end
local function tidy(c, now, forget, keep)
  local u, n = c[U], 0
  for who, r in pairs(c[REP]) do
    local due
    if r[1] < 0 then
      due = forget - r[1] -- retired at -r[1]
    else
      if r[3] > r[2] and r[4] <= now then
        u = u + r[3] - r[2]
        r[2] = r[3]
      end
      if r[3] > r[2] then due = r[4] else due = r[4] + forget end
    end
    if due <= now and r[3] <= r[2] and who ~= keep then
      c[REP][who] = nil
    elseif due > now and (n == 0 or due < n) then
      n = due
    end
  end
  c[U], c[N] = u, n
end
-- due reports whether cell c is to be tidied at now: its "n" has passed.
local function due(c, now) return c[N] > 0 and c[N] <= now end
`

// syncScript does, step for step, what internal/regiontest's Memory.sync
// does in Go, for each of several cells of one reporter: KEYS are pairs
// of a cell and the cell before it. ARGV: 1 the reporter ID, 2
// LeaseShare, 3 ContendFor, 4 ForgetAfter (ms), then one string per cell
// (appendSyncArgs), packed so that Redis makes one string of a cell, not
// 17 and one a request: 16 little-endian doubles
// (Seq, Used, Claim, Want, Limit, the duration, Elapsed, Foreign,
// ForeignPrevious, LiveFor, ExpireAt, flags (1 ReportOnly, 2 Retire, 4 Fixed,
// 8 debits follow, 16 undo this Seq's first touch: firstTouch), the
// number of requests, Floor, Local, Generation), a byte holding the length
// of LocalID and LocalID ("" for none), then one double a request, its
// cost (negative: a Reserve request), then, with flag 8, one byte a request
// (1: a Debit, granted whatever the room). It returns one string per cell:
// syncResultLen doubles {stale, contended, lease, charged, room, wait, then
// used, charged, foreign and reversals of the cell, then used, charged and
// foreign of the previous cell, then the cell's local count of LocalID
// after the call (0 without one)}, then one byte a request, its outcome
// (0 granted, 1 denied, 2 pending).
//
// A non-empty LocalID's local count is raised to Local first, even when
// the sync is stale or the reporter retired: what the raise adds goes into
// "t" and "u" and comes out of "b" (floored at 0); a Local not above the
// count changes nothing. The caller validated LocalID (CheckLocalID).
//
// A reporter's key in the cell's map is the reporter ID, followed by
// "/<generation>" from the second generation on. The cell's "t" is
// everything charged (each reporter's max(claim, used), plus the local
// counts) and "u" its count (each reporter's used, with the unused part of
// an ended lease counted as used: tidy, plus the local counts), so "t" −
// "u" is the unused part of live leases.
//
// A cell costs two commands: one MGET of it and the cell before it (a GET
// when the previous cell is not weighed), one SET of the whole cell with
// its absolute expiry (a PEXPIREAT when a stale sync changed nothing); a
// previous cell is written back only when it was tidied.
//
// Counts are Lua numbers, exact below 2^53; a count of 2^53 or more (nine
// times the largest limit) leaves no room. The capacity the rule leaves,
// limit − ⌈previous·(duration−elapsed)/duration⌉, is computed in 16-bit
// limbs so that it stays exact (the product reaches 2^88); the tests hold it
// to window.Room. Lease, contention and forgetting deadlines are Redis's
// clock (TIME), so no two limiters' clocks are ever compared. On a single
// server one call carries up to syncChunk cells; in a cluster one, since
// cells of different identifiers live in different slots.
const syncScript = cellLua + `
local BASE = 65536
local BIG = 9007199254740992
local function ceilmuldiv(p, w, d)
  if p == 0 then return 0 end -- a cold cell's: no previous window
  local l = {}
  for i = 1, 4 do local r = p % BASE; l[i] = r; p = (p - r) / BASE end
  local prod, carry = {}, 0
  for i = 1, 4 do
    local v = l[i] * w + carry
    local r = v % BASE
    prod[i] = r; carry = (v - r) / BASE
  end
  for i = 5, 6 do local r = carry % BASE; prod[i] = r; carry = (carry - r) / BASE end
  local q, rem = 0, 0
  for i = 6, 1, -1 do
    local v = rem * BASE + prod[i]
    local qi = math.floor(v / d)
    rem = v - qi * d
    while rem < 0 do qi = qi - 1; rem = rem + d end
    while rem >= d do qi = qi + 1; rem = rem - d end
    q = q * BASE + qi
  end
  if rem > 0 then q = q + 1 end
  return q
end
-- capacity is the room the rule leaves below limit, given the previous
-- window's p (the foreign part forP added) and the current's foreign forC,
-- elapsed el of dur: -1 when the counts leave none.
local function capacity(p, forC, forP, limit, dur, el)
  p = p + forP
  if p >= BIG or forC >= BIG then return -1 end
  local q = ceilmuldiv(p, dur - el, dur)
  if q > limit then return -1 end
  return limit - q - forC
end
local FIXED = '<dddddddddddddddd' .. 'Bc0'
local COSTS = {}
local REPLY = '<dddddddddddddd'

local rid, share, contend, forget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)

local res = {}
for k = 1, #KEYS / 2 do
  local cur, prv = KEYS[2*k-1], KEYS[2*k]
  local blob = ARGV[4 + k]
  local seq, Ur, Cr, want, limit, dur, el, fc, fp, livefor, expire, flags, nreq, floor, L, gen, lid, pos = struct.unpack(FIXED, blob)
  local reportOnly, retire = flags % 2 == 1, math.floor(flags / 2) % 2 == 1
  local fixed, debits = math.floor(flags / 4) % 2 == 1, math.floor(flags / 8) % 2 == 1
  local undo = flags >= 16
  local costs = {} -- request i costs costs[i]
  local debit = {} -- request i is a debit when debit[i] is 1
  if nreq > 0 then
    local f = COSTS[nreq]
    if not f then f = '<' .. string.rep('d', nreq); COSTS[nreq] = f end
    costs = {struct.unpack(f, blob, pos)}
    if debits then debit = {string.byte(blob, costs[nreq + 1], costs[nreq + 1] + nreq - 1)} end
  end
  local id = rid
  if gen ~= 0 then id = rid .. '/' .. string.format('%d', gen) end
  local weighs = not reportOnly and not fixed

  local raw
  if weighs then raw = redis.call('MGET', cur, prv) else raw = {redis.call('GET', cur)} end
  local c = load(raw[1])
  local changed = false
  if not c then
    c = fresh()
  elseif due(c, now) then
    tidy(c, now, forget, id)
    changed = true
  end
  local t, u, o, g, x, n, b, rv = c[T], c[U], c[O], c[G], c[X], c[N], c[B], c[R]
  local rs, ru, rc, re = 0, 0, 0, 0
  local rep = c[REP][id]
  if rep then rs, ru, rc, re = rep[1], rep[2], rep[3], rep[4] end
  if undo and rs == seq then
    -- This very sync's first touch (firstTouch), whose requests did not
    -- all fit: taken back whole, as if it had never been written, and the
    -- requests decided below as for any reporter the cell does not know.
    t, u = t - math.max(rc, ru), u - ru
    rs, ru, rc, re = 0, 0, 0, 0
    c[REP][id] = nil
    changed = true
  end

  -- The local count, even when the sync is stale or the reporter retired:
  -- what it admitted without the origin counts once, whichever path (this
  -- sync, an import) tells it first.
  local lv = 0
  if lid ~= '' then
    lv = c[LOC][lid] or 0
    if L > lv then
      local d = L - lv
      t, u, b = t + d, u + d, math.max(0, b - d)
      lv = L
      c[LOC][lid] = L
      changed = true
    end
  end

  local retired = rs < 0
  local stale = retired or seq <= rs
  if not stale then
    if rs == 0 and b > 0 then
      -- A reporter the cell does not know, with admissions: the cell was
      -- lost and rebuilt, and "b" (what the bridge restored) holds them
      -- already.
      b = math.max(0, b - math.max(Cr, Ur))
    end
    if Ur < ru then rv = rv + 1 end -- it gave back a lease counted as used
    local known = rs > 0
    local old = math.max(rc, ru)
    u = u + Ur - ru
    rs, ru, rc = seq, Ur, math.max(Cr, Ur)
    t = t + math.max(rc, ru) - old
    -- The lower bound of the region's admissions of a reporter the cell
    -- does not know, above what is charged: the cell was lost, and the
    -- other reporters' parts are missing until they sync again (each then
    -- takes its part back out of "b", above). So a lost cell is rebuilt by
    -- the first sync of any live reporter. A reporter the cell knows was
    -- not lost with it: its floor may hold what others admitted while the
    -- origin failed (they report it) or a lease that came back, and is not
    -- taken.
    if not known and floor > t + b then b = floor - t end
  end

  local pt, po, pg, pu = 0, 0, 0, 0
  if fixed then fp = 0 end -- a fixed window weighs no previous cell
  if weighs then
    local p = load(raw[2])
    if p then
      if due(p, now) then tidy(p, now, forget, nil); keep(prv, p) end
      pt, pu, po, pg = p[T] + p[B], p[U] + p[B], p[O], p[G]
    end
  end
  local forC, forP = math.max(fc, g), math.max(fp, pg)
  local capUp = BIG -- a report only: not computed
  if not reportOnly then capUp = capacity(math.max(pt, po), forC, forP, limit, dur, el) end

  local out = {}
  local pending = false
  for i = 1, nreq do
    local cost = costs[i]
    local reserve = cost < 0
    if reserve then cost = -cost end
    if stale or debit[i] ~= 1 and math.max(t + b, o) + cost > capUp then
      out[i] = 2
      if not stale then pending = true end
    else
      out[i] = 0
      rc = rc + cost; t = t + cost
      if not reserve then ru = ru + cost; u = u + cost end
    end
  end

  -- What did not fit against everything charged: denied if the count
  -- (admissions, ended leases as used) leaves no room, else pending until
  -- live leases are used or returned.
  local wait = 0
  if pending then
    local capFirm = capacity(math.max(pu, po), forC, forP, limit, dur, el)
    local firm = math.max(u + b, o)
    for i = 1, nreq do
      if out[i] == 2 then
        if firm + math.abs(costs[i]) > capFirm then
          out[i] = 1
        else
          x = now + contend
          wait = contend
          if n > now and n - now < wait then wait = n - now end
        end
      end
    end
  end

  -- A lease, while nothing waits and the cell is not contended: the
  -- reporter's whole unused holding stays within 1/share of the room.
  local lease = 0
  if not stale and want > 0 and not pending and now >= x then
    local h = rc - ru
    local most = math.floor((capUp - math.max(t + b, o) + h) / share) - h
    if most > 0 then
      lease = math.min(want, most)
      rc = rc + lease; t = t + lease
    end
  end
  if not stale then
    local d
    if rc > ru then re = now + livefor; d = re else re = now; d = now + forget end
    if n == 0 or d < n then n = d end
    if retire and rc <= ru then
      -- Folded into the totals: only a mark stays, so a sync of it sent
      -- again changes nothing; tidy drops the mark after forget.
      c[REP][id] = {-now, 0, 0, 0}
    else
      c[REP][id] = {rs, ru, rc, re}
    end
    changed = true
  end
  if changed then
    c[T], c[U], c[X], c[N], c[B], c[R] = t, u, x, n, b, rv
    save(cur, c, expire)
  else
    redis.call('PEXPIREAT', cur, expire)
  end
  res[k] = struct.pack(REPLY, (stale and not retired) and 1 or 0, now < x and 1 or 0, lease, math.max(rc, ru),
    capUp - math.max(t + b, o), wait, math.max(u + b, o), math.max(t + b, o), g, rv,
    math.max(pu, po), math.max(pt, po), pg, lv) .. string.char(unpack(out))
end
return res
`

// syncResultLen is the length of the sync script's reply before the
// outcomes.
const syncResultLen = 14

// importChunk is the most cells one import script call carries on a single
// server. In a cluster each call carries one cell: cells of different
// identifiers live in different slots.
const importChunk = 128

// readScript returns, for each of two cells (KEYS[1] current, KEYS[2]
// previous), the cell's count (count in countLua, tidying the cell first
// when due; ARGV[1] is ForgetAfter in ms) and the foreign usage "g":
// {count1, foreign1, count2, foreign2}.
const readScript = countLua + `
local out = {}
for i, k in ipairs(KEYS) do
  out[2*i-1], out[2*i] = count(k, now, tonumber(ARGV[1]))
end
return out`

// importScript records, for each cell KEYS[i], one Imported; its ARGV
// follow the previous cell's: Foreign, Own, ExpireAt, the number m of
// local counts, then m pairs of a LocalID (validated by the caller:
// CheckLocalID) and its count. It raises each local count as the sync
// script raises a sync's Local (what the raise adds goes into "t" and "u"
// and comes out of "b", floored at 0; a count not above the cell's changes
// nothing), then the foreign usage "g" to Foreign and the own lower bound
// "o" to Own; a cell this call creates expires at ExpireAt, an existing
// cell keeps the expiry its reports set, and a cell nothing changed is not
// written. Every admission is charged in "t" before it is final, so an own
// count above "t" (and "b") means the cell lost admissions (Redis
// restarted, failed over or evicted it, and reporters charged from zero
// since): the difference is kept as "b" and counted on top of what
// reporters charge from now on.
const importScript = cellLua + `
local a = 1
for _, k in ipairs(KEYS) do
  local g, o, expire, m = tonumber(ARGV[a]), tonumber(ARGV[a+1]), tonumber(ARGV[a+2]), tonumber(ARGV[a+3])
  local l0 = a + 3 -- local j is ARGV[l0 + 2j - 1] (its ID) and ARGV[l0 + 2j] (its count)
  a = l0 + 2*m + 1
  local c = load(redis.call('GET', k))
  local existed, changed = c ~= nil, false
  if not existed then c = fresh() end
  for j = 1, m do
    local f, L = ARGV[l0 + 2*j - 1], tonumber(ARGV[l0 + 2*j])
    local old = c[LOC][f] or 0
    if L > old then
      local d = L - old
      c[T], c[U], c[B] = c[T] + d, c[U] + d, math.max(0, c[B] - d)
      c[LOC][f] = L
      changed = true
    end
  end
  if g > c[G] then c[G] = g; changed = true end
  if o > c[O] then c[O] = o; changed = true end
  if o > c[T] + c[B] then c[B] = o - c[T]; changed = true end
  if changed then
    if existed then keep(k, c) else save(k, c, expire) end
  end
end
return 1`

// NewRedis returns an origin on the Redis at cfg.URL. It only parses the
// configuration: connections are made when needed, and the scripts are
// loaded when Redis first says it lacks them, so a limiter can start while
// Redis is down and converge once it is back. Every call is bounded by its
// context's deadline. Its errors never show the URL's password.
func NewRedis(cfg RedisConfig) (*Redis, error) {
	client, err := newRedisClient(cfg.URL)
	if err != nil {
		return nil, redact.Error(err, cfg.URL)
	}
	_, isCluster := client.(*redis.ClusterClient)
	r := &Redis{
		client:  client,
		cluster: isCluster,
		prefix:  cfg.KeyPrefix,
		sync:    redis.NewScript(syncScript),
		read:    redis.NewScript(readScript),
		imp:     redis.NewScript(importScript),
		count:   redis.NewScript(countScript),
	}
	if cfg.Trips <= 0 {
		cfg.Trips = DefaultTrips
	}
	r.trips = newTrips(cfg.Trips, r.Settle)
	r.forgetMs = cfg.ForgetAfter.Milliseconds()
	if r.forgetMs <= 0 {
		r.forgetMs = ForgetAfter.Milliseconds()
	}
	if r.prefix == "" {
		r.prefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(r.prefix, "{}") {
		client.Close()
		return nil, fmt.Errorf("redis key prefix %q: braces would break hash tags", r.prefix)
	}
	return r, nil
}

// newRedisClient parses the URL forms RedisConfig.URL documents.
func newRedisClient(raw string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("redis URL %q: want redis://host:port or redis+cluster://host:port", redact.Conn(raw))
	}
	switch scheme {
	case "redis", "rediss", "unix":
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("redis URL: %w", err)
		}
		boundCalls(raw, &opt.ContextTimeoutEnabled, &opt.MaxRetries, &opt.DialerRetries)
		return redis.NewClient(opt), nil
	case "redis+cluster", "rediss+cluster":
		opt, err := redis.ParseClusterURL(strings.TrimSuffix(scheme, "+cluster") + "://" + rest)
		if err != nil {
			return nil, fmt.Errorf("redis cluster URL: %w", err)
		}
		boundCalls(raw, &opt.ContextTimeoutEnabled, &opt.MaxRetries, &opt.DialerRetries)
		return redis.NewClusterClient(opt), nil
	}
	return nil, fmt.Errorf("redis URL scheme %q: want redis, rediss, redis+cluster or rediss+cluster", scheme)
}

// boundCalls sets the options of a client of the URL raw, single server or
// cluster alike: calls end with their context, and neither retry nor
// dial again unless the URL says so (setsOption).
func boundCalls(raw string, contextTimeout *bool, maxRetries, dialerRetries *int) {
	*contextTimeout = true
	if !setsOption(raw, "max_retries") {
		*maxRetries = -1
	}
	if !setsOption(raw, "dialer_retries") {
		*dialerRetries = 1
	}
}

// setsOption reports whether the URL sets the go-redis option name. Unless
// it sets them, commands are not retried by the client (max_retries) and a
// connection is dialled once a call (dialer_retries): a call that fails
// must fail within the check's read timeout, and fail as what it is — a
// refused connection as refused, not as a timeout after five dials 100ms
// apart, which a limiter takes for a Redis that is only late; a settle call
// that fails is sent again by the next round anyway. go-redis's own retries
// (3, with backoff up to 512ms) would also hide a Redis that is down from
// the breakers for a second per call.
func setsOption(raw, name string) bool {
	_, query, _ := strings.Cut(raw, "?")
	for kv := range strings.SplitSeq(query, "&") {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// loadScripts loads the scripts on every node that may run them.
func (r *Redis) loadScripts(ctx context.Context) error {
	return r.eachNode(ctx, func(ctx context.Context, c *redis.Client) error {
		return loadOn(ctx, c, r.sync, r.read, r.imp, r.count)
	})
}

// loadOn loads scripts on the server c, in order, and stops at the first
// that fails.
func loadOn(ctx context.Context, c *redis.Client, scripts ...*redis.Script) error {
	for _, s := range scripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

// eachNode calls fn for the server, or for every master of a cluster
// (concurrently, as go-redis's ForEachMaster does), and returns the first
// error.
func (r *Redis) eachNode(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("unexpected redis client %T", r.client)
}

// Key returns the Redis key of cell c: prefix{ws.ns.duration.base64url(id)}:seq,
// followed by :epoch for a cell of a reset's epoch (window.Cell.Epoch not 0:
// the same hash tag, so the same slot as its neighbours; a cell never reset
// keeps the key it always had). Workspace and namespace are tokens of
// [A-Za-z0-9_-]; the identifier is base64url-encoded, so any bytes give an
// unambiguous key without braces.
func (r *Redis) Key(c window.Cell) string {
	var buf [128]byte // most keys: one allocation, the string's
	return string(r.appendKey(buf[:0], c))
}

func (r *Redis) appendKey(dst []byte, c window.Cell) []byte {
	dst = append(dst, r.prefix...)
	dst = append(dst, '{')
	dst = append(dst, c.Workspace...)
	dst = append(dst, '.')
	dst = append(dst, c.Namespace...)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, c.Duration, 10)
	dst = append(dst, '.')
	dst = base64.RawURLEncoding.AppendEncode(dst, []byte(c.Identifier))
	dst = append(dst, '}', ':')
	dst = strconv.AppendInt(dst, c.Sequence, 10)
	if c.Epoch != 0 {
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, c.Epoch, 10)
	}
	return dst
}

// Read returns, in one command, what Redis holds of cell c and of the cell
// before it (Previous): each cell's count (CellCounts.Used: admissions,
// with the unused part of a lease no longer live counted as used, never
// below the own count Import recorded) and the other regions' usage Import
// recorded, clamped to 0..window.MaxCount; missing cells count 0. Once
// every limiter has given its leases back, that is exactly what was
// admitted. It is no part of Origin: no limiter or bridge path reads a
// cell without syncing it; it is the one look at a cell for tools and tests
// (test/soak, test/bench) that check what Redis holds.
func (r *Redis) Read(ctx context.Context, c window.Cell) (current, previous Totals, err error) {
	p := Previous(c)
	vals, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		return []*redis.Cmd{r.read.EvalSha(ctx, pipe, []string{r.Key(c), r.Key(p)}, r.forgetMs)}
	})
	if err != nil {
		return Totals{}, Totals{}, fmt.Errorf("redis read: %w", err)
	}
	v, err := vals[0].Int64Slice()
	if err != nil || len(v) != 4 {
		return Totals{}, Totals{}, fmt.Errorf("redis read: unexpected reply %v: %w", vals[0].Val(), err)
	}
	return Totals{clampCount(v[0]), clampCount(v[1])}, Totals{clampCount(v[2]), clampCount(v[3])}, nil
}

// Import records imports in one pipeline of script calls (importChunk cells
// a call on a single server, one a call in a cluster). An invalid local
// count (ErrInvalidLocal) fails it before anything is sent.
func (r *Redis) Import(ctx context.Context, imports []Imported) error {
	if err := CheckImports(imports); err != nil {
		return fmt.Errorf("redis import: %w", err)
	}
	chunk := r.chunk(importChunk)
	_, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, 0, (len(imports)+chunk-1)/chunk)
		for part := range slices.Chunk(imports, chunk) {
			keys := make([]string, len(part))
			args := make([]any, 0, 4*len(part))
			for i, im := range part {
				keys[i] = r.Key(im.Cell)
				args = append(args, clampCount(im.Foreign), clampCount(im.Own), im.ExpireAt, len(im.Locals))
				for _, l := range im.Locals {
					args = append(args, l.ID, clampCount(l.Count))
				}
			}
			cmds = append(cmds, r.imp.EvalSha(ctx, pipe, keys, args...))
		}
		return cmds
	})
	if err != nil {
		return fmt.Errorf("redis import %d cells: %w", len(imports), err)
	}
	return nil
}

// Sync applies s in one script call on the cell's node. Concurrent Syncs
// share round trips (RedisConfig.Trips): one that finds every trip taken
// leaves with the next, in the same script call as the others on its node.
// If ctx ends before s left, the error wraps ErrNotSent.
func (r *Redis) Sync(ctx context.Context, reporter string, s Sync) (SyncResult, error) {
	if err := CheckSync(&s); err != nil {
		return SyncResult{}, fmt.Errorf("redis sync: %w", err)
	}
	res, err := r.trips.do(ctx, reporter, s)
	if err != nil {
		return SyncResult{}, fmt.Errorf("redis sync: %w", err)
	}
	return res, nil
}

// syncChunk is the most cells one sync script call carries on a single
// server. Redis runs one script at a time and reads a pipeline in chunks of
// 16 KiB (about one script call of 16 cells), so a check's round trip finds
// at most one such call, a fraction of a millisecond, ahead of it per
// settle call in flight, even when a window's leases all go back at once.
const syncChunk = 16

// Settle applies ss in one pipeline: a first touch (firstTouch) for each
// sync that may take one, script calls for the others, syncChunk cells a
// call on a single server and one a call in a cluster. Syncs whose first
// touch found the cell, or whose requests did not all fit, go to the
// script in a second pipeline. An invalid local count (ErrInvalidLocal)
// fails it before anything is sent.
func (r *Redis) Settle(ctx context.Context, reporter string, ss []Sync) ([]SyncResult, error) {
	out := make([]SyncResult, len(ss))
	var touch, script []int // indexes of ss
	readClock := false
	now, known := r.clock.now()
	for i := range ss {
		if err := CheckSync(&ss[i]); err != nil {
			return nil, fmt.Errorf("redis settle: %w", err)
		}
		if !r.cluster && firstTouchable(&ss[i]) {
			if known {
				touch = append(touch, i)
				continue
			}
			readClock = true // the next Settle may touch
		}
		script = append(script, i)
	}
	// First touches to take back (flag 16) and decide by script.
	again, err := r.settlePipeline(ctx, reporter, ss, touch, script, now, readClock, false, out)
	if err == nil && len(again) > 0 {
		_, err = r.settlePipeline(ctx, reporter, ss, nil, again, 0, false, true, out)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// settlePipeline applies, in one pipeline, into out, a first touch at
// Redis time now (as last read) for each sync of ss[touch] and script
// calls for the syncs ss[script] (undo: each a first touch to take back
// first, flag 16). It reads Redis's clock (TIME) in the same pipeline when
// there are touches or readClock, and sends nothing when there is nothing
// to send. It returns the syncs whose first touch the script is to decide:
// those whose SET found the cell, or whose requests did not all fit.
func (r *Redis) settlePipeline(ctx context.Context, reporter string, ss []Sync, touch, script []int, now int64, readClock, undo bool,
	out []SyncResult) ([]int, error) {
	readClock = readClock || len(touch) > 0
	if len(script) == 0 && !readClock {
		return nil, nil
	}
	var timeCmd *redis.Cmd
	sets := make([]*redis.Cmd, len(touch))
	gets := make([]*redis.Cmd, len(touch))
	var scripts []*redis.Cmd
	var parts [][]int
	sent := time.Now().UnixMilli()
	_, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		var cmds []*redis.Cmd
		if readClock {
			timeCmd = pipe.Do(ctx, "TIME")
			cmds = append(cmds, timeCmd)
		}
		var key [128]byte
		for k, i := range touch {
			s := &ss[i]
			value := appendFirstTouch(make([]byte, 0, 64+len(reporter)), reporterID(reporter, s.Generation), s, now, r.forgetMs)
			sets[k] = pipe.Do(ctx, "SET", string(r.appendKey(key[:0], s.Cell)), value, "NX", "PXAT", max(s.ExpireAt, 1))
			cmds = append(cmds, sets[k])
			if !s.Fixed {
				gets[k] = pipe.Do(ctx, "GET", string(r.appendKey(key[:0], s.Previous())))
			}
		}
		scripts, parts = r.queueScripts(ctx, pipe, reporter, ss, script, undo)
		return append(cmds, scripts...)
	})
	if err != nil {
		return nil, fmt.Errorf("redis settle %d cells: %w", len(touch)+len(script), err)
	}
	var redisNow int64
	if readClock {
		if redisNow, err = replyTime(timeCmd); err != nil {
			return nil, fmt.Errorf("redis settle: %w", err)
		}
		r.clock.set(redisNow, sent)
	}
	if err := readScripts(ss, scripts, parts, out); err != nil {
		return nil, err
	}
	var again []int
	for k, i := range touch {
		s := &ss[i]
		if err := sets[k].Err(); errors.Is(err, redis.Nil) {
			// The cell was there: the script decides. Flag 16 takes back
			// only an entry of this very Seq, which a pipeline sent again
			// after NOSCRIPT may have written: a no-op otherwise.
			again = append(again, i)
			continue
		} else if err != nil {
			return nil, fmt.Errorf("redis settle: first touch: %w", err)
		}
		var prev RedisCell
		havePrev := false
		if gets[k] != nil {
			raw, err := gets[k].Text()
			if prev, havePrev, err = r.cellReply("redis settle: previous cell", s.Previous(), raw, err); err != nil {
				return nil, err
			}
		}
		res, ok := touchResult(s, prev, havePrev, redisNow)
		if !ok {
			again = append(again, i)
			continue
		}
		out[i] = res
		r.touches.Add(1)
	}
	return again, nil
}

// queueScripts queues the sync script calls of ss[idx], syncChunk cells a
// call on a single server and one a call in a cluster (cells of one slot
// a call); undo sets flag 16 for each. It returns the calls with the
// indexes each carries.
func (r *Redis) queueScripts(ctx context.Context, pipe redis.Pipeliner, reporter string, ss []Sync, idx []int, undo bool) ([]*redis.Cmd, [][]int) {
	var cmds []*redis.Cmd
	var parts [][]int
	for part := range slices.Chunk(idx, r.chunk(syncChunk)) {
		keys := make([]string, 0, 2*len(part))
		args := make([]any, 4, 4+len(part))
		args[0], args[1], args[2], args[3] = reporter, LeaseShare, ContendFor, r.forgetMs
		for _, i := range part {
			s := &ss[i]
			keys = append(keys, r.Key(s.Cell), r.Key(s.Previous()))
			args = append(args, appendSyncArgs(make([]byte, 0, syncArgsLen+len(s.LocalID)+8*len(s.Requests)), s, undo))
		}
		cmds = append(cmds, r.sync.EvalSha(ctx, pipe, keys, args...))
		parts = append(parts, part)
	}
	return cmds, parts
}

// readScripts reads the replies of script calls, each for the syncs
// ss[part], into out.
func readScripts(ss []Sync, cmds []*redis.Cmd, parts [][]int, out []SyncResult) error {
	for i, c := range cmds {
		part := parts[i]
		v, err := c.StringSlice()
		if err != nil || len(v) != len(part) {
			return fmt.Errorf("redis settle: unexpected reply for %d cells %.200v: %w", len(part), c.Val(), err)
		}
		for k, j := range part {
			res, err := syncResult([]byte(v[k]), len(ss[j].Requests))
			if err != nil {
				return fmt.Errorf("redis settle: %w", err)
			}
			res.PreviousRead = !ss[j].ReportOnly && !ss[j].Fixed
			out[j] = res
		}
	}
	return nil
}

// chunk is how many cells one script call carries: most on a single
// server, one in a cluster, where cells of different identifiers live in
// different slots.
func (r *Redis) chunk(most int) int {
	if r.cluster {
		return 1
	}
	return most
}

// replyTime reads a TIME reply as unix ms.
func replyTime(c *redis.Cmd) (int64, error) {
	v, err := c.StringSlice()
	if err != nil || len(v) != 2 {
		return 0, fmt.Errorf("TIME: unexpected reply %v: %w", c.Val(), err)
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("TIME: unexpected reply %v", v)
	}
	return sec*1000 + usec/1000, nil
}

// syncArgsLen is the length of a cell's packed arguments (appendSyncArgs)
// without its LocalID and requests.
const syncArgsLen = 16*8 + 1

// appendSyncArgs appends s packed as the sync script reads a cell's
// arguments (undo: flag 16, take this Seq's first touch back first): 16 little-endian doubles, LocalID's length as a byte and
// LocalID (at most MaxLocalID bytes: CheckSync), one double a request.
// Every number is exact: counts are clamped to window.MaxCount, a power of
// two, and the others are below 2^53.
func appendSyncArgs(dst []byte, s *Sync, undo bool) []byte {
	debits := slices.ContainsFunc(s.Requests, func(q Request) bool { return q.Debit })
	var flags int64 // bit i set: the sync script's flag 1<<i
	for i, on := range [...]bool{s.ReportOnly, s.Retire, s.Fixed, debits, undo} {
		flags |= int64(b2byte(on)) << i
	}
	for _, v := range [16]int64{s.Seq, clampCount(s.Used), clampCount(s.Claim), clampCount(s.Want), s.Limit, s.Cell.Duration,
		s.Elapsed, clampCount(s.Foreign), clampCount(s.ForeignPrevious), s.LiveFor, s.ExpireAt, flags, int64(len(s.Requests)),
		clampCount(s.Floor), clampCount(s.Local), max(s.Generation, 0)} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(v)))
	}
	dst = append(dst, byte(len(s.LocalID)))
	dst = append(dst, s.LocalID...)
	for _, q := range s.Requests {
		c := float64(q.Cost)
		if q.Reserve {
			c = -c
		}
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(c))
	}
	if debits {
		for _, q := range s.Requests {
			dst = append(dst, b2byte(q.Debit))
		}
	}
	return dst
}

// syncReplyLen is the length of a cell's packed reply without its
// outcomes.
const syncReplyLen = syncResultLen * 8

// syncResult reads one cell's packed reply (see syncScript), for a sync
// of requests requests; counts are clamped to 0..window.MaxCount, as
// everything Redis says is input.
func syncResult(reply []byte, requests int) (SyncResult, error) {
	if len(reply) != syncReplyLen+requests {
		return SyncResult{}, fmt.Errorf("a cell's reply of %d bytes, want %d", len(reply), syncReplyLen+requests)
	}
	var v [syncResultLen]int64
	for i := range v {
		v[i] = replyInt(math.Float64frombits(binary.LittleEndian.Uint64(reply[8*i:])))
	}
	res := SyncResult{
		Stale:     v[0] == 1,
		Contended: v[1] == 1,
		Lease:     clampCount(v[2]),
		Charged:   clampCount(v[3]),
		Room:      min(v[4], RoomUnknown),
		WaitMs:    min(max(v[5], 0), ContendFor),
		Current:   CellCounts{Used: clampCount(v[6]), Charged: clampCount(v[7]), Foreign: clampCount(v[8])},
		Reversals: max(v[9], 0),
		Previous:  CellCounts{Used: clampCount(v[10]), Charged: clampCount(v[11]), Foreign: clampCount(v[12])},
		Local:     clampCount(v[13]),
		Outcomes:  make([]Outcome, requests),
	}
	for i := range requests {
		// 0 Granted, 1 Denied, anything else Pending.
		res.Outcomes[i] = Outcome(min(reply[syncReplyLen+i], byte(Pending)))
	}
	return res, nil
}

// replyInt is a number of the sync script's reply, within ±window.MaxCount
// (NaN: 0).
func replyInt(f float64) int64 {
	switch {
	case f != f:
		return 0
	case f >= window.MaxCount:
		return window.MaxCount
	case f <= -window.MaxCount:
		return -window.MaxCount
	}
	return int64(f)
}

// clampCount brings a count Redis returned into 0..window.MaxCount: what
// Redis holds is input too.
func clampCount(v int64) int64 { return min(max(v, 0), window.MaxCount) }

// run executes the commands queue adds in one pipeline on the client (a
// pipeline that found every connection busy wraps ErrNotSent); if Redis
// lost the scripts (a restart or failover), it loads them and runs once
// more.
func (r *Redis) run(ctx context.Context, queue func(context.Context, redis.Pipeliner) []*redis.Cmd) ([]*redis.Cmd, error) {
	return runPipeline(ctx, r.client.Pipeline, r.loadScripts, true, queue)
}

// runPipeline executes the commands queue adds in one pipeline of
// pipeline(); if a node lost the scripts, it loads them (load) and runs
// once more. With notSent, a pipeline that found every connection busy
// wraps ErrNotSent: the load, not Redis, held it back.
func runPipeline(ctx context.Context, pipeline func() redis.Pipeliner, load func(context.Context) error, notSent bool,
	queue func(context.Context, redis.Pipeliner) []*redis.Cmd) ([]*redis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		pipe := pipeline()
		cmds := queue(ctx, pipe)
		_, err := pipe.Exec(ctx)
		if errors.Is(err, redis.Nil) {
			err = firstError(cmds) // a GET or SET NX that found nothing is an answer
		}
		if err == nil {
			return cmds, nil
		}
		if notSent && errors.Is(err, redis.ErrPoolTimeout) {
			return nil, fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		if attempt > 0 || !isNoScript(err, cmds) {
			return nil, err
		}
		if lerr := load(ctx); lerr != nil {
			return nil, errors.Join(err, lerr)
		}
	}
}

// firstError is the first error of cmds that is not redis.Nil.
func firstError(cmds []*redis.Cmd) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}

func isNoScript(err error, cmds []*redis.Cmd) bool {
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		return true
	}
	for _, c := range cmds {
		if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// Ping checks that Redis answers.
func (r *Redis) Ping(ctx context.Context) error {
	return r.client.Ping(ctx).Err()
}

// TripStats returns how many round trips the Syncs made so far, how many
// syncs they carried, and how many syncs first touches decided.
func (r *Redis) TripStats() TripStats {
	return TripStats{Trips: r.trips.sent.Load(), Syncs: r.trips.carried.Load(), FirstTouches: r.touches.Load()}
}

// Close closes the connections. Syncs still waiting for a round trip fail
// with ErrNotSent.
func (r *Redis) Close() error {
	r.trips.close()
	return r.client.Close()
}

// Client returns the underlying go-redis client, for tests and tooling.
func (r *Redis) Client() redis.UniversalClient { return r.client }

// b2byte is 1 for true, 0 for false.
func b2byte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
