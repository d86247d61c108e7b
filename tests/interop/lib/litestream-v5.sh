#!/bin/sh
# The ZERO_LITESTREAM_EXECUTABLE_V5 of the Zero 1.10 suite: what view-syncers restore with by default
# (ZERO_LITESTREAM_RESTORE_USING_V5). The gauge exporter (litestream-gauge.mjs: its argv lines and its restore
# delay) over the real litestream 0.5 ($LITESTREAM_V5_BIN, scripts/install-litestream.sh 0.5) instead of 0.3.
[ -n "$LITESTREAM_V5_BIN" ] || { echo "litestream-v5.sh: LITESTREAM_V5_BIN is not set" >&2; exit 1; }
LITESTREAM_BIN=$LITESTREAM_V5_BIN exec "$(dirname "$0")/litestream-gauge.mjs" "$@"
