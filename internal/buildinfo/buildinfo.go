// Package buildinfo names the version a command was built as, for --version
// and for the version its micro service reports.
package buildinfo

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// Dev is the version of a binary built without a stamped version and without
// a module version recorded by the go command (go run, go build with
// -buildvcs=false, tests).
const Dev = "dev"

// Version returns the version of the running binary: stamped when it is not
// empty (the command's variable that `make build` sets with -ldflags -X),
// else the main module's version the go command recorded in the binary, else
// Dev. It never returns an empty string.
func Version(stamped string) string {
	if v := strings.TrimSpace(stamped); v != "" {
		return v
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Dev
}

// semver is the grammar of semver.org 2.0.0, the one nats.go's micro checks a
// service's version against.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// Semver returns v as a semantic version that micro accepts as a service's
// version, keeping what v says:
//
//   - a semantic version, with or without a leading "v" (a release tag
//     "v1.2.3", a Go pseudo-version "v0.0.0-20261122175401-2633de2abcde"),
//     is returned without the "v";
//   - Dev and the empty string become "0.0.0-dev";
//   - anything else (a bare commit "2633de2-dirty" from git describe) becomes
//     "0.0.0-dev+" followed by v as build metadata, each character outside
//     [0-9A-Za-z.-] replaced by "-" and empty dot-separated parts dropped.
func Semver(v string) string {
	v = strings.TrimSpace(v)
	if s := strings.TrimPrefix(v, "v"); semver.MatchString(s) {
		return s
	}
	const dev = "0.0.0-dev"
	if v == "" || v == Dev {
		return dev
	}
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-', r == '.':
			return r
		}
		return '-'
	}, v)
	var parts []string
	for _, p := range strings.Split(clean, ".") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return dev
	}
	return dev + "+" + strings.Join(parts, ".")
}
