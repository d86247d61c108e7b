use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::cleanup::change_db::FailureClass;
use crate::cleanup::status::{BackupStatus, Status};
use crate::cleanup::HoldReason;
use crate::litestream::destination::Listing;
use crate::litestream::layout::Layout;
use crate::ops::metrics::Direction;

/// A scrape at `wall`, `held_for` after the hold in force began at `since`.
fn clock(wall: SystemTime, since: tokio::time::Instant, held_for: f64) -> Clock {
    Clock {
        wall,
        now: since + Duration::from_secs_f64(held_for),
    }
}

/// A page of `status` alone: the handles' figures at their defaults, the clock at the epoch.
fn page(status: &Status) -> String {
    render(
        &Instruments::default(),
        status,
        &HandleFigures::default(),
        clock(UNIX_EPOCH, tokio::time::Instant::now(), 0.0),
    )
}

fn listing(newest: Option<SystemTime>, layout: Layout) -> Listing {
    Listing {
        objects: 3,
        newest,
        layout,
        uploads: Default::default(),
    }
}

fn parse(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"));
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn rendered_values_parse_back() {
    let instruments = Instruments::default();
    instruments.reservation_seconds.observe(3.0);
    instruments.reservation_seconds.observe(100.0);
    instruments
        .relay_counters(Direction::Downstream)
        .relayed(1, 300);
    instruments
        .relay_counters(Direction::Downstream)
        .relayed(1, 200);
    instruments
        .relay_counters(Direction::Upstream)
        .relayed(1, 9);
    instruments.upstream_connect_errors.inc();
    instruments.relay_write_stalls.inc();
    instruments.relay_write_stalls.inc();
    instruments
        .connections_refused
        .get_or_create(&crate::net::admission::Refusal::NotAllowed.label())
        .inc_by(3);
    instruments.tls_reloaded(true);
    instruments.tls_reloaded(false);
    instruments.tls_reloaded(false);
    let since = tokio::time::Instant::now();
    let mut status = Status {
        newest_backup: Some(("718sh0nk8".into(), at(1_750_000_000.0))),
        purges: 4,
        purged_rows: 12345,
        purge_failures: crate::cleanup::status::PurgeFailures {
            total: 9,
            consecutive: 3,
            last: Some(crate::cleanup::status::PurgeFailure {
                class: FailureClass::Permission,
                sqlstate: Some("42501".into()),
                message: "permission denied".into(),
            }),
        },
        holds: [(HoldReason::NoSubscribers, 7)].into_iter().collect(),
        scrape_errors: 1,
        held_since: Some(crate::cleanup::status::HeldSince {
            reason: HoldReason::SubscriberBehind,
            since,
            since_wall: at(1_749_999_947.0),
        }),
        change_log: Some(crate::cleanup::status::ChangeLogReading {
            size: crate::cleanup::change_db::ChangeLogSize {
                rows: 1234,
                exact: true,
            },
            read_at: at(1_750_000_000.0),
        }),
        last_purge: Some(crate::cleanup::LastPurge {
            before: "0a".into(),
            backed_up_at: None,
            run: Some(crate::cleanup::PurgeRun {
                bound: "backup".into(),
                rows: 12345,
                completed_at: at(1_750_000_000.0),
            }),
        }),
        backup: BackupStatus {
            verifying: true,
            verified: false,
            listing: Some(listing(
                Some(at(1_746_600_000.5)),
                Layout::Restorable(crate::litestream::layout::Chain {
                    generation: "6876d0f712825346".into(),
                    snapshot_index: 0,
                    last_index: 1,
                    newest: at(1_746_600_000.5),
                    objects: 2,
                }),
            )),
            stale: Some((Some(at(1_746_600_000.5)), at(1_750_000_000.0))),
            errors: [(crate::litestream::destination::ErrorKind::Timeout, 2)]
                .into_iter()
                .collect(),
            failing: None,
        },
        // Another sidecar purges.
        standby: Some(true),
        memory: crate::cleanup::Memory::Kept,
        // One reservation slot closed here: kept.
        slots: vec![slot(
            crate::cleanup::slots::SlotKind::Reservation,
            "us",
            false,
            60,
        )],
        holder: "us".into(),
        backup_unknown: Some("litestream restarted".into()),
        backup_below_purge: Some(("0a".into(), "09".into())),
        ..Status::default()
    };
    refuse(&mut status, crate::cleanup::unservable::Reason::Ltx);
    let handles = HandleFigures {
        reservations_open: 2,
        cleanup_delay: Duration::from_secs(45),
        subscribers: 3,
        registered: Some(true),
        change_db_up: true,
        upstream_up: false,
        connections_open: 17,
        max_connections: 16384,
    };
    let text = render(
        &instruments,
        &status,
        &handles,
        clock(at(1_750_000_042.5), since, 95.5),
    );
    let scrape = parse(&text);
    let v = |name: &str| value(&scrape, name, None);
    assert_eq!(v("litestream_sidecar_reservations_open"), 2.0);
    assert_eq!(v("litestream_sidecar_purger"), 0.0);
    assert_eq!(v("litestream_sidecar_state_kept"), 1.0);
    assert_eq!(v("litestream_sidecar_reservations_kept"), 1.0);
    assert_eq!(v("litestream_sidecar_backup_position_known"), 0.0);
    assert_eq!(v("litestream_sidecar_backup_below_last_purge"), 1.0);
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_unservable",
            Some(("reason", "ltx"))
        ),
        1.0
    );
    assert_eq!(v("litestream_sidecar_relayed_subscribers"), 3.0);
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_relay_frames_total",
            Some(("direction", "downstream"))
        ),
        2.0
    );
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_relay_bytes_total",
            Some(("direction", "downstream"))
        ),
        500.0
    );
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_relay_bytes_total",
            Some(("direction", "upstream"))
        ),
        9.0
    );
    assert_eq!(v("litestream_sidecar_upstream_connect_errors_total"), 1.0);
    assert_eq!(v("litestream_sidecar_backup_verified"), 0.0);
    assert_eq!(v("litestream_sidecar_backup_stale"), 1.0);
    assert_eq!(
        v("litestream_sidecar_backup_destination_newest_timestamp_seconds"),
        1_746_600_000.5
    );
    let errors = |kind| {
        value(
            &scrape,
            "litestream_sidecar_backup_verification_errors_total",
            Some(("kind", kind)),
        )
    };
    assert_eq!((errors("timeout"), errors("denied")), (2.0, 0.0));
    let layout = |layout| {
        value(
            &scrape,
            "litestream_sidecar_backup_layout",
            Some(("layout", layout)),
        )
    };
    assert_eq!((layout("restorable"), layout("index_gap")), (1.0, 0.0));
    assert_eq!(v("litestream_sidecar_relay_write_stalls_total"), 2.0);
    assert_eq!(v("litestream_sidecar_connections_open"), 17.0);
    assert_eq!(v("litestream_sidecar_max_connections"), 16384.0);
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_connections_refused_total",
            Some(("reason", "not_allowed"))
        ),
        3.0
    );
    let reloads = |result| {
        value(
            &scrape,
            "litestream_sidecar_tls_reloads_total",
            Some(("result", result)),
        )
    };
    assert_eq!((reloads("ok"), reloads("error")), (1.0, 2.0));
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_backup_watermark",
            Some(("watermark", "718sh0nk8"))
        ),
        1.0
    );
    assert_eq!(v("litestream_sidecar_backup_age_seconds"), 42.5);
    assert_eq!(v("litestream_sidecar_cleanup_delay_seconds"), 45.0);
    assert_eq!(v("litestream_sidecar_purge_runs_total"), 4.0);
    assert_eq!(v("litestream_sidecar_purged_rows_total"), 12345.0);
    assert_eq!(v("litestream_sidecar_purge_failures_total"), 9.0);
    assert_eq!(v("litestream_sidecar_purge_consecutive_failures"), 3.0);
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_purge_failing",
            Some(("class", "permission"))
        ),
        1.0
    );
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_purge_failing",
            Some(("class", "unavailable"))
        ),
        0.0
    );
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_cleanup_holds_total",
            Some(("reason", "no_subscribers"))
        ),
        7.0
    );
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_cleanup_holds_total",
            Some(("reason", "starting_up"))
        ),
        0.0
    );
    assert_eq!(v("litestream_sidecar_registered"), 1.0);
    assert_eq!(v("litestream_sidecar_change_db_up"), 1.0);
    assert_eq!(v("litestream_sidecar_litestream_scrape_errors_total"), 1.0);
    assert_eq!(
        value(
            &scrape,
            "litestream_sidecar_cleanup_held_seconds",
            Some(("reason", "subscriber_behind"))
        ),
        95.5
    );
    assert_eq!(
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "litestream_sidecar_cleanup_held_seconds")
            .count(),
        1,
        "only the reason in force has a series"
    );
    assert_eq!(v("litestream_sidecar_change_log_rows"), 1234.0);
    assert_eq!(v("litestream_sidecar_upstream_up"), 0.0);
    assert_eq!(
        v("litestream_sidecar_last_purge_timestamp_seconds"),
        1_750_000_000.0
    );
    assert!(
        text.contains("litestream_sidecar_build_info{version=\""),
        "{text}"
    );
    assert!(
        text.contains("litestream_sidecar_reservation_duration_seconds_count 2"),
        "{text}"
    );
    assert!(
        text.contains("litestream_sidecar_reservation_duration_seconds_sum 103.0"),
        "{text}"
    );
}

