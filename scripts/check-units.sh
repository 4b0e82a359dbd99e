#!/usr/bin/env bash
# Checks the systemd units in deploy/systemd: `systemd-analyze verify` must
# accept them without a single warning (with the binaries at their ExecStart
# paths, built into a scratch root), `systemd-analyze security --offline`
# must rate them at most EXPOSURE_MAX (0-100; systemd prints it divided by
# 10), and each must keep the hardening the docs promise. Installs systemd
# with apt when systemd-analyze is missing. Writes nothing outside a
# temporary directory. Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
EXPOSURE_MAX=${EXPOSURE_MAX:-20}
log() { printf 'check-units: %s\n' "$*" >&2; }

if ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then log "systemd-analyze is missing and installing it needs root"; exit 1; fi
  log "installing systemd (for systemd-analyze)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >&2
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# verify loads the units' dependencies (sysinit.target, ...) from the root.
mkdir -p "$root/usr/lib/systemd" "$root/etc/systemd/system" "$root/opt/sluice/bin"
cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/"
CGO_ENABLED=0 "$GO" build -o "$root/opt/sluice/bin/" ./cmd/limiter ./cmd/bridge

fail=0
for unit in deploy/systemd/*.service; do
  name=$(basename "$unit")
  cp "$unit" "$root/etc/systemd/system/$name"
  # verify exits 0 on some mistakes (an unknown key is only a warning):
  # any output at all is a failure.
  if ! out=$(systemd-analyze --root="$root" verify "$name" 2>&1) || [ -n "$out" ]; then
    log "$name: systemd-analyze verify:"; printf '%s\n' "$out" >&2; fail=1
  fi
  if ! out=$(systemd-analyze --root="$root" security --offline=yes --threshold="$EXPOSURE_MAX" "$name" 2>&1); then
    log "$name: exposure above $EXPOSURE_MAX:"; printf '%s\n' "$out" | tail -n 25 >&2; fail=1
  else
    log "$name: $(printf '%s\n' "$out" | grep -o 'Overall exposure level.*')"
  fi
  for want in DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes CapabilityBoundingSet= KillSignal=SIGTERM; do
    grep -qx "$want" "$unit" || { log "$name: missing $want"; fail=1; }
  done
done
exit "$fail"
