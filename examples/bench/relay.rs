//! The `/changes` relay: throughput against a plain TCP byte relay over the same stream, added latency of one small
//! frame, and resident memory per relayed subscriber.
//!
//! The upstream is a stand-in for Zero's change-streamer in this process: a hand-made handshake, then frames
//! encoded once (Zero 0.20's msg-first form) and written in large chunks, so that it is never the bottleneck. The
//! subscribers are tokio-tungstenite clients that read every message and ack it, as Zero's client does. The plain
//! relay copies bytes between the same kinds of sockets (`tokio::io::copy_bidirectional`) in a process of its own
//! on the same multi-thread runtime as the sidecar, which is the release binary: the two differ only in what they
//! do with the bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Barrier};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{mib, ms, percentile, Daemon, Report};

/// Messages per stream, the status included.
const FRAMES: usize = 100_000;
const RUNS: usize = 5;
const LATENCY_SAMPLES: usize = 2_000;
const SUBSCRIBERS_FOR_MEMORY: usize = 1_000;
const CONCURRENCY: usize = 64;

pub async fn run(report: &mut Report) {
    println!("changes relay");
    let stream = Arc::new(encode_stream(FRAMES));
    let frame_bytes = stream.len() as f64 / FRAMES as f64;
    let (upstream_addr, mut upstream) = fake_upstream().await;
    let plain_relay = PlainRelay::start(upstream_addr);
    let plain = plain_relay.addr;
    let daemon = Daemon::start(&format!(
        "[server]\nlisten = \"{{addr}}\"\n[litestream]\nbackup_url = \"s3://bench/replica\"\n\
         proxy_listen = \"127.0.0.1:0\"\n[discovery]\nmode = \"off\"\n[upstream]\naddress = \"{upstream_addr}\"\n"
    ));
    let sidecar: SocketAddr = daemon.addr.parse().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for subscribers in [1, 10] {
        let mut plain_rates = Vec::new();
        let mut sidecar_rates = Vec::new();
        let mut sidecar_cpu = Duration::ZERO;
        // Interleaved, so that a noisy neighbour on the machine slows both alike.
        for _ in 0..RUNS {
            plain_rates.push(throughput(plain, &mut upstream, &stream, subscribers).await);
            let cpu = daemon.cpu_time();
            sidecar_rates.push(throughput(sidecar, &mut upstream, &stream, subscribers).await);
            sidecar_cpu += daemon.cpu_time() - cpu;
        }
        let plain_rate = median(&mut plain_rates);
        let sidecar_rate = median(&mut sidecar_rates);
        let show = |rate: f64| {
            format!(
                "{:.0} MB/s, {:.0}k msg/s",
                rate / 1e6,
                rate / frame_bytes / 1e3
            )
        };
        report.add(
            format!("throughput, {subscribers} subscriber(s) x {FRAMES} msgs of ~{frame_bytes:.0} B: plain TCP relay"),
            show(plain_rate),
            "",
            None,
        );
        report.add(
            format!("throughput, {subscribers} subscriber(s): sidecar"),
            show(sidecar_rate),
            "",
            None,
        );
        let ratio = sidecar_rate / plain_rate;
        report.add(
            format!("  sidecar / plain TCP relay, {subscribers} subscriber(s) (median of {RUNS})"),
            format!("{ratio:.2}"),
            ">= 0.9",
            Some(ratio >= 0.9),
        );
        let messages = (FRAMES * subscribers * RUNS) as f64;
        report.add(
            "  sidecar CPU per relayed message (and its ack)",
            format!("{:.2} us", sidecar_cpu.as_secs_f64() * 1e6 / messages),
            "",
            None,
        );
    }

    let direct = latencies(upstream_addr, &mut upstream).await;
    let relayed = latencies(sidecar, &mut upstream).await;
    report.add(
        "one small message, upstream write to subscriber read, p50: direct / sidecar",
        format!(
            "{} / {}",
            ms(percentile(&direct, 0.5)),
            ms(percentile(&relayed, 0.5))
        ),
        "",
        None,
    );
    let added = percentile(&relayed, 0.99).saturating_sub(percentile(&direct, 0.99));
    report.add(
        format!(
            "  added latency p99 (sidecar {} - direct {})",
            ms(percentile(&relayed, 0.99)),
            ms(percentile(&direct, 0.99))
        ),
        ms(added),
        "<= 1 ms",
        Some(added <= Duration::from_millis(1)),
    );

    memory(&daemon, sidecar, &mut upstream, report).await;
}

