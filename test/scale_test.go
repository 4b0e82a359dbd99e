package test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/scale"
)

// The scale scenario of `make scale` (package internal/scale), small: 20,000
// live cells in a private MariaDB, three regions with a limiter and a bridge
// each as processes of their own, 200 cells changed a second for 8 s. The
// targets are the full run's: each bridge reads at most twice the rows
// changed plus scale.RowsReadConstant a second (not every live row), each
// limiter holds the cells it serves (not every cell live elsewhere),
// convergence p99 ≤ 250 ms, and a restarted bridge recovers every other
// region's components.
func TestScaleShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out lockedBuffer
	res, err := scale.Run(ctx, scale.Config{
		Cells:      20_000,
		Changes:    200,
		Duration:   8 * time.Second,
		Cycle:      4 * time.Second,
		Grace:      1500 * time.Millisecond,
		HeapSample: time.Second,
		BinDir:     builtCommands(t),
		RedisURL:   redistest.SharedURL(t),
		Log:        testWriter{t, "scale"},
		ProcessLog: &out,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(out.String(), 100))
	}
	var table strings.Builder
	res.WriteTable(&table)
	t.Log("\n" + table.String())
	for _, target := range res.Targets() {
		if !target.Pass {
			t.Errorf("%s: %s (%s)", target.Name, target.Measured, target.Bound)
		}
	}
	if res.Failed > 0 || res.Denied > 0 {
		t.Errorf("%d checks failed and %d were denied; every check of the scenario must be admitted", res.Failed, res.Denied)
	}
	if t.Failed() {
		t.Logf("processes' output, last lines:\n%s", tail(out.String(), 100))
	}
}

// The policies scenario of `make scale-policies` (scale.RunPolicies), small:
// 20 workspaces × 100 overrides (every tenth a tombstone) and 200 reset
// marks in a private MariaDB, three regions with a limiter and a bridge each
// as processes, 20 sets, deletes and resets a second through the admin API
// for 8 s. The targets are the full run's: each bridge reads about twice
// the policy rows changed (not every row, as a full read each second would:
// 2,000 rows/s here, 70 times the changes), no process's live heap grows
// beyond the collector's slack, every change is answered, and every change
// sampled reads back in every region and every process holds the same live
// overrides at the end.
func TestScalePoliciesShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out lockedBuffer
	res, err := scale.RunPolicies(ctx, scale.PoliciesConfig{
		Workspaces: 20,
		Overrides:  100,
		Marks:      10,
		Changes:    20,
		Duration:   8 * time.Second,
		GCWait:     20 * time.Second,
		BinDir:     builtCommands(t),
		RedisURL:   redistest.SharedURL(t),
		Log:        testWriter{t, "scale"},
		ProcessLog: &out,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(out.String(), 100))
	}
	var table strings.Builder
	res.WriteTable(&table)
	t.Log("\n" + table.String())
	for _, target := range res.Targets() {
		if !target.Pass {
			t.Errorf("%s: %s (%s)", target.Name, target.Measured, target.Bound)
		}
	}
	if t.Failed() {
		t.Logf("processes' output, last lines:\n%s", tail(out.String(), 100))
	}
}

// builtCommands returns the directory of the built commands (see binary).
func builtCommands(t *testing.T) string {
	t.Helper()
	return filepath.Dir(binary(t, "limiter"))
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
