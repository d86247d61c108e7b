//! `GET /metrics`: the figures operators watch, driven by real reservations, purges and registration.

mod common;

use std::time::Duration;

use common::pg::TestSchema;
use common::*;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::protocol::Mode;

#[tokio::test]
async fn reservations_and_their_durations() {
    let sidecar = start(config("")).await;
    let mut a = connect(&sidecar.snapshot_url("a")).await;
    next_text(&mut a).await;
    let mut b = connect(&sidecar.snapshot_url("b")).await;
    next_text(&mut b).await;
    eventually("two reservations", || sidecar.registry.len() == 2).await;
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(&page, "litestream_sidecar_reservations_open", None),
        Some(2.0)
    );
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_reservation_duration_seconds_count",
            None
        ),
        Some(0.0)
    );

    // One ends by its subscription after 45 s: the delay grows and the histogram counts it.
    let started = sidecar.registry.open_reservations()[0].started;
    sidecar.registry.end_by_subscription(
        "a",
        sidecar.registry.ticket(),
        started + Duration::from_secs(45),
    );
    drop(b);
    eventually("both ended", || sidecar.registry.is_empty()).await;
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(&page, "litestream_sidecar_reservations_open", None),
        Some(0.0)
    );
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_reservation_duration_seconds_count",
            None
        ),
        Some(2.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_cleanup_delay_seconds", None),
        Some(45.0)
    );
    // Discovery is off in this config: no registration gauge; the change DB does not exist.
    assert_eq!(value(&page, "litestream_sidecar_registered", None), None);
    assert_eq!(
        value(&page, "litestream_sidecar_change_db_up", None),
        Some(0.0)
    );
    drop(a);
    sidecar.stop().await;
}

#[tokio::test]
async fn backups_purges_holds_and_registration() {
    let db = TestSchema::create(Some(5), Some("127.0.0.1:4851")).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 2).await;
    }
    let backed_up = epoch_now() - 100.0;
    let litestream = MetricsServer::start(&progress_page(&[("0b", backed_up)])).await;
    let config = config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
         [discovery]\nmode = \"verify\"\nadvertise_address = \"127.0.0.1:4851\"\ninterval = \"100ms\"\n",
        db.config(),
        litestream.url()
    ));
    let sidecar = start_aged(config, Duration::from_secs(120)).await;
    // No subscriber yet: held, and the holds are counted by reason.
    eventually("a hold", || sidecar.status.get().checks >= 2).await;
    let page = scrape(&sidecar).await;
    assert!(
        value(
            &page,
            "litestream_sidecar_cleanup_holds_total",
            Some(("reason", "no_subscribers"))
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(
        value(&page, "litestream_sidecar_registered", None),
        Some(1.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_change_db_up", None),
        Some(1.0)
    );
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_backup_watermark",
            Some(("watermark", "0b"))
        ),
        Some(1.0)
    );
    let age = value(&page, "litestream_sidecar_backup_age_seconds", None).unwrap();
    assert!((100.0..200.0).contains(&age), "{age}");

    let _sub = sidecar.subscribers.connect(SubscriberInfo {
        id: "vs".into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "01".into(),
        watermark: "0c".into(),
    });
    eventually_async("purged", || async { db.watermarks().await == ["0b", "0c"] }).await;
    eventually("purge counted", || sidecar.status.get().purges >= 1).await;
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(&page, "litestream_sidecar_purge_runs_total", None),
        Some(1.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_purged_rows_total", None),
        Some(4.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_relayed_subscribers", None),
        Some(1.0)
    );

    // litestream goes away: scrape errors are counted.
    litestream.stop();
    eventually("scrape errors", || sidecar.status.get().scrape_errors >= 1).await;
    let page = scrape(&sidecar).await;
    assert!(
        value(
            &page,
            "litestream_sidecar_litestream_scrape_errors_total",
            None
        )
        .unwrap()
            >= 1.0
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn relayed_frames_bytes_subscribers_and_connect_errors() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "vs", "0a", false);
    let (mut client, _) = tokio_tungstenite::connect_async(sidecar.url(&path))
        .await
        .unwrap();
    let mut conn = upstream.accept().await;
    let status = conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    assert_eq!(next_text(&mut client).await, status);
    let commit = conn
        .send_msg(2, r#"["commit",{"tag":"commit"},{"watermark":"0b"}]"#)
        .await;
    assert_eq!(next_text(&mut client).await, commit);
    send_text(&mut client, r#"{"ack":1}"#).await;
    send_text(&mut client, r#"{"ack":2}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    assert_eq!(conn.next_ack().await, 2);

    let page = scrape(&sidecar).await;
    let count = |name: &str, direction: &str| value(&page, name, Some(("direction", direction)));
    assert_eq!(
        count("litestream_sidecar_relay_frames_total", "downstream"),
        Some(2.0)
    );
    assert_eq!(
        count("litestream_sidecar_relay_bytes_total", "downstream"),
        Some((status.len() + commit.len()) as f64)
    );
    assert_eq!(
        count("litestream_sidecar_relay_frames_total", "upstream"),
        Some(2.0)
    );
    assert_eq!(
        count("litestream_sidecar_relay_bytes_total", "upstream"),
        Some(18.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_relayed_subscribers", None),
        Some(1.0)
    );
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_upstream_connect_errors_total",
            None
        ),
        Some(0.0)
    );

    // The change-streamer goes away: the next subscription is refused and counted.
    drop(conn);
    drop(upstream);
    let (status, _) = refused(&sidecar.url(&changes_path(3, "t2", "vs2", "0a", false))).await;
    assert!(status == 502 || status == 503, "{status}");
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_upstream_connect_errors_total",
            None
        ),
        Some(1.0)
    );
    drop(client);
    sidecar.stop().await;
}

/// The alerting rules shipped for operators (docs/operations.md, "Alerting").
const RULES: &str = include_str!("../deploy/prometheus/litestream-sidecar.rules.yml");

/// Every `litestream_sidecar_…` name in the rules file: expressions, annotations and comments alike.
fn metric_names_in_rules() -> std::collections::BTreeSet<&'static str> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = RULES;
    while let Some(at) = rest.find("litestream_sidecar_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // The bare prefix, as the file's header names it, is no metric.
        if len > "litestream_sidecar_".len() {
            names.insert(&tail[..len]);
        }
        rest = &tail[len..];
    }
    names
}

