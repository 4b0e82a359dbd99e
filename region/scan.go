package region

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/window"
)

// countLua defines count(key, now, forget), the one definition of "the
// region's count of a cell as its Redis holds it" (CellCounts.Used), and
// returns it with the foreign usage "g": the count "u" (admissions
// reported, the unused part of every lease no longer live counted as
// used: the cell is tidied first when due, as the sync script does) plus
// the admissions the cell lost ("b"), never below the own count "o" the
// bridge restored; a missing cell counts 0. Once every limiter has given
// its leases back it is exactly what the region admitted. readScript
// (Read) and countScript (ScanCounts, the bridge's sweep) both start with
// it, and the sync script computes the same from the same value, so what a
// limiter decides on, what it hydrates a cell from and what the bridge
// recovers into MySQL cannot drift apart.
const countLua = cellLua + `
local function count(key, now, forget)
  local c = load(redis.call('GET', key))
  if not c then return 0, 0 end
  if due(c, now) then tidy(c, now, forget, nil); keep(key, c) end
  return math.max(c[U] + c[B], c[O]), c[G]
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
`

// countScript returns, for each cell KEYS[i], {count, expiry}: count(key,
// now, ARGV[1]) and the unix millisecond at which Redis expires the key (by
// Redis's clock; 0 when the key is gone or has no expiry).
const countScript = countLua + `
local forget = tonumber(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
  local c = count(k, now, forget)
  local ttl = redis.call('PTTL', k)
  local at = 0
  if ttl > 0 then at = now + ttl end
  out[2*i-1], out[2*i] = c, at
end
return out`

// CellCount is one live cell's count as the region's Redis holds it.
type CellCount struct {
	Cell window.Cell
	// Count is the cell's count, as (*Redis).Read returns it
	// (CellCounts.Used).
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
// and is the count Read returns (count in countLua); cells holding nothing
// are left out. It ends at yield's first error or ctx's end. Like any
// SCAN, it sees every key that exists for the whole scan and may see one
// twice; cells created during the scan may be missed, which a later scan
// catches. Counts are clamped to 0..window.MaxCount.
func (r *Redis) ScanCounts(ctx context.Context, yield func([]CellCount) error) (ScanReport, error) {
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
	err := r.eachNode(ctx, func(ctx context.Context, node *redis.Client) error {
		return r.scanNode(ctx, node, emit)
	})
	if err != nil {
		return rep, fmt.Errorf("redis scan of cell counts: %w", err)
	}
	return rep, nil
}

// scanNode scans one server's keys under the prefix.
func (r *Redis) scanNode(ctx context.Context, node *redis.Client, emit func([]CellCount, int) error) error {
	match := globEscape(r.prefix) + "{*}:*"
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, match, scanCount).Result()
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		cells := make([]window.Cell, 0, len(keys))
		names := keys[:0] // the keys of cells, in place
		for _, k := range keys {
			if c, ok := r.ParseKey(k); ok {
				cells, names = append(cells, c), append(names, k)
			}
		}
		skipped := len(keys) - len(names)
		var out []CellCount
		if len(names) > 0 {
			counts, err := r.counts(ctx, node, names)
			if err != nil {
				return err
			}
			out = make([]CellCount, 0, len(cells))
			for i, c := range cells {
				n, at := clampCount(counts[2*i]), counts[2*i+1]
				if n == 0 || at <= 0 {
					skipped++ // gone since the scan, or nothing counted
					continue
				}
				out = append(out, CellCount{Cell: c, Count: n, ExpireAt: at})
			}
		}
		if err := emit(out, skipped); err != nil {
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
func (r *Redis) counts(ctx context.Context, node *redis.Client, keys []string) ([]int64, error) {
	chunk := r.chunk(importChunk)
	load := func(ctx context.Context) error { return loadOn(ctx, node, r.count) }
	cmds, err := runPipeline(ctx, node.Pipeline, load, false, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, 0, (len(keys)+chunk-1)/chunk)
		for part := range slices.Chunk(keys, chunk) {
			cmds = append(cmds, r.count.EvalSha(ctx, pipe, part, r.forgetMs))
		}
		return cmds
	})
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
	// Each part is read leniently: the cell read must give key back (Key),
	// which no other string does.
	rest, _ := strings.CutPrefix(key, r.prefix+"{")
	tag, seq, _ := strings.Cut(rest, "}:")
	seq, ep, reset := strings.Cut(seq, ":")
	parts := strings.Split(tag, ".")
	if len(parts) != 4 {
		return window.Cell{}, false
	}
	var epoch int64
	var err0 error
	if reset {
		epoch, err0 = strconv.ParseInt(ep, 10, 64)
	}
	dur, err1 := strconv.ParseInt(parts[2], 10, 64)
	s, err2 := strconv.ParseInt(seq, 10, 64)
	id, err3 := base64.RawURLEncoding.DecodeString(parts[3])
	c := window.Cell{Workspace: parts[0], Namespace: parts[1], Identifier: string(id), Duration: dur, Sequence: s, Epoch: epoch}
	if err0 != nil || err1 != nil || err2 != nil || err3 != nil || c.Validate() != nil || r.Key(c) != key {
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
