//! Snapshot reservations over real sockets: exact frames, close codes and what the registry holds.

use std::time::Duration;

use crate::support::*;
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn reservation_gets_the_status_frame_and_stays_open() {
    let sidecar = start(config("")).await;
    let mut clients = Vec::new();
    for task in ["a", "b", "c", "d"] {
        let mut ws =
            connect(&sidecar.url(&format!("/replication/v3/snapshot?taskID=task-{task}"))).await;
        assert_eq!(next_text(&mut ws).await, V3_STATUS);
        send_text(&mut ws, r#"{"ack":1}"#).await;
        clients.push(ws);
    }
    eventually("four reservations", || sidecar.registry.len() == 4).await;
    let tasks: Vec<_> = sidecar
        .registry
        .open_reservations()
        .into_iter()
        .map(|r| r.task_id)
        .collect();
    assert_eq!(tasks, ["task-a", "task-b", "task-c", "task-d"]);
    // Nothing else arrives: the socket is held open (pings aside).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sidecar.registry.len(), 4);
    sidecar.stop().await;
}

#[tokio::test]
async fn task_id_is_decoded_like_zero_does() {
    let sidecar = start(config("")).await;
    let mut ws =
        connect(&sidecar.url("/replication/v3/snapshot?x=1&taskID=rm-1%2Fbackup+7&taskID=second"))
            .await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    eventually("reservation", || sidecar.registry.len() == 1).await;
    assert_eq!(
        sidecar.registry.open_reservations()[0].task_id,
        "rm-1/backup 7"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn backup_url_is_escaped_as_json() {
    let sidecar = start(config("").tap_backup_url("file:///backups/\"zero\"")).await;
    let mut ws = connect(&sidecar.snapshot_url("t1")).await;
    assert_eq!(
        next_text(&mut ws).await,
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"file:///backups/\"zero\""}]}"#
    );
    sidecar.stop().await;
}

trait TapBackupUrl {
    fn tap_backup_url(self, url: &str) -> Self;
}

impl TapBackupUrl for litestream_sidecar::Config {
    fn tap_backup_url(mut self, url: &str) -> Self {
        self.litestream.backup_url = url.into();
        self
    }
}

#[tokio::test]
async fn retry_with_the_same_task_replaces_the_reservation() {
    let sidecar = start(config("")).await;
    let mut first = connect(&sidecar.snapshot_url("t1")).await;
    assert_eq!(next_text(&mut first).await, V3_STATUS);
    eventually("first reservation", || sidecar.registry.len() == 1).await;
    let started_first = sidecar.registry.open_reservations()[0].started;

    let mut second = connect(&sidecar.snapshot_url("t1")).await;
    assert_eq!(next_text(&mut second).await, V3_STATUS);
    // Zero closes the replaced stream without a status code.
    assert_eq!(expect_close(&mut first).await, None);
    let open = sidecar.registry.open_reservations();
    assert_eq!(open.len(), 1);
    assert!(
        open[0].started > started_first,
        "the new reservation replaced the old one"
    );
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(30));
    // The replaced socket going away leaves the new reservation in place.
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sidecar.registry.len(), 1);
    sidecar.stop().await;
}

#[tokio::test]
async fn reservation_ends_when_its_socket_closes_without_touching_the_delay() {
    let sidecar = start(config("")).await;
    let mut ws = connect(&sidecar.snapshot_url("t1")).await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    let mut other = connect(&sidecar.snapshot_url("t2")).await;
    assert_eq!(next_text(&mut other).await, V3_STATUS);
    eventually("two reservations", || sidecar.registry.len() == 2).await;

    ws.close(None).await.unwrap();
    eventually("t1 released", || sidecar.registry.len() == 1).await;
    assert_eq!(sidecar.registry.open_reservations()[0].task_id, "t2");
    // A crashed client (TCP gone without a close frame) ends its reservation too.
    drop(other);
    eventually("t2 released", || sidecar.registry.is_empty()).await;
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(30));
    sidecar.stop().await;
}

