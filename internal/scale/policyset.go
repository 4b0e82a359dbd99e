package scale

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// policySet is the policies scenario's overrides and marks, and the changes
// made to them. Pattern g (0 ≤ g < total) is override g mod Overrides of
// workspace g / Overrides; its changes all go through one region
// (policyRegion), so that each reads the one before it (read your writes
// holds within a region).
type policySet struct {
	workspaces, overrides, marks int
	total                        int
	// stride orders the changes: change k is of pattern k × stride mod
	// total, which visits every pattern once before any twice and spreads
	// consecutive changes over workspaces.
	stride int

	mu       sync.Mutex
	state    []patternState
	changed  []int       // patterns changed by answered sets and deletes, in order
	resetLog []resetDone // answered resets, in order
	errs     []string

	sets, deletes, resets, failed atomic.Int64
}

// patternState is what the driver knows of one pattern.
type patternState struct {
	live    bool  // a live override, not a tombstone
	limit   int64 // its limit when live
	busy    bool  // a change of it is under way
	unknown bool  // a change of it failed: its outcome is unknown
}

// resetDone is an answered reset: the identifier of pattern g, and the
// epoch the admin endpoint answered.
type resetDone struct {
	g     int
	epoch int64
}

// The loaded overrides' values, and the duration of every override set.
const (
	policyDurationMs = 60_000
	loadedLimitBase  = 100
	setLimitBase     = 1_000_000
)

func newPolicySet(cfg PoliciesConfig) *policySet {
	s := &policySet{workspaces: cfg.Workspaces, overrides: cfg.Overrides, marks: cfg.Marks,
		total: cfg.Workspaces * cfg.Overrides}
	s.state = make([]patternState, s.total)
	for g := range s.state {
		i := g % max(1, s.overrides)
		if !loadedTombstone(i) {
			s.state[g] = patternState{live: true, limit: loadedLimit(i)}
		}
	}
	s.stride = max(1, s.total*618/1000) | 1
	for s.total > 1 && gcd(s.stride, s.total) != 1 {
		s.stride++
	}
	return s
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func policyWorkspace(w int) string { return fmt.Sprintf("pw%05d", w) }

// policyPattern is override i's pattern: every fifth a prefix.
func policyPattern(i int) string {
	if i%5 == 0 {
		return fmt.Sprintf("p%06d_*", i)
	}
	return fmt.Sprintf("id%06d", i)
}

// resetIdentifier is the identifier a reset of override i's pattern names:
// the pattern itself, or one the prefix covers.
func resetIdentifier(i int) string {
	if i%5 == 0 {
		return fmt.Sprintf("p%06d_x", i)
	}
	return fmt.Sprintf("id%06d", i)
}

func loadedTombstone(i int) bool            { return i%TombstoneEvery == TombstoneEvery-1 }
func loadedLimit(i int) int64               { return loadedLimitBase + int64(i%1000) }
func (s *policySet) split(g int) (w, i int) { return g / s.overrides, g % s.overrides }

// policyRegion is the region pattern g's changes go through.
func (s *policySet) policyRegion(g int) int {
	w, i := s.split(g)
	return (w + i) % len(Regions)
}

// loadedLive is how many loaded overrides are live.
func (s *policySet) loadedLive() int {
	n := 0
	for i := range s.overrides {
		if !loadedTombstone(i) {
			n++
		}
	}
	return n * s.workspaces
}

// live is how many overrides the driver holds live now.
func (s *policySet) live() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, st := range s.state {
		if st.live {
			n++
		}
	}
	return n
}

