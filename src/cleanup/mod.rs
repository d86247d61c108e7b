//! Change-log cleanup policy: decides whether, and below which watermark, rows of Zero's `changeLog` may be purged now.
//!
//! Pure: [`decide`] reads plain data and returns a [`Decision`]; it reads no clock, does no I/O and logs nothing. The
//! monitor loop gathers the inputs (registration, litestream scrape, reservation registry, relay acks), calls it once
//! per interval, logs the [`HoldReason`] or the [`Bound`] of the purge, and runs it. Every rule lives here, the
//! registration checks included; not owned here: growing the cleanup delay (the reservation registry), and keeping
//! the purge at or below the newest `changeLog` watermark (the purge itself, PROTOCOL.md W8a).
//!
//! Zero 0.20 pauses all cleanup while any reservation is open (W5), purges past a restore in progress through the
//! legacy signal (W2), stalls for good after one check without subscribers (W1) and can stream a gap to a subscriber
//! still at the replica version (W8b). Here every rule is re-evaluated from scratch on each call, reservations pin a
//! floor instead of pausing (unless configured to pause), and the chosen watermark is the largest one that every rule
//! allows.
//!
//! Watermarks are compared as plain strings (byte-wise), never parsed (PROTOCOL.md §2).

pub mod change_db;
pub mod discovery;
pub mod keeper;
pub mod monitor;
pub mod reservations;
pub mod state;
pub mod status;
pub mod subscribers;

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

pub use crate::config::{ReservationMode, WithoutSubscribers};

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
    last_purged: Option<String>,
    highest: Option<String>,
    current: Option<Backup>,
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
pub struct Observed {
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
            let purged = self
                .last_purged
                .as_deref()
                .is_some_and(|last| watermark <= last);
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
            last_purged: last_purged.map(str::to_owned),
            highest: highest.map(str::to_owned),
            ..Self::default()
        }
    }

    /// After a successful purge below `before`: forget every backup below it. The one at `before` stays, so the
    /// policy reports "nothing new" rather than "no backup" until a newer backup arrives.
    pub fn purged(&mut self, before: &str) {
        self.backups.retain(|b| b.watermark.as_str() >= before);
        self.last_purged = Some(before.to_string());
    }

    pub fn backups(&self) -> &[Backup] {
        &self.backups
    }

    pub fn last_purged(&self) -> Option<&str> {
        self.last_purged.as_deref()
    }

    /// Takes the samples of one readable page: the newest of them is where the gauge is now.
    ///
    /// Below the highest watermark ever reported, every tracked backup above the gauge is forgotten: the generation
    /// it was in may be gone, and if the gauge reports it again that is a new upload, whose own time must age
    /// before it counts (a restore that started meanwhile got the older backup). The highest stays where it was
    /// until the gauge reaches it again; [`decide`] holds until then. Returns what changed, and which move, for the
    /// monitor to pass on to the reservation registry and to log.
    pub fn observe(&mut self, seen: &[(&str, SystemTime)]) -> Observed {
        let Some(&(now_at, backed_up_at)) = seen.iter().max_by(|a, b| a.0.cmp(b.0)) else {
            return Observed {
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
        Observed {
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
    /// Acknowledged watermark (PROTOCOL.md §6.8): the subscriber resumes at or after it.
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
/// listed it. The gauge alone is no proof: a wedged litestream has advanced it without uploading (PROTOCOL.md W3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// `backup.verify = false`: claims are trusted as litestream makes them.
    Unchecked,
    /// A listing that succeeded: the newest object's last-modified time (`None`: the destination is empty). A claim
    /// backed up at `T` is covered when that time is at or after `T - slack`, Zero's own rule since 1.7.0: objects
    /// are written before the gauge moves, and the two clocks may differ a little.
    Listed {
        newest: Option<SystemTime>,
        slack: Duration,
    },
    /// The listing failed or timed out: nothing is known to be behind any claim.
    Unreadable,
}

impl Destination {
    /// Whether a backup claimed at `claimed` has an object behind it.
    pub fn covers(&self, claimed: SystemTime) -> bool {
        match *self {
            Destination::Unchecked => true,
            Destination::Unreadable => false,
            Destination::Listed { newest, slack } => newest.is_some_and(|newest| {
                // Past SystemTime's range the newest object is later than any claim.
                newest
                    .checked_add(slack)
                    .is_none_or(|reach| reach >= claimed)
            }),
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
    pub destination: Destination,
    /// What the sidecar knows beyond the data above: its memory across restarts, litestream's position, the
    /// purger lock, the replica's last reset, the clock.
    pub guards: Guards,
}

/// The facts that keep cleanup safe at the edges of a run: a restart, a resync, a restarted litestream, a second
/// sidecar, a stepped clock. The default is the quiet case: nothing to hold for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Guards {
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
    /// Where litestream's backup stands is unknown: it restarted, its page lost its samples, or it could not be
    /// read. Nothing is purged until a page shows the gauge again.
    pub position_unknown: bool,
    /// The wall clock as the monotonic clock has carried it since the sidecar started: a claim is aged only when
    /// both this and [`Inputs::wall_now`] say so, so a forward step of the wall clock ages nothing. `None`: the
    /// wall clock alone.
    pub steady_now: Option<SystemTime>,
}

/// Whether the state file keeps what this run knows (open reservations, the learned delay) for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Memory {
    /// Written and current.
    #[default]
    Kept,
    /// `cleanup.state_file = "none"`: the operator chose to keep nothing.
    OptedOut,
    /// The last write failed: a restart now would forget the restores in flight.
    Unwritable,
    /// The file the previous run left cannot be read: what it knew is unknown, and nothing is guessed.
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

/// Why [`decide`] did not purge. Variants are listed in the order [`decide`] checks them: the first that applies is
/// reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HoldReason {
    /// `ownerAddress` does not name the sidecar (or cannot be read): it does not front the change-streamer that
    /// owns the shard, so purging is not its call.
    NotRegistered,
    /// Registered, but not yet for `reconnect_grace` plus the cleanup delay: subscribers that were connected to the
    /// change-streamer directly may not have come through the sidecar yet.
    RecentlyRegistered,
    /// Another sidecar holds the shard's purger lock: this one is standby, and takes over when it frees.
    Standby,
    /// The sidecar has been up for less than the cleanup delay (or the reconnect grace, if longer): a restore that
    /// began before it started may still be running unseen, and subscribers the restart cut off are not back yet.
    StartingUp,
    /// The state file the previous run left cannot be read: which restores were in flight is unknown.
    StateUnreadable,
    /// The state file cannot be written: a restart would forget the restores in flight.
    StateUnwritable,
    /// Started without a state file: a restore begun before the start may still be in flight, for up to
    /// `cleanup.hold_without_state`.
    RestoresUnknown,
    /// The replica was reset (a resync): no backup taken since has aged yet.
    ReplicaReset,
    /// Mode `pause` and at least one reservation is open.
    ReservationsOpen,
    /// Mode `pin` and a reservation opened before any backup was known: it protects every row.
    ReservationWithoutFloor,
    /// Where litestream's backup stands is unknown (it restarted, its page lost its samples, or it cannot be read).
    BackupUnknown,
    /// Litestream's gauge reports a watermark below the highest it reported before (it restarted on an older
    /// generation, say): a restore started now gets less than the old high, so no backup above the gauge proves
    /// anything until the gauge reaches the old high again.
    BackupRegressed,
    /// No backed-up watermark is tracked.
    NoBackup,
    /// No subscriber is connected, so nothing confirms what the subscribers still need.
    NoSubscribers,
    /// A connected or recently departed subscriber is still at the replica version; Zero would stream it a gap
    /// instead of an error once the log is purged past it (W8b).
    SubscriberAtReplicaVersion,
    /// No tracked backup is newer than the last purge.
    NothingNew,
    /// Every backup newer than the last purge is younger than the cleanup delay (or has a time in the future).
    BackupTooRecent,
    /// No aged backup newer than the last purge is covered by the destination: it holds no object written at or
    /// after the backup's claimed time minus the slack, or it could not be listed. Purging on litestream's word
    /// alone is how a wedged litestream lost data (PROTOCOL.md W3).
    BackupUnverified,
    /// Every aged backup newer than the last purge is above some reservation's floor.
    ReservationFloor,
    /// Every remaining backup is above some tracked subscriber's acked watermark.
    SubscriberBehind,
}

impl HoldReason {
    /// Every variant, in evaluation order (for pre-registering metric label values).
    pub const ALL: [HoldReason; 20] = [
        HoldReason::NotRegistered,
        HoldReason::RecentlyRegistered,
        HoldReason::Standby,
        HoldReason::StartingUp,
        HoldReason::StateUnreadable,
        HoldReason::StateUnwritable,
        HoldReason::RestoresUnknown,
        HoldReason::ReplicaReset,
        HoldReason::ReservationsOpen,
        HoldReason::ReservationWithoutFloor,
        HoldReason::BackupUnknown,
        HoldReason::BackupRegressed,
        HoldReason::NoBackup,
        HoldReason::NoSubscribers,
        HoldReason::SubscriberAtReplicaVersion,
        HoldReason::NothingNew,
        HoldReason::BackupTooRecent,
        HoldReason::BackupUnverified,
        HoldReason::ReservationFloor,
        HoldReason::SubscriberBehind,
    ];

    /// The snake_case value of the `reason` metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            HoldReason::NotRegistered => "not_registered",
            HoldReason::RecentlyRegistered => "recently_registered",
            HoldReason::Standby => "standby",
            HoldReason::StartingUp => "starting_up",
            HoldReason::StateUnreadable => "state_unreadable",
            HoldReason::StateUnwritable => "state_unwritable",
            HoldReason::RestoresUnknown => "restores_unknown",
            HoldReason::ReplicaReset => "replica_reset",
            HoldReason::ReservationsOpen => "reservations_open",
            HoldReason::ReservationWithoutFloor => "reservation_without_floor",
            HoldReason::BackupUnknown => "backup_unknown",
            HoldReason::BackupRegressed => "backup_regressed",
            HoldReason::NoBackup => "no_backup",
            HoldReason::NoSubscribers => "no_subscribers",
            HoldReason::SubscriberAtReplicaVersion => "subscriber_at_replica_version",
            HoldReason::NothingNew => "nothing_new",
            HoldReason::BackupTooRecent => "backup_too_recent",
            HoldReason::BackupUnverified => "backup_unverified",
            HoldReason::ReservationFloor => "reservation_floor",
            HoldReason::SubscriberBehind => "subscriber_behind",
        }
    }
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HoldReason::NotRegistered => "not registered as the change-streamer address",
            HoldReason::RecentlyRegistered => "registered too recently",
            HoldReason::Standby => "standby: another sidecar holds the shard's purger lock",
            HoldReason::StartingUp => "starting up",
            HoldReason::StateUnreadable => "state file unreadable",
            HoldReason::StateUnwritable => "state file cannot be written",
            HoldReason::RestoresUnknown => {
                "started without a state file: restores in flight unknown"
            }
            HoldReason::ReplicaReset => "replica reset: no backup of the new replica has aged",
            HoldReason::ReservationsOpen => "reservations open",
            HoldReason::ReservationWithoutFloor => "reservation opened before any backup",
            HoldReason::BackupUnknown => "litestream's backed-up position unknown",
            HoldReason::BackupRegressed => {
                "litestream's backup went back below a watermark it reported"
            }
            HoldReason::NoBackup => "no backup yet",
            HoldReason::NoSubscribers => "no connected subscriber",
            HoldReason::SubscriberAtReplicaVersion => "subscriber at replica version",
            HoldReason::NothingNew => "nothing new since last purge",
            HoldReason::BackupTooRecent => "backup too recent",
            HoldReason::BackupUnverified => "backup not found in the destination",
            HoldReason::ReservationFloor => "backup above a reservation floor",
            HoldReason::SubscriberBehind => "subscriber behind backup",
        })
    }
}

