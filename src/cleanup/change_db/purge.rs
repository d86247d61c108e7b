//! The batched, ownership-checked purge of `changeLog`: its target, the checks each batch makes in its transaction
//! before it deletes, and its outcome. Its own file so that every rule a batch enforces reads in one place.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::Transaction;
use tokio_util::sync::CancellationToken;

use super::ownership::read_ownership;
use super::slots::SlotCheck;
use super::sql::WatermarkSql;
use super::{ChangeDb, DbError};
use crate::cleanup::slots::{SlotLimit, SlotName};
use crate::cleanup::Ceiling;
use crate::net::address::same_address;

/// Rows deleted per purge statement unless the caller asks otherwise; keeps each batch transaction short.
pub const DEFAULT_PURGE_BATCH_ROWS: i64 = 10_000;

/// Why a purge stopped before reaching its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeStop {
    /// The caller's stop token was cancelled; checked only between batches, never inside one.
    Cancelled,
    /// `ownerAddress` no longer names the expected address (compared as `host:port`); the batch that saw it
    /// deleted nothing.
    OwnershipMoved { found: Option<String> },
    /// Another replication-manager task took the change log over (`owner` changed); the batch that saw it deleted
    /// nothing.
    OwnerChanged { found: Option<String> },
    /// A row lock is held by someone else (a newer replication-manager holds `FOR SHARE` on the earliest row while
    /// it takes over, or another purger is at work): this round is skipped, it is not an error.
    Locked,
    /// A reservation opened (or announced a lower `minWatermark`), or a subscriber registered behind the purge,
    /// while it ran: the batches after it deleted only below its floor or ack (`None`: nothing, a reservation
    /// protects every row).
    Reserved { floor: Option<String> },
    /// This handle claimed the purger lock ([`ChangeDb::claim_purger`]) but its session does not hold it (the
    /// connection was lost since, or another sidecar has it); the batch that saw it deleted nothing.
    NotPurger,
    /// The target is above the newest watermark in the log (`None`: the log is empty): the log has not reached it
    /// (a backup ahead of the storer, or a bound from before a resync), so the batch deleted nothing.
    BeyondLog { newest: Option<String> },
    /// `replicaVersion` is no longer the one the purge was decided for: the replica was resynced while it ran, and
    /// its bound, which belongs to the old log, says nothing of the new one (whose rows may sit below it). The
    /// batch that saw it deleted nothing.
    ReplicaChanged { found: Option<String> },
    /// A live slot (of any sidecar of the shard) is below the purge's bound: the batches deleted only below its floor
    /// (`None`: nothing, it protects every row). Read inside each batch, under the slot lock.
    Slot {
        slot: SlotName,
        floor: Option<String>,
    },
    /// A live slot is not well formed (a floor that is not a watermark, one of another replica): nothing is deleted
    /// until it is mended or expires.
    SlotMalformed { slot: SlotName, problem: String },
}

impl PurgeStop {
    /// A stop worth a line of its own in the log: a slot that another sidecar, or this one's previous run, holds.
    pub fn is_slot(&self) -> bool {
        matches!(
            self,
            PurgeStop::Slot { .. } | PurgeStop::SlotMalformed { .. }
        )
    }
}

/// What a cleanup check decided to purge: the rows below `before`, of the log of replica `replica_version`
/// (`None`: not checked), so that each batch can tell a log that is no longer the one decided for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeTarget<'a> {
    pub before: &'a str,
    pub replica_version: Option<&'a str>,
    /// Read every live slot inside each batch and delete nothing they need (`None`: slots are not checked).
    pub slots: Option<SlotCheck<'a>>,
}

/// Who must still own the change log for a purge batch to delete anything: `ownerAddress` must name `address`,
/// and, when given, `owner` must still be that replication-manager task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    pub address: &'a str,
    pub owner: Option<&'a str>,
}

impl<'a> From<&'a str> for Expected<'a> {
    /// Only the address is checked.
    fn from(address: &'a str) -> Self {
        Expected {
            address,
            owner: None,
        }
    }
}

/// What one [`ChangeDb::purge`] call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeOutcome {
    /// Rows deleted, over all committed batches.
    pub rows: u64,
    /// Batches committed (the last may have deleted nothing).
    pub batches: u32,
    /// `None` when every row below the target (and below the newest watermark) is gone.
    pub stopped: Option<PurgeStop>,
    /// Longest batch transaction, BEGIN to COMMIT: how long the purge held its locks at a time.
    pub slowest_batch: Duration,
}

impl PurgeOutcome {
    /// True when the purge reached its target.
    pub fn is_complete(&self) -> bool {
        self.stopped.is_none()
    }
}

