//! The cleanup loop, the one place where I/O and the policy meet. Every `check_interval` it observes (scrapes
//! litestream into the [`Backlog`], reads the registration, reservations and subscriber acks), asks
//! [`cleanup::decide`], and acts: purges the change log when the answer is yes, and records and logs what happened.
//! One purge at a time: the loop awaits each before the next tick.
//!
//! Failures never purge: a scrape that fails keeps what is known and tries again next interval; a purge that
//! fails leaves the last purged watermark where it was.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Level};

use crate::cleanup::change_db::{ChangeDb, DbError, Expected, PurgeOutcome, PurgeTarget};
use crate::cleanup::config::{CleanupConfig, Requires};
use crate::cleanup::discovery::DiscoveryConfig;
use crate::cleanup::reservations::Registry;
use crate::cleanup::status::{
    layout_problem, ChangeLogReading, HeldSince, LastPurge, Loudness, PurgeFailure, StatusHandle,
    RECENT_BACKUPS,
};
use crate::cleanup::subscribers::Subscribers;
use crate::cleanup::unservable::{self, LogWatch, Reason, Unservable};
use crate::cleanup::{
    self, Backlog, Backup, Decision, DestinationCheck, GaugeMove, HeldReservation, HoldReason,
    Inputs, Ownership, Subscriber,
};
use crate::litestream::config::{BackupConfig, LitestreamConfig};
use crate::litestream::destination::{self, ErrorKind, ListError};
use crate::litestream::page::scrape;
use crate::litestream::Filter;
use crate::net::client::HttpClient;

/// A warning repeated at most this often while the same problem persists.
const WARN_EVERY: Duration = Duration::from_secs(300);
/// Reading the change log's size never delays a check by more than this.
const SIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a hold sized by the replica lasts while its size is unknown: until it is known (a year stands in for
/// "not yet", and every check computes it afresh).
const UNKNOWN_SIZE_HOLD: Duration = Duration::from_secs(365 * 24 * 3600);

/// How far a running purge may still go, asked before each of its batches. Reservations are read first, then
/// subscribers, as [`Monitor::run`] gathers them: a relay registers its subscriber before it ends the reservation
/// the subscription takes over from, so a restore that finishes between the two reads is seen in one of them.
pub fn purge_limit(
    mode: cleanup::ReservationMode,
    registry: &Registry,
    subscribers: &Subscribers,
    reconnect_grace: Duration,
) -> cleanup::Ceiling {
    let reservations = registry.for_policy();
    let now = Instant::now();
    let tracked = subscribers.for_policy(now, reconnect_grace);
    cleanup::purge_ceiling(mode, &reservations, &tracked, now, reconnect_grace)
}

/// Logs a recurring problem once when it starts or changes, then at most every [`WARN_EVERY`], and once when it
/// clears: an operator sees every transition without a line per tick.
#[derive(Default)]
struct Throttle {
    current: Option<String>,
    last_warned: Option<Instant>,
}

impl Throttle {
    fn failed(&mut self, what: &str, problem: String, level: Level, now: Instant) {
        let changed = self.current.as_deref() != Some(problem.as_str());
        let due = self
            .last_warned
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY);
        if changed || due {
            if level == Level::ERROR {
                error!(error = %problem, "{what}");
            } else {
                warn!(error = %problem, "{what}");
            }
            self.last_warned = Some(now);
        } else {
            debug!(error = %problem, "{what}");
        }
        self.current = Some(problem);
    }

    /// Like [`Throttle::failed`] at warn, but said only when the problem starts or changes: for a check the
    /// sidecar can do without, whose failure an operator may choose to leave as it is.
    fn failed_once(&mut self, what: &str, problem: String) {
        if self.current.as_deref() != Some(problem.as_str()) {
            warn!(error = %problem, "{what}");
        } else {
            debug!(error = %problem, "{what}");
        }
        self.current = Some(problem);
    }

    fn succeeded(&mut self, what: &str) {
        if self.current.take().is_some() {
            info!("{what}");
            self.last_warned = None;
        }
    }
}

pub struct Monitor {
    pub registry: Registry,
    pub subscribers: Subscribers,
    pub change_db: ChangeDb,
    pub status: StatusHandle,
    scraper: HttpClient,
    filter: Filter,
    check_interval: Duration,
    reconnect_grace: Duration,
    mode: cleanup::ReservationMode,
    without_subscribers: cleanup::WithoutSubscribers,
    enabled: bool,
    batch_rows: i64,
    /// When the sidecar started: restores that began before a restart are covered by waiting the cleanup delay.
    started: Instant,
    discovery_mode: crate::cleanup::discovery::DiscoveryMode,
    discovery: crate::cleanup::discovery::StateHandle,
    /// The address purges check `ownerAddress` against in modes `verify` and `adopt`.
    advertise_address: String,
    /// The replication-manager's own `ownerAddress`, which purges check in mode `owner`.
    upstream_address: String,
    /// Where the shard's memory comes from once the keeper has read it from the change DB; `None`: it is
    /// [`Monitor::resumed`] already.
    resumed_from: Option<tokio::sync::watch::Receiver<Option<Resumed>>>,
    /// What the shard remembers (the last purge, the highest backup, the replica version).
    resumed: Resumed,
    restore_limit: crate::cleanup::config::RestoreLimit,
    hold_without_state: crate::cleanup::config::RestoreLimit,
    /// The wall clock at an instant of this run: the base of [`cleanup::Guards::steady_now`].
    anchor: (Instant, SystemTime),
    /// `None`: `backup.verify` is off. `Err`: the client could not be built (an unusable `AWS_*` variable, say),
    /// reported as a failed listing at every check.
    destination: Option<Result<destination::Destination, String>>,
    stale_after: Duration,
    requires: Requires,
    /// How long a relayed commit may stay absent from the change log before the log counts as not written.
    log_unwritten_after: Duration,
}

/// What one check saw besides the backlog, in the policy's own types.
struct Gathered {
    ownership: Ownership,
    /// In mode `owner`, the replication-manager task that held the change log when the ownership was read: every
    /// purge batch checks it still does.
    owner: Option<String>,
    cleanup_delay: Duration,
    reservations: Vec<HeldReservation>,
    subscribers: Vec<Subscriber>,
    /// When the replica was last reset in this run.
    reset_at: Option<SystemTime>,
    /// The replica version this check read: a purge it decides stops at a batch that finds another.
    replica_version: Option<String>,
}

impl Gathered {
    /// `task=floor` for each reservation, for logs.
    fn reservation_list(&self) -> String {
        let list: Vec<String> = self.reservations.iter().map(ToString::to_string).collect();
        list.join(",")
    }
}

