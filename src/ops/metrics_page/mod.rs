//! `GET /metrics` on the main listener, through prometheus-client: a [`Snapshot`] of the state the loops already
//! keep, read at scrape time from [`MetricsSources`], and the live instruments. [`render`] is pure over both, so it
//! is tested by parsing its output.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::cleanup::change_db::FailureClass;
use crate::cleanup::HoldReason;

use super::metrics::Instruments;

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LayoutLabel {
    layout: &'static str,
}

/// Every [`crate::litestream::layout::Layout::kind`], each a series of `backup_layout` from the first listing on.
const LAYOUTS: [&str; 6] = [
    "empty",
    "restorable",
    "no_snapshot",
    "index_gap",
    "unreadable_name",
    "ltx",
];

/// State read at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub reservations_open: u64,
    pub subscribers: u64,
    /// The newest backed-up watermark and how many seconds ago it was backed up.
    pub newest_backup: Option<(String, f64)>,
    pub cleanup_delay_seconds: f64,
    pub purge_runs: u64,
    pub purged_rows: u64,
    pub purge_failures: u64,
    pub purge_consecutive_failures: u64,
    /// The class of the last purge's failure, while purges keep failing.
    pub purge_failing: Option<FailureClass>,
    pub holds: HashMap<HoldReason, u64>,
    /// `None` when discovery is off.
    pub registered: Option<bool>,
    pub change_db_up: bool,
    pub scrape_errors: u64,
    /// The hold reason in force and for how many seconds; `None` while cleanup purges or before its first check.
    pub held: Option<(HoldReason, f64)>,
    /// The change log's size as the monitor last read it.
    pub change_log_rows: Option<u64>,
    pub upstream_up: bool,
    /// Epoch seconds of the last complete purge of this run.
    pub last_purge_timestamp: Option<f64>,
    /// `None` while `backup.verify` is off.
    pub backup: Option<BackupFigures>,
    /// Connections open on the main listener, and its cap (`server.max_connections`).
    pub connections_open: u64,
    pub max_connections: u64,
    /// `Some(true)` while this sidecar holds the shard's purger lock, `Some(false)` while it is standby.
    pub purger: Option<bool>,
    /// Whether the state file keeps what this run knows (`cleanup.state_file = "none"` counts as not).
    pub state_kept: bool,
    /// Live reservation slots of the shard with no socket open on this sidecar (closed, kept across a restart, or
    /// another sidecar's): honoured until their task subscribes or their restore limit passes.
    pub reservations_kept: u64,
    /// Live slots of the shard (every sidecar's) by kind: how many, and the oldest one's age in seconds.
    pub slots: Vec<(crate::cleanup::slots::SlotKind, u64, f64)>,
    /// A live slot is not well formed: cleanup purges nothing while it stands.
    pub slot_malformed: bool,
    /// Whether litestream's backed-up position is known (not after a restart, a sample-less or failed page).
    pub backup_position_known: bool,
    /// The first gauge after a start was below the last purge.
    pub backup_below_last_purge: bool,
    pub drills: DrillFigures,
    /// Why the deployment cannot be served, while it cannot.
    pub unservable: Vec<crate::cleanup::unservable::Reason>,
}

/// The backup destination's figures (`backup.verify`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackupFigures {
    pub verified: bool,
    /// The newest object's last-modified time (epoch seconds) at the last listing that found one.
    pub newest_object: Option<f64>,
    pub stale: bool,
    pub errors: HashMap<crate::litestream::destination::ErrorKind, u64>,
    /// What the last listing that succeeded says of a restore ([`crate::litestream::layout::Layout::kind`]);
    /// `None` before one.
    pub layout: Option<&'static str>,
}

impl BackupFigures {
    pub fn of(backup: &crate::cleanup::status::BackupStatus) -> Self {
        Self {
            verified: backup.verified,
            newest_object: backup
                .listing
                .as_ref()
                .and_then(|l| l.newest)
                .and_then(epoch_seconds),
            stale: backup.stale.is_some(),
            errors: backup.errors.clone(),
            layout: backup.listing.as_ref().map(|l| l.layout.kind()),
        }
    }
}

