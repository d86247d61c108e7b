#!/usr/bin/env bash
# Builds the container image `localhost/litestream-sidecar:latest` where no base image can be pulled: the root
# filesystem comes from Debian's packages (mmdebstrap, unpacked only: glibc, libgcc and the CA certificates), the
# binary is built here, and podman turns the result into an OCI image. The Dockerfile builds the same image where
# a registry is reachable. Prints the image's name on stdout, its size on stderr.
#
#   scripts/image.sh            # IMAGE=name:tag for another name
#
# Installs podman, runc and mmdebstrap from Debian's packages when missing. The unpacked base is kept in
# target/image/ (delete it to refresh it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-localhost/litestream-sidecar:latest}
CARGO=${CARGO:-cargo}
WORK="$ROOT/target/image"
# The sidecar's user and group in the image, as in the Dockerfile (distroless's "nonroot").
ID=65532

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if ((${#need[@]})); then
  echo "image: installing ${need[*]}" >&2
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" uidmap >&2; }
  apt_install || { apt-get update -qq >&2 && apt_install; }
fi

echo "image: building the release binary" >&2
(cd "$ROOT" && $CARGO build --release --locked --bin litestream-sidecar >&2)

mkdir -p "$WORK"
base="$WORK/base.tar"
if [[ ! -s $base ]]; then
  echo "image: unpacking the base from Debian's packages (mmdebstrap)" >&2
  # `extract` unpacks the packages and runs nothing: no shell, no package manager, no maintainer scripts in the
  # image. The release the build machine runs, so that the binary finds the glibc it was linked against.
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  # (mmdebstrap tells a tarball from a directory by the name's ending.)
  mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1,ca-certificates "$suite" "$WORK/base.part.tar" >&2
  mv "$WORK/base.part.tar" "$base"
fi

rootfs="$WORK/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs"
tar -xf "$base" -C "$rootfs"
# What a static daemon never reads: character-set converters, documentation, the package database.
rm -rf "$rootfs"/usr/lib/x86_64-linux-gnu/gconv "$rootfs"/usr/share/{doc,man,info,lintian,locale} \
  "$rootfs"/var/lib/dpkg "$rootfs"/var/cache/* "$rootfs"/var/log/*
# The bundle rustls-native-certs reads, which ca-certificates' install script would have made.
mkdir -p "$rootfs/etc/ssl/certs"
cat "$rootfs"/usr/share/ca-certificates/mozilla/*.crt >"$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsidecar:x:%s:%s:litestream-sidecar:/var/lib/litestream-sidecar:/usr/sbin/nologin\n' \
  "$ID" "$ID" >"$rootfs/etc/passwd"
printf 'root:x:0:\nsidecar:x:%s:\n' "$ID" >"$rootfs/etc/group"
install -d -m 1777 "$rootfs/tmp"
install -d -o "$ID" -g "$ID" -m 0750 "$rootfs/var/lib/litestream-sidecar"
install -D -m 0755 "$ROOT/target/release/litestream-sidecar" "$rootfs/usr/local/bin/litestream-sidecar"
strip "$rootfs/usr/local/bin/litestream-sidecar"
install -D -m 0644 "$ROOT/sidecar.toml" "$rootfs/etc/litestream-sidecar/sidecar.toml"

echo "image: importing into podman as $IMAGE" >&2
layer="$WORK/rootfs.tar"
tar --numeric-owner -C "$rootfs" -cf "$layer" .
# The same configuration as the Dockerfile's final stage; the health check is added by a build step below,
# since `podman import` takes no HEALTHCHECK. No CMD: the daemon and the health check find the config the same
# way, at /etc/litestream-sidecar/sidecar.toml or where LITESTREAM_SIDECAR_CONFIG says.
imported=$(podman import --quiet \
  --change "USER $ID:$ID" \
  --change 'EXPOSE 4851' --change 'EXPOSE 4850' \
  --change 'ENTRYPOINT ["/usr/local/bin/litestream-sidecar"]' \
  "$layer" "$IMAGE-base")
rm -f "$layer"
rm -rf "$rootfs"
podman build --quiet --runtime runc --format docker --tag "$IMAGE" -f - "$WORK" >/dev/null <<EOF
FROM $imported
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s CMD ["/usr/local/bin/litestream-sidecar", "ready"]
EOF
podman rmi --force "$IMAGE-base" >/dev/null 2>&1 || true
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "image: $IMAGE, $((size / 1000 / 1000)) MB ($size bytes)" >&2
echo "$IMAGE"
