// Command limiter runs a Sluice limiter: it answers rate-limit checks over
// NATS from local memory, or asks one with "limiter check".
//
//	limiter [serve] [flags]   serve checks (default)
//	limiter check [flags]     ask a limiter once and print the reply as JSON;
//	                          exit status 0 admitted, 1 denied, 2 error (a
//	                          built binary: "go run" turns every non-zero
//	                          status into 1)
//	limiter override set|get|delete|list [flags]
//	                          set, delete or list the overrides of a
//	                          workspace and print the reply as JSON; exit
//	                          status 0 success, 2 error
//	limiter reset [flags]     forget an identifier's usage (every duration,
//	                          or --duration's) in every region and print
//	                          the reply as JSON; exit status 0 success, 2
//	                          error
//	limiter top [flags]       follow the decision events limiters publish
//	                          (--decision-events) and print the identifiers
//	                          denied most
//	limiter envoy-ratelimit [flags]
//	                          serve with envoyproxy/ratelimit's environment
//	                          (as Envoy Gateway deploys it) translated into
//	                          flags; also what the binary does when it is
//	                          called ratelimit (README, "Switch Envoy
//	                          Gateway to Sluice")
//	limiter --version         print the version the binary was built as
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
	"path/filepath"
	"syscall"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// version is the version this binary was built as, set at link time by
// `make build` (-ldflags "-X main.version=..."); empty: see buildinfo.Version.
var version string

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "ratelimit" {
		args = append([]string{"envoy-ratelimit"}, args...) // Envoy Gateway runs /bin/ratelimit
	}
	code := run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	v := buildinfo.Version(version)
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "check" || args[0] == "override" || args[0] == "reset" || args[0] == "top" || args[0] == "help" || args[0] == "envoy-ratelimit") {
		cmd, args = args[0], args[1:]
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprintln(stdout, "limiter", v)
		return 0
	}
	switch cmd {
	case "check":
		return runCheck(ctx, args, stdout, stderr)
	case "override":
		return runOverride(ctx, args, stdout, stderr)
	case "reset":
		return runOverrideOp(ctx, "reset", args, stdout, stderr)
	case "top":
		return runTop(ctx, args, stdout, stderr)
	case "envoy-ratelimit":
		return runEnvoyRatelimit(ctx, v, args, os.Getenv, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, "usage: limiter [serve] [flags] | limiter check [flags] | limiter override set|get|delete|list [flags] | limiter reset [flags] | limiter top [flags] | limiter envoy-ratelimit [flags] | limiter --version; -h after serve, check, reset or an override subcommand lists its flags")
		return 0
	default:
		return runServe(ctx, v, args, stdout, stderr)
	}
}
