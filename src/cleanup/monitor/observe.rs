//! The loop's readings: the change DB's replica version, litestream's page (or the drills' proofs), the purger lock,
//! the shard's slots, the destination's listing and the change log's size. Each hands what it read to one
//! transition of [`super::Knowledge`] and says what changed; a failed read changes nothing it does not know to be
//! lost.

use std::time::SystemTime;

use tokio::time::Instant;
use tracing::{debug, error, info, warn, Level};

use crate::cleanup::change_db::{FailureClass, Purger};
use crate::cleanup::config::Requires;
use crate::cleanup::status::{layout_problem, ChangeLogReading};
use crate::cleanup::unservable::{self, Reason};
use crate::cleanup::{DestinationCheck, GaugeMove, ReservationMode};
use crate::litestream::destination::{ErrorKind, ListError};
use crate::litestream::page::scrape;

use super::knowledge::{LockMove, PositionSeen, StaleMove};
use super::{Monitor, READ_TIMEOUT};

const KNOWN_AGAIN: &str = "litestream's backed-up position is known again";

impl Monitor {
    /// Reads the change DB's `replicaVersion`; a change is a resync ([`super::Knowledge::on_replica_version`]).
    /// A failed read changes nothing (the purge itself re-checks the log's newest watermark).
    pub(super) async fn read_replica(&mut self, now: Instant) {
        let read = tokio::time::timeout(READ_TIMEOUT, self.change_db.replica_version()).await;
        let version = match read {
            Ok(Ok(Some(version))) => version,
            Ok(Ok(None)) => return,
            Ok(Err(err)) => {
                self.said.replica_problem.failed(
                    "cannot read the change DB's replica version",
                    err.to_string(),
                    Level::DEBUG,
                    now,
                );
                return;
            }
            Err(_) => return,
        };
        self.said
            .replica_problem
            .succeeded("change DB's replica version readable again");
        let Some(old) = self
            .knowledge
            .on_replica_version(version.clone(), SystemTime::now())
        else {
            return;
        };
        self.handles.registry.replica_reset();
        warn!(
            old_replica_version = %old,
            replica_version = %version,
            "the change DB was reset (a resync): claims, the last purge and the highest watermark belonged to the old \
             replica and are forgotten; open reservations protect every row; cleanup holds until a backup of the \
             new replica has aged"
        );
    }

    /// Reads litestream's page into what the loop knows. A failed read, a page without samples or a litestream that
    /// restarted makes the position unknown until a page shows the gauge again: cleanup holds, and (but for a
    /// failed read, which says nothing of the backup itself) statuses wait and new reservations protect every row.
    pub(super) async fn scrape(&mut self, now: Instant) {
        let parsed = match scrape(&self.scraper, &self.litestream.filter).await {
            Ok(parsed) => parsed,
            Err(err) => {
                self.handles.status.update(|s| s.scrape_errors += 1);
                // A bad URL, a 404 or a foreign page will not fix itself; litestream restarting will.
                let level = if err.is_transient() {
                    Level::WARN
                } else {
                    Level::ERROR
                };
                let problem = err.to_string();
                self.said.scrape_problem.failed(
                    "cannot read litestream metrics",
                    problem.clone(),
                    level,
                    now,
                );
                let seen = self.knowledge.on_unreadable_page(&problem);
                return self.position_changed(seen, KNOWN_AGAIN);
            }
        };
        for warning in &parsed.warnings {
            debug!(%warning, "metrics page");
        }
        // A page that keeps the same ignored samples is one problem, said once, not "readable again" and
        // "ignored" anew at every check.
        if parsed.warnings.is_empty() {
            self.said
                .scrape_problem
                .succeeded("litestream metrics readable again");
        } else {
            self.said.scrape_problem.failed(
                "litestream metrics page has samples that were ignored",
                parsed.warnings.join("; "),
                Level::WARN,
                now,
            );
        }
        let seen = self.knowledge.on_page(&parsed);
        self.position_changed(seen, KNOWN_AGAIN);
    }

