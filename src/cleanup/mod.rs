//! Change-log cleanup policy: decides whether, and below which watermark, rows of Zero's `changeLog` may be purged now.
//!
//! Pure: [`decide`] reads plain data and returns a [`Decision`]; it reads no clock, does no I/O and logs nothing. The
//! monitor loop gathers the inputs (registration, litestream scrape, reservation registry, relay acks), calls it once
//! per interval, logs the [`HoldReason`] or the [`Bound`] of the purge, and runs it. Every rule lives here, the
//! registration checks included; not owned here: growing the cleanup delay (the reservation registry), and keeping
//! the purge at or below the newest `changeLog` watermark (the purge itself: docs/protocol.md, "Purging the newest
//! transaction").
//!
//! Zero 0.20 pauses all cleanup while any reservation is open, purges past a restore in progress through the
//! purge-on-subscribe signal, stalls for good after one check without subscribers, and can stream a gap to a
//! subscriber still at the replica version (docs/protocol.md: "Cleanup starved by open reservations", "The
//! purge-on-subscribe signal", "Cleanup that stops for good", "A gap at the replica version"). Here every rule is
//! re-evaluated from scratch on each call, reservations pin a floor instead of pausing (unless configured to pause),
//! and the chosen watermark is the largest one that every rule allows.
//!
//! Watermarks are compared as plain strings (byte-wise), never parsed (docs/protocol.md, "Watermarks").
//!
//! The files: this one (the policy), `tests` (its table), and
//! - [`monitor`]: the loop that gathers the inputs, decides, purges and records.
//! - [`status`]: what the loop last saw and did, for every reader on another task.
//! - [`reservations`]: the registry of snapshot reservations.
//! - [`subscribers`]: the relay's subscribers and their acknowledged watermarks.
//! - [`discovery`]: whether the replication manager is registered and the change DB answers.
//! - [`handles`]: those handles bundled for every component that reads them, and the hooks tests set.
//! - [`state`] and [`keeper`]: the state file that carries the policy's memory across restarts, and its writer.
//! - [`change_db`]: the change DB: reads, the purge, the purger lock, TLS toward PostgreSQL.
//! - [`unservable`]: deployments the sidecar refuses to serve (Zero 1.10's v5 backups, a change log Zero does not
//!   write), for which cleanup holds first of all.

pub mod change_db;
pub mod config;
pub mod discovery;
pub mod drills;
pub mod handles;
pub mod keeper;
pub mod monitor;
pub mod reservations;
pub mod slots;
pub mod state;
pub mod status;
pub mod subscribers;
#[cfg(test)]
mod tests;
pub mod unservable;

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

pub use self::config::{ReservationMode, WithoutSubscribers};

/// A watermark litestream reported as backed up, with the time it reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    pub watermark: String,
    /// Wall-clock time of the backup as litestream reports it (epoch seconds on the metrics page).
    pub backed_up_at: SystemTime,
}

/// Backed-up watermarks not yet purged, and the last purge: the policy's memory between checks. First sighting wins
/// (a watermark keeps the backup time it was first reported with, as in Zero's BackupMonitor), and nothing at or
/// below the last purge is tracked again.
///
/// It also follows the gauge itself: the highest watermark it ever reported and the one it reports now. After a
/// litestream restart (from an older generation, say) the gauge can report less than it did: a restore started now
/// gets that older backup, so nothing above it is proof of a backup any more (see [`Backlog::observe`]).
#[derive(Debug, Default)]
pub struct Backlog {
    backups: Vec<Backup>,
    last_purge: Option<LastPurge>,
    highest: Option<String>,
    current: Option<Backup>,
}

/// The last complete purge: rows below `before` are gone. The one live form, kept in the [`Backlog`] the policy
/// reads and published from there; the change DB stores `before` and `backed_up_at`, `/status` adds ages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastPurge {
    pub before: String,
    /// When the backup at `before` was taken, when it was tracked: the shard's memory keeps it beside `before`.
    pub backed_up_at: Option<SystemTime>,
    /// This run's purge; `None` for one remembered from an earlier run (or another sidecar).
    pub run: Option<PurgeRun>,
}

impl LastPurge {
    /// A purge known only by where it went.
    pub fn remembered(before: &str) -> Self {
        Self {
            before: before.to_owned(),
            backed_up_at: None,
            run: None,
        }
    }
}

/// What this run's purge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeRun {
    /// What set `before`, as the logs say it.
    pub bound: String,
    pub rows: u64,
    pub completed_at: SystemTime,
}