/// What the loop remembers between checks to log each change once.
#[derive(Default)]
struct Said {
    scrape_problem: Throttle,
    listing_problem: Throttle,
    layout_problem: Throttle,
    last_hold: Option<HoldReason>,
    replica_problem: Throttle,
    /// One per [`Reason`], in the order of [`Reason::ALL`].
    refused: [Throttle; 3],
    replicas_problem: Throttle,
}

impl Said {
    fn refused(&mut self, reason: Reason) -> &mut Throttle {
        let at = Reason::ALL
            .iter()
            .position(|r| *r == reason)
            .expect("every reason is in ALL");
        &mut self.refused[at]
    }
}

/// What the previous run left: where its purges and litestream's gauge had got to, for which replica, and whether
/// it said which restores were in flight.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    pub last_purge: Option<Backup>,
    pub highest_backup: Option<String>,
    pub replica_version: Option<String>,
    /// Since when nothing says which restores were in flight (a start without a state file, or with one that did
    /// not keep reservations): cleanup holds for `cleanup.hold_without_state` from then, across restarts too.
    pub restores_unknown_since: Option<SystemTime>,
}

/// What a running purge compares litestream's page with before each batch.
struct GaugeWatch {
    highest: Option<String>,
    process_started: Option<f64>,
    reset_at: Option<SystemTime>,
    /// Why the gauge stopped the purge, once it has.
    stopped: std::sync::Mutex<Option<String>>,
}

/// What the loop knows of litestream's position between checks.
#[derive(Default)]
struct Position {
    /// `process_start_time_seconds` of the last page that had it.
    process_started: Option<f64>,
    /// Why the position is unknown, while it is.
    unknown: Option<String>,
    /// The largest database on the last page that said.
    db_bytes: Option<u64>,
    /// No page with a sample has been read in this run yet.
    first: bool,
}

/// The replica the change log belongs to, and its last change.
#[derive(Default)]
struct Replica {
    version: Option<String>,
    reset_at: Option<SystemTime>,
}

/// The parts of the config the loop acts on: its own section and those whose keys decide what it reads and checks.
#[derive(Clone, Copy)]
pub struct MonitorConfig<'a> {
    pub cleanup: &'a CleanupConfig,
    pub litestream: &'a LitestreamConfig,
    pub backup: &'a BackupConfig,
    pub discovery: &'a DiscoveryConfig,
    /// `upstream.advertised_address`: what `ownerAddress` says while the replication-manager holds it.
    pub upstream_address: &'a str,
}

impl Monitor {
    pub fn new(
        config: MonitorConfig<'_>,
        registry: Registry,
        subscribers: Subscribers,
        change_db: ChangeDb,
        status: StatusHandle,
        started: Instant,
        discovery: crate::cleanup::discovery::StateHandle,
    ) -> Self {
        let litestream = &config.litestream;
        let scraper = HttpClient::new(
            litestream.metrics_url.clone(),
            litestream.scrape_timeout,
            litestream.max_page_bytes,
        )
        .expect("metrics_url was validated as an http URL");
        Self {
            registry,
            subscribers,
            change_db,
            status,
            scraper,
            filter: litestream.filter.clone(),
            check_interval: litestream.check_interval,
            reconnect_grace: config.cleanup.reconnect_grace,
            mode: config.cleanup.reservations,
            without_subscribers: config.cleanup.without_subscribers,
            enabled: config.cleanup.enabled,
            batch_rows: config.cleanup.batch_rows,
            started,
            discovery_mode: config.discovery.mode,
            discovery,
            advertise_address: config.discovery.advertise_address.clone(),
            upstream_address: config.upstream_address.to_string(),
            resumed: Resumed::default(),
            resumed_from: None,
            restore_limit: config.cleanup.restore_limit,
            hold_without_state: config.cleanup.hold_without_state,
            anchor: (Instant::now(), SystemTime::now()),
            destination: config.backup.location.as_ref().map(|location| {
                destination::Destination::open(
                    location,
                    &config.backup.s3,
                    config.backup.list_timeout,
                    std::env::vars(),
                )
            }),
            stale_after: config.backup.stale_after,
            requires: config.cleanup.requires,
            log_unwritten_after: unservable::LOG_UNWRITTEN_AFTER,
        }
    }

    /// Replaces how long a relayed commit may stay out of the change log before the log counts as not written
    /// (tests shorten it instead of waiting).
    pub fn with_log_unwritten_after(mut self, after: Duration) -> Self {
        self.log_unwritten_after = after;
        self
    }

    /// Replaces the destination's client, built with `env` instead of the process environment (tests give their
    /// S3 credentials this way).
    pub fn with_backup_env(mut self, backup: &BackupConfig, env: Vec<(String, String)>) -> Self {
        if let Some(location) = backup.location.as_ref() {
            self.destination = Some(destination::Destination::open(
                location,
                &backup.s3,
                backup.list_timeout,
                env,
            ));
        }
        self
    }

    /// Continues from what the previous run left in the state file.
    pub fn resuming(mut self, resumed: Resumed) -> Self {
        self.resumed = resumed;
        self
    }

    /// Starts checking only once `resumed` has the shard's memory (the keeper reads it from the change DB): a
    /// check before it would decide without the last purge, the highest backup or the replica version.
    pub fn resuming_from(mut self, resumed: tokio::sync::watch::Receiver<Option<Resumed>>) -> Self {
        self.resumed_from = Some(resumed);
        self
    }

