package msgptest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// CheckGenerated regenerates every *_gen.go of the package in the current
// directory into a temporary directory, with the package's own go:generate
// lines for msgp and the msgp that go.mod pins, and fails t when a committed
// one differs or is missing. The package's go:generate line must write to
// ${MSGP_OUT}NAME_gen.go. It needs no network once the module cache holds
// msgp, and skips under -short.
func CheckGenerated(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the generator")
	}
	dir := t.TempDir()
	// msgp derives the names of what it generates from the output's base
	// name, so the fresh files keep the committed names.
	cmd := exec.Command("go", "generate", "-run", "msgp", ".")
	cmd.Env = append(os.Environ(), "MSGP_OUT="+dir+string(filepath.Separator))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go generate: %v\n%s", err, out)
	}
	fresh, err := filepath.Glob(filepath.Join(dir, "*_gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := filepath.Glob("*_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) == 0 || len(fresh) != len(committed) {
		t.Fatalf("generated %d files, %d committed", len(fresh), len(committed))
	}
	for _, f := range fresh {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Base(f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale or missing: run go generate in %s and commit", filepath.Base(f), mustWd(t))
		}
	}
}

func mustWd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}
