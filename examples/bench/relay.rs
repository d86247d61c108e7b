//! The `/changes` relay beside a plain TCP byte relay and nginx, on Zero's traffic shapes: messages per second, the
//! relay process's CPU time per message (and its part in user space, apart from the kernel's TCP work), resident memory, the latency it adds to one small message, and memory per
//! relayed subscriber.
//!
//! The upstream is a stand-in for Zero's change-streamer in this process: a hand-made handshake, then frames
//! encoded once (Zero 0.20's msg-first form) and written in large chunks, so that it is never the bottleneck; and
//! Zero 1.9's own frames, recorded from a real change-streamer (`zero_stream`), written a message at a time as
//! Zero writes them, caught up on at once or live, a transaction at a time. The
//! subscribers are tokio-tungstenite clients that read every message and ack it in a write of its own, as Zero's
//! client does. The plain relay copies bytes between the same kinds of sockets (`tokio::io::copy_bidirectional`
//! on tokio's multi-thread runtime) in a process of its own; the sidecar is the release binary with its defaults,
//! and again with `relay.ack_wakeup_bytes = 0` (woken for every ack), to show what gathering acks saves; with
//! `BENCH_BASELINE_BIN` set, another build (an earlier commit's) runs beside them with the same defaults, so that a
//! change is measured against what it changes in the same runs. All run interleaved, so that a noisy neighbour on
//! the machine slows all alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Barrier};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use litestream_sidecar::protocol::{close, unsupported_version, CHANGES_VERSIONS};
use litestream_sidecar::streamer::relay::probe::PROBE_PATH;

use crate::util::{cpu_time_of, mib, ms, percentile, rss_kib_of, user_time_of, Daemon, Report};

/// Messages per stream, the status included.
const FRAMES: usize = 100_000;
/// Live trickle: transactions written one at a time, each once the subscriber acked the previous one.
const TRICKLE_TRANSACTIONS: usize = 2_000;
const TRICKLE_ROWS: usize = 3;
/// Messages of 1 MiB written at once.
const BIG_MESSAGES: usize = 50;

/// Zero's traffic shapes.
#[derive(Debug, Clone, Copy)]
enum Workload {
    CatchUp,
    Trickle,
    Big,
    /// Zero 1.9's recorded stream (`zero_stream`) written as its change-streamer writes it, one write a message,
    /// all at once: a subscriber catching up.
    ZeroCatchUp,
    /// The same, one transaction at a time, each once the subscriber acked the one before: a subscriber keeping up.
    ZeroLive,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::CatchUp => "catch-up",
            Workload::Trickle => "live trickle",
            Workload::Big => "1 MiB messages",
            Workload::ZeroCatchUp => "Zero 1.9's stream, catch-up",
            Workload::ZeroLive => "Zero 1.9's stream, live",
        }
    }
}
const RUNS: usize = 8;
/// The sidecar with `relay.ack_wakeup_bytes = 0`.
const EVERY_ACK: &str = "sidecar, woken for every ack";
/// `BENCH_BASELINE_BIN`'s build, with the sidecar's defaults.
const BASELINE: &str = "sidecar, baseline build";
const LATENCY_SAMPLES: usize = 2_000;
const SUBSCRIBERS_FOR_MEMORY: usize = 1_000;
const CONCURRENCY: usize = 64;

/// A relay under measurement: its name, address and process, and the messages per second and CPU time of each
/// run.
type Measured<'a> = (&'a str, SocketAddr, u32, Vec<f64>, Vec<Duration>);

/// What [`run`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every workload, then latency and memory.
    All,
    /// The workloads of Zero 1.9's recorded stream only (`make bench BENCH=zero-traffic`).
    ZeroTraffic,
}

