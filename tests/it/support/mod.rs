//! Test harness: the real sidecar on 127.0.0.1:0, real WebSocket clients, a raw-frame client for input no
//! well-behaved library will send, and a stand-in for Zero's change-streamer behind the relay.

pub mod cluster;
pub mod litestream;
pub mod moto;
pub mod pg;
pub mod process;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use litestream_sidecar::cleanup::reservations::Registry;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::cleanup::subscribers::Subscribers;
use litestream_sidecar::cleanup::Decision;
use litestream_sidecar::protocol::Mode;
use litestream_sidecar::{config, App, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

pub const BACKUP_URL: &str = "s3://acme-zero/replica";

/// The snapshot status a v3 reservation gets first, with the test config's [`BACKUP_URL`].
pub const V3_STATUS: &str =
    r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#;

/// The v4 status up to `minWatermark`'s value; the test schema's replica version is `lexi(1000)` = `1rs`.
pub const V4_STATUS: &str = r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica","replicaVersion":"1rs","minWatermark":"#;

/// The replica size [`progress_page`]'s `litestream_db_size` gives, as a v4+ status carries it.
pub const REPLICA_SIZE: &str = r#","replicaSize":12288"#;

/// The whole v4+ status for the test schema with `min_watermark`, from a page made by [`progress_page`].
pub fn v4_status(min_watermark: &str) -> String {
    format!("{V4_STATUS}\"{min_watermark}\"{REPLICA_SIZE}}}]}}")
}

/// The whole v4+ status for the test schema with `min_watermark`, the replica's size unknown (no litestream page).
pub fn v4_status_unsized(min_watermark: &str) -> String {
    format!("{V4_STATUS}\"{min_watermark}\"}}]}}")
}

/// The status message a stand-in upstream sends first (in Zero's msg-first frame: [`UpstreamConn::send_msg`]).
pub const UPSTREAM_STATUS: &str = r#"["status",{"tag":"status"}]"#;

/// The default config's litestream: nothing listens there (port 9, discard).
pub const NO_LITESTREAM: &str = "http://127.0.0.1:9/metrics";

/// A config for tests: loopback listeners on free ports, `extra` (TOML) merged over it. Claims are not checked
/// against the destination (`backup.verify = false`: nothing serves [`BACKUP_URL`]); the tests of that turn it on.
pub fn config(extra: &str) -> Config {
    let base = format!(
        "[litestream]\nbackup_url = \"{BACKUP_URL}\"\nproxy_listen = \"127.0.0.1:0\"\n\
         metrics_url = \"{NO_LITESTREAM}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [change_db]\nurl = \"{NO_CHANGE_DB}\"\n[discovery]\nmode = \"off\"\n\
         [backup]\nverify = false\n[cleanup]\nstate_file = \"none\"\nhold_without_state = \"0s\"\n"
    );
    let mut merged: toml::Table = base.parse().unwrap();
    let extra: toml::Table = extra.parse().expect("extra config is TOML");
    for (section, values) in extra {
        let target = merged
            .entry(section)
            .or_insert_with(|| toml::Value::Table(Default::default()));
        for (key, value) in values.as_table().expect("extra config has sections") {
            target
                .as_table_mut()
                .unwrap()
                .insert(key.clone(), value.clone());
        }
    }
    config::from_toml_str(&toml::to_string(&merged).unwrap(), Some(Default::default()))
        .expect("test config parses")
        .validate()
        .expect("test config is valid")
}

pub struct Sidecar {
    pub addr: SocketAddr,
    pub proxy_addr: SocketAddr,
    pub registry: Registry,
    pub subscribers: Subscribers,
    pub status: litestream_sidecar::cleanup::status::StatusHandle,
    pub discovery: litestream_sidecar::cleanup::discovery::StateHandle,
    pub protocols: litestream_sidecar::streamer::protocols::UpstreamProtocols,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), litestream_sidecar::Error>>,
}

pub async fn start(config: Config) -> Sidecar {
    start_app(App::new(config)).await
}

/// The change DB of [`config`]: nothing listens there.
const NO_CHANGE_DB: &str = "postgres://nobody@127.0.0.1:9/none";
const NO_CHANGE_DB_PORTS: &[u16] = &[9];

