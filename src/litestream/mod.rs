//! Litestream, as the sidecar reads it:
//! - [`page`]: its metrics page: the `litestream_replica_progress` gauge of the rocicorp fork (PROTOCOL.md §7) and
//!   the samples the monitor reads, fetched through the crate's HTTP client.
//! - [`filter`]: that page as the metrics proxy hands it to Zero's own BackupMonitor, without the progress family
//!   or with it clamped (§11.6).
//! - [`destination`]: the backup destination it writes, listed to prove a backup is restorable.
//!
//! Not owned here: how often to scrape, what to do with the progress (the cleanup loop), serving the proxy.

pub mod destination;
pub mod filter;
pub mod page;

pub use crate::config::Filter;
