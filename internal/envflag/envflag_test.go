package envflag

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEnvironmentFillsUnsetFlagsOnly(t *testing.T) {
	t.Setenv("SLUICE_NATS_URL", "nats://env:4222")
	t.Setenv("SLUICE_FLUSH_WORKERS", "3")
	fs := NewFlagSet("x", &bytes.Buffer{})
	url := fs.String("nats-url", "default", "")
	workers := fs.Int("flush-workers", 8, "")
	if err := Parse(fs, []string{"--flush-workers", "5"}); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://env:4222" || *workers != 5 {
		t.Fatalf("nats-url %q, flush-workers %d; want the environment's URL and the command line's 5", *url, *workers)
	}
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Setenv("SLUICE_FLUSH_WORKERS", "many")
	fs := NewFlagSet("x", &bytes.Buffer{})
	fs.Int("flush-workers", 8, "")
	if err := Parse(fs, nil); err == nil || !strings.Contains(err.Error(), "SLUICE_FLUSH_WORKERS") {
		t.Fatalf("err = %v, want one naming SLUICE_FLUSH_WORKERS", err)
	}
}

func TestHelpListsFlagsAndTheEnvironment(t *testing.T) {
	var out bytes.Buffer
	fs := NewFlagSet("limiter serve", &out)
	fs.String("nats-url", "", "NATS server to join")
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: limiter serve", "SLUICE_NATS_URL", "-nats-url", "NATS server to join"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("help does not mention %q:\n%s", want, out.String())
		}
	}
	if err := Parse(NewFlagSet("x", &out), []string{"extra"}); err == nil {
		t.Fatal("a positional argument was accepted")
	}
}

func TestRequirePositiveRefusesZeroAndNegativeIntervalsAndCounts(t *testing.T) {
	newSet := func() *flag.FlagSet {
		fs := NewFlagSet("x", &bytes.Buffer{})
		fs.Duration("flush-interval", time.Second, "")
		fs.Int("flush-workers", 8, "")
		fs.Uint("breaker-failures", 5, "")
		fs.Int("offset", 0, "") // not a count: 0 is fine
		return fs
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--flush-interval", "0s"}, "--flush-interval 0s: want a positive duration"},
		{[]string{"--flush-interval", "-10ms"}, "--flush-interval -10ms: want a positive duration"},
		{[]string{"--flush-workers", "0"}, "--flush-workers 0: want at least 1"},
		{[]string{"--flush-workers", "-3"}, "--flush-workers -3: want at least 1"},
		{[]string{"--breaker-failures", "0"}, "--breaker-failures 0: want at least 1"},
		{[]string{"--offset", "-1"}, ""},
	} {
		fs := newSet()
		if err := Parse(fs, tc.args); err != nil {
			t.Fatal(err)
		}
		err := RequirePositive(fs, "flush-workers", "breaker-failures")
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && got != tc.want {
			t.Fatalf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if err := RequirePositive(newSet(), "no-such-flag"); err == nil {
		t.Fatal("an unknown count flag was accepted")
	}
}

func TestMissingNamesTheRequiredFlagsNotSet(t *testing.T) {
	t.Setenv("SLUICE_NAMESPACE", "api")
	fs := NewFlagSet("x", &bytes.Buffer{})
	fs.String("workspace", "", "")
	fs.String("namespace", "", "")
	fs.String("identifier", "", "")
	fs.Int64("limit", 0, "")
	if err := Parse(fs, []string{"--workspace", "acme", "--limit", "0"}); err != nil {
		t.Fatal(err)
	}
	if got := Missing(fs, "workspace", "namespace", "identifier", "limit"); !slices.Equal(got, []string{"identifier"}) {
		t.Fatalf("Missing = %q, want only identifier (workspace and limit 0 on the command line, namespace from the environment)", got)
	}
}

// A bad flag value is an error the command prints in one line: Parse writes
// nothing, not the flag list after it (-h still prints the list).
func TestABadValueWritesNoUsage(t *testing.T) {
	var out bytes.Buffer
	fs := NewFlagSet("limiter check", &out)
	fs.Duration("timeout", time.Second, "how long to wait")
	err := Parse(fs, []string{"--timeout", "bogus"})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("err = %v, want one naming the flag", err)
	}
	if out.Len() != 0 {
		t.Fatalf("Parse wrote %q on a bad value", out.String())
	}
	if err := Parse(fs, []string{"--nope"}); err == nil || out.Len() != 0 {
		t.Fatalf("an unknown flag: err %v, wrote %q", err, out.String())
	}
}

// Refuse says what is wrong in one line after the command's name and
// answers 2; after -h (the usage written already) it says nothing and
// answers 0. ParsePositive refuses a zero interval as RequirePositive does.
func TestRefuseAndParsePositive(t *testing.T) {
	var out bytes.Buffer
	fs := NewFlagSet("limiter top", &out)
	fs.Duration("interval", time.Second, "")
	fs.Int("rows", 20, "")
	err := ParsePositive(fs, []string{"--rows", "0"}, "rows")
	if got := fmt.Sprint(err); got != "--rows 0: want at least 1" {
		t.Fatalf("ParsePositive: %v", err)
	}
	if code := Refuse(&out, "limiter top", err); code != 2 || out.String() != "limiter top: --rows 0: want at least 1\n" {
		t.Fatalf("Refuse: %d, wrote %q", code, out.String())
	}
	out.Reset()
	if code := Refuse(&out, "limiter top", ParsePositive(fs, []string{"-h"})); code != 0 || !strings.Contains(out.String(), "usage: limiter top") {
		t.Fatalf("Refuse after -h: %d, wrote %q", code, out.String())
	}
}

func TestMissingRequiredNamesTheVariableToo(t *testing.T) {
	fs := NewFlagSet("x", &bytes.Buffer{})
	fs.String("workspace", "", "")
	fs.String("identifier", "", "")
	if err := Parse(fs, []string{"--workspace", "acme"}); err != nil {
		t.Fatal(err)
	}
	if got := MissingRequired(fs, "workspace", "identifier"); !slices.Equal(got, []string{"--identifier (or SLUICE_IDENTIFIER)"}) {
		t.Fatalf("MissingRequired = %q", got)
	}
}
