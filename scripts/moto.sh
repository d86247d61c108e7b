#!/usr/bin/env bash
# Prints the path of a `moto_server` (PyPI `moto[server]`, an S3-compatible server the backup tests run on
# 127.0.0.1), installing it first when there is none: $MOTO_SERVER if set, else one on PATH, else the virtual
# environment target/moto-venv, created and filled with pip when missing. Run by scripts/test.sh, and by the test
# harness itself (tests/it/support/moto.rs) when it finds no moto_server.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${MOTO_SERVER:-} && -x ${MOTO_SERVER} ]]; then
  echo "$MOTO_SERVER"
  exit 0
fi
if found=$(command -v moto_server 2>/dev/null); then
  echo "$found"
  exit 0
fi
venv=target/moto-venv
if [[ ! -x $venv/bin/moto_server ]]; then
  echo "installing moto[server] into $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet 'moto[server]>=5,<6' >&2
fi
echo "$PWD/$venv/bin/moto_server"
