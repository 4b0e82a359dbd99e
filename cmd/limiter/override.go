package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/policy/adminwire"
	"github.com/sluicehq/sluice/window"
)

// "limiter override set|get|delete|list" asks a limiter's ratelimit-admin
// service (README, "Overrides and shadow mode") and prints its reply as JSON: once, or, for
// list, page after page until the last, printed as one reply. Exit status
// 0 success, 2 error: bad or missing flags, no limiter, or the limiter's
// error reply (a 400's message goes to stderr). "limiter reset" is the same
// for the reset endpoint.

// Exit status of an override command that succeeded.
const exitOK = 0

// overrideUsage is what "limiter override -h" prints.
const overrideUsage = `usage: limiter override set|get|delete|list [flags]

  set     set the override of --workspace, --namespace and --identifier (a pattern:
          an identifier, or one where each * matches any bytes, such as user_*
          or org:*:admin) to --limit per --duration, enforced or with --shadow;
          prints the override as stored
  get     print the override of --workspace, --namespace and --identifier (the
          pattern exactly as set) as stored
  delete  delete the override of --workspace, --namespace and --identifier;
          prints {"deleted":true}
  list    list the overrides of --workspace, of --namespace only if given,
          asking for pages of --limit (default 1000) until the last; prints
          {"overrides":[...]}

Exit status 0 success, 2 error (a limiter's refusal is said on stderr).
"limiter override <subcommand> -h" lists its flags; every flag can also come
from the environment as SLUICE_<FLAG>.
`

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
	case "set", "get", "delete", "list":
		return runOverrideOp(ctx, args[0], args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "limiter override: unknown subcommand %q: want set, get, delete or list\n", args[0])
		return exitError
	}
}

// runOverrideOp parses the flags of subcommand op ("set", "get", "delete"
// or "list", or "reset" for "limiter reset"), sends its request (list: one
// a page, each with the whole --timeout) and prints the reply.
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
		period        string
		shadow        bool
		required      = []string{"workspace", "namespace", "identifier"}
		namespaceHelp = "namespace (required)"
	)
	fs := envflag.NewFlagSet(name, stderr)
	af.register(fs, "NATS server to send the request through")
	if op == "list" {
		namespaceHelp = "namespace; empty: every namespace of the workspace"
		required = required[:1]
	}
	fs.StringVar(&ns, "namespace", "", namespaceHelp)
	switch op {
	case "reset":
		fs.StringVar(&pattern, "identifier", "", "the identifier whose usage is forgotten (literal: * is just a byte) (required)")
		fs.Var(&duration, "duration", "window length reset: a duration like 1m, or milliseconds; absent: every duration")
		fs.StringVar(&period, "window", "", "calendar period reset, in place of --duration: "+window.CalendarRule)
	case "set", "get", "delete":
		fs.StringVar(&pattern, "identifier", "", "pattern: an identifier, or one where each * matches any bytes (user_*, org:*:admin; * alone: the whole namespace) (required)")
	case "list":
		fs.Int64Var(&limit, "limit", 0, fmt.Sprintf("overrides asked for a page, 1 to %d; absent: the limiter's default (%d); every page is listed either way",
			adminwire.MaxListLimit, adminwire.DefaultListLimit))
	}
	if op == "set" {
		fs.Int64Var(&limit, "limit", 0, "limit per window that replaces the checks' own (required)")
		fs.Var(&duration, "duration", "window length that replaces the checks' own: a duration like 1m, or milliseconds (required, or --window)")
		fs.StringVar(&period, "window", "", "calendar period that replaces the checks' window, in place of --duration: "+window.CalendarRule)
		fs.BoolVar(&shadow, "shadow", false, "shadow mode: checks counted as if enforced, a denial answered success with shadow_denied")
		required = append(required, "limit")
	}
	if err := envflag.ParsePositive(fs, args); err != nil {
		return envflag.Refuse(stderr, name, err)
	}
	missing := envflag.MissingRequired(fs, required...)
	noDuration := len(envflag.Missing(fs, "duration")) > 0
	if op == "set" && noDuration && period == "" {
		missing = append(missing, "--duration (or "+envflag.Var("duration")+") or --window")
	}
	if len(missing) > 0 {
		return envflag.Refuse(stderr, name, fmt.Errorf("missing required %s", strings.Join(missing, ", ")))
	}
	if period != "" {
		code, ok, err := window.ParseCalendar(period)
		switch {
		case !noDuration:
			err = errors.New("give --duration or --window, not both")
		case !ok:
			err = fmt.Errorf("%q is not a calendar period: %s", period, window.CalendarRule)
		}
		if err != nil {
			return envflag.Refuse(stderr, name, fmt.Errorf("--window: %w", err))
		}
		duration = msDuration(code)
	}
	if op == "list" && len(envflag.Missing(fs, "limit")) == 0 && (limit < 1 || limit > adminwire.MaxListLimit) {
		return envflag.Refuse(stderr, name, fmt.Errorf("--limit %d: want 1 to %d overrides a page", limit, adminwire.MaxListLimit))
	}
	client, closeConn, err := af.client("sluice-limiter-override")
	if err != nil {
		return answer(name, nil, err, stdout, stderr)
	}
	defer closeConn()
	if op == "list" {
		reply, err := listAll(ctx, client, af, ns, int(limit))
		return answer(name, reply, err, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	var reply any
	switch op {
	case "set":
		reply, err = client.SetOverride(ctx, af.workspace, bus.Override{Namespace: ns, Identifier: pattern,
			Limit: limit, Duration: int64(duration), Shadow: shadow})
	case "get":
		reply, err = client.GetOverride(ctx, af.workspace, ns, pattern)
	case "delete":
		err = client.DeleteOverride(ctx, af.workspace, ns, pattern)
		reply = adminwire.DeleteResponse{Deleted: true}
	case "reset":
		var epoch int64
		epoch, err = client.Reset(ctx, af.workspace, ns, pattern, int64(duration))
		reply = adminwire.ResetResponse{Namespace: ns, Identifier: pattern, Duration: int64(duration), Reset: epoch}
	}
	return answer(name, reply, err, stdout, stderr)
}

// listAll asks for the overrides of the flags' workspace (and ns) page
// after page, each page with the whole timeout and at most limit overrides
// (0: the limiter's default), and returns them as one list reply.
func listAll(ctx context.Context, client *bus.Client, af adminFlags, ns string, limit int) (adminwire.ListResponse, error) {
	all := make([]bus.Override, 0)
	cursor := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, af.timeout)
		page, next, err := client.ListOverridesPage(pctx, af.workspace, ns, cursor, limit)
		cancel()
		if err != nil {
			return adminwire.ListResponse{}, err
		}
		all = append(all, page...)
		if next == "" {
			return adminwire.ListResponse{Overrides: all}, nil
		}
		if len(page) == 0 || next == cursor {
			return adminwire.ListResponse{}, fmt.Errorf("the limiter answered a page that does not move on (%d overrides, next %q)", len(page), next)
		}
		cursor = next
	}
}
