//! The cleanup loop, the one place where I/O and the policy meet: every `check_interval` it scrapes litestream,
//! records newly backed-up watermarks, gathers reservations and subscriber acks, asks [`cleanup::decide`], and
//! purges the change log when the answer is yes. One purge at a time: the loop awaits each before the next tick.
//!
//! Failures never purge: a scrape that fails keeps what is known and tries again next interval; a purge that
//! fails leaves the last purged watermark where it was.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::change_db::{ChangeDb, DbError, FailureClass};
use crate::cleanup::{self, Backup, Decision, HeldReservation, HoldReason, Inputs};
use crate::config::Config;
use crate::litestream::{Filter, Progress, Scraper};
use crate::reservations::Registry;
use crate::subscribers::Subscribers;

/// A warning repeated at most this often while the same problem persists.
const WARN_EVERY: Duration = Duration::from_secs(300);

/// Backed-up watermarks not yet purged, and the last purge. Pure bookkeeping, separate from the loop so that the
/// rules (first sighting wins, nothing at or below the last purge) are tested alone.
#[derive(Debug, Default)]
pub struct Tracker {
    backups: Vec<Backup>,
    last_purged: Option<String>,
}

impl Tracker {
    /// Records watermarks seen for the first time; a watermark already known keeps its first backup time, as in
    /// Zero's BackupMonitor. Returns how many were new.
    pub fn record(&mut self, progress: &[Progress]) -> usize {
        let mut added = 0;
        for p in progress {
            let purged = self
                .last_purged
                .as_deref()
                .is_some_and(|last| p.watermark.as_str() <= last);
            if purged || self.backups.iter().any(|b| b.watermark == p.watermark) {
                continue;
            }
            self.backups.push(Backup {
                watermark: p.watermark.clone(),
                backed_up_at: p.backed_up_at,
            });
            added += 1;
        }
        added
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
}

/// What the loop last did, for `/keepalive`, metrics and tests.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Completed checks (scrape, decision and any purge).
    pub checks: u64,
    pub last_decision: Option<Decision>,
    pub last_purged: Option<String>,
    pub purges: u64,
    pub purged_rows: u64,
    pub scrape_errors: u64,
    /// The newest backed-up watermark seen and when it was backed up.
    pub newest_backup: Option<(String, SystemTime)>,
    /// Checks that did not purge, by reason.
    pub holds: std::collections::HashMap<HoldReason, u64>,
    pub purge_failures: PurgeFailures,
}

impl Status {
    /// One line on why cleanup cannot do its job, for `/keepalive` and systemd's status; `None` while purges work.
    pub fn cleanup_problem(&self) -> Option<String> {
        let last = self.purge_failures.last.as_ref()?;
        Some(format!(
            "cleanup held: the last {} change log purge{} failed ({}{}): {}",
            self.purge_failures.consecutive,
            if self.purge_failures.consecutive == 1 {
                ""
            } else {
                "s"
            },
            last.class,
            last.sqlstate
                .as_deref()
                .map(|code| format!(", SQLSTATE {code}"))
                .unwrap_or_default(),
            last.message
        ))
    }
}

/// Failed purges, so that a change DB that keeps rejecting them is loud: counted, classified, and logged once per
/// change of kind (at error when it will not heal by itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeFailures {
    /// Purges in a row that ended in an error; 0 after one that did not.
    pub consecutive: u64,
    /// Every purge that ended in an error.
    pub total: u64,
    /// The latest failure, while `consecutive > 0`.
    pub last: Option<PurgeFailure>,
}

/// One failed purge, as an operator needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeFailure {
    pub class: FailureClass,
    pub sqlstate: Option<String>,
    pub message: String,
}

impl PurgeFailure {
    pub fn of(err: &DbError) -> Self {
        Self {
            class: err.class(),
            sqlstate: err.sqlstate().map(str::to_string),
            message: err.to_string(),
        }
    }
}

/// How loudly to log a failed purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loudness {
    /// A new kind of failure that will not heal by itself.
    Error,
    /// A new kind of failure that may heal.
    Warn,
    /// The same kind as the previous purge's failure: already said.
    Quiet,
}

impl PurgeFailures {
    /// Records a failed purge; the answer says how loudly to log it. A kind is its class and SQLSTATE, not its
    /// message, which names the batch that failed.
    pub fn failed(&mut self, failure: PurgeFailure) -> Loudness {
        let same = self
            .last
            .as_ref()
            .is_some_and(|l| l.class == failure.class && l.sqlstate == failure.sqlstate);
        let loudness = match (same, failure.class.is_permanent()) {
            (true, _) => Loudness::Quiet,
            (false, true) => Loudness::Error,
            (false, false) => Loudness::Warn,
        };
        self.consecutive += 1;
        self.total += 1;
        self.last = Some(failure);
        loudness
    }