pub async fn run(report: &mut Report, scope: Scope) {
    println!("changes relay");
    let stream = Arc::new(vec![encode_stream(FRAMES)]);
    let frame_bytes = stream[0].len() as f64 / FRAMES as f64;
    let zero = Arc::new(ZeroStream::recorded());
    println!("  catch-up: {FRAMES} messages of ~{frame_bytes:.0} B written at once; trickle: {TRICKLE_TRANSACTIONS} transactions of {TRICKLE_ROWS} rows, each written once the previous one's acks arrived; 1 MiB: {BIG_MESSAGES} messages of 1 MiB");
    println!("  Zero 1.9's stream: {} messages ({} transactions, {:.0} B a message on average) as recorded, one write a message", zero.frames.len(), zero.units.len() - 1, zero.bytes as f64 / zero.frames.len() as f64);
    let (upstream_addr, mut upstream) = fake_upstream().await;
    let plain_relay = PlainRelay::start(upstream_addr);
    let plain = plain_relay.addr;
    let config = format!(
        "[server]\nlisten = \"{{addr}}\"\n[litestream]\nbackup_url = \"s3://bench/replica\"\n\
         proxy_listen = \"127.0.0.1:0\"\n[discovery]\nmode = \"off\"\n[upstream]\naddress = \"{upstream_addr}\"\n"
    );
    let daemon = Daemon::start(&config);
    let sidecar: SocketAddr = daemon.addr.parse().unwrap();
    // The same build woken for every ack, to show what gathering them in the kernel saves.
    let every_ack = Daemon::start(&format!("{config}[relay]\nack_wakeup_bytes = 0\n"));
    let baseline = std::env::var_os("BENCH_BASELINE_BIN")
        .filter(|binary| !binary.is_empty())
        .map(|binary| Daemon::start_binary(std::path::Path::new(&binary), &config));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let nginx = Nginx::start(upstream_addr);
    if nginx.is_none() {
        println!("  (no nginx: set NGINX to its binary, as `make bench` does, to compare with it)");
    }
    let big = Arc::new(vec![encode_big(BIG_MESSAGES)]);
    let workloads = [
        (Workload::CatchUp, &[1usize, 10][..]),
        (Workload::Trickle, &[1, 10][..]),
        (Workload::Big, &[1][..]),
        (Workload::ZeroCatchUp, &[10][..]),
        (Workload::ZeroLive, &[10][..]),
    ];
    let zero_only = scope == Scope::ZeroTraffic;
    for (workload, subscriber_counts) in workloads
        .into_iter()
        .filter(|(w, _)| !zero_only || matches!(w, Workload::ZeroCatchUp | Workload::ZeroLive))
    {
        for &subscribers in subscriber_counts {
            // One entry per relay: messages per second and CPU time of each run (the ratios of one run to the next
            // show the spread).
            let mut relays: Vec<Measured> = vec![
                (
                    "plain TCP relay",
                    plain,
                    plain_relay.child.id(),
                    Vec::new(),
                    Vec::new(),
                ),
                (
                    "sidecar",
                    sidecar,
                    daemon.child.id(),
                    Vec::new(),
                    Vec::new(),
                ),
                (
                    EVERY_ACK,
                    every_ack.addr.parse().unwrap(),
                    every_ack.child.id(),
                    Vec::new(),
                    Vec::new(),
                ),
            ];
            if let Some(baseline) = &baseline {
                relays.push((
                    BASELINE,
                    baseline.addr.parse().unwrap(),
                    baseline.child.id(),
                    Vec::new(),
                    Vec::new(),
                ));
            }
            if let Some(nginx) = &nginx {
                relays.insert(
                    1,
                    (
                        "nginx",
                        nginx.addr,
                        nginx.child.id(),
                        Vec::new(),
                        Vec::new(),
                    ),
                );
            }
            let mut messages = 0;
            // Each relay's CPU time in user space over all runs: its own code, beside the kernel's work for it.
            let mut user = std::collections::HashMap::new();
            // Interleaved, so that a noisy neighbour on the machine slows all alike.
            for _ in 0..RUNS {
                for (name, addr, pid, rates, cpu) in relays.iter_mut() {
                    let before = cpu_time_of(*pid);
                    let user_before = user_time_of(*pid);
                    let started = Instant::now();
                    let count = match workload {
                        Workload::CatchUp => {
                            throughput(*addr, &mut upstream, &stream, FRAMES, subscribers).await
                        }
                        Workload::Trickle => trickle(*addr, &mut upstream, subscribers).await,
                        Workload::Big => {
                            throughput(*addr, &mut upstream, &big, BIG_MESSAGES + 1, subscribers)
                                .await
                        }
                        Workload::ZeroCatchUp => {
                            throughput(
                                *addr,
                                &mut upstream,
                                &zero.frames,
                                zero.frames.len(),
                                subscribers,
                            )
                            .await
                        }
                        Workload::ZeroLive => {
                            replay_live(*addr, &mut upstream, &zero, subscribers).await
                        }
                    };
                    rates.push(count as f64 / started.elapsed().as_secs_f64());
                    cpu.push(cpu_time_of(*pid) - before);
                    *user.entry(*name).or_insert(Duration::ZERO) +=
                        user_time_of(*pid).saturating_sub(user_before);
                    messages = count;
                }
            }
            let name_of = workload.name();
            let mut medians = std::collections::HashMap::new();
            let mut cpu_per_message = std::collections::HashMap::new();
            let mut kernel_per_message = std::collections::HashMap::new();
            for (name, _, _, rates, cpu) in relays.iter_mut() {
                let rate = median(rates);
                let per_message =
                    |time: Duration| time.as_secs_f64() * 1e6 / (messages * RUNS) as f64;
                let per = per_message(cpu.iter().sum());
                let in_user = per_message(user[name]).min(per);
                report.add(
                    format!("{name_of}, {subscribers} sub: {name}"),
                    format!(
                        "{:.1}k msg/s, {per:.2} us CPU/msg ({in_user:.2} user)",
                        rate / 1e3
                    ),
                    "",
                    None,
                );
                medians.insert(*name, rate);
                cpu_per_message.insert(*name, per);
                kernel_per_message.insert(*name, per - in_user);
            }
            report.add(
                "  sidecar / the same woken for every ack, CPU per message",
                format!(
                    "{:.2}",
                    cpu_per_message["sidecar"] / cpu_per_message[EVERY_ACK]
                ),
                "",
                None,
            );
            // The lowest and highest ratio of one run's CPU times, the runs being interleaved.
            let spread = |a: &str, b: &str| {
                let runs = |name: &str| &relays.iter().find(|r| r.0 == name).unwrap().4;
                let ratios = runs(a)
                    .iter()
                    .zip(runs(b))
                    .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64());
                let (low, high) = ratios.fold((f64::MAX, 0f64), |(l, h), r| (l.min(r), h.max(r)));
                format!("runs {low:.2}-{high:.2}")
            };
            if baseline.is_some() {
                let user = |name: &str| cpu_per_message[name] - kernel_per_message[name];
                report.add(
                    "  sidecar / the baseline build, CPU per message (user space)",
                    format!(
                        "{:.2} ({:.2}; {})",
                        cpu_per_message["sidecar"] / cpu_per_message[BASELINE],
                        user("sidecar") / user(BASELINE),
                        spread("sidecar", BASELINE)
                    ),
                    "",
                    None,
                );
            }
            let ratio = medians["sidecar"] / medians["plain TCP relay"];
            let target = if subscribers == 1 { 0.9 } else { 0.95 };
            report.add(
                format!("  sidecar / plain TCP relay, msg/s (median of {RUNS})"),
                format!("{ratio:.2}"),
                format!(">= {target}"),
                Some(ratio >= target),
            );
            if nginx.is_some() {
                report.add(
                    "  nginx / plain TCP relay, msg/s",
                    format!("{:.2}", medians["nginx"] / medians["plain TCP relay"]),
                    "",
                    None,
                );
                let cpu = cpu_per_message["sidecar"] / cpu_per_message["nginx"];
                report.add(
                    "  sidecar / nginx, CPU per message",
                    format!("{cpu:.2} ({})", spread("sidecar", "nginx")),
                    "<= 0.8",
                    Some(cpu <= 0.8),
                );
                // The kernel's share alone: what fewer reads, writes and wake-ups save, apart from the relay's code.
                report.add(
                    "  sidecar / nginx, kernel CPU per message",
                    format!(
                        "{:.2}",
                        kernel_per_message["sidecar"] / kernel_per_message["nginx"]
                    ),
                    "",
                    None,
                );
            }
        }
    }

    if zero_only {
        return;
    }
    // Resident memory of each relay once every workload has been through it.
    let mut relays = vec![
        ("plain TCP relay", plain, plain_relay.child.id()),
        ("sidecar", sidecar, daemon.child.id()),
    ];
    if let Some(nginx) = &nginx {
        relays.insert(1, ("nginx", nginx.addr, nginx.child.id()));
    }
    for (name, _, pid) in &relays {
        report.add(
            format!("resident memory after the runs: {name}"),
            mib(rss_kib_of(*pid)),
            "",
            None,
        );
    }
    let direct = latencies(upstream_addr, &mut upstream).await;
    report.add(
        "one small message, upstream write to subscriber read, p50 / p99: direct",
        format!(
            "{} / {}",
            ms(percentile(&direct, 0.5)),
            ms(percentile(&direct, 0.99))
        ),
        "",
        None,
    );
    let mut p99 = std::collections::HashMap::new();
    for (name, addr, _) in &relays {
        let relayed = latencies(*addr, &mut upstream).await;
        let added = |q| percentile(&relayed, q).saturating_sub(percentile(&direct, q));
        report.add(
            format!("  through {name}, p50 / p99 (added p50 / p99)"),
            format!(
                "{} / {} ({} / {})",
                ms(percentile(&relayed, 0.5)),
                ms(percentile(&relayed, 0.99)),
                ms(added(0.5)),
                ms(added(0.99))
            ),
            "",
            None,
        );
        p99.insert(*name, (percentile(&relayed, 0.99), added(0.99)));
    }
    let (sidecar_p99, sidecar_added) = p99["sidecar"];
    if nginx.is_some() {
        let nginx_p99 = p99["nginx"].0;
        report.add(
            "  sidecar p99 / nginx p99",
            format!("{} / {}", ms(sidecar_p99), ms(nginx_p99)),
            "sidecar <= nginx",
            Some(sidecar_p99 <= nginx_p99),
        );
    }
    report.add(
        "  added latency p99 through the sidecar",
        ms(sidecar_added),
        "<= 1 ms",
        Some(sidecar_added <= Duration::from_millis(1)),
    );

    memory(&daemon, sidecar, &mut upstream, report).await;
}

