// Package envflag parses command-line flags that can also come from the
// environment: flag --nats-url is filled from SLUICE_NATS_URL when the
// command line does not give it.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Prefix starts the environment variable of every flag.
const Prefix = "SLUICE_"

// NewFlagSet returns a flag set that reports errors (and -h) instead of
// exiting, writing usage to w.
func NewFlagSet(name string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: %s [flags]\n\nEvery flag can also be set in the environment as %s<FLAG> (for --nats-url: %s);\na flag on the command line wins.\n\n", name, Prefix, Var("nats-url"))
		fs.PrintDefaults()
	}
	return fs
}

// Var returns the environment variable of flag name: SLUICE_ + the name in
// upper case with _ for -.
func Var(name string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Parse parses args, refuses positional arguments, then fills every flag the
// command line did not set from its environment variable. It returns
// flag.ErrHelp when -h was given, after writing the usage to fs's output;
// on any other error it writes nothing (the caller prints the error, one
// line, not the whole flag list after it).
func Parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return err
	}
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(Var(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", Var(f.Name), v, e)
			}
		}
	})
	return err
}

// ParsePositive is Parse followed by RequirePositive(fs, counts...), what
// every command does with its command line: no interval, and no count
// among counts, of zero or less gets past it.
func ParsePositive(fs *flag.FlagSet, args []string, counts ...string) error {
	if err := Parse(fs, args); err != nil {
		return err
	}
	return RequirePositive(fs, counts...)
}

// Refuse ends a command whose flags cannot work, as every Sluice command
// does: it writes err on one line of w after name and a colon and returns
// exit status 2. For flag.ErrHelp (Parse wrote the usage already) it
// writes nothing and returns 0.
func Refuse(w io.Writer, name string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(w, name+":", err)
	return 2
}

// RequirePositive returns an error naming the first flag of fs, in
// lexicographic order, whose value is a time.Duration of zero or less, or,
// among counts (names of integer flags), a value below 1. Commands call it
// after Parse, so that a zero or negative interval is refused rather than
// silently replaced by a library's default. It changes nothing.
func RequirePositive(fs *flag.FlagSet, counts ...string) error {
	isCount := map[string]bool{}
	for _, n := range counts {
		if fs.Lookup(n) == nil {
			return fmt.Errorf("envflag: no flag --%s", n)
		}
		isCount[n] = true
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		switch v := g.Get().(type) {
		case time.Duration:
			if v <= 0 {
				err = fmt.Errorf("--%s %v: want a positive duration", f.Name, v)
			}
		case int, int64, uint, uint64:
			// An integer flag's text is its value in decimal; one above
			// the int64 range parses as the largest int64.
			if n, _ := strconv.ParseInt(f.Value.String(), 10, 64); isCount[f.Name] && n < 1 {
				err = fmt.Errorf("--%s %v: want at least 1", f.Name, v)
			}
		}
	})
	return err
}

// Missing returns, in the order given, the names among required that
// neither the command line nor the environment set (call it after Parse).
func Missing(fs *flag.FlagSet, required ...string) []string {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var missing []string
	for _, name := range required {
		if !set[name] {
			missing = append(missing, name)
		}
	}
	return missing
}

// MissingRequired returns the names Missing returns as a command tells them
// to its user, "--name (or SLUICE_NAME)" each.
func MissingRequired(fs *flag.FlagSet, required ...string) []string {
	missing := Missing(fs, required...)
	for i, name := range missing {
		missing[i] = "--" + name + " (or " + Var(name) + ")"
	}
	return missing
}
