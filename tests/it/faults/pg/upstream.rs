//! Zero's change-streamer (the relay's upstream) killed and restarted under the sidecar, with reservations open and
//! subscribers connected.

use std::time::Duration;

use litestream_sidecar::cleanup::{Decision, HoldReason};

use crate::support::pg::TestSchema;
use crate::support::*;

/// Subscribes through the sidecar from `watermark`; the upstream admits it and sends its status.
async fn subscribe(
    sidecar: &Sidecar,
    upstream: &mut Upstream,
    id: &str,
    watermark: &str,
) -> (Client, UpstreamConn) {
    let url = sidecar.url(&changes_path(3, id, id, watermark, false));
    let (mut client, mut conn) = tokio::join!(connect(&url), upstream.accept());
    conn.send_msg(1, UPSTREAM_STATUS).await;
    next_text(&mut client).await;
    (client, conn)
}

/// Down for longer than `cleanup.reconnect_grace`: every subscriber departed with it, and they come back one at a
/// time. The first one back must not let cleanup run past those still backing off: each gets its grace again.
#[tokio::test]
async fn an_upstream_down_longer_than_the_grace_lets_every_subscriber_return_before_cleanup_resumes(
) {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0b", seconds_ago(600.0))])).await;
    let mut upstream = Upstream::start().await;
    let addr = upstream.addr;
    let sidecar = start_aged(
        upstream.config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [cleanup]\nreconnect_grace = \"8s\"\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(600),
    )
    .await;
    // One subscriber far behind, one up to date; then a view-syncer restoring (its reservation pinned at 0d).
    let (mut slow, slow_conn) = subscribe(&sidecar, &mut upstream, "slow", "0b").await;
    let (mut fast, fast_conn) = subscribe(&sidecar, &mut upstream, "fast", "0d").await;
    eventually_async("purged below the slow subscriber's 0b", || async {
        db.watermarks().await == ["0b", "0c", "0d", "0e"]
    })
    .await;
    litestream.set_page(&progress_page(&[("0d", seconds_ago(600.0))]));
    eventually("0d backed up", || {
        sidecar.registry.newest_backup().as_deref() == Some("0d")
    })
    .await;
    let mut reservation = connect(&sidecar.snapshot_url("vs-restoring")).await;
    next_text(&mut reservation).await;
    assert_eq!(
        sidecar.registry.open_reservations()[0].floor.as_deref(),
        Some("0d")
    );
    let checks = sidecar.status.get().checks;
    eventually("two checks", || sidecar.status.get().checks >= checks + 2).await;
    assert_eq!(
        sidecar.status.get().last_decision,
        Some(Decision::Hold(HoldReason::SubscriberBehind))
    );

    // The change-streamer dies: both subscriptions break, and it stays down past the grace.
    upstream.stop();
    drop((slow_conn, fast_conn, upstream));
    assert_eq!(
        expect_close(&mut slow).await.map(|(code, _)| code),
        Some(1011)
    );
    assert_eq!(
        expect_close(&mut fast).await.map(|(code, _)| code),
        Some(1011)
    );
    let refused = refused(&sidecar.url(&changes_path(3, "fast", "fast", "0d", false))).await;
    assert_eq!(refused.0, 502, "{refused:?}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d", "0e"]);

    // Back; the up-to-date subscriber returns first, the slow one is still backing off. Cleanup waits a whole
    // grace for it rather than purging below 0d, which the fast one and the reservation would allow.
    let mut upstream = Upstream::start_at(addr).await;
    let (_fast, _fast_conn) = subscribe(&sidecar, &mut upstream, "fast", "0d").await;
    let checks = sidecar.status.get().checks;
    eventually("two checks", || sidecar.status.get().checks >= checks + 2).await;
    assert_eq!(
        sidecar.status.get().last_decision,
        Some(Decision::Hold(HoldReason::SubscriberBehind))
    );
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d", "0e"]);

    // The reservation was served throughout: still open, still answering.
    assert_eq!(sidecar.registry.len(), 1);
    let ping_seen = tokio::time::timeout(Duration::from_secs(5), async {
        use futures_util::StreamExt;
        matches!(
            reservation.next().await,
            Some(Ok(tokio_tungstenite::tungstenite::Message::Ping(_)))
        )
    })
    .await;
    assert_eq!(ping_seen, Ok(true), "the reservation is still pinged");

    // The slow one never returns: once its grace from the upstream's return has passed, cleanup resumes.
    eventually_async("purged below 0d", || async {
        db.watermarks().await == ["0d", "0e"]
    })
    .await;
    sidecar.stop().await;
}
