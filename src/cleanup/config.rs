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
        /// false: decide and report, never delete (a dry run).
        enabled: bool = key(true),
        /// Lowest cleanup delay: how long a backup must have existed before the change-log rows it covers may be
        /// purged. Never below 30s; raised by the longest observed restore (reservation ended by its subscription). The
        /// sidecar must also have been up this long.
        initial_delay: Duration = key("30s", keys::duration),
        /// "pin": an open reservation protects the backup that was newest when it opened, and cleanup continues below
        /// it. "pause": any open reservation pauses all cleanup (Zero 0.20's rule; overlapping restores can starve
        /// cleanup).
        reservations: ReservationMode = key(ReservationMode::Pin),
        /// A subscriber that disconnected still holds cleanup back at its last acknowledged watermark for this long
        /// (Zero's clients reconnect within 10s).
        reconnect_grace: Duration = key("30s", keys::duration),
        /// While no subscriber is relayed:
        /// "hold" (Zero 0.20, whose replication-manager's backup replicator subscribes through the sidecar): nothing
        ///   shows that the replication-manager is past the backup, so cleanup waits for a subscriber.
        /// "after_grace" (Zero 0.22 and later, whose backup replicator connects to the change-streamer directly): the
        ///   backup itself proves it; cleanup proceeds once reconnect_grace has passed since the last subscriber left
        ///   (and since the sidecar started). Connected subscribers always bound the purge at their acks.
        without_subscribers: WithoutSubscribers = key(WithoutSubscribers::Hold),
        /// Rows deleted per statement, so that no statement holds locks or writes WAL without bound; each batch is its
        /// own transaction.
        batch_rows: i64 = key(10_000i64, |n: i64| {
            if (1..=1_000_000).contains(&n) {
                Ok(n)
            } else {
                Err(format!("{n} is outside 1..=1000000"))
            }
        }),
        /// A state file of an earlier release, imported into the change DB at the first start and renamed `*.imported`.
        /// What a restart must not forget (open reservations, subscribers' acks, the learned cleanup delay, the last
        /// purge, litestream's highest watermark, the replica version) now lives in the sidecar's own schema in the
        /// change DB (`"<app_id>_<shard_num>/sidecar"`), where every sidecar of the shard writes its slots and every
        /// purge reads them ([docs/operations.md, "What survives a restart"](operations.md#what-survives-a-restart)).
        /// "" means systemd's StateDirectory= ($STATE_DIRECTORY/state.json) when set, else
        /// /var/lib/litestream-sidecar/state.json; "none": nothing to import. A file that cannot be read is left as it
        /// is.
        state_file: Option<PathBuf> = key("", |text: String| {
            Ok(match text.trim() {
                "" => Some(default_state_file(std::env::var("STATE_DIRECTORY").ok().as_deref())),
                "none" => None,
                path => Some(path.into()),
            })
        }),
        /// How long a restore may take: a reservation's slot, whose socket may be long closed, is honoured until its
        /// task subscribes through any sidecar of the shard, or until this long after it opened. "auto": an hour per
        /// 50 GiB of the database litestream backs up (its litestream_db_size), at least an hour, as Zero allows a
        /// restore; while no size is known a reservation does not expire. Or a duration.
        restore_limit: RestoreLimit = key("auto", RestoreLimit::parse),
        /// How long the first start of a shard (no memory in the change DB and no state file to import) holds cleanup:
        /// a restore begun before it may be in flight unseen. "auto" is restore_limit's automatic value (no end while
        /// the size is unknown); shorten it ("0s") only when you know no view-syncer is restoring, such as for a
        /// brand-new deployment.
        hold_without_state: RestoreLimit = key("auto", RestoreLimit::parse),
        /// What proves a backup before rows are purged below it and before a snapshot status sends a view-syncer to it.
        /// "listing": litestream's claim, covered by the destination's names (backup.verify). "restore": a restore
        /// drill restored and checked it: purges stay below the watermark the latest drill proved, statuses wait for a
        /// drill, and no watermark gauge is needed (a stock litestream 0.3 works; with litestream.proxy_mode = "clamp"
        /// Zero sees the change log's oldest watermark). Cleanup then lags by up to backup.drill_interval plus two
        /// drills' time.
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