/// What one readable page did to the gauge, for the monitor to act on and log once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GaugeMove {
    /// Nothing to tell: at or above every watermark it reported before, or still below the highest but no lower
    /// than at the last page (said already).
    Steady,
    /// Below the highest watermark it reported: newly, or lower still than at the last page. `dropped` tracked
    /// backups above `current` were forgotten.
    Regressed {
        highest: String,
        current: String,
        dropped: usize,
    },
    /// Back at or above `highest` after having been below it.
    Recovered { highest: String, current: String },
}

/// What [`Backlog::observe`] made of one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BacklogUpdate {
    /// Watermarks tracked for the first time.
    pub added: usize,
    /// `None`: the page had no usable sample, so nothing is known about the gauge now and what was known stays.
    pub gauge: Option<GaugeMove>,
}

/// Whether a gauge at `current` is below what it once reported (byte-wise, like every watermark comparison).
pub fn is_regressed(highest: Option<&str>, current: Option<&str>) -> bool {
    matches!((highest, current), (Some(highest), Some(current)) if current < highest)
}

impl Backlog {
    /// Records watermarks seen for the first time; returns how many were new.
    pub fn record<'a>(&mut self, seen: impl IntoIterator<Item = (&'a str, SystemTime)>) -> usize {
        let mut added = 0;
        for (watermark, backed_up_at) in seen {
            let purged = self.last_purged().is_some_and(|last| watermark <= last);
            if purged || self.backups.iter().any(|b| b.watermark == watermark) {
                continue;
            }
            self.backups.push(Backup {
                watermark: watermark.to_owned(),
                backed_up_at,
            });
            added += 1;
        }
        added
    }

    /// The backlog of a run that follows one which purged below `last_purged` with the gauge once at `highest`
    /// (both from the state file): nothing at or below the last purge is tracked again, and a gauge that comes back
    /// below the old highest is a regression, restart or not.
    pub fn resumed(last_purged: Option<&str>, highest: Option<&str>) -> Self {
        Self {
            last_purge: last_purged.map(LastPurge::remembered),
            highest: highest.map(str::to_owned),
            ..Self::default()
        }
    }

    /// After a successful purge below `before`: forget every backup below it. The one at `before` stays, so the
    /// policy reports "nothing new" rather than "no backup" until a newer backup arrives.
    /// Takes in what an earlier run (or another sidecar) remembered, after this run may have seen pages already:
    /// the higher of each watermark stands, and backups at or below the last purge are no longer tracked.
    pub fn resume(&mut self, last_purge: Option<&LastPurge>, highest: Option<&str>) {
        if let Some(last) = last_purge {
            if self.last_purged().is_none_or(|l| l < last.before.as_str()) {
                self.backups.retain(|b| b.watermark >= last.before);
                self.last_purge = Some(last.clone());
            }
        }
        if let Some(high) = highest {
            if self.highest.as_deref().is_none_or(|h| h < high) {
                self.highest = Some(high.to_owned());
            }
        }
    }

    pub fn purged(&mut self, before: &str) {
        let backed_up_at = self
            .backups
            .iter()
            .find(|b| b.watermark == before)
            .map(|b| b.backed_up_at);
        self.record_purge(LastPurge {
            before: before.to_owned(),
            backed_up_at,
            run: None,
        });
    }

    /// After a successful purge, with what is known of it.
    pub fn record_purge(&mut self, purge: LastPurge) {
        self.backups.retain(|b| b.watermark >= purge.before);
        self.last_purge = Some(purge);
    }

    pub fn backups(&self) -> &[Backup] {
        &self.backups
    }

    pub fn last_purged(&self) -> Option<&str> {
        self.last_purge.as_ref().map(|p| p.before.as_str())
    }

    /// The last complete purge, with what is known of it.
    pub fn last_purge(&self) -> Option<&LastPurge> {
        self.last_purge.as_ref()
    }

    /// Takes the samples of one readable page: the newest of them is where the gauge is now.
    ///
    /// Below the highest watermark ever reported, every tracked backup above the gauge is forgotten: the generation
    /// it was in may be gone, and if the gauge reports it again that is a new upload, whose own time must age
    /// before it counts (a restore that started meanwhile got the older backup). The highest stays where it was
    /// until the gauge reaches it again; [`decide`] holds until then. Returns what changed, and which move, for the
    /// monitor to pass on to the reservation registry and to log.
    pub fn observe(&mut self, seen: &[(&str, SystemTime)]) -> BacklogUpdate {
        let Some(&(now_at, backed_up_at)) = seen.iter().max_by(|a, b| a.0.cmp(b.0)) else {
            return BacklogUpdate {
                added: 0,
                gauge: None,
            };
        };
        let was_below = self.regression().map(|(_, current)| current.to_owned());
        let gauge = match self.highest.as_deref() {
            Some(highest) if now_at < highest => {
                let before = self.backups.len();
                self.backups.retain(|b| b.watermark.as_str() <= now_at);
                let dropped = before - self.backups.len();
                match was_below {
                    Some(previous) if previous.as_str() <= now_at => GaugeMove::Steady,
                    _ => GaugeMove::Regressed {
                        highest: highest.to_owned(),
                        current: now_at.to_owned(),
                        dropped,
                    },
                }
            }
            highest => {
                let recovered = was_below.is_some().then(|| GaugeMove::Recovered {
                    highest: highest.unwrap_or_default().to_owned(),
                    current: now_at.to_owned(),
                });
                self.highest = Some(now_at.to_owned());
                recovered.unwrap_or(GaugeMove::Steady)
            }
        };
        let added = self.record(seen.iter().copied());
        // Tracked, it keeps its first sighting's time; untracked (at or below the last purge), the page's.
        let current = self
            .backups
            .iter()
            .find(|b| b.watermark == now_at)
            .cloned()
            .unwrap_or_else(|| Backup {
                watermark: now_at.to_owned(),
                backed_up_at,
            });
        self.current = Some(current);
        BacklogUpdate {
            added,
            gauge: Some(gauge),
        }
    }

    /// The highest watermark the gauge ever reported.
    pub fn highest(&self) -> Option<&str> {
        self.highest.as_deref()
    }

    /// Where the gauge was at the last page with a usable sample: what a restore started now gets.
    pub fn current(&self) -> Option<&Backup> {
        self.current.as_ref()
    }

    /// `(highest, current)` while the gauge is below the highest watermark it reported.
    pub fn regression(&self) -> Option<(&str, &str)> {
        let current = self.current.as_ref().map(|b| b.watermark.as_str());
        is_regressed(self.highest(), current).then(|| {
            (
                self.highest().unwrap_or_default(),
                current.unwrap_or_default(),
            )
        })
    }

    /// The newest backed-up watermark known (byte-wise maximum): the floor of a reservation opened now.
    pub fn newest(&self) -> Option<&Backup> {
        self.backups
            .iter()
            .max_by(|a, b| a.watermark.cmp(&b.watermark))
    }
}