/// Connects `subscribers` clients through `relay`, then lets every upstream connection write the whole stream at
/// once, a write per element of `stream` (Zero writes each message on its own, with `TCP_NODELAY`, as Node's `ws`
/// does); messages relayed over all subscribers, once the last one has read (and acked) everything.
async fn throughput(
    relay: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
    stream: &Arc<Vec<Vec<u8>>>,
    count: usize,
    subscribers: usize,
) -> usize {
    let barrier = Arc::new(Barrier::new(subscribers + 1));
    let mut clients = Vec::new();
    for i in 0..subscribers {
        let client = subscribe(relay, &format!("throughput-{i}")).await;
        let conn = upstream.recv().await.expect("upstream connection");
        conn.set_nodelay(true).expect("TCP_NODELAY");
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
            for chunk in stream.iter() {
                if write.write_all(chunk).await.is_err() {
                    break;
                }
            }
            let _ = acks.await;
        });
        clients.push(tokio::spawn(read_all(client, count)));
    }
    barrier.wait().await;
    for client in clients {
        client.await.expect("subscriber");
    }
    count * subscribers
}

/// Live trickle: on each subscription the upstream writes the status, then one transaction at a time (begin,
/// rows, commit), each once the acks of everything before it came back through the relay. Messages relayed.
async fn trickle(
    relay: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
    subscribers: usize,
) -> usize {
    let per_subscriber = 1 + TRICKLE_TRANSACTIONS * (TRICKLE_ROWS + 2);
    let mut clients = Vec::new();
    let mut feeders = Vec::new();
    for i in 0..subscribers {
        let client = subscribe(relay, &format!("trickle-{i}")).await;
        let mut conn = upstream.recv().await.expect("upstream connection");
        feeders.push(tokio::spawn(async move {
            conn.write_all(&encode_frame(
                r#"{"msg":["status",{"tag":"status"}],"id":1}"#,
            ))
            .await
            .unwrap();
            let mut acks = AckCounter::default();
            acks.wait_for(&mut conn, 1).await;
            let mut id = 2u64;
            for tx in 0..TRICKLE_TRANSACTIONS as u64 {
                let frames = transaction(&mut id, tx, TRICKLE_ROWS);
                conn.write_all(&frames).await.unwrap();
                acks.wait_for(&mut conn, id - 1).await;
            }
            conn
        }));
        clients.push(tokio::spawn(read_all(client, per_subscriber)));
    }
    join_live(clients, feeders).await;
    per_subscriber * subscribers
}

