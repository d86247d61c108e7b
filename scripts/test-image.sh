#!/usr/bin/env bash
# The container test (`make test-image`): builds the image (scripts/image.sh), prints its size, runs the sidecar's
# process tests against it under podman (tests/it/faults/pg/sidecar.rs with SIDECAR_IMAGE: readiness and the
# health check, a reservation, relayed subscriptions, purges, SIGTERM closing with 1001, kills and restarts that
# find their slots in the change DB, a takeover while the purger is frozen) on a throwaway PostgreSQL, then prints
# the idle container's resident memory.
# Every container and image it made is removed at the end, also on failure.
#
#   scripts/test-image.sh [PG major, default 15]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARGO=${CARGO:-cargo}
PG=${1:-15}
export IMAGE=localhost/litestream-sidecar:test-$$
started=$SECONDS

cleanup() {
  local names
  names=$(podman ps --all --format '{{.Names}}' 2>/dev/null | grep -E '^litestream-sidecar-(test|idle)-' || true)
  [[ -z $names ]] || podman rm --force --time 0 $names >/dev/null 2>&1 || true
  podman rmi --force "$IMAGE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

scripts/image.sh >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")

echo "test-image: the process tests in the container" >&2
scripts/with-postgres.sh --pg "$PG" env SIDECAR_IMAGE="$IMAGE" \
  $CARGO test --locked --test it -- --test-threads 2 faults::pg::sidecar::

# Idle: the image's own sidecar.toml, nothing to talk to, after its first checks.
name=litestream-sidecar-idle-$$
podman run --detach --rm --name "$name" --runtime runc --network host --read-only --health-interval disable \
  --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  --env LITESTREAM_SIDECAR__SERVER__LISTEN=127.0.0.1:0 \
  --env LITESTREAM_SIDECAR__LITESTREAM__PROXY_LISTEN=127.0.0.1:0 \
  --env LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL=file:///var/lib/litestream-sidecar/backup \
  --env LITESTREAM_SIDECAR__CHANGE_DB__URL=postgres://nobody@127.0.0.1:9/none \
  "$IMAGE" >/dev/null 2>&1
sleep 5
pid=$(podman inspect --format '{{.State.Pid}}' "$name")
rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")

echo
echo "test-image: passed in $((SECONDS - started)) s"
echo "  image $IMAGE: $((size / 1000 / 1000)) MB ($size bytes)"
echo "  idle container's resident memory: $((rss / 1024)) MiB ($rss KiB)"
