# litestream-sidecar container image: build with the Rust toolchain, run on a slim Debian as an unprivileged user.
# Where no base image can be pulled, `make image` (scripts/image.sh) builds the same image from Debian's packages.
#
#   docker build -t litestream-sidecar .
#   docker run --rm --read-only -v $PWD/sidecar.toml:/etc/litestream-sidecar/sidecar.toml:ro \
#     litestream-sidecar
#
# Every config key can also come from the environment (LITESTREAM_SIDECAR__SECTION__KEY), which is how the
# Kubernetes example in deploy/kubernetes/ passes the pod's own address and the change DB password.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin litestream-sidecar \
 && strip target/release/litestream-sidecar

FROM debian:bookworm-slim
# CA certificates for TLS to the change DB (sslmode=require).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/litestream-sidecar /usr/local/bin/litestream-sidecar
COPY sidecar.toml /etc/litestream-sidecar/sidecar.toml
# No volume: what a restart must not forget is kept in the change DB. A state file of an earlier release, mounted
# here, is imported once and renamed.
RUN mkdir -p /var/lib/litestream-sidecar && chown 65532:65532 /var/lib/litestream-sidecar
USER 65532:65532
# 4851: view-syncers (snapshot, changes); 4850: the metrics proxy Zero's BackupMonitor reads.
EXPOSE 4851 4850
# The config is /etc/litestream-sidecar/sidecar.toml, or where LITESTREAM_SIDECAR_CONFIG says: not an argument, so
# that the health check (GET /keepalive at server.listen) reads the same file as the daemon.
ENTRYPOINT ["/usr/local/bin/litestream-sidecar"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s CMD ["/usr/local/bin/litestream-sidecar", "ready"]
