//! What the cleanup loop last saw and did ([`Status`]), shared through a [`StatusHandle`]: the read model that
//! `/status`, `/keepalive`, the metrics page, the metrics proxy and systemd's status read. Each fact has one writer:
//! the cleanup loop publishes what it knows once per check ([`crate::cleanup::monitor::Knowledge::publish`]), the
//! keeper the shard's memory, the drill task the drills.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::cleanup::change_db::{DbError, FailureClass};
use crate::cleanup::unservable::Refusals;
use crate::cleanup::{self, Backup, Decision, HoldReason};
use crate::litestream::destination::{ErrorKind, ListError, Listing};
use crate::litestream::drill::{Claim, Claims, Failure, Proof};
use crate::litestream::layout::Layout;

/// How many of the tracked backups [`Status`] keeps, newest first: enough to see the recent ones, few enough that
/// copying the status for every scrape stays cheap while cleanup is held for days.
pub const RECENT_BACKUPS: usize = 10;

/// What the loop last did, for `/keepalive`, metrics and tests.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Completed checks (scrape, decision and any purge).
    pub checks: u64,
    pub last_decision: Option<Decision>,
    pub purges: u64,
    pub purged_rows: u64,
    pub scrape_errors: u64,
    /// Where litestream's gauge is (the newest watermark of the last page that had one) and when that was
    /// backed up: after a regression, below the highest it reported. Published from the loop's backlog (which owns
    /// it) for readers on other tasks, which cannot reach the backlog without a lock the loop would take every page.
    pub newest_backup: Option<(String, SystemTime)>,
    /// `(highest, current)` while the gauge is below the highest watermark it reported.
    pub backup_regressed: Option<(String, String)>,
    /// The highest watermark the gauge ever reported, in this run or (from the state file) an earlier one.
    pub highest_backup: Option<String>,
    /// Why litestream's position is unknown, while it is (restarted, a page without samples, unreadable).
    pub backup_unknown: Option<String>,
    /// `(last purge, gauge)` when the first gauge after a start was below the last purge: a restore of that
    /// backup cannot catch up from the change log.
    pub backup_below_purge: Option<(String, String)>,
    /// The change DB's `replicaVersion` as last read (or kept from the previous run until read).
    pub replica_version: Option<String>,
    /// `(old, new, when)`: the latest change of the replica version seen (a resync).
    pub replica_reset: Option<(String, String, SystemTime)>,
    /// Whether the state file keeps what this run knows.
    pub memory: cleanup::Memory,
    /// Why it does not, while it does not (a write failed, the file is unreadable).
    pub state_problem: Option<String>,
    /// Reservations kept from the previous run that reached `cleanup.restore_limit` unanswered.
    pub kept_expired: u64,
    /// `Some(true)` while another sidecar holds the shard's purger lock; `None` before the first try.
    pub standby: Option<bool>,
    /// Since when nothing says which restores were in flight, while cleanup holds for it.
    pub restores_unknown_since: Option<SystemTime>,
    /// Checks that did not purge, by reason.
    pub holds: std::collections::HashMap<HoldReason, u64>,
    pub purge_failures: PurgeFailures,
    /// The hold reason of the last check and since when it has held without interruption; `None` after a check
    /// that decided to purge.
    pub held_since: Option<HeldSince>,
    /// The last complete purge: this run's, or the one the shard remembers.
    pub last_purge: Option<cleanup::LastPurge>,
    /// The newest tracked backups (at most [`RECENT_BACKUPS`]), newest first.
    pub recent_backups: Vec<Backup>,
    /// How many backups are tracked (not yet purged below) in all.
    pub backups_tracked: usize,
    /// The change log's size at the last check that could read it.
    pub change_log: Option<ChangeLogReading>,
    /// Why the last attempt to read the change log's size failed, while it is the last.
    pub change_log_error: Option<String>,
    pub backup: BackupStatus,
    pub drills: DrillStatus,
    /// The largest database on litestream's last page that said: the space a drill needs.
    pub db_bytes: Option<u64>,
    /// Why the sidecar cannot serve this deployment, while it cannot: cleanup holds and v4+ snapshot statuses wait.
    pub unservable: Refusals,
    /// Every slot of the shard at the last check that read them, whichever sidecar holds it.
    pub slots: Vec<crate::cleanup::slots::Slot>,
    /// The live slot that bounds purges now, as of that read.
    pub bounding_slot: Option<crate::cleanup::slots::SlotLimit>,
    /// Why the slots could not be read at the last check, while they could not (cleanup holds meanwhile).
    pub slots_problem: Option<String>,
    /// Which sidecar this is in the slot table.
    pub holder: String,
    /// The newest drill proof kept in the change DB when this run read the shard's memory (proved by an earlier
    /// run, or by another sidecar of the shard). The keeper writes it; the drills' own record stays theirs.
    pub kept_proof: Option<Proof>,
}

