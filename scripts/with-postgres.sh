#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL cluster and SIDECAR_TEST_DATABASE_URL pointing at it.
#
#   scripts/with-postgres.sh cargo test
#
# Installs PostgreSQL from Debian's packages when no server binaries are found. The cluster lives in a temp
# directory, listens on 127.0.0.1 on a free port, and is stopped and deleted when the command ends, whether it
# passed, failed or was interrupted. An existing SIDECAR_TEST_DATABASE_URL is used as is.
set -euo pipefail

if [[ -n "${SIDECAR_TEST_DATABASE_URL:-}" ]]; then
  exec "$@"
fi

find_pg_bin() {
  local dir
  for dir in /usr/lib/postgresql/*/bin; do
    [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]] && { echo "$dir"; return 0; }
  done
  return 1
}

if ! PGBIN=$(find_pg_bin); then
  echo "with-postgres: PostgreSQL server binaries not found; installing Debian's postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  PGBIN=$(find_pg_bin)
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}

# PostgreSQL refuses to run as root: run it as the postgres user then.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

TMP=$(mktemp -d /tmp/sidecar-pg.XXXXXX)
chmod 755 "$TMP"
[[ $(id -u) -eq 0 ]] && chown postgres "$TMP"
PORT=$(free_port)

cleanup() {
  as_owner "$PGBIN/pg_ctl" -D "$TMP/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

as_owner "$PGBIN/initdb" -D "$TMP/data" -A trust -U postgres --no-sync -E UTF8 >"$TMP/initdb.log" 2>&1 \
  || { cat "$TMP/initdb.log" >&2; exit 1; }
as_owner "$PGBIN/pg_ctl" -D "$TMP/data" -l "$TMP/postgres.log" -w -t 60 start \
  -o "-p $PORT -k $TMP -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
      -c full_page_writes=off -c wal_level=logical -c max_connections=200" >/dev/null \
  || { cat "$TMP/postgres.log" >&2; exit 1; }

export SIDECAR_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/postgres"
echo "with-postgres: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT" >&2
"$@"