/// An open snapshot reservation as the cleanup policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldReservation {
    pub task_id: String,
    /// The newest watermark known backed up when the reservation opened; the restore it protects starts at or
    /// after it. `None`: no backup was known then, so it protects every row.
    pub floor: Option<String>,
}

/// `task=floor`, as logs show it.
impl fmt::Display for HeldReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}",
            self.task_id,
            self.floor.as_deref().unwrap_or("none")
        )
    }
}

/// Whether the sidecar may speak for the shard's change log: it purges only for the change-streamer it fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// `discovery.mode = "off"`: not checked.
    Unchecked,
    /// `ownerAddress` does not name the sidecar, or could not be read.
    NotRegistered,
    /// `ownerAddress` has named the sidecar without interruption since this instant.
    RegisteredSince(Instant),
}

/// A `/changes` subscriber seen by the relay, connected now or departed earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    /// Zero's subscriber `id`, for logs.
    pub id: String,
    /// Acknowledged watermark (docs/protocol.md, "A subscriber's acknowledged watermark"): the subscriber resumes at
    /// or after it.
    pub acked: String,
    /// The `replicaVersion` the subscriber asked for.
    pub replica_version: String,
    /// When it disconnected; `None` while connected.
    pub departed: Option<Instant>,
    /// It departed before or with the upstream's loss, and the upstream is not back: its grace runs only from the
    /// upstream's return, so until then it is tracked whatever the grace, `cleanup.reconnect_grace = "0s"` too.
    pub awaits_upstream: bool,
}

impl Subscriber {
    pub fn is_connected(&self) -> bool {
        self.departed.is_none()
    }

    /// Connected, departed less than `grace` ago and so still expected to reconnect from `acked`, or waiting for
    /// the upstream's return before its grace can run.
    pub fn is_tracked(&self, now: Instant, grace: Duration) -> bool {
        match self.departed {
            None => true,
            Some(_) if self.awaits_upstream => true,
            // A departure stamped after `now` counts as just now.
            Some(departed) => now.saturating_duration_since(departed) < grace,
        }
    }
}

