// Command limiter runs a Sluice limiter: it answers rate-limit checks over
// NATS from local memory, or asks one with "limiter check".
//
//	limiter [serve] [flags]   serve checks (default)
//	limiter check [flags]     ask a limiter once and print the reply as JSON;
//	                          exit status 0 admitted, 1 denied, 2 error (a
//	                          built binary: "go run" turns every non-zero
//	                          status into 1)
//	limiter help              say how to use it
//
// Every flag can also come from the environment as SLUICE_ + the flag name in
// upper case with _ for - (SLUICE_NATS_URL for --nats-url); a flag given on
// the command line wins.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "check" || args[0] == "help") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "check":
		return runCheck(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, "usage: limiter [serve] [flags] | limiter check [flags]; -h after either lists its flags")
		return 0
	default:
		return runServe(ctx, args, stdout, stderr)
	}
}