    /// `cleanup.requires = "restore"`: litestream's page says only how large the database is (a drill's disk
    /// need); it may be down, or have no gauge, without holding anything.
    pub(super) async fn read_size_of_page(&mut self) {
        match scrape(&self.scraper, &self.litestream.filter).await {
            Ok(parsed) => self.knowledge.on_size(parsed.db_bytes),
            Err(err) => debug!(error = %err, "litestream's page not read (only its size is used)"),
        }
    }

    /// `cleanup.requires = "restore"`: the latest drill's proof, as the drill task recorded it, in place of the page.
    pub(super) fn take_proofs(&mut self) {
        let (failure, proof) = self
            .handles
            .status
            .read(|s| (s.drills.backup_failure().cloned(), s.last_proof().cloned()));
        let seen = self.knowledge.on_proof(failure.as_ref(), proof.as_ref());
        self.position_changed(seen, "a restore drill proved the backup again");
    }

    /// Passes a change of litestream's position on to the registry (which pins reservations at it) and the log;
    /// `found_says` is the line for a position known again.
    fn position_changed(&self, seen: PositionSeen, found_says: &str) {
        let lowered = seen.pass_on(&self.handles.registry);
        if let Some(why) = &seen.lost {
            warn!(why = %why, "litestream's backed-up position unknown; cleanup holds until its page shows it");
        }
        if seen.restarted {
            info!("litestream restarted; its page reports a backup again");
        }
        if let Some(was) = &seen.found {
            info!(was = %was, "{found_says}");
        }
        let Some(taken) = seen.taken else {
            return;
        };
        if taken.added > 0 {
            debug!(
                added = taken.added,
                tracked = self.knowledge.backlog().backups().len(),
                "backed-up watermarks"
            );
        }
        if let Some((purged, gauge)) = &taken.below_purge {
            error!(
                %gauge,
                last_purge = %purged,
                "litestream's backup is below the last purge: a view-syncer restoring it cannot catch up from \
                 the change log (litestream restored from an older backup, or the host was rolled back?)"
            );
        }
        match taken.gauge {
            Some(GaugeMove::Regressed {
                highest,
                current,
                dropped,
            }) => warn!(
                %highest,
                %current,
                dropped_backups = dropped,
                lowered_floors = lowered,
                last_purged = self.knowledge.backlog().last_purged().unwrap_or("none"),
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
    }

    /// Takes (or keeps) the shard's purger lock: of two sidecars for one shard only the holder purges, and the
    /// other takes over when the holder's session ends. When the change DB does not answer, the role stays as it
    /// was: no purge can run then, and each purge batch checks the lock itself.
    pub(super) async fn claim_purger(&mut self) {
        let claimed = tokio::time::timeout(READ_TIMEOUT, self.change_db.claim_purger()).await;
        let standby = match claimed {
            Ok(Ok(purger)) => purger == Purger::Standby,
            Ok(Err(err)) => {
                debug!(error = %err, "purger lock not asked about: the change DB did not answer");
                return;
            }
            Err(_) => return,
        };
        match self.knowledge.on_lock(standby) {
            LockMove::Took => info!("purger lock held: this sidecar purges for the shard"),
            LockMove::Lost => warn!(
                "standby: another sidecar holds the shard's purger lock; this one serves but does not purge, and \
                 takes over when the lock frees"
            ),
            LockMove::Same => {}
        }
    }

    /// Reads every slot of the shard, and which one bounds purges now; the purger also forgets the rows that bound
    /// nothing any more. A failed read holds cleanup (see [`Monitor::guards`]) until one succeeds.
    pub(super) async fn read_slots(&mut self) {
        let limit_now = self
            .cleanup
            .restore_limit
            .known_for(self.knowledge.db_bytes());
        let read = tokio::time::timeout(READ_TIMEOUT, self.change_db.slots(limit_now)).await;
        let slots = match read {
            Ok(Ok(slots)) => slots,
            // No connection: the readiness check and the change DB's own metric say so, and no purge can run.
            Ok(Err(err)) if err.class() == FailureClass::Unavailable => {
                debug!(error = %err, "slots not read: the change DB is not connected");
                return;
            }
            Ok(Err(err)) => {
                if let Some(problem) = self.knowledge.on_slots_unread(err.to_string()) {
                    warn!(error = %problem, "slots not read: cleanup holds until they are");
                }
                return;
            }
            Err(_) => {
                self.knowledge.on_slots_unread(format!(
                    "the change DB did not answer within {READ_TIMEOUT:?}"
                ));
                return;
            }
        };
        let any_dead = slots.iter().any(|s| !s.live);
        let seen = self
            .knowledge
            .on_slots(slots, self.cleanup.reservations == ReservationMode::Pause);
        if let Some((slot, problem)) = &seen.malformed {
            error!(%slot, %problem, "a slot is not well formed: cleanup holds until it is mended or expires");
        }
        if seen.readable_again {
            info!("slots read again");
        }
        if self.knowledge.standby() == Some(false) && any_dead {
            match tokio::time::timeout(READ_TIMEOUT, self.change_db.forget_dead_slots(limit_now))
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
    }

    /// Reads the change log's size into the status, bounded by [`READ_TIMEOUT`]: a slow or dead change DB costs
    /// the check that much at most, and `/status` only ever reads what this left.
    pub(super) async fn read_size(&self) {
        let read = tokio::time::timeout(READ_TIMEOUT, self.change_db.change_log_size()).await;
        let result = match read {
            Ok(Ok(size)) => Ok(size),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {READ_TIMEOUT:?}")),
        };
        self.handles.status.update(|s| match result {
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
    pub(super) async fn verify(&mut self, now: Instant) -> DestinationCheck {
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
                self.said.listing_problem.failed(
                    "cannot list the backup destination; cleanup holds",
                    err.to_string(),
                    Level::WARN,
                    now,
                );
                self.knowledge.on_listing_failed(err);
                self.handles.registry.set_restorable(false);
                return DestinationCheck::Unreadable;
            }
        };
        debug!(
            objects = listing.objects,
            layout = listing.layout.kind(),
            newest = ?listing.newest.map(humantime::format_rfc3339_millis),
            "backup destination listed"
        );
        self.said
            .listing_problem
            .succeeded("backup destination can be listed again");
        self.refuse(Reason::Ltx, unservable::of_layout(&listing.layout), now);
        match layout_problem(&listing.layout) {
            Some(problem) => self.said.layout_problem.failed(
                "backup destination does not restore",
                problem,
                Level::ERROR,
                now,
            ),
            None => self
                .said
                .layout_problem
                .succeeded("backup destination restores again (by its names)"),
        }
        self.handles
            .registry
            .set_restorable(listing.is_restorable());
        let fact = match self.cleanup.requires {
            // A drill's proof was restored from the destination: it needs no object to stand behind it, only a
            // destination that still restores.
            Requires::Restore if listing.is_restorable() => DestinationCheck::Unchecked,
            _ => DestinationCheck::Listed {
                reaches: listing.chain_newest(),
            },
        };
        let stale_after = self.backup.stale_after;
        let covers = fact;
        match self
            .knowledge
            .on_listing(listing, move |claimed| covers.covers(claimed), stale_after)
        {
            StaleMove::Began(newest, claimed) => error!(
                newest_object = newest.map_or("none".into(), |t| humantime::format_rfc3339_seconds(t).to_string()),
                claimed = %humantime::format_rfc3339_seconds(claimed),
                stale_after = ?stale_after,
                "backup destination stale: litestream claims backups its destination does not hold; cleanup holds \
                 for those claims (the sidecar keeps serving)"
            ),
            StaleMove::Ended(newest) => info!(
                newest_object = newest
                    .map_or("none".into(), |t| humantime::format_rfc3339_seconds(t)
                        .to_string()),
                "backup destination no longer stale"
            ),
            StaleMove::Same => {}
        }
        fact
    }
}