/// Restore drills as the drill task last ran them (it runs whatever the configuration; only its schedule can be off).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrillFigures {
    /// `backup.drill_interval`; 0 when drills run only on demand.
    pub interval_seconds: f64,
    pub running: bool,
    /// Drills finished, whatever their outcome.
    pub runs: u64,
    /// Failed drills, by [`crate::litestream::drill::Failure::kind`].
    pub failures: HashMap<&'static str, u64>,
    /// The kind of the latest drill's failure, while the latest drill failed.
    pub failing: Option<&'static str>,
    /// The latest drill that proved the backup.
    pub last_proof: Option<ProofFigures>,
}

/// What a drill that proved the backup found, and how long it took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProofFigures {
    /// When it finished (epoch seconds).
    pub finished: f64,
    pub watermark: String,
    pub replica_version: String,
    pub restore_seconds: f64,
    pub check_seconds: f64,
    pub bytes: u64,
}

impl DrillFigures {
    pub fn of(drills: &crate::cleanup::status::DrillStatus) -> Self {
        use crate::cleanup::status::DrillOutcome;
        Self {
            interval_seconds: drills.interval.map_or(0.0, |i| i.as_secs_f64()),
            running: drills.running_since.is_some(),
            runs: drills.runs,
            failures: drills.failures.clone(),
            // A restore that reached less than the claim stands until a drill reaches it again, whatever the drills
            // in between found.
            failing: match (&drills.restored_less, &drills.last) {
                (Some(failure), _) | (None, Some(DrillOutcome::Failed { failure, .. })) => {
                    Some(failure.kind())
                }
                (None, Some(DrillOutcome::Proved(_)) | None) => None,
            },
            last_proof: drills.last_proof.as_ref().map(|proof| ProofFigures {
                finished: epoch_seconds(proof.finished).unwrap_or(0.0),
                watermark: proof.watermark.clone(),
                replica_version: proof.replica_version.clone(),
                restore_seconds: proof.restore_took.as_secs_f64(),
                check_seconds: proof.check_took.as_secs_f64(),
                bytes: proof.bytes,
            }),
        }
    }
}

fn epoch_seconds(t: std::time::SystemTime) -> Option<f64> {
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}

/// Where a scrape reads its figures: the instruments, and the handles whose state goes into a [`Snapshot`].
pub struct MetricsSources {
    pub instruments: Instruments,
    pub registry: crate::cleanup::reservations::Registry,
    pub subscribers: crate::cleanup::subscribers::Subscribers,
    pub status: crate::cleanup::status::StatusHandle,
    pub discovery_mode: crate::cleanup::discovery::DiscoveryMode,
    pub discovery: crate::cleanup::discovery::StateHandle,
    /// The main listener's connection counts.
    pub admission: crate::net::admission::Admission,
}

