#!/usr/bin/env bash
# `make test`: every test, the Rust tests that need PostgreSQL on every major in $PG and every interop suite on the
# first of them:
#
#   scripts/test.sh              # PostgreSQL 15 and 17 (or the majors in $PG)
#   scripts/test.sh 18           # only PostgreSQL 18
#
# Phases, each with its output in a log file of its own (target/test-logs/PHASE.log; a failed phase's log is printed
# in full at the end):
#   build       the sidecar binary (debug: what the interop suites run), with the benchmark example, so that its
#               dependencies get the features the tests' dependencies add (tokio's test-util and the rest): the
#               tests' build then reuses them, rather than compiling tokio and every crate above it (hyper,
#               tokio-postgres, object_store, …) a second time, and leaves the binary the interop suites run as it
#               is. Meanwhile the interop suites' npm packages are installed, the real litestream binaries
#               (scripts/install-litestream.sh) and moto (scripts/moto.sh: the backup tests and the interop
#               suites' S3 deployments use it), every major's PostgreSQL binaries (scripts/with-postgres.sh
#               --install) and haproxy (scripts/haproxy.sh: the interop suite's pair of sidecars is reached
#               through it)
#   build-tests the tests, examples and benchmarks (so a change cannot break `make bench` unnoticed)
#   alerts      the alerting rules' unit tests (scripts/test-alerts.sh), once
#   rust-unit   `cargo test --lib --bins`, once
#   rust-it     the integration tests that need no database (`--test it -- --skip pg::`), once
#   rust-pg-M   the integration tests that do (`--test it -- pg::`), on PostgreSQL M
#   zero-V-M[-k] the interop suite with real Zero V (each version tests/interop/lib/versions.mjs --list names:
#               0.20, 1.9 and 1.10; scripts/interop.sh) on PostgreSQL M, the first major, or its shard k
# Every interop suite runs whole on the first major, split into the shards its scenarios' measured seconds call for
# (lib/versions.mjs `shardCount`: about 400 s each; Zero 1.9's and 1.10's into two, 0.20's whole), side by side, each
# shard on a cluster of its own: a suite's scenarios, in the groups its table keeps together (the main deployment's,
# which rely on one another; each that starts a deployment of its own; the harness's own tests), are dealt out by
# their seconds (INTEROP_SHARD=k/n, `shardOf`). The sidecar's SQL is tested on every major by rust-pg-M; `make
# interop` runs every suite on every major. The summary says which scenarios ran where.
# After the build, the Rust lane (alerts beside build-tests, as a fresh checkout's alerts mostly wait on
# promtool's download; then rust-unit, rust-it, and rust-pg-M for every major side by side) and every zero-V-M run
# side by side, each phase that needs PostgreSQL on a throwaway cluster of its own (scripts/with-postgres.sh). The
# tests mostly wait (on sockets, timers, the database; the interop suites on Zero's and the sidecar's timers), so
# they cost little beside each other, and the two lanes take about as long: 5 to 6 minutes, the longest shard. Every phase runs even when an earlier one failed.
#
# The last lines: a table of the phases (seconds, result), the test counts of the tests that run once, of each major
# and of the whole run, then what failed: the tests each failed phase names, or its log's last lines. Exits non-zero
# when any phase failed. Everything started is stopped on the way out, also on failure or interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
export CARGO

