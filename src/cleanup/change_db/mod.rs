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
//! This file is the public API and the operations that carry out those rules. Each job behind them has its own
//! file, so that each can be read and tested alone: `sql.rs` (the statements' text), `supervisor.rs` (keeping the
//! one connection up) and `tls.rs` (the connector the connection string's `sslmode` asks for).

pub mod config;
mod slots;
mod sql;
mod supervisor;
pub(crate) mod tls;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, MappedMutexGuard, MutexGuard};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Transaction};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cleanup::slots::{SlotLimit, SlotName};
use crate::cleanup::Ceiling;
use crate::net::address::same_address;
use crate::protocol::shard::ZeroConfig;
pub use slots::{
    slot_lock_key, ReservationWrite, ShardMemory, SlotWrites, SlotWritten, SubscriberRow,
    SCHEMA_VERSION,
};
use sql::{byte_order_probe, Sql, WatermarkSql};
use supervisor::{Link, Logged};
use tls::ChangeDbTls;

/// Rows deleted per purge statement unless the caller asks otherwise; keeps each batch transaction short.
pub const DEFAULT_PURGE_BATCH_ROWS: i64 = 10_000;

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

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection right now; the supervisor is reconnecting.
    #[error("change DB unavailable: {reason}")]
    Unavailable { reason: String },
    /// The schema or a table is absent (SQLSTATE 3F000 / 42P01): Zero has not initialised the change DB yet.
    #[error(
        "change DB schema \"{schema}\" is missing or incomplete: Zero has not initialised it yet"
    )]
    SchemaMissing { schema: String },
    /// Any other failure of a statement, with what the sidecar was doing.
    #[error("change DB {context}: {}", with_cause(source))]
    Query {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl DbError {
    /// What kind of failure this is: whether it heals by itself, and what an operator should do if not.
    pub fn class(&self) -> FailureClass {
        match self {
            DbError::Unavailable { .. } => FailureClass::Unavailable,
            DbError::SchemaMissing { .. } => FailureClass::SchemaMissing,
            DbError::Query { source, .. } => match source.code() {
                Some(code) => FailureClass::of_sqlstate(code.code()),
                // No SQLSTATE: an I/O error or a closed connection rather than a rejected statement.
                None => FailureClass::Unavailable,
            },
        }
    }

    /// The SQLSTATE of a failed statement, if the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            DbError::Query { source, .. } => source.code().map(SqlState::code),
            _ => None,
        }
    }
}

/// Why a change DB operation failed, in the terms that decide what happens next: transient classes are retried
/// quietly on the next check; permanent ones will fail the same way until someone changes the database, its
/// permissions or the sidecar's configuration, so they are logged at error with what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// No connection: the server is down, restarting or unreachable. The supervisor reconnects.
    Unavailable,
    /// Zero's tables are not there yet; they appear when the replication-manager initialises the change DB.
    SchemaMissing,
    /// Serialization failures, deadlocks, lock timeouts, cancelled statements, server shutdown, exhausted
    /// resources (SQLSTATE classes 40, 53, 55P03, 57): the next attempt may succeed.
    Transient,
    /// The sidecar's role lacks a privilege, or was refused at login (42501, class 28).
    Permission,
    /// The server does not know a setting, function or type a statement uses (42704, 42883): a server version
    /// or build the sidecar does not support.
    UnsupportedServer,
    /// A column, table shape or type is not what Zero's schema has (other class 42 codes): the change DB was
    /// created by a Zero version the sidecar does not support, or altered by hand.
    SchemaMismatch,
    /// The connection is to a read-only server, such as a standby (25006).
    ReadOnly,
    /// Anything else the server rejected.
    Other,
}

impl FailureClass {
    /// Every variant, for pre-registering metric label values.
    pub const ALL: [FailureClass; 8] = [
        FailureClass::Unavailable,
        FailureClass::SchemaMissing,
        FailureClass::Transient,
        FailureClass::Permission,
        FailureClass::UnsupportedServer,
        FailureClass::SchemaMismatch,
        FailureClass::ReadOnly,
        FailureClass::Other,
    ];

    /// The class of a server error by its SQLSTATE (PostgreSQL's Appendix A).
    pub fn of_sqlstate(code: &str) -> FailureClass {
        match code {
            "42501" => FailureClass::Permission,
            "42704" | "42883" => FailureClass::UnsupportedServer,
            "3F000" | "42P01" => FailureClass::SchemaMissing,
            "25006" => FailureClass::ReadOnly,
            "55P03" => FailureClass::Transient,
            _ if code.starts_with("28") => FailureClass::Permission,
            _ if code.starts_with("42") => FailureClass::SchemaMismatch,
            _ if ["08", "40", "53", "57"].iter().any(|c| code.starts_with(c)) => {
                FailureClass::Transient
            }
            _ => FailureClass::Other,
        }
    }

