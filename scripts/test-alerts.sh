#!/usr/bin/env bash
# The alerting rules in deploy/prometheus: `promtool check rules` on the rules file, then `promtool test rules` on
# its unit tests. promtool comes from Debian's `prometheus` package, installed first when it is missing, as
# scripts/with-postgres.sh installs PostgreSQL (in a container the package's Prometheus server is not started; on a
# host running systemd, Debian enables and starts it on :9090: `systemctl disable --now prometheus` if unwanted).
#
# The last line counts the checks: the rules check is one, and every `eval_time` of the unit tests is one
# (promtool names each failing one in its output: "alertname: …, time: …" or "expr: …, time: …").
set -euo pipefail
cd "$(dirname "$0")/.."

RULES=deploy/prometheus/litestream-sidecar.rules.yml
TESTS=deploy/prometheus/litestream-sidecar.rules.test.yml

if ! command -v promtool >/dev/null; then
  echo "test-alerts: promtool not found; installing Debian's prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version 2>&1 | head -1 >&2

passed=0 failed=0
if promtool check rules "$RULES"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi

evals=$(grep -cE '^ *- eval_time:' "$TESTS")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
promtool test rules "$TESTS" >"$out" 2>&1 || status=$?
cat "$out"
bad=$(grep -cE '^ +(alertname|expr): .*, time: ' "$out" || true)
if [[ $status -ne 0 && $bad -eq 0 ]]; then
  bad=$evals # promtool failed before evaluating anything (a file it could not load): count none as passed
fi
passed=$((passed + evals - bad))
failed=$((failed + bad))

echo "alerts: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
