//! litestream-sidecar: runs beside litestream on Zero's replication-manager host, serves Zero's snapshot
//! reservations, relays its change subscriptions, and decides when the change log may be purged.
//!
//! The subsystems, from the bottom up (each folder's module docs list its files):
//! - [`shared`]: state one loop writes and others read, and the rhythm of the periodic loops.
//! - [`protocol`]: Zero's change-streamer wire protocol without I/O.
//! - [`net`]: the network edge: addresses, the allow list, admission, TLS, HTTP answers, the WebSocket kit.
//! - [`litestream`]: litestream's metrics page and the backup destination it writes.
//! - [`cleanup`]: when the change log may be purged: the policy, what holds it back, the loop, the change DB.
//! - [`ops`]: what operators read: metrics, `/status` and its table, systemd notifications.
//! - [`streamer`]: the change-streamer endpoints Zero's view-syncers use: `/snapshot` and the `/changes` relay.
//! - [`proxy`]: litestream's metrics page for Zero, without the watermark gauge or with it clamped.
//! - [`server`]: the listeners' routes and readiness.
//! - [`keys`]: how a component reads its section of the config, every problem collected.
//! - [`config`]: `sidecar.toml` and environment overrides, merged and read by each component.
//! - [`app`]: the running sidecar, built from the config.

// Denied rather than forbidden so that `net::sockopt` alone can allow it.
#![deny(unsafe_code)]
// The library is the daemon's inside, read with `cargo doc --document-private-items`: its module docs name the
// private files and items that do the work.
#![allow(rustdoc::private_intra_doc_links)]

pub mod app;
pub mod cleanup;
pub mod config;
pub mod keys;
pub mod litestream;
pub mod net;
pub mod ops;
pub mod protocol;
pub mod proxy;
pub mod server;
pub mod shared;
pub mod streamer;

pub use app::{App, Error};
pub use config::Config;