#[test]
fn unknown_state_is_left_out_rather_than_guessed() {
    let text = page(&Status::default());
    assert!(!text.contains("backup_age_seconds"), "{text}");
    assert!(!text.contains("litestream_sidecar_registered"), "{text}");
    assert!(!text.contains("watermark=\""), "{text}");
    assert!(!text.contains("cleanup_held_seconds{"), "{text}");
    assert!(!text.contains("change_log_rows"), "{text}");
    assert!(!text.contains("backup_layout"), "{text}");
    assert!(!text.contains("drill_proven_watermark_info"), "{text}");
    assert!(!text.contains("drill_restore_seconds"), "{text}");
    assert!(
        text.contains("litestream_sidecar_last_purge_timestamp_seconds 0"),
        "{text}"
    );
}

#[test]
fn the_upstream_counts_as_up_before_any_attempt() {
    let instruments = Instruments::default();
    assert!(instruments.upstream.get().up);
}

/// The page's lines, for asserting exact ones.
fn lines(text: &str) -> std::collections::BTreeSet<&str> {
    text.lines().collect()
}

/// Asserts that the page has every line of `expected`.
fn assert_lines(text: &str, expected: &[&str]) {
    let page = lines(text);
    let missing: Vec<_> = expected.iter().filter(|l| !page.contains(*l)).collect();
    assert!(missing.is_empty(), "missing {missing:#?} in\n{text}");
}