/// A hold reason in force, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSince {
    pub reason: HoldReason,
    /// For durations (the metric), immune to wall-clock steps.
    pub since: Instant,
    /// For people.
    pub since_wall: SystemTime,
}

/// The change log's size as read at `read_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeLogReading {
    pub size: crate::cleanup::change_db::ChangeLogSize,
    pub read_at: SystemTime,
}

/// Restore drills as the drill task last ran them.
#[derive(Debug, Clone, Default)]
pub struct DrillStatus {
    /// `backup.drill_interval`; `None`: drills run only on demand.
    pub interval: Option<Duration>,
    /// `cleanup.requires = "restore"`: drills' proofs drive cleanup and statuses.
    pub drives_cleanup: bool,
    /// When the drill in progress started.
    pub running_since: Option<SystemTime>,
    /// When the next scheduled drill is due.
    pub next_at: Option<SystemTime>,
    /// The latest drill's outcome.
    pub last: Option<DrillOutcome>,
    /// The latest drill of this run that proved the backup ([`Status::last_proof`] adds the one kept from before).
    pub last_proof: Option<Proof>,
    pub runs: u64,
    /// Failed drills, by [`Failure::kind`].
    pub failures: std::collections::HashMap<&'static str, u64>,
    /// The drill that restored less than the backup claimed ([`Failure::RestoredLess`]), until one restores at
    /// least that claim again: a drill that could not run since, or proved less, does not clear it. Cleanup and
    /// snapshot statuses hold meanwhile, whatever `cleanup.requires` says.
    pub restored_less: Option<Failure>,
}

/// One drill's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrillOutcome {
    Proved(Proof),
    Failed {
        failure: Failure,
        started: SystemTime,
        finished: SystemTime,
    },
}

impl DrillStatus {
    /// The latest drill's failure when it was the backup's (see [`Failure::is_backup`]): what holds cleanup and
    /// statuses under `cleanup.requires = "restore"` until a drill proves the backup again.
    pub fn backup_failure(&self) -> Option<&Failure> {
        match &self.last {
            Some(DrillOutcome::Failed { failure, .. }) if failure.is_backup() => Some(failure),
            _ => self.restored_less.as_ref(),
        }
    }

    /// The latest drill's failure when it could not run for want of disk.
    pub fn disk_short(&self) -> Option<&Failure> {
        match &self.last {
            Some(DrillOutcome::Failed {
                failure: failure @ Failure::Disk { .. },
                ..
            }) => Some(failure),
            _ => None,
        }
    }

    /// Takes a drill's outcome into the record.
    pub fn record(&mut self, outcome: &DrillOutcome) {
        self.running_since = None;
        self.runs += 1;
        match outcome {
            DrillOutcome::Proved(proof) => {
                let claimed = match &self.restored_less {
                    Some(Failure::RestoredLess { claimed, .. }) => Some(claimed.as_str()),
                    _ => None,
                };
                if claimed.is_none_or(|claimed| proof.watermark.as_str() >= claimed) {
                    self.restored_less = None;
                }
                self.last_proof = Some(proof.clone());
            }
            DrillOutcome::Failed { failure, .. } => {
                *self.failures.entry(failure.kind()).or_default() += 1;
                if matches!(failure, Failure::RestoredLess { .. }) {
                    self.restored_less = Some(failure.clone());
                }
            }
        }
        self.last = Some(outcome.clone());
    }
}