/// What the backup destination (`litestream.backup_url`) shows behind litestream's claims, as the monitor last
/// listed it. The gauge alone is no proof: a wedged litestream has advanced it without uploading (docs/protocol.md,
/// "Backup claims without an upload").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationCheck {
    /// `backup.verify = false`, or the claims are a drill's: proven by a restore, not by names.
    Unchecked,
    /// A listing that succeeded: the last-modified time of the newest object of the newest generation's unbroken
    /// chain (`None`: nothing restorable). A claim stamped at `T` is covered when that time is at or after `T`:
    /// litestream wrote an object a restore reaches no earlier than the claim, with no slack for clocks.
    Listed { reaches: Option<SystemTime> },
    /// The listing failed or timed out: nothing is known to be behind any claim.
    Unreadable,
}

impl DestinationCheck {
    /// Whether a backup claimed at `claimed` has an object behind it.
    pub fn covers(&self, claimed: SystemTime) -> bool {
        match *self {
            DestinationCheck::Unchecked => true,
            DestinationCheck::Unreadable => false,
            DestinationCheck::Listed { reaches } => {
                reaches.is_some_and(|reaches| reaches >= claimed)
            }
        }
    }
}

/// Everything [`decide`] looks at, gathered by the monitor loop at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub now: Instant,
    /// Wall-clock time of `now`, compared with [`Backup::backed_up_at`].
    pub wall_now: SystemTime,
    /// When the sidecar started.
    pub started: Instant,
    pub ownership: Ownership,
    /// Already `max(30 s, configured initial delay, longest reservation observed)`.
    pub cleanup_delay: Duration,
    /// How long a departed subscriber's ack still bounds the purge (default 30 s, Zero's `CLEANUP_DELAY_MS`).
    pub reconnect_grace: Duration,
    pub mode: ReservationMode,
    pub without_subscribers: WithoutSubscribers,
    /// Tracked backed-up watermarks, in any order.
    pub backups: &'a [Backup],
    /// Every open reservation, whoever will end it.
    pub reservations: &'a [HeldReservation],
    /// Connected and departed subscribers, departed ones of any age (those past the grace are ignored here).
    pub subscribers: &'a [Subscriber],
    /// The `before` of the last purge done, if any.
    pub last_purged: Option<&'a str>,
    /// The highest watermark litestream's gauge ever reported.
    pub highest_backup: Option<&'a str>,
    /// The watermark the gauge reports now (at the last page that had one).
    pub current_backup: Option<&'a str>,
    /// What the backup destination holds: only claims it covers may be purged below.
    pub destination: DestinationCheck,
    /// Claims first seen while a restore would have picked another generation than it picks now: the objects of
    /// today's generation say nothing of them (litestream started a new generation, or a second writer's became
    /// the newest), so the destination covers none of them.
    pub other_generation: &'a [String],
    /// What the sidecar knows beyond the data above: its memory across restarts, litestream's position, the
    /// purger lock, the replica's last reset, the clock.
    pub guards: Guards,
}

/// The facts that keep cleanup safe at the edges of a run: a restart, a resync, a restarted litestream, a second
/// sidecar, a stepped clock. The default is the quiet case: nothing to hold for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Guards {
    /// The deployment cannot be served ([`unservable`]): whatever else holds, nothing here is about the backup
    /// view-syncers restore or the log they catch up from.
    pub unservable: bool,
    /// Another sidecar holds the shard's purger lock, or it could not be taken: this one is standby.
    pub standby: bool,
    /// Whether what this run knows of restores in flight would survive a restart.
    pub memory: Memory,
    /// The run started without a state file, so a restore begun before it may be in flight unseen: cleanup holds
    /// until this instant (`cleanup.hold_without_state` after the start).
    pub restores_unknown_until: Option<Instant>,
    /// The change DB's `replicaVersion` changed (a resync) at this wall-clock time: every claim from before it is
    /// about another replica, and cleanup holds until a backup taken after it has aged.
    pub reset_at: Option<SystemTime>,
    /// The change DB's `replicaVersion` has not been read in this run, and none was kept from the last: a resync
    /// could not be told apart, nor could a purge batch check it is still working on the log it was decided for.
    pub replica_unknown: bool,
    /// Where litestream's backup stands is unknown: it restarted, its page lost its samples, or it could not be
    /// read. Nothing is purged until a page shows the gauge again.
    pub position_unknown: bool,
    /// A restore drill restored less than the backup claimed (objects missing from the backup), and no drill has
    /// restored as far since: every claim is in doubt, whatever the listing says.
    pub restored_less: bool,
    /// `cleanup.requires = "restore"` and the latest drill could not run for want of disk: nothing will be proven
    /// until there is room, and the hold says so rather than waiting in silence.
    pub drill_disk: bool,
    /// The wall clock as the monotonic clock has carried it since the sidecar started: a claim is aged only when
    /// both this and [`Inputs::wall_now`] say so, so a forward step of the wall clock ages nothing. `None`: the
    /// wall clock alone.
    pub steady_now: Option<SystemTime>,
}

