#!/usr/bin/env bash
# Runs the end-to-end interop suite (tests/interop) against real Zero 0.20 processes:
#
#   scripts/with-postgres.sh scripts/interop.sh      # `make test` runs it after the cargo tests
#
# Installs the suite's npm packages with `npm ci` (skipped while node_modules matches package-lock.json), builds the
# sidecar, and runs node's test runner (TAP: "# pass N", "# fail N"). The suite starts and stops every process
# itself; whatever still carries this run's marker when it ends (also on failure or interruption) is killed here.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="$ROOT/tests/interop"
CARGO=${CARGO:-cargo}

: "${SIDECAR_TEST_DATABASE_URL:?run under scripts/with-postgres.sh, or point it at a PostgreSQL with wal_level=logical}"

# node-gyp builds @rocicorp/zero-sqlite3 from source against the installed node's headers (/usr/include/node), so it
# never downloads headers or prebuilt binaries.
export npm_config_nodedir=${npm_config_nodedir:-/usr}
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

cd "$DIR"
stamp=node_modules/.interop-lock.sha256
want=$( (sha256sum package-lock.json; node --version) | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "interop: npm ci (builds @rocicorp/zero-sqlite3 from source; a few minutes)" >&2
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

if [[ -z "${SIDECAR_BIN:-}" ]]; then
  (cd "$ROOT" && $CARGO build --locked --bin litestream-sidecar)
  SIDECAR_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/litestream-sidecar"
  [[ $SIDECAR_BIN = /* ]] || SIDECAR_BIN="$ROOT/$SIDECAR_BIN"
fi
export SIDECAR_BIN

export INTEROP_RUN_ID="interop-$$-$(date +%s)"
kill_marked() {
  local pid
  for pid in $(grep -lsa "INTEROP_CHILD_OF=$INTEROP_RUN_ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [[ $pid != "$$" ]] && kill -KILL "$pid" 2>/dev/null || true
  done
}
trap kill_marked EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s)
status=0
node --test --test-reporter=tap --test-concurrency=1 --test-timeout=900000 interop.test.mjs || status=$?
echo "interop: suite took $(( $(date +%s) - start )) s" >&2
exit $status