/// Whether `name` is a sample name of a family the page documents with both `# HELP` and `# TYPE` (a counter's
/// samples end in `_total`, a histogram's in `_bucket`, `_sum` and `_count`, an info's in `_info`).
fn documented(page: &str, name: &str) -> bool {
    let family_line = |kind: &str, family: &str| {
        page.lines().find_map(|line| {
            let rest = line.strip_prefix(kind)?.strip_prefix(family)?;
            rest.strip_prefix(' ')
        })
    };
    let suffixes: &[(&str, &[&str])] = &[
        (
            "",
            &[
                "gauge",
                "counter",
                "histogram",
                "summary",
                "info",
                "unknown",
            ],
        ),
        ("_total", &["counter"]),
        ("_bucket", &["histogram"]),
        ("_sum", &["histogram", "summary"]),
        ("_count", &["histogram", "summary"]),
        ("_info", &["info"]),
    ];
    suffixes.iter().any(|(suffix, types)| {
        let Some(family) = name.strip_suffix(suffix) else {
            return false;
        };
        family_line("# HELP ", family).is_some()
            && family_line("# TYPE ", family).is_some_and(|t| types.contains(&t.trim()))
    })
}

#[tokio::test]
async fn every_metric_the_alerting_rules_use_is_documented() {
    let names = metric_names_in_rules();
    assert!(
        names.contains("litestream_sidecar_purge_consecutive_failures"),
        "{names:?}"
    );
    // Every part that has metrics of its own is live: a change DB with Zero's schema, litestream with a backup in
    // a destination the sidecar verifies, discovery, an upstream change-streamer, and cleanup held (no subscriber).
    let destination = tempfile::tempdir().unwrap();
    std::fs::write(destination.path().join("00000001.ltx"), b"backup").unwrap();
    let db = TestSchema::create(Some(5), Some("127.0.0.1:4851")).await;
    db.insert_transaction("0a", 2).await;
    let litestream = MetricsServer::start(&progress_page(&[("0a", epoch_now() - 100.0)])).await;
    let upstream = Upstream::start().await;
    let config = upstream.config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\nbackup_url = \"file://{}\"\n\
         [backup]\nverify = true\n\
         [discovery]\nmode = \"verify\"\nadvertise_address = \"127.0.0.1:4851\"\ninterval = \"100ms\"\n",
        db.config(),
        litestream.url(),
        destination.path().display()
    ));
    let sidecar = start_aged(config, Duration::from_secs(120)).await;
    eventually("a hold and a listing of the destination", || {
        let status = sidecar.status.get();
        status.checks >= 2 && status.backup.listing.is_some()
    })
    .await;
    let (status, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{page}");

    let missing: Vec<_> = names.iter().filter(|n| !documented(&page, n)).collect();
    assert!(
        missing.is_empty(),
        "deploy/prometheus/litestream-sidecar.rules.yml uses metrics /metrics does not document: {missing:?}\n{page}"
    );
    sidecar.stop().await;
}
