//! The backup destination check: real directories in both litestream layouts, a real S3-compatible server
//! (moto) on loopback, an endpoint that never answers, and end to end, a sidecar that must not purge a real
//! PostgreSQL change log, nor send a snapshot status, on a claim with nothing behind it.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::moto::Moto;
use common::pg::TestSchema;
use common::*;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::cleanup::{self, Decision, HoldReason};
use litestream_sidecar::litestream::destination::S3Settings;
use litestream_sidecar::litestream::destination::{self, ErrorKind, Listing, Location};
use litestream_sidecar::protocol::Mode;

const SLACK: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_secs(5);

/// Writes `path` under `dir` with a last-modified time `age` ago.
fn write_aged(dir: &Path, path: &str, age: Duration) {
    let path = dir.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"backup bytes").unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

/// The Zero fork's layout (litestream 0.3): a generation with a snapshot and WAL segments.
fn fork_layout(dir: &Path, age: Duration) {
    for path in [
        "generations/a1b2c3d4e5f60718/snapshots/00000000.snapshot.lz4",
        "generations/a1b2c3d4e5f60718/wal/00000000/00000000.wal.lz4",
        "generations/a1b2c3d4e5f60718/wal/00000000/00001000.wal.lz4",
    ] {
        write_aged(dir, path, age);
    }
}

/// litestream 0.5's layout: LTX files by level.
fn ltx_layout(dir: &Path, age: Duration) {
    for path in [
        "ltx/0/0000000000000001-0000000000000001.ltx",
        "ltx/0/0000000000000002-0000000000000002.ltx",
        "ltx/1/0000000000000001-0000000000000002.ltx",
    ] {
        write_aged(dir, path, age);
    }
}

async fn list_dir(dir: &Path) -> Listing {
    destination::Destination::open(
        &Location::Local(dir.to_path_buf()),
        &S3Settings::default(),
        TIMEOUT,
        Vec::new(),
    )
    .unwrap()
    .list()
    .await
    .unwrap()
}

fn covers(listing: &Listing, claimed: SystemTime) -> bool {
    cleanup::DestinationCheck::Listed {
        newest: listing.newest,
        slack: SLACK,
    }
    .covers(claimed)
}

#[tokio::test]
async fn file_destinations_in_both_layouts_cover_only_claims_their_objects_reach() {
    let hour = Duration::from_secs(3600);
    for layout in [fork_layout as fn(&Path, Duration), ltx_layout] {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();

        // Empty: nothing to restore, no claim covered.
        let empty = list_dir(dir.path()).await;
        assert_eq!((empty.objects, empty.newest), (0, None));
        assert!(!empty.is_restorable());
        assert!(!covers(&empty, now - hour));
        assert!(destination::is_stale(
            empty.newest,
            now,
            15 * 60 * Duration::from_secs(1)
        ));

        // Old objects only: restorable, covering an hour-old claim but not one made now (litestream wedged).
        layout(dir.path(), hour);
        let old = list_dir(dir.path()).await;
        assert_eq!(old.objects, 3);
        assert!(old.is_restorable());
        assert!(covers(&old, now - hour));
        assert!(covers(&old, now - hour + SLACK));
        assert!(!covers(&old, now - hour + SLACK + Duration::from_secs(5)));
        assert!(!covers(&old, now));
        assert!(destination::is_stale(
            old.newest,
            now,
            Duration::from_secs(900)
        ));

        // A fresh object anywhere under the path covers a claim made now.
        layout(dir.path(), Duration::ZERO);
        let fresh = list_dir(dir.path()).await;
        assert!(covers(&fresh, now));
        assert!(!destination::is_stale(
            fresh.newest,
            now,
            Duration::from_secs(900)
        ));
    }
}

#[tokio::test]
async fn a_directory_litestream_has_not_created_yet_is_empty_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let listing = list_dir(&dir.path().join("not-yet")).await;
    assert_eq!((listing.objects, listing.newest), (0, None));
}

fn s3_env(key: &(String, String)) -> Vec<(String, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID".into(), key.0.clone()),
        ("AWS_SECRET_ACCESS_KEY".into(), key.1.clone()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ]
}

fn s3_settings(endpoint: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint.into()),
        region: None,
        force_path_style: true,
        allow_http: true,
    }
}

async fn list_s3(
    url: &str,
    endpoint: &str,
    env: Vec<(String, String)>,
    timeout: Duration,
) -> Result<Listing, destination::ListError> {
    destination::Destination::open(
        &Location::parse(url).unwrap(),
        &s3_settings(endpoint),
        timeout,
        env,
    )
    .unwrap()
    .list()
    .await
}

