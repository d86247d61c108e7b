//! Relay faults: a thousand subscriptions through one sidecar process, one subscriber of which stops reading.
//!
//! The sidecar runs as its own process (the built binary), so that its memory is its own: `VmHWM` in
//! `/proc/<pid>/status` is the peak resident set of everything it queued for all subscribers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{RawClient, Upstream, UpstreamConn};

const BIN: &str = env!("CARGO_BIN_EXE_litestream-sidecar");

/// Subscriptions relayed at once, the stalled one included; each is four sockets (two in the sidecar, two here).
const SUBSCRIBERS: usize = 1000;
/// Transactions the upstream streams to every subscriber: begin, a 1 KiB data message, commit.
const TRANSACTIONS: u64 = 50;
/// The sidecar's peak resident set may not exceed this: without per-connection bounds, the stalled subscriber
/// alone would be sent far more than this.
const MAX_RSS: u64 = 256 << 20;
/// What the upstream offers the stalled subscriber at most: many times the socket buffers between them.
const STALL_ATTEMPT: u64 = 1 << 30;
/// The stalled subscriber's `id`.
const STALLED: &str = "stalled-replicator";

/// Every message the upstream sends subscriber `id`, in order, exactly as sent: the status, then the transactions.
fn stream_for(id: &str) -> Vec<String> {
    let filler = "d".repeat(1000);
    let mut frames = vec![format!(r#"{{"msg":["status",{{"tag":"status"}}],"id":1}}"#)];
    let mut n = 2u64;
    for t in 0..TRANSACTIONS {
        let watermark = format!("{:08}", t + 1);
        for msg in [
            format!(
                r#"["begin",{{"tag":"begin","json":"s"}},{{"commitWatermark":"{watermark}"}}]"#
            ),
            format!(r#"["data",{{"tag":"insert","new":{{"sub":"{id}","t":{t},"s":"{filler}"}}}}]"#),
            format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{watermark}"}}]"#),
        ] {
            frames.push(format!(r#"{{"msg":{msg},"id":{n}}}"#));
            n += 1;
        }
    }
    frames
}

/// Subscriptions this process can hold at once: four sockets each, two of them here and two in the sidecar,
/// which inherits this process's limit. A lower soft limit than needed shrinks the case (and says so) rather
/// than failing it for the machine's sake.
fn subscribers_within_fd_limit(wanted: usize) -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let fits = soft.saturating_sub(256) / 2;
    if fits < wanted {
        eprintln!("open file limit {soft}: {fits} subscribers instead of {wanted}");
    }
    wanted.min(fits)
}

/// The sidecar process, killed when the test ends (also when it fails first), and its JSON log.
struct Sidecar {
    child: std::process::Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<serde_json::Value>>>,
    _dir: tempfile::TempDir,
}

impl Sidecar {
    fn start(upstream: SocketAddr) -> Sidecar {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.toml");
        // Subscribers here are not read for a while before the stream starts, and the upstream says nothing
        // meanwhile: liveness is generous so that only the stall rule can end anyone.
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nping_interval = \"500ms\"\npeer_timeout = \"120s\"\n\
                 [litestream]\nbackup_url = \"{}\"\nproxy_listen = \"127.0.0.1:0\"\nmetrics_url = \"{}\"\n\
                 [change_db]\nurl = \"postgres://nobody@127.0.0.1:9/none\"\n[discovery]\nmode = \"off\"\n\
                 [upstream]\naddress = \"{upstream}\"\nsilence_timeout = \"120s\"\n\
                 [relay]\nwrite_stall_timeout = \"2s\"\n[log]\nformat = \"json\"\n\
                 [cleanup]\nstate_file = \"{}\"\n",
                crate::support::BACKUP_URL,
                crate::support::NO_LITESTREAM,
                // Its own state, not the host's default path.
                dir.path().join("state.json").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .env_clear()
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "exited before listening"
            );
            let event: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
            if event["message"] == "listening" {
                break event["addr"].as_str().unwrap().parse().unwrap();
            }
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in stderr.lines() {
                    let Ok(line) = line else { return };
                    if let Ok(event) = serde_json::from_str(&line) {
                        log.lock().unwrap().push(event);
                    }
                }
            });
        }
        Sidecar {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    /// A line of `/proc/<pid>/status`, in bytes (the kernel reports kB).
    fn status_bytes(&self, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {status}"));
        kb << 10
    }

    fn warnings(&self) -> Vec<serde_json::Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["level"] == "WARN")
            .cloned()
            .collect()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plays Zero's change-streamer for one subscription: the status at once, then, once told to go, the stream.
/// Keeps the connection until the sidecar closes it.
async fn stream_upstream(mut conn: UpstreamConn, id: String, mut go: watch::Receiver<bool>) {
    let frames = stream_for(&id);
    conn.send_text(&frames[0]).await;
    go.wait_for(|go| *go).await.unwrap();
    for frame in &frames[1..] {
        if conn
            .ws
            .send(Message::Text(frame.as_str().into()))
            .await
            .is_err()
        {
            return;
        }
    }
    while let Some(Ok(message)) = conn.ws.next().await {
        if matches!(message, Message::Close(_)) {
            return;
        }
    }
}

/// Plays the upstream of the subscriber that stopped reading: once told to go, 64 KiB messages as fast as the
/// relay takes them until the connection fails; returns the close the sidecar sent and the bytes it took.
async fn flood_upstream(
    conn: UpstreamConn,
    mut go: watch::Receiver<bool>,
) -> (Option<(u16, String)>, u64) {
    let (mut sink, mut stream) = conn.ws.split();
    sink.send(Message::Text(stream_for(STALLED)[0].as_str().into()))
        .await
        .unwrap();
    go.wait_for(|go| *go).await.unwrap();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pusher = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let filler = "f".repeat(64 << 10);
            for id in 2u64.. {
                let frame = format!(r#"{{"msg":["data",{{"s":"{filler}"}}],"id":{id}}}"#);
                let len = frame.len() as u64;
                if sink.send(Message::Text(frame.into())).await.is_err() {
                    return;
                }
                if sent.fetch_add(len, std::sync::atomic::Ordering::Relaxed) + len >= STALL_ATTEMPT
                {
                    return;
                }
            }
        })
    };
    let close = loop {
        match stream.next().await {
            Some(Ok(Message::Close(frame))) => {
                break frame.map(|f| (u16::from(f.code), f.reason.to_string()))
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => {
                panic!("the stalled subscription's upstream ended without a close")
            }
        }
    };
    let _ = pusher.await;
    (close, sent.load(std::sync::atomic::Ordering::Relaxed))
}

/// Reads a subscriber's whole stream and checks it byte for byte; returns how many messages arrived.
async fn read_stream(mut client: crate::support::Client, id: String) -> usize {
    let expected = stream_for(&id);
    // The status was read when the subscription opened.
    for (n, want) in expected.iter().enumerate().skip(1) {
        let message = loop {
            let next = tokio::time::timeout(Duration::from_secs(60), client.next())
                .await
                .unwrap_or_else(|_| panic!("{id}: nothing for 60s at message {n}"));
            match next {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(message)) => break message,
                other => panic!("{id}: stream ended at message {n}: {other:?}"),
            }
        };
        match message {
            Message::Text(text) => assert_eq!(text.as_str(), want, "{id}: message {n}"),
            other => panic!("{id}: message {n} is {other:?}"),
        }
    }
    let _ = client.close(None).await;
    expected.len()
}