// load inserts every override (versions an hour before nowMs, from the
// region its changes go through) and every mark (epochs a minute before
// nowMs, every duration) in multi-row INSERTs in primary-key order, two
// statements in flight.
func (s *policySet) load(ctx context.Context, db *sql.DB, nowMs int64) error {
	const perStatement = 2000
	version := nowMs - time.Hour.Milliseconds()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for start := 0; start < s.total; start += perStatement {
		end := min(s.total, start+perStatement)
		g.Go(func() error {
			var b strings.Builder
			b.WriteString("INSERT INTO sluice_overrides (workspace, namespace, pattern, limit_value, duration_ms, shadow, deleted, version_ms, origin) VALUES ")
			args := make([]any, 0, 9*(end-start))
			for k := start; k < end; k++ {
				if k > start {
					b.WriteByte(',')
				}
				b.WriteString("(?,?,?,?,?,?,?,?,?)")
				w, i := s.split(k)
				limit, duration, deleted := loadedLimit(i), int64(policyDurationMs), 0
				if loadedTombstone(i) {
					limit, duration, deleted = 0, 0, 1
				}
				args = append(args, policyWorkspace(w), policyNamespace, []byte(policyPattern(i)), limit, duration,
					0, deleted, version, Regions[s.policyRegion(k)])
			}
			if _, err := db.ExecContext(gctx, b.String(), args...); err != nil {
				return fmt.Errorf("load overrides %d..%d: %w", start, end, err)
			}
			return nil
		})
	}
	nMarks := s.workspaces * s.marks
	epoch := nowMs - time.Minute.Milliseconds()
	expire := policy.Mark{Duration: policy.AllDurations, Epoch: epoch}.ExpireAt(global.MarkGrace.Milliseconds())
	for start := 0; start < nMarks; start += perStatement {
		end := min(nMarks, start+perStatement)
		g.Go(func() error {
			var b strings.Builder
			b.WriteString("INSERT INTO sluice_reset_marks (workspace, namespace, identifier, duration_ms, epoch_ms, expire_at) VALUES ")
			args := make([]any, 0, 6*(end-start))
			for k := start; k < end; k++ {
				if k > start {
					b.WriteByte(',')
				}
				b.WriteString("(?,?,?,?,?,?)")
				// Mark j of workspace w names the identifier of override
				// j × (overrides / marks), spreading them.
				w, j := k/s.marks, k%s.marks
				args = append(args, policyWorkspace(w), policyNamespace,
					[]byte(resetIdentifier(j*(s.overrides/s.marks))), int64(policy.AllDurations), epoch, expire)
			}
			if _, err := db.ExecContext(gctx, b.String(), args...); err != nil {
				return fmt.Errorf("load reset marks %d..%d: %w", start, end, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// policyOp is one kind of change.
type policyOp int8

const (
	opSet policyOp = iota
	opDelete
	opReset
)

// opFor is change k's kind: of every ten, two resets, three deletes (a set
// where the pattern holds a tombstone), five sets.
func opFor(k int) policyOp {
	switch k % 10 {
	case 0, 5:
		return opReset
	case 1, 4, 7:
		return opDelete
	default:
		return opSet
	}
}

// policyJob is one change to make.
type policyJob struct {
	k, g  int
	op    policyOp
	limit int64
}

// next picks change k's pattern and kind, from k on, skipping patterns
// whose change is under way or whose state is unknown, and marks it busy;
// false when none is free.
func (s *policySet) next(k *int) (policyJob, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range min(s.total, 1000) {
		j := *k
		*k++
		g := int(int64(j) * int64(s.stride) % int64(s.total))
		st := &s.state[g]
		if st.busy || st.unknown {
			continue
		}
		op := opFor(j)
		if op == opDelete && !st.live {
			op = opSet
		}
		st.busy = true
		return policyJob{k: j, g: g, op: op, limit: setLimitBase + int64(j)}, true
	}
	return policyJob{}, false
}

// drive makes rate changes a second until ctx ends, each pattern's through
// its region's client by that region's workers, and returns once every
// change sent is answered.
func (s *policySet) drive(ctx context.Context, clients []*bus.Client, rate int) {
	// Enough that a second's changes wait on no answer: the rate is the
	// driver's, not the limiters' latency's.
	const workersPerRegion = 64
	if s.total == 0 || rate == 0 {
		<-ctx.Done()
		return
	}
	queues := make([]chan policyJob, len(Regions))
	var wg sync.WaitGroup
	for r := range Regions {
		queues[r] = make(chan policyJob, 4*workersPerRegion)
		for range workersPerRegion {
			wg.Go(func() {
				for job := range queues[r] {
					s.change(ctx, clients[r], job)
				}
			})
		}
	}
	defer func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	k, sent := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due := int(float64(rate) * now.Sub(start).Seconds())
			for ; sent < due; sent++ {
				job, ok := s.next(&k)
				if !ok {
					break
				}
				select {
				case queues[s.policyRegion(job.g)] <- job:
				case <-ctx.Done():
					s.release(job.g)
					return
				}
			}
		}
	}
}

func (s *policySet) release(g int) {
	s.mu.Lock()
	s.state[g].busy = false
	s.mu.Unlock()
}

// change makes one change (none once ctx has ended: the run is over) and
// records its outcome.
func (s *policySet) change(ctx context.Context, c *bus.Client, job policyJob) {
	if ctx.Err() != nil {
		s.release(job.g)
		return
	}
	w, i := s.split(job.g)
	ws := policyWorkspace(w)
	rctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var err error
	var epoch int64
	switch job.op {
	case opSet:
		_, err = c.SetOverride(rctx, ws, bus.Override{Namespace: policyNamespace, Identifier: policyPattern(i),
			Limit: job.limit, Duration: policyDurationMs})
	case opDelete:
		err = c.DeleteOverride(rctx, ws, policyNamespace, policyPattern(i))
	case opReset:
		epoch, err = c.Reset(rctx, ws, policyNamespace, resetIdentifier(i), policy.AllDurations)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.state[job.g]
	st.busy = false
	if err != nil {
		s.failed.Add(1)
		if job.op != opReset {
			st.unknown = true
		}
		if len(s.errs) < 5 {
			s.errs = append(s.errs, fmt.Sprintf("change %d (%v of %s %s): %v", job.k, job.op, ws, policyPattern(i), err))
		}
		return
	}
	switch job.op {
	case opSet:
		s.sets.Add(1)
		st.live, st.limit = true, job.limit
		s.changed = append(s.changed, job.g)
	case opDelete:
		s.deletes.Add(1)
		st.live = false
		s.changed = append(s.changed, job.g)
	case opReset:
		s.resets.Add(1)
		s.resetLog = append(s.resetLog, resetDone{g: job.g, epoch: epoch})
	}
}

func (op policyOp) String() string {
	switch op {
	case opSet:
		return "set"
	case opDelete:
		return "delete"
	default:
		return "reset"
	}
}

// errors returns the first errors of failed changes.
func (s *policySet) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errs...)
}

// spread returns up to n of vs, evenly spaced, the last one included.
func spread[T any](vs []T, n int) []T {
	if len(vs) <= n {
		return vs
	}
	out := make([]T, 0, n)
	for j := range n {
		out = append(out, vs[len(vs)-1-j*len(vs)/n])
	}
	return out
}

// lookUp asks every region for up to n of the patterns changed (evenly
// spread over the run) and compares the answers with each one's last
// change: the override set, or "no such override" after a delete. It
// returns the patterns sampled, the look-ups that answered otherwise and
// the first few of those.
func (s *policySet) lookUp(ctx context.Context, clients []*bus.Client, n int) (sampled, wrong int, mismatches []string) {
	s.mu.Lock()
	seen := make(map[int]bool, len(s.changed))
	var uniq []int
	for _, g := range s.changed {
		if !seen[g] && !s.state[g].unknown {
			seen[g] = true
			uniq = append(uniq, g)
		}
	}
	sample := spread(uniq, n)
	want := make([]patternState, len(sample))
	for j, g := range sample {
		want[j] = s.state[g]
	}
	s.mu.Unlock()

	type lookup struct{ j, r int }
	jobs := make(chan lookup)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for l := range jobs {
				g := sample[l.j]
				w, i := s.split(g)
				rctx, cancel := context.WithTimeout(ctx, adminTimeout)
				o, err := clients[l.r].GetOverride(rctx, policyWorkspace(w), policyNamespace, policyPattern(i))
				cancel()
				var got string
				var se *bus.ServiceError
				switch {
				case want[l.j].live && err == nil && o.Limit == want[l.j].limit && o.Duration == policyDurationMs:
					continue
				case !want[l.j].live && errors.As(err, &se) && se.Code == 400 && strings.Contains(se.Description, "no such override"):
					continue
				case err != nil:
					got = err.Error()
				default:
					got = fmt.Sprintf("limit %d, duration %d", o.Limit, o.Duration)
				}
				exp := "deleted"
				if want[l.j].live {
					exp = fmt.Sprintf("limit %d", want[l.j].limit)
				}
				mu.Lock()
				wrong++
				if len(mismatches) < 5 {
					mismatches = append(mismatches, fmt.Sprintf("%s %s in %s: %s, want %s",
						policyWorkspace(w), policyPattern(i), Regions[l.r], got, exp))
				}
				mu.Unlock()
			}
		})
	}
	for j := range sample {
		for r := range Regions {
			jobs <- lookup{j, r}
		}
	}
	close(jobs)
	wg.Wait()
	return len(sample), wrong, mismatches
}

