//! Litestream, as the sidecar reads it:
//! - [`page`]: its metrics page: the `litestream_replica_progress` gauge of the rocicorp fork (docs/protocol.md, "litestream's progress gauge") and
//!   the samples the monitor reads, fetched through the crate's HTTP client.
//! - [`filter`]: that page as the metrics proxy hands it to Zero's own BackupMonitor, without the progress family
//!   or with it clamped (docs/protocol.md, "Two purgers").
//! - [`destination`]: the backup destination it writes, listed to prove a backup is restorable, and [`layout`]:
//!   what the listed names say of a restore.
//! - [`drill`]: restoring the newest backup and checking the result, the proof the names cannot give.
//!
//! Not owned here: how often to scrape, what to do with the progress (the cleanup loop), serving the proxy.

pub mod config;
pub mod destination;
pub mod drill;
pub mod filter;
pub mod layout;
pub mod page;
pub mod restore_limit;

pub use crate::litestream::config::Filter;
