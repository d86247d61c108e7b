//! The sidecar's own schema in the change DB (`"<app>_<shard>/sidecar"`): its versioned migrations, the slot table
//! every sidecar of the shard writes (docs/operations.md, "Slots") and the shard's memory (the last purge, the highest
//! backup, the learned cleanup delay, the replica version).
//!
//! Slot writers take the shard's slot lock shared, in the transaction that writes; a purge batch takes it exclusive
//! before it reads the slots. So a slot committed before a batch starts is in what the batch reads, and one written
//! while a batch runs commits after it: a reservation's status goes out only after its row has committed, so no
//! batch that could not see the row deletes anything its restore needs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::GenericClient;
use tracing::{info, warn};

use super::purger_lock::{fnv1a_32, PURGER_LOCK_CLASS};
use super::sql::quote_ident;
use super::{ChangeDb, DbError};
use crate::cleanup::slots::{Slot, SlotKind};
use crate::litestream::drill::Proof;
use crate::protocol::shard::ZeroConfig;

/// The advisory lock class of the slot lock (`"ltsl"`), keyed like the purger lock by the shard.
const SLOT_LOCK_CLASS: i32 = i32::from_be_bytes(*b"ltsl");
/// The advisory lock class that orders two sidecars migrating the schema at once (`"ltsm"`).
const MIGRATE_LOCK_CLASS: i32 = i32::from_be_bytes(*b"ltsm");

/// The schema's migrations, in order: each runs once, in one transaction with its record. Never edit one that has
/// shipped; add the next.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "slots and the shard's memory",
        r#"
    CREATE TABLE {s}.slots (
        kind text NOT NULL CHECK (kind IN ('reservation', 'subscriber')),
        key text NOT NULL,
        task_id text,
        subscriber_id text,
        floor text,
        replica_version text,
        holder text NOT NULL,
        lease bigint NOT NULL DEFAULT 0,
        protocol integer NOT NULL DEFAULT 0,
        connected boolean NOT NULL DEFAULT true,
        opened_at timestamptz NOT NULL DEFAULT now(),
        heartbeat timestamptz NOT NULL DEFAULT now(),
        restore_limit interval,
        grace interval,
        PRIMARY KEY (kind, key),
        CHECK (kind = 'reservation' OR grace IS NOT NULL)
    );
    CREATE TABLE {s}.shard (
        id boolean PRIMARY KEY DEFAULT true CHECK (id),
        replica_version text,
        last_purge text,
        last_purge_backed_up_at timestamptz,
        highest_backup text,
        cleanup_delay interval NOT NULL DEFAULT '30 seconds',
        restores_unknown_since timestamptz,
        imported_from text,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    "#,
    ),
    (
        2,
        "restore drills' proofs, by generation",
        r#"
    CREATE TABLE {s}.proofs (
        generation text PRIMARY KEY,
        replica_version text NOT NULL,
        watermark text NOT NULL,
        started_at timestamptz NOT NULL,
        finished_at timestamptz NOT NULL,
        restore_seconds float8 NOT NULL,
        check_seconds float8 NOT NULL,
        bytes bigint NOT NULL,
        holder text NOT NULL
    );
    "#,
    ),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Whether a slot still bounds purges (see [`crate::cleanup::slots::HEARTBEAT`]); `$1`: the restore limit in seconds
/// for reservations that opened without one (`NULL`: the size is unknown, and they do not expire). A reservation
/// whose socket its holder still vouches for (every heartbeat, 10 s) lives however long its restore takes.
const LIVE: &str = "CASE WHEN kind = 'subscriber' THEN now() < heartbeat + grace \
                    ELSE (connected AND now() < heartbeat + interval '30 seconds') \
                    OR coalesce(now() < opened_at + coalesce(restore_limit, make_interval(secs => $1::float8)), \
                    true) END";

/// Every statement on the sidecar's schema, built once from its quoted name.
#[derive(Debug)]
pub(super) struct SlotSql {
    pub(super) schema: String,
    pub(super) quoted: String,
    migrations_table: String,
    migration_version: String,
    record_migration: String,
    lock_shared: &'static str,
    pub(super) lock_exclusive: &'static str,
    open_reservation: String,
    set_floor: String,
    close_reservation: String,
    forget_reservation: String,
    import_reservation: String,
    end_reservation: String,
    upsert_subscribers: String,
    forget_subscribers: String,
    heartbeat: String,
    own_reservations: String,
    pub(super) list: String,
    forget_dead: String,
    shard_read: String,
    shard_create: String,
    shard_write: String,
    proof_write: String,
    proof_read: String,
    proof_forget: String,
}

