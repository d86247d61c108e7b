#!/usr/bin/env bash
# The alerting rules in deploy/prometheus: `promtool check rules` on the rules file, then `promtool test rules` on
# its unit tests. promtool comes from the machine when it has one, else from Debian's `prometheus` package, which
# is downloaded and unpacked under target/tools rather than installed: installing it would also enable and start a
# Prometheus server, which a test run must not leave behind.
#
# The last line counts the checks: the rules check is one, and every `eval_time` of the unit tests is one
# (promtool names each failing one in its output: "alertname: …, time: …" or "expr: …, time: …").
set -euo pipefail
cd "$(dirname "$0")/.."

RULES=deploy/prometheus/litestream-sidecar.rules.yml
TESTS=deploy/prometheus/litestream-sidecar.rules.test.yml

TOOLS=$PWD/target/tools/prometheus
if ! command -v promtool >/dev/null; then
  if [[ ! -x $TOOLS/usr/bin/promtool ]]; then
    echo "test-alerts: promtool not found; unpacking Debian's prometheus package into $TOOLS" >&2
    work=$(mktemp -d)
    (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
      || { apt-get update -qq >&2 && apt-get download prometheus >/dev/null; }; })
    mkdir -p "$TOOLS"
    dpkg-deb -x "$work"/prometheus_*.deb "$TOOLS"
    rm -rf "$work"
  fi
  export PATH=$TOOLS/usr/bin:$PATH
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
