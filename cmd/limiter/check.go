package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/natsconn"
	"github.com/sluicehq/sluice/window"
)

// Exit statuses of "limiter check".
const (
	exitAdmitted = 0
	exitDenied   = 1
	exitError    = 2
)

// msDuration is a window length flag: a Go duration ("1m", "10s") or a
// plain number of milliseconds.
type msDuration int64

func (d *msDuration) String() string { return strconv.FormatInt(int64(*d), 10) + "ms" }

// Set parses s and refuses a window of zero or less, changing nothing then.
func (d *msDuration) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		v, perr := time.ParseDuration(s)
		if perr != nil {
			return fmt.Errorf("want a duration like 1m or 10s, or milliseconds")
		}
		n = v.Milliseconds()
	}
	if n <= 0 {
		return fmt.Errorf("want a positive window, got %s", s)
	}
	*d = msDuration(n)
	return nil
}

// checkOutput is what "limiter check" prints: the response in the JSON form
// of the client contract.
type checkOutput struct {
	Success    bool  `json:"success"`
	Limit      int64 `json:"limit"`
	Remaining  int64 `json:"remaining"`
	Reset      int64 `json:"reset"`
	RetryAfter int64 `json:"retry_after"`
	// ShadowDenied: enforcement would have denied (shadow mode).
	ShadowDenied bool `json:"shadow_denied,omitempty"`
	// Override: the pattern of the override that applied, if one did.
	Override string `json:"override,omitempty"`
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		url, prefix, ws, ns, id string
		limit, cost             int64
		duration                = msDuration(60_000)
		timeout                 time.Duration
		useJSON, shadow         bool
		windowKind, charge      string
	)
	fs := envflag.NewFlagSet("limiter check", stderr)
	fs.StringVar(&url, "nats-url", nats.DefaultURL, "NATS server to send the check through")
	fs.StringVar(&prefix, "subject-prefix", bus.DefaultPrefix, "prefix of every subject")
	fs.StringVar(&ws, "workspace", "", "workspace (required)")
	fs.StringVar(&ns, "namespace", "", "namespace (required)")
	fs.StringVar(&id, "identifier", "", "identifier to limit (required)")
	fs.Int64Var(&limit, "limit", 0, "limit per window (required)")
	fs.Var(&duration, "duration", "window length: a duration like 1m, or milliseconds")
	fs.Int64Var(&cost, "cost", 1, "cost of this check; 0 only looks")
	fs.DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the reply")
	fs.BoolVar(&useJSON, "json", false, "send the request as JSON instead of msgpack")
	fs.BoolVar(&shadow, "shadow", false, "shadow mode: counted as if enforced, a denial answered success with shadow_denied")
	fs.StringVar(&windowKind, "window", "sliding", "kind of window: sliding; fixed (the window's own count alone, the whole limit back at its end); or a calendar period, "+window.CalendarRule+", which replaces --duration")
	fs.StringVar(&charge, "charge", "all", "how the cost is charged: all (whole or nothing), drain (what is left when it does not fit, denied) or debit (whole whatever the room: usage known afterwards)")
	var sec natsconn.Security
	sec.RegisterFlags(fs)
	if err := envflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitAdmitted
		}
		fmt.Fprintln(stderr, "limiter check:", err)
		return exitError
	}
	if err := envflag.RequirePositive(fs); err != nil {
		fmt.Fprintln(stderr, "limiter check:", err)
		return exitError
	}
	ch, err := window.ParseCharge(charge)
	if err != nil {
		fmt.Fprintln(stderr, "limiter check: --charge:", err)
		return exitError
	}
	switch calendar, isCalendar, err := window.ParseCalendar(windowKind); {
	case err != nil:
		fmt.Fprintln(stderr, "limiter check: --window:", err)
		return exitError
	case isCalendar && len(envflag.Missing(fs, "duration")) == 0:
		fmt.Fprintf(stderr, "limiter check: --duration must be absent with a calendar --window (%s): the period is the window\n", windowKind)
		return exitError
	case isCalendar:
		duration = msDuration(calendar)
	case windowKind != "sliding" && windowKind != "fixed":
		fmt.Fprintf(stderr, "limiter check: --window %q: want sliding, fixed or a calendar period (%s)\n", windowKind, window.CalendarRule)
		return exitError
	}
	if missing := envflag.Missing(fs, "workspace", "namespace", "identifier", "limit"); len(missing) > 0 {
		for i, name := range missing {
			missing[i] = "--" + name + " (or " + envflag.Var(name) + ")"
		}
		fmt.Fprintf(stderr, "limiter check: missing required %s\n", strings.Join(missing, ", "))
		return exitError
	}
	nc, err := dialCLI(&sec, url, "sluice-limiter-check")
	if err != nil {
		fmt.Fprintln(stderr, "limiter check:", err)
		return exitError
	}
	defer nc.Close()
	enc := bus.Msgpack
	if useJSON {
		enc = bus.JSON
	}
	client := bus.NewClient(nc, bus.WithSubjectPrefix(prefix), bus.WithEncoding(enc))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := client.Check(ctx, ws, ns, bus.CheckRequest{Identifier: id, Limit: limit, Duration: int64(duration), Cost: cost,
		Peek: cost == 0, Shadow: shadow, Fixed: windowKind == "fixed", Charge: ch})
	if err != nil {
		fmt.Fprintln(stderr, "limiter check:", err)
		return exitError
	}
	out, _ := json.Marshal(checkOutput(resp))
	fmt.Fprintln(stdout, string(out))
	if !resp.Success {
		return exitDenied
	}
	return exitAdmitted
}

// dialCLI connects a command of the CLI to url as name, with the
// credentials and TLS of sec's flags and of the environment.
func dialCLI(sec *natsconn.Security, url, name string) (*nats.Conn, error) {
	sec.ReadEnv(os.Getenv)
	opts, err := sec.Options(url)
	if err != nil {
		return nil, err
	}
	return natsconn.Dial(url, name, opts...)
}
