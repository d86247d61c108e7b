//! `[cleanup]`: whether and how the change log is purged, and where what must survive a restart is kept.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::keys;

/// `without_subscribers`: what cleanup does while no subscriber is relayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithoutSubscribers {
    /// Hold (Zero's own rule; docs/protocol.md, "Cleanup that stops for good"): with Zero 0.20 the replication-manager's backup replicator is relayed too, so no
    /// relayed subscriber means nothing shows that the replication-manager is past the backup.
    #[default]
    Hold,
    /// Purge below aged backups once `reconnect_grace` has passed since the last relayed subscriber left (and since
    /// the sidecar started). For Zero 0.22 and later, whose backup replicator connects to the change-streamer
    /// directly: a backed-up watermark then proves the replication-manager's replica passed it.
    AfterGrace,
}

/// `reservations`: how open snapshot reservations constrain cleanup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationMode {
    /// Each reservation pins the newest watermark known backed up when it opened: purges stay at or below every
    /// open reservation's floor, so a restore never loses the rows after the backup it restores.
    #[default]
    Pin,
    /// Zero's own rule: any open reservation pauses all cleanup (docs/protocol.md, "How a reservation ends" and
    /// "Cleanup starved by open reservations").
    Pause,
}

/// Where restore limits are decided: litestream's side, as drills use them too.
pub use crate::litestream::restore_limit::RestoreLimit;

/// `requires`: what proves a backup before the change log is purged below it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Requires {
    /// litestream's claim, covered by the newest generation's unbroken chain in the destination (names only).
    #[default]
    Listing,
    /// A restore drill restored and checked the backup: purges stay below the watermark a drill proved, and
    /// snapshot statuses wait for a drill. Needs no watermark gauge: works with a stock litestream 0.3.
    Restore,
}

keys::section! {
    /// `[cleanup]`
    pub struct CleanupConfig(s, drills: bool) {
        /// Off: the sidecar decides and reports, but never deletes.
        enabled: bool = key(true),
        /// Lower bound of the cleanup delay, raised by long reservations (docs/protocol.md, "Zero 0.20's backup
        /// monitor"); never below 30 s.
        initial_delay: Duration = key("30s", keys::duration),
        reservations: ReservationMode = key(ReservationMode::Pin),
        /// How long a departed subscriber's ack still holds cleanup back: Zero's clients reconnect within 10 s.
        reconnect_grace: Duration = key("30s", keys::duration),
        without_subscribers: WithoutSubscribers = key(WithoutSubscribers::Hold),
        /// Rows per DELETE statement, so no statement holds locks or writes WAL without bound.
        batch_rows: i64 = key(10_000i64, |n: i64| {
            if (1..=1_000_000).contains(&n) {
                Ok(n)
            } else {
                Err(format!("{n} is outside 1..=1000000"))
            }
        }),
        /// Where open reservations, the learned cleanup delay, the last purge and litestream's highest watermark
        /// survive a restart (see [`crate::cleanup::state`]); `None`: the operator chose to keep nothing
        /// (`"none"`). Unset: systemd's state directory, else [`DEFAULT_STATE_DIR`].
        state_file: Option<PathBuf> = key("", |text: String| {
            Ok(match text.trim() {
                "" => Some(default_state_file(std::env::var("STATE_DIRECTORY").ok().as_deref())),
                "none" => None,
                path => Some(path.into()),
            })
        }),
        /// How long a restore may take: a reservation kept across a restart is honoured this long after it opened.
        restore_limit: RestoreLimit = key("auto", RestoreLimit::parse),
        /// How long a start without a state file holds cleanup: a restore begun before it may be in flight.
        hold_without_state: RestoreLimit = key("auto", RestoreLimit::parse),
        requires: Requires = key(Requires::Listing, |requires: Requires| {
            if requires == Requires::Restore && !drills {
                Err("\"restore\" needs scheduled drills: set backup.drill_interval to a duration, not \"off\""
                    .to_string())
            } else {
                Ok(requires)
            }
        }),
    }
}

/// Where the state lives when a config names none: systemd's `StateDirectory=` (passed as `$STATE_DIRECTORY`,
/// possibly several paths separated by `:`), else [`DEFAULT_STATE_DIR`].
pub fn default_state_file(state_directory: Option<&str>) -> PathBuf {
    let dir = state_directory
        .and_then(|dirs| dirs.split(':').next())
        .map(str::trim)
        .filter(|dir| !dir.is_empty())
        .unwrap_or(DEFAULT_STATE_DIR);
    Path::new(dir).join("state.json")
}

/// The state's directory outside systemd: the same path systemd's `StateDirectory=litestream-sidecar` gives.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/litestream-sidecar";