/// Connects `subscribers` clients through `relay`, then lets every upstream connection write the whole stream at
/// once; bytes per second over all subscribers, until the last one has read (and acked) everything.
async fn throughput(
    relay: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
    stream: &Arc<Vec<u8>>,
    subscribers: usize,
) -> f64 {
    let barrier = Arc::new(Barrier::new(subscribers + 1));
    let mut clients = Vec::new();
    for i in 0..subscribers {
        let client = subscribe(relay, &format!("throughput-{i}")).await;
        let conn = upstream.recv().await.expect("upstream connection");
        let barrier = barrier.clone();
        let stream = stream.clone();
        tokio::spawn(async move {
            let (mut read, mut write) = conn.into_split();
            // Acks are read and dropped until the relay closes the connection.
            let acks = tokio::spawn(async move {
                let mut sink = vec![0u8; 64 << 10];
                while matches!(read.read(&mut sink).await, Ok(n) if n > 0) {}
            });
            barrier.wait().await;
            let _ = write.write_all(&stream).await;
            let _ = acks.await;
        });
        clients.push(tokio::spawn(read_all(client, FRAMES)));
    }
    barrier.wait().await;
    let started = Instant::now();
    for client in clients {
        client.await.expect("subscriber");
    }
    let elapsed = started.elapsed();
    (stream.len() * subscribers) as f64 / elapsed.as_secs_f64()
}

type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

async fn subscribe(relay: SocketAddr, id: &str) -> Client {
    let url = format!(
        "ws://{relay}/replication/v3/changes?taskID=&id={id}&mode=serving&watermark=0a&replicaVersion=01&initial=false"
    );
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(256 << 20);
    config.max_frame_size = Some(256 << 20);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true)
        .await
        .expect("subscribe");
    ws
}

