#!/bin/sh
# size.sh: the hand-written code of what ships, by package. A line counts when
# it is in a non-test Go file that go generate did not write (no _gen.go) and
# is neither blank nor only a comment; the packages are those the limiter,
# the bridge and the Go client link, of this module. Prints "code all package"
# lines, largest first, then the total code lines.
set -eu
cd "$(dirname "$0")/.."
mod=$(go list -m)
pkgs=$(go list -deps ./cmd/limiter ./cmd/bridge ./bus ./httplimit ./natslimit | grep "^$mod" | sort -u)
for p in $pkgs; do
	files=$(go list -f '{{range .GoFiles}}{{$.Dir}}/{{.}} {{end}}' "$p" | tr ' ' '\n' | grep -v '_gen\.go$' || true)
	[ -n "$files" ] || continue
	code=$(cat $files | grep -v '^[[:space:]]*//' | grep -vc '^[[:space:]]*$' || true)
	all=$(cat $files | wc -l)
	echo "$code $all ${p#$mod/}"
done | sort -rn
for p in $pkgs; do
	go list -f '{{range .GoFiles}}{{$.Dir}}/{{.}} {{end}}' "$p" | tr ' ' '\n' | grep -v '_gen\.go$' || true
done | grep . | xargs cat | grep -v '^[[:space:]]*//' | grep -vc '^[[:space:]]*$' | sed 's/^/total code lines: /'