    /// Records a purge that did not fail; returns how many in a row had failed before it.
    pub fn succeeded(&mut self) -> u64 {
        self.last = None;
        std::mem::take(&mut self.consecutive)
    }
}

/// Shared view of [`Status`].
pub type StatusHandle = crate::shared::Cell<Status>;

/// Logs a recurring problem once when it starts or changes, then at most every [`WARN_EVERY`], and once when it
/// clears: an operator sees every transition without a line per tick.
#[derive(Default)]
struct Throttle {
    current: Option<String>,
    last_warned: Option<Instant>,
}

impl Throttle {
    fn failed(&mut self, what: &str, problem: String, now: Instant) {
        let changed = self.current.as_deref() != Some(problem.as_str());
        let due = self
            .last_warned
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY);
        if changed || due {
            warn!(error = %problem, "{what}");
            self.last_warned = Some(now);
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
    scraper: Scraper,
    filter: Filter,
    check_interval: Duration,
    reconnect_grace: Duration,
    mode: cleanup::ReservationMode,
    enabled: bool,
    batch_rows: i64,
    /// When the sidecar started: restores that began before a restart are covered by waiting the cleanup delay.
    started: Instant,
    discovery_mode: crate::discovery::Mode,
    discovery: crate::discovery::StateHandle,
    /// The address purges check `ownerAddress` against, unless discovery is off.
    advertise_address: String,
}

impl Monitor {
    pub fn new(
        config: &Config,
        registry: Registry,
        subscribers: Subscribers,
        change_db: ChangeDb,
        status: StatusHandle,
        started: Instant,
        discovery: crate::discovery::StateHandle,
    ) -> Self {
        let litestream = &config.litestream;
        let scraper = Scraper::new(
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
            enabled: config.cleanup.enabled,
            batch_rows: config.cleanup.batch_rows,
            started,
            discovery_mode: config.discovery.mode,
            discovery,
            advertise_address: config.discovery.advertise_address.clone(),
        }
    }

    /// Checks every `check_interval` until `shutdown`; a purge in progress finishes its current batch first.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tracker = Tracker::default();
        let mut scrape_problem = Throttle::default();
        let mut last_hold: Option<HoldReason> = None;
        let mut every = crate::shared::Every::new(self.check_interval);
        while every.tick(&shutdown).await {
            let now = Instant::now();
            match self.scraper.scrape(&self.filter).await {
                Ok(parsed) => {
                    scrape_problem.succeeded("litestream metrics readable again");
                    for warning in &parsed.warnings {
                        debug!(%warning, "metrics page");
                    }
                    if !parsed.warnings.is_empty() {
                        scrape_problem.failed(
                            "litestream metrics page has samples that were ignored",
                            parsed.warnings.join("; "),
                            now,
                        );
                    }
                    for p in &parsed.progress {
                        self.registry.saw_backup(&p.watermark);
                    }
                    let added = tracker.record(&parsed.progress);
                    if added > 0 {
                        debug!(
                            added,
                            tracked = tracker.backups().len(),
                            "backed-up watermarks"
                        );
                    }
                    let newest = tracker
                        .backups()
                        .iter()
                        .max_by(|a, b| a.watermark.cmp(&b.watermark))
                        .map(|b| (b.watermark.clone(), b.backed_up_at));
                    if newest.is_some() {
                        self.status.update(|s| s.newest_backup = newest);
                    }
                }
                Err(err) => {
                    self.status.update(|s| s.scrape_errors += 1);
                    // Keep what is known; the decision below still runs on it (Zero does the same).
                    scrape_problem.failed("cannot read litestream metrics", err.to_string(), now);
                }
            }

            let (decision, reservations) = self.decide(&tracker, now);
            debug!(
                decision = ?decision,
                reservations = %describe(&reservations),
                lowest_floor = lowest_floor(&reservations),
                "cleanup decision"
            );
            self.status
                .update(|s| s.last_decision = Some(decision.clone()));
            match decision {
                Decision::Hold(reason) => {
                    self.status
                        .update(|s| *s.holds.entry(reason).or_default() += 1);
                    if last_hold != Some(reason) {
                        info!(%reason, "cleanup held");
                        last_hold = Some(reason);
                    }
                }
                Decision::Purge { before } => {
                    last_hold = None;
                    if !self.enabled {
                        info!(before = %before, "cleanup would purge (cleanup.enabled = false)");
                    } else {
                        let expected = (self.discovery_mode != crate::discovery::Mode::Off)
                            .then_some(self.advertise_address.as_str());
                        match self
                            .change_db
                            .purge(&before, expected, self.batch_rows, &shutdown)
                            .await
                        {
                            Ok(outcome) => {
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
                                let lowest_floor = lowest_floor(&reservations);
                                let reservations = describe(&reservations);
                                match &outcome.stopped {
                                    None => {
                                        info!(
                                            before = %before,
                                            rows = outcome.rows,
                                            batches = outcome.batches,
                                            %reservations,
                                            lowest_floor,
                                            "change log purged"
                                        );
                                        tracker.purged(&before);
                                        self.status.update(|s| s.last_purged = Some(before));
                                    }
                                    Some(stop) => info!(
                                        before = %before,
                                        rows = outcome.rows,
                                        stopped = ?stop,
                                        %reservations,
                                        lowest_floor,
                                        "change log purge stopped early; the next check continues"
                                    ),
                                }
                            }
                            Err(err) => self.purge_failed(&err),
                        }
                    }
                }
            }
            self.status.update(|s| s.checks += 1);
        }
    }