impl SlotSql {
    /// `schema` is the sidecar's, `cdc` Zero's change DB schema (both unquoted).
    pub(super) fn new(schema: &str, cdc: &str) -> SlotSql {
        let s = quote_ident(schema);
        // A floor is a watermark of the replica the change log holds now, if the caller had not read it yet: the
        // floor came from litestream's gauge of that replica (a resync, once seen, lowers every floor to none).
        let current = format!(
            r#"(SELECT "replicaVersion" FROM {}."replicationConfig")"#,
            quote_ident(cdc)
        );
        let slots = format!("{s}.slots");
        let shard = format!("{s}.shard");
        SlotSql {
            schema: schema.to_owned(),
            migrations_table: format!(
                "CREATE TABLE IF NOT EXISTS {s}.migrations (version integer PRIMARY KEY, description text NOT NULL, \
                 applied_at timestamptz NOT NULL DEFAULT now())"
            ),
            migration_version: format!("SELECT coalesce(max(version), 0) FROM {s}.migrations"),
            record_migration: format!(
                "INSERT INTO {s}.migrations (version, description) VALUES ($1, $2)"
            ),
            // A slot write that waits for a lock (someone holds the table) gives up after a second, rather than
            // the session's lock_timeout: the connection is the sidecar's only one, and its checks queue behind.
            lock_shared: "SELECT set_config('lock_timeout', '1s', true), \
                          pg_advisory_xact_lock_shared($1::int4, $2::int4)",
            lock_exclusive: "SELECT pg_advisory_xact_lock($1::int4, $2::int4)",
            open_reservation: format!(
                "INSERT INTO {slots} (kind, key, task_id, floor, replica_version, holder, lease, protocol, connected, \
                                      opened_at, heartbeat, restore_limit)
                 VALUES ('reservation', $1, $1, $2, CASE WHEN $2::text IS NULL THEN $3 ELSE coalesce($3, {current}) END,
                         $4, $5, $6, $7, now() - make_interval(secs => $8::float8), now(),
                         make_interval(secs => $9::float8))
                 ON CONFLICT (kind, key) DO UPDATE SET floor = excluded.floor,
                     replica_version = excluded.replica_version, holder = excluded.holder, lease = excluded.lease,
                     protocol = excluded.protocol, connected = excluded.connected, opened_at = excluded.opened_at,
                     heartbeat = now(), restore_limit = excluded.restore_limit"
            ),
            set_floor: format!(
                "UPDATE {slots} SET floor = $4,
                        replica_version = CASE WHEN $4::text IS NULL THEN $5 ELSE coalesce($5, {current}) END,
                        heartbeat = now()
                  WHERE kind = 'reservation' AND key = $1 AND holder = $2 AND lease = $3"
            ),
            close_reservation: format!(
                "UPDATE {slots} SET connected = false, heartbeat = now()
                  WHERE kind = 'reservation' AND key = $1 AND holder = $2 AND lease = $3"
            ),
            import_reservation: format!(
                "INSERT INTO {slots} (kind, key, task_id, floor, replica_version, holder, lease, protocol, connected,
                                      opened_at, heartbeat)
                 VALUES ('reservation', $1, $1, $2, $3, $4, 0, $5, false, now() - make_interval(secs => $6::float8),
                         now())
                 ON CONFLICT (kind, key) DO NOTHING"
            ),
            forget_reservation: format!(
                "DELETE FROM {slots} WHERE kind = 'reservation' AND key = $1 AND holder = $2 AND lease = $3"
            ),
            // Only a reservation opened before the subscription was requested: one opened since is a new restore.
            end_reservation: format!(
                "DELETE FROM {slots}
                  WHERE kind = 'reservation' AND key = $1 AND opened_at <= now() - make_interval(secs => $2::float8)
                  RETURNING holder, extract(epoch FROM now() - opened_at)::float8, connected"
            ),
            upsert_subscribers: format!(
                "INSERT INTO {slots} (kind, key, task_id, subscriber_id, floor, replica_version, holder, connected,
                                      grace)
                 SELECT 'subscriber', k, t, i, f, r, $7, c, make_interval(secs => $8::float8)
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[])
                     AS u(k, t, i, f, r, c)
                 ON CONFLICT (kind, key) DO UPDATE SET floor = excluded.floor,
                     replica_version = excluded.replica_version, connected = excluded.connected, heartbeat = now(),
                     grace = excluded.grace, holder = excluded.holder"
            ),
            forget_subscribers: format!(
                "DELETE FROM {slots} WHERE kind = 'subscriber' AND holder = $1 AND NOT (key = ANY($2::text[]))"
            ),
            heartbeat: format!(
                "UPDATE {slots} SET heartbeat = now() WHERE kind = 'reservation' AND holder = $1 AND connected"
            ),
            own_reservations: format!(
                "SELECT key, lease FROM {slots} WHERE kind = 'reservation' AND holder = $1"
            ),
            list: format!(
                "SELECT kind, key, task_id, subscriber_id, floor, replica_version, holder, connected,
                        extract(epoch FROM now() - opened_at)::float8,
                        extract(epoch FROM now() - heartbeat)::float8,
                        extract(epoch FROM restore_limit)::float8,
                        {LIVE}
                   FROM {slots} ORDER BY kind, key"
            ),
            forget_dead: format!("DELETE FROM {slots} WHERE NOT ({LIVE})"),
            shard_read: format!(
                "SELECT replica_version, last_purge, extract(epoch FROM last_purge_backed_up_at)::float8,
                        highest_backup, extract(epoch FROM cleanup_delay)::float8,
                        extract(epoch FROM restores_unknown_since)::float8, imported_from
                   FROM {shard}"
            ),
            shard_create: format!(
                "INSERT INTO {shard} (replica_version, last_purge, last_purge_backed_up_at, highest_backup,
                                      cleanup_delay, restores_unknown_since, imported_from)
                 VALUES ($1, $2, to_timestamp($3::float8), $4, make_interval(secs => $5::float8),
                         to_timestamp($6::float8), $7)
                 ON CONFLICT (id) DO NOTHING"
            ),
            // Several sidecars write it: watermarks only rise, the delay only grows, and a replica version that
            // changed (a resync) starts the watermarks afresh. The hold for unknown restores is only ever cleared.
            shard_write: format!(
                r#"UPDATE {shard} SET
                     last_purge = CASE WHEN $1::text IS NOT NULL AND replica_version IS DISTINCT FROM $1 THEN $2
                                       WHEN $2::text IS NOT NULL
                                            AND (last_purge IS NULL OR $2 COLLATE "C" > last_purge COLLATE "C")
                                       THEN $2 ELSE last_purge END,
                     last_purge_backed_up_at =
                                  CASE WHEN $1::text IS NOT NULL AND replica_version IS DISTINCT FROM $1
                                       THEN to_timestamp($3::float8)
                                       WHEN $2::text IS NOT NULL
                                            AND (last_purge IS NULL OR $2 COLLATE "C" > last_purge COLLATE "C")
                                       THEN to_timestamp($3::float8) ELSE last_purge_backed_up_at END,
                     highest_backup = CASE WHEN $1::text IS NOT NULL AND replica_version IS DISTINCT FROM $1 THEN $4
                                           WHEN $4::text IS NOT NULL
                                                AND (highest_backup IS NULL
                                                     OR $4 COLLATE "C" > highest_backup COLLATE "C")
                                           THEN $4 ELSE highest_backup END,
                     cleanup_delay = GREATEST(cleanup_delay, make_interval(secs => $5::float8)),
                     restores_unknown_since = CASE WHEN $6::boolean THEN restores_unknown_since END,
                     replica_version = coalesce($1, replica_version),
                     updated_at = now()"#
            ),
            // One row per generation ('' where litestream names none): its newest proof.
            proof_write: format!(
                "INSERT INTO {s}.proofs (generation, replica_version, watermark, started_at, finished_at,
                                         restore_seconds, check_seconds, bytes, holder)
                 VALUES ($1, $2, $3, to_timestamp($4::float8), to_timestamp($5::float8), $6, $7, $8, $9)
                 ON CONFLICT (generation) DO UPDATE SET replica_version = excluded.replica_version,
                     watermark = excluded.watermark, started_at = excluded.started_at,
                     finished_at = excluded.finished_at, restore_seconds = excluded.restore_seconds,
                     check_seconds = excluded.check_seconds, bytes = excluded.bytes, holder = excluded.holder
                  WHERE excluded.finished_at > {s}.proofs.finished_at"
            ),
            proof_read: format!(
                "SELECT generation, replica_version, watermark, extract(epoch FROM started_at)::float8,
                        extract(epoch FROM finished_at)::float8, restore_seconds, check_seconds, bytes
                   FROM {s}.proofs ORDER BY finished_at DESC LIMIT 1"
            ),
            proof_forget: format!(
                "DELETE FROM {s}.proofs WHERE generation = $1 AND watermark COLLATE \"C\" > $2 COLLATE \"C\""
            ),
            quoted: s,
        }
    }
}