/// Whether the page has a sample of `family` (not just its `# HELP` and `# TYPE`).
fn has_sample(text: &str, family: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix(family)
            .is_some_and(|rest| rest.starts_with([' ', '{', '_']))
    })
}

fn at(seconds: f64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds)
}

fn proof(watermark: &str, finished: f64) -> crate::litestream::drill::Proof {
    crate::litestream::drill::Proof {
        watermark: watermark.into(),
        replica_version: "01".into(),
        generation: Some("6876d0f712825346".into()),
        started: at(finished - 20.0),
        finished: at(finished),
        restore_took: std::time::Duration::from_millis(12_500),
        check_took: std::time::Duration::from_millis(3_250),
        bytes: 1_048_576,
    }
}

fn render_drills(drills: &crate::cleanup::status::DrillStatus) -> String {
    page(&Status {
        drills: drills.clone(),
        ..Status::default()
    })
}

/// A live slot opened `age` seconds ago, held by `holder`.
fn slot(
    kind: crate::cleanup::slots::SlotKind,
    holder: &str,
    connected: bool,
    age: u64,
) -> crate::cleanup::slots::Slot {
    crate::cleanup::slots::Slot {
        kind,
        key: format!("{holder}-{age}"),
        task_id: None,
        subscriber_id: None,
        floor: Some("0a".into()),
        replica_version: Some("01".into()),
        holder: holder.into(),
        connected,
        age: Duration::from_secs(age),
        since_heartbeat: Duration::from_secs(1),
        restore_limit: None,
        live: true,
    }
}