#[tokio::test]
async fn subscription_ends_the_reservation_and_raises_the_delay() {
    let sidecar = start(config("")).await;
    let mut ws = connect(&sidecar.snapshot_url("vs-1")).await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    send_text(&mut ws, r#"{"ack":1}"#).await;
    eventually("reservation", || sidecar.registry.len() == 1).await;
    let started = sidecar.registry.open_reservations()[0].started;

    // The restore took 45 s: longer than the 30 s delay, so the delay becomes 45 s.
    let held = sidecar.registry.end_by_subscription(
        "vs-1",
        sidecar.registry.ticket(),
        started + Duration::from_secs(45),
    );
    assert_eq!(held, Some(Duration::from_secs(45)));
    assert_eq!(expect_close(&mut ws).await, None);
    assert!(sidecar.registry.is_empty());
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(45));

    // A shorter one leaves it alone; an unknown task changes nothing.
    let mut ws = connect(&sidecar.snapshot_url("vs-2")).await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    eventually("reservation", || sidecar.registry.len() == 1).await;
    let started = sidecar.registry.open_reservations()[0].started;
    assert_eq!(
        sidecar.registry.end_by_subscription(
            "vs-2",
            sidecar.registry.ticket(),
            started + Duration::from_secs(5)
        ),
        Some(Duration::from_secs(5))
    );
    assert_eq!(expect_close(&mut ws).await, None);
    assert_eq!(
        sidecar
            .registry
            .end_by_subscription("nobody", sidecar.registry.ticket(), Instant::now()),
        None
    );
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(45));
    sidecar.stop().await;
}

#[tokio::test]
async fn bad_requests_are_refused_before_the_upgrade_with_zeros_messages() {
    let sidecar = start(config("")).await;
    let cases = [
        (
            "/replication/v3/snapshot",
            "Error: Missing taskID in snapshot request",
        ),
        (
            "/replication/v3/snapshot?taskID=",
            "Error: Missing taskID in snapshot request",
        ),
        (
            "/replication/v3/snapshot?taskid=t1",
            "Error: Missing taskID in snapshot request",
        ),
        (
            "/replication/v3/snapshot?%zz=%%&&",
            "Error: Missing taskID in snapshot request",
        ),
        (
            "/replication/v2/snapshot?taskID=t1",
            "Error: Cannot service client at protocol v2. Supported protocols: [v3 ... v6]",
        ),
        (
            "/replication/v7/snapshot?taskID=t1",
            "Error: Cannot service client at protocol v7. Supported protocols: [v3 ... v6]",
        ),
        (
            "/replication/latest/snapshot?taskID=t1",
            "Error: invalid path: /replication/latest/snapshot",
        ),
    ];
    for (path, message) in cases {
        assert_eq!(
            refused(&sidecar.url(path)).await,
            (400, message.to_string()),
            "{path}"
        );
    }
    for path in [
        "/replication/v3/snapshot/?taskID=t1",
        "/replication/v3/snap?taskID=t1",
        "/ws",
    ] {
        assert_eq!(refused(&sidecar.url(path)).await.0, 404, "{path}");
    }
    assert!(sidecar.registry.is_empty());
    sidecar.stop().await;
}