/// What the shard remembers across restarts and takeovers, in the shard row.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardMemory {
    pub replica_version: Option<String>,
    /// The backup the last complete purge went up to, and when it was backed up.
    pub last_purge: Option<(String, SystemTime)>,
    pub highest_backup: Option<String>,
    pub cleanup_delay: Duration,
    /// Since when which restores were in flight is unknown, while cleanup holds for it.
    pub restores_unknown_since: Option<SystemTime>,
    /// The state file this row was imported from, if it was.
    pub imported_from: Option<String>,
}

/// A change to one of this sidecar's reservation rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ReservationWrite {
    /// A reservation opened (or replaced another of its task, whoever held it).
    Open {
        task_id: String,
        lease: i64,
        floor: Option<String>,
        replica_version: Option<String>,
        protocol: i32,
        connected: bool,
        /// Fixed from the replica's size known now; `None` while it is unknown.
        restore_limit: Option<Duration>,
        /// How long ago it opened: zero but for a reservation imported from a state file.
        opened_ago: Duration,
    },
    /// Its floor moved (a gauge that went back, a v4 status's `minWatermark`, a resync).
    Floor {
        task_id: String,
        lease: i64,
        floor: Option<String>,
        replica_version: Option<String>,
    },
    /// Its socket closed: the row stays until its task subscribes or its restore limit passes.
    Close { task_id: String, lease: i64 },
    /// Its socket closed before its status went out: nobody restores from it, and its row goes.
    Forget { task_id: String, lease: i64 },
    /// A reservation an earlier release kept in its state file, opened `opened_ago`, without a socket: a row
    /// already there for its task (a newer reservation) stands.
    Import {
        task_id: String,
        floor: Option<String>,
        replica_version: Option<String>,
        protocol: i32,
        opened_ago: Duration,
    },
}

