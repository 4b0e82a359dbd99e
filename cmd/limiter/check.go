package main

import (
	"context"
	"encoding/json"
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
	const name = "limiter check"
	var (
		af                 adminFlags
		ns, id             string
		limit, cost        int64
		duration           = msDuration(60_000)
		shadow             bool
		windowKind, charge string
	)
	fs := envflag.NewFlagSet(name, stderr)
	af.register(fs, "NATS server to send the check through")
	fs.StringVar(&ns, "namespace", "", "namespace (required)")
	fs.StringVar(&id, "identifier", "", "identifier to limit (required)")
	fs.Int64Var(&limit, "limit", 0, "limit per window (required)")
	fs.Var(&duration, "duration", "window length: a duration like 1m, or milliseconds")
	fs.Int64Var(&cost, "cost", 1, "cost of this check; 0 only looks")
	fs.BoolVar(&shadow, "shadow", false, "shadow mode: counted as if enforced, a denial answered success with shadow_denied")
	fs.StringVar(&windowKind, "window", "sliding", "kind of window: sliding; fixed (the window's own count alone, the whole limit back at its end); or a calendar period, "+window.CalendarRule+", which replaces --duration")
	fs.StringVar(&charge, "charge", "all", "how the cost is charged: all (whole or nothing), drain (what is left when it does not fit, denied) or debit (whole whatever the room: usage known afterwards)")
	if err := envflag.ParsePositive(fs, args); err != nil {
		return envflag.Refuse(stderr, name, err)
	}
	ch, err := window.ParseCharge(charge)
	if err != nil {
		return envflag.Refuse(stderr, name, fmt.Errorf("--charge: %w", err))
	}
	switch calendar, isCalendar, err := window.ParseCalendar(windowKind); {
	case err != nil:
		return envflag.Refuse(stderr, name, fmt.Errorf("--window: %w", err))
	case isCalendar && len(envflag.Missing(fs, "duration")) == 0:
		return envflag.Refuse(stderr, name, fmt.Errorf("--duration must be absent with a calendar --window (%s): the period is the window", windowKind))
	case isCalendar:
		duration = msDuration(calendar)
	case windowKind != "sliding" && windowKind != "fixed":
		return envflag.Refuse(stderr, name, fmt.Errorf("--window %q: want sliding, fixed or a calendar period (%s)", windowKind, window.CalendarRule))
	}
	if missing := envflag.MissingRequired(fs, "workspace", "namespace", "identifier", "limit"); len(missing) > 0 {
		return envflag.Refuse(stderr, name, fmt.Errorf("missing required %s", strings.Join(missing, ", ")))
	}
	client, closeConn, err := af.client("sluice-limiter-check")
	if err != nil {
		return answer(name, nil, err, stdout, stderr)
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	resp, err := client.Check(ctx, af.workspace, ns, bus.CheckRequest{Identifier: id, Limit: limit, Duration: int64(duration), Cost: cost,
		Peek: cost == 0, Shadow: shadow, Fixed: windowKind == "fixed", Charge: ch})
	if code := answer(name, checkOutput(resp), err, stdout, stderr); code != exitAdmitted || resp.Success {
		return code
	}
	return exitDenied
}

// cliFlags are the flags of every client subcommand (check, top, override,
// reset): the NATS server to connect to, with which credentials and TLS,
// and the prefix of the subjects.
type cliFlags struct {
	url, prefix string
	sec         natsconn.Security
}

// register adds the flags to fs; urlHelp says what the server is for.
func (f *cliFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&f.url, "nats-url", nats.DefaultURL, urlHelp)
	fs.StringVar(&f.prefix, "subject-prefix", bus.DefaultPrefix, "prefix of every subject")
	f.sec.RegisterFlags(fs)
}

// dial connects to the flags' server as name, with the credentials and TLS
// of the flags and of the environment.
func (f *cliFlags) dial(name string) (*nats.Conn, error) {
	f.sec.ReadEnv(os.Getenv)
	opts, err := f.sec.Options(f.url)
	if err != nil {
		return nil, err
	}
	return natsconn.Dial(f.url, name, opts...)
}

// adminFlags are the flags "limiter check" and every override subcommand
// share: where to send, how to connect, how long to wait and in which
// encoding.
type adminFlags struct {
	cliFlags
	workspace string
	timeout   time.Duration
	useJSON   bool
}

// register adds the flags to fs; urlHelp says what the server is for.
func (f *adminFlags) register(fs *flag.FlagSet, urlHelp string) {
	f.cliFlags.register(fs, urlHelp)
	fs.StringVar(&f.workspace, "workspace", "", "workspace (required)")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "how long to wait for the reply")
	fs.BoolVar(&f.useJSON, "json", false, "send the request as JSON instead of msgpack")
}

// client connects to NATS as name and returns a client for the flags'
// prefix and encoding, and the function that closes the connection.
func (f *adminFlags) client(name string) (*bus.Client, func(), error) {
	nc, err := f.dial(name)
	if err != nil {
		return nil, nil, err
	}
	enc := bus.Msgpack
	if f.useJSON {
		enc = bus.JSON
	}
	return bus.NewClient(nc, bus.WithSubjectPrefix(f.prefix), bus.WithEncoding(enc)), nc.Close, nil
}

// answer is the output of a client subcommand: v as one line of JSON on
// stdout, and exitOK; or, when err is not nil, err on one line of stderr
// after name, and exitError.
func answer(name string, v any, err error, stdout, stderr io.Writer) int {
	if err == nil {
		var out []byte
		if out, err = json.Marshal(v); err == nil {
			fmt.Fprintln(stdout, string(out))
			return exitOK
		}
	}
	fmt.Fprintln(stderr, name+":", err)
	return exitError
}