impl ChangeDb {
    /// Deletes `changeLog` rows with `watermark < before`, never those at the newest watermark in the table, in
    /// batches of at most `batch_rows` rows until a batch deletes fewer. A `before` above the newest watermark
    /// deletes nothing ([`PurgeStop::BeyondLog`]).
    ///
    /// Each batch is one transaction: a plain read of `ownerAddress` and `owner` (when `expected` is given, another
    /// address or owner stops the purge with nothing deleted in that batch), the purger lock check once
    /// [`ChangeDb::claim_purger`] was called, the newest watermark, the head row locked with `FOR UPDATE NOWAIT` (a
    /// lock held elsewhere skips the round), then the DELETE. `stop` is checked only between batches.
    ///
    /// An error after some batches have committed is returned as is; its context says how many rows went first.
    pub async fn purge<'a>(
        &self,
        before: &str,
        expected: Option<impl Into<Expected<'a>>>,
        batch_rows: i64,
        stop: &CancellationToken,
    ) -> Result<PurgeOutcome, DbError> {
        let mut outcome = PurgeOutcome::default();
        self.purge_within(
            PurgeTarget {
                before,
                replica_version: None,
                slots: None,
            },
            expected,
            batch_rows,
            stop,
            || std::future::ready(Ceiling::None),
            &mut outcome,
        )
        .await?;
        Ok(outcome)
    }

    /// [`ChangeDb::purge`], checking `replicaVersion` in each batch when the target names one (a purge decided
    /// for another replica than the log's deletes nothing: [`PurgeStop::ReplicaChanged`]), with `ceiling` asked (and awaited: it may re-read litestream's gauge) before every
    /// batch: a reservation opened (or a subscriber
    /// registered behind the target) while the purge runs lowers the target of the batches after it to its floor
    /// or ack (to nothing for a reservation that protects every row), and the purge then ends as
    /// [`PurgeStop::Reserved`]. `outcome` is recorded into as batches commit, so that after an error (the server
    /// restarted, the connection dropped) it still counts the rows that went first.
    pub async fn purge_within<'a, C: std::future::Future<Output = Ceiling>>(
        &self,
        target: PurgeTarget<'_>,
        expected: Option<impl Into<Expected<'a>>>,
        batch_rows: i64,
        stop: &CancellationToken,
        ceiling: impl Fn() -> C,
        outcome: &mut PurgeOutcome,
    ) -> Result<(), DbError> {
        let PurgeTarget {
            before,
            replica_version,
            slots,
        } = target;
        let expected_address = expected.map(Into::into);
        let batch_rows = batch_rows.max(1);
        *outcome = PurgeOutcome::default();
        let mut reserved: Option<PurgeStop> = None;
        loop {
            if stop.is_cancelled() {
                outcome.stopped = Some(PurgeStop::Cancelled);
                break;
            }
            let target = match ceiling().await {
                Ceiling::None => before.to_owned(),
                Ceiling::Everything => {
                    reserved = Some(PurgeStop::Reserved { floor: None });
                    break;
                }
                Ceiling::Below(floor) if floor.as_str() < before => {
                    reserved = Some(PurgeStop::Reserved {
                        floor: Some(floor.clone()),
                    });
                    floor
                }
                Ceiling::Below(_) => before.to_owned(),
            };
            let result = self
                .purge_batch(
                    before,
                    &target,
                    expected_address,
                    replica_version,
                    slots,
                    batch_rows,
                )
                .await;
            let batch = self.noting_schema(result).map_err(|err| match err {
                DbError::Query { context, source } => DbError::Query {
                    context: format!(
                        "{context} (purge batch {}, {} rows deleted before it)",
                        outcome.batches + 1,
                        outcome.rows
                    ),
                    source,
                },
                other => other,
            })?;
            match batch {
                Batch::Deleted { rows, took, slot } => {
                    if slot.is_some() {
                        reserved = slot;
                    }
                    outcome.rows += rows;
                    outcome.batches += 1;
                    outcome.slowest_batch = outcome.slowest_batch.max(took);
                    if rows < batch_rows as u64 {
                        break;
                    }
                }
                Batch::Stopped(why) => {
                    outcome.stopped = Some(why);
                    break;
                }
            }
        }
        if outcome.stopped.is_none() {
            outcome.stopped = reserved;
        }
        Ok(())
    }

    /// One batch deleting below `target`, which is at most the purge's `bound`.
    async fn purge_batch(
        &self,
        bound: &str,
        target: &str,
        expected: Option<Expected<'_>>,
        replica_version: Option<&str>,
        slots: Option<SlotCheck<'_>>,
        batch_rows: i64,
    ) -> Result<Batch, DbError> {
        let mut client = self.client().await?;
        let sql = self.watermark_sql(&client).await?;
        let started = Instant::now();
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error("beginning a purge batch", e))?;
        // First of all: a slot committed before this point is in what the batch reads below, and one written from
        // now on commits after the batch.
        if slots.is_some() {
            let (class, key) = self.slot_lock_key();
            tx.query_one(self.inner.slot_sql.lock_exclusive, &[&class, &key])
                .await
                .map_err(|e| self.query_error("taking the slot lock", e))?;
        }

        if let Some(stop) = self
            .batch_stop(&tx, sql, bound, expected, replica_version)
            .await?
        {
            let _ = tx.rollback().await;
            return Ok(Batch::Stopped(stop));
        }

        let mut target = target.to_owned();
        let mut slot_stop = None;
        if let Some(check) = slots {
            match self.slot_limit(&tx, check, &target).await? {
                SlotLimit::Clear => {}
                SlotLimit::Below { floor, slot } => {
                    target = floor.clone();
                    slot_stop = Some(PurgeStop::Slot {
                        slot,
                        floor: Some(floor),
                    });
                }
                SlotLimit::Everything { slot } => {
                    let _ = tx.rollback().await;
                    return Ok(Batch::Stopped(PurgeStop::Slot { slot, floor: None }));
                }
                SlotLimit::Malformed { slot, problem } => {
                    let _ = tx.rollback().await;
                    return Ok(Batch::Stopped(PurgeStop::SlotMalformed { slot, problem }));
                }
            }
        }
        let target = target.as_str();

        let deleted = async {
            tx.query_opt(&sql.lock_head, &[]).await?;
            tx.execute(&sql.purge_batch, &[&target, &batch_rows]).await
        }
        .await;
        let rows = match deleted {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                let _ = tx.rollback().await;
                return Ok(Batch::Stopped(PurgeStop::Locked));
            }
            Err(e) => return Err(self.query_error("deleting changeLog rows", e)),
        };
        tx.commit()
            .await
            .map_err(|e| self.query_error("committing a purge batch", e))?;
        Ok(Batch::Deleted {
            rows,
            took: started.elapsed(),
            slot: slot_stop,
        })
    }

    /// Why a purge batch must delete nothing, if it must: checked inside its transaction, before any row lock.
    async fn batch_stop(
        &self,
        tx: &Transaction<'_>,
        sql: &WatermarkSql,
        bound: &str,
        expected: Option<Expected<'_>>,
        replica_version: Option<&str>,
    ) -> Result<Option<PurgeStop>, DbError> {
        if let Some(expected) = expected {
            // A plain read: no row version, no lock, so the storer's SERIALIZABLE transaction never conflicts.
            let found = read_ownership(tx, &self.inner.sql)
                .await
                .map_err(|e| self.query_error("reading ownerAddress", e))?;
            if !found
                .address
                .as_deref()
                .is_some_and(|f| same_address(f, expected.address))
            {
                return Ok(Some(PurgeStop::OwnershipMoved {
                    found: found.address,
                }));
            }
            if expected
                .owner
                .is_some_and(|owner| found.owner.as_deref() != Some(owner))
            {
                return Ok(Some(PurgeStop::OwnerChanged { found: found.owner }));
            }
        }
        if self.inner.purger_required.load(Ordering::SeqCst) {
            // Asked of the server: a reconnect since the claim is a new session, without the lock.
            let (class, key) = self.inner.purger_lock;
            let held: bool = tx
                .query_one(&self.inner.sql.holds_purger_lock, &[&class, &key])
                .await
                .map_err(|e| self.query_error("checking the purger lock", e))?
                .get(0);
            if !held {
                return Ok(Some(PurgeStop::NotPurger));
            }
        }
        if let Some(want) = replica_version {
            let found: Option<String> = tx
                .query_opt(&self.inner.sql.replica_version, &[])
                .await
                .map_err(|e| self.query_error("reading replicaVersion", e))?
                .map(|row| row.get(0));
            if found.as_deref() != Some(want) {
                return Ok(Some(PurgeStop::ReplicaChanged { found }));
            }
        }
        let newest: Option<String> = tx
            .query_one(&sql.max_watermark, &[])
            .await
            .map_err(|e| self.query_error("reading max(watermark)", e))?
            .get(0);
        if newest.as_deref().is_none_or(|newest| bound > newest) {
            return Ok(Some(PurgeStop::BeyondLog { newest }));
        }
        Ok(None)
    }
}

/// What one purge batch did.
enum Batch {
    /// `slot`: a slot's floor lowered the batch's target.
    Deleted {
        rows: u64,
        took: Duration,
        slot: Option<PurgeStop>,
    },
    Stopped(PurgeStop),
}
