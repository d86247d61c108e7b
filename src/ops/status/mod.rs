//! `GET /status`: everything an operator asks when cleanup does not run, in one JSON document ([`Report`]). The
//! `status` subcommand's side (fetching it, the tables) is `status_cli`.
//!
//! [`build`] is pure: the server gathers the state the loops already keep ([`Sources::gather`]), and the tests feed
//! it plain data. Nothing here touches the
//! change DB: its size is the monitor's last reading, so `/status` answers at once even while the DB is dead.
//!
//! Field names are part of the interface (scripts and alerts read them): add fields, never rename them. Every
//! field the renderer reads is optional on the way in, so a newer `status` reads an older daemon's answer.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::cleanup::reservations::Reservation;
use crate::cleanup::status::{DrillOutcome, Status};
use crate::cleanup::subscribers::SubscriberView;
use crate::cleanup::{Backup, Decision};
use crate::litestream::drill::Proof;
use crate::litestream::layout::Layout;
use crate::ops::metrics::UpstreamHealth;

#[cfg(test)]
pub(crate) mod tests;

/// The whole `/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    pub version: String,
    /// When the document was made (RFC 3339, UTC); every `*_seconds` age is relative to it.
    pub generated_at: String,
    pub uptime_seconds: f64,
    /// Why the sidecar cannot serve this deployment, one entry per reason; empty while it can. While any stands,
    /// cleanup holds (`unservable`) and v4+ snapshot statuses are withheld.
    pub unservable: Vec<UnservableEntry>,
    /// The newest backed-up watermarks litestream reported and the sidecar still tracks, newest first (at most
    /// [`crate::cleanup::status::RECENT_BACKUPS`]), plus the gauge's current one if it is not among them.
    pub backups: Vec<BackupEntry>,
    /// How many backups are tracked in all (not yet purged below).
    pub backups_tracked: usize,
    /// The replica's size as litestream's page last said it (`litestream_db_size`; `null` before the sidecar read
    /// one): what a snapshot status's `replicaSize`, the restore limit and a drill's disk and time go by.
    pub replica_bytes: Option<u64>,
    /// Set while litestream's gauge reports less than it once did (cleanup holds until it is back).
    pub backup_regressed: Option<Regressed>,
    /// What the backup destination holds behind the claims; `null` while `backup.verify` is off.
    pub destination: Option<DestinationEntry>,
    pub drills: Option<DrillsEntry>,
    /// Open snapshot reservations, oldest first.
    pub reservations: Vec<ReservationEntry>,
    /// Relayed subscribers the cleanup policy tracks: connected ones, and departed ones within the reconnect grace
    /// (or any while the upstream is lost).
    pub subscribers: Vec<SubscriberEntry>,
    /// The newest commit the relay has passed to any tracked subscriber: what `caught_up` compares with.
    pub newest_commit: Option<Commit>,
    pub upstream: Option<Upstream>,
    pub cleanup: Option<Cleanup>,
    /// The last purge that went all the way to its target: of this run, or the previous run's from the state
    /// file (then only `before` is known).
    pub last_purge: Option<LastPurgeEntry>,
    pub change_log: Option<ChangeLog>,
    /// Every slot of the shard in the change DB, whichever sidecar holds it, as of the last check (reservations
    /// first, then subscribers, each by key): what bounds every purge of every sidecar.
    pub slots: Vec<SlotEntry>,
    /// The live slot that bounds purges now (`null`: none does).
    pub slot_bound: Option<SlotBoundEntry>,
    /// Who this sidecar is in the slot table (`host/pid/start`).
    pub holder: Option<String>,
    /// Why the slots could not be read at the last check, while they could not (cleanup holds).
    pub slots_problem: Option<String>,
}

