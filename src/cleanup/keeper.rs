//! Keeps this sidecar's slots and the shard's memory in the change DB current ([`crate::cleanup::slots`]).
//!
//! At start it creates or migrates the sidecar's schema, imports a state file an earlier release left (once: it is
//! renamed after), and reads the shard's memory for the cleanup loop. Then every change of the open reservations
//! is written within moments, and a status goes out only once its reservation's row has committed
//! ([`crate::cleanup::reservations::Registry::durable`]): a view-syncer that starts to restore must not depend on
//! a reservation that only this process knows. Subscribers' rows and a heartbeat for every row it holds follow
//! every [`HEARTBEAT`], and sooner when a subscriber comes or goes; a subscription's row is written in the
//! transaction that ends its reservation.
//!
//! While the change DB cannot be written, statuses wait and cleanup holds ([`Memory::Unwritable`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cleanup::change_db::{
    ChangeDb, ReservationWrite, ShardMemory, SlotWrites, SlotWritten, SubscriberRow,
};
use crate::cleanup::config::CleanupConfig;
use crate::cleanup::handles::Handles;
use crate::cleanup::monitor::Resumed;
use crate::cleanup::reservations::Written;
use crate::cleanup::slots::{subscriber_grace, HEARTBEAT};
use crate::cleanup::state::{self, Saved};
use crate::cleanup::{LastPurge, Memory};
use crate::litestream::drill::{Failure, Proof};

/// How often the shard's memory is compared with what was written, and a failed write tried again.
const RECHECK: Duration = Duration::from_secs(1);
/// One write never waits longer than this for the change DB.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Keeper {
    pub db: ChangeDb,
    /// Who this sidecar is in the slot table.
    pub holder: String,
    pub handles: Handles,
    /// `[cleanup]`: which departed subscribers are still tracked (`reconnect_grace`), how long a reservation lives
    /// (`restore_limit`), and the state file an earlier release may have left (`state_file`), imported at the
    /// first start.
    pub cleanup: CleanupConfig,
    /// Where the cleanup loop learns the shard's memory, once read.
    pub resumed: tokio::sync::watch::Sender<Option<Resumed>>,
}

/// A reservation row as this sidecar last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrittenReservation {
    lease: u64,
    floor: Option<String>,
    replica_version: Option<String>,
}

/// The changes that bring the rows `written` to the open reservations `open` (task, lease, floor, protocol),
/// written for replica `replica_version`. Pure, so that the rules are tested without a database: a new lease opens
/// (replacing any row of the task), a moved floor is updated, a reservation no longer open is closed (its row
/// stays until its task subscribes or its limit passes), unless `unsent` says its socket closed before its status
/// went out: then its row goes.
fn reservation_writes(
    written: &HashMap<String, WrittenReservation>,
    open: &[(String, u64, Option<String>, u64)],
    unsent: &[(String, u64)],
    replica_version: Option<&str>,
    restore_limit: Option<Duration>,
) -> Vec<ReservationWrite> {
    let mut writes = Vec::new();
    for (task, lease, floor, protocol) in open {
        let replica_version = replica_version.map(str::to_owned);
        match written.get(task) {
            Some(w) if w.lease == *lease => {
                // A floor written before the replica version was read was tagged with the change log's by the
                // write itself; only another replica (a resync) is news.
                let other_replica = matches!(
                    (&w.replica_version, &replica_version),
                    (Some(was), Some(now)) if was != now
                );
                if w.floor != *floor || (floor.is_some() && other_replica) {
                    writes.push(ReservationWrite::Floor {
                        task_id: task.clone(),
                        lease: *lease as i64,
                        floor: floor.clone(),
                        replica_version,
                    });
                }
            }
            _ => writes.push(ReservationWrite::Open {
                task_id: task.clone(),
                lease: *lease as i64,
                floor: floor.clone(),
                replica_version,
                protocol: i32::try_from(*protocol).unwrap_or(0),
                connected: true,
                restore_limit,
                opened_ago: Duration::ZERO,
            }),
        }
    }
    for (task, w) in written {
        if !open
            .iter()
            .any(|(t, lease, _, _)| t == task && *lease == w.lease)
        {
            let task_id = task.clone();
            let lease = w.lease as i64;
            writes.push(if unsent.iter().any(|(t, l)| t == task && *l == w.lease) {
                ReservationWrite::Forget { task_id, lease }
            } else {
                ReservationWrite::Close { task_id, lease }
            });
        }
    }
    writes
}