/// One of this sidecar's subscribers as its slot says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberRow {
    pub key: String,
    pub task_id: Option<String>,
    pub subscriber_id: String,
    pub floor: String,
    pub replica_version: String,
    pub connected: bool,
}

/// Everything one write transaction carries.
#[derive(Debug, Clone, Default)]
pub struct SlotWrites {
    /// Tasks whose `initial=true` subscription the upstream accepted, with how long ago each was requested: their
    /// reservations end, in the transaction that writes the subscribers' rows.
    pub subscribed: Vec<(String, Duration)>,
    pub reservations: Vec<ReservationWrite>,
    /// Every subscriber this sidecar tracks now, and the grace of their rows; `None`: leave them as they are.
    pub subscribers: Option<(Vec<SubscriberRow>, Duration)>,
    /// Vouch for this sidecar's open reservations, and read back which of its reservation rows still exist.
    pub heartbeat: bool,
}

impl SlotWrites {
    pub fn is_empty(&self) -> bool {
        self.subscribed.is_empty()
            && self.reservations.is_empty()
            && self.subscribers.is_none()
            && !self.heartbeat
    }
}

/// What a write transaction found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotWritten {
    /// Reservations ended by a subscription: task, the sidecar that held it, how long it was open, and whether
    /// its socket was still open at its holder's last write.
    pub ended: Vec<(String, String, Duration, bool)>,
    /// With a heartbeat: this sidecar's reservation rows that still exist (task, lease).
    pub own_reservations: Option<Vec<(String, i64)>>,
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn from_unix(seconds: f64) -> Option<SystemTime> {
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| UNIX_EPOCH.checked_add(Duration::from_secs_f64(seconds)))
        .flatten()
}