/// One row of the slot table, as `pg_replication_slots` shows a replication slot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotEntry {
    /// `reservation` or `subscriber`.
    pub kind: String,
    /// The reservation's task, or the subscriber's key (`holder#n`).
    pub key: String,
    pub task_id: Option<String>,
    /// Zero's subscriber id.
    pub subscriber_id: Option<String>,
    /// Rows above it are needed; `null`: every row is.
    pub floor: Option<String>,
    pub replica_version: Option<String>,
    /// The sidecar that holds (or last held) its socket; `this` is true when that is this one.
    pub holder: String,
    pub this: bool,
    /// Its socket was open at the holder's last write.
    pub connected: bool,
    /// Still bounds purges (see docs/operations.md, "Slots").
    pub live: bool,
    pub age_seconds: f64,
    /// Since its holder last vouched for it.
    pub heartbeat_seconds: f64,
    /// Reservations: how long its restore may take; `null` while the replica's size is unknown.
    pub restore_limit_seconds: Option<f64>,
}

/// The slot that bounds purges now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotBoundEntry {
    pub kind: String,
    pub key: String,
    pub holder: String,
    /// `null`: it protects every row.
    pub floor: Option<String>,
    /// Set when the row is not well formed: nothing is purged while it stands.
    pub problem: Option<String>,
}

/// One reason the deployment cannot be served ([`crate::cleanup::unservable`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UnservableEntry {
    /// `ltx`, `backup_path` or `log_not_written` (as in the metric's `reason` label).
    pub reason: String,
    /// What was found: the objects, rows or commit.
    pub detail: String,
    /// Why that cannot be served.
    pub why: String,
    /// What to do.
    pub remedy: String,
    /// Since when it has stood without interruption.
    pub since: Option<String>,
    pub since_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BackupEntry {
    /// The watermark litestream claims to have backed up.
    pub watermark: String,
    pub backed_up_at: Option<String>,
    pub age_seconds: Option<f64>,
    /// Where litestream's gauge is now: what a restore started now gets.
    pub current: bool,
    /// Whether the destination's restorable chain holds an object written at or after its backup time (only
    /// then may the sidecar purge below it); `null` while `backup.verify` is off or nothing was listed yet.
    pub verified: Option<bool>,
}

/// The backup destination as the last listing saw it (`backup.verify`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DestinationEntry {
    /// Objects under the replica's path, and the newest one's last-modified time.
    pub objects: Option<u64>,
    pub newest_object_at: Option<String>,
    pub newest_object_age_seconds: Option<f64>,
    /// The newest object is more than `backup.stale_after` older than litestream's newest claim.
    pub stale: bool,
    /// Why the latest listing failed, while listings fail.
    pub error: Option<String>,
    /// What the names say of a restore: `restorable`, `empty`, `no_snapshot`, `index_gap`, `unreadable_name` or
    /// `ltx` (litestream 0.5: refused, see [`Report::unservable`]).
    pub layout: Option<String>,
    /// The generation a restore picks, and the chain a restore of it applies (while `restorable`).
    pub generation: Option<String>,
    pub snapshot_index: Option<u64>,
    pub last_wal_index: Option<u64>,
    /// The newest object a restore reaches: claims up to this time are covered.
    pub restore_reaches_at: Option<String>,
    /// Why the newest generation does not restore, while it does not.
    pub problem: Option<String>,
}

