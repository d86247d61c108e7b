//! The backup destination check: real directories in both litestream layouts (0.3's read, 0.5's refused), a real S3-compatible server
//! (moto) on loopback, an endpoint that never answers, and end to end, a sidecar that must not purge a real
//! PostgreSQL change log, nor send a snapshot status, on a claim with nothing behind it.
//!
//! The end-to-end cases need PostgreSQL: they are in [`pg`].

mod pg;

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support::moto::Moto;
use litestream_sidecar::cleanup::{self};
use litestream_sidecar::litestream::destination::S3Settings;
use litestream_sidecar::litestream::destination::{self, ErrorKind, Listing, Location};
use litestream_sidecar::litestream::layout::Layout;

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
        reaches: listing.chain_newest(),
    }
    .covers(claimed)
}

#[tokio::test]
async fn file_destinations_cover_only_claims_their_restorable_chain_reaches() {
    let hour = Duration::from_secs(3600);
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();

    // Empty: nothing to restore, no claim covered.
    let empty = list_dir(dir.path()).await;
    assert_eq!((empty.objects, empty.newest), (0, None));
    assert_eq!(empty.layout, Layout::Empty);
    assert!(!empty.is_restorable());
    assert!(!covers(&empty, now - hour));
    assert!(destination::is_stale(
        empty.newest,
        now,
        15 * 60 * Duration::from_secs(1)
    ));

    // Old objects only: restorable, covering an hour-old claim but not one a second later (litestream wedged).
    fork_layout(dir.path(), hour);
    let old = list_dir(dir.path()).await;
    assert_eq!(old.objects, 3);
    assert!(old.is_restorable());
    let reaches = old.chain_newest().unwrap();
    assert!(covers(&old, reaches));
    assert!(!covers(&old, reaches + Duration::from_secs(1)));
    assert!(!covers(&old, now));
    assert!(destination::is_stale(
        old.newest,
        now,
        Duration::from_secs(900)
    ));

    // A fresh object of the chain covers a claim made now.
    fork_layout(dir.path(), Duration::ZERO);
    let fresh = list_dir(dir.path()).await;
    assert!(covers(&fresh, now));
    assert!(!destination::is_stale(
        fresh.newest,
        now,
        Duration::from_secs(900)
    ));
}

#[tokio::test]
async fn an_ltx_destination_is_recognised_and_covers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    ltx_layout(dir.path(), Duration::ZERO);
    let listing = list_dir(dir.path()).await;
    assert_eq!((listing.objects, &listing.layout), (3, &Layout::Ltx));
    assert!(!listing.is_restorable());
    assert!(!covers(
        &listing,
        SystemTime::now() - Duration::from_secs(3600)
    ));
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
    // S3 keeps last-modified times in whole seconds: a claim is covered up to the chain's newest object's second,
    // and not a second later (no slack).
    let reaches = listing.chain_newest().expect("restorable");
    assert!(reaches <= SystemTime::now());
    assert!(covers(&listing, reaches), "{listing:?}");
    assert!(!covers(&listing, reaches + Duration::from_secs(1)));

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
