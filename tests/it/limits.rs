//! Hostile and careless clients against the main listener: `server.allow`, `server.max_connections`, the request
//! head's time and size limits, over real sockets, with the status codes, the counts in `/metrics` and what the
//! sidecar holds afterwards.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// `litestream_sidecar_connections_refused_total{reason}`, 0 when absent.
async fn refused(sidecar: &Sidecar, reason: &str) -> f64 {
    value(
        &scrape(sidecar).await,
        "litestream_sidecar_connections_refused_total",
        Some(("reason", reason)),
    )
    .unwrap_or(0.0)
}

/// Sends `request` as is and reads until the server closes: the status code and the whole answer.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

fn upgrade_request(addr: SocketAddr, path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

/// Waits until the server closes `stream`, reading and dropping whatever it sends; how long that took.
async fn closed_after(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut sink = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(start + limit, stream.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn peers_outside_the_allow_list_get_403_before_any_upgrade() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("[server]\nallow = [\"10.0.0.0/8\", \"::1\"]\n")).await;
    let snapshot = "/replication/v3/snapshot?taskID=outsider";
    let changes = changes_path(3, "outsider", "a", "0a", false);
    for path in [snapshot, changes.as_str()] {
        let (status, answer) =
            exchange(sidecar.addr, upgrade_request(sidecar.addr, path).as_bytes()).await;
        assert_eq!(status, 403, "{answer}");
        assert!(
            answer.ends_with("forbidden: this address may not open the change-streamer protocol (server.allow)\n"),
            "{answer}"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("upgrade: websocket"),
            "{answer}"
        );
    }
    assert!(
        sidecar.registry.is_empty(),
        "no reservation for a refused peer"
    );
    assert!(
        upstream.none_arrives().await,
        "no upstream connection for a refused peer"
    );
    // The plain endpoints stay open to everyone.
    for path in ["/", "/keepalive", "/metrics", "/status"] {
        let (status, body) = http(sidecar.addr, "GET", path).await;
        assert_ne!(status, 403, "{path}: {body}");
    }
    assert_eq!(refused(&sidecar, "not_allowed").await, 2.0);
    sidecar.stop().await;

    // Loopback in the list: served as usual, and counted nowhere.
    let sidecar = start(config("[server]\nallow = [\"127.0.0.0/8\"]\n")).await;
    let mut ws = connect(&sidecar.snapshot_url("insider")).await;
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    assert_eq!(refused(&sidecar, "not_allowed").await, 0.0);
    drop(ws);
    sidecar.stop().await;
}

#[tokio::test]
async fn past_max_connections_new_connections_get_503_until_one_closes() {
    let sidecar = start(config("[server]\nmax_connections = 3\n")).await;
    // A reservation (upgraded: it keeps its place) and two connections that never finish their request.
    let mut reservation = connect(&sidecar.snapshot_url("kept")).await;
    assert_eq!(next_text(&mut reservation).await, V3_STATUS);
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(sidecar.addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        idle.push(stream);
    }

    let (status, answer) = exchange(
        sidecar.addr,
        upgrade_request(sidecar.addr, "/replication/v3/snapshot?taskID=late").as_bytes(),
    )
    .await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("retry-after: 1\r\n"), "{answer}");
    assert!(
        answer
            .ends_with("too many connections: 3 are open (server.max_connections); retry later\n"),
        "{answer}"
    );
    assert_eq!(
        sidecar.registry.len(),
        1,
        "the refused reservation was never opened"
    );

    // The reservation's place comes back when it closes.
    drop(reservation);
    eventually("the reservation is gone", || sidecar.registry.is_empty()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        if let Ok((ws, _)) = tokio_tungstenite::connect_async(sidecar.snapshot_url("again")).await {
            break ws;
        }
        assert!(Instant::now() < deadline, "no place freed up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(next_text(&mut again).await, V3_STATUS);
    drop(again);
    drop(idle);
    // Scraping needs a place too: wait until the others are gone.
    let body = loop {
        let (status, body) = exchange(
            sidecar.addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        if status == 200 {
            break body;
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "never scraped: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        body.contains("litestream_sidecar_connections_refused_total{reason=\"max_connections\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("litestream_sidecar_max_connections 3"),
        "{body}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_request_head_must_arrive_in_time_and_an_idle_connection_is_closed() {
    let sidecar = start(config("[server]\nheader_read_timeout = \"500ms\"\n")).await;
    // Slow loris: a byte now and then, never the end of the head.
    let mut slow = TcpStream::connect(sidecar.addr).await.unwrap();
    slow.write_all(b"GET /replication/v3/snapshot?taskID=slow HTTP/1.1\r\n")
        .await
        .unwrap();
    let trickle = async {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b"X").await.is_err() {
                break;
            }
        }
    };
    let mut silent = TcpStream::connect(sidecar.addr).await.unwrap();
    trickle.await;
    let closed = closed_after(&mut slow, Duration::from_secs(5))
        .await
        .expect("the slow client is dropped");
    assert!(closed < Duration::from_secs(5));
    assert!(
        closed_after(&mut silent, Duration::from_secs(5))
            .await
            .is_some(),
        "a silent client is dropped"
    );

    // A kept-alive connection is answered, then closed once idle for the same time.
    let mut kept = TcpStream::connect(sidecar.addr).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 256];
    let n = kept.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
    let idle_for = closed_after(&mut kept, Duration::from_secs(5))
        .await
        .expect("an idle connection is closed");
    assert!(
        idle_for >= Duration::from_millis(400),
        "closed after {idle_for:?}"
    );

    assert!(refused(&sidecar, "header_timeout").await >= 2.0);
    assert!(sidecar.registry.is_empty());
    sidecar.stop().await;
}

#[tokio::test]
async fn a_request_head_over_the_limit_gets_431() {
    let sidecar = start(config("[server]\nmax_header_bytes = 8192\n")).await;
    let long_query = format!(
        "GET /replication/v3/snapshot?taskID={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "t".repeat(9000)
    );
    let (status, answer) = exchange(sidecar.addr, long_query.as_bytes()).await;
    assert_eq!(status, 431, "{answer}");
    let many_headers: String = (0..400).map(|i| format!("X-Header-{i}: {i}\r\n")).collect();
    let (status, answer) = exchange(
        sidecar.addr,
        format!("GET / HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status, 431, "{answer}");
    // A head well within it is served.
    let (status, _) = exchange(
        sidecar.addr,
        format!(
            "GET /?q={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "q".repeat(4000)
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(refused(&sidecar, "header_too_large").await, 2.0);
    sidecar.stop().await;
}