impl MetricsSources {
    /// The state the loops keep, read now; `now` dates the newest backup's age.
    pub fn snapshot(&self, now: std::time::SystemTime) -> Snapshot {
        let status = self.status.get();
        let held = status.held_since.as_ref().map(|held| {
            let seconds = tokio::time::Instant::now()
                .saturating_duration_since(held.since)
                .as_secs_f64();
            (held.reason, seconds)
        });
        let discovery = self.discovery.get();
        Snapshot {
            reservations_open: self.registry.len() as u64,
            subscribers: self.subscribers.connected() as u64,
            newest_backup: status.newest_backup.map(|(watermark, at)| {
                let age = now.duration_since(at).unwrap_or_default().as_secs_f64();
                (watermark, age)
            }),
            cleanup_delay_seconds: self.registry.cleanup_delay().as_secs_f64(),
            purge_runs: status.purges,
            purged_rows: status.purged_rows,
            purge_failures: status.purge_failures.total,
            purge_consecutive_failures: status.purge_failures.consecutive,
            purge_failing: status.purge_failures.last.as_ref().map(|l| l.class),
            holds: status.holds,
            registered: (self.discovery_mode != crate::cleanup::discovery::DiscoveryMode::Off)
                .then(|| {
                    discovery.registration
                        == Some(crate::cleanup::discovery::Registration::Registered)
                }),
            change_db_up: discovery.db_up,
            scrape_errors: status.scrape_errors,
            held,
            change_log_rows: status.change_log.as_ref().map(|read| read.size.rows),
            upstream_up: self.instruments.upstream.get().up,
            last_purge_timestamp: status.last_purge.as_ref().and_then(|purge| {
                let since_epoch = purge
                    .run
                    .as_ref()?
                    .completed_at
                    .duration_since(std::time::UNIX_EPOCH);
                since_epoch.ok().map(|d| d.as_secs_f64())
            }),
            backup: status
                .backup
                .verifying
                .then(|| BackupFigures::of(&status.backup)),
            connections_open: self.admission.open() as u64,
            max_connections: self.admission.max_connections() as u64,
            purger: status.standby.map(|standby| !standby),
            state_kept: status.memory == crate::cleanup::Memory::Kept,
            reservations_kept: status
                .slots
                .iter()
                .filter(|s| {
                    s.live
                        && s.kind == crate::cleanup::slots::SlotKind::Reservation
                        && !(s.connected && s.holder == status.holder)
                })
                .count() as u64,
            slots: [
                crate::cleanup::slots::SlotKind::Reservation,
                crate::cleanup::slots::SlotKind::Subscriber,
            ]
            .into_iter()
            .map(|kind| {
                let live = status.slots.iter().filter(|s| s.live && s.kind == kind);
                let count = live.clone().count() as u64;
                let oldest = live.map(|s| s.age.as_secs_f64()).fold(0.0, f64::max);
                (kind, count, oldest)
            })
            .collect(),
            slot_malformed: matches!(
                status.bounding_slot,
                Some(crate::cleanup::slots::SlotLimit::Malformed { .. })
            ),
            backup_position_known: status.backup_unknown.is_none(),
            backup_below_last_purge: status.backup_below_purge.is_some(),
            drills: DrillFigures::of(&status.drills),
            unservable: status
                .unservable
                .iter()
                .map(|r| r.unservable.reason)
                .collect(),
        }
    }

    /// The page `GET /metrics` serves.
    pub fn render(&self) -> String {
        render(
            &self.instruments,
            &self.snapshot(std::time::SystemTime::now()),
        )
    }
}

