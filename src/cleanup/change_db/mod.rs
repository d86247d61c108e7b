//! The Zero change DB in PostgreSQL (docs/protocol.md, "The change DB"): one supervised connection, the reads the
//! sidecar needs (discovery address, replica version, oldest watermark, schema version), the `ownerAddress`
//! compare-and-set, and the batched, ownership-checked purge of `changeLog`.
//!
//! It holds no policy: which watermark may be purged, and when, is [`crate::cleanup`]'s decision; this module only
//! carries it out safely.
//!
//! Safety rules, all from docs/protocol.md:
//! - Zero 0.20's storer runs each upstream transaction at SERIALIZABLE and treats a serialization failure as lost
//!   ownership, which stops the replication-manager ("The storer's transactions", "Writing ownerAddress under a
//!   serializable storer"). So this module never UPDATEs or locks the `replicationState` row except through
//!   [`ChangeDb::adopt_address`] / [`ChangeDb::restore_address`], whose single statement matches no row (creates no row
//!   version) unless a change is needed, and it never touches `owner`.
//! - A purge runs in bounded batches, each its own transaction that first re-reads `ownerAddress` with a plain SELECT,
//!   then takes the head row with `FOR UPDATE NOWAIT` (a newer RM holds `FOR SHARE` on it while it takes over,
//!   "Ownership"), and never deletes rows at the newest watermark in the table ("Purging the newest transaction"). A
//!   target above that watermark deletes nothing: the log has not reached it, and a bound left from before a resync
//!   onto a cluster with lower LSNs would otherwise delete all of the new log but its newest transaction.
//! - Only one sidecar purges a shard: [`ChangeDb::claim_purger`] takes a session advisory lock keyed by the shard
//!   ([`purger_lock_key`]), and once a handle has claimed, each of its purge batches checks that its session still
//!   holds it.
//! - Watermarks compare as bytes ("Watermarks", "Collations that do not sort watermarks as bytes"). Zero's DDL leaves
//!   `watermark` in the database's default collation, and most collations (`C`, `en_US`, ICU root) order LexiVersions'
//!   `[0-9a-z]` as bytes, so the statements use the column's collation and the primary-key index serves them. Some do
//!   not (Danish puts "aa" after "z", Estonian "z" before "t"): once per connection the column's collation is checked
//!   against byte order over every string of up to three such characters, and where it disagrees the statements compare
//!   `COLLATE "C"` instead (correct, but without the index).
//!
//! This file is the handle: its one connection, shared by every clone, and the helpers every operation goes through
//! (the client, the watermark statements for the column's collation, error mapping); its public API is re-exported
//! here. Each job behind it has its own file, so that each can be read and tested alone: `purge.rs` (the batched
//! purge and the checks each batch makes), `purger_lock.rs` (the shard's purger lock and its key), `ownership.rs`
//! (the address row and its compare-and-set), `reads.rs` (what the sidecar reads to report and decide),
//! `error.rs` (failures and their classes), `slots.rs` (the sidecar's own schema, and the slots a purge batch
//! reads), `sql.rs` (the statements' text), `supervisor.rs` (keeping the one connection up) and `tls.rs` (the
//! connector the connection string's `sslmode` asks for).

pub mod config;
mod error;
mod ownership;
mod purge;
mod purger_lock;
mod reads;
mod slots;
mod sql;
mod supervisor;
pub(crate) mod tls;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, MappedMutexGuard, MutexGuard};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::protocol::shard::ZeroConfig;
use error::with_cause;
pub use error::{DbError, FailureClass};
pub use ownership::OwnerRow;
pub use purge::{Expected, PurgeOutcome, PurgeStop, PurgeTarget, DEFAULT_PURGE_BATCH_ROWS};
pub use purger_lock::{purger_lock_key, Purger, PURGER_LOCK_CLASS};
pub use reads::{ChangeLogSize, EXACT_COUNT_LIMIT};
pub use slots::{
    slot_lock_key, ReservationWrite, ShardMemory, SlotCheck, SlotRule, SlotWrites, SlotWritten,
    SubscriberRow, SCHEMA_VERSION,
};
use sql::{byte_order_probe, Sql, WatermarkSql};
use supervisor::{Link, Logged};
use tls::ChangeDbTls;

