//! `GET /status`: everything an operator asks when cleanup does not run, in one JSON document ([`Report`]), and the
//! table `litestream-sidecar status` prints from it ([`render`]).
//!
//! [`build`] and [`render`] are pure: the server gathers the state the loops already keep ([`Sources::gather`]),
//! the subcommand fetches the JSON ([`fetch`]), and the tests feed either side plain data. Nothing here touches the
//! change DB: its size is the monitor's last reading, so `/status` answers at once even while the DB is dead.
//!
//! Field names are part of the interface (scripts and alerts read them): add fields, never rename them. Every
//! field the renderer reads is optional on the way in, so a newer `status` reads an older daemon's answer.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::cleanup::monitor::Status;
use crate::cleanup::reservations::Reservation;
use crate::cleanup::subscribers::SubscriberView;
use crate::cleanup::{Backup, Decision};
use crate::ops::metrics::UpstreamHealth;

/// The whole `/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    pub version: String,
    /// When the document was made (RFC 3339, UTC); every `*_seconds` age is relative to it.
    pub generated_at: String,
    pub uptime_seconds: f64,
    /// The newest backed-up watermarks litestream reported and the sidecar still tracks, newest first (at most
    /// [`crate::cleanup::monitor::RECENT_BACKUPS`]), plus the gauge's current one if it is not among them.
    pub backups: Vec<BackupEntry>,
    /// How many backups are tracked in all (not yet purged below).
    pub backups_tracked: usize,
    /// Set while litestream's gauge reports less than it once did (cleanup holds until it is back).
    pub backup_regressed: Option<Regressed>,
    /// What the backup destination holds behind the claims; `null` while `backup.verify` is off.
    pub destination: Option<DestinationEntry>,
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
    pub last_purge: Option<LastPurge>,
    pub change_log: Option<ChangeLog>,
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
    /// Whether the destination holds an object written at or after its backup time minus `backup.slack` (only
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
pub struct LastPurge {
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
pub struct Inputs {
    pub status: Status,
    pub reservations: Vec<Reservation>,
    pub subscribers: Vec<SubscriberView>,
    pub newest_commit: Option<(String, Instant)>,
    pub upstream: UpstreamHealth,
    pub upstream_address: String,
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
pub fn build(inputs: &Inputs, now: Instant, wall_now: SystemTime) -> Report {
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
        })
        .collect();
    let last_purge = match (&status.last_purge, &status.purged_through) {
        (Some(purge), _) => Some(LastPurge {
            before: purge.before.clone(),
            bound: Some(purge.bound.clone()),
            rows: Some(purge.rows),
            completed_at: Some(rfc3339(purge.completed_at)),
            age_seconds: Some(age(purge.completed_at, wall_now)),
        }),
        (None, Some(through)) => Some(LastPurge {
            before: through.watermark.clone(),
            ..LastPurge::default()
        }),
        (None, None) => None,
    };
    let change_log = ChangeLog {
        rows: status.change_log.as_ref().map(|r| r.size.rows),
        exact: status.change_log.as_ref().map(|r| r.size.exact),
        read_at: status.change_log.as_ref().map(|r| rfc3339(r.read_at)),
        age_seconds: status.change_log.as_ref().map(|r| age(r.read_at, wall_now)),
        error: status.change_log_error.clone(),
    };
    Report {
        version: env!("CARGO_PKG_VERSION").into(),
        generated_at: rfc3339(wall_now),
        uptime_seconds: since(inputs.started),
        backups,
        backups_tracked: status.backups_tracked,
        destination: destination_entry(&status.backup, wall_now),
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
        }),
        cleanup: Some(cleanup(inputs, now, wall_now)),
        last_purge,
        change_log: Some(change_log),
    }
}