/// Starts a sidecar that behaves as if it had been up for `ago` already (the cleanup delay counts from start).
pub async fn start_aged(config: Config, ago: Duration) -> Sidecar {
    let started = tokio::time::Instant::now()
        .checked_sub(ago)
        .expect("the clock goes back that far");
    start_app(App::new(config).started_at(started)).await
}

/// The watermark a sidecar without a litestream stand-in starts out knowing as backed up: statuses are withheld
/// until a backup is known, and most tests are not about that. It is the test schema's replica version
/// (`lexi(1000)`), at or above every watermark those tests write, as a backup is at or above the change log's
/// oldest row: a status waits while the log starts past the newest backup.
pub const SEEDED_BACKUP: &str = "1rs";

pub async fn start_app(app: App) -> Sidecar {
    // Without a change DB no reservation's row can commit: tests of the protocol alone let statuses go out.
    let app = if app.config().change_db.url.get_ports() == NO_CHANGE_DB_PORTS {
        app.statuses_without_slots()
    } else {
        app
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = app.registry().clone();
    if app.config().litestream.metrics_url == NO_LITESTREAM {
        registry.saw_backup(SEEDED_BACKUP);
    }
    let subscribers = app.subscribers().clone();
    let status = app.status().clone();
    let discovery = app.discovery().clone();
    let protocols = app.protocols().clone();
    let proxy = app.bind_proxy().await.expect("metrics proxy binds");
    let proxy_addr = proxy[0].local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(listener, proxy, shutdown.clone()));
    Sidecar {
        addr,
        proxy_addr,
        registry,
        subscribers,
        status,
        discovery,
        protocols,
        shutdown,
        task,
    }
}

impl Sidecar {
    pub fn url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    pub fn snapshot_url(&self, task_id: &str) -> String {
        self.url(&format!("/replication/v3/snapshot?taskID={task_id}"))
    }

    /// Cancels and waits for a clean exit; the timeout only guards against a hang.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(15), self.task).await;
        result
            .expect("shutdown hung")
            .expect("run panicked")
            .expect("run failed");
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}

pub type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

pub async fn connect(url: &str) -> Client {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(256 << 20);
    config.max_frame_size = Some(256 << 20);
    let (ws, response) = tokio_tungstenite::connect_async_with_config(url, Some(config), false)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    assert_eq!(response.status(), 101);
    ws
}

/// A refused upgrade: the HTTP status and body.
pub async fn refused(url: &str) -> (u16, String) {
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => panic!("{url}: upgrade was accepted"),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            (status, body)
        }
        Err(e) => panic!("{url}: unexpected error {e}"),
    }
}