/// Reads `count` messages, acking each in order as Zero's client does (the acks of one read burst go out in one
/// write), then closes.
async fn read_all(ws: Client, count: usize) {
    let (mut sink, stream) = ws.split();
    let mut messages = stream.ready_chunks(1024);
    let mut seen = 0usize;
    while seen < count {
        let chunk = messages.next().await.expect("stream ended early");
        for message in chunk {
            match message.expect("read") {
                Message::Text(_) => {
                    seen += 1;
                    sink.feed(Message::Text(format!("{{\"ack\":{seen}}}").into()))
                        .await
                        .expect("ack");
                }
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        sink.flush().await.expect("flush acks");
    }
    let _ = sink.close().await;
}

/// One small message at a time, written by the upstream and timed until the subscriber has read it.
async fn latencies(
    relay: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
) -> Vec<Duration> {
    let mut client = subscribe(relay, "latency").await;
    let mut conn = upstream.recv().await.expect("upstream connection");
    let frame = encode_frame(&format!(
        r#"{{"msg":{},"id":1}}"#,
        r#"["status",{"tag":"status"}]"#
    ));
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for i in 0..LATENCY_SAMPLES + 100 {
        let begin = Instant::now();
        conn.write_all(&frame).await.unwrap();
        loop {
            match client.next().await {
                Some(Ok(Message::Text(_))) => break,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
        if i >= 100 {
            samples.push(begin.elapsed());
        }
        // Idle between samples, as a quiet subscription is.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    samples.sort();
    samples
}

/// 1,000 subscriptions held open, each having received a status and one transaction and acked them.
async fn memory(
    daemon: &Daemon,
    sidecar: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
    report: &mut Report,
) {
    let small = encode_stream(4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = daemon.rss_kib();
    // The upstream side writes the small stream on every connection and holds it open.
    let feeding = async {
        let mut held = Vec::with_capacity(SUBSCRIBERS_FOR_MEMORY);
        while held.len() < SUBSCRIBERS_FOR_MEMORY {
            let mut conn = upstream.recv().await.expect("upstream connection");
            conn.write_all(&small).await.unwrap();
            held.push(conn);
        }
        held
    };
    let opening = futures_util::stream::iter(0..SUBSCRIBERS_FOR_MEMORY)
        .map(|i| async move {
            let mut ws = subscribe(sidecar, &format!("memory-{i}")).await;
            for id in 1..=4 {
                loop {
                    match ws.next().await {
                        Some(Ok(Message::Text(_))) => break,
                        Some(Ok(_)) => continue,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                ws.send(Message::Text(format!("{{\"ack\":{id}}}").into()))
                    .await
                    .unwrap();
            }
            ws
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>();
    let (held, clients) = tokio::join!(feeding, opening);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = daemon.rss_kib();
    let growth = after.saturating_sub(before);
    let per = growth as f64 / SUBSCRIBERS_FOR_MEMORY as f64;
    report.add(
        format!("resident memory growth, {SUBSCRIBERS_FOR_MEMORY} relayed subscribers"),
        mib(growth),
        "",
        None,
    );
    report.add(
        "  per relayed subscriber (both of its sockets)",
        format!("{per:.1} KiB"),
        "<= 64 KiB",
        Some(per <= 64.0),
    );
    drop(clients);
    drop(held);
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// A stand-in change-streamer: accepts WebSocket upgrades on any path and hands each raw socket, after its 101,
/// to the bench.
pub async fn fake_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                if accept_upgrade(&mut stream).await.is_ok() {
                    let _ = tx.send(stream);
                }
            });
        }
    });
    (addr, rx)
}

async fn accept_upgrade(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut byte).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&byte[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let key = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_string())
        })
        .ok_or(std::io::ErrorKind::InvalidData)?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    stream.write_all(response.as_bytes()).await
}

/// The plain byte relay as a process of its own, like the sidecar, on the same kind of runtime: this bench
/// binary run again with `plain-relay <upstream>`. Killed when dropped.
struct PlainRelay {
    child: std::process::Child,
    addr: SocketAddr,
}

impl PlainRelay {
    fn start(upstream: SocketAddr) -> PlainRelay {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["plain-relay", &upstream.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the plain relay");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().parse().expect("the plain relay's address");
        PlainRelay { child, addr }
    }
}

impl Drop for PlainRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plain relay's process: accept, connect upstream, copy bytes both ways; prints its address first.
pub fn plain_relay_main(upstream: &str) {
    let upstream: SocketAddr = upstream.parse().expect("upstream address");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
}

/// The status, then transactions of a begin, eight data messages and a commit, as Zero 0.20 frames them.
fn encode_stream(frames: usize) -> Vec<u8> {
    let filler = "x".repeat(120);
    let mut out = Vec::new();
    out.extend(encode_frame(
        r#"{"msg":["status",{"tag":"status"}],"id":1}"#,
    ));
    for id in 2..=frames as u64 {
        let tx = (id - 2) / 10;
        let watermark = format!("7{tx:010}");
        let msg = match (id - 2) % 10 {
            0 => format!(
                r#"["begin",{{"tag":"begin","commitLsn":"16/B374D9A0","commitTime":1746600001234567,"xid":{tx},"json":"s"}},{{"commitWatermark":"{watermark}"}}]"#
            ),
            9 => format!(
                r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","commitEndLsn":"16/B374D9D0","commitTime":1746600001234567}},{{"watermark":"{watermark}"}}]"#
            ),
            n => format!(
                r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"issue","keyColumns":["id"],"replicaIdentity":"default"}},"new":{{"id":"i{tx}-{n}","big":9007199254740993,"title":"{filler}"}}}}]"#
            ),
        };
        out.extend(encode_frame(&format!(r#"{{"msg":{msg},"id":{id}}}"#)));
    }
    out
}

/// One unmasked text frame, as a server sends it.
fn encode_frame(text: &str) -> Vec<u8> {
    let len = text.len();
    let mut frame = vec![0x81];
    if len < 126 {
        frame.push(len as u8);
    } else if len <= u16::MAX as usize {
        frame.push(126);
        frame.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        frame.push(127);
        frame.extend_from_slice(&(len as u64).to_be_bytes());
    }
    frame.extend_from_slice(text.as_bytes());
    frame
}
