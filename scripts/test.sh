#!/usr/bin/env bash
# `make test`: every Rust test against a throwaway PostgreSQL (scripts/with-postgres.sh starts and removes it).
# Examples and benchmarks are compiled too, so a change cannot break `make bench` unnoticed.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --all-targets
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --lib --bins --tests 2>&1 | tee "$log" || status=$?
# One closing line for all test binaries.
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "rust: %d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
