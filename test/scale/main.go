// Command scale runs the global layer's scale scenario (package
// internal/scale) and prints its measurements and a PASS or FAIL per
// target; it exits 1 when a target is missed, 2 when the scenario could not
// run. `make scale` runs it at its defaults.
package main

import (
	"context"
	"flag"
	"fmt"
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
	res, err := scale.Run(ctx, cfg)
	stop()
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
