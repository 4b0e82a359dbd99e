#!/usr/bin/env bash
# Makes sure the services the tests use answer on loopback: Redis on
# 127.0.0.1:6379 and MariaDB on 127.0.0.1:3306 with the test account
# sluicetest@127.0.0.1 (password sluicetest, every privilege on databases
# named sluicetest_* and nothing else). Starts them when installed but
# stopped, installs them with apt when missing. It creates the test account,
# through the local socket as root, when it does not exist; it never stops or
# reconfigures a server that already answers and never alters an existing
# account.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # wait_for SECONDS CMD...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 0.2
  done
}

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

redis_ok() { port_open 6379 && { ! command -v redis-cli >/dev/null || redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }; }

ensure_redis() {
  redis_ok && return 0
  if ! command -v redis-server >/dev/null; then
    log "installing redis-server"; apt_install redis-server redis-tools
  fi
  log "starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >&2
  wait_for 20 redis_ok || { log "Redis does not answer on 127.0.0.1:6379"; return 1; }
}

mariadb_cli() { command -v mariadb >/dev/null && echo mariadb || echo mysql; }

# The test account: the tests' default DSN (internal/mysqltest.DefaultDSN)
# names it; SLUICE_TEST_MYSQL_DSN overrides it.
TEST_USER=sluicetest
TEST_HOST=127.0.0.1
TEST_PASSWORD=sluicetest
# Tests create databases named sluicetest_ and 16 hex digits
# (mysqltest.DatabasePrefix); the grant covers exactly that pattern ("\_" is
# a literal underscore in a grant's database pattern).
TEST_DATABASES='sluicetest\_%'

mariadb_ok() { port_open 3306 && MYSQL_PWD="$TEST_PASSWORD" "$(mariadb_cli)" -h 127.0.0.1 -P 3306 -u"$TEST_USER" -e 'SELECT 1' >/dev/null 2>&1; }

# ensure_test_account creates the test account as root over the unix socket
# (a fresh Debian install lets the OS root user in that way) when it does not
# exist. CREATE USER IF NOT EXISTS leaves an existing account as it is.
ensure_test_account() {
  local cli; cli=$(mariadb_cli)
  local exists
  exists=$("$cli" -uroot -N -e "SELECT COUNT(*) FROM mysql.user WHERE User='$TEST_USER' AND Host='$TEST_HOST'") || {
    log "cannot log in to MariaDB as root over the local socket to create the test account"; return 1; }
  if [ "$exists" != 0 ]; then
    log "account $TEST_USER@$TEST_HOST exists but does not log in with the test password; left as it is (drop it, or set SLUICE_TEST_MYSQL_DSN)"
    return 1
  fi
  log "creating the test account $TEST_USER@$TEST_HOST (privileges on $TEST_DATABASES only)"
  "$cli" -uroot -e "CREATE USER IF NOT EXISTS '$TEST_USER'@'$TEST_HOST' IDENTIFIED BY '$TEST_PASSWORD';
GRANT ALL PRIVILEGES ON \`$TEST_DATABASES\`.* TO '$TEST_USER'@'$TEST_HOST';" >&2
}

ensure_mariadb() {
  mariadb_ok && return 0
  if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    log "installing mariadb-server"; apt_install mariadb-server mariadb-client
  fi
  if ! port_open 3306; then
    log "starting mariadbd on 127.0.0.1:3306"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 >&2
    wait_for 60 port_open 3306 || { log "MariaDB does not listen on 127.0.0.1:3306"; return 1; }
  fi
  mariadb_ok || ensure_test_account
  wait_for 30 mariadb_ok || { log "MariaDB does not accept $TEST_USER over TCP on 127.0.0.1:3306"; return 1; }
}

ensure_redis
ensure_mariadb
log "Redis and MariaDB answer on loopback"