/// Whether the state file keeps what this run knows (open reservations, the learned delay) for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Memory {
    /// The slots and the shard's memory in the change DB are current.
    #[default]
    Kept,
    /// Not read from the change DB yet (the sidecar is starting).
    Loading,
    /// The last write of the slots failed: their rows may lag what this sidecar knows.
    Unwritable,
    /// The sidecar's schema cannot be used, or the slots cannot be read: what the shard knows is unknown, and
    /// nothing is guessed.
    Unreadable,
}

/// How far open reservations (and, through [`purge_ceiling`], tracked subscribers) let a purge that is already
/// running go, asked before each of its batches: a reservation can open (or announce a lower floor) and a subscriber
/// can register while a purge runs, after the [`Decision`] was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ceiling {
    /// Nothing limits it.
    None,
    /// Delete nothing more: a reservation protects every row, or mode `pause` has one open.
    Everything,
    /// Delete only rows below this watermark: the lowest open floor, or the lowest tracked ack.
    Below(String),
}

/// The [`Ceiling`] for a running purge while `reservations` are open, by the same rule [`decide`] applies to them.
pub fn ceiling(mode: ReservationMode, reservations: &[HeldReservation]) -> Ceiling {
    if reservations.is_empty() {
        return Ceiling::None;
    }
    if mode == ReservationMode::Pause {
        return Ceiling::Everything;
    }
    let mut lowest: Option<&str> = None;
    for reservation in reservations {
        let Some(floor) = reservation.floor.as_deref() else {
            return Ceiling::Everything;
        };
        lowest = Some(lowest.map_or(floor, |l| l.min(floor)));
    }
    lowest.map_or(Ceiling::None, |floor| Ceiling::Below(floor.to_owned()))
}

/// [`ceiling`], lowered to the lowest acked watermark of the `subscribers` still tracked at `now`.
///
/// A purge is decided with every tracked subscriber at or above its target, but one can register behind it while
/// it runs: a v4 view-syncer whose reservation announced the `minWatermark` of a log already half purged catches
/// up from its own replica at or above it, and once its subscription ends the reservation, only its ack holds the
/// remaining batches back.
pub fn purge_ceiling(
    mode: ReservationMode,
    reservations: &[HeldReservation],
    subscribers: &[Subscriber],
    now: Instant,
    grace: Duration,
) -> Ceiling {
    let lowest_ack = subscribers
        .iter()
        .filter(|s| s.is_tracked(now, grace))
        .map(|s| s.acked.as_str())
        .min();
    match (ceiling(mode, reservations), lowest_ack) {
        (Ceiling::Everything, _) => Ceiling::Everything,
        (limit, None) => limit,
        (Ceiling::None, Some(ack)) => Ceiling::Below(ack.to_owned()),
        (Ceiling::Below(floor), Some(ack)) => Ceiling::Below(floor.min(ack.to_owned())),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Delete change-log rows with `watermark < before`; rows at `before` stay.
    Purge {
        before: String,
        bound: Bound,
    },
    Hold(HoldReason),
}

/// What set a purge's watermark: the newest aged backup itself, or the constraint that lowered it to an older one.
/// When both a reservation and a subscriber lowered it, the subscriber (applied last) is the one that bound it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The newest aged backup newer than the last purge; nothing lowered it.
    Backup,
    /// Kept at or below the newest aged backup the destination covers: newer claims have no object behind them.
    Destination,
    /// Kept at or below this reservation's floor (the lowest open one).
    Reservation { task_id: String, floor: String },
    /// Kept at or below this subscriber's acknowledged watermark (the lowest tracked one).
    Subscriber { id: String, acked: String },
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Backup => f.write_str("the newest aged backup"),
            Bound::Destination => {
                f.write_str("the newest aged backup the destination has objects for")
            }
            Bound::Reservation { task_id, floor } => {
                write!(f, "reservation {task_id} at floor {floor}")
            }
            Bound::Subscriber { id, acked } => write!(f, "subscriber {id} acked at {acked}"),
        }
    }
}