#[tokio::test]
async fn s3_destinations_are_listed_under_the_replica_path_with_the_environments_credentials() {
    let moto = Moto::start().await;
    moto.create_bucket("acme-zero").await;
    for key in [
        "zero/replica/generations/a1b2c3d4e5f60718/snapshots/00000000.snapshot.lz4",
        "zero/replica/generations/a1b2c3d4e5f60718/wal/00000000/00000000.wal.lz4",
        "zero/replica-other/ltx/0/0000000000000001-0000000000000001.ltx",
        "elsewhere/ltx/0/0000000000000001-0000000000000001.ltx",
    ] {
        moto.put("acme-zero", key, b"backup bytes").await;
    }
    let key = moto.access_key("sidecar").await;
    let endpoint = moto.endpoint();

    let listing = list_s3(
        "s3://acme-zero/zero/replica",
        &endpoint,
        s3_env(&key),
        TIMEOUT,
    )
    .await
    .unwrap();
    // Only the replica's own path: not "replica-other", not "elsewhere".
    assert_eq!(listing.objects, 2);
    let now = SystemTime::now();
    assert!(covers(&listing, now), "{listing:?}");
    // A claim from the future (a clock far ahead, or a gauge with nothing behind it) is not covered.
    assert!(!covers(&listing, now + Duration::from_secs(600)));

    // An empty prefix: reachable, but nothing to restore and nothing covered.
    let empty = list_s3(
        "s3://acme-zero/zero/none-yet",
        &endpoint,
        s3_env(&key),
        TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!((empty.objects, empty.newest), (0, None));

    // From here on moto checks signatures. Its check mishandles an encoded '/' in the query string (the prefix
    // parameter), so the bucket's root is listed with the right key; S3 itself signs and checks both alike.
    moto.enforce_auth().await;
    let root = list_s3("s3://acme-zero", &endpoint, s3_env(&key), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(root.objects, 4);

    // Wrong secret, unknown key: refused.
    let wrong_secret = (key.0.clone(), "not-the-secret".to_string());
    let unknown = ("AKIAUNKNOWNKEY000000".to_string(), key.1.clone());
    for creds in [wrong_secret, unknown] {
        let err = list_s3("s3://acme-zero", &endpoint, s3_env(&creds), TIMEOUT)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Denied, "{err}");
    }

    // A bucket that does not exist.
    let err = list_s3("s3://no-such-bucket", &endpoint, s3_env(&key), TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn an_endpoint_that_never_answers_times_out_within_the_list_timeout() {
    // Accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let key = ("AKIAEXAMPLE".to_string(), "secret".to_string());
    let started = std::time::Instant::now();
    let err = list_s3(
        "s3://acme-zero/replica",
        &endpoint,
        s3_env(&key),
        Duration::from_millis(500),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    accepting.abort();
}

// End to end: a sidecar with verification on, litestream's page, and a file:// destination.

fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: id.into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "01".into(),
        watermark: watermark.into(),
    }
}

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

async fn decisions(sidecar: &Sidecar, ticks: u64) -> Decision {
    let target = sidecar.status.get().checks + ticks;
    eventually("monitor checks", || sidecar.status.get().checks >= target).await;
    sidecar.status.get().last_decision.expect("a decision")
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
    let claimed = epoch_now() - 120.0;
    let litestream = MetricsServer::start(&progress_page(&[("0c", claimed)])).await;
    let sidecar = start_aged(
        verifying_config(&db, &litestream, dir.path(), ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0e"));

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

    // Objects from before the claim, but older than the slack allows: still nothing behind it.
    fork_layout(dir.path(), Duration::from_secs(200));
    for _ in 0..2 {
        assert_eq!(
            decisions(&sidecar, 1).await,
            Decision::Hold(HoldReason::BackupUnverified)
        );
    }
    assert_eq!(db.watermarks().await, all, "nothing purged");

    // Within the slack of the claim (30 s before it): covered, and the purge goes ahead.
    write_aged(
        dir.path(),
        "generations/a1b2c3d4e5f60718/wal/00000000/00002000.wal.lz4",
        Duration::from_secs(150),
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
    assert!((newest - (epoch_now() - 150.0)).abs() < 10.0, "{newest}");
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
    let litestream = MetricsServer::start(&progress_page(&[("0b", epoch_now() - 120.0)])).await;
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
    // litestream has claimed a backup, the destination is empty: pings only, for several checks.
    for _ in 0..25 {
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
    }
    assert!(sidecar.status.get().checks >= 2);
    assert_eq!(sidecar.registry.len(), 2);

    ltx_layout(dir.path(), Duration::ZERO);
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