/// Connection supervision settings. The defaults suit production; tests shorten them.
#[derive(Debug, Clone)]
pub struct Options {
    /// First delay before reconnecting; doubled after every failed attempt.
    pub backoff_min: Duration,
    /// Longest delay between reconnection attempts.
    pub backoff_max: Duration,
    /// How long one connection attempt (TCP, TLS, authentication) may take.
    pub connect_timeout: Duration,
    /// Session `lock_timeout`: the longest any statement waits for a row lock. A purge batch that hits it is skipped,
    /// so the sidecar never queues behind Zero for long.
    pub lock_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(5),
        }
    }
}

/// What [`ChangeDb::status`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbState {
    /// Connected, and the schema's tables exist.
    Up,
    /// Not connected; the reason is the last connection error.
    Down(String),
    /// Connected, but the schema or one of its tables is absent: Zero has not initialised the change DB yet.
    SchemaMissing,
}

/// Handle to the change DB. Cheap to clone; all clones share one connection.
#[derive(Clone)]
pub struct ChangeDb {
    inner: Arc<Inner>,
}

/// What every clone of a [`ChangeDb`] shares; the supervisor keeps its connection state.
struct Inner {
    /// The unquoted schema name, for errors and logs.
    schema: String,
    /// The shard's schema in the upstream database (unquoted), where Zero keeps `replicas`.
    upstream_schema: String,
    sql: Sql,
    /// `host=… port=… dbname=… user=…`, never the password.
    target: String,
    /// The one client, `None` while (re)connecting. Held for a whole operation: a purge batch's transaction must
    /// not interleave with another caller's statements on the same connection.
    client: tokio::sync::Mutex<Option<Client>>,
    link: watch::Sender<Link>,
    logged: Mutex<Logged>,
    /// Whether the column's collation orders watermarks as bytes; probed once per connection.
    byte_order: Mutex<Option<bool>>,
    /// The shard's advisory lock key, from [`purger_lock_key`].
    purger_lock: (i32, i32),
    /// Set by the first [`ChangeDb::claim_purger`]: from then on every purge batch requires the lock.
    purger_required: AtomicBool,
    /// The statements on the sidecar's own schema.
    slot_sql: slots::SlotSql,
}

impl fmt::Debug for ChangeDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeDb")
            .field("schema", &self.inner.schema)
            .field("target", &self.inner.target)
            .field("link", &*self.inner.link.borrow())
            .finish()
    }
}

impl ChangeDb {
    /// Starts the connection supervisor for Zero's change DB `"{app_id}_{shard_num}/cdc"` and returns at once;
    /// calls fail with [`DbError::Unavailable`] until the first connection is up (see [`ChangeDb::ready`]).
    ///
    /// The supervisor reconnects with capped exponential backoff until `shutdown` is cancelled. Cancel it only
    /// after the last call (such as restoring `ownerAddress` on the way out): a batch in flight still completes.
    pub fn start(
        pg: tokio_postgres::Config,
        zero: &ZeroConfig,
        options: Options,
        shutdown: CancellationToken,
    ) -> ChangeDb {
        let schema = zero.cdc_schema();
        let mut pg = pg;
        if pg.get_application_name().is_none() {
            pg.application_name("litestream-sidecar");
        }
        let inner = Arc::new(Inner {
            sql: Sql::new(&schema, &zero.upstream_schema()),
            upstream_schema: zero.upstream_schema(),
            schema,
            target: supervisor::target(&pg),
            client: tokio::sync::Mutex::new(None),
            link: watch::Sender::new(Link::Connecting),
            logged: Mutex::new(Logged::Nothing),
            byte_order: Mutex::new(None),
            purger_lock: purger_lock_key(zero),
            purger_required: AtomicBool::new(false),
            slot_sql: slots::SlotSql::new(&zero.sidecar_schema(), &zero.cdc_schema()),
        });
        let tls = ChangeDbTls::for_mode(pg.get_ssl_mode());
        tokio::spawn(supervisor::supervise(
            inner.clone(),
            pg,
            tls,
            options,
            shutdown,
        ));
        ChangeDb { inner }
    }

    /// Waits until a connection is up (the schema may still be missing). Returns at once if it is; never returns
    /// after shutdown, so wrap it in a timeout.
    pub async fn ready(&self) {
        let mut link = self.inner.link.subscribe();
        let _ = link.wait_for(|l| *l == Link::Up).await;
        // The sender lives in `Inner`, which `self` keeps alive, so `wait_for` only returns on `Up`.
    }