/// The Prometheus text exposition of everything above (with `# EOF`, as OpenMetrics ends a page).
pub fn render(instruments: &Instruments, snapshot: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("litestream_sidecar");
    let gauge = |value: f64| {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(value);
        g
    };
    let counter = |value: u64| {
        let c: Counter = Counter::default();
        c.inc_by(value);
        c
    };

    registry.register(
        "build",
        "Version of this sidecar",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    registry.register(
        "reservations_open",
        "Snapshot reservations open now",
        gauge(snapshot.reservations_open as f64),
    );
    registry.register(
        "reservation_duration_seconds",
        "How long reservations were held, however they ended",
        instruments.reservation_seconds.clone(),
    );
    registry.register(
        "relayed_subscribers",
        "Change-stream subscribers relayed now",
        gauge(snapshot.subscribers as f64),
    );
    registry.register(
        "relay_frames",
        "WebSocket frames relayed, by direction",
        instruments.relay_frames.clone(),
    );
    registry.register(
        "relay_bytes",
        "Payload bytes relayed, by direction",
        instruments.relay_bytes.clone(),
    );
    registry.register(
        "upstream_connect_errors",
        "Subscriptions refused because the change-streamer could not be reached or refused the upgrade",
        instruments.upstream_connect_errors.clone(),
    );
    registry.register(
        "connections_open",
        "Connections open on the main listener, WebSockets included",
        gauge(snapshot.connections_open as f64),
    );
    registry.register(
        "max_connections",
        "server.max_connections: past it, new connections get HTTP 503",
        gauge(snapshot.max_connections as f64),
    );
    registry.register(
        "connections_refused",
        "Connections and requests turned away, by reason: max_connections (503), not_allowed (403, server.allow), \
         header_timeout (closed), header_too_large (431)",
        instruments.connections_refused.clone(),
    );
    registry.register(
        "relay_write_stalls",
        "Subscriptions ended because the subscriber stopped reading: bytes waited relay.write_stall_timeout",
        instruments.relay_write_stalls.clone(),
    );
    registry.register(
        "tls_reloads",
        "Re-reads of TLS certificates, keys and CAs on SIGHUP, by result; a failed one keeps the previous ones",
        instruments.tls_reloads.clone(),
    );
    let backup = Family::<Vec<(&'static str, String)>, Gauge>::default();
    if let Some((watermark, _)) = &snapshot.newest_backup {
        backup
            .get_or_create(&vec![("watermark", watermark.clone())])
            .set(1);
    }
    registry.register(
        "backup_watermark",
        "The newest watermark litestream reports backed up (value 1; the watermark is the label)",
        backup,
    );
    if let Some((_, age)) = &snapshot.newest_backup {
        registry.register(
            "backup_age_seconds",
            "Seconds since the newest backed-up watermark was backed up",
            gauge(*age),
        );
    }
    registry.register(
        "cleanup_delay_seconds",
        "How long a backup must exist before the change-log rows it covers may be purged",
        gauge(snapshot.cleanup_delay_seconds),
    );
    registry.register(
        "purge_runs",
        "Change-log purges run",
        counter(snapshot.purge_runs),
    );
    registry.register(
        "purged_rows",
        "Change-log rows purged",
        counter(snapshot.purged_rows),
    );
    registry.register(
        "purge_failures",
        "Change-log purges that ended in an error",
        counter(snapshot.purge_failures),
    );
    registry.register(
        "purge_consecutive_failures",
        "Change-log purges in a row that ended in an error; 0 once one succeeds",
        {
            let g: Gauge = Gauge::default();
            g.set(snapshot.purge_consecutive_failures as i64);
            g
        },
    );
    let failing = Family::<ClassLabel, Gauge>::default();
    for class in FailureClass::ALL {
        failing
            .get_or_create(&ClassLabel {
                class: class.as_str(),
            })
            .set((snapshot.purge_failing == Some(class)) as i64);
    }
    registry.register(
        "purge_failing",
        "1 for the class of the last purge's error while purges keep failing, else 0",
        failing,
    );
    let holds = Family::<ReasonLabel, Counter>::default();
    for reason in HoldReason::ALL {
        let count = snapshot.holds.get(&reason).copied().unwrap_or(0);
        holds
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(count);
    }
    registry.register(
        "cleanup_holds",
        "Cleanup checks that did not purge, by reason",
        holds,
    );
    if let Some(registered) = snapshot.registered {
        registry.register(
            "registered",
            "1 when the shard's ownerAddress names this sidecar",
            gauge(if registered { 1.0 } else { 0.0 }),
        );
    }
    registry.register(
        "change_db_up",
        "1 when the change DB answers with Zero's schema",
        gauge(if snapshot.change_db_up { 1.0 } else { 0.0 }),
    );
    registry.register(
        "litestream_scrape_errors",
        "Failed scrapes of litestream's metrics page",
        counter(snapshot.scrape_errors),
    );
    // Only the reason in force has a series: an alert on `> N` then names the reason, and a reason that gave way
    // to another does not linger at its last value.
    let held = Family::<ReasonLabel, Gauge<f64, AtomicU64>>::default();
    if let Some((reason, seconds)) = snapshot.held {
        held.get_or_create(&ReasonLabel {
            reason: reason.as_str(),
        })
        .set(seconds);
    }
    registry.register(
        "cleanup_held_seconds",
        "Seconds cleanup has been held for the current reason; no series while it purges",
        held,
    );
    if let Some(rows) = snapshot.change_log_rows {
        registry.register(
            "change_log_rows",
            "Rows in the change log: counted up to 10000, PostgreSQL's estimate (pg_class.reltuples) above",
            gauge(rows as f64),
        );
    }
    if let Some(purger) = snapshot.purger {
        registry.register(
            "purger",
            "1 while this sidecar holds the shard's purger lock, 0 while another one does (standby)",
            gauge(if purger { 1.0 } else { 0.0 }),
        );
    }
    registry.register(
        "state_kept",
        "1 while this sidecar's slots and the shard's memory in the change DB are current; 0 while they cannot be \
         written or read, or before they were first read (cleanup holds)",
        gauge(if snapshot.state_kept { 1.0 } else { 0.0 }),
    );
    registry.register(
        "reservations_kept",
        "Live reservation slots of the shard with no socket open on this sidecar (closed, kept across a restart, \
         or another sidecar's): honoured until their task subscribes or their restore limit passes",
        gauge(snapshot.reservations_kept as f64),
    );
    let slots = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    let oldest = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    for (kind, count, age) in &snapshot.slots {
        let label = KindLabel {
            kind: kind.as_str(),
        };
        slots.get_or_create(&label).set(*count as f64);
        oldest.get_or_create(&label).set(*age);
    }
    registry.register(
        "slots",
        "Live slots of the shard in the change DB, whichever sidecar holds them: what bounds every purge",
        slots,
    );
    registry.register(
        "slot_oldest_seconds",
        "Age of the shard's oldest live slot of each kind, whichever sidecar holds it",
        oldest,
    );
    registry.register(
        "slot_malformed",
        "1 while a live slot is not well formed (a floor that is not a watermark, or of another replica): nothing \
         is purged until it is mended or expires",
        gauge(if snapshot.slot_malformed { 1.0 } else { 0.0 }),
    );
    registry.register(
        "backup_position_known",
        "1 while litestream's page shows where its backup stands; 0 after it restarted, lost its samples or could \
         not be read (cleanup holds)",
        gauge(if snapshot.backup_position_known { 1.0 } else { 0.0 }),
    );
    registry.register(
        "backup_below_last_purge",
        "1 when litestream's first backed-up watermark after a start was below the last purge: a restore of that \
         backup cannot catch up",
        gauge(if snapshot.backup_below_last_purge { 1.0 } else { 0.0 }),
    );
    // Every reason has a series from the start, so that an alert sees one end rather than vanish.
    let unservable = Family::<ReasonLabel, Gauge>::default();
    for reason in crate::cleanup::unservable::Reason::ALL {
        unservable
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .set(snapshot.unservable.contains(&reason) as i64);
    }
    registry.register(
        "unservable",
        "1 while the sidecar refuses this deployment for the reason (ltx: the backup destination holds litestream 0.5 \
         files; backup_path: Zero records per-replica or v5 backups, ZERO_LITESTREAM_BACKUP_USING_V5; \
         log_not_written: relayed commits never reach the change log), else 0; cleanup and v4+ snapshot statuses \
         hold meanwhile",
        unservable,
    );
    registry.register(
        "upstream_up",
        "1 when the relay's last attempt to reach the upstream change-streamer succeeded (1 before any attempt)",
        gauge(if snapshot.upstream_up { 1.0 } else { 0.0 }),
    );
    // 0 before the first: "never" in a form alert rules can test for, rather than a series that appears late.
    registry.register(
        "last_purge_timestamp_seconds",
        "Wall-clock time (epoch seconds) of the last complete change-log purge of this run; 0 before the first",
        gauge(snapshot.last_purge_timestamp.unwrap_or(0.0)),
    );
    if let Some(backup) = &snapshot.backup {
        registry.register(
            "backup_verified",
            "1 when the backup destination's newest generation restores and holds an object written at or after \
             litestream's newest claimed backup time, else 0",
            gauge(if backup.verified { 1.0 } else { 0.0 }),
        );
        if let Some(newest) = backup.newest_object {
            registry.register(
                "backup_destination_newest_timestamp_seconds",
                "Last-modified time of the newest object in the backup destination (epoch seconds)",
                gauge(newest),
            );
        }
        registry.register(
            "backup_stale",
            "1 while the backup destination's newest object is more than backup.stale_after older than \
             litestream's newest claimed backup",
            gauge(if backup.stale { 1.0 } else { 0.0 }),
        );
        let errors = Family::<KindLabel, Counter>::default();
        for kind in crate::litestream::destination::ErrorKind::ALL {
            errors
                .get_or_create(&KindLabel {
                    kind: kind.as_str(),
                })
                .inc_by(backup.errors.get(&kind).copied().unwrap_or(0));
        }
        registry.register(
            "backup_verification_errors",
            "Listings of the backup destination that failed, by kind (timeout, denied, not_found, other)",
            errors,
        );
        // Every layout has a series once something was listed, so that an alert on a broken one sees it end; none
        // before that.
        let layout = Family::<LayoutLabel, Gauge>::default();
        if let Some(current) = backup.layout {
            for kind in LAYOUTS {
                layout
                    .get_or_create(&LayoutLabel { layout: kind })
                    .set((kind == current) as i64);
            }
        }
        registry.register(
            "backup_layout",
            "1 for what the last listing of the backup destination says of a restore of its newest generation \
             (empty, restorable, no_snapshot, index_gap, unreadable_name, ltx), 0 for the others; no series before \
             a listing",
            layout,
        );
    }

    let drills = &snapshot.drills;
    registry.register(
        "drill_interval_seconds",
        "backup.drill_interval: how often a restore drill runs; 0 when drills run only on demand (\"off\")",
        gauge(drills.interval_seconds),
    );
    registry.register(
        "drill_running",
        "1 while a restore drill runs",
        gauge(if drills.running { 1.0 } else { 0.0 }),
    );
    registry.register(
        "drill_runs",
        "Restore drills finished, whatever their outcome",
        counter(drills.runs),
    );
    let failures = Family::<KindLabel, Counter>::default();
    let failing = Family::<KindLabel, Gauge>::default();
    for kind in crate::litestream::drill::Failure::KINDS {
        failures
            .get_or_create(&KindLabel { kind })
            .inc_by(drills.failures.get(kind).copied().unwrap_or(0));
        failing
            .get_or_create(&KindLabel { kind })
            .set((drills.failing == Some(kind)) as i64);
    }
    registry.register(
        "drill_failures",
        "Restore drills that proved nothing, by kind: the backup's (restore, nothing, check, not_a_replica, \
         other_replica, restored_less) or the drill's own (timeout, disk, setup)",
        failures,
    );
    registry.register(
        "drill_failing",
        "1 for the kind of the latest restore drill's failure while the latest drill failed (restored_less: until a \
         drill restores as far as that claim again), else 0",
        failing,
    );
    // 0 before the first, as last_purge_timestamp_seconds.
    registry.register(
        "drill_last_success_timestamp_seconds",
        "Wall-clock time (epoch seconds) the latest restore drill that proved the backup finished; 0 before the \
         first of this run",
        gauge(drills.last_proof.as_ref().map_or(0.0, |proof| proof.finished)),
    );
    if let Some(proof) = &drills.last_proof {
        registry.register(
            "drill_proven_watermark",
            "What the latest restore drill that proved the backup restored (value 1; the labels are the restored \
             replica's stateVersion and replicaVersion)",
            Info::new(vec![
                ("watermark", proof.watermark.clone()),
                ("replica_version", proof.replica_version.clone()),
            ]),
        );
        registry.register(
            "drill_restore_seconds",
            "Seconds litestream restore took in the latest restore drill that proved the backup",
            gauge(proof.restore_seconds),
        );
        registry.register(
            "drill_check_seconds",
            "Seconds SQLite's check of the restored database (backup.drill_check) took in the latest restore drill \
             that proved the backup",
            gauge(proof.check_seconds),
        );
        registry.register(
            "drill_restored_bytes",
            "Size in bytes of the database restored by the latest restore drill that proved the backup",
            {
                let g: Gauge = Gauge::default();
                g.set(i64::try_from(proof.bytes).unwrap_or(i64::MAX));
                g
            },
        );
    }

    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}