pub async fn next_text(ws: &mut Client) -> String {
    match next_message(ws).await {
        Some(Message::Text(text)) => text.to_string(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// What the peer's close frame said: `Some((code, reason))`, or `None` for a close without a status code
/// (reported as 1005 by browsers and `ws`).
pub async fn expect_close(ws: &mut Client) -> Option<(u16, String)> {
    match next_message(ws).await {
        Some(Message::Close(frame)) => frame.map(|f| (u16::from(f.code), f.reason.to_string())),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

pub async fn send_text(ws: &mut Client, text: &str) {
    ws.send(Message::Text(text.into())).await.unwrap();
}

pub fn close_code(code: u16) -> CloseCode {
    CloseCode::from(code)
}

/// Polls `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually_async<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(what, Duration::from_secs(20), check).await;
}

/// [`eventually_async`] with a guard of its own, for waits that include a reconnect's backoff or a start-up hold.
pub async fn within<F, Fut>(what: &str, guard: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + guard;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Plain HTTP GET (or another method): status and body.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("response within 10s")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A WebSocket client that writes frames byte by byte as told, for input well-behaved libraries refuse to send.
pub struct RawClient {
    pub stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr, path: &str) -> RawClient {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed during the handshake");
            buffer.extend_from_slice(&chunk[..n]);
            if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        buffer.drain(..head_end);
        RawClient { stream, buffer }
    }

    /// Writes one masked frame header for `len` payload bytes; the payload follows with `write_payload`.
    pub async fn write_header(&mut self, fin: bool, opcode: u8, len: u64) {
        let mut head = vec![(if fin { 0x80 } else { 0 }) | opcode];
        if len < 126 {
            head.push(0x80 | len as u8);
        } else if len <= u16::MAX as u64 {
            head.push(0x80 | 126);
            head.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            head.push(0x80 | 127);
            head.extend_from_slice(&len.to_be_bytes());
        }
        // An all-zero mask leaves the payload as is.
        head.extend_from_slice(&[0, 0, 0, 0]);
        self.stream.write_all(&head).await.unwrap();
    }

    pub async fn write_frame(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        self.write_header(fin, opcode, payload.len() as u64).await;
        self.stream.write_all(payload).await.unwrap();
    }

    async fn fill(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 65536];
        while self.buffer.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(read)) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(_) => panic!("no data within 10s"),
            }
        }
        true
    }

    /// Reads one unmasked server frame: `(opcode, payload)`, or `None` at end of stream.
    pub async fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        if !self.fill(2).await {
            return None;
        }
        let opcode = self.buffer[0] & 0x0f;
        let (len, head) = match self.buffer[1] & 0x7f {
            126 => {
                if !self.fill(4).await {
                    return None;
                }
                (
                    u16::from_be_bytes([self.buffer[2], self.buffer[3]]) as usize,
                    4,
                )
            }
            127 => {
                if !self.fill(10).await {
                    return None;
                }
                (
                    u64::from_be_bytes(self.buffer[2..10].try_into().unwrap()) as usize,
                    10,
                )
            }
            n => (n as usize, 2),
        };
        if !self.fill(head + len).await {
            return None;
        }
        let payload = self.buffer[head..head + len].to_vec();
        self.buffer.drain(..head + len);
        Some((opcode, payload))
    }

    /// Skips the status and pings; returns the close code and reason of the server's close frame.
    pub async fn read_close(&mut self) -> Option<(u16, String)> {
        loop {
            let (opcode, payload) = self.read_frame().await?;
            if opcode == 0x8 {
                if payload.len() < 2 {
                    return Some((1005, String::new()));
                }
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                return Some((code, String::from_utf8_lossy(&payload[2..]).into_owned()));
            }
        }
    }

    /// True once the server has dropped the TCP connection (after any frames it sent).
    pub async fn is_dropped(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// Stands in for litestream's metrics endpoint (the Zero fork cannot run here): serves whatever page the test
/// sets, with the status the test sets, or misbehaves as the test sets (see [`Misbehave`]).
#[derive(Clone)]
pub struct MetricsServer {
    pub addr: SocketAddr,
    state: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    misbehave: std::sync::Arc<std::sync::Mutex<Option<Misbehave>>>,
    pub requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The most body bytes of one [`Misbehave::Huge`] page handed to its connection (the test may reset it).
    pub huge_most_sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: CancellationToken,
}

/// How the stand-in misbehaves instead of serving its page.
#[derive(Clone, Debug)]
pub enum Misbehave {
    /// Accepts the connection and reads the request, then never answers.
    Hang,
    /// Answers 200 and sends `prefix` as the start of a body that never ends.
    HangMidBody { prefix: String },
    /// A 200 page of `bytes` bytes: `prefix`, then comment lines, produced as it is sent (never held whole), with
    /// a `Content-Length` when `declared`, chunked otherwise.
    Huge {
        prefix: String,
        bytes: u64,
        declared: bool,
    },
}

type TestBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

impl MetricsServer {
    pub async fn start(page: &str) -> MetricsServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = MetricsServer {
            addr,
            state: std::sync::Arc::new(std::sync::Mutex::new((200, page.to_string()))),
            misbehave: Default::default(),
            requests: Default::default(),
            huge_most_sent: Default::default(),
            stop: CancellationToken::new(),
        };
        let shared = server.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    accepted = listener.accept() => accepted.unwrap(),
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let stop = shared.stop.clone();
                    let service = hyper::service::service_fn(move |_req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(shared.respond().await) }
                    });
                    let serve = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = serve => {}
                    }
                });
            }
        });
        server
    }

    async fn respond(&self) -> hyper::Response<TestBody> {
        use http_body_util::BodyExt;
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let misbehave = self.misbehave.lock().unwrap().clone();
        let (status, body, length) = match misbehave {
            None => {
                let (status, page) = self.state.lock().unwrap().clone();
                let body = http_body_util::Full::new(bytes::Bytes::from(page)).boxed();
                (status, body, None)
            }
            Some(Misbehave::Hang) => std::future::pending().await,
            Some(Misbehave::HangMidBody { prefix }) => {
                let first = futures_util::stream::once(async move {
                    Ok(hyper::body::Frame::data(bytes::Bytes::from(prefix)))
                });
                let body = first.chain(futures_util::stream::pending());
                (
                    200,
                    BodyExt::boxed(http_body_util::StreamBody::new(body)),
                    Some(1 << 20),
                )
            }
            Some(Misbehave::Huge {
                prefix,
                bytes,
                declared,
            }) => {
                let most = self.huge_most_sent.clone();
                let filler = bytes::Bytes::from(format!("# {}\n", "x".repeat(65533)));
                let chunks = futures_util::stream::unfold(
                    (Some(bytes::Bytes::from(prefix)), 0u64),
                    move |(prefix, done)| {
                        let most = most.clone();
                        let filler = filler.clone();
                        async move {
                            if done >= bytes {
                                return None;
                            }
                            let chunk = prefix.unwrap_or(filler);
                            let chunk = chunk.slice(..chunk.len().min((bytes - done) as usize));
                            let done = done + chunk.len() as u64;
                            most.fetch_max(done, std::sync::atomic::Ordering::SeqCst);
                            Some((
                                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)),
                                (None, done),
                            ))
                        }
                    },
                );
                let body = BodyExt::boxed(http_body_util::StreamBody::new(chunks));
                (200, body, declared.then_some(bytes))
            }
        };
        let mut response = hyper::Response::new(body);
        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        response.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        if let Some(length) = length {
            response
                .headers_mut()
                .insert("content-length", hyper::header::HeaderValue::from(length));
        }
        response
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    /// Serves `page` (and stops misbehaving).
    pub fn set_page(&self, page: &str) {
        self.state.lock().unwrap().1 = page.to_string();
        self.misbehave(None);
    }

    pub fn set_status(&self, status: u16) {
        self.state.lock().unwrap().0 = status;
    }

    /// Misbehaves from the next request on (`None`: serves the page again).
    pub fn misbehave(&self, how: Option<Misbehave>) {
        *self.misbehave.lock().unwrap() = how;
    }

    /// Stops accepting: the port is closed, as when litestream is down.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// A litestream_replica_progress page in the Zero fork's format (docs/protocol.md, "litestream's progress gauge").
