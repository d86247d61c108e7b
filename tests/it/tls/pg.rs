//! SIGHUP on a running process: statuses go out only once their reservation's row has committed, so these cases
//! run against the change DB.

use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;

use super::*;
use crate::support::pg::TestSchema;

#[tokio::test]
async fn sighup_gives_new_connections_the_new_certificate_and_keeps_open_ones() {
    let (ca_a, ca_b) = (Ca::new("CA A"), Ca::new("CA B"));
    let (a, b) = (ca_a.leaf("sidecar A"), ca_b.leaf("sidecar B"));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = install(dir.path(), &a);
    let litestream = litestream().await;
    let db = TestSchema::create(None, None).await;
    let config = binary_config(
        dir.path(),
        &litestream.url(),
        &format!("[server]\n{}\n{}", tls_keys(&cert, &key), db.config()),
    );
    let process = Process::spawn(&config).await;
    let both: &[&Ca] = &[&ca_a, &ca_b];

    let (mut old, presented) = wss(process.addr, "/replication/v3/snapshot?taskID=old", both).await;
    assert_eq!(presented, a.der);
    assert_eq!(text_of(&mut old).await, V3_STATUS);
    // `status` speaks TLS to a daemon whose config says so, trusting the configured certificate.
    assert_eq!(
        status_json(process.addr, &config).await["reservations"][0]["task_id"],
        "old"
    );

    install(dir.path(), &b);
    hangup(&process);
    reloads_counted(process.addr, both, "ok", 1.0).await;
    let (mut new, presented) = wss(process.addr, "/replication/v3/snapshot?taskID=new", both).await;
    assert_eq!(presented, b.der, "a new connection got the old certificate");
    assert_eq!(text_of(&mut new).await, V3_STATUS);
    // Only CA B is needed from now on.
    assert_eq!(https(process.addr, "/", &[&ca_b]).await, (200, "OK".into()));
    // The connection opened before the reload is still served: pinged, and its ack read.
    a_ping_arrives(&mut old).await;
    old.send(Message::Text(r#"{"ack":1}"#.into()))
        .await
        .unwrap();
    a_ping_arrives(&mut old).await;
    let json = status_json(process.addr, &config).await;
    let tasks: Vec<_> = json["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["task_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tasks, ["old", "new"], "{json:#}");

    // A renewal gone wrong: a key that is not the certificate's. The previous pair stays in service, and the
    // operator is told at error which file, where, is wrong.
    const NOT_RELOADED: &str = "TLS certificate not reloaded; still serving the previous one";
    replace(&key, &ca_a.leaf("stray").key_pem);
    hangup(&process);
    reloads_counted(process.addr, both, "error", 1.0).await;
    let failed = process.wait_logged(NOT_RELOADED, 1).await;
    assert_eq!(failed["level"], "ERROR", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("server.tls_key_file"), "{error}");
    assert!(error.contains(&key.display().to_string()), "{error}");
    let (_third, presented) =
        wss(process.addr, "/replication/v3/snapshot?taskID=third", both).await;
    assert_eq!(presented, b.der);
    // A key file that is gone is reported the same way.
    std::fs::remove_file(&key).unwrap();
    hangup(&process);
    reloads_counted(process.addr, both, "error", 2.0).await;
    let failed = process.wait_logged(NOT_RELOADED, 2).await;
    assert!(
        failed["error"].as_str().unwrap().contains("No such file"),
        "{failed}"
    );
    a_ping_arrives(&mut old).await;
    a_ping_arrives(&mut new).await;

    let (status, page) = https(process.addr, "/metrics", &[&ca_b]).await;
    assert_eq!(status, 200);
    assert_eq!(
        crate::support::process::metric(
            &page,
            "litestream_sidecar_tls_reloads_total{result=\"ok\"}"
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        crate::support::process::metric(
            &page,
            "litestream_sidecar_tls_reloads_total{result=\"error\"}"
        ),
        Some(2.0),
        "{page}"
    );
}

/// Waits until the metrics page (over TLS, trusting `cas`) counts `count` re-reads of TLS files with `result`:
/// each is counted once the re-read has ended, its new pair in service or the previous one kept.
async fn reloads_counted(addr: SocketAddr, cas: &[&Ca], result: &str, count: f64) {
    let series = format!("litestream_sidecar_tls_reloads_total{{result=\"{result}\"}}");
    until(
        &format!("{series} {count}"),
        Duration::from_secs(10),
        || async { https(addr, "/metrics", cas).await.1 },
        |page: &String| crate::support::process::metric(page, &series) == Some(count),
    )
    .await;
}

#[tokio::test]
async fn sighup_without_tls_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let litestream = litestream().await;
    let db = TestSchema::create(None, None).await;
    let process = Process::spawn(&binary_config(dir.path(), &litestream.url(), &db.config())).await;
    let mut ws = connect(&format!(
        "ws://{}/replication/v3/snapshot?taskID=t1",
        process.addr
    ))
    .await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    hangup(&process);
    process
        .wait_logged("reload: no TLS configured, nothing to re-read", 1)
        .await;
    // Still up, connection and all.
    a_ping_arrives(&mut ws).await;
    assert_eq!(http(process.addr, "GET", "/").await, (200, "OK".into()));
}
