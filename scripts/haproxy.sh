#!/usr/bin/env bash
# Prints the path of the haproxy binary the interop suite puts in front of a pair of sidecars (as a Kubernetes
# Service would be): the machine's, else Debian's haproxy package, installed with apt. The package's service is
# left stopped and disabled where systemd runs: the suite starts haproxy itself, with its own config, and stops it.
set -euo pipefail
if ! command -v haproxy >/dev/null; then
  echo "haproxy.sh: haproxy not found; installing Debian's haproxy package" >&2
  { apt-get install -y -qq haproxy || { apt-get update -qq && apt-get install -y -qq haproxy; }; } >&2
  if [[ -d /run/systemd/system ]]; then
    systemctl disable --now haproxy >&2 || true
  fi
fi
command -v haproxy