/// Opens a subscription and reads its status.
async fn subscribe(addr: SocketAddr, id: &str) -> crate::support::Client {
    let path = crate::support::changes_path(3, &format!("task-{id}"), id, "00000000", false);
    let mut client = crate::support::connect(&format!("ws://{addr}{path}")).await;
    assert_eq!(
        crate::support::next_text(&mut client).await,
        stream_for(id)[0]
    );
    client
}

/// A thousand subscriptions stream through the sidecar while one subscriber stops reading: every other one gets
/// its whole stream byte for byte, the stalled one is ended by the write-stall rule (its upstream closed with
/// 1001, one warning naming it, the stall counted), the sidecar's memory stays bounded by what it queues per
/// connection, and it goes on serving new subscriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_stream_while_one_stops_reading() {
    let subscribers = subscribers_within_fd_limit(SUBSCRIBERS);
    let mut upstream = Upstream::start().await;
    let sidecar = Sidecar::start(upstream.addr);
    let (go_tx, go) = watch::channel(false);

    // The upstream plays each subscription as it arrives, by the subscriber's id.
    let flood = Arc::new(Mutex::new(None));
    let dispatcher = {
        let flood = flood.clone();
        tokio::spawn(async move {
            let mut streams = Vec::new();
            while let Some(conn) = upstream.next_conn().await {
                let id = conn.param("id").expect("an id");
                if id == STALLED {
                    *flood.lock().unwrap() = Some(tokio::spawn(flood_upstream(conn, go.clone())));
                } else {
                    streams.push(tokio::spawn(stream_upstream(conn, id, go.clone())));
                }
            }
            drop(streams);
        })
    };

    // The stalled subscriber reads its status, then nothing: it answers no ping and takes no byte.
    let stalled_path = crate::support::changes_path(3, "task-stalled", STALLED, "00000000", false);
    let mut stalled = RawClient::connect(sidecar.addr, &stalled_path).await;
    loop {
        let (opcode, payload) = stalled.read_frame().await.expect("the status");
        if opcode == 0x1 {
            assert_eq!(payload, stream_for(STALLED)[0].as_bytes());
            break;
        }
    }
    let ids: Vec<String> = (1..subscribers)
        .map(|i| format!("serving-{i:04}"))
        .collect();
    let clients: Vec<(String, crate::support::Client)> = futures_util::stream::iter(ids)
        .map(|id| async move {
            let client = subscribe(sidecar.addr, &id).await;
            (id, client)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert_eq!(clients.len(), subscribers - 1);
    let open_rss = sidecar.status_bytes("VmRSS:");

    // Everyone streams at once.
    go_tx.send(true).unwrap();
    let readers: Vec<_> = clients
        .into_iter()
        .map(|(id, client)| tokio::spawn(read_stream(client, id)))
        .collect();
    let expected = stream_for("x").len();
    for reader in readers {
        assert_eq!(reader.await.unwrap(), expected);
    }
    let flood = flood
        .lock()
        .unwrap()
        .take()
        .expect("the stalled subscription reached the upstream");
    let (close, offered) = tokio::time::timeout(Duration::from_secs(60), flood)
        .await
        .expect("the stalled subscription was not ended within 60s")
        .unwrap();
    assert_eq!(close, Some((1001, "subscriber stopped reading".into())));
    assert!(offered < STALL_ATTEMPT, "the relay took everything offered");
    assert!(
        stalled.is_dropped().await,
        "the stalled subscriber's connection was kept"
    );

    // Memory: at most a bounded queue per connection, however much the stalled subscriber was offered.
    let peak = sidecar.status_bytes("VmHWM:");
    eprintln!(
        "{subscribers} subscribers: sidecar RSS {} MiB with all open, peak {} MiB; the stalled one was sent {} MiB",
        open_rss >> 20,
        peak >> 20,
        offered >> 20
    );
    assert!(peak < MAX_RSS, "sidecar peak RSS {} MiB", peak >> 20);

    // The sidecar goes on serving: a new subscription gets its whole stream.
    let late = subscribe(sidecar.addr, "late-replicator").await;
    assert_eq!(read_stream(late, "late-replicator".into()).await, expected);

    // The stall was its own rule: one warning, naming the subscriber, and one count.
    let (_, metrics) = crate::support::http(sidecar.addr, "GET", "/metrics").await;
    assert!(
        metrics.contains("litestream_sidecar_relay_write_stalls_total 1\n"),
        "{metrics}"
    );
    // The log is read on a thread of its own, and may be a line behind the metric: wait for the subscription's
    // end, logged after its warning.
    crate::support::eventually("the stalled subscription's end logged", || {
        sidecar
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|e| e["message"] == "subscription ended" && e["outcome"] == "ClientStalled")
    })
    .await;
    let warnings = sidecar.warnings();
    let stalls: Vec<_> = warnings
        .iter()
        .filter(|e| e["message"] == "subscriber stopped reading: subscription ended")
        .collect();
    assert_eq!(stalls.len(), 1, "{warnings:?}");
    assert_eq!(stalls[0]["id"], STALLED);
    let ended: HashMap<String, usize> = sidecar
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e["message"] == "subscription ended")
        .fold(HashMap::new(), |mut counts, e| {
            *counts.entry(e["outcome"].to_string()).or_default() += 1;
            counts
        });
    assert_eq!(
        ended.get("\"ClientStalled\"").copied(),
        Some(1),
        "{ended:?}"
    );
    drop(sidecar);
    dispatcher.abort();
}
