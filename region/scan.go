package region

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/window"
)

// countLua defines count(key, now, grace), the one definition of "the
// region's count of a cell as its Redis holds it", and returns it with the
// foreign usage "g": everything charged ("t") plus the admissions the cell
// lost ("b"), less the unused part of the leases live at now or that
// stopped being live less than grace milliseconds before (a lease no longer
// live counts as used, as the sync script's denials count it), and never
// below the own count "o" the bridge restored. Once every limiter has given
// its leases back it is exactly what the region admitted (t = u).
// readScript (Read, grace 0: what denials count) and countScript
// (ScanCounts, grace LeaseSettleFor) both start with it, so what a limiter
// hydrates a cell from and what the bridge recovers into MySQL cannot drift
// apart.
const countLua = `
local function count(key, now, grace)
  local v = redis.call('HMGET', key, 't', 'o', 'g', 'b', 'k')
  local t = tonumber(v[1] or '0') + tonumber(v[4] or '0')
  local o, kmax = tonumber(v[2] or '0'), tonumber(v[5] or '0')
  local since = now - grace
  if kmax > since then
    local all = redis.call('HGETALL', key)
    local rep = {}
    for j = 1, #all, 2 do
      local kind, who = string.sub(all[j], 1, 2), string.sub(all[j], 3)
      if kind == 'e:' or kind == 'c:' or kind == 'u:' then
        local r = rep[who]
        if not r then r = {0, 0, 0}; rep[who] = r end
        local n = tonumber(all[j + 1])
        if kind == 'c:' then r[1] = n elseif kind == 'u:' then r[2] = n else r[3] = n end
      end
    end
    for _, r in pairs(rep) do
      if r[3] > since and r[1] > r[2] then t = t - (r[1] - r[2]) end
    end
  end
  if o > t then t = o end
  return t, tonumber(v[3] or '0')
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
`

// countScript returns, for each cell KEYS[i], {count, expiry}: count(key,
// now, ARGV[1]) and the unix millisecond at which Redis expires the key (by
// Redis's clock; 0 when the key is gone or has no expiry).
const countScript = countLua + `
local grace = tonumber(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
  local c = count(k, now, grace)
  local ttl = redis.call('PTTL', k)
  local at = 0
  if ttl > 0 then at = now + ttl end
  out[2*i-1], out[2*i] = c, at
end
return out`

// LeaseSettleFor is how long after a lease stopped being live ScanCounts
// still counts its unused part as unused. A live limiter gives an ended
// lease back at its next settle round (10ms, later on a loaded host), and
// Redis keeps a lease live 100ms past the limiter's own end of it, so an
// ended lease is counted by denials (Read) for a moment while its limiter
// is about to give it back. A sweep writes into a store whose components
// only grow: counting such a lease there would keep it in MySQL for good.
// A lease still unreturned this long after it ended belongs to a limiter
// that is gone, and its unused part counts as used, as Read counts it.
const LeaseSettleFor = 10 * time.Second

// CellCount is one live cell's count as the region's Redis holds it.
type CellCount struct {
	Cell window.Cell
	// Count is what the region admitted in the cell as Redis can vouch for:
	// everything charged and lost, less the unused part of leases live or
	// ended less than the scan's grace ago, at least the own count the
	// bridge restored. With grace 0 it is Origin.Read's Count.
	Count int64
	// ExpireAt is the unix millisecond at which Redis drops the cell.
	ExpireAt int64
}

// ScanReport says what one ScanCounts saw.
type ScanReport struct {
	// Cells is how many cells were passed to yield.
	Cells int
	// Skipped counts keys under the prefix that are not a cell's (they do
	// not parse, or name an invalid cell) and cells that were gone or held
	// nothing by the time they were read.
	Skipped int
}

// scanCount is the COUNT hint of one SCAN call, and the most cells one
// yield carries.
const scanCount = 1000

// ScanCounts reads every cell under the origin's key prefix, on every
// master of a cluster, and passes them to yield a batch at a time (at most
// 1000 cells, one call at a time). Each cell's count is read atomically
// (count in countLua), a lease's unused part counting as used only once it
// has not been live for grace (the bridge passes LeaseSettleFor); cells
// holding nothing are left out. It ends at yield's first error or ctx's
// end. Like any SCAN, it sees every key that exists for the whole scan and
// may see one twice; cells created during the scan may be missed, which a
// later scan catches. Counts are clamped to 0..window.MaxCount.
func (r *Redis) ScanCounts(ctx context.Context, grace time.Duration, yield func([]CellCount) error) (ScanReport, error) {
	var (
		mu  sync.Mutex
		rep ScanReport
	)
	// Yields are serialized, so the caller needs no lock of its own.
	emit := func(cs []CellCount, skipped int) error {
		mu.Lock()
		defer mu.Unlock()
		rep.Skipped += skipped
		if len(cs) == 0 {
			return nil
		}
		rep.Cells += len(cs)
		return yield(cs)
	}
	var err error
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return r.scanNode(ctx, node, grace, emit)
		})
	case *redis.Client:
		err = r.scanNode(ctx, c, grace, emit)
	default:
		err = fmt.Errorf("unexpected redis client %T", r.client)
	}
	if err != nil {
		return rep, fmt.Errorf("redis scan of cell counts: %w", err)
	}
	return rep, nil
}

