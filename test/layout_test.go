package test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/sluicehq/sluice/"

// goPackage is what go list says of one package.
type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// listPackages runs go list on patterns from the module's root.
func listPackages(t *testing.T, patterns ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// packageTable reads docs/architecture.md's table of packages: package →
// the packages of ours it says the package imports.
func packageTable(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table := map[string][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "## Packages and their direction":
			in = true
			continue
		case in && strings.HasPrefix(line, "## "):
			return table
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		name := strings.Trim(strings.TrimSpace(cols[0]), "`")
		var imports []string
		if last := strings.TrimSpace(cols[len(cols)-1]); last != "—" {
			for imp := range strings.SplitSeq(last, ",") {
				imports = append(imports, strings.TrimSpace(imp))
			}
		}
		slices.Sort(imports)
		table[name] = imports
	}
	t.Fatal("docs/architecture.md has no section \"## Packages and their direction\"")
	return nil
}

// The package table of docs/architecture.md names every package of the
// module (but this one of tests) and, for each, exactly the packages of
// ours its non-test code imports: it cannot drift from the code.
func TestPackageTableMatchesTheImports(t *testing.T) {
	table := packageTable(t)
	for _, p := range listPackages(t, "./...") {
		name := strings.TrimPrefix(p.ImportPath, module)
		if name == "test" {
			continue
		}
		var ours []string
		for _, imp := range p.Imports {
			if rest, ok := strings.CutPrefix(imp, module); ok {
				ours = append(ours, rest)
			}
		}
		slices.Sort(ours)
		want, ok := table[name]
		if !ok {
			t.Errorf("package %s is missing from the table in docs/architecture.md", name)
			continue
		}
		if !slices.Equal(ours, want) {
			t.Errorf("package %s imports %v; the table says %v", name, ours, want)
		}
		delete(table, name)
	}
	for name := range table {
		t.Errorf("the table names %s, which is not a package", name)
	}
}

// A program that uses the Go client links what a client needs: no Redis or
// MySQL driver, no circuit breaker, no Prometheus, none of the limiter, and
// none of the cross-region layer (global, bridge) or the internal events
// limiters and bridges exchange.
func TestTheClientLinksOnlyWhatAClientNeeds(t *testing.T) {
	p := listPackages(t, "./bus")[0]
	for _, dep := range p.Deps {
		for _, banned := range []string{"github.com/redis/", "github.com/go-sql-driver/", "github.com/sony/gobreaker",
			"github.com/prometheus/", module + "service", module + "region", module + "bus/transport", "github.com/nats-io/nats-server",
			module + "global", module + "bridge", module + "bus/event"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the client links %s", dep)
			}
		}
	}
}

// The limiter links the entries it exchanges with its bridge (global) and
// none of the bridge: its state, its stores and their drivers are in
// bridge and bridge/mysql.
func TestTheLimiterLinksNoBridge(t *testing.T) {
	p := listPackages(t, "./service")[0]
	for _, dep := range p.Deps {
		for _, banned := range []string{module + "bridge", "github.com/go-sql-driver/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the limiter links %s", dep)
			}
		}
	}
}
