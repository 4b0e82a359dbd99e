package envflag

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
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