// scanNode scans one server's keys under the prefix.
func (r *Redis) scanNode(ctx context.Context, node *redis.Client, grace time.Duration, emit func([]CellCount, int) error) error {
	match := globEscape(r.prefix) + "{*}.*"
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, match, scanCount).Result()
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		cells := make([]window.Cell, 0, len(keys))
		names := make([]string, 0, len(keys))
		skipped := 0
		for _, k := range keys {
			c, ok := r.ParseKey(k)
			if !ok {
				skipped++
				continue
			}
			cells, names = append(cells, c), append(names, k)
		}
		if len(names) > 0 {
			counts, err := r.counts(ctx, node, names, grace.Milliseconds())
			if err != nil {
				return err
			}
			out := make([]CellCount, 0, len(cells))
			for i, c := range cells {
				n, at := clampCount(counts[2*i]), counts[2*i+1]
				if n == 0 || at <= 0 {
					skipped++ // gone since the scan, or nothing counted
					continue
				}
				out = append(out, CellCount{Cell: c, Count: n, ExpireAt: at})
			}
			if err := emit(out, skipped); err != nil {
				return err
			}
		} else if err := emit(nil, skipped); err != nil {
			return err
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// counts runs countScript on node for keys: importChunk keys a call on a
// single server, one a call in a cluster (keys of different identifiers
// live in different slots), in one pipeline.
func (r *Redis) counts(ctx context.Context, node *redis.Client, keys []string, graceMs int64) ([]int64, error) {
	chunk := importChunk
	if r.cluster {
		chunk = 1
	}
	run := func() ([]*redis.Cmd, error) {
		pipe := node.Pipeline()
		cmds := make([]*redis.Cmd, 0, (len(keys)+chunk-1)/chunk)
		for start := 0; start < len(keys); start += chunk {
			cmds = append(cmds, r.count.EvalSha(ctx, pipe, keys[start:min(start+chunk, len(keys))], graceMs))
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if err != nil && isNoScript(err, cmds) {
		if lerr := r.count.Load(ctx, node).Err(); lerr != nil {
			return nil, errors.Join(err, fmt.Errorf("load script: %w", lerr))
		}
		cmds, err = run()
	}
	if err != nil {
		return nil, fmt.Errorf("read counts of %d cells: %w", len(keys), err)
	}
	out := make([]int64, 0, 2*len(keys))
	for _, c := range cmds {
		v, err := c.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("read counts: unexpected reply %v: %w", c.Val(), err)
		}
		out = append(out, v...)
	}
	if len(out) != 2*len(keys) {
		return nil, fmt.Errorf("read counts: %d numbers for %d cells", len(out), len(keys))
	}
	return out, nil
}

// ParseKey returns the cell whose key (Key) is key, and whether key is the
// key of a valid cell under this origin's prefix.
func (r *Redis) ParseKey(key string) (window.Cell, bool) {
	rest, ok := strings.CutPrefix(key, r.prefix+"{")
	if !ok {
		return window.Cell{}, false
	}
	tag, seq, ok := strings.Cut(rest, "}.")
	if !ok {
		return window.Cell{}, false
	}
	parts := strings.Split(tag, ".")
	if len(parts) != 4 {
		return window.Cell{}, false
	}
	var epoch int64
	seq, ep, reset := strings.Cut(seq, ".")
	if reset {
		e, err := strconv.ParseInt(ep, 10, 64)
		if err != nil || e == 0 {
			return window.Cell{}, false
		}
		epoch = e
	}
	dur, err1 := strconv.ParseInt(parts[2], 10, 64)
	s, err2 := strconv.ParseInt(seq, 10, 64)
	id, err3 := base64.RawURLEncoding.DecodeString(parts[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return window.Cell{}, false
	}
	c := window.Cell{Workspace: parts[0], Namespace: parts[1], Identifier: string(id), Duration: dur, Sequence: s, Epoch: epoch}
	if c.Validate() != nil || r.Key(c) != key {
		return window.Cell{}, false
	}
	return c, true
}

// globEscape escapes the characters SCAN's MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
