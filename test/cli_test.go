package test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/service"
)

// The built limiter binary's exit status is what README documents for
// scripts: 0 admitted, 1 denied, 2 error. (Under "go run" both 1 and 2
// become 1, which is why the docs send scripts to a built binary.)
func TestCheckExitStatusOfTheBuiltBinary(t *testing.T) {
	srv := startServer(t)
	startLimiter(t, srv.ClientURL(), "local", service.Config{})
	bin := binary(t, "limiter")
	for _, tc := range []struct {
		name  string
		extra []string
		want  int
	}{
		{"admitted", []string{"--limit", "1"}, 0},
		{"denied", []string{"--limit", "1"}, 1},
		{"never passes", []string{"--limit", "1", "--cost", "2"}, 1},
		{"bad request", []string{"--limit", "1", "--duration", "10"}, 2},
		{"missing flag", nil, 2},
	} {
		args := append([]string{"check", "--nats-url", srv.ClientURL(), "--workspace", "acme", "--namespace", "api",
			"--identifier", "script"}, tc.extra...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.want {
			t.Fatalf("%s: exit %d, want %d; output %s", tc.name, code, tc.want, strings.TrimSpace(string(out)))
		}
	}
}
