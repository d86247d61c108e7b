//! `GET /metrics`: the figures operators watch, driven by real reservations, purges and registration.
//!
//! The cases that need PostgreSQL are in [`pg`].

mod pg;

use std::time::Duration;

use crate::support::*;

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
