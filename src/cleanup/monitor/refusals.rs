//! The checks that refuse a deployment the sidecar cannot serve ([`crate::cleanup::unservable`]): a replica that
//! backs up with litestream 0.5 or to a path of its own, and a change log that does not hold what the relay passed
//! on. A refusal holds cleanup and v4+ snapshot statuses while it stands.

use std::time::SystemTime;

use tokio::time::Instant;
use tracing::{debug, Level};

use crate::cleanup::unservable::{self, Reason, Unservable};

use super::{Monitor, READ_TIMEOUT};

impl Monitor {
    /// Records what the check for `reason` found (`None`: it does not apply now), logs it (at error when it starts
    /// or changes and every 5 minutes while it lasts, at info when it clears), and tells the registry, which
    /// withholds v4+ statuses while any refusal stands.
    pub(super) fn refuse(&mut self, reason: Reason, found: Option<Unservable>, now: Instant) {
        let throttle = self.said.refused(reason);
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
        let refused = self.knowledge.on_refusal(reason, found, SystemTime::now());
        self.handles.registry.set_unservable(refused);
    }

    /// Reads the upstream's `replicas` table where the change DB's connection sees it: a replica recorded with a
    /// path of its own or a v5 backup is a refusal. Absent (another database, Zero before 1.10), it refuses nothing.
    /// A failed read changes nothing: what the last one found stands.
    pub(super) async fn read_replica_backups(&mut self, now: Instant) {
        let read = tokio::time::timeout(READ_TIMEOUT, self.change_db.replica_backups()).await;
        let rows = match read {
            Ok(Ok(rows)) => rows,
            Ok(Err(err)) if err.class().is_permanent() => {
                self.said.replicas_problem.failed_once(
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
        self.said.replicas_problem.succeeded(&format!(
            "{} readable again",
            self.change_db.replicas_table()
        ));
        let found =
            rows.and_then(|rows| unservable::of_replicas(self.change_db.replicas_table(), &rows));
        self.refuse(Reason::BackupPath, found, now);
    }

    /// Follows the commits the relay passes on into the change log ([`unservable::LogWatch`]): one that stays out
    /// of it for `log_unwritten_after` is a refusal. A failed read changes nothing.
    pub(super) async fn watch_log(&mut self, now: Instant) {
        let Some(version) = self.knowledge.replica_version().map(str::to_owned) else {
            return;
        };
        self.log_watch.for_replica(&version);
        let relayed = self.handles.subscribers.newest_commit_of(&version);
        let relayed = relayed.as_ref().map(|(w, at)| (w.as_str(), *at));
        let Some(probe) = self
            .log_watch
            .probe(relayed, now, SystemTime::now())
            .map(str::to_owned)
        else {
            return self.refuse(Reason::LogNotWritten, None, now);
        };
        let read = tokio::time::timeout(READ_TIMEOUT, self.change_db.log_reaches(&probe)).await;
        let reaches = match read {
            Ok(Ok(reaches)) => reaches,
            Ok(Err(err)) => {
                debug!(error = %err, watermark = %probe, "change log not asked whether it holds a relayed commit");
                return;
            }
            Err(_) => return,
        };
        let found = self.log_watch.answer(
            reaches,
            now,
            self.log_unwritten_after,
            self.change_db.change_log_table(),
        );
        self.refuse(Reason::LogNotWritten, found, now);
    }
}