    /// True when retrying will not help until someone changes something.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            FailureClass::Permission
                | FailureClass::UnsupportedServer
                | FailureClass::SchemaMismatch
                | FailureClass::ReadOnly
        )
    }

    /// The snake_case value of the `class` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Unavailable => "unavailable",
            FailureClass::SchemaMissing => "schema_missing",
            FailureClass::Transient => "transient",
            FailureClass::Permission => "permission",
            FailureClass::UnsupportedServer => "unsupported_server",
            FailureClass::SchemaMismatch => "schema_mismatch",
            FailureClass::ReadOnly => "read_only",
            FailureClass::Other => "other",
        }
    }

    /// What an operator should do about a failure of this class.
    pub fn remedy(self) -> &'static str {
        match self {
            FailureClass::Unavailable => {
                "check that the change DB server is up and reachable from this host; the sidecar reconnects by itself"
            }
            FailureClass::SchemaMissing => {
                "start the replication-manager so that it initialises the change DB, and check zero.app_id and \
                 zero.shard_num"
            }
            FailureClass::Transient => "none needed if it clears; if it persists, look for long-held locks on changeLog",
            FailureClass::Permission => {
                "grant the sidecar's role SELECT, UPDATE and DELETE on the change DB schema's tables (it runs \
                 SELECT ... FOR UPDATE and DELETE on changeLog), or use the replication-manager's role"
            }
            FailureClass::UnsupportedServer => {
                "the server rejected a setting or function the sidecar uses: check that the PostgreSQL major is one \
                 the sidecar supports (15 to 18) and report the SQLSTATE and message"
            }
            FailureClass::SchemaMismatch => {
                "the change DB's tables are not shaped as the sidecar expects: check that the Zero version is one the \
                 sidecar supports and that zero.app_id names the right schema"
            }
            FailureClass::ReadOnly => {
                "change_db.url points at a read-only server (a standby?): point it at the primary"
            }
            FailureClass::Other => "report the SQLSTATE and message",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error and its cause: tokio-postgres' `Display` omits the cause ("db error"), which carries the server's
/// message.
fn with_cause(err: &tokio_postgres::Error) -> String {
    match std::error::Error::source(err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

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

/// The result of [`ChangeDb::claim_purger`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purger {
    /// This handle's session holds the shard's purger lock: it may purge.
    Held,
    /// Another session holds it: another sidecar purges this shard.
    Standby,
}

/// The class half of the purger lock's key: names this program among users of two-int4 advisory locks ("ltsc").
/// Part of the lock's contract with other sidecar releases: never change it.
pub const PURGER_LOCK_CLASS: i32 = i32::from_be_bytes(*b"ltsc");

/// The purger lock's key for a shard: [`PURGER_LOCK_CLASS`] and the 32-bit FNV-1a hash of its change DB schema
/// name (`"{app_id}_{shard_num}/cdc"`, UTF-8), as the bits of an `int4`. Sidecars of different releases must agree
/// on it, hence a fixed hash rather than std's `DefaultHasher`. `pg_locks` shows it as `classid` and `objid` (as
/// `oid`, so a negative half shows as itself plus 2^32) with `objsubid` 2.
pub fn purger_lock_key(zero: &ZeroConfig) -> (i32, i32) {
    (
        PURGER_LOCK_CLASS,
        fnv1a_32(zero.cdc_schema().as_bytes()) as i32,
    )
}

fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
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

/// How a purge batch reads the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRule {
    /// `cleanup.reservations = "pause"`: any live reservation protects every row.
    pub pause: bool,
    /// The restore limit of reservations that opened without one (`None`: the replica's size is unknown now).
    pub restore_limit_now: Option<Duration>,
}

/// Which slots a purge batch reads, and whose subscribers it leaves to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCheck<'a> {
    pub rule: SlotRule,
    /// The purging sidecar's own name in the slot table: its subscribers' rows are copies, written at each
    /// heartbeat, of what it tracks itself and asks before every batch (the purge's ceiling), which is fresher.
    /// Its reservations' rows are read as any other's: a reservation whose socket closed is only there.
    pub own: Option<&'a str>,
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

/// The shard's address table row: where view-syncers are sent, and which replication-manager task owns the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerRow {
    /// `ownerAddress`; `None` if the row is missing or NULL.
    pub address: Option<String>,
    /// `owner`, the replication-manager's task ID; `None` if the row is missing or NULL.
    pub owner: Option<String>,
}

