//! Snapshot reservations: idle memory, memory for 10,000 open reservations, upgrade-to-status latency.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{mib, ms, percentile, Daemon, Report};

const CONNECTIONS: usize = 10_000;
const CONCURRENCY: usize = 64;

pub async fn run(report: &mut Report) {
    println!("snapshot reservations");
    let litestream = crate::util::litestream_stand_in().await;
    let daemon = Daemon::start(&format!(
        "[server]\nlisten = \"{{addr}}\"\n{}[discovery]\nmode = \"off\"\n",
        crate::util::served(&litestream)
    ));
    crate::util::wait_for_status(&daemon.addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = daemon.rss_kib();
    report.add(
        "idle resident memory",
        mib(idle),
        "<= 10 MiB",
        Some(idle <= 10 * 1024),
    );

    let url = format!("ws://{}/replication/v3/snapshot?taskID=", daemon.addr);
    let started = Instant::now();
    let mut sockets = Vec::with_capacity(CONNECTIONS);
    let mut pending = futures_util::stream::iter(0..CONNECTIONS)
        .map(|i| reserve(format!("{url}bench-{i}")))
        .buffer_unordered(CONCURRENCY);
    let mut totals = Vec::with_capacity(CONNECTIONS);
    while let Some((ws, _, total)) = pending.next().await {
        totals.push(total);
        sockets.push(ws);
    }
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = daemon.rss_kib();
    totals.sort();
    let growth = loaded.saturating_sub(idle);
    report.add(
        format!("resident memory growth, {CONNECTIONS} open reservations"),
        mib(growth),
        "<= 40 MiB",
        Some(growth <= 40 * 1024),
    );
    report.add(
        "  per reservation",
        format!("{:.2} KiB", growth as f64 / CONNECTIONS as f64),
        "",
        None,
    );
    report.add(
        format!("connect + handshake + status, p99 while opening ({CONCURRENCY} at a time)"),
        ms(percentile(&totals, 0.99)),
        "",
        None,
    );

    // Latency one at a time, with the 10,000 reservations still open: the client is idle between samples, so
    // the figure is the sidecar's, not the load generator's.
    let mut to_status = Vec::new();
    let mut handshake_and_status = Vec::new();
    for i in 0..1000 {
        let (_ws, upgrade_to_status, total) = reserve(format!("{url}latency-{i}")).await;
        to_status.push(upgrade_to_status);
        handshake_and_status.push(total);
    }
    to_status.sort();
    handshake_and_status.sort();
    let p99 = percentile(&to_status, 0.99);
    report.add(
        "upgrade to status frame, p50 (10,000 open)",
        ms(percentile(&to_status, 0.5)),
        "",
        None,
    );
    report.add(
        "upgrade to status frame, p99 (10,000 open)",
        ms(p99),
        "<= 5 ms",
        Some(p99 <= Duration::from_millis(5)),
    );
    report.add(
        "connect + upgrade + status, p99 (10,000 open)",
        ms(percentile(&handshake_and_status, 0.99)),
        "",
        None,
    );
    report.add(
        format!("time to open {CONNECTIONS} reservations ({CONCURRENCY} at a time)"),
        format!("{:.2} s", elapsed.as_secs_f64()),
        "",
        None,
    );
    drop(sockets);
}

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens one reservation: the socket, the time from the completed upgrade to the status frame, and the time from
/// connecting to the status frame.
async fn reserve(url: String) -> (Client, Duration, Duration) {
    let begin = Instant::now();
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    let upgraded = Instant::now();
    match ws.next().await {
        Some(Ok(Message::Text(_))) => {}
        other => panic!("expected the status, got {other:?}"),
    }
    let now = Instant::now();
    (ws, now - upgraded, now - begin)
}
