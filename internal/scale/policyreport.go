package scale

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// The policies scenario's targets' constants.
const (
	// PolicyReadsPerChange is what a bridge may read per policy row changed:
	// each changed row is read by the reloads that cover its changed_us,
	// (since − ChangeLag, now], twice at the defaults (ChangeLag equals the
	// reload interval).
	PolicyReadsPerChange = 2
	// PolicyReadsJitter and PolicyReadsPerReload are the room the reloads'
	// timing needs on top. A reload (Store.LoadChanged) reads the server's
	// clock, then the components, the denials, the overrides and the marks:
	// a policy row changed between the clock read and its query is read by
	// this reload and, since the next one's mark is that clock less
	// ChangeLag, by the two after it: each millisecond between them adds
	// 0.1% to the reads (measured on this machine: 2.00 to 2.05 reads a
	// change). And reloads tick every second but each reads the clock a
	// little after its tick: a read late by δ reads the rows changed in the
	// δ after the previous tick a third time and those in the δ before it
	// once, which balances over many rows, and over few by up to a row a
	// reload. 5% covers 50 ms between the clock and the policy queries.
	PolicyReadsJitter    = 0.05
	PolicyReadsPerReload = 1
	// PolicyHeapFraction and PolicyHeapConstant bound a process's live heap
	// growth from the quiet before the changes to the quiet after them: the
	// changes add no override (sets and deletes of loaded patterns replace
	// an entry with one of the same size) and at most a mark per reset
	// (about 200 B; 20 KiB a second at 100 changes a second), so what
	// remains is the buffers' slack and the resolution of the runtime's
	// report (1 MiB). A process that kept something of each change (an old
	// table view, a message) grows by the changes times its size: at 6,000
	// changes (a minute at 100 a second) the bound catches 1.4 KiB a change
	// kept in a small process, 3.5 KiB in one of 250 MiB.
	PolicyHeapFraction = 0.05
	PolicyHeapConstant = 8 << 20
)

// Changes is how many changes were sent: answered or failed (a failed one
// may have changed a row).
func (res *PoliciesResult) Changes() int64 { return res.Sets + res.Deletes + res.Resets + res.Failed }

// ChangedPerSecond is Changes over the window.
func (res *PoliciesResult) ChangedPerSecond() float64 {
	return float64(res.Changes()) / res.Window.Seconds()
}

// Targets returns the verdict on each target of the scenario.
func (res *PoliciesResult) Targets() []Target {
	var ts []Target
	changed := res.ChangedPerSecond()
	bound := PolicyReadsPerChange*changed*(1+PolicyReadsJitter) + PolicyReadsPerReload
	for _, b := range res.Bridges {
		read := b.RowsRead / res.Window.Seconds()
		ts = append(ts, Target{
			Name: fmt.Sprintf("bridge %s: MySQL rows read/s ≤ %d × policy rows changed/s (+%.0f%% and %d/s for the reloads' timing), after its full read",
				b.Region, PolicyReadsPerChange, 100*PolicyReadsJitter, PolicyReadsPerReload),
			Measured: fmt.Sprintf("%.1f/s (%.0f rows; changed %.1f/s; %.3f a change)", read, b.RowsRead, changed, b.RowsRead/float64(res.Changes())),
			Bound:    fmt.Sprintf("≤ %.1f/s", bound),
			Pass:     b.RowsRead >= 0 && res.Changes() > 0 && read <= bound,
		})
	}
	heap := func(name string, start, end float64) Target {
		growth := end - start
		hb := PolicyHeapFraction*start + PolicyHeapConstant
		return Target{
			Name:     fmt.Sprintf("%s: live heap growth, quiet before the changes → quiet after, ≤ %.0f%% + %d MiB", name, 100*PolicyHeapFraction, PolicyHeapConstant>>20),
			Measured: fmt.Sprintf("%s → %s (%s)", mib(start), mib(end), signed(growth)),
			Bound:    "≤ +" + mib(hb),
			Pass:     !math.IsNaN(growth) && growth <= hb,
		}
	}
	for _, l := range res.Limiters {
		ts = append(ts, heap("limiter "+l.Region, l.HeapStart, l.HeapEnd))
	}
	for _, b := range res.Bridges {
		ts = append(ts, heap("bridge "+b.Region, b.HeapStart, b.HeapEnd))
	}
	ts = append(ts, Target{
		Name:     "every change answered",
		Measured: fmt.Sprintf("%d sent, %d failed", res.Changes(), res.Failed),
		Bound:    "0 failed",
		Pass:     res.Changes() > 0 && res.Failed == 0,
	})
	ts = append(ts, Target{
		Name: "every sampled change visible in every region (look-ups through each region's limiter), every sampled reset whose mark has not ended stored",
		Measured: fmt.Sprintf("%d patterns × %d regions, %d wrong; %d resets, %d lost",
			res.Sampled, len(Regions), res.Wrong, res.ResetsSampled, res.ResetsLost),
		Bound: "0 wrong, 0 lost",
		Pass:  res.Sampled > 0 && res.Wrong == 0 && res.ResetsLost == 0,
	})
	var held []string
	same := true
	first := math.NaN()
	for _, p := range res.processOverrides() {
		held = append(held, fmt.Sprintf("%s %s", p.name, count(p.n)))
		if math.IsNaN(first) {
			first = p.n
		}
		same = same && p.n == first && (res.ExpectedLive < 0 || p.n == float64(res.ExpectedLive))
	}
	want := "all equal"
	if res.ExpectedLive >= 0 {
		want = fmt.Sprintf("all %d, as the changes answered leave", res.ExpectedLive)
	}
	ts = append(ts, Target{
		Name:     "every bridge and limiter holds the same live overrides at the end",
		Measured: strings.Join(held, ", "),
		Bound:    want,
		Pass:     same && !math.IsNaN(first),
	})
	return ts
}

