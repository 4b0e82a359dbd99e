package scale

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// The targets' constants.
const (
	// RowsReadConstant is the constant of the rows-read target, per
	// bridge and second: what a bridge may read independently of the
	// traffic. Its cleanup deletes expired rows in batches of at most
	// 1000 a minute (17 rows/s), and each reload runs two range queries
	// (components, denials) whose boundary rows are read even when
	// nothing changed; 100 rows/s covers both with room, and is a
	// hundredth of what reading every live row once a second costs at
	// the short scenario's 20,000 cells.
	RowsReadConstant = 100
	// HeapPerServedCell and HeapConstant bound a limiter's heap growth:
	// at most HeapPerServedCell bytes for each cell it served (about 480
	// bytes per identifier are measured by `make soak`; twice that leaves
	// room for imports and replay state) plus HeapConstant for buffers
	// and the collector's slack, whatever is live in other regions.
	HeapPerServedCell = 1024
	HeapConstant      = 16 << 20
	// ConvergenceP99 is the convergence target (docs/performance.md's targets).
	ConvergenceP99 = 250 * time.Millisecond
)

// Target is one target's verdict.
type Target struct {
	Name, Measured, Bound string
	Pass                  bool
}

// Targets returns the verdict on each target of the scenario.
func (res *Result) Targets() []Target {
	var ts []Target
	perBridge := res.Server.LoadRowsReadPerSecond / float64(len(Regions))
	bound := 2*res.ChangedPerSecond + RowsReadConstant
	ts = append(ts, Target{
		Name:     "MySQL rows read/s per bridge by its loads ≤ 2 × cells changed/s + " + fmt.Sprint(RowsReadConstant),
		Measured: fmt.Sprintf("%.0f (changed %.0f/s)", perBridge, res.ChangedPerSecond),
		Bound:    fmt.Sprintf("≤ %.0f", bound),
		Pass:     perBridge <= bound,
	})
	for _, l := range res.Limiters {
		cellsOK := l.CellsHeld <= 1.1*float64(l.CellsServed)+100
		growth := l.Heap - l.HeapIdle
		heapBound := float64(HeapPerServedCell*l.CellsServed + HeapConstant)
		ts = append(ts, Target{
			Name: fmt.Sprintf("limiter %s holds the cells it serves (≤ 1.1 × served + 100), heap growth ≤ %d B × served + %d MiB",
				l.Region, HeapPerServedCell, HeapConstant>>20),
			Measured: fmt.Sprintf("%s cells held of %d served; heap +%s", count(l.CellsHeld), l.CellsServed, mib(growth)),
			Bound:    fmt.Sprintf("≤ %.0f cells, ≤ +%s", 1.1*float64(l.CellsServed)+100, mib(heapBound)),
			Pass:     cellsOK && growth <= heapBound,
		})
	}
	c := res.Convergence
	ts = append(ts, Target{
		Name:     "convergence p99 ≤ 250 ms (every admission reaching both other regions)",
		Measured: fmt.Sprintf("p99 %s of %d (%d missing)", dur(c.P99), c.Samples+c.Missing, c.Missing),
		Bound:    "≤ " + dur(ConvergenceP99),
		Pass:     c.Samples > 0 && c.P99 <= ConvergenceP99,
	})
	rs := res.Restart
	ts = append(ts, Target{
		Name: fmt.Sprintf("the store holds every admission, and a restarted bridge (%s) every other region's components", rs.Region),
		Measured: fmt.Sprintf("store %d of %d; snapshot %d cells (sum %d) after %s", rs.StoredAll, rs.AdmittedAll,
			rs.SnapshotCells, rs.SnapshotSum, rs.Took.Round(time.Millisecond)),
		Bound: fmt.Sprintf("≥ store %d cells (sum %d)", rs.StoreCells, rs.StoreSum),
		Pass:  rs.Recovered && rs.StoredAll == rs.AdmittedAll,
	})
	return ts
}

// Pass reports whether every target was met.
func (res *Result) Pass() bool { return allPass(res.Targets()) }

// allPass reports whether every target of ts was met.
func allPass(ts []Target) bool {
	for _, t := range ts {
		if !t.Pass {
			return false
		}
	}
	return true
}

