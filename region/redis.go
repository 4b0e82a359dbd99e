package region

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
}

// Redis is an Origin on a Redis server or Redis Cluster. A cell is one hash:
// field "t" holds the total and field "r:<reporter>" each reporter's highest
// report, so replays are idempotent. The current and previous cell of an
// identifier share a hash tag and so a cluster slot: a read of both is one
// command to one node.
type Redis struct {
	client  redis.UniversalClient
	cluster bool
	prefix  string
	apply   *redis.Script
	read    *redis.Script
	admit   *redis.Script
	release *redis.Script
}

// applyScript records, for each cell, one reporter's cumulative count, adds
// what grew to the total and sets the cell's absolute expiry, atomically, and
// returns the totals. KEYS are cells; ARGV[1] is the reporter field and
// ARGV[2i], ARGV[2i+1] the own count and expire-at (ms) of KEYS[i]. Counts
// are exact below 2^53 (Lua numbers); a single process admits at most the
// limit, 10^15, in one cell.
const applyScript = `
local f = ARGV[1]
local out = {}
for i, k in ipairs(KEYS) do
  local own = tonumber(ARGV[2*i])
  local cur = redis.call('HMGET', k, f, 't')
  local old = tonumber(cur[1] or '0')
  local total
  if own > old then
    redis.call('HSET', k, f, ARGV[2*i])
    total = redis.call('HINCRBY', k, 't', string.format('%d', own - old))
  else
    total = tonumber(cur[2] or '0')
  end
  redis.call('PEXPIREAT', k, ARGV[2*i+1])
  out[i] = total
end
return out`

// admitScript admits cost in one cell if its total allows, atomically, after
// recording the reporter's own count as applyScript does. KEYS[1] is the
// cell; ARGV[1] the reporter field, ARGV[2] its own count, ARGV[3] the cost,
// ARGV[4] the largest total (before the cost) at which the cost fits,
// ARGV[5] the expire-at (ms). It returns {admitted (0 or 1), total, the
// reporter's own count}. Counts go to Redis as strings ('%d'): Lua would
// write a number above 10^14 in exponent notation.
const admitScript = `
local k, f = KEYS[1], ARGV[1]
local own, cost, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HMGET', k, f, 't')
local r, t = tonumber(cur[1] or '0'), tonumber(cur[2] or '0')
if own > r then
  redis.call('HSET', k, f, ARGV[2])
  t = redis.call('HINCRBY', k, 't', string.format('%d', own - r))
  r = own
end
local ok = 0
if t <= most then
  t = redis.call('HINCRBY', k, 't', ARGV[3])
  r = redis.call('HINCRBY', k, f, ARGV[3])
  ok = 1
end
redis.call('PEXPIREAT', k, ARGV[5])
return {ok, t, r}`

// releaseScript takes back ARGV[2] from the total of KEYS[1] and from the
// reporter field ARGV[1].
const releaseScript = `
redis.call('HINCRBY', KEYS[1], 't', '-' .. ARGV[2])
redis.call('HINCRBY', KEYS[1], ARGV[1], '-' .. ARGV[2])
return 1`

// applyChunk is the most cells one script call carries on a single server.
// In a cluster each call carries one cell: cells of different identifiers
// live in different slots.
const applyChunk = 128

// readScript returns the totals of two cells.
// KEYS[1] current cell, KEYS[2] previous cell.
const readScript = `
return {tonumber(redis.call('HGET', KEYS[1], 't') or '0'), tonumber(redis.call('HGET', KEYS[2], 't') or '0')}`

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
		apply:   redis.NewScript(applyScript),
		read:    redis.NewScript(readScript),
		admit:   redis.NewScript(admitScript),
		release: redis.NewScript(releaseScript),
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
		opt.ContextTimeoutEnabled = true
		if !setsRetries(raw) {
			opt.MaxRetries = -1
		}
		return redis.NewClient(opt), nil
	case "redis+cluster", "rediss+cluster":
		opt, err := redis.ParseClusterURL(strings.TrimSuffix(scheme, "+cluster") + "://" + rest)
		if err != nil {
			return nil, fmt.Errorf("redis cluster URL: %w", err)
		}
		opt.ContextTimeoutEnabled = true
		if !setsRetries(raw) {
			opt.MaxRetries = -1
		}
		return redis.NewClusterClient(opt), nil
	}
	return nil, fmt.Errorf("redis URL scheme %q: want redis, rediss, redis+cluster or rediss+cluster", scheme)
}

// setsRetries reports whether the URL sets go-redis's max_retries. Unless
// it does, commands are not retried by the client: a read that fails must
// fail within the check's read timeout, and a replay that fails is sent
// again by the next replay round anyway; go-redis's own retries (3, with
// backoff up to 512ms) would only hide a Redis that is down from the
// breakers for a second per call.
func setsRetries(raw string) bool {
	_, query, _ := strings.Cut(raw, "?")
	for kv := range strings.SplitSeq(query, "&") {
		if k, _, _ := strings.Cut(kv, "="); k == "max_retries" {
			return true
		}
	}
	return false
}

