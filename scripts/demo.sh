#!/usr/bin/env bash
# `make demo`: the sidecar beside real Zero 1.9 processes on 127.0.0.1, with `litestream-sidecar status` refreshed
# every 3 s (tests/demo/demo.mjs), until Ctrl-C:
#
#   scripts/with-postgres.sh --pg 15 scripts/demo.sh       # what `make demo` runs
#   DEMO_SECONDS=150 make demo                             # ends by itself after 150 s: exit 0 only if it purged and a drill proved the backup
#
# Installs the Zero 1.9 interop suite's npm packages when needed (scripts/install-interop.sh 1.9: Zero 1.9 and
# Node 22) and the real litestream 0.3.13 unless LITESTREAM_BIN names one (scripts/install-litestream.sh), builds
# the sidecar (debug, as the tests do) unless SIDECAR_BIN names one, and runs the demo on Node 22.
# Every process the demo starts carries this run's marker; whatever still does when it ends (also on errors or
# interruption) is killed here, and its temp dir is removed. scripts/with-postgres.sh removes the PostgreSQL cluster.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARGO=${CARGO:-cargo}
: "${SIDECAR_TEST_DATABASE_URL:?run under scripts/with-postgres.sh (make demo), or point it at a PostgreSQL with wal_level=logical}"

NODE=$("$ROOT/scripts/install-interop.sh" 1.9)
LITESTREAM_BIN=${LITESTREAM_BIN:-$("$ROOT/scripts/install-litestream.sh")}
export LITESTREAM_BIN

if [[ -z "${SIDECAR_BIN:-}" ]]; then
  (cd "$ROOT" && $CARGO build --locked --bin litestream-sidecar)
  SIDECAR_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/litestream-sidecar"
  [[ $SIDECAR_BIN = /* ]] || SIDECAR_BIN="$ROOT/$SIDECAR_BIN"
fi
export SIDECAR_BIN

# Zero's processes, its workers and litestream's gauge exporter (a `#!/usr/bin/env node` script) find Node 22 first.
export PATH="$(dirname "$NODE"):$PATH"
# The interop harness's Zero 1.9 deployment (tests/interop/lib), with telemetry off.
export INTEROP_ZERO=1.9 ZERO_ENABLE_TELEMETRY=false DO_NOT_TRACK=1

export INTEROP_RUN_ID="demo-$$-$(date +%s)"
# The demo's temp dirs (and those of Zero's processes) all go under one, removed at the end whatever happened.
DEMO_TMP=$(mktemp -d /tmp/sidecar-demo.XXXXXX)
cleanup() {
  local pid
  for pid in $(grep -lsa "INTEROP_CHILD_OF=$INTEROP_RUN_ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [[ $pid != "$$" ]] && kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$DEMO_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

TMPDIR=$DEMO_TMP "$NODE" "$ROOT/tests/demo/demo.mjs"