    /// Connected and the schema's three tables present, or why not. Logs each change of state once.
    pub async fn status(&self) -> DbState {
        let result = async {
            let client = self.client().await?;
            let t = &self.inner.sql.tables;
            let row = client
                .query_one(&self.inner.sql.tables_present, &[&t[0], &t[1], &t[2]])
                .await
                .map_err(|e| self.query_error("checking the schema", e))?;
            if row.get::<_, bool>(0) {
                Ok(())
            } else {
                Err(self.schema_missing())
            }
        }
        .await;
        let state = match result {
            Ok(()) => DbState::Up,
            Err(DbError::SchemaMissing { .. }) => DbState::SchemaMissing,
            Err(DbError::Unavailable { reason }) => DbState::Down(reason),
            Err(err) => DbState::Down(err.to_string()),
        };
        match &state {
            DbState::Up => self.inner.note(Logged::Up),
            DbState::SchemaMissing => self.inner.note(Logged::SchemaMissing),
            DbState::Down(_) => {}
        }
        state
    }

    /// The connected client, held until the guard drops.
    async fn client(&self) -> Result<MappedMutexGuard<'_, Client>, DbError> {
        let guard = self.inner.client.lock().await;
        let unavailable = || DbError::Unavailable {
            reason: self.inner.down_reason(),
        };
        let client = MutexGuard::try_map(guard, Option::as_mut).map_err(|_| unavailable())?;
        if client.is_closed() {
            return Err(unavailable());
        }
        Ok(client)
    }

    /// The watermark statements that compare as bytes on this connection: the index-friendly ones when the
    /// column's collation agrees with byte order (`C`, `en_US`, ICU root…), else the `COLLATE "C"` ones.
    async fn watermark_sql(&self, client: &Client) -> Result<&WatermarkSql, DbError> {
        let cached = *self
            .inner
            .byte_order
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let byte_order = match cached {
            Some(known) => known,
            None => {
                let sql = &self.inner.sql;
                let row = client
                    .query_opt(&sql.watermark_collation, &[&sql.tables[0]])
                    .await
                    .map_err(|e| self.query_error("reading the watermark collation", e))?
                    .ok_or_else(|| self.schema_missing())?;
                let (quoted, name): (String, String) = (row.get(0), row.get(1));
                let agrees: bool = client
                    .query_one(&byte_order_probe(&quoted), &[])
                    .await
                    .map_err(|e| self.query_error("checking the watermark collation", e))?
                    .get(0);
                if agrees {
                    debug!(collation = %name, "watermark collation orders as bytes");
                } else {
                    warn!(
                        collation = %name,
                        "the change log's collation does not order watermarks as bytes; comparing with \
                         COLLATE \"C\", which cannot use the primary key index"
                    );
                }
                *self
                    .inner
                    .byte_order
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(agrees);
                agrees
            }
        };
        Ok(if byte_order {
            &self.inner.sql.indexed
        } else {
            &self.inner.sql.bytewise
        })
    }

    fn schema_missing(&self) -> DbError {
        DbError::SchemaMissing {
            schema: self.inner.schema.clone(),
        }
    }

    fn query_error(&self, context: &str, err: tokio_postgres::Error) -> DbError {
        if err.is_closed() {
            return DbError::Unavailable {
                reason: with_cause(&err),
            };
        }
        match err.code() {
            Some(code)
                if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::INVALID_SCHEMA_NAME =>
            {
                self.schema_missing()
            }
            _ => DbError::Query {
                context: context.into(),
                source: err,
            },
        }
    }

    /// Logs the schema appearing or disappearing, once per change.
    fn noting_schema<T>(&self, result: Result<T, DbError>) -> Result<T, DbError> {
        match &result {
            Ok(_) => self.inner.note(Logged::Up),
            Err(DbError::SchemaMissing { .. }) => {
                // A schema created again may come with another collation.
                *self
                    .inner
                    .byte_order
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = None;
                self.inner.note(Logged::SchemaMissing)
            }
            Err(_) => {}
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_before_the_first_connection_are_unavailable() {
        // Port 1 on loopback: refused at once.
        let pg: tokio_postgres::Config = "postgres://zero@127.0.0.1:1/zero?sslmode=disable"
            .parse()
            .unwrap();
        let shutdown = CancellationToken::new();
        let db = ChangeDb::start(
            pg,
            &ZeroConfig {
                app_id: "zero".into(),
                shard_num: 0,
            },
            Options::default(),
            shutdown.clone(),
        );
        let err = db.owner_address().await.unwrap_err();
        assert!(matches!(err, DbError::Unavailable { .. }), "{err}");
        assert_eq!(err.class(), FailureClass::Unavailable);
        assert!(matches!(db.status().await, DbState::Down(_)));
        shutdown.cancel();
    }
}