/// Restore drills (`backup.drill_interval`, `litestream-sidecar drill`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DrillsEntry {
    /// Seconds between scheduled drills; `null`: on demand only.
    pub interval_seconds: Option<f64>,
    /// `cleanup.requires = "restore"`: proven watermarks drive cleanup and statuses.
    pub drive_cleanup: bool,
    pub running_since: Option<String>,
    pub next_at: Option<String>,
    pub runs: u64,
    pub failures: u64,
    /// The latest drill.
    pub last: Option<DrillEntry>,
    /// The latest drill that proved the backup (the same as `last` when that one did).
    pub last_proof: Option<DrillEntry>,
    /// A drill restored less than the backup claimed: cleanup and snapshot statuses hold until a drill restores
    /// at least that claim again (`null` while none did).
    pub restored_less: Option<RestoredLessEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RestoredLessEntry {
    /// What the backup claimed when that drill started, and where the claim came from.
    pub claimed: String,
    pub claimed_by: String,
    /// The watermark the restore reached, and the generation it restored.
    pub restored: String,
    pub generation: Option<String>,
    pub error: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DrillEntry {
    pub ok: bool,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub age_seconds: Option<f64>,
    /// The restored replica's `stateVersion`: the watermark a restore is proven to reach.
    pub proven_watermark: Option<String>,
    pub replica_version: Option<String>,
    /// The generation litestream restored.
    pub generation: Option<String>,
    /// Read from the change DB at start (a proof of an earlier run, or of another sidecar of the shard).
    pub kept: bool,
    pub restore_seconds: Option<f64>,
    pub check_seconds: Option<f64>,
    pub bytes: Option<u64>,
    /// Why it failed, and the failure's kind (the metric label).
    pub error: Option<String>,
    pub error_kind: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Regressed {
    pub highest: String,
    pub current: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReservationEntry {
    pub task_id: String,
    pub started_at: Option<String>,
    pub age_seconds: f64,
    /// The watermark it pins: no row at or above it is purged while it is open. `null`: no backup was known
    /// when it opened, so it protects every row.
    pub floor: Option<String>,
    /// Opened before the sidecar's last restart and kept from its state file: honoured until its task subscribes
    /// or `cleanup.restore_limit` has passed since it opened.
    pub kept: bool,
    /// Why its status is not sent yet (`no_backup`, `not_restorable`, `change_db`, `unservable`,
    /// `log_past_backup`), while it waits: its view-syncer only sees pings. `null` once sent.
    pub withheld: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubscriberEntry {
    /// Zero's subscriber `id`.
    pub id: String,
    pub task_id: Option<String>,
    /// `serving` or `backup`.
    pub mode: String,
    pub replica_version: String,
    /// The newest commit it acknowledged (or the watermark it subscribed from): rows from here on are kept.
    pub acked: String,
    /// `connected` or `departed`.
    pub state: String,
    pub connected_at: Option<String>,
    pub departed_at: Option<String>,
    /// Seconds since it departed; `null` while connected.
    pub departed_seconds: Option<f64>,
    /// `acked` is at or past `newest_commit` (true when no commit has been relayed yet).
    pub caught_up: bool,
    /// Seconds since the oldest commit relayed to it that it has not acknowledged was relayed; 0 when it has
    /// acknowledged everything relayed to it.
    pub lag_seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Commit {
    pub watermark: String,
    pub relayed_at: Option<String>,
    pub age_seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Upstream {
    pub address: String,
    /// Whether the relay's last connect succeeded (true before any).
    pub up: bool,
    pub last_attempt_at: Option<String>,
    pub last_error: Option<String>,
    /// The protocol versions it serves, as far as the sidecar knows (`upstream.protocols`).
    pub protocols: Option<ProtocolsEntry>,
    /// Why it will not become ready, where the sidecar's own settings are the cause ([`crate::ops::hidden_gauge`]).
    pub readiness_warning: Option<String>,
}

/// What the upstream serves decides which versions get a snapshot status and which subscriptions are relayed
/// (docs/protocol.md, "Protocol versions the upstream serves").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProtocolsEntry {
    /// `auto` (learned from the upstream), or the configured range as in `4..6`.
    pub setting: String,
    /// The upstream's lowest and highest version; `null` while unknown.
    pub min: Option<u64>,
    pub max: Option<u64>,
    /// Who said so: `config`, `probe` or `refusal` (of a relayed subscription).
    pub source: Option<String>,
    /// Since when it has been so.
    pub since: Option<String>,
    /// Why the last probe learned nothing, while it is the last.
    pub probe_error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cleanup {
    /// `cleanup.enabled`: when false the decision is made and logged, and nothing is deleted.
    pub enabled: bool,
    /// `hold`, `purge`, or `pending` before the first check.
    pub decision: String,
    /// The [`crate::cleanup::HoldReason`] label (as in the metrics' `reason`), while held.
    pub hold_reason: Option<String>,
    /// The same in words.
    pub hold_reason_text: Option<String>,
    /// Since when this hold reason has been in force without interruption.
    pub held_since: Option<String>,
    pub held_seconds: Option<f64>,
    /// While purging: rows below this watermark go.
    pub purge_before: Option<String>,
    /// While purging: what set `purge_before`.
    pub purge_bound: Option<String>,
    /// Why cleanup cannot do its job (litestream's gauge went back, purges fail), as `/keepalive` says it.
    pub problem: Option<String>,
    /// How long a backup must exist before the rows it covers may go.
    pub delay_seconds: f64,
    pub checks: u64,
    pub purges: u64,
    pub purged_rows: u64,
    pub consecutive_purge_failures: u64,
    pub purge_failures: u64,
    /// `purger` (holds the shard's purger lock), `standby` (another sidecar does), or `unknown` before the first
    /// try.
    pub role: String,
    /// `kept` (the state file is current), `none` (`cleanup.state_file = "none"`), `unwritable` or `unreadable`.
    pub state: String,
    /// Why the state file is not current, while it is not.
    pub state_problem: Option<String>,
    /// Since when which restores were in flight is unknown (a start without a state file), while cleanup holds
    /// for it.
    pub restores_unknown_since: Option<String>,
    /// Why litestream's backed-up position is unknown, while it is.
    pub backup_unknown: Option<String>,
    /// The change DB's replica version, and when it last changed (a resync) in this run.
    pub replica_version: Option<String>,
    pub replica_reset_at: Option<String>,
    /// Reservations kept across a restart that ended unanswered at `cleanup.restore_limit`.
    pub kept_reservations_expired: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LastPurgeEntry {
    /// Rows below this watermark are gone.
    pub before: String,
    pub bound: Option<String>,
    pub rows: Option<u64>,
    pub completed_at: Option<String>,
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChangeLog {
    /// `null` until the monitor has read it once.
    pub rows: Option<u64>,
    /// Counted (small logs) rather than PostgreSQL's estimate (`pg_class.reltuples`, large logs).
    pub exact: Option<bool>,
    pub read_at: Option<String>,
    pub age_seconds: Option<f64>,
    /// Why the last reading failed, while it is the last: `rows` is then older.
    pub error: Option<String>,
}

/// Everything [`build`] reads, gathered at one instant.
#[derive(Debug, Clone)]
pub struct ReportInputs {
    pub status: Status,
    pub reservations: Vec<Reservation>,
    pub subscribers: Vec<SubscriberView>,
    pub newest_commit: Option<(String, Instant)>,
    pub upstream: UpstreamHealth,
    pub upstream_address: String,
    pub protocols: crate::protocol::versions::Known,
    /// `upstream.protocols` is a range rather than `auto`.
    pub protocols_fixed: bool,
    /// `litestream.proxy_mode`.
    pub proxy_mode: crate::litestream::config::ProxyMode,
    pub cleanup_enabled: bool,
    pub cleanup_delay: Duration,
    pub started: Instant,
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Seconds, to the millisecond: finer is noise.
fn seconds(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

/// The wall-clock time of the monotonic instant `at`.
fn wall(at: Instant, now: Instant, wall_now: SystemTime) -> SystemTime {
    wall_now - now.saturating_duration_since(at)
}

fn age(at: SystemTime, wall_now: SystemTime) -> f64 {
    seconds(wall_now.duration_since(at).unwrap_or_default())
}

/// The `/status` document for `inputs` at `now` (`wall_now` on the wall clock).
/// The slot table and the slot that bounds purges, from the monitor's last read.
fn slots(status: &Status) -> (Vec<SlotEntry>, Option<SlotBoundEntry>) {
    use crate::cleanup::slots::SlotLimit;
    let entries = status
        .slots
        .iter()
        .map(|slot| SlotEntry {
            kind: slot.kind.as_str().into(),
            key: slot.key.clone(),
            task_id: slot.task_id.clone(),
            subscriber_id: slot.subscriber_id.clone(),
            floor: slot.floor.clone(),
            replica_version: slot.replica_version.clone(),
            holder: slot.holder.clone(),
            this: slot.holder == status.holder,
            connected: slot.connected,
            live: slot.live,
            age_seconds: seconds(slot.age),
            heartbeat_seconds: seconds(slot.since_heartbeat),
            restore_limit_seconds: slot.restore_limit.map(seconds),
        })
        .collect();
    let bound = status.bounding_slot.as_ref().and_then(|limit| {
        let (slot, floor, problem) = match limit {
            SlotLimit::Clear => return None,
            SlotLimit::Below { floor, slot } => (slot, Some(floor.clone()), None),
            SlotLimit::Everything { slot } => (slot, None, None),
            SlotLimit::Malformed { slot, problem } => (slot, None, Some(problem.clone())),
        };
        Some(SlotBoundEntry {
            kind: slot.kind.as_str().into(),
            key: slot.key.clone(),
            holder: slot.holder.clone(),
            floor,
            problem,
        })
    });
    (entries, bound)
}

pub fn build(inputs: &ReportInputs, now: Instant, wall_now: SystemTime) -> Report {
    let status = &inputs.status;
    let since = |at: Instant| seconds(now.saturating_duration_since(at));
    let current = status.newest_backup.as_ref().map(|(w, _)| w.as_str());
    let mut backups: Vec<BackupEntry> = status
        .recent_backups
        .iter()
        .map(|b| backup_entry(b, current, &status.backup, wall_now))
        .collect();
    if let Some((watermark, at)) = &status.newest_backup {
        if !backups.iter().any(|b| &b.watermark == watermark) {
            let gauge = Backup {
                watermark: watermark.clone(),
                backed_up_at: *at,
            };
            backups.push(backup_entry(&gauge, current, &status.backup, wall_now));
            backups.sort_by(|a, b| b.watermark.cmp(&a.watermark));
        }
    }
    let newest_commit = inputs.newest_commit.as_ref().map(|(watermark, at)| Commit {
        watermark: watermark.clone(),
        relayed_at: Some(rfc3339(wall(*at, now, wall_now))),
        age_seconds: since(*at),
    });
    let subscribers = inputs
        .subscribers
        .iter()
        .map(|s| SubscriberEntry {
            id: s.info.id.clone(),
            task_id: s.info.task_id.clone(),
            mode: s.info.mode.as_str().to_string(),
            replica_version: s.info.replica_version.clone(),
            acked: s.acked.clone(),
            state: if s.departed.is_some() {
                "departed"
            } else {
                "connected"
            }
            .into(),
            connected_at: Some(rfc3339(wall(s.connected, now, wall_now))),
            departed_at: s.departed.map(|at| rfc3339(wall(at, now, wall_now))),
            departed_seconds: s.departed.map(since),
            caught_up: inputs
                .newest_commit
                .as_ref()
                .is_none_or(|(newest, _)| s.acked.as_str() >= newest.as_str()),
            lag_seconds: s.unacked_since.map_or(0.0, since),
        })
        .collect();
    let reservations = inputs
        .reservations
        .iter()
        .map(|r| ReservationEntry {
            task_id: r.task_id.clone(),
            started_at: Some(rfc3339(wall(r.started, now, wall_now))),
            age_seconds: since(r.started),
            floor: r.floor.clone(),
            kept: r.kept,
            withheld: r.withheld.map(Into::into),
        })
        .collect();
    let last_purge = status.last_purge.as_ref().map(|purge| match &purge.run {
        Some(run) => LastPurgeEntry {
            before: purge.before.clone(),
            bound: Some(run.bound.clone()),
            rows: Some(run.rows),
            completed_at: Some(rfc3339(run.completed_at)),
            age_seconds: Some(age(run.completed_at, wall_now)),
        },
        None => LastPurgeEntry {
            before: purge.before.clone(),
            ..LastPurgeEntry::default()
        },
    });
    let change_log = ChangeLog {
        rows: status.change_log.as_ref().map(|r| r.size.rows),
        exact: status.change_log.as_ref().map(|r| r.size.exact),
        read_at: status.change_log.as_ref().map(|r| rfc3339(r.read_at)),
        age_seconds: status.change_log.as_ref().map(|r| age(r.read_at, wall_now)),
        error: status.change_log_error.clone(),
    };
    let (slot_entries, slot_bound) = slots(status);
    Report {
        version: env!("CARGO_PKG_VERSION").into(),
        generated_at: rfc3339(wall_now),
        uptime_seconds: since(inputs.started),
        unservable: status
            .unservable
            .iter()
            .map(|refusal| UnservableEntry {
                reason: refusal.unservable.reason.as_str().into(),
                detail: refusal.unservable.detail.clone(),
                why: refusal.unservable.reason.why().into(),
                remedy: refusal.unservable.reason.remedy().into(),
                since: Some(rfc3339(refusal.since.min(wall_now))),
                since_seconds: Some(age(refusal.since, wall_now)),
            })
            .collect(),
        backups,
        backups_tracked: status.backups_tracked,
        replica_bytes: status.db_bytes,
        destination: destination_entry(&status.backup, wall_now),
        drills: Some(drills_entry(status, wall_now)),
        backup_regressed: status
            .backup_regressed
            .as_ref()
            .map(|(highest, current)| Regressed {
                highest: highest.clone(),
                current: current.clone(),
            }),
        reservations,
        subscribers,
        newest_commit,
        upstream: Some(Upstream {
            address: inputs.upstream_address.clone(),
            up: inputs.upstream.up,
            last_attempt_at: inputs.upstream.last_attempt.map(rfc3339),
            last_error: inputs.upstream.last_error.clone(),
            protocols: Some(protocols_entry(inputs)),
            readiness_warning: crate::ops::hidden_gauge::warning(
                inputs.proxy_mode,
                &inputs.protocols,
            ),
        }),
        cleanup: Some(cleanup(inputs, now, wall_now)),
        last_purge,
        change_log: Some(change_log),
        slots: slot_entries,
        slot_bound,
        holder: (!status.holder.is_empty()).then(|| status.holder.clone()),
        slots_problem: status.slots_problem.clone(),
    }
}

fn protocols_entry(inputs: &ReportInputs) -> ProtocolsEntry {
    let known = &inputs.protocols;
    let versions = known.versions.as_ref();
    ProtocolsEntry {
        setting: match versions {
            Some(v) if inputs.protocols_fixed => format!("{}..{}", v.start(), v.end()),
            _ => "auto".into(),
        },
        min: versions.map(|v| *v.start()),
        max: versions.map(|v| *v.end()),
        source: known.source.map(|s| s.as_str().to_string()),
        since: known.since.map(rfc3339),
        probe_error: known.probe_error.clone(),
    }
}

fn backup_entry(
    backup: &Backup,
    current: Option<&str>,
    destination: &crate::cleanup::status::BackupStatus,
    wall_now: SystemTime,
) -> BackupEntry {
    let verified = destination
        .verifying
        .then_some(destination.listing.as_ref())
        .flatten()
        .map(|listing| {
            crate::cleanup::DestinationCheck::Listed {
                reaches: listing.chain_newest(),
            }
            .covers(backup.backed_up_at)
        });
    BackupEntry {
        watermark: backup.watermark.clone(),
        backed_up_at: Some(rfc3339(backup.backed_up_at)),
        age_seconds: Some(age(backup.backed_up_at, wall_now)),
        current: current == Some(backup.watermark.as_str()),
        verified,
    }
}

fn destination_entry(
    destination: &crate::cleanup::status::BackupStatus,
    wall_now: SystemTime,
) -> Option<DestinationEntry> {
    let listing = destination.listing.as_ref();
    let newest = listing.and_then(|l| l.newest);
    let chain = listing.and_then(|l| l.layout.chain());
    let generation = listing.and_then(|l| match &l.layout {
        Layout::Restorable(chain) => Some(chain.generation.clone()),
        Layout::Broken { generation, .. } => Some(generation.clone()),
        Layout::Empty | Layout::Ltx => None,
    });
    destination.verifying.then(|| DestinationEntry {
        objects: listing.map(|l| l.objects),
        newest_object_at: newest.map(rfc3339),
        newest_object_age_seconds: newest.map(|t| age(t, wall_now)),
        stale: destination.stale.is_some(),
        error: destination.failing.as_ref().map(ToString::to_string),
        layout: listing.map(|l| l.layout.kind().to_string()),
        generation,
        snapshot_index: chain.map(|c| c.snapshot_index),
        last_wal_index: chain.map(|c| c.last_index),
        restore_reaches_at: chain.map(|c| rfc3339(c.newest)),
        problem: listing.and_then(|l| {
            crate::cleanup::status::layout_problem(&l.layout).or_else(|| {
                crate::cleanup::unservable::of_layout(&l.layout)
                    .map(|refused| format!("refused: {}", refused.detail))
            })
        }),
    })
}

fn drills_entry(status: &Status, wall_now: SystemTime) -> DrillsEntry {
    let drills = &status.drills;
    let proved = |proof: &Proof| DrillEntry {
        ok: true,
        started_at: Some(rfc3339(proof.started)),
        finished_at: Some(rfc3339(proof.finished)),
        age_seconds: Some(age(proof.finished, wall_now)),
        proven_watermark: Some(proof.watermark.clone()),
        replica_version: Some(proof.replica_version.clone()),
        generation: proof.generation.clone(),
        restore_seconds: Some(seconds(proof.restore_took)),
        check_seconds: Some(seconds(proof.check_took)),
        bytes: Some(proof.bytes),
        ..DrillEntry::default()
    };
    DrillsEntry {
        interval_seconds: drills.interval.map(seconds),
        drive_cleanup: drills.drives_cleanup,
        running_since: drills.running_since.map(rfc3339),
        next_at: drills.next_at.map(rfc3339),
        runs: drills.runs,
        failures: drills.failures.values().sum(),
        last: drills.last.as_ref().map(|last| match last {
            DrillOutcome::Proved(proof) => proved(proof),
            DrillOutcome::Failed {
                failure,
                started,
                finished,
            } => DrillEntry {
                ok: false,
                started_at: Some(rfc3339(*started)),
                finished_at: Some(rfc3339(*finished)),
                age_seconds: Some(age(*finished, wall_now)),
                error: Some(failure.to_string()),
                error_kind: Some(failure.kind().to_string()),
                ..DrillEntry::default()
            },
        }),
        last_proof: status.last_proof().map(|proof| DrillEntry {
            kept: status.proof_is_kept(),
            ..proved(proof)
        }),
        restored_less: match &drills.restored_less {
            Some(
                failure @ crate::litestream::drill::Failure::RestoredLess {
                    claimed,
                    restored,
                    generation,
                    by,
                },
            ) => Some(RestoredLessEntry {
                claimed: claimed.clone(),
                claimed_by: (*by).to_string(),
                restored: restored.clone(),
                generation: generation.clone(),
                error: failure.to_string(),
            }),
            _ => None,
        },
    }
}

fn cleanup(inputs: &ReportInputs, now: Instant, wall_now: SystemTime) -> Cleanup {
    let status = &inputs.status;
    let mut cleanup = Cleanup {
        enabled: inputs.cleanup_enabled,
        decision: "pending".into(),
        problem: status.cleanup_problem(),
        delay_seconds: seconds(inputs.cleanup_delay),
        checks: status.checks,
        purges: status.purges,
        purged_rows: status.purged_rows,
        consecutive_purge_failures: status.purge_failures.consecutive,
        purge_failures: status.purge_failures.total,
        role: match status.standby {
            None => "unknown",
            Some(false) => "purger",
            Some(true) => "standby",
        }
        .into(),
        state: match status.memory {
            crate::cleanup::Memory::Kept => "kept",
            crate::cleanup::Memory::Loading => "loading",
            crate::cleanup::Memory::Unwritable => "unwritable",
            crate::cleanup::Memory::Unreadable => "unreadable",
        }
        .into(),
        state_problem: status.state_problem.clone(),
        restores_unknown_since: status.restores_unknown_since.map(rfc3339),
        backup_unknown: status.backup_unknown.clone(),
        replica_version: status.replica_version.clone(),
        replica_reset_at: status.replica_reset.as_ref().map(|(_, _, at)| rfc3339(*at)),
        kept_reservations_expired: status.kept_expired,
        ..Cleanup::default()
    };
    match &status.last_decision {
        None => {}
        Some(Decision::Hold(reason)) => {
            cleanup.decision = "hold".into();
            cleanup.hold_reason = Some(reason.as_str().into());
            cleanup.hold_reason_text = Some(reason.to_string());
            if let Some(held) = status.held_since.as_ref().filter(|h| h.reason == *reason) {
                cleanup.held_since = Some(rfc3339(held.since_wall.min(wall_now)));
                cleanup.held_seconds = Some(seconds(now.saturating_duration_since(held.since)));
            }
        }
        Some(Decision::Purge { before, bound }) => {
            cleanup.decision = "purge".into();
            cleanup.purge_before = Some(before.clone());
            cleanup.purge_bound = Some(bound.to_string());
        }
    }
    cleanup
}

/// What `/status` reads: the handles of the state the loops keep, and the configuration it reports.
pub struct Sources {
    pub handles: crate::cleanup::handles::Handles,
    pub upstream: crate::shared::Cell<UpstreamHealth>,
    pub upstream_address: String,
    /// What is known of the upstream's protocol versions, as the relay and the probe learn it.
    pub protocols: tokio::sync::watch::Receiver<crate::protocol::versions::Known>,
    /// `upstream.protocols` is a fixed range.
    pub protocols_fixed: bool,
    /// `litestream.proxy_mode`: `hide` in front of Zero 1.10 is said in `upstream.readiness_warning`.
    pub proxy_mode: crate::litestream::config::ProxyMode,
    /// `[cleanup]`: whether it purges (`enabled`), which departed subscribers it still tracks (`reconnect_grace`).
    pub cleanup: crate::cleanup::config::CleanupConfig,
    pub started: Instant,
}

impl Sources {
    /// The state now, without I/O: every source is in memory.
    pub fn gather(&self, now: Instant) -> ReportInputs {
        let handles = &self.handles;
        ReportInputs {
            status: handles.status.get(),
            reservations: handles.registry.open_reservations(),
            subscribers: handles.subscribers.view(now, self.cleanup.reconnect_grace),
            newest_commit: handles.subscribers.newest_commit(),
            upstream: self.upstream.get(),
            upstream_address: self.upstream_address.clone(),
            protocols: self.protocols.borrow().clone(),
            protocols_fixed: self.protocols_fixed,
            proxy_mode: self.proxy_mode,
            cleanup_enabled: self.cleanup.enabled,
            cleanup_delay: handles.registry.cleanup_delay(),
            started: self.started,
        }
    }

    /// The JSON `GET /status` serves.
    pub fn render_json(&self) -> String {
        let now = Instant::now();
        let report = build(&self.gather(now), now, SystemTime::now());
        let mut json = serde_json::to_string_pretty(&report).expect("a report always serializes");
        json.push('\n');
        json
    }
}
