//! The sidecar's integration tests: one binary, one module per scenario, one harness ([`support`]).
//!
//! Every test that needs PostgreSQL (`SIDECAR_TEST_DATABASE_URL`, or a cluster of its own) lives in a module
//! named `pg`, so that
//!
//! - `cargo test --test it -- --skip pg::` runs everything that needs no database, once;
//! - `scripts/with-postgres.sh --pg 15 cargo test --test it -- pg::` runs the rest, once per PostgreSQL major.
//!
//! No other module may be named so that its path ends in `pg`. The fuzz targets ([`fuzz`]) and the cleanup model
//! ([`model`]) run here with few cases; `make fuzz` runs them with many (`FUZZ_CASES`, `MODEL_CASES`). The map of
//! what is tested where is docs/testing.md.

mod support;

/// The backup destination check (directories, S3 on moto, an endpoint that never answers) and, end to end, no
/// purge and no snapshot status on a claim with nothing behind it.
mod backup;
/// The change DB against a real PostgreSQL: rows left by every purge, ownership, the address compare-and-set.
mod change_db;
/// Cleanup end to end: litestream's page, the policy, and the rows left in a real change log.
mod cleanup;
/// The binary as operators run it: flags, config files, logs, signals, systemd.
mod cli;
/// docs/configuration.md against the reference `sidecar.toml`.
mod docs;
/// Restore drills and the destination's layout with the real litestream: what drills prove, and faults of the
/// backup (objects deleted or corrupted, litestream killed, the destination unreachable, a small disk, LTX).
mod drills;
/// Faults injected into a running sidecar: PostgreSQL, upstream, litestream, the sidecar itself, clients.
mod faults;
/// Fuzz targets: every parser of outside input, on random and mutated input.
mod fuzz;
/// Connection limits: the allow list, request heads, `max_connections`.
mod limits;
/// `GET /metrics` and the metrics the alerting rules use.
mod metrics;
/// The registry, the subscriber tracker and the cleanup policy together, over random interleavings.
mod model;
/// The protocol versions the upstream serves: learned from its refusals or configured, and enforced before any
/// status or dial.
mod protocols;
/// The litestream metrics proxy: the progress family filtered or clamped, failures as 502.
mod proxy;
/// Registration in the address table, readiness, ownership-aware cleanup, the v4+ snapshot status.
mod registration;
/// The change-stream relay between view-syncers and Zero's change-streamer.
mod relay;
/// Snapshot reservations: the status frame, their lifetime, bad requests, pings, shutdown.
mod reservations;
/// No secret in any log line, page, `--check-config` output or config error.
mod secrets;
/// Slots in the change DB: several sidecars' reservations and subscribers bound every purge batch.
mod slots;
/// `GET /status`: what holds cleanup, subscribers and their lag, with the change DB alive or dead.
mod status;
/// TLS on both hops: wss for clients, TLS to the upstream, certificate reloads on SIGHUP.
mod tls;
/// Deployments the sidecar refuses (Zero 1.10's v5 backups, a change log Zero does not write): reported, cleanup
/// and v4+ statuses held, cleared when the cause goes.
mod unservable;
