// Package envflag parses command-line flags that can also come from the
// environment: flag --nats-url is filled from SLUICE_NATS_URL when the
// command line does not give it.
package envflag

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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
// flag.ErrHelp when -h was given.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
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
