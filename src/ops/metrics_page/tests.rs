use super::*;
use crate::ops::metrics::Direction;

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
    let snapshot = Snapshot {
        reservations_open: 2,
        subscribers: 3,
        newest_backup: Some(("718sh0nk8".into(), 42.5)),
        cleanup_delay_seconds: 45.0,
        purge_runs: 4,
        purged_rows: 12345,
        purge_failures: 9,
        purge_consecutive_failures: 3,
        purge_failing: Some(FailureClass::Permission),
        holds: [(HoldReason::NoSubscribers, 7)].into_iter().collect(),
        registered: Some(true),
        change_db_up: true,
        scrape_errors: 1,
        held: Some((HoldReason::SubscriberBehind, 95.5)),
        change_log_rows: Some(1234),
        upstream_up: false,
        last_purge_timestamp: Some(1_750_000_000.0),
        backup: Some(BackupFigures {
            verified: false,
            newest_object: Some(1_746_600_000.5),
            stale: true,
            errors: [(crate::litestream::destination::ErrorKind::Timeout, 2)]
                .into_iter()
                .collect(),
        }),
        connections_open: 17,
        max_connections: 16384,
        purger: Some(false),
        state_kept: true,
        reservations_kept: 1,
        backup_position_known: false,
        backup_below_last_purge: true,
    };
    let text = render(&instruments, &snapshot);
    let scrape = parse(&text);
    let v = |name: &str| value(&scrape, name, None);
    assert_eq!(v("litestream_sidecar_reservations_open"), 2.0);
    assert_eq!(v("litestream_sidecar_purger"), 0.0);
    assert_eq!(v("litestream_sidecar_state_kept"), 1.0);
    assert_eq!(v("litestream_sidecar_reservations_kept"), 1.0);
    assert_eq!(v("litestream_sidecar_backup_position_known"), 0.0);
    assert_eq!(v("litestream_sidecar_backup_below_last_purge"), 1.0);
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
    let text = render(&Instruments::default(), &Snapshot::default());
    assert!(!text.contains("backup_age_seconds"), "{text}");
    assert!(!text.contains("litestream_sidecar_registered"), "{text}");
    assert!(!text.contains("watermark=\""), "{text}");
    assert!(!text.contains("cleanup_held_seconds{"), "{text}");
    assert!(!text.contains("change_log_rows"), "{text}");
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
