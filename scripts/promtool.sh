#!/usr/bin/env bash
# Checks the Prometheus alert rules in monitoring/ with promtool: `promtool
# check rules` (syntax, expressions) and `promtool test rules` (the cases in
# monitoring/alerts_test.yml). When promtool is missing it installs Debian's
# `prometheus` package, which ships it, without recommends and without
# starting the Prometheus server the package contains: a policy-rc.d that
# refuses every start is in place for the install (the one already there is
# kept), the service is disabled at boot afterwards, and nothing of the
# package may run or listen on 9090.
set -euo pipefail

log() { printf 'promtool: %s\n' "$*" >&2; }

cd "$(dirname "$0")/.."

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install_promtool() {
  if [ "$(id -u)" -ne 0 ]; then
    log "promtool is missing and installing it needs root: apt-get install prometheus"; return 1
  fi
  if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  fi
  local policy=/usr/sbin/policy-rc.d own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# written by sluice scripts/promtool.sh for one install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  local listening_before=""
  if port_open 9090; then listening_before=1; fi
  log "installing Debian's prometheus package for promtool (no service started)"
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2 || rc=$?
  if [ -n "$own_policy" ]; then rm -f "$policy"; fi
  if [ "$rc" -ne 0 ]; then log "apt-get install prometheus failed"; return "$rc"; fi
  # Only promtool is wanted: keep the package's server from starting at boot too.
  deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
  update-rc.d prometheus disable >/dev/null 2>&1 || true
  if [ -z "$listening_before" ] && port_open 9090; then
    log "something listens on 9090 after the install; stopping the prometheus service the package started"
    invoke-rc.d prometheus stop >&2 2>/dev/null || systemctl stop prometheus >&2 2>/dev/null || true
    if port_open 9090; then log "port 9090 still in use after the install"; return 1; fi
  fi
  command -v promtool >/dev/null || { log "the prometheus package did not provide promtool"; return 1; }
}

command -v promtool >/dev/null || install_promtool
promtool check rules monitoring/alerts.yml
promtool test rules monitoring/alerts_test.yml
