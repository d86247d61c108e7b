//! The figures that need a real change log: backups, purges, holds and registration; and every metric the
//! alerting rules use, documented on a page from a sidecar that has purged.

use std::time::Duration;

use crate::support::pg::TestSchema;
use crate::support::*;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::protocol::Mode;

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
    // No subscriber yet: held, and the holds are counted by reason (the first checks may hold for what is still
    // being read: the change DB, the registration).
    let no_subscribers = |page: &prometheus_parse::Scrape| {
        value(
            page,
            "litestream_sidecar_cleanup_holds_total",
            Some(("reason", "no_subscribers")),
        )
        .is_some_and(|holds| holds >= 1.0)
    };
    eventually_async("a hold for want of a subscriber", || async {
        no_subscribers(&scrape(&sidecar).await)
    })
    .await;
    let page = scrape(&sidecar).await;
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
        replica_version: "1rs".into(),
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

/// The alerting rules shipped for operators (docs/operations.md, "Alerting").
const RULES: &str = include_str!("../../../deploy/prometheus/litestream-sidecar.rules.yml");

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
    // The rules' backup and drill families, as a sidecar shows them before its first drill: the file at the
    // destination's root is not litestream's, so the layout is empty and the scheduled drill waits for a backup.
    let lines: std::collections::BTreeSet<&str> = page.lines().collect();
    for line in [
        "litestream_sidecar_backup_layout{layout=\"empty\"} 1",
        "litestream_sidecar_backup_layout{layout=\"restorable\"} 0",
        "litestream_sidecar_backup_layout{layout=\"no_snapshot\"} 0",
        "litestream_sidecar_drill_interval_seconds 3600.0",
        "litestream_sidecar_drill_running 0.0",
        "litestream_sidecar_drill_runs_total 0",
        "litestream_sidecar_drill_failing{kind=\"restore\"} 0",
        "litestream_sidecar_drill_last_success_timestamp_seconds 0.0",
    ] {
        assert!(lines.contains(line), "no {line:?} in\n{page}");
    }
    assert!(!page.contains("drill_proven_watermark_info"), "{page}");
    sidecar.stop().await;
}