/// Declares [`HoldReason`] from one table, so that a reason is added in one place: its variant, its label (the
/// `reason` of `cleanup_holds_total` and `/status`'s `hold_reason`) and its words, in the order [`decide`] checks
/// them.
macro_rules! hold_reasons {
    ($($(#[doc = $doc:literal])* $variant:ident => $label:literal, $text:literal;)*) => {
        /// Why [`decide`] did not purge, in the order [`decide`] checks the reasons: the first that applies is
        /// reported, and [`HoldReason::ALL`] lists them so.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum HoldReason {
            $($(#[doc = $doc])* $variant,)*
        }

        impl HoldReason {
            /// Every reason, in evaluation order (for pre-registering metric label values).
            pub const ALL: [HoldReason; [$(stringify!($variant)),*].len()] = [$(HoldReason::$variant),*];

            /// The snake_case value of the `reason` metric label.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $(HoldReason::$variant => $label,)*
                }
            }
        }

        impl fmt::Display for HoldReason {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $(HoldReason::$variant => $text,)*
                })
            }
        }
    };
}

hold_reasons! {
    /// The deployment cannot be served ([`unservable::Reason`]): its backups or its change log are not what the
    /// sidecar reads, so nothing it knows says what view-syncers still need.
    Unservable => "unservable",
        "refused: the sidecar cannot serve this deployment (see unservable in /status)";
    /// `ownerAddress` does not name the sidecar (or cannot be read): it does not front the change-streamer that
    /// owns the shard, so purging is not its call.
    NotRegistered => "not_registered",
        "not registered as the change-streamer address";
    /// Registered, but not yet for `reconnect_grace` plus the cleanup delay: subscribers that were connected to the
    /// change-streamer directly may not have come through the sidecar yet.
    RecentlyRegistered => "recently_registered",
        "registered too recently";
    /// Another sidecar holds the shard's purger lock: this one is standby, and takes over when it frees.
    Standby => "standby",
        "standby: another sidecar holds the shard's purger lock";
    /// The sidecar has been up for less than the cleanup delay (or the reconnect grace, if longer): a restore that
    /// began before it started may still be running unseen, and subscribers the restart cut off are not back yet.
    StartingUp => "starting_up",
        "starting up";
    /// The state file the previous run left cannot be read: which restores were in flight is unknown.
    StateUnreadable => "state_unreadable",
        "state file unreadable";
    /// The state file cannot be written: a restart would forget the restores in flight.
    StateUnwritable => "state_unwritable",
        "state file cannot be written";
    /// Started without a state file: a restore begun before the start may still be in flight, for up to
    /// `cleanup.hold_without_state`.
    RestoresUnknown => "restores_unknown",
        "started without a state file: restores in flight unknown";
    /// The replica was reset (a resync): no backup taken since has aged yet.
    ReplicaReset => "replica_reset",
        "replica reset: no backup of the new replica has aged";
    /// The change DB's replica version has not been read yet (and none was kept): which log this is is unknown.
    ReplicaUnknown => "replica_unknown",
        "replica version not read yet: which change log this is is unknown";
    /// Mode `pause` and at least one reservation is open.
    ReservationsOpen => "reservations_open",
        "reservations open";
    /// Mode `pin` and a reservation opened before any backup was known: it protects every row.
    ReservationWithoutFloor => "reservation_without_floor",
        "reservation opened before any backup";
    /// Where litestream's backup stands is unknown (it restarted, its page lost its samples, or it cannot be read).
    BackupUnknown => "backup_unknown",
        "litestream's backed-up position unknown";
    /// The latest restore drill restored less than the backup claimed when it started, and no drill has restored
    /// as far since: a view-syncer restoring now would get less than the names and the gauge say.
    RestoredLess => "restored_less",
        "a restore drill restored less than the backup claims: objects are missing from it";
    /// `cleanup.requires = "restore"` and restore drills cannot run for want of disk in `backup.drill_dir`.
    DrillDisk => "drill_disk",
        "restore drills cannot run: too little disk in backup.drill_dir (see drills in /status)";
    /// Litestream's gauge reports a watermark below the highest it reported before (it restarted on an older
    /// generation, say): a restore started now gets less than the old high, so no backup above the gauge proves
    /// anything until the gauge reaches the old high again. Checked before `NoBackup`: a regression may leave
    /// nothing tracked, and it is the news an operator needs.
    BackupRegressed => "backup_regressed",
        "litestream's backup went back below a watermark it reported";
    /// No backed-up watermark is tracked.
    NoBackup => "no_backup",
        "no backup yet";
    /// No subscriber is connected, so nothing confirms what the subscribers still need (departed ones in their
    /// grace do not count). With [`WithoutSubscribers::AfterGrace`], only while a departed one is in its grace or
    /// the sidecar has been up for less than `reconnect_grace`.
    NoSubscribers => "no_subscribers",
        "no connected subscriber";
    /// A connected or recently departed subscriber is still at the replica version; Zero would stream it a gap
    /// instead of an error once the log is purged past it (docs/protocol.md, "A gap at the replica version").
    SubscriberAtReplicaVersion => "subscriber_at_replica_version",
        "subscriber at replica version";
    /// No tracked backup is newer than the last purge (and, after a reset, taken after it).
    NothingNew => "nothing_new",
        "nothing new since last purge";
    /// Every backup newer than the last purge is younger than the cleanup delay (or has a time in the future).
    BackupTooRecent => "backup_too_recent",
        "backup too recent";
    /// No aged backup newer than the last purge is covered by the destination: the generation a restore picks does not
    /// restore by its names, or its chain holds no object written at or after the backup's claimed time, or it
    /// could not be listed. Purging on litestream's word
    /// alone is how a wedged litestream lost data (docs/protocol.md, "Backup claims without an upload").
    BackupUnverified => "backup_unverified",
        "backup not found in the destination";
    /// Every aged backup newer than the last purge is above some reservation's floor.
    ReservationFloor => "reservation_floor",
        "backup above a reservation floor";
    /// Every remaining backup is above some tracked subscriber's acked watermark.
    SubscriberBehind => "subscriber_behind",
        "subscriber behind backup";
}

