//! `/status` against a real change log: what holds cleanup, since when, and what the last purge did.

use std::time::Duration;

use crate::support::pg::TestSchema;
use crate::support::*;
use serde_json::Value;

use super::{series, status, subscriber};

#[tokio::test]
async fn status_tells_what_holds_cleanup_since_when_and_what_the_last_purge_did() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let config = config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"2s\"\n",
        db.config(),
        litestream.url()
    ));
    let sidecar = start_aged(config, Duration::from_secs(60)).await;

    // Before any subscriber, cleanup holds for want of one (once the change DB has answered: the first check may
    // come before its connection and hold for the replica version).
    eventually("a hold for want of a subscriber", || {
        let s = sidecar.status.get();
        s.held_since.is_some()
            && s.last_decision
                == Some(litestream_sidecar::cleanup::Decision::Hold(
                    litestream_sidecar::cleanup::HoldReason::NoSubscribers,
                ))
    })
    .await;
    let page = scrape(&sidecar).await;
    assert!(
        value(
            &page,
            "litestream_sidecar_cleanup_held_seconds",
            Some(("reason", "no_subscribers"))
        )
        .is_some(),
        "{:?}",
        page.samples
    );
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_last_purge_timestamp_seconds",
            None
        ),
        Some(0.0),
        "0 before the first purge"
    );

    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let _lease = sidecar
        .registry
        .open("restore-1", tokio::time::Instant::now());
    // Nothing newer than the purge is backed up: held for that, with the size read after the purge.
    eventually("held with nothing new and the size read", || {
        let s = sidecar.status.get();
        s.held_since.is_some() && s.change_log.is_some_and(|r| r.size.rows == 12)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let json = status(&sidecar).await;
    let cleanup = &json["cleanup"];
    assert_eq!(cleanup["decision"], "hold", "{json:#}");
    assert_eq!(cleanup["hold_reason"], "nothing_new");
    assert!(cleanup["held_since"].as_str().unwrap().ends_with('Z'));
    assert!(cleanup["held_seconds"].as_f64().unwrap() >= 1.0, "{json:#}");
    assert_eq!(cleanup["delay_seconds"], 30.0);
    assert_eq!(cleanup["enabled"], true);
    assert_eq!(cleanup["purges"], 1);
    assert_eq!(cleanup["purged_rows"], 8);

    let purge = &json["last_purge"];
    assert_eq!(purge["before"], "0c");
    assert_eq!(purge["rows"], 8);
    assert_eq!(purge["bound"], "the newest aged backup");
    assert!(purge["completed_at"].is_string(), "{json:#}");

    let backup = &json["backups"][0];
    assert_eq!(backup["watermark"], "0c");
    assert_eq!(backup["current"], true);
    assert!((backup["age_seconds"].as_f64().unwrap() - 120.0).abs() < 10.0);

    let reservation = &json["reservations"][0];
    assert_eq!(reservation["task_id"], "restore-1");
    assert_eq!(reservation["floor"], "0c");
    assert!(reservation["age_seconds"].as_f64().unwrap() >= 1.0);

    let sub = &json["subscribers"][0];
    assert_eq!(sub["id"], "vs-1");
    assert_eq!(sub["task_id"], "task-9");
    assert_eq!(sub["mode"], "serving");
    assert_eq!(sub["acked"], "0d");
    assert_eq!(sub["state"], "connected");
    assert_eq!(sub["lag_seconds"], 0.0);

    assert_eq!(json["change_log"]["rows"], 12);
    assert_eq!(json["change_log"]["exact"], true);
    assert_eq!(json["change_log"]["error"], Value::Null);
    assert_eq!(json["upstream"]["up"], true);

    let page = scrape(&sidecar).await;
    let held = value(
        &page,
        "litestream_sidecar_cleanup_held_seconds",
        Some(("reason", "nothing_new")),
    )
    .expect("the reason in force has a series");
    assert!(held >= 1.0, "{held}");
    assert_eq!(
        series(&page, "litestream_sidecar_cleanup_held_seconds"),
        1,
        "the previous reason's series is gone"
    );
    assert_eq!(
        value(&page, "litestream_sidecar_change_log_rows", None),
        Some(12.0)
    );
    assert_eq!(
        value(&page, "litestream_sidecar_upstream_up", None),
        Some(1.0)
    );
    let purged_at = value(
        &page,
        "litestream_sidecar_last_purge_timestamp_seconds",
        None,
    )
    .expect("set after a purge");
    assert!((epoch_now() - purged_at).abs() < 60.0, "{purged_at}");
    sidecar.stop().await;
    db.drop().await;
}
