//! When the daemon's restore drills run ([`crate::litestream::drill`] runs one): every `backup.drill_interval` once
//! the destination lists something restorable, and sooner again after a failure. Each outcome goes into the status,
//! which `/status`, the metrics and, under `cleanup.requires = "restore"`, the cleanup loop read. On demand,
//! `litestream-sidecar drill` runs one in its own process.

use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cleanup::status::{DrillOutcome, StatusHandle};
use crate::litestream::drill::Drill;

/// The first retry after a failed drill; each further one waits twice as long, up to the interval.
const FIRST_RETRY: Duration = Duration::from_secs(60);
/// How often the task looks whether the destination has become restorable before its first drill.
const WAIT_FOR_BACKUP: Duration = Duration::from_secs(5);

pub struct Drills {
    drill: Drill,
    interval: Option<Duration>,
    /// `backup.verify` lists the destination: the first drill waits for a restorable listing.
    listed: bool,
    status: StatusHandle,
}

impl Drills {
    pub fn new(
        drill: Drill,
        interval: Option<Duration>,
        drives_cleanup: bool,
        listed: bool,
        status: StatusHandle,
    ) -> Self {
        status.update(|s| {
            s.drills.interval = interval;
            s.drills.drives_cleanup = drives_cleanup;
        });
        Self {
            drill,
            interval,
            listed,
            status,
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        let swept = self.drill.sweep();
        if swept > 0 {
            warn!(
                swept,
                dir = %self.drill.dir.display(),
                "removed what earlier drills cut short left behind"
            );
        }
        let mut due: Option<tokio::time::Instant> = None;
        let mut retry = FIRST_RETRY;
        loop {
            let status = self.status.clone();
            let (interval, listed) = (self.interval, self.listed);
            let wait = async move {
                match (interval, due) {
                    (None, _) => std::future::pending().await,
                    (Some(_), Some(due)) => tokio::time::sleep_until(due).await,
                    (Some(_), None) => loop {
                        if restorable(&status, listed) {
                            break;
                        }
                        tokio::time::sleep(WAIT_FOR_BACKUP).await;
                    },
                }
            };
            // Shutdown stops a drill in progress too: litestream is killed and the scratch directory removed.
            let outcome = tokio::select! {
                () = shutdown.cancelled() => return,
                outcome = async {
                    wait.await;
                    self.run_one().await
                } => outcome,
            };
            if let Some(interval) = self.interval {
                let after = match &outcome {
                    DrillOutcome::Proved(_) => {
                        retry = FIRST_RETRY;
                        interval
                    }
                    DrillOutcome::Failed { .. } => {
                        let after = retry.min(interval);
                        retry = retry.saturating_mul(2);
                        after
                    }
                };
                due = Some(tokio::time::Instant::now() + after);
                self.status
                    .update(|s| s.drills.next_at = Some(SystemTime::now() + after));
            }
        }
    }

    async fn run_one(&self) -> DrillOutcome {
        let started = SystemTime::now();
        let (db_bytes, replica_version, claims) = self
            .status
            .read(|s| (s.db_bytes, s.replica_version.clone(), s.drill_claims()));
        self.status
            .update(|s| s.drills.running_since = Some(started));
        info!(
            dir = %self.drill.dir.display(),
            claimed = claims.gauge.as_ref().map_or("", |c| c.watermark.as_str()),
            "restore drill started"
        );
        let outcome = match self
            .drill
            .run(db_bytes, replica_version.as_deref(), &claims)
            .await
        {
            Ok(proof) => {
                info!(
                    proven_watermark = %proof.watermark,
                    replica_version = %proof.replica_version,
                    generation = proof.generation.as_deref().unwrap_or(""),
                    restore_seconds = proof.restore_took.as_secs_f64(),
                    check_seconds = proof.check_took.as_secs_f64(),
                    bytes = proof.bytes,
                    "restore drill proved the backup"
                );
                DrillOutcome::Proved(proof)
            }
            Err(failure) => {
                error!(
                    error = %failure,
                    kind = failure.kind(),
                    backup_at_fault = failure.is_backup(),
                    "restore drill failed"
                );
                DrillOutcome::Failed {
                    failure,
                    started,
                    finished: SystemTime::now(),
                }
            }
        };
        self.status.update(|s| s.drills.record(&outcome));
        outcome
    }
}

/// Scheduled drills wait for something to restore, as a drill before it could only fail: with `backup.verify` on,
/// a listing that shows a restorable generation; without it, litestream's first claim (or, when drills drive
/// cleanup and no gauge is read, nothing: the drill is the only way to learn).
fn restorable(status: &StatusHandle, listed: bool) -> bool {
    status.read(|s| {
        if listed {
            s.backup
                .listing
                .as_ref()
                .is_some_and(|listing| listing.is_restorable())
        } else {
            s.drills.drives_cleanup || s.newest_backup.is_some()
        }
    })
}