    /// Counts a failed purge and logs it once per kind: at error, with the SQLSTATE and what to do, when it will
    /// not heal by itself; at warn otherwise.
    fn purge_failed(&self, err: &DbError) {
        let failure = PurgeFailure::of(err);
        let mut loudness = Loudness::Quiet;
        let mut consecutive = 0;
        self.status.update(|s| {
            loudness = s.purge_failures.failed(failure.clone());
            consecutive = s.purge_failures.consecutive;
        });
        let class = failure.class.as_str();
        let sqlstate = failure.sqlstate.as_deref().unwrap_or("none");
        match loudness {
            Loudness::Error => error!(
                class,
                sqlstate,
                error = %err,
                remedy = failure.class.remedy(),
                consecutive,
                "cleanup held: change log purge failed, and will until this is fixed"
            ),
            Loudness::Warn => warn!(
                class,
                sqlstate,
                error = %err,
                consecutive,
                "cleanup held: change log purge failed; retrying at the next check"
            ),
            Loudness::Quiet => debug!(
                class,
                sqlstate,
                error = %err,
                consecutive,
                "change log purge failed again"
            ),
        }
    }

    /// The decision, and the reservations it was taken with (empty when it held before reading them).
    fn decide(&self, tracker: &Tracker, now: Instant) -> (Decision, Vec<HeldReservation>) {
        let cleanup_delay = self.registry.cleanup_delay();
        if self.discovery_mode != crate::discovery::Mode::Off {
            let state = self.discovery.get();
            if state.registration != Some(crate::discovery::Registration::Registered) {
                return (Decision::Hold(HoldReason::NotRegistered), Vec::new());
            }
            if !state
                .continuity
                .held_for(self.reconnect_grace + cleanup_delay, now)
            {
                return (Decision::Hold(HoldReason::RecentlyRegistered), Vec::new());
            }
        }
        let reservations: Vec<HeldReservation> = self
            .registry
            .open_reservations()
            .into_iter()
            .map(|r| HeldReservation {
                task_id: r.task_id,
                floor: r.floor,
            })
            .collect();
        let subscribers = self.subscribers.for_policy(now, self.reconnect_grace);
        let decision = cleanup::decide(&Inputs {
            now,
            wall_now: SystemTime::now(),
            started: self.started,
            cleanup_delay,
            reconnect_grace: self.reconnect_grace,
            mode: self.mode,
            backups: tracker.backups(),
            reservations: &reservations,
            subscribers: &subscribers,
            last_purged: tracker.last_purged(),
        });
        (decision, reservations)
    }
}

/// The lowest floor among `reservations`, for logs: `"none"` when one has no floor, `""` when there are none.
fn lowest_floor(reservations: &[HeldReservation]) -> &str {
    if reservations.iter().any(|r| r.floor.is_none()) {
        return "none";
    }
    reservations
        .iter()
        .filter_map(|r| r.floor.as_deref())
        .min()
        .unwrap_or("")
}