/// The backup destination as the monitor last saw it (`backup.verify`).
#[derive(Debug, Clone, Default)]
pub struct BackupStatus {
    /// `backup.verify` is on: the fields below mean something.
    pub verifying: bool,
    /// The last listing that succeeded.
    pub listing: Option<Listing>,
    /// Litestream's newest claim is covered by the destination.
    pub verified: bool,
    /// `(newest object, newest claim)` while the destination is stale: its newest object is more than
    /// `backup.stale_after` older than litestream's newest claim.
    pub stale: Option<(Option<SystemTime>, SystemTime)>,
    /// Listings that failed, by kind.
    pub errors: std::collections::HashMap<ErrorKind, u64>,
    /// The error of the latest listing, while listings fail.
    pub failing: Option<ListError>,
}

/// What an operator must hear of the destination's layout; `None` while it restores or holds nothing yet, and for
/// litestream 0.5's files, which are a refusal of the whole deployment ([`crate::cleanup::unservable`]) rather than
/// a problem of one generation.
pub fn layout_problem(layout: &Layout) -> Option<String> {
    match layout {
        Layout::Empty | Layout::Restorable(_) | Layout::Ltx => None,
        Layout::Broken {
            generation,
            problem,
        } => Some(format!(
            "cleanup and snapshot statuses held: the backup's newest generation {generation} does not restore: \
             {problem}"
        )),
    }
}

impl Status {
    /// The latest proof of the backup: this run's drill's, else the one kept in the change DB.
    pub fn last_proof(&self) -> Option<&Proof> {
        self.drills.last_proof.as_ref().or(self.kept_proof.as_ref())
    }

    /// [`Status::last_proof`] is the kept one: no drill of this run has proved the backup yet.
    pub fn proof_is_kept(&self) -> bool {
        self.drills.last_proof.is_none() && self.kept_proof.is_some()
    }

    /// What the backup claims now, for a drill that starts now to reach ([`Claims`]): the newest watermark of
    /// litestream's gauge that the destination's listing covers (any, with `backup.verify` off), never above where
    /// the gauge is now (a gauge that went back is its own hold); and the last proof, which binds a restore of its
    /// own generation. Under `cleanup.requires = "restore"` the gauge is not read, and the proofs are the claims.
    pub fn drill_claims(&self) -> Claims {
        let chain = self
            .backup
            .listing
            .as_ref()
            .and_then(|listing| listing.layout.chain());
        let gauge = (!self.drills.drives_cleanup)
            .then(|| {
                let (current, _) = self.newest_backup.as_ref()?;
                self.recent_backups
                    .iter()
                    .map(|b| (b.watermark.as_str(), b.backed_up_at))
                    .chain(self.newest_backup.iter().map(|(w, at)| (w.as_str(), *at)))
                    .filter(|&(watermark, at)| {
                        watermark <= current.as_str()
                            && (!self.backup.verifying || chain.is_some_and(|c| c.newest >= at))
                    })
                    .map(|(watermark, _)| watermark)
                    .max()
                    .map(|watermark| Claim {
                        watermark: watermark.to_string(),
                        generation: chain.map(|c| c.generation.clone()),
                    })
            })
            .flatten();
        let proof = self.last_proof().map(|proof| Claim {
            watermark: proof.watermark.clone(),
            generation: proof.generation.clone(),
        });
        Claims { gauge, proof }
    }

    /// The watermark the last complete purge deleted below.
    pub fn last_purged(&self) -> Option<&str> {
        self.last_purge.as_ref().map(|p| p.before.as_str())
    }

