package natsconn

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/natstest"
)

// Check refuses a region or a prefix that cannot name subjects, before
// anything else, and otherwise returns the options and the logger.
func TestServeFlagsCheck(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // a part of the error; empty: none
	}{
		{nil, ""},
		{[]string{"--region", "eu.west"}, `--region "eu.west": want`},
		{[]string{"--subject-prefix", "a..b"}, "--subject-prefix: subject prefix"},
		{[]string{"--log-level", "chatty"}, "--log-level"},
		{[]string{"--nats-user", "u"}, "--nats-user u: no password"},
	} {
		var f ServeFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f.RegisterFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		_, log, err := f.Check("nats://127.0.0.1:4222", &out)
		switch {
		case tc.want == "" && (err != nil || log == nil):
			t.Fatalf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Fatalf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestServedRegionRefusesAClusterNameThatIsNoToken(t *testing.T) {
	srv, err := natstest.StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	c, err := Connect(srv.ClientURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.ServedRegion(""); got != "local" || err != nil {
		t.Fatalf("ServedRegion(\"\") = %q, %v; want local", got, err)
	}
	if _, err := c.ServedRegion("eu west"); err == nil || !strings.Contains(err.Error(), "pass --region") {
		t.Fatalf("ServedRegion(\"eu west\"): %v, want a refusal that says to pass --region", err)
	}
}