fn backup_entry(
    backup: &Backup,
    current: Option<&str>,
    destination: &crate::cleanup::monitor::BackupStatus,
    wall_now: SystemTime,
) -> BackupEntry {
    let verified = destination
        .verifying
        .then_some(destination.listing)
        .flatten()
        .map(|listing| {
            crate::cleanup::Destination::Listed {
                newest: listing.newest,
                slack: destination.slack,
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
    destination: &crate::cleanup::monitor::BackupStatus,
    wall_now: SystemTime,
) -> Option<DestinationEntry> {
    let newest = destination.listing.and_then(|l| l.newest);
    destination.verifying.then(|| DestinationEntry {
        objects: destination.listing.map(|l| l.objects),
        newest_object_at: newest.map(rfc3339),
        newest_object_age_seconds: newest.map(|t| age(t, wall_now)),
        stale: destination.stale.is_some(),
        error: destination.failing.as_ref().map(ToString::to_string),
    })
}

fn cleanup(inputs: &Inputs, now: Instant, wall_now: SystemTime) -> Cleanup {
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
            crate::cleanup::Memory::OptedOut => "none",
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
    pub registry: crate::cleanup::reservations::Registry,
    pub subscribers: crate::cleanup::subscribers::Subscribers,
    pub status: crate::cleanup::monitor::StatusHandle,
    pub upstream: crate::shared::Cell<UpstreamHealth>,
    pub upstream_address: String,
    pub cleanup_enabled: bool,
    pub reconnect_grace: Duration,
    pub started: Instant,
}

impl Sources {
    /// The state now, without I/O: every source is in memory.
    pub fn gather(&self, now: Instant) -> Inputs {
        Inputs {
            status: self.status.get(),
            reservations: self.registry.open_reservations(),
            subscribers: self.subscribers.view(now, self.reconnect_grace),
            newest_commit: self.subscribers.newest_commit(),
            upstream: self.upstream.get(),
            upstream_address: self.upstream_address.clone(),
            cleanup_enabled: self.cleanup_enabled,
            cleanup_delay: self.registry.cleanup_delay(),
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

// ---------------------------------------------------------------------------------------------------------------
// The subcommand's side

/// Why `litestream-sidecar status` got no report.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot reach the sidecar at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("the sidecar at {addr} answered /status with something other than a status report: {source}")]
    NotAReport {
        addr: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Asks the daemon at `addr` (`host:port`) for `/status`, over TLS through `tls` when its listener speaks it;
/// returns the raw JSON and the parsed report.
pub async fn fetch(
    addr: &str,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
) -> Result<(String, Report), FetchError> {
    use crate::net::client::HttpError;
    // The client's messages name the URL and call it a scrape; here the address is said once, up front.
    let unreachable = |err: HttpError| FetchError::Unreachable {
        addr: addr.to_string(),
        reason: match err {
            HttpError::Io { source, .. } => source.to_string(),
            HttpError::Timeout { after, .. } => format!("no answer within {after:?}"),
            HttpError::Http { status, .. } => format!("GET /status answered HTTP {status}"),
            HttpError::TooLarge { limit, .. } => format!("answer larger than {limit} bytes"),
            HttpError::InvalidUrl { reason, .. } => reason.to_string(),
        },
    };
    let url = format!("http://{addr}/status").parse().map_err(|_| {
        unreachable(HttpError::InvalidUrl {
            url: addr.to_string(),
            reason: "not a host:port",
        })
    })?;
    let scraper =
        crate::net::client::HttpClient::new(url, timeout, 16 << 20).map_err(unreachable)?;
    let scraper = match tls {
        Some(connector) => scraper.with_tls(connector),
        None => scraper,
    };
    let body = scraper.fetch().await.map_err(unreachable)?;
    read_report(&body).map_err(|source| FetchError::NotAReport {
        addr: addr.to_string(),
        source,
    })
}

/// A `/status` answer as text and as a report. Whoever answers at the address writes it, so it is read like any
/// outside input: invalid UTF-8 is replaced rather than refused, since `--json` shows the text as it came.
pub fn read_report(body: &[u8]) -> Result<(String, Report), serde_json::Error> {
    let text = String::from_utf8_lossy(body).into_owned();
    let report = serde_json::from_str(&text)?;
    Ok((text, report))
}

/// Where to reach a daemon that listens on `listen`: a wildcard address is reached on loopback.
pub fn local_address(listen: std::net::SocketAddr) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    std::net::SocketAddr::new(ip, listen.port()).to_string()
}

// ---------------------------------------------------------------------------------------------------------------
// The table

/// `1h 2m 3s`, to the second.
fn duration(secs: f64) -> String {
    let whole = Duration::from_secs(secs.max(0.0).round() as u64);
    humantime::format_duration(whole).to_string()
}

fn or_dash(value: Option<&str>) -> &str {
    value.filter(|v| !v.is_empty()).unwrap_or("-")
}

/// Widest a column is padded to. A longer cell pushes the rest of its row right instead of widening the column:
/// one long value (whatever answered at `--addr` chose it) padded onto every row would make the table grow with
/// the square of the answer.
const MAX_COLUMN: usize = 64;

/// Left-aligned columns two spaces apart, like `litestream snapshots`.
fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count().min(MAX_COLUMN));
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Two-column `key  value` lines.
fn fields(out: &mut String, pairs: &[(&str, String)]) {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in pairs {
        out.push_str(&format!("{key:<width$}  {value}\n"));
    }
}

/// The readable form of a report, one section per question: what is backed up, who holds rows back, what cleanup
/// decided and since when, what it did last, and how big the log is.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "litestream-sidecar {}, up {}, at {}\n\n",
        or_dash(Some(&report.version)),
        duration(report.uptime_seconds),
        or_dash(Some(&report.generated_at)),
    ));

    out.push_str(&format!(
        "BACKUPS ({} tracked)\n",
        report.backups_tracked.max(report.backups.len())
    ));
    if report.backups.is_empty() {
        out.push_str("none reported by litestream yet\n");
    } else {
        let rows: Vec<Vec<String>> = report
            .backups
            .iter()
            .map(|b| {
                vec![
                    b.watermark.clone(),
                    or_dash(b.backed_up_at.as_deref()).to_string(),
                    b.age_seconds.map_or("-".into(), duration),
                    match b.verified {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "-",
                    }
                    .to_string(),
                    if b.current { "current" } else { "" }.to_string(),
                ]
            })
            .collect();
        table(
            &mut out,
            &["WATERMARK", "BACKED UP", "AGE", "IN DESTINATION", ""],
            &rows,
        );
    }
    if let Some(destination) = &report.destination {
        let newest = destination.newest_object_at.as_deref().map_or_else(
            || "no object".to_string(),
            |at| {
                format!(
                    "newest object {at} ({} ago)",
                    destination
                        .newest_object_age_seconds
                        .map_or("-".into(), duration)
                )
            },
        );
        out.push_str(&format!(
            "destination: {} objects, {newest}{}{}\n",
            destination
                .objects
                .map_or("-".to_string(), |n| n.to_string()),
            if destination.stale { "; STALE" } else { "" },
            destination
                .error
                .as_deref()
                .map(|e| format!("; listing fails: {e}"))
                .unwrap_or_default()
        ));
    }
    if let Some(regressed) = &report.backup_regressed {
        out.push_str(&format!(
            "litestream's watermark went back from {} to {}\n",
            regressed.highest, regressed.current
        ));
    }

    out.push_str(&format!("\nRESERVATIONS ({})\n", report.reservations.len()));
    if report.reservations.is_empty() {
        out.push_str("none open\n");
    } else {
        let rows: Vec<Vec<String>> = report
            .reservations
            .iter()
            .map(|r| {
                vec![
                    if r.kept {
                        format!("{} (kept across a restart)", r.task_id)
                    } else {
                        r.task_id.clone()
                    },
                    duration(r.age_seconds),
                    r.floor
                        .clone()
                        .unwrap_or_else(|| "none (protects every row)".into()),
                ]
            })
            .collect();
        table(&mut out, &["TASK", "AGE", "FLOOR"], &rows);
    }

    out.push_str(&format!("\nSUBSCRIBERS ({})\n", report.subscribers.len()));
    if report.subscribers.is_empty() {
        out.push_str("none\n");
    } else {
        let rows: Vec<Vec<String>> = report
            .subscribers
            .iter()
            .map(|s| {
                let state = match s.departed_seconds {
                    Some(ago) => format!("departed {} ago", duration(ago)),
                    None => s.state.clone(),
                };
                let lag = if s.caught_up && s.lag_seconds == 0.0 {
                    "caught up".to_string()
                } else if s.lag_seconds > 0.0 {
                    format!("behind {}", duration(s.lag_seconds))
                } else {
                    "behind".to_string()
                };
                vec![
                    s.id.clone(),
                    or_dash(s.task_id.as_deref()).to_string(),
                    s.mode.clone(),
                    s.acked.clone(),
                    state,
                    lag,
                ]
            })
            .collect();
        table(
            &mut out,
            &["ID", "TASK", "MODE", "ACKED", "STATE", "LAG"],
            &rows,
        );
    }
    match &report.newest_commit {
        Some(commit) => out.push_str(&format!(
            "newest commit relayed: {} ({} ago)\n",
            commit.watermark,
            duration(commit.age_seconds)
        )),
        None => out.push_str("newest commit relayed: none yet\n"),
    }
    if let Some(upstream) = &report.upstream {
        let state = match (upstream.up, &upstream.last_attempt_at) {
            (true, None) => "not tried yet".to_string(),
            (true, Some(at)) => format!("up (last connect {at})"),
            (false, at) => format!(
                "DOWN (last connect {}: {})",
                or_dash(at.as_deref()),
                or_dash(upstream.last_error.as_deref())
            ),
        };
        out.push_str(&format!("upstream {}: {state}\n", upstream.address));
    }

    out.push_str("\nCLEANUP\n");
    match &report.cleanup {
        None => out.push_str("unknown\n"),
        Some(cleanup) => {
            let mut pairs = Vec::new();
            let decision = match cleanup.decision.as_str() {
                "hold" => format!(
                    "hold: {} ({})",
                    or_dash(cleanup.hold_reason_text.as_deref()),
                    or_dash(cleanup.hold_reason.as_deref())
                ),
                "purge" if !cleanup.enabled => format!(
                    "would purge below {} (cleanup.enabled = false)",
                    or_dash(cleanup.purge_before.as_deref())
                ),
                "purge" => format!("purge below {}", or_dash(cleanup.purge_before.as_deref())),
                _ => "pending: no check yet".to_string(),
            };
            pairs.push(("decision", decision));
            if let Some(since) = &cleanup.held_since {
                let held = cleanup
                    .held_seconds
                    .map_or(String::new(), |s| format!(" ({})", duration(s)));
                pairs.push(("since", format!("{since}{held}")));
            }
            if let Some(bound) = &cleanup.purge_bound {
                pairs.push(("bound by", bound.clone()));
            }
            if let Some(problem) = &cleanup.problem {
                pairs.push(("problem", problem.clone()));
            }
            pairs.push(("delay", duration(cleanup.delay_seconds)));
            if cleanup.role != "purger" {
                pairs.push(("role", cleanup.role.clone()));
            }
            let state = match &cleanup.state_problem {
                Some(problem) => format!("{}: {problem}", cleanup.state),
                None => cleanup.state.clone(),
            };
            pairs.push(("state", state));
            if let Some(since) = &cleanup.restores_unknown_since {
                pairs.push(("unknown", format!("restores in flight since {since}")));
            }
            pairs.push((
                "purges",
                format!(
                    "{} ({} rows, {} failed, {} in a row)",
                    cleanup.purges,
                    cleanup.purged_rows,
                    cleanup.purge_failures,
                    cleanup.consecutive_purge_failures
                ),
            ));
            fields(&mut out, &pairs);
        }
    }

    out.push_str("\nLAST PURGE\n");
    match &report.last_purge {
        None => out.push_str("none yet\n"),
        Some(purge) => {
            let mut pairs = vec![("below", purge.before.clone())];
            match (&purge.completed_at, purge.age_seconds) {
                (Some(at), Some(age)) => {
                    pairs.push(("at", format!("{at} ({} ago)", duration(age))))
                }
                _ => pairs.push(("at", "before the last restart".into())),
            }
            if let Some(rows) = purge.rows {
                pairs.push(("rows", rows.to_string()));
            }
            if let Some(bound) = &purge.bound {
                pairs.push(("bound by", bound.clone()));
            }
            fields(&mut out, &pairs);
        }
    }

    out.push_str("\nCHANGE LOG\n");
    let log = report.change_log.clone().unwrap_or_default();
    let mut pairs = Vec::new();
    match (log.rows, log.exact) {
        (Some(rows), Some(false)) => pairs.push(("rows", format!("~{rows} (estimate)"))),
        (Some(rows), _) => pairs.push(("rows", rows.to_string())),
        (None, _) => pairs.push(("rows", "not read yet".into())),
    }
    if let (Some(at), Some(age)) = (&log.read_at, log.age_seconds) {
        pairs.push(("read", format!("{at} ({} ago)", duration(age))));
    }
    if let Some(error) = &log.error {
        pairs.push(("error", error.clone()));
    }
    fields(&mut out, &pairs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::monitor::{HeldSince, LastPurge as Purged};
    use crate::cleanup::subscribers::SubscriberInfo;
    use crate::cleanup::{Bound, HoldReason};
    use crate::protocol::Mode;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A sidecar up for an hour, held for 5 minutes by a subscriber behind the backup, after a purge 10 minutes ago.
    fn inputs(now: Instant, wall_now: SystemTime) -> Inputs {
        let status = Status {
            checks: 60,
            standby: Some(true),
            memory: crate::cleanup::Memory::Unwritable,
            state_problem: Some("cannot write /var/lib/x/state.json: denied".into()),
            last_decision: Some(Decision::Hold(HoldReason::SubscriberBehind)),
            held_since: Some(HeldSince {
                reason: HoldReason::SubscriberBehind,
                since: now - secs(300),
                since_wall: wall_now - secs(300),
            }),
            purges: 1,
            purged_rows: 42,
            last_purge: Some(Purged {
                before: "0c".into(),
                bound: "the newest aged backup".into(),
                rows: 42,
                completed_at: wall_now - secs(600),
            }),
            newest_backup: Some(("0f".into(), wall_now - secs(90))),
            recent_backups: vec![
                Backup {
                    watermark: "0f".into(),
                    backed_up_at: wall_now - secs(90),
                },
                Backup {
                    watermark: "0c".into(),
                    backed_up_at: wall_now - secs(700),
                },
            ],
            backups_tracked: 2,
            change_log: Some(crate::cleanup::monitor::ChangeLogReading {
                size: crate::cleanup::change_db::ChangeLogSize {
                    rows: 1234,
                    exact: true,
                },
                read_at: wall_now - secs(20),
            }),
            ..Status::default()
        };
        Inputs {
            status,
            reservations: vec![
                Reservation {
                    task_id: "restore-7".into(),
                    started: now - secs(45),
                    floor: Some("0c".into()),
                    kept: false,
                },
                Reservation {
                    task_id: "restore-6".into(),
                    started: now - secs(30),
                    floor: Some("0b".into()),
                    kept: true,
                },
            ],
            subscribers: vec![
                SubscriberView {
                    info: SubscriberInfo {
                        id: "vs-slow".into(),
                        task_id: Some("task-1".into()),
                        mode: Mode::Serving,
                        replica_version: "01".into(),
                        watermark: "0b".into(),
                    },
                    acked: "0d".into(),
                    connected: now - secs(1800),
                    departed: None,
                    unacked_since: Some(now - secs(75)),
                },
                SubscriberView {
                    info: SubscriberInfo {
                        id: "vs-gone".into(),
                        task_id: None,
                        mode: Mode::Backup,
                        replica_version: "01".into(),
                        watermark: "0e".into(),
                    },
                    acked: "0g".into(),
                    connected: now - secs(900),
                    departed: Some(now - secs(10)),
                    unacked_since: None,
                },
            ],
            newest_commit: Some(("0g".into(), now - secs(2))),
            upstream: UpstreamHealth::default(),
            upstream_address: "127.0.0.1:4849".into(),
            cleanup_enabled: true,
            cleanup_delay: secs(120),
            started: now - secs(3600),
        }
    }

    fn report() -> Report {
        let now = Instant::now();
        let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
        build(&inputs(now, wall_now), now, wall_now)
    }

    #[test]
    fn the_report_says_who_holds_cleanup_and_since_when() {
        let report = report();
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["cleanup"]["decision"], "hold");
        assert_eq!(json["cleanup"]["hold_reason"], "subscriber_behind");
        assert_eq!(json["cleanup"]["held_since"], "2025-06-15T15:01:40Z");
        assert_eq!(json["cleanup"]["held_seconds"], 300.0);
        assert_eq!(json["cleanup"]["delay_seconds"], 120.0);
        assert_eq!(json["backups"][0]["watermark"], "0f");
        assert_eq!(json["backups"][0]["current"], true);
        assert_eq!(json["backups"][0]["age_seconds"], 90.0);
        assert_eq!(json["backups"][1]["current"], false);
        assert_eq!(json["reservations"][0]["task_id"], "restore-7");
        assert_eq!(json["reservations"][0]["age_seconds"], 45.0);
        assert_eq!(json["reservations"][0]["floor"], "0c");
        assert_eq!(json["reservations"][0]["kept"], false);
        assert_eq!(json["reservations"][1]["task_id"], "restore-6");
        assert_eq!(json["reservations"][1]["kept"], true);
        let slow = &json["subscribers"][0];
        assert_eq!(
            (
                &slow["id"],
                &slow["state"],
                &slow["caught_up"],
                &slow["lag_seconds"]
            ),
            (
                &"vs-slow".into(),
                &"connected".into(),
                &false.into(),
                &75.0.into()
            )
        );
        let gone = &json["subscribers"][1];
        assert_eq!(gone["state"], "departed");
        assert_eq!(gone["departed_seconds"], 10.0);
        assert_eq!(gone["caught_up"], true);
        assert_eq!(json["last_purge"]["before"], "0c");
        assert_eq!(json["last_purge"]["rows"], 42);
        assert_eq!(json["last_purge"]["age_seconds"], 600.0);
        assert_eq!(json["change_log"]["rows"], 1234);
        assert_eq!(json["change_log"]["exact"], true);
        assert_eq!(json["upstream"]["up"], true);
        assert_eq!(json["newest_commit"]["watermark"], "0g");
    }

    #[test]
    fn the_gauges_backup_is_listed_even_when_no_longer_tracked() {
        let now = Instant::now();
        let wall_now = SystemTime::now();
        let mut inputs = inputs(now, wall_now);
        inputs.status.recent_backups.clear();
        inputs.status.newest_backup = Some(("0a".into(), wall_now - secs(5)));
        let report = build(&inputs, now, wall_now);
        assert_eq!(report.backups.len(), 1);
        assert!(report.backups[0].current);
    }

    #[test]
    fn a_purge_decision_has_its_bound_and_no_hold() {
        let now = Instant::now();
        let wall_now = SystemTime::now();
        let mut inputs = inputs(now, wall_now);
        inputs.status.last_decision = Some(Decision::Purge {
            before: "0d".into(),
            bound: Bound::Reservation {
                task_id: "restore-7".into(),
                floor: "0d".into(),
            },
        });
        inputs.status.held_since = None;
        let cleanup = build(&inputs, now, wall_now).cleanup.unwrap();
        assert_eq!(cleanup.decision, "purge");
        assert_eq!(cleanup.purge_before.as_deref(), Some("0d"));
        assert_eq!(
            cleanup.purge_bound.as_deref(),
            Some("reservation restore-7 at floor 0d")
        );
        assert_eq!((cleanup.hold_reason, cleanup.held_since), (None, None));
    }

    /// With `backup.verify` on, each claim says whether the destination covers it, and the destination is shown.
    #[test]
    fn claims_say_whether_the_destination_holds_them() {
        let now = Instant::now();
        let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
        let mut inputs = inputs(now, wall_now);
        inputs.status.backup = crate::cleanup::monitor::BackupStatus {
            verifying: true,
            slack: secs(60),
            // Written 5 minutes ago: covers the claim of 11m 40s ago, not the one of 1m 30s ago.
            listing: Some(crate::litestream::destination::Listing {
                objects: 3,
                newest: Some(wall_now - secs(300)),
            }),
            stale: Some((Some(wall_now - secs(300)), wall_now - secs(90))),
            ..Default::default()
        };
        let report = build(&inputs, now, wall_now);
        let verified: Vec<_> = report.backups.iter().map(|b| b.verified).collect();
        assert_eq!(verified, [Some(false), Some(true)]);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["destination"]["objects"], 3);
        assert_eq!(json["destination"]["stale"], true);
        let text = render(&report);
        for needle in [
            "0f         2025-06-15T15:05:10Z  1m 30s   NO              current",
            "0c         2025-06-15T14:55:00Z  11m 40s  yes",
            "destination: 3 objects, newest object 2025-06-15T15:01:40Z (5m ago); STALE",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        // Verification off: no verdicts, no destination.
        let report = build(&self::inputs(now, wall_now), now, wall_now);
        assert!(report.backups.iter().all(|b| b.verified.is_none()));
        assert_eq!(report.destination, None);
    }

    #[test]
    fn the_table_has_a_section_per_question() {
        let text = render(&report());
        for needle in [
            "BACKUPS (2 tracked)",
            "WATERMARK  BACKED UP",
            "0f         2025-06-15T15:05:10Z  1m 30s   -               current",
            "RESERVATIONS (2)",
            "restore-7                          45s  0c",
            "restore-6 (kept across a restart)  30s  0b",
            "SUBSCRIBERS (2)",
            "vs-slow  task-1  serving  0d     connected         behind 1m 15s",
            "vs-gone  -       backup   0g     departed 10s ago  caught up",
            "newest commit relayed: 0g (2s ago)",
            "upstream 127.0.0.1:4849: not tried yet",
            "decision  hold: subscriber behind backup (subscriber_behind)",
            "since     2025-06-15T15:01:40Z (5m)",
            "delay     2m",
            "role      standby",
            "state     unwritable: cannot write /var/lib/x/state.json: denied",
            "LAST PURGE",
            "below     0c",
            "rows      42",
            "CHANGE LOG",
            "rows  1234",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
    }

    #[test]
    fn a_long_cell_does_not_widen_its_column_for_every_row() {
        let mut report = Report {
            subscribers: vec![SubscriberEntry::default(); 1000],
            ..Report::default()
        };
        report.subscribers[0].id = "x".repeat(10_000);
        let text = render(&report);
        assert!(
            text.contains(&format!("{}  -", "x".repeat(10_000))),
            "the long id is shown whole"
        );
        // Every other row is padded to the capped width, not to the long id.
        for line in text.lines().filter(|l| !l.starts_with('x')) {
            assert!(line.len() <= MAX_COLUMN + 100, "{line:?}");
        }
    }

    #[test]
    fn an_empty_or_older_report_still_renders() {
        let text = render(&Report::default());
        assert!(text.contains("none reported by litestream yet"), "{text}");
        assert!(text.contains("RESERVATIONS (0)\nnone open"), "{text}");
        assert!(text.contains("rows  not read yet"), "{text}");
        // Fields it does not know (a `verified` added later, say) are ignored.
        let report: Report = serde_json::from_str(
            r#"{"backups":[{"watermark":"0a","verified":true}],"cleanup":{"decision":"pending"}}"#,
        )
        .unwrap();
        let text = render(&report);
        assert!(text.contains("0a"), "{text}");
        assert!(text.contains("pending: no check yet"), "{text}");
    }

    #[test]
    fn estimates_and_failures_are_marked() {
        let mut report = report();
        report.change_log = Some(ChangeLog {
            rows: Some(2_000_000),
            exact: Some(false),
            error: Some("change DB unavailable".into()),
            ..ChangeLog::default()
        });
        report.upstream = Some(Upstream {
            address: "cs:4849".into(),
            up: false,
            last_attempt_at: Some("2025-06-15T14:00:00Z".into()),
            last_error: Some("connection refused".into()),
        });
        let text = render(&report);
        assert!(text.contains("rows   ~2000000 (estimate)"), "{text}");
        assert!(text.contains("error  change DB unavailable"), "{text}");
        assert!(
            text.contains(
                "upstream cs:4849: DOWN (last connect 2025-06-15T14:00:00Z: connection refused)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_wildcard_listener_is_reached_on_loopback() {
        assert_eq!(
            local_address("0.0.0.0:4851".parse().unwrap()),
            "127.0.0.1:4851"
        );
        assert_eq!(local_address("[::]:4851".parse().unwrap()), "[::1]:4851");
        assert_eq!(
            local_address("10.0.0.5:4851".parse().unwrap()),
            "10.0.0.5:4851"
        );
    }
}