pub fn progress_page(samples: &[(&str, f64)]) -> String {
    let mut page = String::from(
        "# HELP litestream_db_size The current size of the real DB\n# TYPE litestream_db_size gauge\n\
         litestream_db_size{db=\"/var/lib/zero/replica.db\"} 12288\n\
         # HELP litestream_replica_progress The last replicated watermark and time of replication\n\
         # TYPE litestream_replica_progress gauge\n",
    );
    for (watermark, time) in samples {
        page.push_str(&format!(
            "litestream_replica_progress{{db=\"/var/lib/zero/replica.db\",name=\"file\",watermark=\"{watermark}\"}} {time:e}\n"
        ));
    }
    page
}

/// LexiVersion of `n` (docs/protocol.md, "Watermarks"): base 36 with a length prefix, so byte order is numeric order.
pub fn lexi(n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    let mut rest = n;
    loop {
        digits.push(DIGITS[(rest % 36) as usize]);
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(DIGITS[digits.len() - 1]);
    digits.reverse();
    String::from_utf8(digits).unwrap()
}

/// A subscriber in serving mode at `watermark`, of no task, as the relay registers it.
pub fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: id.into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "1rs".into(),
        watermark: watermark.into(),
    }
}

/// The monitor's decision once it has checked `ticks` more times.
pub async fn decisions(sidecar: &Sidecar, ticks: u64) -> Decision {
    let target = sidecar.status.get().checks + ticks;
    eventually("monitor checks", || sidecar.status.get().checks >= target).await;
    sidecar.status.get().last_decision.expect("a decision")
}

/// Waits until the monitor decides `expected`, then asserts that the next check decides it again: a settled state,
/// never one read in passing. After a purge whose rows were seen gone, a fixed number of checks is not enough: the
/// purging check may still be finishing, and a purge that stopped early (its gauge or ceiling moved between
/// batches) is decided again by the next check even when nothing is left to delete.
pub async fn settles_on(sidecar: &Sidecar, expected: Decision) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let decision = decisions(sidecar, 1).await;
        if decision == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the decision {expected:?}; the last was {decision:?}"
        );
    }
    assert_eq!(decisions(sidecar, 1).await, expected, "a check later");
}