/// Zero 1.9's recorded stream (`zero_stream`), encoded as its change-streamer sends it.
struct ZeroStream {
    /// Every message's frame, in order: one write each.
    frames: Arc<Vec<Vec<u8>>>,
    /// The frames before the first transaction (the status), then each transaction's, as ranges of `frames`: what
    /// the live replay writes before it waits for the acks. Zero numbers the messages 1, 2, 3…, so the last id of
    /// a unit is its end.
    units: Vec<std::ops::Range<usize>>,
    bytes: usize,
}

impl ZeroStream {
    fn recorded() -> Self {
        let messages = crate::zero_stream::messages();
        let transactions = crate::zero_stream::transactions(&messages);
        let offset = |slice: &[&str]| {
            (slice.as_ptr() as usize - messages.as_ptr() as usize) / std::mem::size_of::<&str>()
        };
        let first = transactions.first().map_or(messages.len(), |t| offset(t));
        let mut units = Vec::with_capacity(transactions.len() + 1);
        units.push(0..first);
        let mut end = first;
        for transaction in &transactions {
            let start = offset(transaction);
            assert_eq!(start, end, "nothing but transactions follows the status");
            end = start + transaction.len();
            units.push(start..end);
        }
        assert_eq!(end, messages.len(), "the recording ends with a transaction");
        for (i, message) in messages.iter().enumerate() {
            assert!(
                message.starts_with(&format!("{{\"id\":{},", i + 1)),
                "message {} is numbered as Zero numbers them",
                i + 1
            );
        }
        let frames: Vec<Vec<u8>> = messages.iter().map(|m| encode_frame(m)).collect();
        let bytes = frames.iter().map(Vec::len).sum();
        Self {
            frames: Arc::new(frames),
            units,
            bytes,
        }
    }
}

