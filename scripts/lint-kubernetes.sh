#!/usr/bin/env bash
# The Kubernetes examples (deploy/kubernetes/*.yaml), part of `make lint`: validated against the Kubernetes schema
# by kubernetes-validate (PyPI, pinned, in a virtualenv under target/), then checked for what the deployment guides
# promise of them (tests/kubernetes/check.py), and that check against copies with each promise broken.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/target/kubernetes-venv"
VERSION=1.37.0
if ! "$VENV/bin/pip" show kubernetes-validate 2>/dev/null | grep -qx "Version: $VERSION"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "kubernetes-validate==$VERSION"
fi
manifests=("$ROOT"/deploy/kubernetes/*.yaml)
"$VENV/bin/kubernetes-validate" --strict --quiet "${manifests[@]}"
"$VENV/bin/python" "$ROOT/tests/kubernetes/check.py" "${manifests[@]}"
if ! out=$("$VENV/bin/python" "$ROOT/tests/kubernetes/check.py" --self-test "${manifests[@]}"); then
  echo "$out" | grep FAIL
  exit 1
fi
echo "kubernetes: ${#manifests[@]} manifests valid, promises kept, every broken promise caught"