/// A backup time `secs` seconds ago, for metrics pages.
pub fn seconds_ago(secs: f64) -> f64 {
    epoch_now() - secs
}

/// Backed up two minutes ago: older than the 30 s minimum cleanup delay.
pub fn aged() -> f64 {
    seconds_ago(120.0)
}

/// Now as epoch seconds, for backup times in metrics pages.
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Limits for the stand-in upstream and test clients: above the sidecar's 128 MiB, so the sidecar's limit is
/// the one tested.
pub fn large_ws_config() -> WebSocketConfig {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(256 << 20);
    config.max_frame_size = Some(256 << 20);
    config
}

/// A stand-in for Zero's change-streamer: accepts WebSocket upgrades on 127.0.0.1:0 and hands each connection,
/// with the request target it was opened for, to the test, which plays Zero's part (see [`UpstreamConn`]).
///
/// Like Zero, it upgrades a request for a protocol version outside the range it serves (v1 to v6 unless told, as
/// Zero 1.9) and closes it at once with 1002 and Zero's refusal; such requests, the sidecar's probes among them, are
/// answered here, recorded ([`Upstream::refused_targets`]) and never handed to the test.
pub struct Upstream {
    pub addr: SocketAddr,
    conns: tokio::sync::mpsc::UnboundedReceiver<UpstreamConn>,
    refused: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

/// The protocol versions a stand-in upstream serves, and whether it answers the sidecar's probe.
#[derive(Debug, Clone)]
pub struct Serves {
    pub versions: std::ops::RangeInclusive<u64>,
    /// false: a probe (`/replication/v0/changes`) is upgraded and dropped without a word, so that the sidecar can
    /// only learn the range from a relayed subscription's refusal.
    pub answers_probes: bool,
}

/// Zero 1.9: v1 to v6.
pub const ZERO_1_9: Serves = Serves {
    versions: 1..=6,
    answers_probes: true,
};

/// The version of a `/replication/v{N}/...` request target, if it has one.
pub fn target_version(target: &str) -> Option<u64> {
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    let rest = path.strip_prefix("/replication/v")?;
    let (digits, action) = rest.split_once('/')?;
    matches!(action, "changes" | "snapshot")
        .then(|| digits.parse().ok())
        .flatten()
}

/// How a stand-in upstream answers a request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A version it serves: the test plays the rest.
    Serve,
    /// An unanswered probe: the socket is dropped without a word.
    Drop,
    /// A version it does not serve: closed with 1002 and this reason, as Zero does.
    Refuse(String),
}

/// What Zero serving `serves` does with a request for `target`.
pub fn answer_like_zero(target: &str, serves: &Serves) -> Answer {
    match target_version(target).filter(|v| !serves.versions.contains(v)) {
        None => Answer::Serve,
        Some(0) if !serves.answers_probes => Answer::Drop,
        Some(version) => Answer::Refuse(format!(
            "Error: Cannot service client at protocol v{version}. Supported protocols: [v{} ... v{}]",
            serves.versions.start(),
            serves.versions.end()
        )),
    }
}

/// Closes an upgraded socket with 1002 and `reason`, as Zero's `closeWithError` does.
pub async fn close_with_refusal<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>, reason: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let frame = tungstenite::protocol::CloseFrame {
        code: CloseCode::from(1002),
        reason: reason.into(),
    };
    let _ = ws.close(Some(frame)).await;
    // The peer's answering close, briefly: Zero does not wait for it either.
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.next()).await;
}

pub type ServerSocket = tokio_tungstenite::WebSocketStream<TcpStream>;

/// One subscription as the upstream sees it.
pub struct UpstreamConn {
    /// Path and query exactly as the sidecar sent them.
    pub target: String,
    pub ws: ServerSocket,
}