type processCount struct {
	name string
	n    float64
}

func (res *PoliciesResult) processOverrides() []processCount {
	var out []processCount
	for _, b := range res.Bridges {
		out = append(out, processCount{"bridge " + b.Region, b.Overrides})
	}
	for _, l := range res.Limiters {
		out = append(out, processCount{"limiter " + l.Region, l.Overrides})
	}
	return out
}

// Pass reports whether every target was met.
func (res *PoliciesResult) Pass() bool { return allPass(res.Targets()) }

// WriteTable writes the measurements, then each target with PASS or FAIL.
func (res *PoliciesResult) WriteTable(w io.Writer) {
	cfg := res.Config
	fmt.Fprintf(w, "policies scenario: %d workspaces × %d overrides (every %dth a tombstone), %d reset marks; %d changes/s for %v\n\n",
		cfg.Workspaces, cfg.Overrides, TombstoneEvery, res.Marks, cfg.Changes, cfg.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "load of %d override and %d mark rows\t%v\n", res.Overrides, res.Marks, res.Load.Round(time.Millisecond))
	fmt.Fprintf(tw, "every process holding the %d live overrides\t%v after the bridges' start\n", res.Live, res.Held.Round(time.Millisecond))
	fmt.Fprintf(tw, "bridges idle after that\t%v later\n", res.Settle.Round(time.Millisecond))
	fmt.Fprintf(tw, "window\t%v (changes sent for %v, then %v for their last reads)\n",
		res.Window.Round(time.Millisecond), res.Sent.Round(time.Millisecond), PolicyTail)
	fmt.Fprintf(tw, "changes\t%d sets, %d deletes, %d resets answered, %d failed: %.1f/s over the window\n",
		res.Sets, res.Deletes, res.Resets, res.Failed, res.ChangedPerSecond())
	fmt.Fprintf(tw, "policy rows the store shows changed\t%d (at most one a change)\n", res.StoreRowsChanged)
	s := res.Server
	fmt.Fprintf(tw, "MySQL rows read/s (server)\t%.1f in all, upserts' reads of their rows included; returned (Rows_sent) %.1f (%.1f per bridge, each reload's clock row included)\n",
		s.RowsReadPerSecond, s.LoadRowsReadPerSecond, s.LoadRowsReadPerSecond/float64(len(Regions)))
	fmt.Fprintf(tw, "MySQL rows upserted/s (server)\t%.1f (Handler_write: every bridge writes every change), %.1f changed an existing row (Handler_update)\n",
		s.RowsWrittenPerSecond, s.RowsUpdatedPerSecond)
	fmt.Fprintf(tw, "mariadbd CPU\t%.2f cores\n", s.CPU)
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "process\tstart-up load\tfirst reads (rows)\trows read in window\tper change\tsnapshots asked/chunks/MiB\tCPU (cores)\tlive heap before\tafter\toverrides held\t")
	sec := res.Window.Seconds()
	for _, b := range res.Bridges {
		fmt.Fprintf(tw, "bridge %s\t%v\t%s\t%.0f (%.1f/s)\t%.3f\t%d/%d/%.1f\t%.2f\t%s\t%s\t%s\t\n", b.Region, b.StartupLoad.Round(time.Millisecond),
			count(b.FullRead), b.RowsRead, b.RowsRead/sec, b.RowsRead/float64(res.Changes()),
			b.Snapshots, b.SnapshotChunks, float64(b.SnapshotBytes)/(1<<20), b.CPU, mib(b.HeapStart), mib(b.HeapEnd), count(b.Overrides))
	}
	for _, l := range res.Limiters {
		fmt.Fprintf(tw, "limiter %s\t\t\t\t\t\t%.2f\t%s\t%s\t%s\t\n", l.Region, l.CPU, mib(l.HeapStart), mib(l.HeapEnd), count(l.Overrides))
	}
	tw.Flush()
	fmt.Fprintln(w)

	for _, e := range res.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	for _, m := range res.Mismatches {
		fmt.Fprintf(w, "wrong: %s\n", m)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(res.Errors)+len(res.Mismatches)+len(res.Notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, t := range res.Targets() {
		verdict := "PASS"
		if !t.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s  %s: %s (%s)\n", verdict, t.Name, t.Measured, t.Bound)
	}
}

// signed formats a heap change with its sign.
func signed(b float64) string {
	if b >= 0 {
		return "+" + mib(b)
	}
	return mib(b)
}
