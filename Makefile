# litestream-sidecar. `make run` starts the sidecar with ./sidecar.toml; `make test` installs and starts what the
# tests need (a throwaway PostgreSQL cluster, the interop suite's npm packages) and runs every test; `make demo` shows
# it at work beside real Zero processes until Ctrl-C.

CARGO ?= cargo
CONFIG ?= ./sidecar.toml
# PostgreSQL majors `make test` runs the whole suite against, each on its own throwaway cluster: `make test PG=18`.
PG ?= 15 17

.PHONY: all build run demo test interop lint bench fuzz clean image test-image

all: build

build:
	$(CARGO) build --release --locked

run: build
	./target/release/litestream-sidecar --config $(CONFIG)

# Every test (scripts/test.sh): the alerting rules' unit tests and the Rust tests that need no database once; the
# Rust tests that need PostgreSQL on every major in $(PG); the interop suites against real Zero 0.20, 1.9 and 1.10
# (tests/interop) whole on the first major, each split into shards by its measured time. Each on a throwaway
# cluster, side by side. Ends with each phase's time and the test counts; the phases' logs are
# in target/test-logs.
test:
	CARGO="$(CARGO)" scripts/test.sh $(PG)

# The sidecar at work beside real Zero 1.9 processes on a throwaway PostgreSQL (the first major in $(PG)), with
# `litestream-sidecar status` every 3 s, until Ctrl-C. DEMO_SECONDS=150 ends it by itself: exit 0 only if it purged and a restore drill proved the backup.
demo:
	scripts/with-postgres.sh --pg $(firstword $(PG)) env CARGO="$(CARGO)" scripts/demo.sh

# Only the interop suites (tests/interop, scripts/interop.sh) with real Zero processes of each version in $(ZERO)
# (npm ci, the sidecar build, Zero, the real litestream, moto), the full matrix: each whole, on every major in $(PG),
# one after another: `make interop ZERO=1.9 PG=17`. By default every version tests/interop/lib/versions.mjs can
# install (0.20, 1.9 and 1.10).
ZERO ?= $(shell node tests/interop/lib/versions.mjs --list-interop)
interop:
	@status=0; for pg in $(PG); do for v in $(ZERO); do \
	  echo "== Zero $$v on PostgreSQL $$pg"; \
	  scripts/with-postgres.sh --pg $$pg env CARGO="$(CARGO)" scripts/interop.sh $$v || status=1; \
	done; done; exit $$status


# The container image, localhost/litestream-sidecar:latest (scripts/image.sh): a base unpacked from Debian's
# packages with mmdebstrap and the release binary, imported with podman (which it installs when missing). The
# Dockerfile builds the same image where a base image can be pulled.
image:
	CARGO="$(CARGO)" scripts/image.sh

# The container test (scripts/test-image.sh): the image built, the process tests run against it under podman on
# a throwaway PostgreSQL (the first major in $(PG)), its size and idle memory printed, everything it made removed.
test-image:
	CARGO="$(CARGO)" scripts/test-image.sh $(firstword $(PG))

# Also every config key's meaning in sidecar.toml and docs/configuration.md against its doc comment (the
# config_reference example; `cargo run --example config_reference -- --write` rewrites both), and the Kubernetes
# examples: the schema and what the guides promise of them (scripts/lint-kubernetes.sh), and the code's docs: every
# link in them resolves (rustdoc, private items included).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps --document-private-items --quiet
	$(CARGO) run --locked --quiet --example config_reference -- --check
	scripts/lint-kubernetes.sh

# The purge benchmark runs on every major in $(PG), side by side; the relay is compared with nginx (Debian's, from
# scripts/nginx.sh) as a WebSocket proxy; `laggard` times a relayed subscriber's acks against a direct one's on the
# same upstream; the restore drill replicates and restores a database of BENCH_DRILL_MIB MiB (1024) with the real
# litestream 0.3.13 (scripts/install-litestream.sh) in TMPDIR; `slots` counts the statements a sidecar sends to the
# change DB at its defaults with 500 reservations and 100 subscribers, and times purge batches with the slot check
# beside ones without; the relay also replays Zero 1.9's recorded stream (examples/bench/zero-1.9-stream.jsonl, alone:
# BENCH=zero-traffic). BENCH names sections to run alone: `make bench BENCH=drill`.
BENCH ?=
bench:
	NGINX="$$(scripts/nginx.sh)" LITESTREAM_BIN="$$(scripts/install-litestream.sh)" \
	  scripts/with-postgres.sh --pg "$(PG)" $(CARGO) run --locked --release --example bench -- $(BENCH)

# Every fuzz target (module `fuzz` of the integration-test binary, tests/it/fuzz/, a file per target: the parsers of outside bytes)
# for FUZZ_CASES cases each, in a release build; each prints its count, time and seed (FUZZ_SEED=... replays one).
# Then the cleanup model (module `model`, tests/it/model.rs) over MODEL_CASES histories. `make test` runs the same
# targets briefly, and the model over 2,000 histories.
FUZZ_CASES ?= 1000000
MODEL_CASES ?= 100000
fuzz:
	FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release --locked --test it -- fuzz:: --nocapture --test-threads=2
	MODEL_CASES=$(MODEL_CASES) $(CARGO) test --release --locked --test it -- model::

clean:
	$(CARGO) clean