#[tokio::test]
async fn health_endpoints() {
    let sidecar = start(config("")).await;
    assert_eq!(http(sidecar.addr, "GET", "/").await, (200, "OK".into()));
    assert_eq!(
        http(sidecar.addr, "GET", "/?probe=1").await,
        (200, "OK".into())
    );
    // This sidecar's change DB does not exist: alive, but not ready.
    let (status, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(status, 503);
    assert!(body.contains("change DB"), "{body}");
    assert_eq!(http(sidecar.addr, "GET", "/nope").await.0, 404);
    assert_eq!(http(sidecar.addr, "POST", "/").await.0, 405);
    let (status, body) = http(sidecar.addr, "GET", "/replication/v3/snapshot?taskID=t1").await;
    assert_eq!(status, 400);
    assert!(body.contains("WebSocket"), "{body}");
    assert!(sidecar.registry.is_empty());
    sidecar.stop().await;
}

/// A peer is dropped only once nothing arrived from it for `server.peer_timeout`, not at the first unanswered
/// ping: a view-syncer whose network stalls for a few seconds keeps its reservation, as Zero's own server lets it.
#[tokio::test]
async fn a_reservation_outlives_unanswered_pings_until_the_peer_timeout() {
    let sidecar = start(config(
        "[server]\nping_interval = \"1s\"\npeer_timeout = \"6s\"\n",
    ))
    .await;

    // A responsive client (tungstenite answers pings while reading) keeps its reservation.
    let mut alive = connect(&sidecar.snapshot_url("alive")).await;
    assert_eq!(next_text(&mut alive).await, V3_STATUS);
    let pings = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let pings = pings.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = alive.next().await {
                if matches!(message, Message::Ping(_)) {
                    pings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    };

    // A client that reads but never answers: the status, then a ping a second.
    let opened = Instant::now();
    let mut silent =
        RawClient::connect(sidecar.addr, "/replication/v3/snapshot?taskID=silent").await;
    assert_eq!(silent.read_frame().await, Some((0x1, V3_STATUS.into())));
    for _ in 0..2 {
        assert_eq!(silent.read_frame().await, Some((0x9, Vec::new())));
    }
    // Two pings went unanswered, and half a second more: one missed pong is no reason to drop it.
    tokio::time::sleep_until(opened + Duration::from_millis(2500)).await;
    let held: Vec<String> = sidecar
        .registry
        .open_reservations()
        .into_iter()
        .map(|r| r.task_id)
        .collect();
    assert_eq!(held, ["alive", "silent"]);

    // Six silent seconds: dropped (no close handshake with a peer that stopped answering), never sooner.
    assert!(
        silent.is_dropped().await,
        "server kept an unresponsive peer"
    );
    assert!(
        opened.elapsed() >= Duration::from_secs(6),
        "dropped after {:?}",
        opened.elapsed()
    );
    eventually("silent released", || sidecar.registry.len() == 1).await;
    assert_eq!(sidecar.registry.open_reservations()[0].task_id, "alive");
    // The answering client outlived the timeout too, pinged all along (its reader counts them on its own task).
    eventually("six pings answered by the live client", || {
        pings.load(std::sync::atomic::Ordering::Relaxed) >= 6
    })
    .await;
    assert_eq!(sidecar.registry.open_reservations()[0].task_id, "alive");
    sidecar.stop().await;
    reader.await.unwrap();
}

#[tokio::test]
async fn server_answers_client_pings() {
    let sidecar = start(config("")).await;
    let mut raw = RawClient::connect(sidecar.addr, "/replication/v3/snapshot?taskID=t1").await;
    assert_eq!(
        raw.read_frame().await.unwrap(),
        (0x1, V3_STATUS.as_bytes().to_vec())
    );
    raw.write_frame(true, 0x9, b"hello").await;
    assert_eq!(raw.read_frame().await.unwrap(), (0xA, b"hello".to_vec()));
    sidecar.stop().await;
}

#[tokio::test]
async fn shutdown_closes_every_socket_with_1001_and_exits() {
    let sidecar = start(config("")).await;
    let mut clients = Vec::new();
    for i in 0..5 {
        let mut ws = connect(&sidecar.snapshot_url(&format!("t{i}"))).await;
        assert_eq!(next_text(&mut ws).await, V3_STATUS);
        clients.push(ws);
    }
    eventually("five reservations", || sidecar.registry.len() == 5).await;
    sidecar.begin_shutdown();
    for ws in &mut clients {
        assert_eq!(
            expect_close(ws).await,
            Some((1001, "sidecar shutting down".into()))
        );
    }
    let registry = sidecar.registry.clone();
    sidecar.stop().await;
    assert!(registry.is_empty());
}

#[tokio::test]
async fn malformed_acks_close_only_that_socket() {
    let sidecar = start(config("")).await;
    let mut bystander = connect(&sidecar.snapshot_url("bystander")).await;
    assert_eq!(next_text(&mut bystander).await, V3_STATUS);

    for (i, bad) in [
        r#"{"ack":1,"extra":true}"#,
        r#"{"ack":"1"}"#,
        "ack",
        r#"{"ack":2}"#,
        "[1]",
    ]
    .into_iter()
    .enumerate()
    {
        let mut ws = connect(&sidecar.snapshot_url(&format!("bad{i}"))).await;
        assert_eq!(next_text(&mut ws).await, V3_STATUS);
        send_text(&mut ws, bad).await;
        let (code, reason) = expect_close(&mut ws).await.expect("a close code");
        assert_eq!(code, 1002, "{bad}");
        assert!(reason.starts_with("Error: "), "{reason}");
        assert!(reason.len() <= 123);
    }
    // A second ack of the status is as wrong as an ack of a message never sent.
    let mut twice = connect(&sidecar.snapshot_url("twice")).await;
    assert_eq!(next_text(&mut twice).await, V3_STATUS);
    send_text(&mut twice, r#"{"ack":1}"#).await;
    send_text(&mut twice, r#"{"ack":1}"#).await;
    assert_eq!(expect_close(&mut twice).await.unwrap().0, 1002);

    eventually("only the bystander left", || sidecar.registry.len() == 1).await;
    send_text(&mut bystander, r#"{"ack":1}"#).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sidecar.registry.open_reservations()[0].task_id, "bystander");
    sidecar.stop().await;
}

#[tokio::test]
async fn binary_and_invalid_utf8_get_their_close_codes() {
    let sidecar = start(config("")).await;
    let path = "/replication/v3/snapshot?taskID=t";

    let mut raw = RawClient::connect(sidecar.addr, path).await;
    raw.write_frame(true, 0x2, b"{\"ack\":1}").await;
    assert_eq!(raw.read_close().await.unwrap().0, 1003);

    let mut raw = RawClient::connect(sidecar.addr, path).await;
    raw.write_frame(true, 0x1, &[b'{', 0xff, 0xfe, b'}']).await;
    assert_eq!(raw.read_close().await.unwrap().0, 1007);

    // Invalid UTF-8 split across fragments is caught once the message is whole.
    let mut raw = RawClient::connect(sidecar.addr, path).await;
    raw.write_frame(false, 0x1, &[b'{', 0xe2]).await;
    raw.write_frame(true, 0x0, &[0x28, b'}']).await;
    assert_eq!(raw.read_close().await.unwrap().0, 1007);

    // A valid ack split into fragments is accepted.
    let mut raw = RawClient::connect(sidecar.addr, path).await;
    raw.write_frame(false, 0x1, b"{\"ack\"").await;
    raw.write_frame(true, 0x0, b":1}").await;
    raw.write_frame(true, 0x9, b"p").await;
    assert_eq!(
        raw.read_frame().await.unwrap(),
        (0x1, V3_STATUS.as_bytes().to_vec())
    );
    assert_eq!(raw.read_frame().await.unwrap(), (0xA, b"p".to_vec()));

    // Reserved opcodes are a protocol error.
    let mut raw = RawClient::connect(sidecar.addr, path).await;
    raw.write_frame(true, 0x3, b"").await;
    assert_eq!(raw.read_close().await.unwrap().0, 1002);

    sidecar.stop().await;
}

#[tokio::test]
async fn messages_up_to_the_limit_are_read_and_larger_ones_close_with_1009() {
    use litestream_sidecar::streamer::snapshot::MAX_CLIENT_FRAME;
    let sidecar = start(config("")).await;
    let path = "/replication/v3/snapshot?taskID=big";

    // A frame of exactly the limit is read whole: it fails as an ack (1002), not as too big (1009).
    let mut raw = RawClient::connect(sidecar.addr, path).await;
    let mut payload = vec![b' '; MAX_CLIENT_FRAME];
    payload[0] = b'[';
    *payload.last_mut().unwrap() = b']';
    raw.write_frame(true, 0x1, &payload).await;
    assert_eq!(raw.read_close().await.unwrap().0, 1002);

    // One byte more is refused from its header alone, however little follows it: clients only send acks, and
    // server.max_message_bytes (for the change-streamer's messages) does not apply.
    for claim in [MAX_CLIENT_FRAME as u64 + 1, 100 << 20, (128 << 20) + 1] {
        let mut raw = RawClient::connect(sidecar.addr, path).await;
        raw.write_header(true, 0x1, claim).await;
        assert_eq!(
            raw.read_close().await,
            Some((1009, "message too big".into())),
            "a {claim}-byte claim"
        );
    }

    // So is a fragmented message that grows past the limit.
    let mut raw = RawClient::connect(sidecar.addr, path).await;
    let chunk = vec![b' '; MAX_CLIENT_FRAME / 2];
    raw.write_frame(false, 0x1, &chunk).await;
    raw.write_frame(false, 0x0, &chunk).await;
    raw.write_frame(true, 0x0, b"x").await;
    assert_eq!(raw.read_close().await.unwrap().0, 1009);

    eventually("nothing held", || sidecar.registry.is_empty()).await;
    sidecar.stop().await;
}

#[tokio::test]
async fn a_burst_of_connects_and_drops_leaves_no_reservation_behind() {
    let sidecar = start(config("")).await;
    let mut bystander = connect(&sidecar.snapshot_url("bystander")).await;
    assert_eq!(next_text(&mut bystander).await, V3_STATUS);

    let addr = sidecar.addr;
    let mut workers = Vec::new();
    for worker in 0..50 {
        workers.push(tokio::spawn(async move {
            for i in 0..200 {
                let task = format!("w{worker}-{}", i % 7);
                let path = format!("/replication/v3/snapshot?taskID={task}");
                // Half drop after the status, half drop in the middle of the handshake.
                if i % 2 == 0 {
                    let mut raw = RawClient::connect(addr, &path).await;
                    let _ = raw.read_frame().await;
                } else {
                    use tokio::io::AsyncWriteExt;
                    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let _ = stream
                        .write_all(
                            format!("GET {path} HTTP/1.1\r\nUpgrade: websocket\r\n").as_bytes(),
                        )
                        .await;
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    eventually("only the bystander left", || sidecar.registry.len() == 1).await;
    send_text(&mut bystander, r#"{"ack":1}"#).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sidecar.registry.open_reservations()[0].task_id, "bystander");
    sidecar.stop().await;
}