impl Upstream {
    /// Accepts every upgrade; serves v1 to v6 ([`ZERO_1_9`]).
    pub async fn start() -> Upstream {
        Self::start_with(None, ZERO_1_9, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Serves these versions, refusing others as Zero does.
    pub async fn serving(serves: Serves) -> Upstream {
        Self::start_with(None, serves, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Answers every upgrade with this HTTP status instead.
    pub async fn refusing(status: u16) -> Upstream {
        Self::start_with(Some(status), ZERO_1_9, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Accepts every upgrade at `addr`: an upstream restarted where it was.
    pub async fn start_at(addr: SocketAddr) -> Upstream {
        Self::start_with(None, ZERO_1_9, addr).await
    }

    /// Serves these versions at `addr`: another release restarted where the upstream was.
    pub async fn serving_at(addr: SocketAddr, serves: Serves) -> Upstream {
        Self::start_with(None, serves, addr).await
    }

    /// The request targets this upstream refused itself for their version, in order.
    pub fn refused_targets(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }

    async fn start_with(refuse: Option<u16>, serves: Serves, addr: SocketAddr) -> Upstream {
        // A stopped listener at `addr` is closed once its aborted task is dropped: shortly.
        let mut attempts = 0;
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(err) if attempts < 100 => {
                    attempts += 1;
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => panic!("cannot bind the upstream stand-in at {addr}: {err}"),
            }
        };
        let addr = listener.local_addr().unwrap();
        let (tx, conns) = tokio::sync::mpsc::unbounded_channel();
        let refused = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let refusals = refused.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                let (serves, refusals) = (serves.clone(), refusals.clone());
                tokio::spawn(async move {
                    let target = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
                    let seen = target.clone();
                    // The callback's signature is tungstenite's.
                    #[allow(clippy::result_large_err)]
                    let callback = move |request: &tungstenite::handshake::server::Request,
                                         response: tungstenite::handshake::server::Response| {
                        *seen.lock().unwrap() = request.uri().to_string();
                        match refuse {
                            None => Ok(response),
                            Some(status) => Err(tungstenite::http::Response::builder()
                                .status(status)
                                .body(Some("refused by the test upstream".to_string()))
                                .unwrap()),
                        }
                    };
                    let accepted = tokio_tungstenite::accept_hdr_async_with_config(
                        stream,
                        callback,
                        Some(large_ws_config()),
                    )
                    .await;
                    if let Ok(mut ws) = accepted {
                        let target = target.lock().unwrap().clone();
                        match answer_like_zero(&target, &serves) {
                            Answer::Serve => {
                                let _ = tx.send(UpstreamConn { target, ws });
                            }
                            Answer::Drop => refusals.lock().unwrap().push(target),
                            Answer::Refuse(reason) => {
                                refusals.lock().unwrap().push(target);
                                close_with_refusal(&mut ws, reason).await;
                            }
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            conns,
            refused,
            task,
        }
    }

    /// The config extra for a sidecar relaying to this upstream (keys of `[server]` may precede it).
    pub fn config(&self, extra: &str) -> Config {
        config(&format!(
            "{extra}\n[upstream]\naddress = \"{}\"\n",
            self.addr
        ))
    }

    /// The next subscription that reached the upstream.
    pub async fn accept(&mut self) -> UpstreamConn {
        tokio::time::timeout(Duration::from_secs(10), self.conns.recv())
            .await
            .expect("no upstream connection within 10s")
            .expect("upstream stopped")
    }

    /// Stops accepting; the connections already handed out stay with their owners.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// The next subscription that reached the upstream, however long it takes (for a test that dispatches
    /// subscriptions as they come and bounds its own time); `None` once the upstream stopped.
    pub async fn next_conn(&mut self) -> Option<UpstreamConn> {
        self.conns.recv().await
    }

    /// True if no subscription reached the upstream within a short while.
    pub async fn none_arrives(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(200), self.conns.recv())
            .await
            .is_err()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Zero 0.20's rejections of a subscription, checked in Zero's order (docs/protocol.md, "Rejections and close codes"): `Some((1002, reason))`.
pub fn zero_rejection(target: &str) -> Option<(u16, String)> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let version = path
        .strip_prefix("/replication/v")
        .and_then(|rest| rest.strip_suffix("/changes"))
        .and_then(|v| v.parse::<u64>().ok());
    match version {
        Some(v) if (1..=3).contains(&v) => {}
        Some(v) => {
            return Some((
                1002,
                format!(
                "Error: Cannot service client at protocol v{v}. Supported protocols: [v1 ... v3]"
            ),
            ))
        }
        None => return Some((1002, format!("Error: invalid path: {path}"))),
    }
    for key in ["id", "replicaVersion", "watermark"] {
        let value = url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        if value.is_empty() {
            return Some((1002, format!("Error: invalid querystring - missing {key}")));
        }
    }
    None
}

impl UpstreamConn {
    /// A query parameter of the request as Zero reads it.
    pub fn param(&self, key: &str) -> Option<String> {
        let query = self.target.split_once('?').map(|(_, q)| q).unwrap_or("");
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }

    /// Plays Zero 0.20 accepting or rejecting the subscription: a rejection closes with 1002 and Zero's reason
    /// and returns false.
    pub async fn admit_like_zero(&mut self) -> bool {
        match zero_rejection(&self.target) {
            None => true,
            Some((code, reason)) => {
                self.close(Some(code), &reason).await;
                false
            }
        }
    }

    /// Sends a message in Zero 0.20's msg-first frame form: `{"msg":<msg>,"id":<id>}`.
    pub async fn send_msg(&mut self, id: u64, msg: &str) -> String {
        let frame = format!(r#"{{"msg":{msg},"id":{id}}}"#);
        self.send_text(&frame).await;
        frame
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::Text(text.into())).await.unwrap();
    }

    /// Closes with a code and reason, or with no code at all (`None`), as Zero does at the end of a stream.
    pub async fn close(&mut self, code: Option<u16>, reason: &str) {
        let frame = code.map(|code| tungstenite::protocol::CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_string().into(),
        });
        let _ = self.ws.close(frame).await;
    }

    /// The next data or close message from the sidecar, skipping pings and pongs.
    pub async fn next_message(&mut self) -> Option<Message> {
        next_message(&mut self.ws).await
    }

    pub async fn next_text(&mut self) -> String {
        match self.next_message().await {
            Some(Message::Text(text)) => text.to_string(),
            other => panic!("expected a text frame upstream, got {other:?}"),
        }
    }

    /// Reads the next message as Zero's server does: exactly `{"ack":N}`, or the test fails.
    pub async fn next_ack(&mut self) -> u64 {
        let text = self.next_text().await;
        litestream_sidecar::protocol::decode_ack(text.as_bytes())
            .unwrap_or_else(|e| panic!("{text:?} is not an ack: {e}"))
    }

    /// What the sidecar's close frame said, like [`expect_close`]; the answering close is sent at once.
    pub async fn expect_close(&mut self) -> Option<(u16, String)> {
        let close = match self.next_message().await {
            Some(Message::Close(frame)) => frame.map(|f| (u16::from(f.code), f.reason.to_string())),
            other => panic!("expected a close frame upstream, got {other:?}"),
        };
        let _ = self.ws.flush().await;
        close
    }
}

/// The next data or close message of any socket, skipping pings and pongs, with a hang guard.
pub async fn next_message<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Option<Message>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("no message within 10s");
        match next {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(message)) => return Some(message),
            Some(Err(_)) | None => return None,
        }
    }
}

/// A `/changes` path with a 0.20 client's query (docs/protocol.md, "Subscription parameters").
pub fn changes_path(
    version: u64,
    task_id: &str,
    id: &str,
    watermark: &str,
    initial: bool,
) -> String {
    format!(
        "/replication/v{version}/changes?taskID={task_id}&id={id}&mode=serving&watermark={watermark}\
         &replicaVersion=1rs&initial={initial}"
    )
}

/// `GET /metrics`, parsed.
pub async fn scrape(sidecar: &Sidecar) -> prometheus_parse::Scrape {
    let (status, body) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("a metrics page")
}

/// The value of `name`'s first sample (with `label`, if given); a histogram's count.
pub fn value(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref buckets) => {
                buckets.last().map_or(0.0, |b| b.count)
            }
            ref other => panic!("{name}: {other:?}"),
        })
}

/// Reads frames, answering pings, until a text frame arrives; `None` if `pings` pings came first.
pub async fn text_after_pings(raw: &mut RawClient, pings: usize) -> Option<String> {
    let mut seen = 0;
    loop {
        let (opcode, payload) = raw.read_frame().await.expect("the socket stays open");
        match opcode {
            0x9 => {
                raw.write_frame(true, 0xA, b"").await;
                seen += 1;
                if seen >= pings {
                    return None;
                }
            }
            0x1 => return Some(String::from_utf8(payload).unwrap()),
            other => panic!("unexpected opcode {other}"),
        }
    }
}
