//! Stands in for Zero's change-streamer behind the relay.

use super::*;

/// The status message a stand-in upstream sends first (in Zero's msg-first frame: [`UpstreamConn::send_msg`]).
pub const UPSTREAM_STATUS: &str = r#"["status",{"tag":"status"}]"#;

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
        Self::config_for(self.addr, extra)
    }

    /// [`Upstream::config`] for an upstream that will listen at `addr` (or has stopped there).
    pub fn config_for(addr: SocketAddr, extra: &str) -> Config {
        config(&format!("{extra}\n[upstream]\naddress = \"{addr}\"\n"))
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
        let next = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("no message within 60s");
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