/// Decides whether to purge now, and below which watermark.
///
/// Purges below `W`, the largest tracked backup watermark that satisfies every rule:
/// - it was backed up at least `cleanup_delay` ago by the wall clock (a time in the future is not aged);
/// - the destination covers it (see [`DestinationCheck::covers`]), unless verification is off;
/// - mode `pin`: `W <=` every open reservation's floor; mode `pause`: no reservation is open;
/// - `W <=` the acked watermark of every connected subscriber and of every subscriber departed less than
///   `reconnect_grace` ago;
/// - `W >` `last_purged`.
///
/// It also needs the sidecar to have been up for `cleanup_delay`, litestream's gauge at or above every watermark it
/// reported, at least one connected subscriber, and no tracked subscriber still at its replica version. W need not
/// be the newest backup: a slow subscriber or an older reservation only lowers it.
///
/// Otherwise it holds with the first reason that applies, in the order the [`HoldReason`] table declares them
/// (each reason's doc says when it applies).
pub fn decide(inputs: &Inputs) -> Decision {
    match choose(inputs) {
        Ok((before, bound)) => Decision::Purge {
            before: before.to_owned(),
            bound,
        },
        Err(reason) => Decision::Hold(reason),
    }
}

fn choose<'a>(inputs: &Inputs<'a>) -> Result<(&'a str, Bound), HoldReason> {
    if inputs.guards.unservable {
        return Err(HoldReason::Unservable);
    }
    match inputs.ownership {
        Ownership::Unchecked => {}
        Ownership::NotRegistered => return Err(HoldReason::NotRegistered),
        Ownership::RegisteredSince(since) => {
            if inputs.now.saturating_duration_since(since)
                < inputs.reconnect_grace + inputs.cleanup_delay
            {
                return Err(HoldReason::RecentlyRegistered);
            }
        }
    }
    let guards = &inputs.guards;
    if guards.standby {
        return Err(HoldReason::Standby);
    }
    // Subscribers the restart cut off are known to no one now: they get the grace they had to come back.
    let start_wait = inputs.cleanup_delay.max(inputs.reconnect_grace);
    if inputs.now.saturating_duration_since(inputs.started) < start_wait {
        return Err(HoldReason::StartingUp);
    }
    match guards.memory {
        Memory::Kept => {}
        Memory::Unreadable | Memory::Loading => return Err(HoldReason::StateUnreadable),
        Memory::Unwritable => return Err(HoldReason::StateUnwritable),
    }
    if guards
        .restores_unknown_until
        .is_some_and(|until| inputs.now < until)
    {
        return Err(HoldReason::RestoresUnknown);
    }
    if let Some(reset) = guards.reset_at {
        let since_reset = |b: &Backup| b.backed_up_at >= reset && is_aged(b, inputs);
        if !inputs.backups.iter().any(since_reset) {
            return Err(HoldReason::ReplicaReset);
        }
    }
    if guards.replica_unknown {
        return Err(HoldReason::ReplicaUnknown);
    }

    let mut lowest_floor: Option<&'a HeldReservation> = None;
    match inputs.mode {
        ReservationMode::Pause if !inputs.reservations.is_empty() => {
            return Err(HoldReason::ReservationsOpen)
        }
        ReservationMode::Pause => {}
        ReservationMode::Pin => {
            for reservation in inputs.reservations {
                let Some(floor) = reservation.floor.as_deref() else {
                    return Err(HoldReason::ReservationWithoutFloor);
                };
                if lowest_floor.is_none_or(|lowest| Some(floor) < lowest.floor.as_deref()) {
                    lowest_floor = Some(reservation);
                }
            }
        }
    }

    if guards.position_unknown {
        return Err(HoldReason::BackupUnknown);
    }
    if guards.restored_less {
        return Err(HoldReason::RestoredLess);
    }
    if guards.drill_disk {
        return Err(HoldReason::DrillDisk);
    }
    if is_regressed(inputs.highest_backup, inputs.current_backup) {
        return Err(HoldReason::BackupRegressed);
    }
    if inputs.backups.is_empty() {
        return Err(HoldReason::NoBackup);
    }

    let tracked = || {
        inputs
            .subscribers
            .iter()
            .filter(|s| s.is_tracked(inputs.now, inputs.reconnect_grace))
    };
    if !inputs.subscribers.iter().any(Subscriber::is_connected) {
        // With the change-streamer's own backup replicator connected directly (Zero >= 0.22), the backup proves the
        // replication-manager's replica passed it; view-syncers that left get the grace to come back first, and a
        // sidecar that just started waits as long for those of a previous run.
        let quiet = tracked().next().is_none()
            && inputs.now.saturating_duration_since(inputs.started) >= inputs.reconnect_grace;
        if inputs.without_subscribers == WithoutSubscribers::Hold || !quiet {
            return Err(HoldReason::NoSubscribers);
        }
    }
    if tracked().any(|s| s.acked == s.replica_version) {
        return Err(HoldReason::SubscriberAtReplicaVersion);
    }
    // `None` only when no subscriber is tracked and that is allowed above.
    let lowest_ack = tracked().min_by(|a, b| a.acked.cmp(&b.acked));

    // Backups at or below the last purge could only repeat it. Leaving them out before the other filters keeps a
    // stale one from hiding the constraint that actually stops the next purge.
    let is_new = |b: &&Backup| {
        inputs
            .last_purged
            .is_none_or(|last| b.watermark.as_str() > last)
            && guards.reset_at.is_none_or(|reset| b.backed_up_at >= reset)
    };
    if !inputs.backups.iter().any(|b| is_new(&b)) {
        return Err(HoldReason::NothingNew);
    }
    let aged: Vec<&'a Backup> = inputs
        .backups
        .iter()
        .filter(is_new)
        .filter(|b| is_aged(b, inputs))
        .collect();
    if aged.is_empty() {
        return Err(HoldReason::BackupTooRecent);
    }
    let newest = |candidates: &[&'a str]| candidates.iter().copied().max();
    let aged_newest = aged.iter().map(|b| b.watermark.as_str()).max();
    let mut candidates: Vec<&'a str> = aged
        .iter()
        .filter(|b| {
            inputs.destination.covers(b.backed_up_at)
                && !inputs.other_generation.contains(&b.watermark)
        })
        .map(|b| b.watermark.as_str())
        .collect();
    if candidates.is_empty() {
        return Err(HoldReason::BackupUnverified);
    }

    // Each constraint in turn; the last one that lowered the newest candidate is what bound the purge.
    let mut bound = if newest(&candidates) == aged_newest {
        Bound::Backup
    } else {
        Bound::Destination
    };
    if let Some(reservation) = lowest_floor {
        let floor = reservation.floor.as_deref().unwrap_or_default();
        let before = newest(&candidates);
        candidates.retain(|&w| w <= floor);
        if candidates.is_empty() {
            return Err(HoldReason::ReservationFloor);
        }
        if newest(&candidates) != before {
            bound = Bound::Reservation {
                task_id: reservation.task_id.clone(),
                floor: floor.to_owned(),
            };
        }
    }

    if let Some(subscriber) = lowest_ack {
        let before = newest(&candidates);
        candidates.retain(|&w| w <= subscriber.acked.as_str());
        if candidates.is_empty() {
            return Err(HoldReason::SubscriberBehind);
        }
        if newest(&candidates) != before {
            bound = Bound::Subscriber {
                id: subscriber.id.clone(),
                acked: subscriber.acked.clone(),
            };
        }
    }
    newest(&candidates)
        .map(|before| (before, bound))
        .ok_or(HoldReason::SubscriberBehind)
}

/// Backed up at least `cleanup_delay` ago by the wall clock, and by the wall clock as the monotonic clock carried it
/// since the start, so that a forward step ages nothing (`checked_sub` fails only near `SystemTime`'s limits;
/// nothing is aged then).
fn is_aged(backup: &Backup, inputs: &Inputs) -> bool {
    let now = match inputs.guards.steady_now {
        Some(steady) => inputs.wall_now.min(steady),
        None => inputs.wall_now,
    };
    now.checked_sub(inputs.cleanup_delay)
        .is_some_and(|cutoff| backup.backed_up_at <= cutoff)
}