/// Zero's live stream: on each subscription the upstream writes the recording a unit at a time (the status, then
/// one transaction), a write a message, each unit once every message before it was acked through the relay.
/// Messages relayed.
async fn replay_live(
    relay: SocketAddr,
    upstream: &mut mpsc::UnboundedReceiver<TcpStream>,
    zero: &Arc<ZeroStream>,
    subscribers: usize,
) -> usize {
    let per_subscriber = zero.frames.len();
    let mut clients = Vec::new();
    let mut feeders = Vec::new();
    for i in 0..subscribers {
        let client = subscribe(relay, &format!("zero-live-{i}")).await;
        let mut conn = upstream.recv().await.expect("upstream connection");
        conn.set_nodelay(true).expect("TCP_NODELAY");
        let zero = zero.clone();
        feeders.push(tokio::spawn(async move {
            let mut acks = AckCounter::default();
            for unit in &zero.units {
                for frame in &zero.frames[unit.clone()] {
                    conn.write_all(frame).await.unwrap();
                }
                acks.wait_for(&mut conn, unit.end as u64).await;
            }
            conn
        }));
        clients.push(tokio::spawn(read_all(client, per_subscriber)));
    }
    join_live(clients, feeders).await;
    per_subscriber * subscribers
}

/// Waits for a live workload's subscribers to have read everything, then closes its upstream connections.
async fn join_live(
    clients: Vec<tokio::task::JoinHandle<()>>,
    feeders: Vec<tokio::task::JoinHandle<TcpStream>>,
) {
    for client in clients {
        client.await.expect("subscriber");
    }
    for feeder in feeders {
        drop(feeder.await.expect("upstream side"));
    }
}