/// `task=floor` for each reservation, comma-separated, for logs.
fn describe(reservations: &[HeldReservation]) -> String {
    reservations
        .iter()
        .map(|r| format!("{}={}", r.task_id, r.floor.as_deref().unwrap_or("none")))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(watermark: &str, secs: u64) -> Progress {
        Progress {
            watermark: watermark.into(),
            backed_up_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            db: "/replica.db".into(),
            name: "s3".into(),
        }
    }

    #[test]
    fn reservations_are_described_for_logs() {
        let held = |task: &str, floor: Option<&str>| HeldReservation {
            task_id: task.into(),
            floor: floor.map(Into::into),
        };
        assert_eq!(lowest_floor(&[]), "");
        assert_eq!(describe(&[]), "");
        let two = [held("a", Some("0c")), held("b", Some("0b"))];
        assert_eq!(lowest_floor(&two), "0b");
        assert_eq!(describe(&two), "a=0c,b=0b");
        let floorless = [held("a", Some("0c")), held("b", None)];
        assert_eq!(lowest_floor(&floorless), "none");
        assert_eq!(describe(&floorless), "a=0c,b=none");
    }

    fn failure(class: FailureClass, sqlstate: Option<&str>, message: &str) -> PurgeFailure {
        PurgeFailure {
            class,
            sqlstate: sqlstate.map(Into::into),
            message: message.into(),
        }
    }

    #[test]
    fn purge_failures_are_loud_once_per_kind_and_counted_until_one_succeeds() {
        let mut failures = PurgeFailures::default();
        let denied = |batch: u32| {
            failure(
                FailureClass::Permission,
                Some("42501"),
                &format!("permission denied (purge batch {batch})"),
            )
        };
        assert_eq!(failures.failed(denied(1)), Loudness::Error);
        // Same class and SQLSTATE, another batch: already said.
        assert_eq!(failures.failed(denied(2)), Loudness::Quiet);
        let timeout = failure(FailureClass::Transient, Some("55P03"), "lock timeout");
        assert_eq!(failures.failed(timeout.clone()), Loudness::Warn);
        assert_eq!(failures.failed(denied(3)), Loudness::Error);
        assert_eq!((failures.consecutive, failures.total), (4, 4));
        assert_eq!(failures.last, Some(denied(3)));

        assert_eq!(failures.succeeded(), 4);
        assert_eq!((failures.consecutive, failures.total), (0, 4));
        assert_eq!(failures.last, None);
        assert_eq!(failures.succeeded(), 0);
        // After a success the same kind is news again.
        assert_eq!(failures.failed(timeout), Loudness::Warn);
    }

    #[test]
    fn the_cleanup_problem_names_count_class_and_sqlstate() {
        let mut status = Status::default();
        assert_eq!(status.cleanup_problem(), None);
        status.purge_failures.failed(failure(
            FailureClass::UnsupportedServer,
            Some("42704"),
            "unrecognized configuration parameter \"lc_collate\"",
        ));
        assert_eq!(
            status.cleanup_problem().as_deref(),
            Some(
                "cleanup held: the last 1 change log purge failed (unsupported_server, SQLSTATE 42704): \
                 unrecognized configuration parameter \"lc_collate\""
            )
        );
        status.purge_failures.failed(failure(
            FailureClass::Unavailable,
            None,
            "change DB unavailable: connecting",
        ));
        assert_eq!(
            status.cleanup_problem().as_deref(),
            Some(
                "cleanup held: the last 2 change log purges failed (unavailable): change DB unavailable: connecting"
            )
        );
    }

    #[test]
    fn first_sighting_of_a_watermark_wins() {
        let mut tracker = Tracker::default();
        assert_eq!(tracker.record(&[progress("0a", 100)]), 1);
        assert_eq!(
            tracker.record(&[progress("0a", 200), progress("0b", 300)]),
            1
        );
        let times: Vec<_> = tracker
            .backups()
            .iter()
            .map(|b| (b.watermark.as_str(), b.backed_up_at))
            .collect();
        assert_eq!(
            times,
            [
                ("0a", SystemTime::UNIX_EPOCH + Duration::from_secs(100)),
                ("0b", SystemTime::UNIX_EPOCH + Duration::from_secs(300)),
            ]
        );
    }

    #[test]
    fn nothing_at_or_below_the_last_purge_is_tracked_again() {
        let mut tracker = Tracker::default();
        tracker.record(&[progress("0a", 1), progress("0b", 2), progress("0c", 3)]);
        tracker.purged("0b");
        assert_eq!(tracker.last_purged(), Some("0b"));
        let left: Vec<_> = tracker
            .backups()
            .iter()
            .map(|b| b.watermark.as_str())
            .collect();
        assert_eq!(left, ["0b", "0c"]);
        assert_eq!(
            tracker.record(&[progress("0a", 9), progress("0b", 9), progress("0d", 9)]),
            1
        );
        // Byte-wise order: "110" (36) is after "0z" (35).
        tracker.purged("0z");
        assert_eq!(tracker.record(&[progress("110", 10)]), 1);
    }
}