/// Refuses the deployment for `reason`.
fn refuse(status: &mut Status, reason: crate::cleanup::unservable::Reason) {
    let found = crate::cleanup::unservable::Unservable {
        reason,
        detail: "found".into(),
    };
    status.unservable.set(reason, Some(found), UNIX_EPOCH);
}

/// Every kind of failure has a series of both families from the start, 0 unless `counted` says otherwise, and
/// `drill_failing` is 1 only for `failing`.
fn failure_lines(counted: &[(&str, u64)], failing: Option<&str>) -> Vec<String> {
    crate::litestream::drill::Failure::KINDS
        .iter()
        .flat_map(|kind| {
            let count = counted
                .iter()
                .find(|(k, _)| k == kind)
                .map_or(0, |(_, n)| *n);
            [
                format!("litestream_sidecar_drill_failures_total{{kind=\"{kind}\"}} {count}"),
                format!(
                    "litestream_sidecar_drill_failing{{kind=\"{kind}\"}} {}",
                    u8::from(failing == Some(*kind))
                ),
            ]
        })
        .collect()
}

#[test]
fn before_any_drill() {
    let text = render_drills(&crate::cleanup::status::DrillStatus {
        interval: Some(std::time::Duration::from_secs(3600)),
        ..Default::default()
    });
    let mut expected = vec![
        "# HELP litestream_sidecar_drill_interval_seconds backup.drill_interval: how often a restore drill runs; 0 when drills run only on demand (\"off\").".to_string(),
        "# TYPE litestream_sidecar_drill_interval_seconds gauge".into(),
        "litestream_sidecar_drill_interval_seconds 3600.0".into(),
        "# HELP litestream_sidecar_drill_running 1 while a restore drill runs.".into(),
        "# TYPE litestream_sidecar_drill_running gauge".into(),
        "litestream_sidecar_drill_running 0.0".into(),
        "# HELP litestream_sidecar_drill_runs Restore drills finished, whatever their outcome.".into(),
        "# TYPE litestream_sidecar_drill_runs counter".into(),
        "litestream_sidecar_drill_runs_total 0".into(),
        "# HELP litestream_sidecar_drill_failures Restore drills that proved nothing, by kind: the backup's (restore, nothing, check, not_a_replica, other_replica, restored_less) or the drill's own (timeout, disk, setup).".into(),
        "# TYPE litestream_sidecar_drill_failures counter".into(),
        "# HELP litestream_sidecar_drill_failing 1 for the kind of the latest restore drill's failure while the latest drill failed (restored_less: until a drill restores as far as that claim again), else 0.".into(),
        "# TYPE litestream_sidecar_drill_failing gauge".into(),
        "# HELP litestream_sidecar_drill_last_success_timestamp_seconds Wall-clock time (epoch seconds) the latest restore drill that proved the backup finished; 0 before the first of this run.".into(),
        "# TYPE litestream_sidecar_drill_last_success_timestamp_seconds gauge".into(),
        "litestream_sidecar_drill_last_success_timestamp_seconds 0.0".into(),
    ];
    expected.extend(failure_lines(&[], None));
    assert_lines(
        &text,
        &expected.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // What only a proof says is left out rather than shown as 0.
    for family in [
        "litestream_sidecar_drill_proven_watermark",
        "litestream_sidecar_drill_restore_seconds",
        "litestream_sidecar_drill_check_seconds",
        "litestream_sidecar_drill_restored_bytes",
    ] {
        assert!(!text.contains(family), "{family} in\n{text}");
    }
}

#[test]
fn after_a_drill_that_proved_the_backup() {
    let proved = proof("0b", 1_750_000_000.5);
    let text = render_drills(&crate::cleanup::status::DrillStatus {
        interval: None,
        last: Some(crate::cleanup::status::DrillOutcome::Proved(proved.clone())),
        last_proof: Some(proved),
        runs: 2,
        failures: [("timeout", 1)].into_iter().collect(),
        ..Default::default()
    });
    let mut expected = vec![
        "litestream_sidecar_drill_interval_seconds 0.0".to_string(),
        "litestream_sidecar_drill_running 0.0".into(),
        "litestream_sidecar_drill_runs_total 2".into(),
        "litestream_sidecar_drill_last_success_timestamp_seconds 1750000000.5".into(),
        "# HELP litestream_sidecar_drill_proven_watermark What the latest restore drill that proved the backup restored (value 1; the labels are the restored replica's stateVersion and replicaVersion).".into(),
        "# TYPE litestream_sidecar_drill_proven_watermark info".into(),
        "litestream_sidecar_drill_proven_watermark_info{watermark=\"0b\",replica_version=\"01\"} 1".into(),
        "# HELP litestream_sidecar_drill_restore_seconds Seconds litestream restore took in the latest restore drill that proved the backup.".into(),
        "# TYPE litestream_sidecar_drill_restore_seconds gauge".into(),
        "litestream_sidecar_drill_restore_seconds 12.5".into(),
        "# HELP litestream_sidecar_drill_check_seconds Seconds SQLite's check of the restored database (backup.drill_check) took in the latest restore drill that proved the backup.".into(),
        "# TYPE litestream_sidecar_drill_check_seconds gauge".into(),
        "litestream_sidecar_drill_check_seconds 3.25".into(),
        "# HELP litestream_sidecar_drill_restored_bytes Size in bytes of the database restored by the latest restore drill that proved the backup.".into(),
        "# TYPE litestream_sidecar_drill_restored_bytes gauge".into(),
        "litestream_sidecar_drill_restored_bytes 1048576".into(),
    ];
    // The earlier failure stays counted; none is failing now.
    expected.extend(failure_lines(&[("timeout", 1)], None));
    assert_lines(
        &text,
        &expected.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[test]
fn after_a_drill_that_failed() {
    let earlier = proof("0a", 1_750_000_000.0);
    let text = render_drills(&crate::cleanup::status::DrillStatus {
        interval: Some(std::time::Duration::from_secs(1800)),
        running_since: Some(at(1_750_003_700.0)),
        last: Some(crate::cleanup::status::DrillOutcome::Failed {
            failure: crate::litestream::drill::Failure::Check {
                check: "quick_check",
                detail: "row 3 missing from index".into(),
            },
            started: at(1_750_003_500.0),
            finished: at(1_750_003_600.0),
        }),
        last_proof: Some(earlier),
        runs: 5,
        failures: [("check", 2), ("disk", 1)].into_iter().collect(),
        ..Default::default()
    });
    let mut expected = vec![
        "litestream_sidecar_drill_interval_seconds 1800.0".to_string(),
        // A retry runs; the failure stays the latest outcome until it ends.
        "litestream_sidecar_drill_running 1.0".into(),
        "litestream_sidecar_drill_runs_total 5".into(),
        // The last proof's figures stay: the backup was proven that far, then.
        "litestream_sidecar_drill_last_success_timestamp_seconds 1750000000.0".into(),
        "litestream_sidecar_drill_proven_watermark_info{watermark=\"0a\",replica_version=\"01\"} 1"
            .into(),
        "litestream_sidecar_drill_restore_seconds 12.5".into(),
        "litestream_sidecar_drill_check_seconds 3.25".into(),
        "litestream_sidecar_drill_restored_bytes 1048576".into(),
    ];
    expected.extend(failure_lines(&[("check", 2), ("disk", 1)], Some("check")));
    assert_lines(
        &text,
        &expected.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("litestream_sidecar_drill_failing{") && l.ends_with(" 1"))
            .count(),
        1,
        "only the latest failure's kind is failing\n{text}"
    );
}

#[test]
fn the_layout_has_a_series_per_kind_once_listed() {
    let with_backup = |backup: BackupStatus| {
        page(&Status {
            backup,
            ..Status::default()
        })
    };
    let verifying = BackupStatus {
        verifying: true,
        ..Default::default()
    };
    let help = "# HELP litestream_sidecar_backup_layout 1 for what the last listing of the backup destination says of a restore of its newest generation (empty, restorable, no_snapshot, index_gap, unreadable_name, ltx), 0 for the others; no series before a listing.";
    let kind = "# TYPE litestream_sidecar_backup_layout gauge";

    // backup.verify off: no family.
    assert!(!with_backup(BackupStatus::default()).contains("backup_layout"));
    // Nothing listed yet: no series (and prometheus-client leaves a family without one out).
    let text = with_backup(verifying.clone());
    assert!(
        !has_sample(&text, "litestream_sidecar_backup_layout"),
        "{text}"
    );
    // Listed: 1 for the current kind, 0 for every other.
    let text = with_backup(BackupStatus {
        listing: Some(listing(
            None,
            Layout::Broken {
                generation: "0123456789abcdef".into(),
                problem: crate::litestream::layout::Problem::IndexGap { missing: 1 },
            },
        )),
        ..verifying
    });
    assert_lines(
        &text,
        &[
            help,
            kind,
            "litestream_sidecar_backup_layout{layout=\"empty\"} 0",
            "litestream_sidecar_backup_layout{layout=\"restorable\"} 0",
            "litestream_sidecar_backup_layout{layout=\"no_snapshot\"} 0",
            "litestream_sidecar_backup_layout{layout=\"index_gap\"} 1",
            "litestream_sidecar_backup_layout{layout=\"unreadable_name\"} 0",
            "litestream_sidecar_backup_layout{layout=\"ltx\"} 0",
        ],
    );
}

#[test]
fn every_layout_is_a_label_of_backup_layout() {
    use crate::litestream::layout::{Chain, Layout, Problem};
    let broken = |problem| Layout::Broken {
        generation: "0123456789abcdef".into(),
        problem,
    };
    let layouts = [
        Layout::Empty,
        Layout::Restorable(Chain {
            generation: "0123456789abcdef".into(),
            snapshot_index: 0,
            last_index: 1,
            newest: std::time::UNIX_EPOCH,
            objects: 2,
        }),
        broken(Problem::NoSnapshot),
        broken(Problem::IndexGap { missing: 1 }),
        broken(Problem::UnreadableName {
            path: "generations/x/y".into(),
        }),
        Layout::Ltx,
    ];
    for layout in &layouts {
        // A variant added to Layout or Problem stops this match from compiling: add it to `layouts` and LAYOUTS.
        match layout {
            Layout::Empty | Layout::Restorable(_) | Layout::Ltx => {}
            Layout::Broken { problem, .. } => match problem {
                Problem::NoSnapshot | Problem::IndexGap { .. } | Problem::UnreadableName { .. } => {
                }
            },
        }
    }
    let kinds: Vec<_> = layouts.iter().map(Layout::kind).collect();
    assert_eq!(kinds, destination::LAYOUTS);
}

#[test]
fn the_destination_metrics_read_the_listing() {
    let unlisted = BackupStatus {
        verifying: true,
        ..Default::default()
    };
    let text = page(&Status {
        backup: unlisted.clone(),
        ..Status::default()
    });
    assert!(
        !has_sample(&text, "litestream_sidecar_backup_layout"),
        "{text}"
    );
    let listed = BackupStatus {
        listing: Some(listing(Some(at(1_746_600_000.5)), Layout::Ltx)),
        ..unlisted
    };
    let text = page(&Status {
        backup: listed,
        ..Status::default()
    });
    assert_lines(
        &text,
        &[
            "litestream_sidecar_backup_layout{layout=\"ltx\"} 1",
            "litestream_sidecar_backup_destination_newest_timestamp_seconds 1746600000.5",
        ],
    );
}

#[test]
fn every_unservable_reason_has_a_series_and_only_those_in_force_are_1() {
    use crate::cleanup::unservable::Reason;
    let refused = |unservable: Vec<Reason>| {
        let mut status = Status::default();
        for reason in unservable {
            refuse(&mut status, reason);
        }
        page(&status)
    };
    assert_lines(
        &refused(vec![]),
        &[
            "# TYPE litestream_sidecar_unservable gauge",
            "litestream_sidecar_unservable{reason=\"ltx\"} 0",
            "litestream_sidecar_unservable{reason=\"backup_path\"} 0",
            "litestream_sidecar_unservable{reason=\"log_not_written\"} 0",
        ],
    );
    assert_lines(
        &refused(vec![Reason::BackupPath, Reason::LogNotWritten]),
        &[
            "litestream_sidecar_unservable{reason=\"ltx\"} 0",
            "litestream_sidecar_unservable{reason=\"backup_path\"} 1",
            "litestream_sidecar_unservable{reason=\"log_not_written\"} 1",
        ],
    );
}

#[test]
fn live_slots_are_counted_by_kind_with_the_oldest_age() {
    use crate::cleanup::slots::SlotKind;
    let text = page(&Status {
        slots: vec![
            // Open on this sidecar: not kept.
            slot(SlotKind::Reservation, "us", true, 7200),
            // Closed here, and another sidecar's: kept.
            slot(SlotKind::Reservation, "us", false, 10),
            slot(SlotKind::Reservation, "them", true, 20),
            // No longer live: not counted.
            crate::cleanup::slots::Slot {
                live: false,
                ..slot(SlotKind::Subscriber, "them", false, 9000)
            },
        ],
        holder: "us".into(),
        bounding_slot: Some(crate::cleanup::slots::SlotLimit::Malformed {
            slot: crate::cleanup::slots::SlotName {
                kind: SlotKind::Reservation,
                key: "them-20".into(),
                holder: "them".into(),
            },
            problem: "not a watermark".into(),
        }),
        ..Status::default()
    });
    for line in [
        "litestream_sidecar_slots{kind=\"reservation\"} 3.0",
        "litestream_sidecar_slots{kind=\"subscriber\"} 0.0",
        "litestream_sidecar_slot_oldest_seconds{kind=\"reservation\"} 7200.0",
        "litestream_sidecar_slot_malformed 1.0",
        "litestream_sidecar_reservations_kept 2.0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[tokio::test]
async fn the_handle_figures_read_the_handles() {
    use crate::cleanup::discovery::{DiscoveryMode, Registration};
    let instruments = Instruments::default();
    let registry = crate::cleanup::reservations::Registry::new(Duration::from_secs(45));
    let _leases = [
        registry.open("a", tokio::time::Instant::now()),
        registry.open("b", tokio::time::Instant::now()),
    ];
    let subscribers = crate::cleanup::subscribers::Subscribers::default();
    let _subscriber = subscribers.connect(crate::cleanup::subscribers::SubscriberInfo {
        id: "s".into(),
        task_id: None,
        mode: Default::default(),
        replica_version: "01".into(),
        watermark: "0a".into(),
    });
    let discovery = crate::cleanup::discovery::StateHandle::default();
    discovery.update(|d| {
        d.db_up = true;
        d.registration = Some(Registration::Elsewhere("10.0.0.9:4849".into()));
    });
    instruments.upstream.update(|u| u.up = false);
    let mut sources = MetricsSources {
        admission: crate::net::admission::Admission::new(
            16384,
            instruments.connections_refused.clone(),
        ),
        instruments,
        handles: crate::cleanup::handles::Handles {
            registry,
            subscribers,
            status: Default::default(),
            discovery,
        },
        discovery_mode: DiscoveryMode::Verify,
    };
    assert_eq!(
        sources.handle_figures(),
        HandleFigures {
            reservations_open: 2,
            cleanup_delay: Duration::from_secs(45),
            subscribers: 1,
            registered: Some(false),
            change_db_up: true,
            upstream_up: false,
            connections_open: 0,
            max_connections: 16384,
        }
    );
    sources
        .handles
        .discovery
        .update(|d| d.registration = Some(Registration::Registered));
    assert_eq!(sources.handle_figures().registered, Some(true));
    // Discovery off: nothing is read, so nothing is said.
    sources.discovery_mode = DiscoveryMode::Off;
    assert_eq!(sources.handle_figures().registered, None);
}