/// Counts the ack frames (masked, short) a subscriber's acks arrive in on the upstream's socket.
#[derive(Default)]
struct AckCounter {
    buffer: Vec<u8>,
    seen: u64,
}

impl AckCounter {
    async fn wait_for(&mut self, conn: &mut TcpStream, acks: u64) {
        let mut chunk = [0u8; 4096];
        while self.seen < acks {
            let n = conn.read(&mut chunk).await.expect("acks");
            assert!(n > 0, "the relay closed the upstream connection");
            self.buffer.extend_from_slice(&chunk[..n]);
            let mut at = 0;
            while self.buffer.len() >= at + 2 {
                let len = (self.buffer[at + 1] & 0x7f) as usize;
                assert!(len < 126, "an ack is short");
                let frame = 2 + 4 + len;
                if self.buffer.len() < at + frame {
                    break;
                }
                if self.buffer[at] & 0x0f == 0x1 {
                    self.seen += 1;
                }
                at += frame;
            }
            self.buffer.drain(..at);
        }
    }
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

/// Reads `count` messages, acking each in order as Zero's client does: one ack per message, written on its own as
/// soon as the message is consumed (docs/protocol.md, "Frames and acks"). Then closes.
async fn read_all(ws: Client, count: usize) {
    let (mut sink, mut messages) = ws.split();
    let mut seen = 0usize;
    while seen < count {
        match messages
            .next()
            .await
            .expect("stream ended early")
            .expect("read")
        {
            Message::Text(_) => {
                seen += 1;
                sink.send(Message::Text(format!("{{\"ack\":{seen}}}").into()))
                    .await
                    .expect("ack");
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
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
                match accept_upgrade(&mut stream).await {
                    // The sidecar's protocol probe, refused as Zero 1.9 refuses it (docs/protocol.md, "Protocol
                    // versions the upstream serves"): it is no subscriber, and the bench's subscriptions are not
                    // kept waiting on what it learns.
                    Ok(path) if path == PROBE_PATH => {
                        let _ = stream.write_all(&refusal_of_v0()).await;
                    }
                    Ok(_) => {
                        let _ = tx.send(stream);
                    }
                    Err(_) => {}
                }
            });
        }
    });
    (addr, rx)
}

/// Answers a WebSocket upgrade, returning the request's path.
async fn accept_upgrade(stream: &mut TcpStream) -> std::io::Result<String> {
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
    let path = head
        .split(' ')
        .nth(1)
        .ok_or(std::io::ErrorKind::InvalidData)?
        .to_string();
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
    stream.write_all(response.as_bytes()).await?;
    Ok(path)
}