    /// Checks every `check_interval` until `shutdown`: observe, decide, act. A purge in progress finishes its
    /// current batch first.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backlog = Backlog::default();
        let mut replica = Replica::default();
        let mut position = Position {
            first: true,
            ..Position::default()
        };
        let mut waiting = self.resumed_from.take();
        if waiting.is_none() {
            let resumed = self.resumed.clone();
            self.resume(resumed, &mut backlog, &mut replica, &mut position);
        }
        let mut said = Said::default();
        let mut log_watch = LogWatch::default();
        if self.destination.is_some() {
            self.status.update(|s| s.backup.verifying = true);
        }
        let mut every = crate::shared::Every::new(self.check_interval);
        while every.tick(&shutdown).await {
            let now = Instant::now();
            // Checks run from the start (statuses need litestream's position), but decide nothing before the
            // shard's memory is read: the status says `loading` until then.
            let read = waiting.as_ref().and_then(|from| from.borrow().clone());
            if let Some(resumed) = read {
                waiting = None;
                self.resume(resumed, &mut backlog, &mut replica, &mut position);
            }
            self.read_replica(&mut replica, &mut backlog, &mut said, now)
                .await;
            self.read_replica_backups(&mut said, now).await;
            self.watch_log(&mut log_watch, &replica, &mut said, now)
                .await;
            match self.requires {
                Requires::Listing => {
                    self.scrape(
                        &mut backlog,
                        &mut position,
                        &mut said,
                        replica.reset_at,
                        now,
                    )
                    .await
                }
                Requires::Restore => {
                    self.read_size_of_page(&mut position).await;
                    self.take_proofs(&mut backlog, &mut position, &replica);
                }
            }
            self.claim_purger().await;
            self.read_slots(&position, &replica).await;
            let destination = self.verify(&backlog, &mut said, now).await;
            let other_generation = self.claims_of_other_generations(&backlog);
            let observed = self.gather(now, &replica);
            let guards = self.guards(now, &position, &replica);
            self.settle_unknown_restores(&guards, now);
            let decision = cleanup::decide(&Inputs {
                now,
                wall_now: SystemTime::now(),
                started: self.started,
                ownership: observed.ownership,
                cleanup_delay: observed.cleanup_delay,
                reconnect_grace: self.reconnect_grace,
                mode: self.mode,
                without_subscribers: self.without_subscribers,
                backups: backlog.backups(),
                reservations: &observed.reservations,
                subscribers: &observed.subscribers,
                last_purged: backlog.last_purged(),
                highest_backup: backlog.highest(),
                current_backup: backlog.current().map(|b| b.watermark.as_str()),
                destination,
                other_generation: &other_generation,
                guards,
            });
            debug!(
                ?decision,
                reservations = %observed.reservation_list(),
                "cleanup decision"
            );
            self.act(
                decision,
                &observed,
                &mut backlog,
                &position,
                &mut said,
                &shutdown,
            )
            .await;
            self.read_size().await;
            self.status.update(|s| s.checks += 1);
        }
    }

    /// Takes in the shard's memory. Read after this run's own first checks, it may be about another replica than
    /// the change log now holds (a resync while no sidecar ran): its watermarks are then left out, and the reset
    /// holds cleanup as a resync seen live does.
    fn resume(
        &self,
        resumed: Resumed,
        backlog: &mut Backlog,
        replica: &mut Replica,
        position: &mut Position,
    ) {
        // The next page is compared with the remembered last purge as a first page after a start is.
        position.first = true;
        match (&replica.version, &resumed.replica_version) {
            (Some(now), Some(then)) if now != then => {
                warn!(
                    remembered = %then,
                    current = %now,
                    "the shard's memory is of another replica: a resync happened while no sidecar ran; cleanup \
                     holds until a backup of this one has aged"
                );
                replica.reset_at = Some(SystemTime::now());
            }
            _ => {
                backlog.resume(
                    resumed.last_purge.as_ref().map(|b| b.watermark.as_str()),
                    resumed.highest_backup.as_deref(),
                );
                if replica.version.is_none() {
                    replica.version = resumed.replica_version.clone();
                }
                self.status.update(|s| {
                    s.purged_through = resumed.last_purge.clone();
                    s.highest_backup = backlog.highest().map(str::to_owned);
                    if s.replica_version.is_none() {
                        s.replica_version = resumed.replica_version.clone();
                    }
                });
            }
        }
        self.status
            .update(|s| s.restores_unknown_since = resumed.restores_unknown_since);
    }

    /// The guards of a check at `now` (see [`cleanup::Guards`]).
    fn guards(&self, now: Instant, position: &Position, replica: &Replica) -> cleanup::Guards {
        let (
            standby,
            memory,
            restores_unknown_since,
            refused,
            slots_unread,
            restored_less,
            drill_disk,
        ) = self.status.read(|s| {
            (
                s.standby,
                s.memory,
                s.restores_unknown_since,
                !s.unservable.is_empty(),
                s.slots_problem.is_some(),
                s.drills.restored_less.is_some(),
                s.drills.drives_cleanup && s.drills.disk_short().is_some(),
            )
        });
        // Slots that cannot be read are memory that cannot be read: nothing says which restores are in flight.
        let memory = if slots_unread && memory == cleanup::Memory::Kept {
            cleanup::Memory::Unreadable
        } else {
            memory
        };
        let (anchor, anchor_wall) = self.anchor;
        // While the replica's size is unknown, "auto" has no end to give the hold: a restore of a replica of
        // unknown size may still be running.
        let hold_without_state = self
            .hold_without_state
            .known_for(position.db_bytes)
            .unwrap_or(UNKNOWN_SIZE_HOLD);
        cleanup::Guards {
            unservable: refused,
            standby: standby == Some(true),
            memory,
            restores_unknown_until: restores_unknown_since.map(|since| {
                // From this run's start at the latest, so that tests and restarts that date the start back agree.
                let since = since.min(anchor_wall);
                let remaining = (since + hold_without_state)
                    .duration_since(anchor_wall)
                    .unwrap_or_default();
                anchor.min(self.started) + remaining
            }),
            reset_at: replica.reset_at,
            replica_unknown: replica.version.is_none(),
            position_unknown: position.unknown.is_some(),
            restored_less,
            drill_disk,
            steady_now: anchor_wall.checked_add(now.saturating_duration_since(anchor)),
        }
    }

    /// Records what the check for `reason` found (`None`: it does not apply now), logs it (at error when it starts
    /// or changes and every 5 minutes while it lasts, at info when it clears), and tells the registry, which
    /// withholds v4+ statuses while any refusal stands.
    fn refuse(&self, reason: Reason, found: Option<Unservable>, said: &mut Said, now: Instant) {
        let throttle = said.refused(reason);
        match &found {
            Some(found) => throttle.failed(
                &format!(
                    "refused ({reason}): the sidecar cannot serve this deployment; cleanup and v4+ snapshot \
                     statuses held"
                ),
                found.to_string(),
                Level::ERROR,
                now,
            ),
            None => throttle.succeeded(&format!(
                "no longer refused ({reason}): {}",
                match reason {
                    Reason::Ltx => "the backup destination holds no litestream 0.5 files any more",
                    Reason::BackupPath =>
                        "no replica is recorded backing up to a path of its own or with litestream 0.5 any more",
                    Reason::LogNotWritten =>
                        "the change log holds the relayed commit it lacked, or the replica was resynced",
                }
            )),
        }
        let mut refused = false;
        self.status.update(|s| {
            s.unservable.set(reason, found, SystemTime::now());
            refused = !s.unservable.is_empty();
        });
        self.registry.set_unservable(refused);
    }

    /// Reads the upstream's `replicas` table where the change DB's connection sees it: a replica recorded with a
    /// path of its own or a v5 backup is a refusal. Absent (another database, Zero before 1.10), it refuses nothing.
    /// A failed read changes nothing: what the last one found stands.
    async fn read_replica_backups(&self, said: &mut Said, now: Instant) {
        let read = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.replica_backups()).await;
        let rows = match read {
            Ok(Ok(rows)) => rows,
            Ok(Err(err)) if err.class().is_permanent() => {
                said.replicas_problem.failed_once(
                    &format!(
                        "cannot read {}, where Zero 1.10 records replicas that back up with litestream 0.5; \
                         grant the sidecar's role SELECT on it, or leave it: the listing and the change log still \
                         tell such a deployment",
                        self.change_db.replicas_table()
                    ),
                    err.to_string(),
                );
                return;
            }
            Ok(Err(err)) => {
                debug!(error = %err, "replicas table not read: the change DB did not answer");
                return;
            }
            Err(_) => return,
        };
        said.replicas_problem.succeeded(&format!(
            "{} readable again",
            self.change_db.replicas_table()
        ));
        let found =
            rows.and_then(|rows| unservable::of_replicas(self.change_db.replicas_table(), &rows));
        self.refuse(Reason::BackupPath, found, said, now);
    }

    /// Follows the commits the relay passes on into the change log ([`LogWatch`]): one that stays out of it for
    /// `log_unwritten_after` is a refusal. A failed read changes nothing.
    async fn watch_log(
        &self,
        watch: &mut LogWatch,
        replica: &Replica,
        said: &mut Said,
        now: Instant,
    ) {
        let Some(version) = replica.version.as_deref() else {
            return;
        };
        watch.for_replica(version);
        let relayed = self.subscribers.newest_commit_of(version);
        let relayed = relayed.as_ref().map(|(w, at)| (w.as_str(), *at));
        let Some(probe) = watch
            .probe(relayed, now, SystemTime::now())
            .map(str::to_owned)
        else {
            return self.refuse(Reason::LogNotWritten, None, said, now);
        };
        let read = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.log_reaches(&probe)).await;
        let reaches = match read {
            Ok(Ok(reaches)) => reaches,
            Ok(Err(err)) => {
                debug!(error = %err, watermark = %probe, "change log not asked whether it holds a relayed commit");
                return;
            }
            Err(_) => return,
        };
        let found = watch.answer(
            reaches,
            now,
            self.log_unwritten_after,
            self.change_db.change_log_table(),
        );
        self.refuse(Reason::LogNotWritten, found, said, now);
    }

    /// Takes (or keeps) the shard's purger lock: of two sidecars for one shard only the holder purges, and the
    /// other takes over when the holder's session ends. When the change DB does not answer, the role stays as it
    /// was: no purge can run then, and each purge batch checks the lock itself.
    async fn claim_purger(&self) {
        let claimed = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.claim_purger()).await;
        let standby = match claimed {
            Ok(Ok(purger)) => purger == crate::cleanup::change_db::Purger::Standby,
            Ok(Err(err)) => {
                debug!(error = %err, "purger lock not asked about: the change DB did not answer");
                return;
            }
            Err(_) => return,
        };
        match (self.status.read(|s| s.standby), standby) {
            (Some(true) | None, false) => info!("purger lock held: this sidecar purges for the shard"),
            (Some(false) | None, true) => warn!(
                "standby: another sidecar holds the shard's purger lock; this one serves but does not purge, and \
                 takes over when the lock frees"
            ),
            _ => {}
        }
        self.status.update(|s| s.standby = Some(standby));
    }

    /// Reads every slot of the shard into the status, and which one bounds purges now; the purger also forgets the
    /// rows that bound nothing any more. A failed read holds cleanup (see [`Monitor::guards`]) until one succeeds.
    async fn read_slots(&self, position: &Position, replica: &Replica) {
        let limit_now = self.restore_limit.known_for(position.db_bytes);
        let read = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.slots(limit_now)).await;
        let slots = match read {
            Ok(Ok(slots)) => slots,
            // No connection: the readiness check and the change DB's own metric say so, and no purge can run.
            Ok(Err(err)) if err.class() == crate::cleanup::change_db::FailureClass::Unavailable => {
                debug!(error = %err, "slots not read: the change DB is not connected");
                return;
            }
            Ok(Err(err)) => {
                let problem = err.to_string();
                if self
                    .status
                    .read(|s| s.slots_problem.as_deref() != Some(problem.as_str()))
                {
                    warn!(error = %problem, "slots not read: cleanup holds until they are");
                }
                self.status.update(|s| s.slots_problem = Some(problem));
                return;
            }
            Err(_) => {
                self.status.update(|s| {
                    s.slots_problem = Some(format!(
                        "the change DB did not answer within {SIZE_TIMEOUT:?}"
                    ))
                });
                return;
            }
        };
        let bounding = crate::cleanup::slots::bounding(
            &slots,
            replica.version.as_deref(),
            self.mode == cleanup::ReservationMode::Pause,
        );
        if let Some(crate::cleanup::slots::SlotLimit::Malformed { slot, problem }) = &bounding {
            if self.status.read(|s| s.bounding_slot != bounding) {
                error!(%slot, %problem, "a slot is not well formed: cleanup holds until it is mended or expires");
            }
        }
        if self.status.read(|s| s.slots_problem.is_some()) {
            info!("slots read again");
        }
        let purger = self.status.read(|s| s.standby == Some(false));
        if purger && slots.iter().any(|s| !s.live) {
            match tokio::time::timeout(SIZE_TIMEOUT, self.change_db.forget_dead_slots(limit_now))
                .await
            {
                Ok(Ok(n)) if n > 0 => debug!(
                    forgotten = n,
                    "slots past their grace or restore limit forgotten"
                ),
                Ok(Err(err)) => debug!(error = %err, "dead slots not forgotten"),
                _ => {}
            }
        }
        self.status.update(|s| {
            s.slots = slots;
            s.bounding_slot = bounding;
            s.slots_problem = None;
        });
    }

    /// Reads the change DB's `replicaVersion`; a change is a resync, which makes every claim, the highest watermark,
    /// the last purge and the destination's listing facts about another replica. A failed read changes nothing (the purge itself re-checks the log's newest watermark).
    async fn read_replica(
        &self,
        replica: &mut Replica,
        backlog: &mut Backlog,
        said: &mut Said,
        now: Instant,
    ) {
        let read = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.replica_version()).await;
        let version = match read {
            Ok(Ok(Some(version))) => version,
            Ok(Ok(None)) => return,
            Ok(Err(err)) => {
                said.replica_problem.failed(
                    "cannot read the change DB's replica version",
                    err.to_string(),
                    Level::DEBUG,
                    now,
                );
                return;
            }
            Err(_) => return,
        };
        said.replica_problem
            .succeeded("change DB's replica version readable again");
        let old = replica.version.replace(version.clone());
        let Some(old) = old.filter(|old| *old != version) else {
            if replica.version.is_some() {
                self.status
                    .update(|s| s.replica_version = Some(version.clone()));
            }
            return;
        };
        let at = SystemTime::now();
        replica.reset_at = Some(at);
        *backlog = Backlog::default();
        self.registry.replica_reset();
        warn!(
            old_replica_version = %old,
            replica_version = %version,
            "the change DB was reset (a resync): claims, the last purge and the highest watermark belonged to the old \
             replica and are forgotten; open reservations protect every row; cleanup holds until a backup of the \
             new replica has aged"
        );
        self.status.update(|s| {
            s.replica_version = Some(version.clone());
            s.replica_reset = Some((old, version, at));
            s.purged_through = None;
            s.highest_backup = None;
            s.newest_backup = None;
            s.backup_regressed = None;
            s.backup_below_purge = None;
            s.recent_backups.clear();
            s.backups_tracked = 0;
            s.backup.listing = None;
            s.backup.verified = false;
        });
    }

    /// Reads litestream's page into the backlog and the position. A failed read, a page without samples or a
    /// litestream that restarted makes the position unknown until a page shows the gauge again: cleanup holds,
    /// and (but for a failed read, which says nothing of the backup itself) statuses wait and new reservations
    /// protect every row. Samples taken before the replica's last reset are about the old replica: ignored.
    async fn scrape(
        &self,
        backlog: &mut Backlog,
        position: &mut Position,
        said: &mut Said,
        reset_at: Option<SystemTime>,
        now: Instant,
    ) {
        let parsed = match scrape(&self.scraper, &self.filter).await {
            Ok(parsed) => parsed,
            Err(err) => {
                self.status.update(|s| s.scrape_errors += 1);
                // A bad URL, a 404 or a foreign page will not fix itself; litestream restarting will.
                let level = if err.is_transient() {
                    Level::WARN
                } else {
                    Level::ERROR
                };
                let problem = err.to_string();
                said.scrape_problem.failed(
                    "cannot read litestream metrics",
                    problem.clone(),
                    level,
                    now,
                );
                // Before any page showed a backup there is no position to lose: the hold is "no backup".
                if backlog.current().is_some() {
                    self.position_unknown(
                        position,
                        format!("its page cannot be read: {problem}"),
                        false,
                    );
                }
                return;
            }
        };
        for warning in &parsed.warnings {
            debug!(%warning, "metrics page");
        }
        // A page that keeps the same ignored samples is one problem, said once, not "readable again" and
        // "ignored" anew at every check.
        if parsed.warnings.is_empty() {
            said.scrape_problem
                .succeeded("litestream metrics readable again");
        } else {
            said.scrape_problem.failed(
                "litestream metrics page has samples that were ignored",
                parsed.warnings.join("; "),
                Level::WARN,
                now,
            );
        }
        if parsed.db_bytes.is_some() {
            position.db_bytes = parsed.db_bytes;
            self.status.update(|s| s.db_bytes = parsed.db_bytes);
        }
        let restarted = match (position.process_started, parsed.process_started) {
            (Some(before), Some(after)) => before != after,
            _ => false,
        };
        if parsed.process_started.is_some() {
            position.process_started = parsed.process_started;
        }
        let seen: Vec<_> = parsed
            .progress
            .iter()
            .filter(|p| reset_at.is_none_or(|reset| p.backed_up_at >= reset))
            .map(|p| (p.watermark.as_str(), p.backed_up_at))
            .collect();
        if seen.is_empty() {
            if backlog.current().is_none() {
                return;
            }
            let why = if restarted {
                "litestream restarted and has not reported a backup since"
            } else {
                "its page has no backed-up watermark"
            };
            self.position_unknown(position, why.to_string(), true);
            return;
        }
        if restarted {
            info!("litestream restarted; its page reports a backup again");
        }
        if let Some(why) = position.unknown.take() {
            info!(was = %why, "litestream's backed-up position is known again");
            self.status.update(|s| s.backup_unknown = None);
        }
        self.take_samples(backlog, position, &seen);
    }

    /// The position became unknown; `forget`: the backup itself may be gone or older, so statuses wait and new
    /// reservations protect every row until it is known again.
    fn position_unknown(&self, position: &mut Position, why: String, forget: bool) {
        if forget {
            self.registry.forget_backup();
        }
        // The first reason stays until a page shows the gauge again: "litestream restarted" says more than the
        // sample-less pages that follow it.
        if position.unknown.is_some() {
            return;
        }
        warn!(why = %why, "litestream's backed-up position unknown; cleanup holds until its page shows it");
        position.unknown = Some(why.clone());
        self.status.update(|s| s.backup_unknown = Some(why));
    }

    /// Takes one page's samples: the backlog, the regression watch, the registry's newest backup, the status.
    fn take_samples(
        &self,
        backlog: &mut Backlog,
        position: &mut Position,
        seen: &[(&str, SystemTime)],
    ) {
        let observed = backlog.observe(seen);
        if observed.added > 0 {
            debug!(
                added = observed.added,
                tracked = backlog.backups().len(),
                "backed-up watermarks"
            );
        }
        let Some(current) = backlog.current().cloned() else {
            return;
        };
        let first = std::mem::take(&mut position.first);
        let below_purge = match backlog.last_purged() {
            Some(purged) if first && current.watermark.as_str() < purged => {
                error!(
                    gauge = %current.watermark,
                    last_purge = %purged,
                    "litestream's backup is below the last purge: a view-syncer restoring it cannot catch up from \
                     the change log (litestream restored from an older backup, or the host was rolled back?)"
                );
                Some((purged.to_owned(), current.watermark.clone()))
            }
            Some(purged) if current.watermark.as_str() < purged => {
                self.status.read(|s| s.backup_below_purge.clone())
            }
            _ => None,
        };
        let lowered = self.registry.saw_backup(&current.watermark);
        match observed.gauge {
            Some(GaugeMove::Regressed {
                highest,
                current,
                dropped,
            }) => warn!(
                %highest,
                %current,
                dropped_backups = dropped,
                lowered_floors = lowered,
                last_purged = backlog.last_purged().unwrap_or("none"),
                "litestream's backed-up watermark went back below the highest it reported; cleanup held \
                 until it is back, reservations pinned no higher than it"
            ),
            Some(GaugeMove::Recovered { highest, current }) => info!(
                %highest,
                %current,
                "litestream's backed-up watermark is back at its highest; cleanup resumes"
            ),
            Some(GaugeMove::Steady) | None => {}
        }
        let regressed = backlog
            .regression()
            .map(|(highest, current)| (highest.to_owned(), current.to_owned()));
        let highest = backlog.highest().map(str::to_owned);
        self.status.update(|s| {
            s.newest_backup = Some((current.watermark, current.backed_up_at));
            s.backup_regressed = regressed;
            s.highest_backup = highest;
            s.backup_below_purge = below_purge;
        });
        self.publish_backups(backlog);
    }

    /// Copies the newest tracked backups into the status, for `/status`.
    fn publish_backups(&self, backlog: &Backlog) {
        let mut recent = backlog.backups().to_vec();
        recent.sort_by(|a, b| b.watermark.cmp(&a.watermark));
        let tracked = recent.len();
        recent.truncate(RECENT_BACKUPS);
        self.status.update(|s| {
            s.recent_backups = recent;
            s.backups_tracked = tracked;
        });
    }

    /// Reads the change log's size into the status, bounded by [`SIZE_TIMEOUT`]: a slow or dead change DB costs
    /// the check that much at most, and `/status` only ever reads what this left.
    async fn read_size(&self) {
        let read = tokio::time::timeout(SIZE_TIMEOUT, self.change_db.change_log_size()).await;
        let result = match read {
            Ok(Ok(size)) => Ok(size),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {SIZE_TIMEOUT:?}")),
        };
        self.status.update(|s| match result {
            Ok(size) => {
                s.change_log = Some(ChangeLogReading {
                    size,
                    read_at: SystemTime::now(),
                });
                s.change_log_error = None;
            }
            Err(err) => s.change_log_error = Some(err),
        });
    }

    /// What the destination holds behind the claims, for the policy. Lists it at every check: a snapshot deleted
    /// under an idle database must be seen although no new claim asks about it. The names say whether the newest
    /// generation restores ([`crate::litestream::layout`]); a layout that does not is logged once and holds
    /// cleanup and statuses until it does again.
    async fn verify(&self, backlog: &Backlog, said: &mut Said, now: Instant) -> DestinationCheck {
        let Some(destination) = &self.destination else {
            return DestinationCheck::Unchecked;
        };
        let result = match destination {
            Ok(destination) => destination.list().await,
            Err(problem) => Err(ListError {
                kind: ErrorKind::Other,
                message: problem.clone(),
            }),
        };
        let listing = match result {
            Ok(listing) => listing,
            Err(err) => {
                said.listing_problem.failed(
                    "cannot list the backup destination; cleanup holds",
                    err.to_string(),
                    Level::WARN,
                    now,
                );
                self.status.update(|s| {
                    *s.backup.errors.entry(err.kind).or_default() += 1;
                    s.backup.verified = false;
                    s.backup.failing = Some(err);
                });
                self.registry.set_restorable(false);
                return DestinationCheck::Unreadable;
            }
        };
        debug!(
            objects = listing.objects,
            layout = listing.layout.kind(),
            newest = ?listing.newest.map(humantime::format_rfc3339_millis),
            "backup destination listed"
        );
        said.listing_problem
            .succeeded("backup destination can be listed again");
        self.refuse(
            Reason::Ltx,
            unservable::of_layout(&listing.layout),
            said,
            now,
        );
        match layout_problem(&listing.layout) {
            Some(problem) => said.layout_problem.failed(
                "backup destination does not restore",
                problem,
                Level::ERROR,
                now,
            ),
            None => said
                .layout_problem
                .succeeded("backup destination restores again (by its names)"),
        }
        self.registry.set_restorable(listing.is_restorable());
        let fact = match self.requires {
            // A drill's proof was restored from the destination: it needs no object to stand behind it, only a
            // destination that still restores.
            Requires::Restore if listing.is_restorable() => DestinationCheck::Unchecked,
            _ => DestinationCheck::Listed {
                reaches: listing.chain_newest(),
            },
        };
        let claimed = backlog
            .backups()
            .iter()
            .chain(backlog.current())
            .map(|b| b.backed_up_at)
            .max();
        let stale = claimed.and_then(|claimed| {
            destination::is_stale(listing.newest, claimed, self.stale_after)
                .then_some((listing.newest, claimed))
        });
        let was_stale = self.status.read(|s| s.backup.stale.is_some());
        match (was_stale, stale) {
            (false, Some((newest, claimed))) => error!(
                newest_object = newest.map_or("none".into(), |t| humantime::format_rfc3339_seconds(t).to_string()),
                claimed = %humantime::format_rfc3339_seconds(claimed),
                stale_after = ?self.stale_after,
                "backup destination stale: litestream claims backups its destination does not hold; cleanup holds \
                 for those claims (the sidecar keeps serving)"
            ),
            (true, None) => info!(
                newest_object = listing
                    .newest
                    .map_or("none".into(), |t| humantime::format_rfc3339_seconds(t)
                        .to_string()),
                "backup destination no longer stale"
            ),
            _ => {}
        }
        self.status.update(|s| {
            s.backup.verified = claimed.is_some_and(|claimed| fact.covers(claimed));
            s.backup.stale = stale;
            s.backup.listing = Some(listing);
            s.backup.failing = None;
        });
        fact
    }

    /// The generation a restore picks, as the latest listing read it (`None`: nothing listed, or nothing restorable).
    fn restore_target(&self) -> Option<String> {
        self.status.read(|s| {
            s.backup
                .listing
                .as_ref()
                .and_then(|listing| listing.layout.chain())
                .map(|chain| chain.generation.clone())
        })
    }

    /// The tracked claims of litestream's gauge that are of another generation than the one a restore picks (see
    /// [`crate::litestream::layout::Uploads`]): the destination's objects cover none of those
    /// ([`Inputs::other_generation`]). Under `cleanup.requires = "restore"` the backlog holds proofs, which name
    /// their generation themselves.
    fn claims_of_other_generations(&self, backlog: &Backlog) -> Vec<String> {
        if self.requires == Requires::Restore {
            return Vec::new();
        }
        self.status.read(|s| {
            let Some(listing) = s.backup.listing.as_ref() else {
                return Vec::new();
            };
            backlog
                .backups()
                .iter()
                .filter(|b| listing.claim_of_another_generation(b.backed_up_at))
                .map(|b| b.watermark.clone())
                .collect()
        })
    }

    /// `cleanup.requires = "restore"`: the latest drill's proof stands in for litestream's gauge, through the
    /// same backlog, regression watch and reservation floors. A drill that found the backup broken makes the
    /// position unknown (cleanup holds, statuses wait) until a drill proves it again; one that could not run
    /// leaves the last proof standing.
    fn take_proofs(&self, backlog: &mut Backlog, position: &mut Position, replica: &Replica) {
        let (failure, proof) = self.status.read(|s| {
            (
                s.drills.backup_failure().cloned(),
                s.drills.last_proof.clone(),
            )
        });
        if let Some(failure) = failure {
            // Restoring less than was claimed has a hold of its own (and statuses wait for it), under either
            // trust level.
            if !matches!(
                failure,
                crate::litestream::drill::Failure::RestoredLess { .. }
            ) {
                self.position_unknown(
                    position,
                    format!("the last restore drill failed: {failure}"),
                    true,
                );
            }
            return;
        }
        let Some(proof) = proof else {
            return;
        };
        let of_this_replica = replica
            .version
            .as_deref()
            .is_some_and(|version| version == proof.replica_version)
            && replica.reset_at.is_none_or(|reset| proof.started >= reset);
        if !of_this_replica {
            if backlog.current().is_some() {
                self.position_unknown(
                    position,
                    "the last drill's proof is of another replica version".to_string(),
                    true,
                );
            }
            return;
        }
        // A proof stands for its own generation only: once a restore picks another (litestream started a new one,
        // or a second writer's is newer), what it proved is not what view-syncers get.
        let target = self.restore_target();
        if let (Some(target), Some(generation)) = (&target, &proof.generation) {
            if target != generation {
                self.position_unknown(
                    position,
                    format!(
                        "the last drill's proof is of generation {generation}, and a restore now picks \
                         generation {target}"
                    ),
                    true,
                );
                return;
            }
        }
        if let Some(why) = position.unknown.take() {
            info!(was = %why, "a restore drill proved the backup again");
            self.status.update(|s| s.backup_unknown = None);
        }
        self.take_samples(
            backlog,
            position,
            &[(proof.watermark.as_str(), proof.finished)],
        );
    }

    /// `cleanup.requires = "restore"`: litestream's page says only how large the database is (a drill's disk
    /// need); it may be down, or have no gauge, without holding anything.
    async fn read_size_of_page(&self, position: &mut Position) {
        match scrape(&self.scraper, &self.filter).await {
            Ok(parsed) => {
                if parsed.db_bytes.is_some() {
                    position.db_bytes = parsed.db_bytes;
                    self.status.update(|s| s.db_bytes = parsed.db_bytes);
                }
            }
            Err(err) => debug!(error = %err, "litestream's page not read (only its size is used)"),
        }
    }

    /// Everything else the policy reads, at one instant.
    fn gather(&self, now: Instant, replica: &Replica) -> Gathered {
        let discovery = self.discovery.get();
        let registered =
            discovery.registration == Some(crate::cleanup::discovery::Registration::Registered);
        // Registered but not yet stamped: counts as registered just now.
        let registered_since = registered.then(|| discovery.continuity.since().unwrap_or(now));
        let ownership = match (self.discovery_mode, registered_since) {
            (crate::cleanup::discovery::DiscoveryMode::Off, _) => Ownership::Unchecked,
            (_, None) => Ownership::NotRegistered,
            (_, Some(since)) => Ownership::RegisteredSince(since),
        };
        let mut reservations = self.registry.for_policy();
        let mut subscribers = self.subscribers.for_policy(now, self.reconnect_grace);
        // Every live slot of the shard too: another sidecar's reservations and subscribers, and this one's
        // reservations whose sockets closed. A floor of another replica, or of none known, protects every row here;
        // the purge batch names such a row.
        let (slots, holder) = self.status.read(|s| (s.slots.clone(), s.holder.clone()));
        for slot in slots.iter().filter(|s| s.live) {
            let floor = match (slot.effective_floor(), replica.version.as_deref()) {
                (Some(floor), Some(version)) if slot.problem(Some(version)).is_none() => {
                    Some(floor.to_owned())
                }
                _ => None,
            };
            match slot.kind {
                crate::cleanup::slots::SlotKind::Reservation => {
                    // This sidecar's own open one is listed once, at the lower of its two floors.
                    match reservations.iter_mut().find(|r| r.task_id == slot.key) {
                        Some(own) => {
                            own.floor = match (own.floor.take(), floor) {
                                (Some(a), Some(b)) => Some(a.min(b)),
                                _ => None,
                            }
                        }
                        None => reservations.push(HeldReservation {
                            task_id: slot.key.clone(),
                            floor,
                        }),
                    }
                }
                crate::cleanup::slots::SlotKind::Subscriber if slot.holder != holder => {
                    // A subscriber is always at some watermark; one that cannot be trusted holds at the replica
                    // version, below every row.
                    let replica_version = slot.replica_version.clone().unwrap_or_default();
                    subscribers.push(Subscriber {
                        id: slot
                            .subscriber_id
                            .clone()
                            .unwrap_or_else(|| slot.key.clone()),
                        acked: floor.unwrap_or_else(|| replica_version.clone()),
                        replica_version,
                        departed: (!slot.connected).then_some(now),
                        awaits_upstream: false,
                    })
                }
                crate::cleanup::slots::SlotKind::Subscriber => {}
            }
        }
        Gathered {
            ownership,
            owner: discovery.owner,
            cleanup_delay: self.registry.cleanup_delay(),
            reservations,
            subscribers,
            reset_at: replica.reset_at,
            replica_version: replica.version.clone(),
        }
    }

    async fn act(
        &self,
        decision: Decision,
        observed: &Gathered,
        backlog: &mut Backlog,
        position: &Position,
        said: &mut Said,
        shutdown: &CancellationToken,
    ) {
        self.status
            .update(|s| s.last_decision = Some(decision.clone()));
        let (before, bound) = match decision {
            Decision::Hold(reason) => {
                self.status.update(|s| {
                    *s.holds.entry(reason).or_default() += 1;
                    if s.held_since.as_ref().is_none_or(|h| h.reason != reason) {
                        s.held_since = Some(HeldSince {
                            reason,
                            since: Instant::now(),
                            since_wall: SystemTime::now(),
                        });
                    }
                });
                if said.last_hold != Some(reason) {
                    info!(%reason, "cleanup held");
                    said.last_hold = Some(reason);
                }
                return;
            }
            Decision::Purge { before, bound } => (before, bound),
        };
        said.last_hold = None;
        self.status.update(|s| s.held_since = None);
        if !self.enabled {
            info!(before = %before, %bound, "cleanup would purge (cleanup.enabled = false)");
            return;
        }
        // Every batch re-checks who owns the change log: the sidecar's address (verify, adopt), or the
        // replication-manager's address held by the task discovery saw (owner).
        let expected = match self.discovery_mode {
            crate::cleanup::discovery::DiscoveryMode::Off => None,
            crate::cleanup::discovery::DiscoveryMode::Verify
            | crate::cleanup::discovery::DiscoveryMode::Adopt => {
                Some(Expected::from(self.advertise_address.as_str()))
            }
            crate::cleanup::discovery::DiscoveryMode::Owner => Some(Expected {
                address: &self.upstream_address,
                owner: observed.owner.as_deref(),
            }),
        };
        let mut outcome = PurgeOutcome::default();
        let holder = self.status.read(|s| s.holder.clone());
        // Litestream can restart or go back while a long purge runs: its gauge is read again before every batch,
        // and anything but a steady gauge stops the purge (the next check decides afresh).
        let gauge = GaugeWatch {
            highest: backlog.highest().map(str::to_owned),
            process_started: position.process_started,
            reset_at: observed.reset_at,
            stopped: std::sync::Mutex::new(None),
        };
        let purged = self
            .change_db
            .purge_within(
                // The version this decision was made for: a resync while the purge runs stops it.
                PurgeTarget {
                    before: &before,
                    replica_version: observed.replica_version.as_deref(),
                    slots: Some(crate::cleanup::change_db::SlotCheck {
                        rule: crate::cleanup::change_db::SlotRule {
                            pause: self.mode == cleanup::ReservationMode::Pause,
                            restore_limit_now: self.restore_limit.known_for(position.db_bytes),
                        },
                        own: Some(&holder),
                    }),
                },
                expected,
                self.batch_rows,
                shutdown,
                || self.batch_limit(&gauge),
                &mut outcome,
            )
            .await;
        if let Some(why) = gauge
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            warn!(
                before = %before,
                rows = outcome.rows,
                why = %why,
                "change log purge stopped: litestream's gauge moved while it ran; the next check decides afresh"
            );
        }
        if let Err(err) = purged {
            return self.purge_failed(&err, &outcome);
        }
        let mut failed_before = 0;
        self.status.update(|s| {
            failed_before = s.purge_failures.succeeded();
            s.purges += 1;
            s.purged_rows += outcome.rows;
        });
        if failed_before > 0 {
            info!(
                failed_before,
                "change log purges work again; cleanup resumes"
            );
        }
        let reservations = observed.reservation_list();
        match &outcome.stopped {
            None => {
                info!(
                    before = %before,
                    %bound,
                    rows = outcome.rows,
                    batches = outcome.batches,
                    %reservations,
                    "change log purged"
                );
                backlog.purged(&before);
                // The backup at `before` stays in the backlog: the clamped proxy page shows it with its real time.
                let through = backlog
                    .backups()
                    .iter()
                    .find(|b| b.watermark == before)
                    .cloned();
                let last = LastPurge {
                    before: before.clone(),
                    bound: bound.to_string(),
                    rows: outcome.rows,
                    completed_at: SystemTime::now(),
                };
                self.status.update(|s| {
                    s.purged_through = through;
                    s.last_purge = Some(last);
                });
                self.publish_backups(backlog);
            }
            Some(crate::cleanup::change_db::PurgeStop::Slot { slot, floor }) => warn!(
                before = %before,
                %bound,
                rows = outcome.rows,
                %slot,
                floor = floor.as_deref().unwrap_or("every row"),
                "change log purge stopped at a slot below its bound (another sidecar's, or a socket since closed); \
                 the next check continues"
            ),
            Some(crate::cleanup::change_db::PurgeStop::SlotMalformed { slot, problem }) => error!(
                before = %before,
                rows = outcome.rows,
                %slot,
                %problem,
                "change log purge stopped: a slot is not well formed; nothing more is purged until it is mended or \
                 expires"
            ),
            Some(stop) => info!(
                before = %before,
                %bound,
                rows = outcome.rows,
                stopped = ?stop,
                %reservations,
                "change log purge stopped early; the next check continues"
            ),
        }
    }

    /// Lets the hold for unknown restores go once it has passed, so the state file stops carrying it.
    fn settle_unknown_restores(&self, guards: &cleanup::Guards, now: Instant) {
        if guards
            .restores_unknown_until
            .is_some_and(|until| now >= until)
        {
            info!("cleanup.hold_without_state has passed since the start without a state file");
            self.status.update(|s| s.restores_unknown_since = None);
        }
    }

    /// How far the next batch of a running purge may go: litestream's gauge read again (and handed to the registry,
    /// so that a reservation opened now is pinned at the freshest position), then reservations and subscribers.
    async fn batch_limit(&self, gauge: &GaugeWatch) -> cleanup::Ceiling {
        if let Some(why) = self.gauge_moved(gauge).await {
            *gauge.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            return cleanup::Ceiling::Everything;
        }
        purge_limit(
            self.mode,
            &self.registry,
            &self.subscribers,
            self.reconnect_grace,
        )
    }

    /// Why litestream's page no longer supports the running purge, if it does not: unreadable, no samples, a
    /// restart, or a gauge below the highest it reported.
    async fn gauge_moved(&self, gauge: &GaugeWatch) -> Option<String> {
        if self.requires == Requires::Restore {
            return self.proof_moved(gauge);
        }
        let parsed = match scrape(&self.scraper, &self.filter).await {
            Ok(parsed) => parsed,
            Err(err) => return Some(format!("its page cannot be read: {err}")),
        };
        if let (Some(before), Some(now)) = (gauge.process_started, parsed.process_started) {
            if before != now {
                self.registry.forget_backup();
                return Some("litestream restarted".into());
            }
        }
        let newest = parsed
            .progress
            .iter()
            .filter(|p| gauge.reset_at.is_none_or(|reset| p.backed_up_at >= reset))
            .map(|p| p.watermark.as_str())
            .max();
        let Some(newest) = newest else {
            self.registry.forget_backup();
            return Some("its page has no backed-up watermark".into());
        };
        self.registry.saw_backup(newest);
        match gauge.highest.as_deref() {
            Some(highest) if newest < highest => {
                Some(format!("it went back from {highest} to {newest}"))
            }
            _ => None,
        }
    }

    /// `cleanup.requires = "restore"`: a drill that ended during the purge and found the backup broken, or proved
    /// less than before, stops it as a gauge that went back would.
    fn proof_moved(&self, gauge: &GaugeWatch) -> Option<String> {
        let (failure, proof) = self.status.read(|s| {
            (
                s.drills.backup_failure().cloned(),
                s.drills.last_proof.clone(),
            )
        });
        if let Some(failure) = failure {
            self.registry.forget_backup();
            return Some(format!("a restore drill failed: {failure}"));
        }
        match (gauge.highest.as_deref(), proof) {
            (Some(highest), Some(proof)) if proof.watermark.as_str() < highest => Some(format!(
                "a restore drill proved only {} (below {highest})",
                proof.watermark
            )),
            _ => None,
        }
    }

    /// Counts a failed purge and logs it once per kind: at error, with the SQLSTATE and what to do, when it will
    /// not heal by itself; at warn otherwise. The rows of the batches `done` before the failure committed, and are
    /// counted as purged.
    fn purge_failed(&self, err: &DbError, done: &PurgeOutcome) {
        let failure = PurgeFailure::of(err);
        let mut loudness = Loudness::Quiet;
        let mut consecutive = 0;
        self.status.update(|s| {
            loudness = s.purge_failures.failed(failure.clone());
            consecutive = s.purge_failures.consecutive;
            s.purged_rows += done.rows;
        });
        let rows_deleted_before = done.rows;
        let class = failure.class.as_str();
        let sqlstate = failure.sqlstate.as_deref().unwrap_or("none");
        match loudness {
            Loudness::Error => error!(
                class,
                sqlstate,
                error = %err,
                remedy = failure.class.remedy(),
                consecutive,
                rows_deleted_before,
                "cleanup held: change log purge failed, and will until this is fixed"
            ),
            Loudness::Warn => warn!(
                class,
                sqlstate,
                error = %err,
                consecutive,
                rows_deleted_before,
                "cleanup held: change log purge failed; retrying at the next check"
            ),
            Loudness::Quiet => debug!(
                class,
                sqlstate,
                error = %err,
                consecutive,
                rows_deleted_before,
                "change log purge failed again"
            ),
        }
    }
}