/// Decides whether to purge now, and below which watermark.
///
/// Purges below `W`, the largest tracked backup watermark that satisfies every rule:
/// - it was backed up at least `cleanup_delay` ago by the wall clock (a time in the future is not aged);
/// - the destination covers it (see [`Destination::covers`]), unless verification is off;
/// - mode `pin`: `W <=` every open reservation's floor; mode `pause`: no reservation is open;
/// - `W <=` the acked watermark of every connected subscriber and of every subscriber departed less than
///   `reconnect_grace` ago;
/// - `W >` `last_purged`.
///
/// It also needs the sidecar to have been up for `cleanup_delay`, litestream's gauge at or above every watermark it
/// reported, at least one connected subscriber, and no tracked subscriber still at its replica version. W need not
/// be the newest backup: a slow subscriber or an older reservation only lowers it.
///
/// Otherwise it holds with the first reason that applies, checked in this fixed order (that of [`HoldReason::ALL`]):
/// 1. `NotRegistered`: ownership is checked and `ownerAddress` does not name the sidecar.
/// 2. `RecentlyRegistered`: it has named the sidecar for less than `reconnect_grace + cleanup_delay`.
/// 3. `Standby`: another sidecar holds the shard's purger lock.
/// 4. `StartingUp`: uptime `< max(cleanup_delay, reconnect_grace)`.
/// 5. `StateUnreadable`, 6. `StateUnwritable`: the state file cannot be read, or written ([`Memory`]).
/// 7. `RestoresUnknown`: started without a state file, less than `cleanup.hold_without_state` ago.
/// 8. `ReplicaReset`: the replica was reset and no backup taken after the reset has aged.
/// 9. `ReservationsOpen`: mode `pause` and a reservation is open.
/// 10. `ReservationWithoutFloor`: mode `pin` and a reservation has no floor.
/// 11. `BackupUnknown`: litestream's position is unknown (restarted, no samples, unreadable).
/// 12. `BackupRegressed`: `current_backup < highest_backup`. Before `NoBackup`: a regression may leave nothing
///     tracked, and it is the news an operator needs.
/// 13. `NoBackup`: no backup is tracked.
/// 14. `NoSubscribers`: no subscriber is connected (departed ones in their grace do not count); with
///     [`WithoutSubscribers::AfterGrace`], only while a departed one is in its grace or uptime `< reconnect_grace`.
/// 15. `SubscriberAtReplicaVersion`: a tracked subscriber's acked equals its replica version.
/// 16. `NothingNew`: no backup is newer than `last_purged` (and, after a reset, taken after it).
/// 17. `BackupTooRecent`: none of those is old enough.
/// 18. `BackupUnverified`: none of the aged ones is covered by the destination, or it could not be listed.
/// 19. `ReservationFloor`: all of the covered ones are above some reservation's floor.
/// 20. `SubscriberBehind`: all of those are above some tracked subscriber's acked watermark.
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
        Memory::Kept | Memory::OptedOut => {}
        Memory::Unreadable => return Err(HoldReason::StateUnreadable),
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
        .filter(|b| inputs.destination.covers(b.backed_up_at))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use std::time::UNIX_EPOCH;

    use proptest::prelude::*;

    use HoldReason::*;

    /// Seconds since the test epoch at which most tests decide.
    const NOW: u64 = 10_000;
    /// The replica version every test subscriber asked for; below every test watermark.
    const RV: &str = "01";

    fn at(secs: u64) -> Instant {
        // A fixed base keeps the arithmetic readable; Instant has no zero.
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    fn wall(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_746_600_000 + secs)
    }

    fn wm(s: &str) -> String {
        s.to_owned()
    }

    /// Backed up `secs_ago` seconds before [`NOW`].
    fn backup(watermark: &str, secs_ago: u64) -> Backup {
        Backup {
            watermark: wm(watermark),
            backed_up_at: wall(NOW - secs_ago),
        }
    }

    fn reservation(task_id: &str, floor: Option<&str>) -> HeldReservation {
        HeldReservation {
            task_id: task_id.to_owned(),
            floor: floor.map(wm),
        }
    }

    fn sub(acked: &str) -> Subscriber {
        Subscriber {
            id: format!("vs-{acked}"),
            acked: wm(acked),
            replica_version: wm(RV),
            departed: None,
            awaits_upstream: false,
        }
    }

    /// Disconnected `secs_ago` seconds before [`NOW`].
    fn departed(acked: &str, secs_ago: u64) -> Subscriber {
        Subscriber {
            departed: Some(at(NOW - secs_ago)),
            ..sub(acked)
        }
    }

    /// Owned inputs; defaults: long uptime, 60 s delay, 30 s grace, mode pin, nothing tracked.
    struct Case {
        now: u64,
        started: u64,
        ownership: Ownership,
        delay: u64,
        grace: u64,
        mode: ReservationMode,
        without_subscribers: WithoutSubscribers,
        backups: Vec<Backup>,
        reservations: Vec<HeldReservation>,
        subscribers: Vec<Subscriber>,
        last_purged: Option<String>,
        /// The gauge: `(highest, current)`; unset, it reports the newest backup.
        gauge: Option<(&'static str, &'static str)>,
        destination: Destination,
        guards: Guards,
    }

    fn case() -> Case {
        Case {
            now: NOW,
            started: 0,
            ownership: Ownership::Unchecked,
            delay: 60,
            grace: 30,
            mode: ReservationMode::Pin,
            without_subscribers: WithoutSubscribers::Hold,
            backups: vec![],
            reservations: vec![],
            subscribers: vec![],
            last_purged: None,
            gauge: None,
            destination: Destination::Unchecked,
            guards: Guards::default(),
        }
    }

    impl Case {
        fn decide(&self) -> Decision {
            let newest = self.backups.iter().map(|b| b.watermark.as_str()).max();
            let (highest, current) = self
                .gauge
                .map_or((newest, newest), |(h, c)| (Some(h), Some(c)));
            decide(&Inputs {
                now: at(self.now),
                wall_now: wall(self.now),
                started: at(self.started),
                ownership: self.ownership,
                cleanup_delay: Duration::from_secs(self.delay),
                reconnect_grace: Duration::from_secs(self.grace),
                mode: self.mode,
                without_subscribers: self.without_subscribers,
                backups: &self.backups,
                reservations: &self.reservations,
                subscribers: &self.subscribers,
                last_purged: self.last_purged.as_deref(),
                highest_backup: highest,
                current_backup: current,
                destination: self.destination,
                guards: self.guards,
            })
        }
    }

    /// A case that purges below 0c unless a guard holds it.
    fn guarded() -> Case {
        Case {
            backups: vec![backup("0b", 600), backup("0c", 300)],
            subscribers: vec![sub("0d")],
            ..case()
        }
    }

    #[test]
    fn each_guard_holds_with_its_own_reason_and_the_quiet_case_purges() {
        assert_eq!(guarded().decide(), purge("0c"));
        let with = |guards: Guards| {
            Case {
                guards,
                ..guarded()
            }
            .decide()
        };
        let held = Guards::default();
        assert_eq!(
            with(Guards {
                standby: true,
                ..held
            }),
            Decision::Hold(Standby)
        );
        assert_eq!(
            with(Guards {
                memory: Memory::Unreadable,
                ..held
            }),
            Decision::Hold(StateUnreadable)
        );
        assert_eq!(
            with(Guards {
                memory: Memory::Unwritable,
                ..held
            }),
            Decision::Hold(StateUnwritable)
        );
        // Opting out of the state file is the operator's call: no hold for it.
        assert_eq!(
            with(Guards {
                memory: Memory::OptedOut,
                ..held
            }),
            purge("0c")
        );
        assert_eq!(
            with(Guards {
                restores_unknown_until: Some(at(NOW + 1)),
                ..held
            }),
            Decision::Hold(RestoresUnknown)
        );
        assert_eq!(
            with(Guards {
                restores_unknown_until: Some(at(NOW)),
                ..held
            }),
            purge("0c")
        );
        assert_eq!(
            with(Guards {
                position_unknown: true,
                ..held
            }),
            Decision::Hold(BackupUnknown)
        );
    }

    #[test]
    fn after_a_reset_only_backups_taken_since_count_once_they_have_aged() {
        let reset = |secs_ago: u64| Guards {
            reset_at: Some(wall(NOW - secs_ago)),
            ..Guards::default()
        };
        // Reset 200 s ago: 0b and 0c are claims about the old replica; nothing of the new one yet.
        let mut case = Case {
            guards: reset(200),
            ..guarded()
        };
        assert_eq!(case.decide(), Decision::Hold(ReplicaReset));
        // A backup of the new replica, not yet aged (60 s delay).
        case.backups.push(backup("05", 30));
        assert_eq!(case.decide(), Decision::Hold(ReplicaReset));
        // Aged: the purge goes below it, never below an old claim, though those are higher.
        case.backups.push(backup("04", 100));
        assert_eq!(case.decide(), purge("04"));
    }

    #[test]
    fn a_forward_step_of_the_wall_clock_ages_no_claim() {
        // The wall clock jumped an hour ahead; by the monotonic clock since the start it is still NOW - 3600.
        let case = Case {
            now: NOW,
            backups: vec![backup("0b", 3630)],
            subscribers: vec![sub("0d")],
            guards: Guards {
                steady_now: Some(wall(NOW - 3600)),
                ..Guards::default()
            },
            ..case()
        };
        assert_eq!(case.decide(), Decision::Hold(BackupTooRecent));
        let later = Case {
            guards: Guards {
                steady_now: Some(wall(NOW - 3500)),
                ..Guards::default()
            },
            ..case
        };
        assert_eq!(later.decide(), purge("0b"));
    }

    /// A purge below the newest aged backup, which nothing lowered.
    fn purge(before: &str) -> Decision {
        Decision::Purge {
            before: wm(before),
            bound: Bound::Backup,
        }
    }

    /// A purge lowered to `before` by reservation `task_id`'s floor.
    fn purge_at_floor(before: &str, task_id: &str, floor: &str) -> Decision {
        Decision::Purge {
            before: wm(before),
            bound: Bound::Reservation {
                task_id: wm(task_id),
                floor: wm(floor),
            },
        }
    }

    /// A purge lowered to `before` by the subscriber that acked `acked` (ids are `vs-{acked}`).
    fn purge_at_ack(before: &str, acked: &str) -> Decision {
        Decision::Purge {
            before: wm(before),
            bound: Bound::Subscriber {
                id: format!("vs-{acked}"),
                acked: wm(acked),
            },
        }
    }

    /// One aged backup at "0a" and a caught-up subscriber: purges unless the test adds an obstacle.
    fn ready() -> Case {
        Case {
            backups: vec![backup("0a", 120)],
            subscribers: vec![sub("0a")],
            ..case()
        }
    }

    #[test]
    fn ready_case_purges_below_the_backup() {
        assert_eq!(ready().decide(), purge("0a"));
    }

    // The destination: a claim counts only with an object behind it.

    fn listed(secs_ago: Option<u64>) -> Destination {
        Destination::Listed {
            newest: secs_ago.map(|ago| wall(NOW - ago)),
            slack: Duration::from_secs(60),
        }
    }

    #[test]
    fn holds_unless_the_destination_has_an_object_from_the_claim_minus_the_slack() {
        let with = |destination| Case {
            destination,
            ..ready()
        };
        // "0a" was claimed 120 s ago: an object from 180 s ago covers it with 60 s of slack, one from 181 s not.
        assert_eq!(with(listed(Some(180))).decide(), purge("0a"));
        assert_eq!(with(listed(Some(0))).decide(), purge("0a"));
        assert_eq!(
            with(listed(Some(181))).decide(),
            Decision::Hold(BackupUnverified)
        );
        assert_eq!(
            with(listed(None)).decide(),
            Decision::Hold(BackupUnverified)
        );
        assert_eq!(
            with(Destination::Unreadable).decide(),
            Decision::Hold(BackupUnverified)
        );
        assert_eq!(with(Destination::Unchecked).decide(), purge("0a"));
    }

    #[test]
    fn claims_made_after_the_uploads_stopped_lower_the_purge_to_an_older_covered_one() {
        // Uploads stopped 300 s ago while the gauge went on: "0c" (claimed 120 s ago) has nothing behind it.
        let wedged = Case {
            backups: vec![backup("0a", 600), backup("0c", 120)],
            subscribers: vec![sub("0c")],
            destination: listed(Some(300)),
            ..case()
        };
        assert_eq!(
            wedged.decide(),
            Decision::Purge {
                before: wm("0a"),
                bound: Bound::Destination
            }
        );
    }

    #[test]
    fn unverified_comes_after_the_other_backup_reasons_and_before_floors_and_acks() {
        let young = Case {
            backups: vec![backup("0a", 10)],
            destination: Destination::Unreadable,
            ..ready()
        };
        assert_eq!(young.decide(), Decision::Hold(BackupTooRecent));
        let nothing_new = Case {
            last_purged: Some(wm("0a")),
            destination: Destination::Unreadable,
            ..ready()
        };
        assert_eq!(nothing_new.decide(), Decision::Hold(NothingNew));
        let floor_and_behind = Case {
            reservations: vec![reservation("t1", Some("05"))],
            subscribers: vec![sub("05")],
            destination: listed(None),
            ..ready()
        };
        assert_eq!(floor_and_behind.decide(), Decision::Hold(BackupUnverified));
        let ordered: Vec<_> = HoldReason::ALL.iter().map(HoldReason::as_str).collect();
        let at = |label| ordered.iter().position(|l| *l == label).unwrap();
        assert_eq!(at("backup_unverified"), at("backup_too_recent") + 1);
    }

    // Ownership: only for the change-streamer the sidecar fronts, and only once its subscribers had time to arrive.

    #[test]
    fn holds_unless_registered_for_the_grace_plus_the_delay() {
        let not = Case {
            ownership: Ownership::NotRegistered,
            ..ready()
        };
        assert_eq!(not.decide(), Decision::Hold(NotRegistered));
        // 30 s grace + 60 s delay.
        let recent = Case {
            ownership: Ownership::RegisteredSince(at(NOW - 89)),
            ..ready()
        };
        assert_eq!(recent.decide(), Decision::Hold(RecentlyRegistered));
        let long_enough = Case {
            ownership: Ownership::RegisteredSince(at(NOW - 90)),
            ..ready()
        };
        assert_eq!(long_enough.decide(), purge("0a"));
        assert_eq!(
            Case {
                ownership: Ownership::Unchecked,
                ..ready()
            }
            .decide(),
            purge("0a")
        );
    }

    #[test]
    fn registration_comes_before_every_other_reason() {
        for (ownership, reason) in [
            (Ownership::NotRegistered, NotRegistered),
            (Ownership::RegisteredSince(at(NOW)), RecentlyRegistered),
        ] {
            let d = Case {
                started: NOW,
                ownership,
                ..case()
            }
            .decide();
            assert_eq!(d, Decision::Hold(reason));
        }
    }

    // Rule d: uptime.

    #[test]
    fn a_reconnect_grace_longer_than_the_delay_lengthens_the_start_up_wait() {
        let young = Case {
            started: NOW - 89,
            grace: 90,
            ..ready()
        };
        assert_eq!(young.decide(), Decision::Hold(StartingUp));
        assert_ne!(
            Case {
                started: NOW - 90,
                ..young
            }
            .decide(),
            Decision::Hold(StartingUp)
        );
    }

    #[test]
    fn holds_until_uptime_reaches_the_cleanup_delay() {
        let young = Case {
            started: NOW - 59,
            ..ready()
        };
        assert_eq!(young.decide(), Decision::Hold(StartingUp));
        let old_enough = Case {
            started: NOW - 60,
            ..ready()
        };
        assert_eq!(old_enough.decide(), purge("0a"));
    }

    #[test]
    fn starting_up_comes_before_every_other_reason() {
        let d = Case {
            started: NOW,
            ..case()
        }
        .decide();
        assert_eq!(d, Decision::Hold(StartingUp));
    }

    // Rule b: reservations.

    #[test]
    fn pause_mode_holds_while_any_reservation_is_open() {
        let d = Case {
            mode: ReservationMode::Pause,
            reservations: vec![reservation("t1", Some("0z"))],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(ReservationsOpen));
    }

    #[test]
    fn pin_mode_purges_up_to_a_floor_at_or_above_the_backup() {
        let d = Case {
            reservations: vec![reservation("t1", Some("0a"))],
            ..ready()
        }
        .decide();
        assert_eq!(d, purge("0a"));
    }

    #[test]
    fn reservation_without_floor_holds_everything_in_pin_mode() {
        let d = Case {
            reservations: vec![reservation("t1", Some("0z")), reservation("t2", None)],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(ReservationWithoutFloor));
    }

    #[test]
    fn pin_mode_stops_at_the_lowest_floor() {
        let d = Case {
            backups: vec![backup("0a", 300), backup("0b", 200), backup("0c", 100)],
            subscribers: vec![sub("0c")],
            reservations: vec![reservation("t1", Some("0c")), reservation("t2", Some("0b"))],
            ..case()
        }
        .decide();
        assert_eq!(d, purge_at_floor("0b", "t2", "0b"));
    }

    #[test]
    fn holds_when_every_aged_backup_is_above_a_floor() {
        let d = Case {
            reservations: vec![reservation("t1", Some("09"))],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(ReservationFloor));
    }

    #[test]
    fn pin_purges_below_the_older_floor_where_pause_holds_with_overlapping_reservations() {
        // A opened when "0a" was the newest backup, B after "0c" was backed up; both restores still run.
        let overlapping = Case {
            backups: vec![backup("0a", 600), backup("0c", 300), backup("0e", 120)],
            subscribers: vec![sub("0e")],
            reservations: vec![reservation("a", Some("0a")), reservation("b", Some("0c"))],
            ..case()
        };
        assert_eq!(overlapping.decide(), purge_at_floor("0a", "a", "0a"));
        let paused = Case {
            mode: ReservationMode::Pause,
            ..overlapping
        };
        assert_eq!(paused.decide(), Decision::Hold(ReservationsOpen));
    }

    // Rule a: backup age.

    #[test]
    fn no_backup_holds() {
        let d = Case {
            subscribers: vec![sub("0a")],
            ..case()
        }
        .decide();
        assert_eq!(d, Decision::Hold(NoBackup));
    }

    // The gauge going backwards.

    #[test]
    fn a_gauge_below_its_old_high_holds_even_an_otherwise_ready_purge() {
        // Everything else allows a purge below 0c.
        let ready = Case {
            backups: vec![backup("0a", 300), backup("0c", 120)],
            subscribers: vec![sub("0d")],
            ..case()
        };
        assert_eq!(ready.decide(), purge("0c"));
        let regressed = Case {
            gauge: Some(("0c", "0b")),
            ..ready
        };
        assert_eq!(regressed.decide(), Decision::Hold(BackupRegressed));
        // Back at the old high: nothing holds it any more.
        let back = Case {
            gauge: Some(("0c", "0c")),
            ..regressed
        };
        assert_eq!(back.decide(), purge("0c"));
        // Byte-wise, like every comparison: "110" (36) is above "0z" (35).
        let longer = Case {
            gauge: Some(("0z", "110")),
            ..back
        };
        assert_eq!(longer.decide(), purge("0c"));
    }

    #[test]
    fn a_regression_is_checked_after_reservations_and_before_no_backup() {
        // Nothing tracked (the regression dropped it all): the regression is what is reported.
        let empty = Case {
            gauge: Some(("0c", "0b")),
            subscribers: vec![sub("0d")],
            ..case()
        };
        assert_eq!(empty.decide(), Decision::Hold(BackupRegressed));
        let floorless = Case {
            reservations: vec![reservation("t1", None)],
            ..empty
        };
        assert_eq!(floorless.decide(), Decision::Hold(ReservationWithoutFloor));
        let young = Case {
            started: NOW - 10,
            reservations: vec![],
            ..floorless
        };
        assert_eq!(young.decide(), Decision::Hold(StartingUp));
        // Reasons after it in the order do not hide it.
        let without_subscribers = Case {
            started: 0,
            backups: vec![backup("0a", 10)],
            subscribers: vec![],
            ..young
        };
        assert_eq!(
            without_subscribers.decide(),
            Decision::Hold(BackupRegressed)
        );
    }

    fn watermarks(backlog: &Backlog) -> Vec<&str> {
        backlog
            .backups()
            .iter()
            .map(|b| b.watermark.as_str())
            .collect()
    }

    #[test]
    fn a_gauge_going_back_forgets_the_backups_above_it_until_it_reaches_its_high() {
        let mut backlog = Backlog::default();
        let first = backlog.observe(&seen(&[backup("0b", 300)]));
        assert_eq!((first.added, first.gauge), (1, Some(GaugeMove::Steady)));
        backlog.observe(&seen(&[backup("0d", 200)]));
        backlog.purged("0b");
        assert_eq!(watermarks(&backlog), ["0b", "0d"]);
        assert_eq!(backlog.regression(), None);

        // Litestream restarted on an older generation: it reports 0c.
        let back = backlog.observe(&seen(&[backup("0c", 50)]));
        assert_eq!(
            back.gauge,
            Some(GaugeMove::Regressed {
                highest: "0d".into(),
                current: "0c".into(),
                dropped: 1
            })
        );
        assert_eq!(back.added, 1);
        assert_eq!(watermarks(&backlog), ["0b", "0c"]);
        assert_eq!(backlog.regression(), Some(("0d", "0c")));
        assert_eq!(backlog.current(), Some(&backup("0c", 50)));
        assert_eq!(backlog.highest(), Some("0d"));
        // Said once: the same value again is no news, and a scrape without a usable sample changes nothing.
        assert_eq!(
            backlog.observe(&seen(&[backup("0c", 40)])).gauge,
            Some(GaugeMove::Steady)
        );
        assert_eq!(backlog.observe(&[]).gauge, None);
        assert_eq!(backlog.regression(), Some(("0d", "0c")));
        // Lower still is news again; the floor of what is tracked follows it down, the last purge stays.
        assert_eq!(
            backlog.observe(&seen(&[backup("0a", 30)])).gauge,
            Some(GaugeMove::Regressed {
                highest: "0d".into(),
                current: "0a".into(),
                dropped: 2
            })
        );
        assert_eq!(watermarks(&backlog), Vec::<&str>::new());
        assert_eq!(backlog.last_purged(), Some("0b"));
        // At or below the last purge it is not tracked, but it is still where the gauge is, with the page's time.
        assert_eq!(backlog.current(), Some(&backup("0a", 30)));

        // Between the old high and now: still below it.
        assert_eq!(
            backlog.observe(&seen(&[backup("0c", 20)])).gauge,
            Some(GaugeMove::Steady)
        );
        assert_eq!(backlog.regression(), Some(("0d", "0c")));
        // The old high again, as a new upload: tracked with its new time, not the forgotten one.
        assert_eq!(
            backlog.observe(&seen(&[backup("0d", 10)])).gauge,
            Some(GaugeMove::Recovered {
                highest: "0d".into(),
                current: "0d".into()
            })
        );
        assert_eq!(backlog.regression(), None);
        assert_eq!(backlog.backups(), [backup("0c", 20), backup("0d", 10)]);
        assert_eq!(
            backlog.observe(&seen(&[backup("0e", 5)])).gauge,
            Some(GaugeMove::Steady)
        );
        assert_eq!(backlog.highest(), Some("0e"));
    }

    #[test]
    fn the_gauge_is_the_newest_sample_of_a_page() {
        let mut backlog = Backlog::default();
        // Two replicas: the one ahead is where the gauge is (a watermark counts once one replica has it, W13).
        backlog.observe(&seen(&[backup("0c", 20), backup("0e", 10)]));
        assert_eq!(backlog.current(), Some(&backup("0e", 10)));
        assert_eq!(backlog.regression(), None);
        // The replica ahead is gone from the page: what is left is below the high.
        let gone = backlog.observe(&seen(&[backup("0c", 20)]));
        assert!(matches!(gone.gauge, Some(GaugeMove::Regressed { .. })));
        assert_eq!(watermarks(&backlog), ["0c"]);
    }

    #[test]
    fn backup_younger_than_the_delay_is_not_a_candidate() {
        let d = Case {
            backups: vec![backup("0a", 59)],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(BackupTooRecent));
        let exactly = Case {
            backups: vec![backup("0a", 60)],
            ..ready()
        };
        assert_eq!(exactly.decide(), purge("0a"));
    }

    #[test]
    fn newest_aged_backup_wins_over_a_newer_young_one() {
        let d = Case {
            backups: vec![backup("0a", 120), backup("0b", 10)],
            subscribers: vec![sub("0b")],
            ..case()
        }
        .decide();
        assert_eq!(d, purge("0a"));
    }

    #[test]
    fn backup_time_in_the_future_is_not_aged() {
        let d = Case {
            backups: vec![Backup {
                watermark: wm("0a"),
                backed_up_at: wall(NOW + 3600),
            }],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(BackupTooRecent));
    }

    // Rule e: subscribers.

    #[test]
    fn without_subscribers_after_grace_purges_once_the_last_one_had_its_grace() {
        let after_grace = |subscribers: Vec<Subscriber>| Case {
            without_subscribers: WithoutSubscribers::AfterGrace,
            subscribers,
            ..ready()
        };
        // Nobody ever relayed: the backup alone vouches for the replication-manager.
        assert_eq!(after_grace(vec![]).decide(), purge("0a"));
        // One left 5 s ago (grace 30 s): it may come back from its ack.
        assert_eq!(
            after_grace(vec![departed("0a", 5)]).decide(),
            Decision::Hold(NoSubscribers)
        );
        // Gone for longer than the grace: forgotten.
        assert_eq!(after_grace(vec![departed("09", 31)]).decide(), purge("0a"));
        // A sidecar up for less than the grace waits for the subscribers of its previous run: its start-up wait
        // covers the grace.
        let young = Case {
            started: NOW - 29,
            delay: 20,
            backups: vec![backup("0a", 120)],
            ..after_grace(vec![])
        };
        assert_eq!(young.decide(), Decision::Hold(StartingUp));
        assert_eq!(
            Case {
                started: NOW - 30,
                ..young
            }
            .decide(),
            purge("0a")
        );
        // Connected subscribers still bound the purge as always.
        let behind = Case {
            backups: vec![backup("0a", 300), backup("0c", 200)],
            ..after_grace(vec![sub("0b")])
        };
        assert_eq!(behind.decide(), purge_at_ack("0a", "0b"));
    }

    #[test]
    fn no_connected_subscriber_holds_even_with_a_departed_one_in_its_grace() {
        let none = Case {
            subscribers: vec![],
            ..ready()
        };
        assert_eq!(none.decide(), Decision::Hold(NoSubscribers));
        let only_departed = Case {
            subscribers: vec![departed("0a", 5)],
            ..ready()
        };
        assert_eq!(only_departed.decide(), Decision::Hold(NoSubscribers));
    }

    #[test]
    fn holds_when_a_subscriber_is_behind_every_aged_backup() {
        let d = Case {
            subscribers: vec![sub("0a"), sub("09")],
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(SubscriberBehind));
    }

    #[test]
    fn slow_subscriber_lowers_the_purge_to_an_older_backup() {
        let d = Case {
            backups: vec![backup("0a", 300), backup("0c", 200), backup("0e", 100)],
            subscribers: vec![sub("0e"), sub("0d")],
            ..case()
        }
        .decide();
        assert_eq!(d, purge_at_ack("0c", "0d"));
    }

    #[test]
    fn departed_subscriber_within_the_grace_still_bounds_the_purge() {
        let d = Case {
            backups: vec![backup("0a", 300), backup("0c", 200)],
            subscribers: vec![sub("0c"), departed("0b", 29)],
            ..case()
        }
        .decide();
        assert_eq!(d, purge_at_ack("0a", "0b"));
    }

    #[test]
    fn departed_subscriber_outside_the_grace_is_ignored() {
        let d = Case {
            backups: vec![backup("0a", 300), backup("0c", 200)],
            subscribers: vec![sub("0c"), departed("0b", 30)],
            ..case()
        }
        .decide();
        assert_eq!(d, purge("0c"));
    }

    // Rule g: replica version.

    #[test]
    fn subscriber_at_its_replica_version_holds_even_where_acks_allow() {
        // Purging below RV itself would pass the ack rule; rule g alone holds it.
        let d = Case {
            backups: vec![backup(RV, 120)],
            subscribers: vec![sub("0a"), sub(RV)],
            ..case()
        }
        .decide();
        assert_eq!(d, Decision::Hold(SubscriberAtReplicaVersion));
    }

    #[test]
    fn departed_subscriber_at_replica_version_holds_only_within_the_grace() {
        let within = Case {
            subscribers: vec![sub("0a"), departed(RV, 10)],
            ..ready()
        };
        assert_eq!(within.decide(), Decision::Hold(SubscriberAtReplicaVersion));
        let after = Case {
            subscribers: vec![sub("0a"), departed(RV, 31)],
            ..ready()
        };
        assert_eq!(after.decide(), purge("0a"));
    }

    // Rule f: progress.

    #[test]
    fn holds_when_nothing_new_was_backed_up_since_the_last_purge() {
        let d = Case {
            last_purged: Some(wm("0a")),
            ..ready()
        }
        .decide();
        assert_eq!(d, Decision::Hold(NothingNew));
    }

    #[test]
    fn purges_a_backup_newer_than_the_last_purge() {
        let d = Case {
            backups: vec![backup("0a", 300), backup("0b", 200)],
            subscribers: vec![sub("0b")],
            last_purged: Some(wm("0a")),
            ..case()
        }
        .decide();
        assert_eq!(d, purge("0b"));
    }

    #[test]
    fn an_already_purged_backup_does_not_hide_the_real_obstacle() {
        // "0a" was purged last time and is still tracked; it must not turn the reason into NothingNew.
        let too_recent = Case {
            backups: vec![backup("0a", 300), backup("0b", 10)],
            subscribers: vec![sub("0b")],
            last_purged: Some(wm("0a")),
            ..case()
        };
        assert_eq!(too_recent.decide(), Decision::Hold(BackupTooRecent));
        let behind = Case {
            backups: vec![backup("0a", 300), backup("0b", 200)],
            subscribers: vec![sub("0a")],
            last_purged: Some(wm("0a")),
            ..case()
        };
        assert_eq!(behind.decide(), Decision::Hold(SubscriberBehind));
        let above_floor = Case {
            backups: vec![backup("0a", 300), backup("0b", 200)],
            subscribers: vec![sub("0b")],
            reservations: vec![reservation("t1", Some("0a"))],
            last_purged: Some(wm("0a")),
            ..case()
        };
        assert_eq!(above_floor.decide(), Decision::Hold(ReservationFloor));
    }

    // Watermark ordering.

    #[test]
    fn watermarks_compare_byte_wise_across_lengths() {
        // "0z" (35) < "110" (36): byte-wise order is numeric order for lexi-versions.
        let d = Case {
            backups: vec![backup("110", 100), backup("0z", 200)],
            subscribers: vec![sub("0z")],
            ..case()
        }
        .decide();
        assert_eq!(d, purge_at_ack("0z", "0z"));
        let caught_up = Case {
            backups: vec![backup("110", 100), backup("0z", 200)],
            subscribers: vec![sub("110")],
            last_purged: Some(wm("0z")),
            ..case()
        };
        assert_eq!(caught_up.decide(), purge("110"));
    }

    fn seen(backups: &[Backup]) -> Vec<(&str, SystemTime)> {
        backups
            .iter()
            .map(|b| (b.watermark.as_str(), b.backed_up_at))
            .collect()
    }

    #[test]
    fn newest_backup_is_the_byte_wise_maximum() {
        let mut backlog = Backlog::default();
        assert_eq!(backlog.newest(), None);
        backlog.record(seen(&[backup("0z", 3), backup("110", 2), backup("09", 1)]));
        assert_eq!(backlog.newest(), Some(&backup("110", 2)));
    }

    #[test]
    fn first_sighting_of_a_watermark_wins() {
        let mut backlog = Backlog::default();
        assert_eq!(backlog.record(seen(&[backup("0a", 300)])), 1);
        assert_eq!(
            backlog.record(seen(&[backup("0a", 200), backup("0b", 100)])),
            1
        );
        assert_eq!(backlog.backups(), [backup("0a", 300), backup("0b", 100)]);
    }

    #[test]
    fn nothing_at_or_below_the_last_purge_is_tracked_again() {
        let mut backlog = Backlog::default();
        backlog.record(seen(&[backup("0a", 3), backup("0b", 2), backup("0c", 1)]));
        backlog.purged("0b");
        assert_eq!(backlog.last_purged(), Some("0b"));
        let left: Vec<_> = backlog
            .backups()
            .iter()
            .map(|b| b.watermark.as_str())
            .collect();
        assert_eq!(left, ["0b", "0c"]);
        assert_eq!(
            backlog.record(seen(&[backup("0a", 9), backup("0b", 9), backup("0d", 9)])),
            1
        );
        // Byte-wise order: "110" (36) is after "0z" (35).
        backlog.purged("0z");
        assert_eq!(backlog.record(seen(&[backup("110", 10)])), 1);
    }

    #[test]
    fn a_running_purge_stops_at_the_lowest_floor_or_at_once() {
        use ReservationMode::{Pause, Pin};
        assert_eq!(ceiling(Pin, &[]), Ceiling::None);
        assert_eq!(ceiling(Pause, &[]), Ceiling::None);
        let floored = [reservation("c", Some("0c")), reservation("e", Some("0e"))];
        assert_eq!(ceiling(Pin, &floored), Ceiling::Below("0c".into()));
        // Mode pause: any open reservation pauses cleanup, a running purge included.
        assert_eq!(ceiling(Pause, &floored), Ceiling::Everything);
        let floorless = [reservation("c", Some("0c")), reservation("early", None)];
        assert_eq!(ceiling(Pin, &floorless), Ceiling::Everything);
    }

    #[test]
    fn a_running_purge_also_stops_at_the_lowest_tracked_ack() {
        use ReservationMode::{Pause, Pin};
        let grace = Duration::from_secs(30);
        let ceiling = |mode, reservations: &[HeldReservation], subscribers: &[Subscriber]| {
            purge_ceiling(mode, reservations, subscribers, at(NOW), grace)
        };
        // A v4 view-syncer caught up from 0b, below a purge running towards 0d, and its reservation ended.
        let behind = [sub("0e"), sub("0b")];
        assert_eq!(ceiling(Pin, &[], &behind), Ceiling::Below("0b".into()));
        // Departed within the grace it still counts; past it, not.
        assert_eq!(
            ceiling(Pin, &[], &[sub("0e"), departed("0b", 29)]),
            Ceiling::Below("0b".into())
        );
        assert_eq!(
            ceiling(Pin, &[], &[sub("0e"), departed("0b", 30)]),
            Ceiling::Below("0e".into())
        );
        assert_eq!(ceiling(Pin, &[], &[]), Ceiling::None);
        // The lower of the floors and the acks; a reservation that protects everything still stops it.
        let floored = [reservation("c", Some("0c"))];
        assert_eq!(ceiling(Pin, &floored, &behind), Ceiling::Below("0b".into()));
        assert_eq!(
            ceiling(Pin, &floored, &[sub("0e")]),
            Ceiling::Below("0c".into())
        );
        assert_eq!(ceiling(Pause, &floored, &behind), Ceiling::Everything);
        assert_eq!(
            ceiling(Pin, &[reservation("early", None)], &behind),
            Ceiling::Everything
        );
    }

    #[test]
    fn reservations_show_as_task_and_floor() {
        assert_eq!(reservation("a", Some("0c")).to_string(), "a=0c");
        assert_eq!(reservation("b", None).to_string(), "b=none");
    }

    // PROTOCOL.md §9.3, adapted: the sidecar starts with the RM restore at 00:00 with a 4 min delay; litestream
    // uploads W1="0w" at 00:10; V reserves at 00:12 and subscribes at 00:19 (the delay becomes 7 min).
    #[test]
    fn worked_timeline() {
        let min = |m: u64| m * 60;
        let timeline = |now: u64, delay: u64, mode, reservations, subscribers| {
            Case {
                now,
                started: 0,
                delay,
                mode,
                backups: vec![Backup {
                    watermark: wm("0w"),
                    backed_up_at: wall(min(10)),
                }],
                reservations,
                subscribers,
                ..case()
            }
            .decide()
        };
        let rm_backup = || sub("0x");
        let v_reserved = || vec![reservation("v", Some("0w"))];
        for mode in [ReservationMode::Pin, ReservationMode::Pause] {
            // 00:03: still starting up.
            let d = timeline(min(3), min(4), mode, vec![], vec![rm_backup()]);
            assert_eq!(d, Decision::Hold(StartingUp));
            // 00:13, V reserving: W1 is 3 min old.
            let d = timeline(min(13), min(4), mode, v_reserved(), vec![rm_backup()]);
            let expected = match mode {
                ReservationMode::Pin => BackupTooRecent,
                ReservationMode::Pause => ReservationsOpen,
            };
            assert_eq!(d, Decision::Hold(expected));
            // 00:15, V restoring: pin may purge below V's floor; pause waits for V (Zero's behaviour).
            let d = timeline(min(15), min(4), mode, v_reserved(), vec![rm_backup()]);
            let expected = match mode {
                ReservationMode::Pin => purge("0w"),
                ReservationMode::Pause => Decision::Hold(ReservationsOpen),
            };
            assert_eq!(d, expected);
            // 00:20: V subscribed at W1, its reservation ended, the delay is 7 min; W1 (00:10) is aged.
            let d = timeline(min(20), min(7), mode, vec![], vec![rm_backup(), sub("0w")]);
            assert_eq!(d, purge("0w"));
        }
    }

    #[test]
    fn hold_reasons_have_distinct_labels_in_evaluation_order() {
        let labels: std::collections::HashSet<_> =
            HoldReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), HoldReason::ALL.len());
        for reason in HoldReason::ALL {
            let label = reason.as_str();
            assert!(
                label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label}"
            );
            let phrase = reason.to_string();
            assert!(
                !phrase.is_empty() && phrase == phrase.to_lowercase(),
                "{phrase}"
            );
        }
        assert_eq!(HoldReason::ALL[0], NotRegistered);
        assert_eq!(HoldReason::ALL[3], StartingUp);
        assert_eq!(HoldReason::ALL[10], BackupUnknown);
        assert_eq!(HoldReason::ALL[11], BackupRegressed);
        assert_eq!(HoldReason::ALL[17], BackupUnverified);
        assert_eq!(HoldReason::ALL[19], SubscriberBehind);
    }

    // Property tests: a model of the monitor's view over random event sequences.

    /// The LexiVersion of `n` (PROTOCOL.md §2), to produce watermarks of varying length.
    fn lexi(n: u64) -> String {
        let mut digits = Vec::new();
        let mut rest = n;
        loop {
            digits.push(std::char::from_digit((rest % 36) as u32, 36).unwrap());
            rest /= 36;
            if rest == 0 {
                break;
            }
        }
        digits.push(std::char::from_digit(digits.len() as u32 - 1, 36).unwrap());
        digits.iter().rev().collect()
    }

    #[test]
    fn lexi_matches_the_protocol_examples() {
        assert_eq!(lexi(0), "00");
        assert_eq!(lexi(10), "0a");
        assert_eq!(lexi(35), "0z");
        assert_eq!(lexi(36), "110");
        assert_eq!(lexi(46655), "2zzz");
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// The stream advances by `step` positions.
        Commit(u64),
        /// Litestream backs up the head (after a commit when `advance`, so possibly at the replica version when
        /// not), reported `lag` seconds ago (or ahead, with clock trouble). Skipped unless newer than every backup.
        Backup {
            advance: bool,
            lag: u64,
            future: bool,
        },
        /// A reservation opens with the newest backup known now as its floor.
        Open,
        Close(usize),
        /// A subscriber connects at some position reached so far.
        Connect(usize),
        /// A connected subscriber acks some position (only a newer one moves it).
        Ack(usize, usize),
        Leave(usize),
        Advance(u64),
        /// The monitor lists the destination: its newest object `ago` seconds old (`None`: empty), or the listing
        /// fails (`ago` unused), or verification is off.
        List {
            outcome: u8,
            ago: Option<u64>,
        },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            2 => (1..400u64).prop_map(Event::Commit),
            3 => (prop::bool::weighted(0.8), 0..120u64, prop::bool::weighted(0.1))
                .prop_map(|(advance, lag, future)| Event::Backup { advance, lag, future }),
            1 => Just(Event::Open),
            2 => any::<usize>().prop_map(Event::Close),
            2 => any::<usize>().prop_map(Event::Connect),
            4 => (any::<usize>(), any::<usize>()).prop_map(|(s, p)| Event::Ack(s, p)),
            1 => any::<usize>().prop_map(Event::Leave),
            4 => (0..90u64).prop_map(Event::Advance),
            2 => (0..3u8, prop::option::weighted(0.9, 0..200u64))
                .prop_map(|(outcome, ago)| Event::List { outcome, ago }),
        ]
    }

    struct Model {
        mode: ReservationMode,
        without_subscribers: WithoutSubscribers,
        delay: Duration,
        grace: Duration,
        clock: u64,
        head: u64,
        positions: Vec<String>,
        backups: Vec<Backup>,
        reservations: Vec<HeldReservation>,
        next_task: u32,
        subscribers: Vec<Subscriber>,
        last_purged: Option<String>,
        destination: Destination,
    }

    /// The slack of every listing in the model.
    const SLACK: u64 = 60;

    impl Model {
        fn new(
            mode: ReservationMode,
            without_subscribers: WithoutSubscribers,
            delay: u64,
            grace: u64,
            head: u64,
        ) -> Self {
            Model {
                mode,
                without_subscribers,
                delay: Duration::from_secs(delay),
                grace: Duration::from_secs(grace),
                clock: 0,
                head,
                positions: vec![lexi(head)],
                backups: vec![],
                reservations: vec![],
                next_task: 0,
                subscribers: vec![],
                last_purged: None,
                destination: Destination::Unchecked,
            }
        }

        fn replica_version(&self) -> &str {
            &self.positions[0]
        }

        fn apply(&mut self, event: &Event) {
            match *event {
                Event::Commit(step) => {
                    self.head += step;
                    self.positions.push(lexi(self.head));
                }
                Event::Backup {
                    advance,
                    lag,
                    future,
                } => {
                    if advance {
                        self.head += 1;
                        self.positions.push(lexi(self.head));
                    }
                    let watermark = lexi(self.head);
                    if self
                        .backups
                        .iter()
                        .map(|b| b.watermark.as_str())
                        .max()
                        .is_some_and(|newest| newest >= watermark.as_str())
                    {
                        return;
                    }
                    let backed_up_at = if future {
                        wall(self.clock + lag + 1)
                    } else {
                        wall(self.clock.saturating_sub(lag))
                    };
                    self.backups.push(Backup {
                        watermark,
                        backed_up_at,
                    });
                }
                Event::Open => {
                    self.next_task += 1;
                    let floor = self.backups.iter().map(|b| b.watermark.clone()).max();
                    self.reservations.push(HeldReservation {
                        task_id: format!("t{}", self.next_task),
                        floor,
                    });
                }
                Event::Close(i) if !self.reservations.is_empty() => {
                    let i = i % self.reservations.len();
                    self.reservations.remove(i);
                }
                Event::Connect(p) => {
                    let acked = self.positions[p % self.positions.len()].clone();
                    let replica_version = self.replica_version().to_owned();
                    self.subscribers.push(Subscriber {
                        id: format!("vs-{}", self.subscribers.len()),
                        acked,
                        replica_version,
                        departed: None,
                        awaits_upstream: false,
                    });
                }
                Event::Ack(s, p) if !self.subscribers.is_empty() => {
                    let position = self.positions[p % self.positions.len()].clone();
                    let i = s % self.subscribers.len();
                    let subscriber = &mut self.subscribers[i];
                    if subscriber.is_connected() && position > subscriber.acked {
                        subscriber.acked = position;
                    }
                }
                Event::Leave(s) if !self.subscribers.is_empty() => {
                    let i = s % self.subscribers.len();
                    let now = at(self.clock);
                    self.subscribers[i].departed.get_or_insert(now);
                }
                Event::Advance(secs) => self.clock += secs,
                Event::List { outcome, ago } => {
                    self.destination = match outcome {
                        0 => Destination::Unchecked,
                        1 => Destination::Unreadable,
                        _ => Destination::Listed {
                            newest: ago.map(|ago| wall(self.clock.saturating_sub(ago))),
                            slack: Duration::from_secs(SLACK),
                        },
                    }
                }
                Event::Close(_) | Event::Ack(..) | Event::Leave(_) => {}
            }
        }

        fn inputs(&self) -> Inputs<'_> {
            Inputs {
                now: at(self.clock),
                wall_now: wall(self.clock),
                started: at(0),
                ownership: Ownership::Unchecked,
                cleanup_delay: self.delay,
                reconnect_grace: self.grace,
                mode: self.mode,
                without_subscribers: self.without_subscribers,
                backups: &self.backups,
                reservations: &self.reservations,
                subscribers: &self.subscribers,
                last_purged: self.last_purged.as_deref(),
                // Backups only ever advance in this model: the gauge is at its highest.
                highest_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
                current_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
                destination: self.destination,
                guards: Guards::default(),
            }
        }

        fn tracked(&self) -> impl Iterator<Item = &Subscriber> {
            let now = at(self.clock);
            self.subscribers.iter().filter(move |s| match s.departed {
                None => true,
                Some(d) => now - d < self.grace,
            })
        }

        fn is_aged(&self, backup: &Backup) -> bool {
            backup.backed_up_at + self.delay <= wall(self.clock)
        }

        /// Every rule, written independently of `decide`, for purging below `w`.
        fn violations(&self, w: &str) -> Vec<&'static str> {
            let mut broken = vec![];
            if Duration::from_secs(self.clock) < self.delay.max(self.grace) {
                broken.push("purge before uptime reached the delay and the reconnect grace");
            }
            if self.mode == ReservationMode::Pause && !self.reservations.is_empty() {
                broken.push("purge in pause mode with a reservation open");
            }
            for r in &self.reservations {
                match &r.floor {
                    None => broken.push("purge with a floorless reservation open"),
                    Some(floor) if w > floor.as_str() => {
                        broken.push("purge above a reservation floor")
                    }
                    Some(_) => {}
                }
            }
            if !self.subscribers.iter().any(Subscriber::is_connected) {
                match self.without_subscribers {
                    WithoutSubscribers::Hold => broken.push("purge without a connected subscriber"),
                    WithoutSubscribers::AfterGrace => {
                        if self.tracked().next().is_some() {
                            broken.push("purge while a departed subscriber may still come back");
                        }
                        if Duration::from_secs(self.clock) < self.grace {
                            broken.push("purge without subscribers before the grace since start");
                        }
                    }
                }
            }
            for s in self.tracked() {
                if w > s.acked.as_str() {
                    broken.push("purge above a tracked subscriber's ack");
                }
                if s.acked == s.replica_version {
                    broken.push("purge with a tracked subscriber at the replica version");
                }
            }
            if !self
                .backups
                .iter()
                .any(|b| b.watermark == w && self.is_aged(b))
            {
                broken.push("purge at a watermark that is not an aged backup");
            }
            if self.last_purged.as_deref().is_some_and(|last| w <= last) {
                broken.push("purge not above the last purge");
            }
            let claimed = self.backups.iter().find(|b| b.watermark == w);
            match (self.destination, claimed) {
                (Destination::Unchecked, _) | (_, None) => {}
                (Destination::Unreadable, _) => broken.push("purge on a failed listing"),
                (Destination::Listed { newest: None, .. }, _) => {
                    broken.push("purge with an empty destination")
                }
                (
                    Destination::Listed {
                        newest: Some(n), ..
                    },
                    Some(b),
                ) => {
                    if n + Duration::from_secs(SLACK) < b.backed_up_at {
                        broken.push("purge at a claim with no object behind it")
                    }
                }
            }
            broken
        }

        /// The bound names a constraint that really lowered the purge, and nothing else did after it.
        fn check_bound(&self, before: &str, bound: &Bound) -> Result<(), TestCaseError> {
            let newest_candidate = self
                .backups
                .iter()
                .filter(|b| self.is_aged(b))
                .filter(|b| {
                    self.last_purged
                        .as_deref()
                        .is_none_or(|l| b.watermark.as_str() > l)
                })
                .map(|b| b.watermark.as_str())
                .max();
            match bound {
                Bound::Backup => {
                    prop_assert_eq!(Some(before), newest_candidate, "bound by the backup alone")
                }
                Bound::Destination => {
                    prop_assert!(
                        Some(before) < newest_candidate,
                        "the destination lowered it"
                    );
                    prop_assert!(!self
                        .violations(newest_candidate.unwrap_or_default())
                        .is_empty());
                }
                Bound::Reservation { task_id, floor } => {
                    prop_assert!(
                        before <= floor.as_str() && newest_candidate > Some(floor.as_str())
                    );
                    prop_assert!(self
                        .reservations
                        .iter()
                        .any(|r| &r.task_id == task_id && r.floor.as_ref() == Some(floor)));
                }
                Bound::Subscriber { acked, .. } => {
                    prop_assert!(
                        before <= acked.as_str() && newest_candidate > Some(acked.as_str())
                    );
                    prop_assert!(self.tracked().any(|s| &s.acked == acked));
                }
            }
            Ok(())
        }

        fn check(&mut self) -> Result<(), TestCaseError> {
            let decision = decide(&self.inputs());
            // The largest backup that every rule allows, if any.
            let best = self
                .backups
                .iter()
                .map(|b| b.watermark.as_str())
                .filter(|w| self.violations(w).is_empty())
                .max()
                .map(str::to_owned);
            match decision {
                Decision::Purge { before, bound } => {
                    let broken = self.violations(&before);
                    self.check_bound(&before, &bound)?;
                    prop_assert!(broken.is_empty(), "Purge({}) breaks {:?}", before, broken);
                    prop_assert_eq!(Some(&before), best.as_ref(), "not the largest safe backup");
                    self.last_purged = Some(before);
                }
                Decision::Hold(reason) => {
                    prop_assert_eq!(best, None, "held ({}) although a backup was safe", reason);
                }
            }
            Ok(())
        }
    }

    fn mode() -> impl Strategy<Value = ReservationMode> {
        prop_oneof![Just(ReservationMode::Pin), Just(ReservationMode::Pause)]
    }

    fn without_subscribers() -> impl Strategy<Value = WithoutSubscribers> {
        prop_oneof![
            Just(WithoutSubscribers::Hold),
            Just(WithoutSubscribers::AfterGrace)
        ]
    }

    proptest! {
        #[test]
        fn decisions_over_random_histories_are_safe_and_maximal(
            mode in mode(),
            without in without_subscribers(),
            delay in 30..150u64,
            grace in 0..60u64,
            start in 1..1400u64,
            events in prop::collection::vec(event(), 1..100),
        ) {
            let mut model = Model::new(mode, without, delay, grace, start);
            model.check()?;
            for event in &events {
                model.apply(event);
                model.check()?;
            }
        }

        #[test]
        fn purges_the_newest_aged_backup_when_nothing_stands_in_the_way(
            mode in mode(),
            delay in 30..3600u64,
            ages in prop::collection::vec(0..7200u64, 1..6),
            start in 1..3000u64,
            steps in prop::collection::vec(1..2000u64, 6),
            uptime_extra in 0..3600u64,
        ) {
            // Backups at increasing watermarks, oldest first; at least the first is aged.
            let mut ages = ages;
            ages.sort_unstable_by(|a, b| b.cmp(a));
            ages[0] += delay;
            let now = 20_000;
            let mut head = start;
            let backups: Vec<Backup> = ages
                .iter()
                .zip(&steps)
                .map(|(&age, &step)| {
                    head += step;
                    Backup { watermark: lexi(head), backed_up_at: wall(now - age) }
                })
                .collect();
            let newest_aged = backups
                .iter()
                .zip(&ages)
                .rev()
                .find(|(_, age)| **age >= delay)
                .map(|(b, _)| b.watermark.clone())
                .unwrap();
            let subscribers = [Subscriber {
                id: "vs".into(),
                acked: lexi(head),
                replica_version: lexi(start),
                departed: None,
                awaits_upstream: false,
            }];
            let d = decide(&Inputs {
                now: at(now),
                wall_now: wall(now),
                started: at(now - delay - uptime_extra),
                cleanup_delay: Duration::from_secs(delay),
                reconnect_grace: Duration::from_secs(30),
                mode,
                without_subscribers: WithoutSubscribers::Hold,
                backups: &backups,
                reservations: &[],
                subscribers: &subscribers,
                last_purged: None,
                ownership: Ownership::Unchecked,
                highest_backup: backups.last().map(|b| b.watermark.as_str()),
                current_backup: backups.last().map(|b| b.watermark.as_str()),
                destination: Destination::Unchecked,
                guards: Guards::default(),
            });
            prop_assert_eq!(d, Decision::Purge { before: newest_aged, bound: Bound::Backup });
        }
    }
}