fn duration(seconds: Option<f64>) -> Option<Duration> {
    seconds
        .filter(|s| s.is_finite())
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
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

impl ChangeDb {
    pub(super) fn slot_lock_key(&self) -> (i32, i32) {
        (SLOT_LOCK_CLASS, self.inner.purger_lock.1)
    }

    pub(super) fn slot_error(&self, context: String, err: tokio_postgres::Error) -> DbError {
        if err.is_closed() {
            return DbError::Unavailable {
                reason: super::with_cause(&err),
            };
        }
        DbError::Query {
            context,
            source: err,
        }
    }

    /// The sidecar's schema, quoted.
    pub fn sidecar_schema(&self) -> &str {
        &self.inner.slot_sql.quoted
    }

    /// Creates the sidecar's schema if it is absent and applies the migrations it lacks, in one transaction under
    /// an advisory lock, so that sidecars starting together apply each once. Returns the schema's version. A schema
    /// newer than this build (a rollback) is used as it is: migrations only add.
    pub async fn migrate(&self) -> Result<i32, DbError> {
        let mut client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let s = &sql.quoted;
        let fail = |what: &str, err| self.slot_error(what.to_string(), err);
        let tx = client
            .transaction()
            .await
            .map_err(|e| fail("beginning the schema migration", e))?;
        let (_, key) = self.inner.purger_lock;
        tx.query_one(sql.lock_exclusive, &[&MIGRATE_LOCK_CLASS, &key])
            .await
            .map_err(|e| fail("taking the migration lock", e))?;
        let exists: bool = tx
            .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[s])
            .await
            .map_err(|e| fail("looking for the sidecar's schema", e))?
            .get(0);
        if !exists {
            tx.batch_execute(&format!("CREATE SCHEMA {s}"))
                .await
                .map_err(|e| {
                    fail(
                        &format!(
                            "CREATE SCHEMA {s} (the sidecar's role needs CREATE on the database: GRANT CREATE ON \
                             DATABASE <db> TO <role>; or create it for the role: CREATE SCHEMA {s} AUTHORIZATION \
                             <role>)"
                        ),
                        e,
                    )
                })?;
        }
        let grant = format!(
            "(the sidecar's role needs to own schema {s}, or CREATE and USAGE on it: GRANT CREATE, USAGE ON SCHEMA {s} \
             TO <role>)"
        );
        tx.batch_execute(&sql.migrations_table)
            .await
            .map_err(|e| fail(&format!("creating {s}.migrations {grant}"), e))?;
        let current: i32 = tx
            .query_one(&sql.migration_version, &[])
            .await
            .map_err(|e| fail(&format!("reading {s}.migrations {grant}"), e))?
            .get(0);
        for (version, description, text) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            tx.batch_execute(&text.replace("{s}", s))
                .await
                .map_err(|e| {
                    fail(
                        &format!("applying migration {version} ({description}) {grant}"),
                        e,
                    )
                })?;
            tx.execute(&sql.record_migration, &[version, description])
                .await
                .map_err(|e| fail(&format!("recording migration {version}"), e))?;
            info!(schema = %sql.schema, version, description, "sidecar schema migrated");
        }
        tx.commit()
            .await
            .map_err(|e| fail("committing the schema migration", e))?;
        if current > SCHEMA_VERSION {
            warn!(
                schema = %sql.schema,
                version = current,
                known = SCHEMA_VERSION,
                "the sidecar's schema is newer than this build: a newer sidecar migrated it; this one uses the \
                 tables it knows"
            );
        }
        Ok(current.max(SCHEMA_VERSION))
    }

    /// The shard's memory; `None` before any sidecar of this schema version wrote it.
    pub async fn shard_memory(&self) -> Result<Option<ShardMemory>, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let row = client
            .query_opt(&sql.shard_read, &[])
            .await
            .map_err(|e| self.slot_error(format!("reading {}.shard", sql.quoted), e))?;
        Ok(row.map(|row| ShardMemory {
            replica_version: row.get(0),
            last_purge: row.get::<_, Option<String>>(1).map(|w| {
                (
                    w,
                    row.get::<_, Option<f64>>(2)
                        .and_then(from_unix)
                        .unwrap_or(UNIX_EPOCH),
                )
            }),
            highest_backup: row.get(3),
            cleanup_delay: duration(row.get(4)).unwrap_or_default(),
            restores_unknown_since: row.get::<_, Option<f64>>(5).and_then(from_unix),
            imported_from: row.get(6),
        }))
    }

    /// Writes the shard's memory for the first time; `false` if another sidecar did first (its row stands).
    pub async fn create_shard_memory(&self, memory: &ShardMemory) -> Result<bool, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let (last, last_at) = match &memory.last_purge {
            Some((w, at)) => (Some(w.as_str()), Some(unix_seconds(*at))),
            None => (None, None),
        };
        let created = client
            .execute(
                &sql.shard_create,
                &[
                    &memory.replica_version,
                    &last,
                    &last_at,
                    &memory.highest_backup,
                    &seconds(memory.cleanup_delay),
                    &memory.restores_unknown_since.map(unix_seconds),
                    &memory.imported_from,
                ],
            )
            .await
            .map_err(|e| self.slot_error(format!("writing {}.shard", sql.quoted), e))?;
        Ok(created > 0)
    }

    /// Merges this sidecar's view into the shard's memory (see the statement for how several writers agree).
    pub async fn write_shard_memory(&self, memory: &ShardMemory) -> Result<(), DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let (last, last_at) = match &memory.last_purge {
            Some((w, at)) => (Some(w.as_str()), Some(unix_seconds(*at))),
            None => (None, None),
        };
        client
            .execute(
                &sql.shard_write,
                &[
                    &memory.replica_version,
                    &last,
                    &last_at,
                    &memory.highest_backup,
                    &seconds(memory.cleanup_delay),
                    &memory.restores_unknown_since.is_some(),
                ],
            )
            .await
            .map_err(|e| self.slot_error(format!("writing {}.shard", sql.quoted), e))?;
        Ok(())
    }

    /// Keeps a restore drill's proof as its generation's newest, unless a newer one is kept already (another
    /// sidecar's).
    pub async fn write_proof(&self, proof: &Proof, holder: &str) -> Result<(), DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        client
            .execute(
                &sql.proof_write,
                &[
                    &proof.generation.clone().unwrap_or_default(),
                    &proof.replica_version,
                    &proof.watermark,
                    &unix_seconds(proof.started),
                    &unix_seconds(proof.finished),
                    &proof.restore_took.as_secs_f64(),
                    &proof.check_took.as_secs_f64(),
                    &i64::try_from(proof.bytes).unwrap_or(i64::MAX),
                    &holder,
                ],
            )
            .await
            .map_err(|e| self.slot_error(format!("writing {}.proofs", sql.quoted), e))?;
        Ok(())
    }

    /// Forgets the kept proof of `generation` above `restored`: a drill found that a restore of it reaches only
    /// that, so the proof no longer holds, and a restart must not stand on it.
    pub async fn forget_proof(
        &self,
        generation: Option<&str>,
        restored: &str,
    ) -> Result<u64, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        client
            .execute(
                &sql.proof_forget,
                &[&generation.unwrap_or_default(), &restored],
            )
            .await
            .map_err(|e| self.slot_error(format!("writing {}.proofs", sql.quoted), e))
    }

    /// The newest proof any sidecar of the shard kept, of whichever generation.
    pub async fn latest_proof(&self) -> Result<Option<Proof>, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let row = client
            .query_opt(&sql.proof_read, &[])
            .await
            .map_err(|e| self.slot_error(format!("reading {}.proofs", sql.quoted), e))?;
        Ok(row.map(|row| {
            let generation: String = row.get(0);
            let at = |i: usize| {
                row.get::<_, Option<f64>>(i)
                    .and_then(from_unix)
                    .unwrap_or(UNIX_EPOCH)
            };
            Proof {
                generation: (!generation.is_empty()).then_some(generation),
                replica_version: row.get(1),
                watermark: row.get(2),
                started: at(3),
                finished: at(4),
                restore_took: Duration::from_secs_f64(row.get::<_, f64>(5).max(0.0)),
                check_took: Duration::from_secs_f64(row.get::<_, f64>(6).max(0.0)),
                bytes: u64::try_from(row.get::<_, i64>(7)).unwrap_or(0),
            }
        }))
    }

    /// Writes `writes` as `holder`, in one transaction under the slot lock taken shared.
    pub async fn write_slots(
        &self,
        holder: &str,
        writes: &SlotWrites,
    ) -> Result<SlotWritten, DbError> {
        let mut client = self.client().await?;
        let sql = &self.inner.slot_sql;
        let table = format!("{}.slots", sql.quoted);
        let fail = |what: &str, err| self.slot_error(format!("{what} {table}"), err);
        let tx = client
            .transaction()
            .await
            .map_err(|e| fail("beginning a write of", e))?;
        let (class, key) = self.slot_lock_key();
        tx.query_one(sql.lock_shared, &[&class, &key])
            .await
            .map_err(|e| fail("taking the slot lock for", e))?;
        let mut written = SlotWritten::default();
        for (task_id, ago) in &writes.subscribed {
            for row in tx
                .query(&sql.end_reservation, &[task_id, &seconds(*ago)])
                .await
                .map_err(|e| fail("ending a reservation in", e))?
            {
                written.ended.push((
                    task_id.clone(),
                    row.get(0),
                    duration(row.get(1)).unwrap_or_default(),
                    row.get(2),
                ));
            }
        }
        for write in &writes.reservations {
            let result = match write {
                ReservationWrite::Open {
                    task_id,
                    lease,
                    floor,
                    replica_version,
                    protocol,
                    connected,
                    restore_limit,
                    opened_ago,
                } => {
                    tx.execute(
                        &sql.open_reservation,
                        &[
                            task_id,
                            floor,
                            replica_version,
                            &holder,
                            lease,
                            protocol,
                            connected,
                            &seconds(*opened_ago),
                            &restore_limit.map(seconds),
                        ],
                    )
                    .await
                }
                ReservationWrite::Floor {
                    task_id,
                    lease,
                    floor,
                    replica_version,
                } => {
                    tx.execute(
                        &sql.set_floor,
                        &[task_id, &holder, lease, floor, replica_version],
                    )
                    .await
                }
                ReservationWrite::Close { task_id, lease } => {
                    tx.execute(&sql.close_reservation, &[task_id, &holder, lease])
                        .await
                }
                ReservationWrite::Forget { task_id, lease } => {
                    tx.execute(&sql.forget_reservation, &[task_id, &holder, lease])
                        .await
                }
                ReservationWrite::Import {
                    task_id,
                    floor,
                    replica_version,
                    protocol,
                    opened_ago,
                } => {
                    tx.execute(
                        &sql.import_reservation,
                        &[
                            task_id,
                            floor,
                            replica_version,
                            &holder,
                            protocol,
                            &seconds(*opened_ago),
                        ],
                    )
                    .await
                }
            };
            result.map_err(|e| fail("writing a reservation to", e))?;
        }
        if let Some((rows, grace)) = &writes.subscribers {
            let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
            if !rows.is_empty() {
                let tasks: Vec<Option<&str>> = rows.iter().map(|r| r.task_id.as_deref()).collect();
                let ids: Vec<&str> = rows.iter().map(|r| r.subscriber_id.as_str()).collect();
                let floors: Vec<&str> = rows.iter().map(|r| r.floor.as_str()).collect();
                let versions: Vec<&str> = rows.iter().map(|r| r.replica_version.as_str()).collect();
                let connected: Vec<bool> = rows.iter().map(|r| r.connected).collect();
                tx.execute(
                    &sql.upsert_subscribers,
                    &[
                        &keys,
                        &tasks,
                        &ids,
                        &floors,
                        &versions,
                        &connected,
                        &holder,
                        &seconds(*grace),
                    ],
                )
                .await
                .map_err(|e| fail("writing subscribers to", e))?;
            }
            tx.execute(&sql.forget_subscribers, &[&holder, &keys])
                .await
                .map_err(|e| fail("forgetting subscribers in", e))?;
        }
        if writes.heartbeat {
            tx.execute(&sql.heartbeat, &[&holder])
                .await
                .map_err(|e| fail("vouching for reservations in", e))?;
            let own = tx
                .query(&sql.own_reservations, &[&holder])
                .await
                .map_err(|e| fail("reading reservations back from", e))?;
            written.own_reservations =
                Some(own.iter().map(|row| (row.get(0), row.get(1))).collect());
        }
        tx.commit()
            .await
            .map_err(|e| fail("committing a write of", e))?;
        Ok(written)
    }

    /// What the live slots allow a purge batch going up to `target`, read in its transaction `tx` with the log's
    /// replica version (the slot lock already taken). The purger's own subscribers are left to its ceiling.
    pub(super) async fn slot_limit(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        check: SlotCheck<'_>,
        target: &str,
    ) -> Result<crate::cleanup::slots::SlotLimit, DbError> {
        let log_replica: Option<String> = tx
            .query_opt(&self.inner.sql.replica_version, &[])
            .await
            .map_err(|e| self.query_error("reading replicaVersion", e))?
            .map(|row| row.get(0));
        let sql = &self.inner.slot_sql;
        let mut read = read_slots(tx, sql, check.rule.restore_limit_now)
            .await
            .map_err(|e| self.slot_error(format!("reading {}.slots", sql.quoted), e))?;
        if let Some(own) = check.own {
            read.retain(|s| !(s.kind == SlotKind::Subscriber && s.holder == own));
        }
        Ok(crate::cleanup::slots::limit(
            &read,
            target,
            log_replica.as_deref(),
            check.rule.pause,
        ))
    }

    /// Every slot of the shard, whichever sidecar holds it, live or not; `restore_limit_now`: the limit for
    /// reservations that opened without one (`None`: the replica's size is unknown).
    pub async fn slots(&self, restore_limit_now: Option<Duration>) -> Result<Vec<Slot>, DbError> {
        let client = self.client().await?;
        read_slots(&*client, &self.inner.slot_sql, restore_limit_now)
            .await
            .map_err(|e| {
                self.slot_error(format!("reading {}.slots", self.inner.slot_sql.quoted), e)
            })
    }

    /// Deletes the rows that bound nothing any more (their holder is gone, their grace or limit passed); returns
    /// how many.
    pub async fn forget_dead_slots(
        &self,
        restore_limit_now: Option<Duration>,
    ) -> Result<u64, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.slot_sql;
        client
            .execute(&sql.forget_dead, &[&restore_limit_now.map(seconds)])
            .await
            .map_err(|e| {
                self.slot_error(format!("forgetting dead slots in {}.slots", sql.quoted), e)
            })
    }
}

