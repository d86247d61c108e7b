# litestream-sidecar. `make run` starts the sidecar with ./sidecar.toml; `make test` installs and starts what the
# tests need (a throwaway PostgreSQL cluster) and runs every test.

CARGO ?= cargo
CONFIG ?= ./sidecar.toml

.PHONY: all build run test lint bench clean

all: build

build:
	$(CARGO) build --release --locked

run: build
	./target/release/litestream-sidecar --config $(CONFIG)

test:
	scripts/with-postgres.sh scripts/test.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

bench:
	scripts/with-postgres.sh $(CARGO) run --locked --release --example bench

clean:
	$(CARGO) clean