majors=("$@")
if [[ ${#majors[@]} -eq 0 ]]; then
  read -r -a majors <<<"${PG:-15 17}"
fi
# The Zero versions with an interop suite that can be installed (tests/interop/lib/versions.mjs).
read -r -a ZERO_VERSIONS <<<"$(node tests/interop/lib/versions.mjs --list)"

# The major every interop suite runs on, whole (`make interop` runs each on every major).
INTEROP_MAJOR=${majors[0]}
# zero_phase VERSION K N: the phase of shard K of N of VERSION's suite.
zero_phase() {
  if [[ $3 -eq 1 ]]; then echo "zero-$1-$INTEROP_MAJOR"; else echo "zero-$1-$INTEROP_MAJOR-$2"; fi
}

STARTED=$(date +%s)
# Every sidecar a test starts keeps its state where the test says: the host's default state file (an installed
# sidecar's) must come out of the run as it went in.
HOST_STATE=/var/lib/litestream-sidecar/state.json
host_state() { stat -c '%Y %s' "$HOST_STATE" 2>/dev/null || echo absent; }
HOST_STATE_BEFORE=$(host_state)
LOGS=${TEST_LOGS:-$PWD/target/test-logs}
rm -rf "$LOGS"
mkdir -p "$LOGS"
export LOGS

# Every phase runs in the background and is waited for (a trapped signal ends `wait` at once, not a foreground
# command). On the way out, also on failure or interruption, whatever this run still has running gets SIGTERM: the
# phases' own scripts then stop what they started (scripts/with-postgres.sh its cluster, scripts/interop.sh every
# process carrying its run's marker).
LANES=()
descendants() {
  local child
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}
stop_lanes() {
  local pids
  pids=$(descendants $$)
  # shellcheck disable=SC2086 # a list of pids
  [[ -z $pids ]] || kill -TERM $pids 2>/dev/null || true
  for pid in ${LANES[@]+"${LANES[@]}"}; do wait "$pid" 2>/dev/null || true; done
  LANES=()
}
trap stop_lanes EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# phase NAME COMMAND...: runs COMMAND with its output in $LOGS/NAME.log; records its seconds and exit status.
phase() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  echo "[$(date +%T)] $name: started" >&2
  "$@" >"$LOGS/$name.log" 2>&1 </dev/null || rc=$?
  echo "$name $(($(date +%s) - start)) $rc" >"$LOGS/$name.phase"
  echo "[$(date +%T)] $name: $([[ $rc -eq 0 ]] && echo passed || echo "FAILED (exit $rc)")" >&2
  return 0
}

# The Rust integration tests: one binary, `it`, whose tests that need PostgreSQL all have a path segment `pg`. They
# mostly wait (on sockets, timers, the database), so more of them run at once than there are cores.
TEST_THREADS=${TEST_THREADS:-8}
RUST_NOPG=(--test it -- --skip pg:: --test-threads="$TEST_THREADS")
RUST_PG=(--test it -- pg:: --test-threads="$TEST_THREADS")

build() {
  # The installs wait on the network and the disk (and Zero 0.20's compiles zero-sqlite3); the build takes the rest.
  local installs=() version pid
  for version in "${ZERO_VERSIONS[@]}"; do
    scripts/install-interop.sh "$version" >/dev/null &
    installs+=($!)
  done
  (scripts/install-litestream.sh 0.3 >"$LOGS/litestream.path" && scripts/install-litestream.sh 0.5 >"$LOGS/litestream-0.5.path") &
  local ils=$!
  # An S3-compatible server (moto) on loopback, before the phases that start it side by side.
  scripts/moto.sh >"$LOGS/moto.path" &
  local moto=$!
  # Every major's server binaries, before the phases that start clusters of them side by side; then haproxy, for the
  # interop suites' pair of sidecars (both may come from apt, which installs one package at a time).
  (scripts/with-postgres.sh --pg "$(IFS=,; echo "${majors[*]}")" --install >/dev/null \
    && scripts/haproxy.sh >"$LOGS/haproxy.path") &
  local pgs=$!
  local rc=0
  # (An example that does not compile fails build-tests, not this: the binary alone then.)
  $CARGO build --locked --bin litestream-sidecar --example bench \
    || $CARGO build --locked --bin litestream-sidecar || rc=$?
  for pid in "${installs[@]}"; do wait "$pid" || rc=$?; done
  wait $ils || rc=$?
  wait $moto || rc=$?
  wait $pgs || rc=$?
  return $rc
}
build_tests() {
  # promtool is fetched by test-alerts.sh itself.
  $CARGO build --locked --all-targets
}
phase build build &
LANES+=($!)
wait "${LANES[0]}"
LANES=()
export SIDECAR_BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug/litestream-sidecar
[[ $SIDECAR_BIN = /* ]] || SIDECAR_BIN=$PWD/$SIDECAR_BIN
# The real litestream binaries (scripts/install-litestream.sh) that the tests, the interop suites and the drills run.
LITESTREAM_BIN=$(cat "$LOGS/litestream.path" 2>/dev/null || true)
LITESTREAM_05_BIN=$(cat "$LOGS/litestream-0.5.path" 2>/dev/null || true)
export LITESTREAM_BIN LITESTREAM_05_BIN
MOTO_SERVER=$(cat "$LOGS/moto.path" 2>/dev/null || true)
HAPROXY_BIN=$(cat "$LOGS/haproxy.path" 2>/dev/null || true)
export MOTO_SERVER HAPROXY_BIN

if [[ $(cut -d' ' -f3 "$LOGS/build.phase") -eq 0 ]]; then
  rust_lane() {
    phase alerts scripts/test-alerts.sh &
    local pids=($!)
    phase build-tests build_tests
    phase rust-unit $CARGO test --locked --no-fail-fast --lib --bins
    phase rust-it $CARGO test --locked --no-fail-fast "${RUST_NOPG[@]}"
    # The majors side by side: these tests mostly wait.
    for major in "${majors[@]}"; do
      phase "rust-pg-$major" scripts/with-postgres.sh --pg "$major" $CARGO test --locked --no-fail-fast "${RUST_PG[@]}" &
      pids+=($!)
    done
    wait "${pids[@]}"
  }
  rust_lane &
  LANES+=($!)
  # Every suite whole on the first major, in the shards its measured seconds call for (lib/versions.mjs
  # `shardCount`), each shard on a cluster of its own.
  for version in "${ZERO_VERSIONS[@]}"; do
    shards=$(node tests/interop/lib/versions.mjs --shards "$version")
    for k in $(seq 1 "$shards"); do
      phase "$(zero_phase "$version" "$k" "$shards")" env INTEROP_SHARD="$k/$shards" \
        scripts/with-postgres.sh --pg "$INTEROP_MAJOR" scripts/interop.sh "$version" &
      LANES+=($!)
    done
  done
  for pid in "${LANES[@]}"; do wait "$pid" || true; done
  LANES=()
fi

# The logs of the phases that failed, in full.
status=0
for f in "$LOGS"/*.phase; do
  read -r name secs rc <"$f"
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "===== $name failed (exit $rc); its log ($LOGS/$name.log) follows ====="
    cat "$LOGS/$name.log"
    echo "===== end of $name ====="
  fi
done
# A phase that never ran (the build failed) fails the run too.
[[ $(cut -d' ' -f3 "$LOGS/build.phase") -eq 0 ]] || status=1

# cargo test prints "test result: ok. N passed; M failed; …", node's TAP reporter "# pass N" and "# fail N",
# scripts/test-alerts.sh "alerts: N passed, M failed".
count() { # count FILES...: "rust_passed rust_failed interop_passed interop_failed"
  awk '
    /^test result:/ { rp += $4; rf += $6 }
    /^# pass /      { ip += $3 }
    /^# fail /      { if_ += $3 }
    END { print rp+0, rf+0, ip+0, if_+0 }' "$@" /dev/null
}
logs_of() { for n in "$@"; do [[ -f $LOGS/$n.log ]] && echo "$LOGS/$n.log"; done; true; }

echo
echo "phase              seconds  result"
total_secs=0
for f in "$LOGS"/*.phase; do
  read -r name secs rc <"$f"
  printf '%-18s %7s  %s\n' "$name" "$secs" "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")"
done
printf '%-18s %7s\n' total "$(( $(date +%s) - STARTED ))"
echo

total_passed=0 total_failed=0
# shellcheck disable=SC2046 # one log path a line, no spaces
read -r rp rf _ _ < <(count $(logs_of rust-unit rust-it))
echo "without PostgreSQL: rust $rp passed, $rf failed"
total_passed=$((total_passed + rp)) total_failed=$((total_failed + rf))
for major in "${majors[@]}"; do
  # shellcheck disable=SC2046
  read -r rp rf _ _ < <(count $(logs_of "rust-pg-$major"))
  echo "PostgreSQL $major: rust $rp passed, $rf failed"
  total_passed=$((total_passed + rp)) total_failed=$((total_failed + rf))
done
# Which scenarios ran where, as scripts/interop.sh names them ("interop 1.9: shard 1/2: scenarios 1-8; …").
for version in "${ZERO_VERSIONS[@]}"; do
  shards=$(node tests/interop/lib/versions.mjs --shards "$version")
  for k in $(seq 1 "$shards"); do
    name=$(zero_phase "$version" "$k" "$shards")
    # shellcheck disable=SC2046
    read -r _ _ zp zf < <(count $(logs_of "$name"))
    scenarios=$(sed -nE 's/^interop [^:]+: shard [0-9]+\/[0-9]+: scenarios ([^;]*);.*/\1/p' \
      "$LOGS/$name.log" 2>/dev/null | head -n 1)
    echo "Zero $version on PostgreSQL $INTEROP_MAJOR, shard $k/$shards [scenarios ${scenarios:-?}]: $zp passed, $zf failed"
    [[ -f $LOGS/$name.phase ]] || zf=1
    total_passed=$((total_passed + zp)) total_failed=$((total_failed + zf))
  done
done
# scripts/test-alerts.sh closes with "alerts: N passed, M failed"; without that line it failed before testing.
read -r ap af < <(awk '/^alerts: [0-9]+ passed, [0-9]+ failed$/ { p = $2; f = $4 } END { print p+0, f+0 }' \
  "$LOGS/alerts.log" 2>/dev/null || echo 0 1)
grep -qE '^alerts: [0-9]+ passed, [0-9]+ failed$' "$LOGS/alerts.log" 2>/dev/null || af=1
echo "alerting rules: $ap passed, $af failed"
total_passed=$((total_passed + ap)) total_failed=$((total_failed + af))
echo "ran on PostgreSQL ${majors[*]} (the interop suites on $INTEROP_MAJOR; \`make interop\` runs them on each)"
echo "total: $total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]] || status=1
# What failed, named in the last lines too (a page that shows only the end of the output still shows it): each failed
# phase's failed tests (cargo's "test NAME ... FAILED", TAP's "not ok N - NAME"), or, when it names none (it failed
# before or between its tests), its log's last lines.
for f in "$LOGS"/*.phase; do
  read -r name secs rc <"$f"
  [[ $rc -ne 0 ]] || continue
  failed=$(sed -nE 's/^test (.*) \.\.\. FAILED$/\1/p; s/^[[:space:]]*not ok [0-9]+ - (.*)$/\1/p' "$LOGS/$name.log" | head -n 10)
  if [[ -n $failed ]]; then
    echo "$name failed (exit $rc):"
  else
    echo "$name failed (exit $rc) naming no test; its log ends:"
    failed=$(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -n 5)
  fi
  echo "$failed" | sed 's/^/  /'
done
if [[ $(host_state) != "$HOST_STATE_BEFORE" ]]; then
  echo "$HOST_STATE changed during the run: a test wrote it (every sidecar a test starts must name its own cleanup.state_file), or a sidecar installed here did"
  status=1
fi
exit "$status"