// resetsStored looks up to n of the answered resets whose marks still
// matter (evenly spread) up in the store: each mark must hold at least the
// epoch answered. A mark of every duration ends AllDurationsFor's windows
// and the grace after its epoch (policy.Mark.ExpireAt) and is then pruned
// by design, so older resets are not looked up. It returns how many it
// looked up and how many it did not find.
func (s *policySet) resetsStored(ctx context.Context, db *sql.DB, n int) (sampled, lost int, err error) {
	// A margin of a minute: a mark about to end may be pruned while it is
	// looked up.
	live := time.Now().Add(time.Minute).UnixMilli()
	s.mu.Lock()
	var alive []resetDone
	for _, rd := range s.resetLog {
		if (policy.Mark{Duration: policy.AllDurations, Epoch: rd.epoch}).ExpireAt(global.MarkGrace.Milliseconds()) > live {
			alive = append(alive, rd)
		}
	}
	s.mu.Unlock()
	sample := spread(alive, n)
	for _, rd := range sample {
		w, i := s.split(rd.g)
		var epoch int64
		err := db.QueryRowContext(ctx, "SELECT epoch_ms FROM sluice_reset_marks WHERE workspace = ? AND namespace = ? AND identifier = ? AND duration_ms = ?",
			policyWorkspace(w), policyNamespace, []byte(resetIdentifier(i)), int64(policy.AllDurations)).Scan(&epoch)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			lost++
		case err != nil:
			return 0, 0, fmt.Errorf("look up a reset mark: %w", err)
		case epoch < rd.epoch:
			lost++
		}
	}
	return len(sample), lost, nil
}

// storeRowsChanged counts the override and mark rows changed after the
// server's clock read since (µs).
func storeRowsChanged(ctx context.Context, db *sql.DB, since int64) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM sluice_overrides WHERE changed_us > ?) + (SELECT COUNT(*) FROM sluice_reset_marks WHERE changed_us > ?)",
		since, since).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the policy rows changed: %w", err)
	}
	return n, nil
}
