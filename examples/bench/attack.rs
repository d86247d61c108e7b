//! Under attack: 10,000 slow-loris connections (a request head that never ends, a byte now and then, reconnecting
//! when dropped) and 1,000 WebSockets that each announce a 100 MiB frame and send a trickle of it (half on
//! `/snapshot`, half on `/changes`), all at once against the release binary with its default limits. Printed:
//! the sidecar's peak resident memory while they are all open, and a normal reservation's time to its status.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{mib, ms, percentile, Daemon, Report};

const SLOW_LORIS: usize = 10_000;
const CLAIMS: usize = 1_000;
/// What each claiming socket's frame header announces.
const CLAIM: u64 = 100 << 20;
const SAMPLES: usize = 500;

pub async fn run(report: &mut Report) {
    println!("under attack");
    let (upstream_addr, mut upstream) = crate::relay::fake_upstream().await;
    // The upstream side of each relayed claim stays open, as a real change-streamer's would.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(stream) = upstream.recv().await {
            held.push(stream);
        }
    });
    let litestream = crate::util::litestream_stand_in().await;
    let daemon = Daemon::start(&format!(
        "[server]\nlisten = \"{{addr}}\"\n{}[discovery]\nmode = \"off\"\n[upstream]\naddress = \"{upstream_addr}\"\n",
        crate::util::served(&litestream)
    ));
    let addr: SocketAddr = daemon.addr.parse().unwrap();
    crate::util::wait_for_status(&daemon.addr).await;
    let idle = daemon.rss_kib();

    let loris_open = Arc::new(AtomicUsize::new(0));
    let claims_open = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    // Opened in waves, as a real flood ramps up, so that the listener's backlog does not overflow.
    for i in 0..SLOW_LORIS {
        attackers.push(tokio::spawn(slow_loris(addr, i, loris_open.clone())));
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for i in 0..CLAIMS {
        let path = if i % 2 == 0 {
            format!("/replication/v3/snapshot?taskID=claim-{i}")
        } else {
            format!(
                "/replication/v3/changes?taskID=&id=claim-{i}&mode=serving&watermark=0a&replicaVersion=01\
                 &initial=false"
            )
        };
        attackers.push(tokio::spawn(claimer(addr, path, claims_open.clone())));
    }
    let ramp = Instant::now();
    while loris_open.load(Ordering::Relaxed) < SLOW_LORIS * 95 / 100
        && ramp.elapsed() < Duration::from_secs(8)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open_at_measure = loris_open.load(Ordering::Relaxed);

    // Normal reservations one at a time while the attack goes on, with the sidecar's memory sampled throughout.
    let mut to_status = Vec::with_capacity(SAMPLES);
    let mut peak = daemon.rss_kib();
    let url = format!("ws://{addr}/replication/v3/snapshot?taskID=");
    for i in 0..SAMPLES {
        let begin = Instant::now();
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}normal-{i}"))
            .await
            .expect("a normal reservation is accepted under attack");
        match ws.next().await {
            Some(Ok(Message::Text(_))) => {}
            other => panic!("expected the status, got {other:?}"),
        }
        to_status.push(begin.elapsed());
        if i % 25 == 0 {
            peak = peak.max(daemon.rss_kib());
        }
        drop(ws);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    peak = peak.max(daemon.rss_kib());
    for attacker in attackers {
        attacker.abort();
    }
    to_status.sort();

    report.add(
        format!("slow-loris connections open while measured (of {SLOW_LORIS})"),
        open_at_measure.to_string(),
        "",
        None,
    );
    report.add(
        format!(
            "claiming sockets open while measured (of {CLAIMS}; /snapshot ones are closed, 1009)"
        ),
        claims_open.load(Ordering::Relaxed).to_string(),
        "",
        None,
    );
    report.add("resident memory, idle", mib(idle), "", None);
    report.add(
        "resident memory, peak under attack",
        mib(peak),
        "<= 64 MiB",
        Some(peak <= 64 * 1024),
    );
    let p99 = percentile(&to_status, 0.99);
    report.add(
        "reservation connect to status under attack, p50",
        ms(percentile(&to_status, 0.5)),
        "",
        None,
    );
    report.add(
        "reservation connect to status under attack, p99",
        ms(p99),
        "<= 5 ms",
        Some(p99 <= Duration::from_millis(5)),
    );
}

/// A request head that never ends: the request line, then one header byte a second. Reconnects when dropped
/// (server.header_read_timeout), as an attacker would.
async fn slow_loris(addr: SocketAddr, i: usize, open: Arc<AtomicUsize>) {
    loop {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let head = format!(
            "GET /replication/v3/snapshot?taskID=loris-{i} HTTP/1.1\r\nHost: sidecar\r\nX-"
        );
        if stream.write_all(head.as_bytes()).await.is_ok() {
            open.fetch_add(1, Ordering::Relaxed);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if stream.write_all(b"a").await.is_err() {
                    break;
                }
            }
            open.fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A WebSocket that announces a `CLAIM`-byte frame, sends 1 KiB of it, then a byte a second. Reconnects a second
/// after being closed.
async fn claimer(addr: SocketAddr, path: String, open: Arc<AtomicUsize>) {
    loop {
        if let Ok(mut stream) = TcpStream::connect(addr).await {
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            );
            if stream.write_all(request.as_bytes()).await.is_ok() && switched(&mut stream).await {
                let mut frame = vec![0x82u8, 0x80 | 127];
                frame.extend_from_slice(&CLAIM.to_be_bytes());
                frame.extend_from_slice(&[0, 0, 0, 0]);
                frame.extend_from_slice(&[0u8; 1024]);
                if stream.write_all(&frame).await.is_ok() {
                    open.fetch_add(1, Ordering::Relaxed);
                    let mut sink = [0u8; 256];
                    loop {
                        tokio::select! {
                            read = stream.read(&mut sink) => if matches!(read, Ok(0) | Err(_)) { break },
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                                if stream.write_all(b"x").await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    open.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Reads the handshake's answer: whether it is a 101.
async fn switched(stream: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut chunk = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.len() > 8192 {
            return false;
        }
    }
    head.starts_with(b"HTTP/1.1 101")
}
