#!/usr/bin/env bash
# Prints the path of an nginx binary for `make bench`'s relay comparison: the machine's, else Debian's nginx
# package downloaded and unpacked under target/tools rather than installed (installing it would enable and start a
# web server on port 80, which a bench must not leave behind). The bench writes its own config and runs it in a
# temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nginx >/dev/null; then
  command -v nginx
  exit 0
fi
TOOLS=$PWD/target/tools/nginx
if [[ ! -x $TOOLS/usr/sbin/nginx ]]; then
  echo "nginx.sh: nginx not found; unpacking Debian's nginx package into $TOOLS" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && { apt-get download nginx >/dev/null 2>&1 \
    || { apt-get update -qq >&2 && apt-get download nginx >/dev/null; }; })
  mkdir -p "$TOOLS"
  dpkg-deb -x "$work"/nginx_*.deb "$TOOLS"
fi
echo "$TOOLS/usr/sbin/nginx"
