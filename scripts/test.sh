#!/usr/bin/env bash
# `make test`: every Rust test and the interop suites with real Zero 0.20 and 1.9 (scripts/interop.sh,
# scripts/interop-1.9.sh), once per PostgreSQL major, and the alerting rules' unit tests (scripts/test-alerts.sh)
# once:
#
#   scripts/test.sh              # PostgreSQL 15 and 17 (or the majors in $PG)
#   scripts/test.sh 18           # only PostgreSQL 18
#
# Each major gets its own throwaway cluster (scripts/with-postgres.sh starts and removes it). Every major runs even
# when an earlier one failed; the last lines count the tests of each major, of the alerting rules and of the whole
# run. Examples and benchmarks are compiled too, so a change cannot break `make bench` unnoticed.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
export CARGO

majors=("$@")
if [[ ${#majors[@]} -eq 0 ]]; then
  read -r -a majors <<<"${PG:-15 17}"
fi

$CARGO build --locked --all-targets
# The backup tests list an S3-compatible server (moto) on loopback.
MOTO_SERVER=$(scripts/moto.sh)
export MOTO_SERVER

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0

# The alerting rules need no database: once, not per major.
echo "=== alerting rules ===" >&2
scripts/test-alerts.sh 2>&1 | tee "$logs/alerts.log" || status=1

# The Zero 0.20 interop suite runs on the first major only: the change DB's SQL is the same for both Zero
# generations, Zero 1.9's suite covers it on every major, and `make test` must stay well inside 30 minutes on two
# cores. `scripts/with-postgres.sh --pg 17 scripts/interop.sh` runs it on another.
first=${majors[0]}
for major in "${majors[@]}"; do
  echo "=== PostgreSQL $major ===" >&2
  log=$logs/$major.log
  # shellcheck disable=SC2016 # expanded by the inner shell
  INTEROP_020=$([[ $major == "$first" ]] && echo 1 || echo 0) \
    scripts/with-postgres.sh --pg "$major" bash -c '
    status=0
    $CARGO test --locked --lib --bins --tests || status=$?
    if [[ $INTEROP_020 == 1 ]]; then scripts/interop.sh || status=$?; fi
    scripts/interop-1.9.sh || status=$?
    exit $status' 2>&1 | tee "$log" || status=1
done

# One line a major, then one for the whole run. cargo test prints "test result: ok. N passed; M failed; …",
# node's TAP reporter "# pass N" and "# fail N".
total_passed=0 total_failed=0
for major in "${majors[@]}"; do
  read -r rp rf ip if_ < <(awk '
    /^test result:/ { rp += $4; rf += $6 }
    /^# pass /      { ip += $3 }
    /^# fail /      { if_ += $3 }
    END { print rp+0, rf+0, ip+0, if_+0 }' "$logs/$major.log")
  echo "PostgreSQL $major: rust $rp passed, $rf failed; interop $ip passed, ${if_} failed"
  total_passed=$((total_passed + rp + ip))
  total_failed=$((total_failed + rf + if_))
done
# scripts/test-alerts.sh closes with "alerts: N passed, M failed"; without that line it failed before testing.
read -r ap af < <(awk '/^alerts: [0-9]+ passed, [0-9]+ failed$/ { p = $2; f = $4 } END { print p+0, f+0 }' \
  "$logs/alerts.log")
if ! grep -qE '^alerts: [0-9]+ passed, [0-9]+ failed$' "$logs/alerts.log"; then af=1; fi
echo "alerting rules: $ap passed, $af failed"
total_passed=$((total_passed + ap))
total_failed=$((total_failed + af))
echo "ran on PostgreSQL ${majors[*]}"
echo "total: $total_passed passed, $total_failed failed"
exit "$status"
