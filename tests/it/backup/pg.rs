//! End to end on a real PostgreSQL change log: a claimed backup with nothing behind it never leads to a purge
//! nor to a snapshot status.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::support::pg::TestSchema;
use crate::support::*;
use litestream_sidecar::cleanup::{Decision, HoldReason};

// End to end: a sidecar with verification on, litestream's page, and a file:// destination.

fn verifying_config(
    db: &TestSchema,
    litestream: &MetricsServer,
    dir: &Path,
    extra: &str,
) -> litestream_sidecar::Config {
    let url = url::Url::from_directory_path(dir).unwrap();
    config(&format!(
        "{}[litestream]\nbackup_url = \"{url}\"\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
         [cleanup]\nreconnect_grace = \"2s\"\n[discovery]\ninterval = \"100ms\"\n\
         [backup]\nverify = true\nlist_timeout = \"1s\"\n{extra}",
        db.config(),
        litestream.url()
    ))
}

/// `/keepalive` once the change DB is up: still ready (200), whatever the destination does.
async fn keepalive(sidecar: &Sidecar) -> String {
    eventually_async("ready", || async {
        http(sidecar.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    http(sidecar.addr, "GET", "/keepalive").await.1
}

fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_claimed_backup_with_nothing_behind_it_never_leads_to_a_purge() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let all = db.watermarks().await;
    let dir = tempfile::tempdir().unwrap();
    // litestream claims 0c was uploaded two minutes ago; the destination is empty.
    let claimed = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", claimed)])).await;
    let sidecar = start_aged(
        verifying_config(&db, &litestream, dir.path(), ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0e"));

    // Once the change DB has answered (a first check may hold for its replica version), then check after check.
    settles_on(&sidecar, Decision::Hold(HoldReason::BackupUnverified)).await;
    for _ in 0..3 {
        assert_eq!(
            decisions(&sidecar, 1).await,
            Decision::Hold(HoldReason::BackupUnverified)
        );
    }
    assert_eq!(db.watermarks().await, all, "nothing purged");
    let status = sidecar.status.get();
    assert!(
        status.backup.stale.is_some(),
        "an empty destination behind a claim is stale"
    );
    let body = keepalive(&sidecar).await;
    assert!(body.contains("backup destination stale"), "{body}");
    let (_, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(
        metric(&page, "litestream_sidecar_backup_verified"),
        Some(0.0)
    );
    assert_eq!(metric(&page, "litestream_sidecar_backup_stale"), Some(1.0));
    assert!(page.contains("litestream_sidecar_cleanup_holds_total{reason=\"backup_unverified\"}"));

    // Objects from before the claim (200 s ago; the claim was 120 s ago): nothing written after it, still held.
    fork_layout(dir.path(), Duration::from_secs(200));
    for _ in 0..2 {
        assert_eq!(
            decisions(&sidecar, 1).await,
            Decision::Hold(HoldReason::BackupUnverified)
        );
    }
    assert_eq!(db.watermarks().await, all, "nothing purged");

    // A WAL segment of the chain written after the claim: covered, and the purge goes ahead.
    write_aged(
        dir.path(),
        "generations/a1b2c3d4e5f60718/wal/00000000/00002000.wal.lz4",
        Duration::from_secs(90),
    );
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let status = sidecar.status.get();
    assert!(
        status.backup.verified && status.backup.stale.is_none(),
        "{:?}",
        status.backup
    );
    let (_, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(
        metric(&page, "litestream_sidecar_backup_verified"),
        Some(1.0)
    );
    assert_eq!(metric(&page, "litestream_sidecar_backup_stale"), Some(0.0));
    let newest = metric(
        &page,
        "litestream_sidecar_backup_destination_newest_timestamp_seconds",
    )
    .unwrap();
    assert!((newest - (epoch_now() - 90.0)).abs() < 10.0, "{newest}");
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn a_listing_that_fails_holds_cleanup() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    let all = db.watermarks().await;
    let dir = tempfile::tempdir().unwrap();
    // A file where the destination directory should be: every listing fails.
    let not_a_dir = dir.path().join("replica");
    std::fs::write(&not_a_dir, b"").unwrap();
    let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
    let url = url::Url::from_file_path(&not_a_dir).unwrap();
    let sidecar = start_aged(
        config(&format!(
            "{}[litestream]\nbackup_url = \"{url}\"\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [discovery]\ninterval = \"100ms\"\n[backup]\nverify = true\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0c"));
    // Once the change DB has answered (a first check may hold for its replica version), then check after check.
    settles_on(&sidecar, Decision::Hold(HoldReason::BackupUnverified)).await;
    for _ in 0..3 {
        assert_eq!(
            decisions(&sidecar, 1).await,
            Decision::Hold(HoldReason::BackupUnverified)
        );
    }
    assert_eq!(db.watermarks().await, all);
    let body = keepalive(&sidecar).await;
    assert!(body.contains("cannot be listed"), "{body}");
    let (_, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert!(
        metric(
            &page,
            "litestream_sidecar_backup_verification_errors_total{kind=\"other\"}"
        )
        .unwrap()
            >= 3.0,
        "{page}"
    );
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn no_status_is_sent_before_the_destination_holds_a_restorable_backup() {
    let db = TestSchema::create(Some(6), None).await;
    db.insert_transaction("0b", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let litestream = MetricsServer::start(&progress_page(&[("0b", epoch_now() - 10.0)])).await;
    let sidecar = start(verifying_config(
        &db,
        &litestream,
        dir.path(),
        "[server]\nping_interval = \"100ms\"\n",
    ))
    .await;
    let mut v3 = RawClient::connect(sidecar.addr, "/replication/v3/snapshot?taskID=v3").await;
    let mut v6 = RawClient::connect(sidecar.addr, "/replication/v6/snapshot?taskID=v6").await;
    // litestream has claimed a backup, the destination is empty: pings only, for 25 pings and at least two checks
    // (on a loaded machine the checks may take longer than the pings).
    let mut pings = 0;
    while pings < 25 || sidecar.status.get().checks < 2 {
        assert!(pings < 600, "two checks within 600 pings");
        assert_eq!(
            text_after_pings(&mut v3, 1).await,
            None,
            "no v3 status without a backup"
        );
        assert_eq!(
            text_after_pings(&mut v6, 1).await,
            None,
            "no v6 status without a backup"
        );
        pings += 1;
    }
    assert_eq!(sidecar.registry.len(), 2);

    // litestream 0.5's files: refused, and still no status.
    ltx_layout(dir.path(), Duration::ZERO);
    eventually("the LTX layout seen", || {
        sidecar
            .status
            .get()
            .backup
            .listing
            .is_some_and(|l| l.layout == Layout::Ltx)
    })
    .await;
    for _ in 0..5 {
        assert_eq!(
            text_after_pings(&mut v3, 1).await,
            None,
            "no status for an LTX destination"
        );
    }
    let refused_for_ltx = || {
        sidecar
            .status
            .get()
            .unservable
            .has(litestream_sidecar::cleanup::unservable::Reason::Ltx)
    };
    assert!(refused_for_ltx(), "an LTX destination is a refusal");
    assert!(sidecar.registry.is_unservable());
    std::fs::remove_dir_all(dir.path().join("ltx")).unwrap();

    fork_layout(dir.path(), Duration::ZERO);
    // The LTX files gone: the refusal clears with the next listing.
    eventually("the LTX refusal cleared", || !refused_for_ltx()).await;
    let (mut status3, mut status6) = (None, None);
    for _ in 0..100 {
        if status3.is_none() {
            status3 = text_after_pings(&mut v3, 1).await;
        }
        if status6.is_none() {
            status6 = text_after_pings(&mut v6, 1).await;
        }
        if status3.is_some() && status6.is_some() {
            break;
        }
    }
    let url = url::Url::from_directory_path(dir.path()).unwrap();
    assert_eq!(
        status3,
        Some(format!(
            r#"{{"id":1,"msg":["status",{{"tag":"status","backupURL":"{url}"}}]}}"#
        ))
    );
    let status6 = status6.expect("a v6 status once the destination holds a backup");
    assert!(status6.contains(r#""minWatermark":"0b""#), "{status6}");
    sidecar.stop().await;
    db.drop().await;
}