/// Rows in the change log up to this many are counted; above it the size is PostgreSQL's estimate, so that reading
/// it never scans a large log.
pub const EXACT_COUNT_LIMIT: i64 = 10_000;

/// How many rows the change log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeLogSize {
    pub rows: u64,
    /// Counted (at most [`EXACT_COUNT_LIMIT`] rows), rather than estimated from `pg_class.reltuples`, which lags
    /// behind purges until autovacuum catches up.
    pub exact: bool,
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

impl Inner {
    /// Releases the purger lock if `client`'s session holds it; returns whether it did.
    async fn release_purger_lock(&self, client: &Client) -> Result<bool, tokio_postgres::Error> {
        if !self.purger_required.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let (class, key) = self.purger_lock;
        let row = client
            .query_one(&self.sql.release_purger_lock, &[&class, &key])
            .await?;
        Ok(row.get(0))
    }
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

    /// The discovery address (`SELECT "ownerAddress" FROM replicationState`); `None` if the row is missing or NULL.
    pub async fn owner_address(&self) -> Result<Option<String>, DbError> {
        Ok(self.ownership().await?.address)
    }

    /// `ownerAddress` and `owner` of the address table row, read together.
    pub async fn ownership(&self) -> Result<OwnerRow, DbError> {
        let result = async {
            let client = self.client().await?;
            read_ownership(&*client, &self.inner.sql)
                .await
                .map_err(|e| self.query_error("reading ownerAddress", e))
        }
        .await;
        self.noting_schema(result)
    }

    /// The change-streamer's replica version from `replicationConfig`; `None` if the row is missing.
    pub async fn replica_version(&self) -> Result<Option<String>, DbError> {
        let result = async {
            let client = self.client().await?;
            let row = client
                .query_opt(&self.inner.sql.replica_version, &[])
                .await
                .map_err(|e| self.query_error("reading replicaVersion", e))?;
            Ok(row.map(|r| r.get(0)))
        }
        .await;
        self.noting_schema(result)
    }

