//! The sidecar itself stopped in the middle of its work: restores in progress lose their reservations with the
//! process, so what protects them after a restart is the cleanup delay, which must survive it.

use std::time::Duration;

use litestream_sidecar::cleanup::{Decision, HoldReason};
use litestream_sidecar::protocol::Mode;
use litestream_sidecar::state;
use litestream_sidecar::subscribers::SubscriberInfo;

use crate::common::pg::TestSchema;
use crate::common::*;

fn subscriber(watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: "vs".into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "01".into(),
        watermark: watermark.into(),
    }
}

async fn decisions(sidecar: &Sidecar, ticks: u64) -> Decision {
    let target = sidecar.status.get().checks + ticks;
    eventually("monitor checks", || sidecar.status.get().checks >= target).await;
    sidecar.status.get().last_decision.expect("a decision")
}

#[tokio::test]
async fn a_learned_cleanup_delay_survives_a_restart_and_protects_restores_begun_before_it() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0c", epoch_now() - 600.0)])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let config = || {
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [cleanup]\nreconnect_grace = \"1s\"\nstate_file = \"{}\"\n",
            db.config(),
            litestream.url(),
            path.display()
        ))
    };

    // A restore took 45 s (its subscription ended the reservation then): the cleanup delay is now 45 s, and the
    // state file says so within a check.
    let sidecar = start_aged(config(), Duration::from_secs(600)).await;
    let lease = sidecar.registry.open("vs-1", tokio::time::Instant::now());
    let started = sidecar.registry.open_reservations()[0].started;
    sidecar.registry.end_by_subscription(
        "vs-1",
        sidecar.registry.ticket(),
        started + Duration::from_secs(45),
    );
    drop(lease);
    eventually("the learned delay is on disk", || {
        state::load(&path)
            .ok()
            .flatten()
            .is_some_and(|s| s.cleanup_delay == Duration::from_secs(45))
    })
    .await;
    sidecar.stop().await;

    // Restarted 40 s ago: past the configured 30 s but not the learned 45 s. A restore that began before the
    // restart may still run, so cleanup waits, with every row kept.
    let sidecar = start_aged(config(), Duration::from_secs(40)).await;
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(45));
    let _sub = sidecar.subscribers.connect(subscriber("0e"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::StartingUp)
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c", "0d", "0e"]);
    sidecar.stop().await;

    // Once up for the learned delay it purges, and the last purge is kept too.
    let sidecar = start_aged(config(), Duration::from_secs(50)).await;
    let _sub = sidecar.subscribers.connect(subscriber("0e"));
    eventually_async("purged below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    eventually("the last purge is on disk", || {
        state::load(&path).ok().flatten().is_some_and(|s| {
            s.last_purge.map(|b| b.watermark).as_deref() == Some("0c")
                && s.cleanup_delay == Duration::from_secs(45)
        })
    })
    .await;
    sidecar.stop().await;

    // The next run resumes after it: nothing at or below it is purged again, and status shows it.
    let sidecar = start_aged(config(), Duration::from_secs(50)).await;
    eventually("the last purge is restored", || {
        sidecar.status.get().last_purged() == Some("0c")
    })
    .await;
    sidecar.stop().await;

    // A corrupt file is no reason not to start: the configured delay applies, and the file is written anew.
    std::fs::write(&path, "{ not json").unwrap();
    let sidecar = start_aged(config(), Duration::from_secs(40)).await;
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(30));
    eventually("a valid state file again", || {
        state::load(&path).is_ok_and(|s| s.is_some())
    })
    .await;
    sidecar.stop().await;
}
