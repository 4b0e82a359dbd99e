#!/usr/bin/env bash
# Builds the container images sluice-limiter:$IMAGE_TAG and
# sluice-bridge:$IMAGE_TAG from deploy/container (FROM scratch, static
# binaries from $BIN, user 65532) with buildah, then checks each image
# without a container runtime: it mounts the image, shows its entrypoint,
# user and size, makes sure it holds no shell, and runs its entrypoint chrooted
# into the image's file system as user 65532 — the limiter serving checks on
# an embedded NATS server, the bridge connected to it with /readyz answering.
# Installs buildah with apt when missing. Needs root (buildah's storage and
# chroot); `make image` runs it after `make build`.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin}
IMAGE_TAG=${IMAGE_TAG:-dev}
# A tag is [A-Za-z0-9_.-], not starting with . or -.
IMAGE_TAG=$(printf '%s' "$IMAGE_TAG" | tr -c 'A-Za-z0-9_.-' '-' | sed 's/^[.-]*//')
IMAGE_TAG=${IMAGE_TAG:-dev}
UID_GID=65532:65532
log() { printf 'image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (buildah storage and chroot)"
if ! command -v buildah >/dev/null; then
  log "installing buildah"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >&2
fi
CA=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$CA" ]; then
  log "installing ca-certificates"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates >&2
fi
bh() { buildah --storage-driver vfs "$@"; }

work=$(mktemp -d)
ctrs=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for c in "${ctrs[@]}"; do bh umount "$c" >/dev/null 2>&1 || true; bh rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# build NAME [BINARY [AS]]: the image sluice-NAME:$IMAGE_TAG from
# $BIN/BINARY (default NAME), placed in the context as AS (default BINARY).
build() {
  local name=$1 bin=${2:-$1} as=${3:-${2:-$1}} ctx="$work/ctx-$1"
  [ -x "$BIN/$bin" ] || die "$BIN/$bin missing: run make build"
  mkdir -p "$ctx"
  cp "$BIN/$bin" "$ctx/$as"
  cp "$CA" "$ctx/ca-certificates.crt"
  # Rebuilding a tag would leave the old image behind, untagged.
  bh rmi "sluice-$name:$IMAGE_TAG" >/dev/null 2>&1 || true
  bh bud --quiet --layers=false --build-arg "VERSION=$IMAGE_TAG" \
    -f "deploy/container/$name.Containerfile" -t "sluice-$name:$IMAGE_TAG" "$ctx" >/dev/null
}

# mount_image NAME VAR: a new working container of the image, mounted; its
# root file system's path goes into VAR (in this shell, so cleanup sees it).
mount_image() {
  local ctr
  ctr=$(bh from --quiet "sluice-$1:$IMAGE_TAG")
  ctrs+=("$ctr")
  printf -v "$2" '%s' "$(bh mount "$ctr")"
}

# inspect NAME ROOT [PATH]: entrypoint (PATH, default /NAME), user, size; no
# shell, only what is expected.
inspect() {
  local name=$1 root=$2 path=${3:-/$1} user entry size files want
  user=$(bh inspect --type image --format '{{.OCIv1.Config.User}}' "sluice-$name:$IMAGE_TAG")
  entry=$(bh inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "sluice-$name:$IMAGE_TAG")
  size=$(bh images --format '{{.Size}}' "sluice-$name:$IMAGE_TAG")
  log "sluice-$name:$IMAGE_TAG entrypoint $entry user $user size $size"
  [ "$user" = "$UID_GID" ] || die "sluice-$name: user is '$user', want $UID_GID"
  [ "$entry" = "[$path]" ] || die "sluice-$name: entrypoint is $entry, want [$path]"
  files=$(cd "$root" && find . ! -type d | sort | tr '\n' ' ')
  want=$(printf '%s\n' ".$path" ./etc/ssl/certs/ca-certificates.crt | sort | tr '\n' ' ')
  [ "$files" = "$want" ] && [ ! -e "$root/bin/sh" ] ||
    die "sluice-$name: the image holds $files, want $want"
}

# in NAME ROOT ARGS...: runs the image's entrypoint as the image's user.
in_image() {
  local name=$1 root=$2; shift 2
  chroot --userspec="$UID_GID" "$root" "/$name" "$@"
}

# wait_line FILE REGEX: waits up to 30s for a line of FILE matching REGEX, prints it.
wait_line() {
  local i
  for i in $(seq 300); do
    if grep -m1 -Eo "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# stop PID NAME: SIGTERM, wait, and require exit 0.
stop() {
  kill -TERM "$1"
  local rc=0
  wait "$1" || rc=$?
  [ "$rc" -eq 0 ] || die "$2 exited $rc after SIGTERM"
}

for name in limiter bridge; do build "$name"; done
build envoy-ratelimit limiter ratelimit
mount_image limiter lroot
mount_image bridge broot
mount_image envoy-ratelimit eroot
inspect limiter "$lroot"
inspect bridge "$broot"
inspect envoy-ratelimit "$eroot" /bin/ratelimit

for pair in "limiter:$lroot" "bridge:$broot"; do
  name=${pair%%:*} root=${pair#*:}
  got=$(in_image "$name" "$root" --version)
  want=$("$BIN/$name" --version)
  [ "$got" = "$want" ] || die "$name --version in the image printed '$got', the binary '$want'"
  log "$got (static, runs as $UID_GID in the image)"
done

# The limiter serves checks on its embedded NATS server, from inside the image.
chroot --userspec="$UID_GID" "$lroot" /limiter serve --nats-listen 127.0.0.1:0 >"$work/limiter.out" 2>"$work/limiter.err" &
pids+=($!); lpid=$!
url=$(wait_line "$work/limiter.out" 'nats://127\.0\.0\.1:[0-9]+') || { cat "$work/limiter.err" >&2; die "limiter did not start"; }
wait_line "$work/limiter.err" 'msg="limiter serving"' >/dev/null || { cat "$work/limiter.err" >&2; die "limiter did not serve"; }
check() { in_image limiter "$lroot" check --nats-url "$url" --workspace smoke --namespace image \
  --identifier "check-$$" --limit 1 --duration 1m; }
check >/dev/null || die "first check against the image's limiter was not admitted"
rc=0; check >/dev/null || rc=$?
[ "$rc" -eq 1 ] || die "second check of a limit of 1 exited $rc, want 1 (denied)"
log "limiter in the image: admitted, then denied at a limit of 1"

# The bridge connects to that NATS server and says it is ready.
chroot --userspec="$UID_GID" "$broot" /bridge --nats-url "$url" --region smoke --metrics-addr 127.0.0.1:0 >"$work/bridge.out" 2>"$work/bridge.err" &
pids+=($!); bpid=$!
metrics=$(wait_line "$work/bridge.out" 'http://[0-9.:]+') || { cat "$work/bridge.err" >&2; die "bridge did not start"; }
curl -fsS "$metrics/readyz" >/dev/null || die "bridge in the image is not ready"
log "bridge in the image: serving region smoke, /readyz 200"

# The Envoy Gateway image, started as Envoy Gateway starts envoyproxy/ratelimit
# (its command, environment and certificate mount at /certs; no xDS server
# here, so FORCE_START_WITHOUT_INITIAL_CONFIG, as Envoy Gateway sets it,
# lets it start without configuration), plus the SLUICE_* an operator adds:
# /healthcheck answers OK on 8080, gRPC serves mTLS on 8081 to a client of
# the same CA, Prometheus on 19001.
certs="$eroot/certs"
mkdir -p "$certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=smoke-ca \
  -keyout "$work/ca.key" -out "$certs/ca.crt" 2>/dev/null
issue() { # issue NAME: a certificate of the CA for NAME (server and client use)
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" -addext "subjectAltName=DNS:$1,IP:127.0.0.1" \
    -keyout "$work/$1.key" -out "$work/$1.csr" 2>/dev/null
  openssl x509 -req -in "$work/$1.csr" -CA "$certs/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -days 1 \
    -copy_extensions copy -out "$work/$1.crt" 2>/dev/null
}
issue envoy-ratelimit
issue envoy
cp "$work/envoy-ratelimit.crt" "$certs/tls.crt"; cp "$work/envoy-ratelimit.key" "$certs/tls.key"
chown -R "$UID_GID" "$certs"
env -i RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_IGNOREDOTFILES=true RUNTIME_WATCH_ROOT=false \
  LOG_LEVEL=info USE_STATSD=false CONFIG_TYPE=GRPC_XDS_SOTW CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:1 \
  CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=/certs/tls.crt \
  GRPC_SERVER_TLS_KEY=/certs/tls.key GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt CONFIG_GRPC_XDS_SERVER_USE_TLS=true \
  CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key \
  CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt FORCE_START_WITHOUT_INITIAL_CONFIG=true \
  REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:6379 USE_PROMETHEUS=true PROMETHEUS_ADDR=:19001 \
  PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml \
  SLUICE_NATS_URL="$url" SLUICE_REDIS_PREFIX="sluice-image-smoke-$$" \
  "$(command -v chroot)" --userspec="$UID_GID" "$eroot" /bin/ratelimit >"$work/eg.out" 2>"$work/eg.err" &
pids+=($!); epid=$!
wait_line "$work/eg.out" 'rate limit health check on http://[^ ]+' >/dev/null || { cat "$work/eg.err" >&2; die "the Envoy Gateway image did not serve its health check"; }
[ "$(curl -fsS http://127.0.0.1:8080/healthcheck)" = OK ] || die "the Envoy Gateway image's /healthcheck did not answer OK"
echo | openssl s_client -connect 127.0.0.1:8081 -alpn h2 -CAfile "$certs/ca.crt" -cert "$work/envoy.crt" -key "$work/envoy.key" \
  -verify_return_error >"$work/tls.out" 2>&1 || { cat "$work/tls.out" >&2; die "the Envoy Gateway image's gRPC port refused Envoy's mTLS"; }
curl -fsS http://127.0.0.1:19001/metrics | grep -q '^sluice_rls_config_loads_total' || die "the Envoy Gateway image serves no rate limit metrics on 19001"
log "envoy-ratelimit image: /bin/ratelimit with Envoy Gateway's environment and /certs: /healthcheck OK on 8080, mTLS on 8081, metrics on 19001"

stop "$epid" envoy-ratelimit
stop "$bpid" bridge
stop "$lpid" limiter
pids=()
log "ok: sluice-limiter:$IMAGE_TAG, sluice-bridge:$IMAGE_TAG and sluice-envoy-ratelimit:$IMAGE_TAG"