/// The close frame Zero 1.9 ends a `/replication/v0/changes` socket with: 1002 and its refusal's text.
fn refusal_of_v0() -> Vec<u8> {
    let reason = unsupported_version(0, &CHANGES_VERSIONS);
    let mut frame = vec![0x88, (2 + reason.len()) as u8];
    frame.extend_from_slice(&close::PROTOCOL_ERROR.to_be_bytes());
    frame.extend_from_slice(reason.as_bytes());
    frame
}

/// nginx as a WebSocket proxy in front of the same upstream, as an operator without the sidecar would run it:
/// Debian's binary (`$NGINX`), one worker process and no master (so its CPU time is one process's), its config
/// and temp files in a temp dir. Stopped when dropped.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(upstream: SocketAddr) -> Option<Nginx> {
        let binary = std::env::var("NGINX").ok().filter(|b| !b.is_empty())?;
        let dir = tempfile::tempdir().unwrap();
        let addr = crate::util::free_addr();
        let d = dir.path().display();
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               map $http_upgrade $connection_upgrade {{ default upgrade; \"\" close; }}\n\
               server {{\n    listen {addr};\n    location / {{\n      proxy_pass http://{upstream};\n\
                 proxy_http_version 1.1;\n      proxy_set_header Upgrade $http_upgrade;\n\
                 proxy_set_header Connection $connection_upgrade;\n      proxy_read_timeout 3600s;\n\
                 proxy_send_timeout 3600s;\n      proxy_buffering off;\n      tcp_nodelay on;\n    }}\n  }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, config).unwrap();
        let mut child = std::process::Command::new(&binary)
            // nginx reads `NGINX` as a list of inherited listening sockets; the bench's is the binary's path.
            .env_remove("NGINX")
            .args([
                "-p",
                &d.to_string(),
                "-c",
                path.to_str().unwrap(),
                "-e",
                "stderr",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|err| println!("  (nginx {binary} did not start: {err})"))
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            if child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
                let _ = child.kill();
                println!("  (nginx did not start listening)");
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Nginx {
            child,
            addr: addr.parse().unwrap(),
            _dir: dir,
        })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plain byte relay as a process of its own, like the sidecar, on the same kind of runtime: this bench
/// binary run again with `plain-relay <upstream>`. Killed when dropped.
pub struct PlainRelay {
    pub child: std::process::Child,
    pub addr: SocketAddr,
}

impl PlainRelay {
    pub fn start(upstream: SocketAddr) -> PlainRelay {
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

/// One transaction as Zero 0.20 frames it: begin, `rows` inserts, commit; `id` is the next message id.
fn transaction(id: &mut u64, tx: u64, rows: usize) -> Vec<u8> {
    let watermark = format!("7{tx:010}");
    let mut out = Vec::new();
    let mut push = |msg: String| {
        out.extend(encode_frame(&format!(r#"{{"msg":{msg},"id":{id}}}"#)));
        *id += 1;
    };
    push(format!(
        r#"["begin",{{"tag":"begin","commitLsn":"16/B374D9A0","commitTime":1746600001234567,"xid":{tx},"json":"s"}},{{"commitWatermark":"{watermark}"}}]"#
    ));
    for n in 0..rows {
        push(format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"issue","keyColumns":["id"],"replicaIdentity":"default"}},"new":{{"id":"i{tx}-{n}","big":9007199254740993,"title":"{}"}}}}]"#,
            "x".repeat(120)
        ));
    }
    push(format!(
        r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","commitEndLsn":"16/B374D9D0","commitTime":1746600001234567}},{{"watermark":"{watermark}"}}]"#
    ));
    out
}

/// The status, then `messages` data messages of 1 MiB each.
fn encode_big(messages: usize) -> Vec<u8> {
    let mut out = encode_frame(r#"{"msg":["status",{"tag":"status"}],"id":1}"#);
    let filler = "y".repeat(1 << 20);
    for id in 2..=messages as u64 + 1 {
        out.extend(encode_frame(&format!(
            r#"{{"msg":["data",{{"tag":"insert","new":{{"s":"{filler}"}}}}],"id":{id}}}"#
        )));
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
