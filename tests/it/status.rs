//! `GET /status` and the metrics that go with it, from a real sidecar: against a real change log, through the
//! relay, and with the change DB dead.
//!
//! The case that needs PostgreSQL is in [`pg`].

mod pg;

use std::time::Duration;

use crate::support::{self, *};
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use serde_json::Value;

async fn status(sidecar: &Sidecar) -> Value {
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn series(scrape: &prometheus_parse::Scrape, name: &str) -> usize {
    scrape.samples.iter().filter(|s| s.metric == name).count()
}

/// A subscriber of view-syncer task `task-9`.
fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        task_id: Some("task-9".into()),
        ..support::subscriber(id, watermark)
    }
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
