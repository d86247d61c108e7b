//! `litestream-sidecar status`: fetches the daemon's `/status` ([`fetch`]) and prints it as tables ([`render`]);
//! `litestream-sidecar ready`: asks its `/keepalive` ([`ready`]).
//! [`render`] is pure: the tests feed it plain reports. Every field the renderer reads is optional on the way in, so
//! a newer `status` reads an older daemon's answer.

use std::time::Duration;

use crate::ops::status::Report;

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
    let body = get(addr, "/status", tls, timeout).await?;
    read_report(&body).map_err(|source| FetchError::NotAReport {
        addr: addr.to_string(),
        source,
    })
}

/// `litestream-sidecar ready`, a container's health check (the image has no HTTP client of its own): whether the
/// daemon at `addr` answers `/keepalive` with 200, and what it said.
pub async fn ready(
    addr: &str,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
) -> Result<String, FetchError> {
    let body = get(addr, "/keepalive", tls, timeout).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// `GET path` from the daemon at `addr`: the body of a 200 answer.
async fn get(
    addr: &str,
    path: &str,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
) -> Result<bytes::Bytes, FetchError> {
    use crate::net::client::HttpError;
    // The client's messages name the URL and call it a scrape; here the address is said once, up front.
    let unreachable = |err: HttpError| FetchError::Unreachable {
        addr: addr.to_string(),
        reason: match err {
            HttpError::Io { source, .. } => source.to_string(),
            HttpError::Timeout { after, .. } => format!("no answer within {after:?}"),
            HttpError::Http { status, .. } => format!("GET {path} answered HTTP {status}"),
            HttpError::TooLarge { limit, .. } => format!("answer larger than {limit} bytes"),
            HttpError::InvalidUrl { reason, .. } => reason.to_string(),
        },
    };
    let url = format!("http://{addr}{path}").parse().map_err(|_| {
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
    scraper.fetch().await.map_err(unreachable)
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
/// The shard's slots, whichever sidecar holds them, and the one that bounds purges now.
fn slots_section(out: &mut String, report: &Report) {
    let live = report.slots.iter().filter(|s| s.live).count();
    out.push_str(&format!(
        "\nSLOTS ({live} live of {}, in the change DB; this sidecar is {})\n",
        report.slots.len(),
        or_dash(report.holder.as_deref())
    ));
    if let Some(problem) = &report.slots_problem {
        out.push_str(&format!("NOT READ: {problem} (cleanup holds)\n"));
    }
    if report.slots.is_empty() {
        out.push_str("none\n");
        return;
    }
    let rows: Vec<Vec<String>> = report
        .slots
        .iter()
        .map(|s| {
            let holder = if s.this {
                format!("{} (this)", s.holder)
            } else {
                s.holder.clone()
            };
            let state = match (s.live, s.connected) {
                (false, _) => "expired",
                (true, true) => "connected",
                (true, false) => "closed, kept",
            };
            vec![
                s.kind.clone(),
                s.key.clone(),
                s.floor.clone().unwrap_or_else(|| "every row".into()),
                holder,
                duration(s.age_seconds),
                format!("{} ago", duration(s.heartbeat_seconds)),
                state.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "KIND",
            "KEY",
            "FLOOR",
            "HOLDER",
            "AGE",
            "HEARTBEAT",
            "STATE",
        ],
        &rows,
    );
    match &report.slot_bound {
        Some(bound) => out.push_str(&format!(
            "bounding purges: {} {} held by {}, {}\n",
            bound.kind,
            bound.key,
            bound.holder,
            match (&bound.problem, &bound.floor) {
                (Some(problem), _) => format!("NOT WELL FORMED: {problem}; nothing is purged"),
                (None, Some(floor)) => format!("at {floor}"),
                (None, None) => "protecting every row".into(),
            }
        )),
        None => out.push_str("bounding purges: none\n"),
    }
}

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
    if !report.unservable.is_empty() {
        unservable_section(&mut out, &report.unservable);
    }

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
        match (&destination.layout, &destination.problem) {
            (_, Some(problem)) => out.push_str(&format!("layout: {problem}\n")),
            (Some(layout), None) if layout == "restorable" => out.push_str(&format!(
                "layout: generation {}, snapshot {}, WAL to index {}, a restore reaches {}\n",
                or_dash(destination.generation.as_deref()),
                destination
                    .snapshot_index
                    .map_or("-".into(), |i| format!("{i:08x}")),
                destination
                    .last_wal_index
                    .map_or("-".into(), |i| format!("{i:08x}")),
                or_dash(destination.restore_reaches_at.as_deref()),
            )),
            (Some(layout), None) => out.push_str(&format!("layout: {layout}\n")),
            (None, None) => {}
        }
    }
    if let Some(drills) = &report.drills {
        drills_section(&mut out, drills);
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
                let task = match (&r.withheld, r.kept) {
                    (Some(why), _) => format!("{} (status withheld: {why})", r.task_id),
                    (None, true) => format!("{} (kept across a restart)", r.task_id),
                    (None, false) => r.task_id.clone(),
                };
                vec![
                    task,
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
    slots_section(&mut out, report);
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
        if let Some(protocols) = &upstream.protocols {
            out.push_str(&format!(
                "upstream protocols: {}\n",
                protocols_line(protocols)
            ));
        }
        if let Some(warning) = &upstream.readiness_warning {
            out.push_str(&format!("upstream not ready: {warning}\n"));
        }
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

/// `REFUSED`, first of all: a deployment the sidecar cannot serve is the one thing that matters until it is fixed.
fn unservable_section(out: &mut String, entries: &[crate::ops::status::UnservableEntry]) {
    out.push_str(
        "REFUSED: the sidecar cannot serve this deployment; cleanup and v4+ snapshot statuses are held\n",
    );
    for entry in entries {
        let since = match (&entry.since, entry.since_seconds) {
            (Some(at), Some(secs)) => format!(" (since {at}, {})", duration(secs)),
            (Some(at), None) => format!(" (since {at})"),
            _ => String::new(),
        };
        out.push_str(&format!("{}{since}: {}\n", entry.reason, entry.detail));
        if !entry.why.is_empty() {
            out.push_str(&format!("  why: {}\n", entry.why));
        }
        if !entry.remedy.is_empty() {
            out.push_str(&format!("  what to do: {}\n", entry.remedy));
        }
    }
    out.push('\n');
}

/// `DRILLS`: the latest drill, the latest proof and when the next one runs.
fn drills_section(out: &mut String, drills: &crate::ops::status::DrillsEntry) {
    out.push_str(&format!(
        "\nDRILLS ({}, {} run, {} failed{})\n",
        drills
            .interval_seconds
            .map_or("on demand only".to_string(), |s| format!(
                "every {}",
                duration(s)
            )),
        drills.runs,
        drills.failures,
        if drills.drive_cleanup {
            "; proofs drive cleanup"
        } else {
            ""
        },
    ));
    let line =
        |entry: &crate::ops::status::DrillEntry| match (&entry.proven_watermark, &entry.error) {
            (Some(watermark), _) => format!(
                "restored watermark {watermark} at {} ({} ago): restore {}, check {}, {} bytes",
                or_dash(entry.finished_at.as_deref()),
                entry.age_seconds.map_or("-".into(), duration),
                entry.restore_seconds.map_or("-".into(), duration),
                entry.check_seconds.map_or("-".into(), duration),
                entry.bytes.map_or("-".into(), |b| b.to_string()),
            ),
            (None, error) => format!(
                "FAILED at {} ({} ago): {}",
                or_dash(entry.finished_at.as_deref()),
                entry.age_seconds.map_or("-".into(), duration),
                or_dash(error.as_deref()),
            ),
        };
    match (&drills.last, &drills.last_proof) {
        (None, _) => out.push_str("no drill yet\n"),
        (Some(last), proof) => {
            out.push_str(&format!("last:   {}\n", line(last)));
            if let Some(proof) = proof.as_ref().filter(|_| !last.ok) {
                out.push_str(&format!("proven: {}\n", line(proof)));
            }
        }
    }
    if let Some(less) = &drills.restored_less {
        out.push_str(&format!(
            "RESTORED LESS: the backup claims {} ({}), a restore{} reaches only {}; cleanup and snapshot \
             statuses held until a drill restores {} again\n",
            less.claimed,
            less.claimed_by,
            less.generation
                .as_deref()
                .map(|g| format!(" of generation {g}"))
                .unwrap_or_default(),
            less.restored,
            less.claimed,
        ));
    }
    if let Some(since) = &drills.running_since {
        out.push_str(&format!("running since {since}\n"));
    } else if let Some(next) = &drills.next_at {
        out.push_str(&format!("next at {next}\n"));
    }
}

/// What the upstream serves, and who said so: `[v4 ... v6] (probe, since …)`, or why it is not known.
fn protocols_line(protocols: &crate::ops::status::ProtocolsEntry) -> String {
    match (protocols.min, protocols.max) {
        (Some(min), Some(max)) => {
            let how = match protocols.source.as_deref() {
                Some("config") => "upstream.protocols".to_string(),
                Some("refusal") => "learned from a refused subscription".to_string(),
                Some("probe") => "learned by probe".to_string(),
                other => or_dash(other).to_string(),
            };
            match &protocols.since {
                Some(since) => format!("[v{min} ... v{max}] ({how}, since {since})"),
                None => format!("[v{min} ... v{max}] ({how})"),
            }
        }
        _ => match &protocols.probe_error {
            Some(error) => format!("unknown ({}; last probe: {error})", protocols.setting),
            None => format!("unknown yet ({})", protocols.setting),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::status::tests::report;
    use crate::ops::status::{ChangeLog, ProtocolsEntry, SubscriberEntry, Upstream};

    #[test]
    fn the_table_has_a_section_per_question() {
        let text = render(&report());
        for needle in [
            "BACKUPS (2 tracked)",
            "WATERMARK  BACKED UP",
            "0f         2025-06-15T15:05:10Z  1m 30s   -               current",
            "RESERVATIONS (2)",
            "restore-7 (status withheld: log_past_backup)  45s  0c",
            "restore-6 (kept across a restart)             30s  0b",
            "SUBSCRIBERS (2)",
            "vs-slow  task-1  serving  0d     connected         behind 1m 15s",
            "vs-gone  -       backup   0g     departed 10s ago  caught up",
            "newest commit relayed: 0g (2s ago)",
            "upstream 127.0.0.1:4849: not tried yet",
            "upstream protocols: [v4 ... v6] (learned by probe, since 2025-06-15T14:56:40Z)",
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
    fn a_refusal_comes_before_everything_else_with_what_to_do() {
        let mut report = report();
        assert!(!render(&report).contains("REFUSED"), "none while servable");
        report.unservable = vec![crate::ops::status::UnservableEntry {
            reason: "backup_path".into(),
            detail: r#"Zero records per-replica or v5 backups in "zero_0"."replicas": replica "r2" (backupPath "1761", backupV5 true)"#.into(),
            why: "Zero 1.10's v5 backups go elsewhere".into(),
            remedy: "unset ZERO_LITESTREAM_BACKUP_USING_V5".into(),
            since: Some("2025-06-15T15:01:40Z".into()),
            since_seconds: Some(300.0),
        }];
        let text = render(&report);
        let expected = "\n\nREFUSED: the sidecar cannot serve this deployment; cleanup and v4+ snapshot statuses are \
                        held\nbackup_path (since 2025-06-15T15:01:40Z, 5m): Zero records per-replica or v5 backups in \
                        \"zero_0\".\"replicas\": replica \"r2\" (backupPath \"1761\", backupV5 true)\n  why: Zero \
                        1.10's v5 backups go elsewhere\n  what to do: unset ZERO_LITESTREAM_BACKUP_USING_V5\n\nBACKUPS";
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
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
            protocols: Some(ProtocolsEntry {
                setting: "auto".into(),
                probe_error: Some("upstream cs:4849 unreachable".into()),
                ..ProtocolsEntry::default()
            }),
            readiness_warning: None,
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
        assert!(
            text.contains(
                "upstream protocols: unknown (auto; last probe: upstream cs:4849 unreachable)"
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