// loadScripts loads the scripts on every node that may run them.
func (r *Redis) loadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		for _, s := range []*redis.Script{r.apply, r.read, r.admit, r.release} {
			if err := s.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("load script: %w", err)
			}
		}
		return nil
	}
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Client:
		return load(ctx, c)
	}
	return fmt.Errorf("unexpected redis client %T", r.client)
}

// Key returns the Redis key of cell c: prefix{ws.ns.duration.base64url(id)}.seq.
// Workspace and namespace are tokens of [A-Za-z0-9_-]; the identifier is
// base64url-encoded, so any bytes give an unambiguous key without braces.
func (r *Redis) Key(c window.Cell) string {
	return string(r.appendKey(nil, c))
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
	dst = append(dst, '}', '.')
	return strconv.AppendInt(dst, c.Sequence, 10)
}

// Read returns the totals of c and of the cell before it in one command.
func (r *Redis) Read(ctx context.Context, c window.Cell) (current, previous int64, err error) {
	p := c
	p.Sequence--
	vals, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		return []*redis.Cmd{r.read.EvalSha(ctx, pipe, []string{r.Key(c), r.Key(p)})}
	})
	if err != nil {
		return 0, 0, fmt.Errorf("redis read: %w", err)
	}
	pair, err := vals[0].Int64Slice()
	if err != nil || len(pair) != 2 {
		return 0, 0, fmt.Errorf("redis read: unexpected reply %v: %w", vals[0].Val(), err)
	}
	return clampCount(pair[0]), clampCount(pair[1]), nil
}

// Apply records reports in one pipeline of script calls (applyChunk cells a
// call on a single server, one a call in a cluster) and returns the totals.
func (r *Redis) Apply(ctx context.Context, reporter string, reports []Report) ([]int64, error) {
	chunk := applyChunk
	if r.cluster {
		chunk = 1
	}
	field := "r:" + reporter
	cmds, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, 0, (len(reports)+chunk-1)/chunk)
		for start := 0; start < len(reports); start += chunk {
			part := reports[start:min(start+chunk, len(reports))]
			keys := make([]string, len(part))
			args := make([]any, 1, 1+2*len(part))
			args[0] = field
			for i, rep := range part {
				keys[i] = r.Key(rep.Cell)
				args = append(args, rep.Own, rep.ExpireAt)
			}
			cmds = append(cmds, r.apply.EvalSha(ctx, pipe, keys, args...))
		}
		return cmds
	})
	if err != nil {
		return nil, fmt.Errorf("redis apply %d cells: %w", len(reports), err)
	}
	totals := make([]int64, 0, len(reports))
	for _, c := range cmds {
		part, err := c.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("redis apply: unexpected reply %v: %w", c.Val(), err)
		}
		for _, t := range part {
			totals = append(totals, clampCount(t))
		}
	}
	if len(totals) != len(reports) {
		return nil, fmt.Errorf("redis apply: %d totals for %d cells", len(totals), len(reports))
	}
	return totals, nil
}

// Admit decides a's admission in one script call on the cell's node.
func (r *Redis) Admit(ctx context.Context, reporter string, a Admission) (AdmitResult, error) {
	cmds, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		return []*redis.Cmd{r.admit.EvalSha(ctx, pipe, []string{r.Key(a.Cell)},
			"r:"+reporter, a.Own, a.Cost, a.Max, a.ExpireAt)}
	})
	if err != nil {
		return AdmitResult{}, fmt.Errorf("redis admit: %w", err)
	}
	vals, err := cmds[0].Int64Slice()
	if err != nil || len(vals) != 3 {
		return AdmitResult{}, fmt.Errorf("redis admit: unexpected reply %v: %w", cmds[0].Val(), err)
	}
	return AdmitResult{Admitted: vals[0] == 1, Total: clampCount(vals[1]), Reported: clampCount(vals[2])}, nil
}

// Release takes back cost in one script call on the cell's node.
func (r *Redis) Release(ctx context.Context, reporter string, c window.Cell, cost int64) error {
	_, err := r.run(ctx, func(ctx context.Context, pipe redis.Pipeliner) []*redis.Cmd {
		return []*redis.Cmd{r.release.EvalSha(ctx, pipe, []string{r.Key(c)}, "r:"+reporter, cost)}
	})
	if err != nil {
		return fmt.Errorf("redis release: %w", err)
	}
	return nil
}

// clampCount brings a count Redis returned into 0..window.MaxCount: what
// Redis holds is input too.
func clampCount(v int64) int64 { return min(max(v, 0), window.MaxCount) }

// run executes the commands queue adds in one pipeline; if Redis lost the
// scripts (a restart or failover), it loads them and runs once more.
func (r *Redis) run(ctx context.Context, queue func(context.Context, redis.Pipeliner) []*redis.Cmd) ([]*redis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		pipe := r.client.Pipeline()
		cmds := queue(ctx, pipe)
		_, err := pipe.Exec(ctx)
		if err == nil {
			return cmds, nil
		}
		if attempt > 0 || !isNoScript(err, cmds) {
			return nil, err
		}
		if lerr := r.loadScripts(ctx); lerr != nil {
			return nil, errors.Join(err, lerr)
		}
	}
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

// Close closes the connections.
func (r *Redis) Close() error { return r.client.Close() }

// Client returns the underlying go-redis client, for tests and tooling.
func (r *Redis) Client() redis.UniversalClient { return r.client }