    /// One line on why cleanup cannot do its job (the deployment cannot be served, litestream's gauge went back,
    /// purges fail), for `/keepalive` and systemd's status; `None` while none is so.
    pub fn cleanup_problem(&self) -> Option<String> {
        let refused = self.unservable.iter().map(|refusal| {
            format!(
                "refused ({}): cleanup and snapshot statuses held: {}",
                refusal.unservable.reason, refusal.unservable
            )
        });
        let regressed = self.backup_regressed.as_ref().map(|(highest, current)| {
            format!(
                "cleanup held: litestream's backed-up watermark went back from {highest} to {current} \
                 (restarted on an older generation?); it resumes once the backup reaches {highest} again"
            )
        });
        let stale = self.backup.stale.map(|(newest, claimed)| {
            format!(
                "backup destination stale: its newest object is from {}, litestream claims a backup at {} \
                 (litestream wedged or uploading elsewhere?); cleanup holds for claims with nothing behind them",
                newest.map_or("never (it is empty)".to_string(), |t| {
                    humantime::format_rfc3339_seconds(t).to_string()
                }),
                humantime::format_rfc3339_seconds(claimed)
            )
        });
        let unlisted =
            self.backup.failing.as_ref().map(|err| {
                format!("cleanup held: the backup destination cannot be listed ({err})")
            });
        let failing = self.purge_failure_problem();
        let state = self
            .state_problem
            .as_ref()
            .map(|problem| format!("cleanup held: {problem}"));
        let slots = self.slots_problem.as_ref().map(|problem| {
            format!("cleanup held: the slots in the change DB cannot be read ({problem})")
        });
        let unknown = self
            .backup_unknown
            .as_ref()
            .map(|why| format!("cleanup held: litestream's backed-up position is unknown ({why})"));
        let below = self.backup_below_purge.as_ref().map(|(purged, gauge)| {
            format!(
                "litestream's backup ({gauge}) is below the last purge ({purged}): a view-syncer restoring it \
                 cannot catch up (litestream restored from an older backup?)"
            )
        });
        let layout = self
            .backup
            .listing
            .as_ref()
            .and_then(|listing| layout_problem(&listing.layout));
        // Only where it stops cleanup: otherwise a failed drill is the drills' own news (/status, metrics, alerts).
        // A restore that reached less than the backup claimed stops it under either trust level.
        let drill = self
            .drills
            .backup_failure()
            .filter(|failure| {
                self.drills.drives_cleanup || matches!(failure, Failure::RestoredLess { .. })
            })
            .map(|failure| {
                format!(
                    "cleanup and snapshot statuses held: the last restore drill failed ({failure})"
                )
            });
        let disk = self
            .drills
            .disk_short()
            .filter(|_| self.drills.drives_cleanup)
            .map(|failure| format!("cleanup held: restore drills cannot run: {failure}"));
        let problems: Vec<String> = refused
            .chain(
                [
                    state, slots, below, regressed, unknown, stale, unlisted, layout, drill, disk,
                    failing,
                ]
                .into_iter()
                .flatten(),
            )
            .collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    fn purge_failure_problem(&self) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_regressed_backup_is_a_cleanup_problem_alongside_failing_purges() {
        let mut status = Status {
            backup_regressed: Some(("0d".into(), "0b".into())),
            ..Status::default()
        };
        let problem = status.cleanup_problem().unwrap();
        assert!(problem.contains("went back from 0d to 0b"), "{problem}");
        status.purge_failures.failed(failure(
            FailureClass::Transient,
            Some("55P03"),
            "lock timeout",
        ));
        let both = status.cleanup_problem().unwrap();
        assert!(
            both.starts_with(&problem) && both.contains("(transient, SQLSTATE 55P03)"),
            "{both}"
        );
        status.backup_regressed = None;
        assert!(status
            .cleanup_problem()
            .unwrap()
            .starts_with("cleanup held: the last 1"));
    }

    #[test]
    fn a_refusal_comes_first_and_says_what_to_do() {
        use crate::cleanup::unservable::{of_layout, Reason};
        let mut status = Status {
            backup_regressed: Some(("0d".into(), "0b".into())),
            ..Status::default()
        };
        status
            .unservable
            .set(Reason::Ltx, of_layout(&Layout::Ltx), std::time::UNIX_EPOCH);
        let problem = status.cleanup_problem().unwrap();
        assert!(
            problem.starts_with(
                "refused (ltx): cleanup and snapshot statuses held: the backup destination (litestream.backup_url) \
                 holds litestream 0.5 (LTX) files"
            ),
            "{problem}"
        );
        assert!(
            problem.contains("what to do: back up with litestream 0.3"),
            "{problem}"
        );
        assert!(
            problem.contains("; cleanup held: litestream's backed-up watermark went back"),
            "{problem}"
        );
        // The layout itself is not a second problem.
        assert_eq!(layout_problem(&Layout::Ltx), None);
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
}