// WriteTable writes the measurements, then each target with PASS or FAIL.
func (res *Result) WriteTable(w io.Writer) {
	cfg := res.Config
	fmt.Fprintf(w, "scale scenario: %d live cells, %d changes/s over %v (working set %d cells, each checked every %v, limit %d)\n\n",
		cfg.Cells, cfg.Changes, res.Window.Round(time.Millisecond), cfg.Changes*int(cfg.Cycle/time.Second), cfg.Cycle, cfg.Limit)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "load of %d rows\t%v\n", cfg.Cells, res.Load.Round(time.Millisecond))
	fmt.Fprintf(tw, "bridges idle after their start-up loads\t%v later\n", res.Settle.Round(time.Millisecond))
	fmt.Fprintf(tw, "checks in the window\t%d sent, %d admitted, %d denied, %d failed\n", res.Sent, res.Admitted, res.Denied, res.Failed)
	fmt.Fprintf(tw, "cells changed/s\t%.0f\n", res.ChangedPerSecond)
	s := res.Server
	fmt.Fprintf(tw, "MySQL rows read/s (server)\t%.0f in all (%.0f per bridge), upserts' reads of their rows included; by loads (Rows_sent) %.0f (%.0f per bridge)\n",
		s.RowsReadPerSecond, s.RowsReadPerSecond/float64(len(Regions)), s.LoadRowsReadPerSecond,
		s.LoadRowsReadPerSecond/float64(len(Regions)))
	fmt.Fprintf(tw, "MySQL rows upserted/s (server)\t%.0f (Handler_write), of which %.0f existing rows (Handler_update)\n", s.RowsWrittenPerSecond, s.RowsUpdatedPerSecond)
	fmt.Fprintf(tw, "mariadbd CPU\t%.2f cores\n", s.CPU)
	fmt.Fprintf(tw, "store before the bridge restart\t%d counted of %d loaded and admitted\n", res.Restart.StoredAll, res.Restart.AdmittedAll)
	c := res.Convergence
	fmt.Fprintf(tw, "convergence (check → import in another region)\tp50 %s, p99 %s, max %s over %d, %d missing\n",
		dur(c.P50), dur(c.P99), dur(c.Max), c.Samples+c.Missing, c.Missing)
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bridge\tstart-up load\tCPU (cores)\tlive heap\theap in use\tcells\trows loaded/s (own stat)\t")
	for _, b := range res.Bridges {
		loaded := "not exported"
		if b.RowsLoadedPerSecond >= 0 {
			loaded = fmt.Sprintf("%.0f", b.RowsLoadedPerSecond)
		}
		fmt.Fprintf(tw, "%s\t%v\t%.2f\t%s\t%s\t%s\t%s\t\n", b.Region, b.StartupLoad.Round(time.Millisecond), b.CPU,
			mib(b.Heap), mib(b.HeapInuse), count(b.Cells), loaded)
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "limiter\tlive heap idle\tafter traffic\tcells served\tcells held\tgrowth per held cell\tper served cell\t")
	for _, l := range res.Limiters {
		growth := l.Heap - l.HeapIdle
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", l.Region, mib(l.HeapIdle), mib(l.Heap), l.CellsServed, count(l.CellsHeld),
			perCell(growth, l.CellsHeld), perCell(growth, float64(l.CellsServed)))
	}
	tw.Flush()
	fmt.Fprintln(w)

	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(res.Notes) > 0 {
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

func perCell(bytes, cells float64) string {
	if math.IsNaN(bytes) || math.IsNaN(cells) {
		return "no answer"
	}
	if cells <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f B", bytes/cells)
}

// count formats a count that may be unknown (NaN).
func count(v float64) string {
	if math.IsNaN(v) {
		return "no answer"
	}
	return fmt.Sprintf("%.0f", v)
}

func mib(b float64) string {
	if math.IsNaN(b) {
		return "no answer"
	}
	sign := ""
	if b < 0 {
		sign, b = "-", -b
	}
	return fmt.Sprintf("%s%.1f MiB", sign, b/(1<<20))
}

func dur(d time.Duration) string {
	if d == Infinite {
		return "∞"
	}
	return strings.TrimSpace(d.Round(100 * time.Microsecond).String())
}