    /// How many rows `changeLog` holds: counted while PostgreSQL's estimate says it is small (or has none), else the
    /// estimate. Reads at most [`EXACT_COUNT_LIMIT`] + 1 rows, so it stays cheap on any log.
    pub async fn change_log_size(&self) -> Result<ChangeLogSize, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = &self.inner.sql;
            let estimate: i64 = client
                .query_opt(&sql.change_log_estimate, &[&sql.tables[0]])
                .await
                .map_err(|e| self.query_error("reading the change log's size estimate", e))?
                .and_then(|row| row.get::<_, Option<i64>>(0))
                .unwrap_or(-1);
            if estimate > EXACT_COUNT_LIMIT {
                return Ok(ChangeLogSize {
                    rows: estimate as u64,
                    exact: false,
                });
            }
            let counted: i64 = client
                .query_one(&sql.change_log_count, &[&(EXACT_COUNT_LIMIT + 1)])
                .await
                .map_err(|e| self.query_error("counting the change log", e))?
                .get(0);
            let exact = counted <= EXACT_COUNT_LIMIT;
            let rows = if exact {
                counted
            } else {
                counted.max(estimate)
            };
            Ok(ChangeLogSize {
                rows: rows.max(0) as u64,
                exact,
            })
        }
        .await;
        self.noting_schema(result)
    }

    /// The oldest watermark in `changeLog` (byte-wise); `None` when the log is empty.
    pub async fn min_watermark(&self) -> Result<Option<String>, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = self.watermark_sql(&client).await?;
            let row = client
                .query_one(&sql.min_watermark, &[])
                .await
                .map_err(|e| self.query_error("reading min(watermark)", e))?;
            Ok(row.get(0))
        }
        .await;
        self.noting_schema(result)
    }

    /// The change log table, quoted as statements name it: for messages about it.
    pub fn change_log_table(&self) -> &str {
        &self.inner.sql.tables[0]
    }

    /// The upstream's `replicas` table, quoted as statements name it: for messages about it.
    pub fn replicas_table(&self) -> &str {
        &self.inner.sql.replicas
    }

    /// Whether `changeLog` holds a row at or past `watermark` (byte-wise): what the storer has written so far.
    /// Served by the primary-key index where the column's collation orders as bytes.
    pub async fn log_reaches(&self, watermark: &str) -> Result<bool, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = self.watermark_sql(&client).await?;
            let row = client
                .query_one(&sql.reaches, &[&watermark])
                .await
                .map_err(|e| self.query_error("looking for a watermark in the change log", e))?;
            Ok(row.get(0))
        }
        .await;
        self.noting_schema(result)
    }

    /// The rows of the upstream's `"{app}_{shard}".replicas` that back up to a path of their own or with
    /// litestream 0.5 (Zero 1.10's v5 backups), read through the change DB's connection: `None` when that table, or
    /// both of its columns that say so, are not there (the upstream is another database, or Zero is older than
    /// 1.10), which is no error. A table dropped between the two reads counts as absent.
    pub async fn replica_backups(
        &self,
    ) -> Result<Option<Vec<crate::cleanup::unservable::ReplicaRow>>, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.sql;
        let context = format!("reading {}", sql.replicas);
        let columns: Vec<String> = client
            .query(&sql.replica_columns, &[&self.inner.upstream_schema])
            .await
            .map_err(|e| self.upstream_error(&context, e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let Some(select) = sql::replica_backups(&sql.replicas, &columns) else {
            return Ok(None);
        };
        match client.query(&select, &[]).await {
            Ok(rows) => Ok(Some(
                rows.iter()
                    .map(|row| crate::cleanup::unservable::ReplicaRow {
                        id: row.get(0),
                        backup_path: row.get(1),
                        backup_v5: row.get(2),
                    })
                    .collect(),
            )),
            Err(e)
                if e.code() == Some(&SqlState::UNDEFINED_TABLE)
                    || e.code() == Some(&SqlState::UNDEFINED_COLUMN) =>
            {
                Ok(None)
            }
            Err(e) => Err(self.upstream_error(&context, e)),
        }
    }

    /// A failed read outside the change DB's own schema: never [`DbError::SchemaMissing`], which is about that
    /// schema.
    fn upstream_error(&self, context: &str, err: tokio_postgres::Error) -> DbError {
        if err.is_closed() {
            return DbError::Unavailable {
                reason: with_cause(&err),
            };
        }
        DbError::Query {
            context: context.into(),
            source: err,
        }
    }

    /// `versionHistory.dataVersion`: 5 for Zero 0.20-0.25 (SERIALIZABLE storer), 6 from 0.26 (row locks).
    /// `None` if the table or its row is absent.
    pub async fn data_version(&self) -> Result<Option<i32>, DbError> {
        let client = self.client().await?;
        match client.query_opt(&self.inner.sql.data_version, &[]).await {
            Ok(row) => Ok(row.map(|r| r.get(0))),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
            Err(e) => Err(self.query_error("reading versionHistory", e)),
        }
    }

    /// Sets `ownerAddress` to `to` only if it is exactly `from` now (and `from` differs from `to`); returns whether
    /// the row changed. A call that changes nothing writes nothing, so it cannot conflict with Zero's storer.
    pub async fn adopt_address(&self, from: &str, to: &str) -> Result<bool, DbError> {
        let result = async {
            let client = self.client().await?;
            let changed = client
                .execute(&self.inner.sql.adopt_address, &[&from, &to])
                .await
                .map_err(|e| self.query_error("updating ownerAddress", e))?;
            Ok(changed > 0)
        }
        .await;
        let result = self.noting_schema(result);
        if let Ok(true) = result {
            info!(from, to, "ownerAddress changed");
        }
        result
    }

    /// Puts the replication-manager's address back where ours is, as [`ChangeDb::adopt_address`] in reverse; returns
    /// whether the row changed. A row that someone else has changed meanwhile is left alone.
    pub async fn restore_address(&self, ours: &str, theirs: &str) -> Result<bool, DbError> {
        self.adopt_address(ours, theirs).await
    }

    /// Takes the shard's purger lock ([`purger_lock_key`]) on this handle's session, unless the session holds it
    /// already (advisory locks stack, and one release must free it). Call it before every purge.
    ///
    /// From the first call on, every purge batch of this handle and its clones checks that the session still holds
    /// the lock, and stops with [`PurgeStop::NotPurger`] if not. The lock goes with the session: after a reconnect,
    /// or once the other holder's session ends, the next call takes it if it is free.
    pub async fn claim_purger(&self) -> Result<Purger, DbError> {
        self.inner.purger_required.store(true, Ordering::SeqCst);
        let client = self.client().await?;
        let (class, key) = self.inner.purger_lock;
        let sql = &self.inner.sql;
        let held: bool = client
            .query_one(&sql.holds_purger_lock, &[&class, &key])
            .await
            .map_err(|e| self.query_error("checking the purger lock", e))?
            .get(0);
        if held {
            return Ok(Purger::Held);
        }
        let taken: bool = client
            .query_one(&sql.try_purger_lock, &[&class, &key])
            .await
            .map_err(|e| self.query_error("taking the purger lock", e))?
            .get(0);
        if taken {
            info!(schema = %self.inner.schema, class, key, "purger lock taken: this sidecar purges the change log");
            Ok(Purger::Held)
        } else {
            debug!(schema = %self.inner.schema, class, key, "purger lock held by another session");
            Ok(Purger::Standby)
        }
    }

    /// Releases the purger lock if this handle's session holds it; returns whether it did. Purge batches still
    /// require it until the next [`ChangeDb::claim_purger`]. Shutdown releases it without this call.
    pub async fn release_purger(&self) -> Result<bool, DbError> {
        let client = self.client().await?;
        let released = self
            .inner
            .release_purger_lock(&client)
            .await
            .map_err(|e| self.query_error("releasing the purger lock", e))?;
        if released {
            info!(schema = %self.inner.schema, "purger lock released");
        }
        Ok(released)
    }

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

/// `ownerAddress` and `owner`, on a plain client or inside a purge batch's transaction.
async fn read_ownership(
    client: &impl GenericClient,
    sql: &Sql,
) -> Result<OwnerRow, tokio_postgres::Error> {
    let row = client.query_opt(&sql.owner_address, &[]).await?;
    Ok(row.map_or_else(OwnerRow::default, |r| OwnerRow {
        address: r.get(0),
        owner: r.get(1),
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_without_a_connection_heal_by_themselves() {
        let down = DbError::Unavailable {
            reason: "connecting".into(),
        };
        assert_eq!(down.class(), FailureClass::Unavailable);
        assert!(!down.class().is_permanent());
        assert_eq!(down.sqlstate(), None);
        let missing = DbError::SchemaMissing {
            schema: "zero_0/cdc".into(),
        };
        assert_eq!(missing.class(), FailureClass::SchemaMissing);
        assert!(!missing.class().is_permanent());
        assert!(missing.to_string().contains("\"zero_0/cdc\""));
    }

    #[test]
    fn sqlstates_are_classified_by_whether_they_heal() {
        let cases = [
            // lock_timeout, serialization failure, deadlock, admin shutdown, too many connections.
            ("55P03", FailureClass::Transient),
            ("40001", FailureClass::Transient),
            ("40P01", FailureClass::Transient),
            ("57P01", FailureClass::Transient),
            ("53300", FailureClass::Transient),
            ("08006", FailureClass::Transient),
            // insufficient privilege, invalid password.
            ("42501", FailureClass::Permission),
            ("28P01", FailureClass::Permission),
            // "unrecognized configuration parameter" (lc_collate on PostgreSQL 16+), undefined function.
            ("42704", FailureClass::UnsupportedServer),
            ("42883", FailureClass::UnsupportedServer),
            // undefined column, datatype mismatch.
            ("42703", FailureClass::SchemaMismatch),
            ("42804", FailureClass::SchemaMismatch),
            ("42P01", FailureClass::SchemaMissing),
            ("3F000", FailureClass::SchemaMissing),
            ("25006", FailureClass::ReadOnly),
            ("XX000", FailureClass::Other),
        ];
        for (code, class) in cases {
            assert_eq!(FailureClass::of_sqlstate(code), class, "{code}");
        }
        let permanent: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| c.is_permanent())
            .collect();
        assert_eq!(
            permanent,
            [
                FailureClass::Permission,
                FailureClass::UnsupportedServer,
                FailureClass::SchemaMismatch,
                FailureClass::ReadOnly
            ]
        );
        for class in FailureClass::ALL {
            assert!(!class.remedy().is_empty());
        }
    }

    /// The key is shared by every release that may run beside this one: a change here lets two sidecars purge.
    #[test]
    fn the_purger_lock_key_is_fnv1a_of_the_schema_and_never_changes() {
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        let shard = |shard_num| ZeroConfig {
            app_id: "zero".into(),
            shard_num,
        };
        assert_eq!(PURGER_LOCK_CLASS, 0x6c74_7363);
        assert_eq!(purger_lock_key(&shard(0)), (0x6c74_7363, -1_060_586_361));
        assert_eq!(purger_lock_key(&shard(1)), (0x6c74_7363, 0x5248_8a1c));
    }

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
