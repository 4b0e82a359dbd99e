// Command scale runs the global layer's scale scenario (package
// internal/scale), or with -policies its policies scenario, and prints its
// measurements and a PASS or FAIL per target; it exits 1 when a target is
// missed, 2 when the scenario could not run. `make scale` and `make
// scale-policies` run them at their defaults.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/scale"
)

func main() {
	var cfg scale.Config
	flag.IntVar(&cfg.Cells, "cells", scale.DefaultCells, "live cells loaded into MySQL before the bridges start")
	flag.IntVar(&cfg.Changes, "changes", scale.DefaultChanges, "cells changed per second by the steady traffic")
	flag.DurationVar(&cfg.Duration, "d", scale.DefaultDuration, "measured duration of the steady traffic")
	flag.DurationVar(&cfg.Cycle, "cycle", scale.DefaultCycle, "how often each cell of the working set is checked (working set: changes × cycle)")
	flag.StringVar(&cfg.RedisURL, "redis", "redis://127.0.0.1:6379", "the regions' Redis (each region gets a key prefix of its own, deleted at the end)")
	flag.StringVar(&cfg.BinDir, "bin", "", "directory with built limiter and bridge commands (empty: build them)")
	flag.BoolVar(&cfg.NoBridgeRedis, "no-bridge-redis", false, "start the bridges without the region's Redis (no sweeps into MySQL), to measure what sweeps cost")
	flag.DurationVar(&cfg.SweepInterval, "sweep-interval", 0, "the bridges' --sweep-interval (0: their default)")
	var pc scale.PoliciesConfig
	policies := flag.Bool("policies", false, "run the policies scenario: overrides and reset marks loaded into MySQL, then policy changes through the admin API")
	flag.IntVar(&pc.Workspaces, "workspaces", scale.DefaultPolicyWorkspaces, "-policies: workspaces loaded")
	flag.IntVar(&pc.Overrides, "overrides", scale.DefaultPolicyOverrides, "-policies: overrides loaded per workspace (every tenth a tombstone)")
	flag.IntVar(&pc.Marks, "marks", scale.DefaultPolicyMarks, "-policies: reset marks loaded per workspace")
	flag.IntVar(&pc.Changes, "policy-changes", scale.DefaultPolicyChanges, "-policies: policy changes a second (sets, deletes, resets)")
	verbose := flag.Bool("v", false, "copy the processes' output to stderr")
	flag.Parse()

	cfg.Log = os.Stderr
	if *verbose {
		cfg.ProcessLog = os.Stderr
	} else {
		f, err := os.CreateTemp("", "sluice-scale-*.log")
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(2)
		}
		defer f.Close()
		fmt.Fprintf(os.Stderr, "processes' output in %s\n", f.Name())
		cfg.ProcessLog = f
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *policies {
		pc.Duration, pc.RedisURL, pc.BinDir, pc.Log, pc.ProcessLog = cfg.Duration, cfg.RedisURL, cfg.BinDir, cfg.Log, cfg.ProcessLog
		res, err := scale.RunPolicies(ctx, pc)
		stop()
		report(res, err)
		return
	}
	res, err := scale.Run(ctx, cfg)
	stop()
	report(res, err)
}

// result is what both scenarios return.
type result interface {
	WriteTable(w io.Writer)
	Pass() bool
}

// report prints res, and exits 2 on err, 1 when a target was missed.
func report[R result](res R, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	fmt.Println()
	res.WriteTable(os.Stdout)
	if !res.Pass() {
		os.Exit(1)
	}
}
