//! `GET /status` and the metrics that go with it, from a real sidecar: against a real change log, through the
//! relay, and with the change DB dead.

mod common;

use std::time::Duration;

use common::pg::TestSchema;
use common::*;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::protocol::Mode;
use serde_json::Value;

async fn status(sidecar: &Sidecar) -> Value {
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn series(scrape: &prometheus_parse::Scrape, name: &str) -> usize {
    scrape.samples.iter().filter(|s| s.metric == name).count()
}

fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: id.into(),
        task_id: Some("task-9".into()),
        mode: Mode::Serving,
        replica_version: "01".into(),
        watermark: watermark.into(),
    }
}

#[tokio::test]
async fn status_tells_what_holds_cleanup_since_when_and_what_the_last_purge_did() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let old = epoch_now() - 120.0;
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let config = config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"2s\"\n",
        db.config(),
        litestream.url()
    ));
    let sidecar = start_aged(config, Duration::from_secs(60)).await;

    // Before any subscriber, cleanup holds for want of one.
    eventually("a hold", || sidecar.status.get().held_since.is_some()).await;
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

#[tokio::test]
async fn status_answers_at_once_while_the_change_db_is_dead() {
    // The default test config's change DB and litestream both refuse connections.
    let sidecar = start(config("")).await;
    eventually("a check", || sidecar.status.get().checks >= 1).await;
    let started = std::time::Instant::now();
    let json = status(&sidecar).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(json["change_log"]["rows"], Value::Null, "{json:#}");
    assert!(json["change_log"]["error"].is_string(), "{json:#}");
    assert_eq!(json["cleanup"]["decision"], "hold");
    assert_eq!(json["cleanup"]["hold_reason"], "starting_up");
    assert_eq!(json["last_purge"], Value::Null);
    assert_eq!(json["reservations"], Value::Array(vec![]));
    assert_eq!(json["backups"], Value::Array(vec![]));
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(&page, "litestream_sidecar_change_log_rows", None),
        None
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn relayed_subscribers_show_their_lag_and_the_upstream_its_last_connect() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "vs-relayed", "0a", false);
    let url = sidecar.url(&path);
    let (mut client, mut conn) = tokio::join!(connect(&url), upstream.accept());
    assert!(conn.admit_like_zero().await);
    conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    next_text(&mut client).await;
    let commit = |w: &str| format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#);
    conn.send_msg(2, &commit("0b")).await;
    next_text(&mut client).await;
    eventually("the commit seen", || {
        sidecar.subscribers.newest_commit().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let json = status(&sidecar).await;
    assert_eq!(json["newest_commit"]["watermark"], "0b", "{json:#}");
    let sub = &json["subscribers"][0];
    assert_eq!(sub["id"], "vs-relayed");
    assert_eq!(sub["acked"], "0a");
    assert_eq!(sub["caught_up"], false);
    assert!(sub["lag_seconds"].as_f64().unwrap() >= 1.0, "{json:#}");
    assert_eq!(json["upstream"]["up"], true);
    assert!(json["upstream"]["last_attempt_at"].is_string());

    // Acknowledged: caught up, no lag.
    send_text(&mut client, r#"{"ack":2}"#).await;
    assert_eq!(conn.next_ack().await, 2);
    eventually("the ack", || sidecar.subscribers.acked_by_id()[0].1 == "0b").await;
    let json = status(&sidecar).await;
    assert_eq!(json["subscribers"][0]["caught_up"], true, "{json:#}");
    assert_eq!(json["subscribers"][0]["lag_seconds"], 0.0);

    // The change-streamer goes away: the next subscription cannot reach it.
    drop(conn);
    upstream.stop();
    drop(upstream);
    let (code, _) = refused(&sidecar.url(&changes_path(3, "t2", "vs-2", "0a", false))).await;
    assert!(code == 502 || code == 503, "{code}");
    let json = status(&sidecar).await;
    assert_eq!(json["upstream"]["up"], false, "{json:#}");
    assert!(json["upstream"]["last_error"].is_string());
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(&page, "litestream_sidecar_upstream_up", None),
        Some(0.0)
    );
    sidecar.stop().await;
}
