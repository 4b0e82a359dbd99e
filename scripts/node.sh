#!/usr/bin/env bash
# Makes sure Node.js (18 or later) and npm are installed, installing them with
# apt where missing, then installs the TypeScript example's pinned packages
# (examples/typescript, `npm ci`) when its package-lock.json changed since the
# last install, so the tests that run the example never download.
set -euo pipefail

log() { printf 'node: %s\n' "$*" >&2; }

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    log "need root to apt-get install $*"; return 1
  fi
  if [ -z "${APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

ensure_node() {
  if ! command -v node >/dev/null; then
    log "installing nodejs"; apt_install nodejs
  fi
  # Some builds of nodejs bundle npm; Debian's ships it apart.
  if ! command -v npm >/dev/null; then
    log "installing npm"; apt_install npm
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$major" -lt 18 ]; then
    log "Node.js $(node --version) is too old: the example needs 18 or later"; return 1
  fi
}

# ensure_packages DIR: npm ci in DIR unless node_modules was installed from
# the same package-lock.json.
ensure_packages() {
  local dir=$1 stamp want
  stamp="$dir/node_modules/.sluice-lock.sha256"
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  log "npm ci in $dir"
  (cd "$dir" && npm ci --no-audit --no-fund >&2)
  echo "$want" >"$stamp"
}

ensure_node
ensure_packages "$(dirname "$0")/../examples/typescript"
log "Node.js $(node --version), npm $(npm --version); examples/typescript installed"