/// Applies a successful write of `writes` to `written`.
fn apply(written: &mut HashMap<String, WrittenReservation>, writes: &[ReservationWrite]) {
    for write in writes {
        match write {
            ReservationWrite::Open {
                task_id,
                lease,
                floor,
                replica_version,
                ..
            }
            | ReservationWrite::Floor {
                task_id,
                lease,
                floor,
                replica_version,
            } => {
                written.insert(
                    task_id.clone(),
                    WrittenReservation {
                        lease: *lease as u64,
                        floor: floor.clone(),
                        replica_version: replica_version.clone(),
                    },
                );
            }
            ReservationWrite::Close { task_id, lease }
            | ReservationWrite::Forget { task_id, lease } => {
                if written
                    .get(task_id)
                    .is_some_and(|w| w.lease == *lease as u64)
                {
                    written.remove(task_id);
                }
            }
            // Without a socket of this run: nothing of it to follow.
            ReservationWrite::Import { .. } => {}
        }
    }
}

impl Keeper {
    /// Starts (schema, import, memory), then writes until `shutdown`, then once more, so that a clean stop leaves
    /// every socket it closed marked closed.
    pub async fn run(self, shutdown: CancellationToken) {
        self.handles
            .status
            .update(|s| s.holder = self.holder.clone());
        let mut backoff = Duration::from_millis(250);
        let mut said: Option<String> = None;
        // The latest drill proof the change DB holds as this sidecar knows it: a new one is written once.
        let mut proof_written: Option<Proof>;
        loop {
            // A connection first: while there is none, the sidecar is starting (or the change DB is down, which
            // the supervisor and the readiness check report), not failing here.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                () = self.db.ready() => {}
            }
            match self.start().await {
                Ok((resumed, kept)) => {
                    let _ = self.resumed.send(Some(resumed));
                    proof_written = kept;
                    break;
                }
                Err(problem) => {
                    if said.as_deref() != Some(problem.as_str()) {
                        error!(error = %problem, "the sidecar's schema in the change DB cannot be used yet: cleanup \
                               holds and snapshot statuses wait; retrying");
                    }
                    self.handles.status.update(|s| {
                        s.memory = Memory::Unreadable;
                        s.state_problem = Some(problem.clone());
                    });
                    said = Some(problem);
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
        let mut changes = self.handles.registry.changes();
        let mut written: HashMap<String, WrittenReservation> = HashMap::new();
        let mut subscribers_written: Option<Vec<SubscriberRow>> = None;
        let mut last_heartbeat: Option<Instant> = None;
        let mut memory_written: Option<ShardMemory> = None;
        let mut less_forgotten: Option<Failure> = None;
        let mut failing = false;
        loop {
            let version = *changes.borrow_and_update();
            let now = Instant::now();
            let heartbeat = last_heartbeat.is_none_or(|at| now.duration_since(at) >= HEARTBEAT);
            let (writes, rows) =
                self.gather(&written, subscribers_written.as_deref(), heartbeat, now);
            let outcome = if writes.is_empty() {
                Ok(SlotWritten::default())
            } else {
                self.write(&writes).await
            };
            match outcome {
                Ok(outcome) => {
                    apply(&mut written, &writes.reservations);
                    if writes.subscribers.is_some() {
                        subscribers_written = Some(rows);
                    }
                    if heartbeat {
                        last_heartbeat = Some(now);
                    }
                    self.settle(outcome, &mut written);
                    self.handles.registry.set_written(Written::Through(version));
                    if std::mem::take(&mut failing) {
                        info!("slots written to the change DB again; cleanup may resume");
                    }
                    self.handles.status.update(|s| {
                        s.memory = Memory::Kept;
                        s.state_problem = None;
                    });
                }
                Err(problem) => {
                    self.handles
                        .registry
                        .put_back_subscribed(writes.subscribed, now);
                    if !std::mem::replace(&mut failing, true) {
                        warn!(
                            error = %problem,
                            "cannot write slots to the change DB: snapshot statuses wait and cleanup holds; \
                             retrying every second"
                        );
                    }
                    self.handles.status.update(|s| {
                        s.memory = Memory::Unwritable;
                        s.state_problem = Some(problem);
                    });
                }
            }
            // A restore that reached less than a kept proof unmakes it: a restart must not stand on it.
            let less = self.handles.status.read(|s| s.drills.restored_less.clone());
            if less != less_forgotten {
                if let Some(Failure::RestoredLess {
                    restored,
                    generation,
                    ..
                }) = &less
                {
                    let forgot = tokio::time::timeout(
                        WRITE_TIMEOUT,
                        self.db.forget_proof(generation.as_deref(), restored),
                    )
                    .await;
                    match forgot {
                        Ok(Ok(_)) => less_forgotten = less,
                        Ok(Err(err)) => debug!(error = %err, "a broken proof not forgotten yet"),
                        Err(_) => {
                            debug!("a broken proof not forgotten yet: the change DB did not answer")
                        }
                    }
                } else {
                    less_forgotten = less;
                }
            }
            let proof = self.handles.status.read(|s| s.drills.last_proof.clone());
            if let Some(new) = proof.as_ref().filter(|_| proof != proof_written) {
                let wrote =
                    tokio::time::timeout(WRITE_TIMEOUT, self.db.write_proof(new, &self.holder))
                        .await;
                match wrote {
                    Ok(Ok(())) => proof_written = proof,
                    Ok(Err(err)) => debug!(error = %err, "drill proof not written yet"),
                    Err(_) => debug!("drill proof not written yet: the change DB did not answer"),
                }
            }
            let memory = self.memory();
            if memory_written.as_ref() != Some(&memory) {
                let wrote =
                    tokio::time::timeout(WRITE_TIMEOUT, self.db.write_shard_memory(&memory)).await;
                if let Ok(Ok(())) = wrote {
                    memory_written = Some(memory);
                }
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
        let (writes, _) = self.gather(
            &written,
            subscribers_written.as_deref(),
            true,
            Instant::now(),
        );
        if let Err(problem) = self.write(&writes).await {
            warn!(error = %problem, "slots not written at shutdown: rows of closed sockets expire by themselves");
        }
    }

    /// What to write now: the subscriptions that ended reservations, the reservations' changes, and the
    /// subscribers when they changed (who, or whether connected) or a heartbeat is due. Returns the subscribers'
    /// rows as they are now.
    fn gather(
        &self,
        written: &HashMap<String, WrittenReservation>,
        subscribers_written: Option<&[SubscriberRow]>,
        heartbeat: bool,
        now: Instant,
    ) -> (SlotWrites, Vec<SubscriberRow>) {
        let (replica_version, db_bytes) = self
            .handles
            .status
            .read(|s| (s.replica_version.clone(), s.db_bytes));
        let rows = self.subscriber_rows(now);
        let changed = subscribers_written.is_none_or(|before| {
            before.len() != rows.len()
                || before
                    .iter()
                    .zip(&rows)
                    .any(|(a, b)| a.key != b.key || a.connected != b.connected)
        });
        let subscribed = self.handles.registry.take_subscribed(now);
        // Taken before the open ones are read: a reservation that closes between the two reads is closed, as any
        // whose status went out (more protection, never less).
        let unsent: Vec<(String, u64)> = self
            .handles
            .registry
            .take_released()
            .into_iter()
            .filter(|(_, _, sent)| !sent)
            .map(|(task, lease, _)| (task, lease))
            .collect();
        let writes = SlotWrites {
            reservations: reservation_writes(
                written,
                &self.handles.registry.for_slots(),
                &unsent,
                replica_version.as_deref(),
                self.cleanup.restore_limit.known_for(db_bytes),
            ),
            subscribers: (heartbeat || changed || !subscribed.is_empty())
                .then(|| (rows.clone(), subscriber_grace(self.cleanup.reconnect_grace))),
            subscribed,
            heartbeat,
        };
        (writes, rows)
    }

    fn subscriber_rows(&self, now: Instant) -> Vec<SubscriberRow> {
        let mut rows: Vec<SubscriberRow> = self
            .handles
            .subscribers
            .for_slots(now, self.cleanup.reconnect_grace)
            .into_iter()
            .map(|(n, view)| SubscriberRow {
                key: format!("{}#{n}", self.holder),
                task_id: view.info.task_id.clone(),
                subscriber_id: view.info.id.clone(),
                floor: view.acked.clone(),
                replica_version: view.info.replica_version.clone(),
                connected: view.departed.is_none(),
            })
            .collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }

    async fn write(&self, writes: &SlotWrites) -> Result<SlotWritten, String> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.db.write_slots(&self.holder, writes)).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {WRITE_TIMEOUT:?}")),
        }
    }

    /// Takes in what a write found: restores that ended (their length teaches the cleanup delay), and this
    /// sidecar's reservations whose rows another sidecar ended.
    fn settle(&self, outcome: SlotWritten, written: &mut HashMap<String, WrittenReservation>) {
        for (task_id, holder, held, connected) in outcome.ended {
            self.handles.registry.learned(held);
            // The relay logs the end of a reservation whose socket it holds; this one's socket is elsewhere or
            // closed (another sidecar's, this one's before a restart, or one whose view-syncer closed it).
            if holder != self.holder || !connected {
                info!(%task_id, %holder, held = ?held, "reservation ended by its subscription");
            }
        }
        if let Some(own) = outcome.own_reservations {
            written.retain(|task, w| {
                let there = own.iter().any(|(t, lease)| t == task && *lease as u64 == w.lease);
                if !there && self.handles.registry.ended_elsewhere(task, w.lease) {
                    info!(task_id = %task, "reservation ended: its task subscribed through another sidecar");
                }
                there
            });
        }
    }

    /// This sidecar's view of the shard's memory.
    fn memory(&self) -> ShardMemory {
        let (last_purge, highest_backup, replica_version, restores_unknown_since) =
            self.handles.status.read(|s| {
                (
                    s.last_purge.clone(),
                    s.highest_backup.clone(),
                    s.replica_version.clone(),
                    s.restores_unknown_since,
                )
            });
        ShardMemory {
            replica_version,
            last_purge: last_purge.and_then(|p| Some((p.before, p.backed_up_at?))),
            highest_backup,
            cleanup_delay: self.handles.registry.cleanup_delay(),
            restores_unknown_since,
            imported_from: None,
        }
    }

    /// Migrates the schema, imports a state file if one is there, and reads the shard's memory and the newest drill
    /// proof kept (the status's last proof until a drill of this run proves).
    async fn start(&self) -> Result<(Resumed, Option<Proof>), String> {
        let version = self.db.migrate().await.map_err(|e| e.to_string())?;
        let mut memory = self.db.shard_memory().await.map_err(|e| e.to_string())?;
        let imported = self.import().await?;
        if memory.is_none() {
            let first = imported.clone().unwrap_or_else(|| ShardMemory {
                replica_version: None,
                last_purge: None,
                highest_backup: None,
                cleanup_delay: Duration::ZERO,
                // Nothing says which restores were in flight before this start.
                restores_unknown_since: Some(SystemTime::now()),
                imported_from: None,
            });
            if imported.is_none() {
                warn!(
                    "no slots and no state file yet (a first start): a restore begun before this start may be in \
                     flight unseen, so cleanup holds for cleanup.hold_without_state"
                );
            }
            self.db
                .create_shard_memory(&first)
                .await
                .map_err(|e| e.to_string())?;
            memory = self.db.shard_memory().await.map_err(|e| e.to_string())?;
        } else if let Some(imported) = &imported {
            self.db
                .write_shard_memory(imported)
                .await
                .map_err(|e| e.to_string())?;
            memory = self.db.shard_memory().await.map_err(|e| e.to_string())?;
        }
        let memory = memory.ok_or("the shard's memory was written but reads back empty")?;
        self.handles.registry.learned(memory.cleanup_delay);
        info!(
            schema = %self.db.sidecar_schema(),
            version,
            holder = %self.holder,
            cleanup_delay = ?memory.cleanup_delay,
            last_purge = memory.last_purge.as_ref().map_or("", |(w, _)| w.as_str()),
            highest_backup = memory.highest_backup.as_deref().unwrap_or(""),
            replica_version = memory.replica_version.as_deref().unwrap_or(""),
            "slots and the shard's memory read from the change DB"
        );
        let kept = self.db.latest_proof().await.map_err(|e| e.to_string())?;
        if let Some(proof) = &kept {
            info!(
                proven_watermark = %proof.watermark,
                generation = proof.generation.as_deref().unwrap_or(""),
                replica_version = %proof.replica_version,
                finished_at = %humantime::format_rfc3339_seconds(proof.finished),
                "the newest restore drill proof read from the change DB"
            );
        }
        self.handles.status.update(|s| {
            s.memory = Memory::Kept;
            s.state_problem = None;
            s.kept_proof = kept.clone();
        });
        let resumed = Resumed {
            last_purge: memory.last_purge.map(|(before, backed_up_at)| LastPurge {
                before,
                backed_up_at: Some(backed_up_at),
                run: None,
            }),
            highest_backup: memory.highest_backup,
            replica_version: memory.replica_version,
            restores_unknown_since: memory.restores_unknown_since,
        };
        Ok((resumed, kept))
    }

    /// Imports the state file an earlier release left, if there is one: its reservations and subscribers become
    /// slots, what it remembered goes into the shard's memory, and it is renamed `*.imported` so that it is read
    /// once. A file that cannot be read is left where it is and imports nothing: which restores were in flight is
    /// then unknown, and cleanup holds for `cleanup.hold_without_state`.
    async fn import(&self) -> Result<Option<ShardMemory>, String> {
        let Some(path) = self.cleanup.state_file.clone() else {
            return Ok(None);
        };
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || state::load(&path))
                .await
                .map_err(|e| e.to_string())?
        };
        let saved: Saved = match read {
            Ok(Some(saved)) => saved,
            Ok(None) => return Ok(None),
            Err(err) => {
                error!(error = %err, "state file of an earlier release not imported: it cannot be read; which \
                       restores were in flight is unknown, so cleanup holds for cleanup.hold_without_state. Move \
                       it aside once no view-syncer is restoring");
                return Ok(Some(ShardMemory {
                    replica_version: None,
                    last_purge: None,
                    highest_backup: None,
                    cleanup_delay: Duration::ZERO,
                    restores_unknown_since: Some(SystemTime::now()),
                    imported_from: Some(path.display().to_string()),
                }));
            }
        };
        let wall_now = SystemTime::now();
        let reservations = saved
            .reservations
            .iter()
            .map(|kept| ReservationWrite::Import {
                task_id: kept.task_id.clone(),
                floor: kept.floor.clone(),
                replica_version: saved.replica_version.clone(),
                protocol: i32::try_from(kept.protocol).unwrap_or(0),
                opened_ago: wall_now.duration_since(kept.opened_at).unwrap_or_default(),
            })
            .collect();
        let subscribers = saved
            .subscribers
            .iter()
            .enumerate()
            .map(|(n, kept)| SubscriberRow {
                key: format!("{}/imported#{n}", self.holder),
                task_id: kept.task_id.clone(),
                subscriber_id: kept.id.clone(),
                floor: kept.acked.clone(),
                replica_version: kept.replica_version.clone(),
                connected: false,
            })
            .collect::<Vec<_>>();
        let writes = SlotWrites {
            subscribed: Vec::new(),
            reservations,
            subscribers: None,
            heartbeat: false,
        };
        self.db
            .write_slots(&self.holder, &writes)
            .await
            .map_err(|e| e.to_string())?;
        if !subscribers.is_empty() {
            // Under a holder of their own: nobody vouches for them, so they live for their grace from now.
            self.db
                .write_slots(
                    &format!("{}/imported", self.holder),
                    &SlotWrites {
                        subscribers: Some((
                            subscribers,
                            subscriber_grace(self.cleanup.reconnect_grace),
                        )),
                        ..SlotWrites::default()
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
        }
        let mut renamed = path.clone().into_os_string();
        renamed.push(".imported");
        // Imported again at the next start if it stays: the same rows, and rows already there stand.
        if let Err(err) = std::fs::rename(&path, &renamed) {
            warn!(
                path = %path.display(),
                error = %err,
                "state file imported but not renamed: it is imported again at the next start (rows already in the \
                 change DB stand); move it aside"
            );
        }
        info!(
            path = %path.display(),
            renamed = %PathBuf::from(&renamed).display(),
            reservations = saved.reservations.len(),
            subscribers = saved.subscribers.len(),
            "state file of an earlier release imported into the change DB"
        );
        Ok(Some(ShardMemory {
            replica_version: saved.replica_version,
            last_purge: saved.last_purge.map(|b| (b.watermark, b.backed_up_at)),
            highest_backup: saved.highest_backup,
            cleanup_delay: saved.cleanup_delay,
            restores_unknown_since: if saved.knows_reservations {
                saved.restores_unknown_since
            } else {
                Some(wall_now)
            },
            imported_from: Some(path.display().to_string()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(task: &str, lease: u64, floor: Option<&str>) -> (String, u64, Option<String>, u64) {
        (task.into(), lease, floor.map(Into::into), 6)
    }

    #[test]
    fn reservations_open_move_and_close_as_their_rows() {
        let mut written = HashMap::new();
        let first =
            reservation_writes(&written, &[open("a", 1, Some("0a"))], &[], Some("01"), None);
        assert!(
            matches!(&first[..], [ReservationWrite::Open { task_id, lease: 1, restore_limit: None, .. }] if task_id == "a")
        );
        apply(&mut written, &first);
        // Nothing changed: nothing to write.
        assert!(
            reservation_writes(&written, &[open("a", 1, Some("0a"))], &[], Some("01"), None)
                .is_empty()
        );
        // The floor moved.
        let moved = reservation_writes(&written, &[open("a", 1, None)], &[], Some("01"), None);
        assert_eq!(
            moved,
            [ReservationWrite::Floor {
                task_id: "a".into(),
                lease: 1,
                floor: None,
                replica_version: Some("01".into())
            }]
        );
        apply(&mut written, &moved);
        // Replaced by a retry of its task: a new lease opens; the old lease's close matches no row (it is the new one's).
        let replaced = reservation_writes(
            &written,
            &[open("a", 2, Some("0b"))],
            &[],
            Some("01"),
            Some(Duration::from_secs(3600)),
        );
        assert!(matches!(
            &replaced[..],
            [
                ReservationWrite::Open { lease: 2, .. },
                ReservationWrite::Close { lease: 1, .. }
            ]
        ));
        apply(&mut written, &replaced);
        assert_eq!(
            written["a"].lease, 2,
            "the close of the old lease leaves the new one"
        );
        // Its socket closed.
        // One whose status never went out is forgotten; one whose status did is closed.
        assert_eq!(
            reservation_writes(&written, &[], &[("a".into(), 2)], Some("01"), None),
            [ReservationWrite::Forget {
                task_id: "a".into(),
                lease: 2
            }]
        );
        let closed = reservation_writes(&written, &[], &[], Some("01"), None);
        assert_eq!(
            closed,
            [ReservationWrite::Close {
                task_id: "a".into(),
                lease: 2
            }]
        );
        apply(&mut written, &closed);
        assert!(written.is_empty());
    }

    #[test]
    fn a_floor_written_before_the_replica_was_known_is_not_written_again_for_it() {
        // The write tagged it with the change log's replica: learning the version is no news, another one is.
        let mut written = HashMap::new();
        let first = reservation_writes(&written, &[open("a", 1, Some("0a"))], &[], None, None);
        apply(&mut written, &first);
        assert!(
            reservation_writes(&written, &[open("a", 1, Some("0a"))], &[], Some("01"), None)
                .is_empty()
        );
        let known = reservation_writes(
            &HashMap::new(),
            &[open("a", 1, Some("0a"))],
            &[],
            Some("01"),
            None,
        );
        let mut written = HashMap::new();
        apply(&mut written, &known);
        assert!(matches!(
            &reservation_writes(&written, &[open("a", 1, Some("0a"))], &[], Some("02"), None)[..],
            [ReservationWrite::Floor { replica_version: Some(v), .. }] if v == "02"
        ));
    }
}
