package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/natsconn"
	"github.com/sluicehq/sluice/policy/adminwire"
)

// "limiter override set|delete|list" asks a limiter's ratelimit-admin
// service (DESIGN.md §3.6) once and prints its reply as JSON. Exit status
// 0 success, 2 error: bad or missing flags, no limiter, or the limiter's
// error reply (a 400's message goes to stderr). "limiter reset" is the same
// for the reset endpoint.

// Exit status of an override command that succeeded.
const exitOK = 0

// overrideUsage is what "limiter override -h" prints.
const overrideUsage = `usage: limiter override set|delete|list [flags]

  set     set the override of --workspace, --namespace and --identifier (a pattern:
          an identifier, or a prefix ending in * such as user_*) to --limit per
          --duration, enforced or with --shadow; prints the override as stored
  delete  delete the override of --workspace, --namespace and --identifier;
          prints {"deleted":true}
  list    list the overrides of --workspace, of --namespace only if given;
          prints {"overrides":[...]}

Exit status 0 success, 2 error (a limiter's refusal is said on stderr).
"limiter override <subcommand> -h" lists its flags; every flag can also come
from the environment as SLUICE_<FLAG>.
`

// adminFlags are the flags every override subcommand shares with "limiter
// check": where to send, how to connect and how long to wait.
type adminFlags struct {
	url, prefix, workspace string
	timeout                time.Duration
	useJSON                bool
	sec                    natsconn.Security
}

// register adds the shared flags to fs.
func (f *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "nats-url", nats.DefaultURL, "NATS server to send the request through")
	fs.StringVar(&f.prefix, "subject-prefix", bus.DefaultPrefix, "prefix of every subject")
	fs.StringVar(&f.workspace, "workspace", "", "workspace (required)")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "how long to wait for the reply")
	fs.BoolVar(&f.useJSON, "json", false, "send the request as JSON instead of msgpack")
	f.sec.RegisterFlags(fs)
}

// client connects to NATS and returns a client for the flags' prefix and
// encoding, and the function that closes the connection.
func (f *adminFlags) client() (*bus.Client, func(), error) {
	f.sec.ReadEnv(os.Getenv)
	opts, err := f.sec.Options(f.url)
	if err != nil {
		return nil, nil, err
	}
	nc, err := natsconn.Dial(f.url, "sluice-limiter-override", opts...)
	if err != nil {
		return nil, nil, err
	}
	enc := bus.Msgpack
	if f.useJSON {
		enc = bus.JSON
	}
	return bus.NewClient(nc, bus.WithSubjectPrefix(f.prefix), bus.WithEncoding(enc)), nc.Close, nil
}

// runOverride runs "limiter override" with args, the subcommand first.
func runOverride(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "limiter override: missing subcommand\n\n"+overrideUsage)
		return exitError
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, overrideUsage)
		return exitOK
	case "set", "delete", "list":
		return runOverrideOp(ctx, args[0], args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "limiter override: unknown subcommand %q: want set, delete or list\n", args[0])
		return exitError
	}
}

// runOverrideOp parses the flags of subcommand op ("set", "delete" or
// "list", or "reset" for "limiter reset"), sends its request and prints
// the reply.
func runOverrideOp(ctx context.Context, op string, args []string, stdout, stderr io.Writer) int {
	name := "limiter override " + op
	if op == "reset" {
		name = "limiter reset"
	}
	var (
		af            adminFlags
		ns, pattern   string
		limit         int64
		duration      msDuration
		shadow        bool
		required      = []string{"workspace"}
		namespaceHelp = "namespace (required)"
	)
	fs := envflag.NewFlagSet(name, stderr)
	af.register(fs)
	if op == "list" {
		namespaceHelp = "namespace; empty: every namespace of the workspace"
	}
	fs.StringVar(&ns, "namespace", "", namespaceHelp)
	switch op {
	case "reset":
		fs.StringVar(&pattern, "identifier", "", "the identifier whose usage is forgotten (literal: * is just a byte) (required)")
		fs.Var(&duration, "duration", "window length reset: a duration like 1m, or milliseconds; absent: every duration")
		required = append(required, "namespace", "identifier")
	case "set", "delete":
		fs.StringVar(&pattern, "identifier", "", "pattern: an identifier, or a prefix ending in * (user_*; * alone: the whole namespace) (required)")
		required = append(required, "namespace", "identifier")
	}
	if op == "set" {
		fs.Int64Var(&limit, "limit", 0, "limit per window that replaces the checks' own (required)")
		fs.Var(&duration, "duration", "window length that replaces the checks' own: a duration like 1m, or milliseconds (required)")
		fs.BoolVar(&shadow, "shadow", false, "shadow mode: checks counted as if enforced, a denial answered success with shadow_denied")
		required = append(required, "limit", "duration")
	}
	if err := envflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, name+":", err)
		return exitError
	}
	if err := envflag.RequirePositive(fs); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitError
	}
	if missing := envflag.Missing(fs, required...); len(missing) > 0 {
		for i, n := range missing {
			missing[i] = "--" + n + " (or " + envflag.Var(n) + ")"
		}
		fmt.Fprintf(stderr, "%s: missing required %s\n", name, strings.Join(missing, ", "))
		return exitError
	}
	client, closeConn, err := af.client()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitError
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	var reply any
	switch op {
	case "set":
		reply, err = client.SetOverride(ctx, af.workspace, bus.Override{Namespace: ns, Identifier: pattern,
			Limit: limit, Duration: int64(duration), Shadow: shadow})
	case "delete":
		err = client.DeleteOverride(ctx, af.workspace, ns, pattern)
		reply = adminwire.DeleteResponse{Deleted: true}
	case "reset":
		var epoch int64
		epoch, err = client.Reset(ctx, af.workspace, ns, pattern, int64(duration))
		reply = adminwire.ResetResponse{Namespace: ns, Identifier: pattern, Duration: int64(duration), Reset: epoch}
	case "list":
		var list []bus.Override
		list, err = client.ListOverrides(ctx, af.workspace, ns)
		reply = adminwire.ListResponse{Overrides: append(make([]bus.Override, 0, len(list)), list...)}
	}
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitError
	}
	out, err := json.Marshal(reply)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitError
	}
	fmt.Fprintln(stdout, string(out))
	return exitOK
}