/// Reads every slot with `client` (a transaction, inside a purge batch).
pub(super) async fn read_slots(
    client: &impl GenericClient,
    sql: &SlotSql,
    restore_limit_now: Option<Duration>,
) -> Result<Vec<Slot>, tokio_postgres::Error> {
    let rows = client
        .query(&sql.list, &[&restore_limit_now.map(seconds)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| Slot {
            // The table's CHECK allows only these two.
            kind: SlotKind::parse(row.get(0)).unwrap_or(SlotKind::Reservation),
            key: row.get(1),
            task_id: row.get(2),
            subscriber_id: row.get(3),
            floor: row.get(4),
            replica_version: row.get(5),
            holder: row.get(6),
            connected: row.get(7),
            age: duration(row.get(8)).unwrap_or_default(),
            since_heartbeat: duration(row.get(9)).unwrap_or_default(),
            restore_limit: duration(row.get(10)),
            live: row.get(11),
        })
        .collect())
}

/// The slot lock's key for `zero`'s shard: its class, and the shard's key as the purger lock has it.
pub fn slot_lock_key(zero: &ZeroConfig) -> (i32, i32) {
    (
        SLOT_LOCK_CLASS,
        fnv1a_32(zero.cdc_schema().as_bytes()) as i32,
    )
}

const _: () =
    assert!(SLOT_LOCK_CLASS != PURGER_LOCK_CLASS && MIGRATE_LOCK_CLASS != PURGER_LOCK_CLASS);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_quoted_schema() {
        let sql = SlotSql::new("zero_0/sidecar", "zero_0/cdc");
        assert!(sql.list.contains(r#"FROM "zero_0/sidecar".slots"#));
        assert!(sql
            .forget_dead
            .starts_with(r#"DELETE FROM "zero_0/sidecar".slots WHERE NOT (CASE"#));
        for (_, _, text) in MIGRATIONS {
            assert!(!text.replace("{s}", &sql.quoted).contains("{s}"));
        }
    }

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        for (at, (version, _, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version as usize, at + 1);
        }
    }

    #[test]
    fn a_reservation_lives_without_a_limit_while_the_size_is_unknown() {
        // The liveness rule keeps a reservation whose limit is unknown: coalesce(NULL comparison, true).
        assert!(LIVE.contains("coalesce(now() < opened_at + coalesce(restore_limit, make_interval(secs => $1::float8)), true)"));
        assert!(LIVE.contains("now() < heartbeat + grace"));
        assert!(LIVE.contains("(connected AND now() < heartbeat + interval '30 seconds')"));
    }
}
