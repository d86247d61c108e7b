# litestream-sidecar. `make run` starts the sidecar with ./sidecar.toml; `make test` installs and starts what the
# tests need (a throwaway PostgreSQL cluster, the interop suite's npm packages) and runs every test.

CARGO ?= cargo
CONFIG ?= ./sidecar.toml

.PHONY: all build run test interop lint bench clean

all: build

build:
	$(CARGO) build --release --locked

run: build
	./target/release/litestream-sidecar --config $(CONFIG)

# The cargo tests, then the end-to-end interop suite against real Zero processes (tests/interop), on one
# throwaway PostgreSQL cluster.
test:
	scripts/with-postgres.sh sh -c 'scripts/test.sh && CARGO="$(CARGO)" scripts/interop.sh'

# Only the interop suite (npm ci, the sidecar build, Zero, the litestream stand-in).
interop:
	scripts/with-postgres.sh env CARGO="$(CARGO)" scripts/interop.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

bench:
	scripts/with-postgres.sh $(CARGO) run --locked --release --example bench

clean:
	$(CARGO) clean
