//! Acting on a decision: a hold is counted and said once; a purge runs batch by batch, each bounded afresh by
//! litestream's page (or the drills' proofs), the reservations and the subscribers, and checked by the change DB
//! against the owner, the purger lock, the replica and the slots. A failure is counted and logged by kind.

use std::sync::Mutex;
use std::time::SystemTime;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cleanup::change_db::{
    DbError, Expected, PurgeOutcome, PurgeStop, PurgeTarget, SlotCheck, SlotRule,
};
use crate::cleanup::config::Requires;
use crate::cleanup::discovery::DiscoveryMode;
use crate::cleanup::status::{HeldSince, Loudness, PurgeFailure};
use crate::cleanup::{self, Decision, PurgeRun, ReservationMode};
use crate::litestream::page::scrape;

use super::gather::Gathered;
use super::knowledge::GaugeWatch;
use super::{purge_limit, Monitor};

impl Monitor {
    pub(super) async fn act(
        &mut self,
        decision: Decision,
        observed: &Gathered,
        shutdown: &CancellationToken,
    ) {
        self.handles
            .status
            .update(|s| s.last_decision = Some(decision.clone()));
        let (before, bound) = match decision {
            Decision::Hold(reason) => {
                self.handles.status.update(|s| {
                    *s.holds.entry(reason).or_default() += 1;
                    if s.held_since.as_ref().is_none_or(|h| h.reason != reason) {
                        s.held_since = Some(HeldSince {
                            reason,
                            since: Instant::now(),
                            since_wall: SystemTime::now(),
                        });
                    }
                });
                if self.said.last_hold != Some(reason) {
                    info!(%reason, "cleanup held");
                    self.said.last_hold = Some(reason);
                }
                return;
            }
            Decision::Purge { before, bound } => (before, bound),
        };
        self.said.last_hold = None;
        self.handles.status.update(|s| s.held_since = None);
        if !self.cleanup.enabled {
            info!(before = %before, %bound, "cleanup would purge (cleanup.enabled = false)");
            return;
        }
        let mut outcome = PurgeOutcome::default();
        let stopped = Mutex::new(None);
        let purged = {
            let this = &*self;
            // Every batch re-checks who owns the change log: the sidecar's address (verify, adopt), or the
            // replication-manager's address held by the task discovery saw (owner).
            let expected = match this.discovery_config.mode {
                DiscoveryMode::Off => None,
                DiscoveryMode::Verify | DiscoveryMode::Adopt => Some(Expected::from(
                    this.discovery_config.advertise_address.as_str(),
                )),
                DiscoveryMode::Owner => Some(Expected {
                    address: &this.upstream_address,
                    owner: observed.owner.as_deref(),
                }),
            };
            let holder = this.handles.status.read(|s| s.holder.clone());
            // Litestream can restart or go back while a long purge runs: its gauge is read again before every
            // batch, and anything but a steady gauge stops the purge (the next check decides afresh).
            let gauge = this.knowledge.gauge_watch();
            this.change_db
                .purge_within(
                    // The version this decision was made for: a resync while the purge runs stops it.
                    PurgeTarget {
                        before: &before,
                        replica_version: observed.replica_version.as_deref(),
                        slots: Some(SlotCheck {
                            rule: SlotRule {
                                pause: this.cleanup.reservations == ReservationMode::Pause,
                                restore_limit_now: this
                                    .cleanup
                                    .restore_limit
                                    .known_for(this.knowledge.db_bytes()),
                            },
                            own: Some(&holder),
                        }),
                    },
                    expected,
                    this.cleanup.batch_rows,
                    shutdown,
                    || this.batch_limit(&gauge, &stopped),
                    &mut outcome,
                )
                .await
        };
        if let Some(why) = stopped.into_inner().unwrap_or_else(|e| e.into_inner()) {
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
        self.handles.status.update(|s| {
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
                self.knowledge.on_purged(
                    &before,
                    PurgeRun {
                        bound: bound.to_string(),
                        rows: outcome.rows,
                        completed_at: SystemTime::now(),
                    },
                );
                self.publish();
            }
            Some(PurgeStop::Slot { slot, floor }) => warn!(
                before = %before,
                %bound,
                rows = outcome.rows,
                %slot,
                floor = floor.as_deref().unwrap_or("every row"),
                "change log purge stopped at a slot below its bound (another sidecar's, or a socket since closed); \
                 the next check continues"
            ),
            Some(PurgeStop::SlotMalformed { slot, problem }) => error!(
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

    /// How far the next batch of a running purge may go: litestream's gauge read again (and handed to the registry,
    /// so that a reservation opened now is pinned at the freshest position), then reservations and subscribers.
    /// Once the gauge moved, why is kept in `stopped` and the purge goes no further.
    async fn batch_limit(
        &self,
        gauge: &GaugeWatch,
        stopped: &Mutex<Option<String>>,
    ) -> cleanup::Ceiling {
        let verdict = match self.cleanup.requires {
            Requires::Restore => {
                let (failure, proof) = self
                    .handles
                    .status
                    .read(|s| (s.drills.backup_failure().cloned(), s.last_proof().cloned()));
                gauge.judge_proof(failure.as_ref(), proof.as_ref())
            }
            Requires::Listing => {
                let page = scrape(&self.scraper, &self.litestream.filter).await;
                gauge.judge_page(page.as_ref().map_err(ToString::to_string))
            }
        };
        verdict.pass_on(&self.handles.registry);
        if let Some(why) = verdict.moved {
            *stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            return cleanup::Ceiling::Everything;
        }
        purge_limit(
            self.cleanup.reservations,
            &self.handles.registry,
            &self.handles.subscribers,
            self.cleanup.reconnect_grace,
        )
    }

    /// Counts a failed purge and logs it once per kind: at error, with the SQLSTATE and what to do, when it will
    /// not heal by itself; at warn otherwise. The rows of the batches `done` before the failure committed, and are
    /// counted as purged.
    fn purge_failed(&self, err: &DbError, done: &PurgeOutcome) {
        let failure = PurgeFailure::of(err);
        let mut loudness = Loudness::Quiet;
        let mut consecutive = 0;
        self.handles.status.update(|s| {
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
