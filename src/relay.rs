//! The `/changes` relay: each subscription is a WebSocket to Zero's change-streamer, opened before the
//! subscriber's own upgrade is answered ([`serve`]), and every frame is relayed unchanged both ways (PROTOCOL.md
//! §6, §11.2). A subscription the sidecar cannot relay is refused before the upgrade: HTTP 400 for a path or
//! version no Zero serves, HTTP 502 when the upstream cannot be reached, which makes Zero's client back off
//! instead of reconnecting every 25 ms (W10).
//!
//! What the relay owns: the upstream handshake, each hop's liveness (the subscriber is pinged, a silent upstream is
//! dropped), close codes passed through both ways, back-pressure, ending the subscriber's snapshot reservation
//! once the upstream has registered it (§5.3 4a), and each subscriber's acknowledged watermark for the cleanup
//! policy (§6.8). What it does not: decide whether a subscription is valid; the upstream does, and its answers
//! (error frames, closes with Zero's reasons) reach the subscriber as sent.
//!
//! One task serves both directions of a connection: two reads, two [`Outbox`]es flushed as `select!` branches, and
//! the pings, all cancel-safe. Frames are not decoded and re-encoded: their headers are read in place, data frames
//! are passed on as received (a read's worth at a time, without a copy), and only control frames and what ack
//! tracking needs are looked at. A source is read only while the outbox toward the other side holds less than
//! `relay.max_buffered_bytes`, so a subscriber that reads slowly stops the reads from its upstream and TCP does the
//! rest; nothing else is buffered beyond the frame being read.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Role, WebSocket};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::config::{RelayConfig, UpstreamConfig};
use crate::inspect::{inspect, Downstream};
use crate::protocol::{self, close, SubscriberContext, Version};
use crate::reservations::Registry;
use crate::server::plain;
use crate::subscribers::{SubscriberHandle, SubscriberInfo, Subscribers};
use crate::ws::{self, CloseWith, Io, Liveness, Outbox, PeerClose};

/// Client messages longer than this are not acks; they are relayed without being read.
const ACK_INSPECT_LIMIT: usize = 256;

/// Everything a relayed connection needs besides its sockets.
#[derive(Clone)]
pub struct RelayContext {
    pub settings: Arc<Settings>,
    pub registry: Registry,
    pub subscribers: Subscribers,
    /// Relayed frames and bytes, counted once per read.
    pub instruments: crate::metrics::Instruments,
    pub shutdown: CancellationToken,
}

/// The relay's slice of the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub upstream: UpstreamConfig,
    pub relay: RelayConfig,
    /// How often the subscriber is pinged (`server.ping_interval`).
    pub ping_interval: Duration,
    /// Largest message or frame read from either side (`server.max_message_bytes`).
    pub max_message_bytes: usize,
}

/// Why a subscription could not be relayed; the subscriber gets an HTTP error before its upgrade.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream {addr} unreachable: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("upstream {addr} did not complete the WebSocket handshake within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("upstream {addr} refused the WebSocket upgrade: HTTP {status}")]
    Refused { addr: String, status: u16 },
    #[error("upstream {addr} WebSocket handshake failed: {reason}")]
    Handshake { addr: String, reason: String },
}

impl RelayError {
    /// The HTTP status the subscriber is refused with: the gateway could not reach a working upstream.
    pub fn status(&self) -> StatusCode {
        StatusCode::BAD_GATEWAY
    }
}

/// Answers a `/changes` upgrade request. The upstream WebSocket is opened first, inside the request, so that a
/// subscription the sidecar cannot relay is refused (HTTP 502) before the subscriber's upgrade completes; the
/// relay then runs on its own task in `tracker`.
pub async fn serve(
    mut req: Request<Incoming>,
    version: &Version,
    peer: SocketAddr,
    ctx: &RelayContext,
    tracker: &TaskTracker,
) -> Response<Full<Bytes>> {
    if let Err(message) = protocol::check_changes(version) {
        debug!(%message, "subscription refused");
        return plain(StatusCode::BAD_REQUEST, message);
    }
    if ctx.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let (response, upgrade) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(pair) => pair,
        Err(err) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("bad WebSocket upgrade: {err}\n"),
            )
        }
    };
    let settings = &ctx.settings;
    let query = req.uri().query();
    let subscription = protocol::parse_subscriber_context(query);
    let target = upstream_target(
        req.uri().path(),
        query,
        settings.relay.suppress_upstream_cleanup,
    );
    let span = info_span!("relay", %peer, upstream = %settings.upstream.address);
    let upstream = match connect(&settings.upstream, &target)
        .instrument(span.clone())
        .await
    {
        Ok(upstream) => upstream,
        Err(err) => {
            ctx.instruments.upstream_connect_errors.inc();
            span.in_scope(|| warn!(error = %err, "subscription refused: upstream unavailable"));
            return plain(err.status(), format!("{err}\n"));
        }
    };
    if ctx.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let ctx = ctx.clone();
    tracker.spawn(
        async move {
            match upgrade.await {
                Ok(ws) => {
                    handle_changes(ctx, subscription, ws, upstream).await;
                }
                // The upstream socket is dropped with the task: Zero sees the subscriber leave.
                Err(err) => debug!(error = %err, "upgrade failed"),
            }
        }
        .instrument(span),
    );
    response.map(|_| Full::default())
}

/// The request target sent upstream: the subscriber's path and query string, with `initial=true` turned into
/// `initial=false` when the sidecar owns cleanup.
pub fn upstream_target(path: &str, query: Option<&str>, suppress_upstream_cleanup: bool) -> String {
    match query {
        None => path.to_string(),
        Some(query) if suppress_upstream_cleanup => {
            format!("{path}?{}", protocol::suppress_initial(query))
        }
        Some(query) => format!("{path}?{query}"),
    }
}

/// Opens the upstream WebSocket for `target` (path and query), under `upstream.connect_timeout`.
pub async fn connect(upstream: &UpstreamConfig, target: &str) -> Result<Io, RelayError> {
    let addr = &upstream.address;
    tokio::time::timeout(upstream.connect_timeout, handshake(addr, target))
        .await
        .unwrap_or_else(|_| {
            Err(RelayError::Timeout {
                addr: addr.clone(),
                timeout: upstream.connect_timeout,
            })
        })
}

async fn handshake(addr: &str, target: &str) -> Result<Io, RelayError> {
    let failed = |reason: String| RelayError::Handshake {
        addr: addr.to_string(),
        reason,
    };
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| RelayError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let request = Request::get(target)
        .header(HOST, addr)
        .header(UPGRADE, "websocket")
        .header(CONNECTION, "Upgrade")
        .header(
            "Sec-WebSocket-Key",
            fastwebsockets::handshake::generate_key(),
        )
        .header("Sec-WebSocket-Version", "13")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(e.to_string()))?;
    // The connection future is driven here, in this task, until it hands the socket over; it finishes as soon as
    // a 101 arrives, possibly before the response future is polled again.
    let mut conn = std::pin::pin!(conn.with_upgrades());
    let mut conn_done = false;
    let mut send = std::pin::pin!(sender.send_request(request));
    let response = tokio::select! {
        biased;
        response = &mut send => response,
        result = &mut conn => {
            result.map_err(|e| failed(e.to_string()))?;
            conn_done = true;
            send.await
        }
    }
    .map_err(|e| failed(e.to_string()))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(RelayError::Refused {
            addr: addr.to_string(),
            status: response.status().as_u16(),
        });
    }
    let upgrade_header = response
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok());
    if !upgrade_header.is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(failed("101 without Upgrade: websocket".into()));
    }
    let upgraded = if conn_done {
        hyper::upgrade::on(response).await
    } else {
        tokio::join!(hyper::upgrade::on(response), conn).0
    }
    .map_err(|e| failed(e.to_string()))?;
    Ok(TokioIo::new(upgraded))
}

/// How a relayed connection ended: the first cause, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream closed; `code` is what its close frame carried (`None`: no status code).
    UpstreamClosed {
        code: Option<u16>,
    },
    /// The subscriber closed.
    ClientClosed {
        code: Option<u16>,
    },
    /// The upstream connection broke without a close frame.
    UpstreamGone,
    /// The subscriber's connection broke without a close frame.
    ClientGone,
    /// Nothing arrived from the upstream for a whole `upstream.silence_timeout`.
    UpstreamSilent,
    /// The subscriber did not answer a ping.
    ClientUnresponsive,
    /// The upstream sent something that is not WebSocket; it was closed with this.
    UpstreamProtocolError(CloseWith),
    /// The subscriber sent something that is not WebSocket; it was closed with this.
    ClientProtocolError(CloseWith),
    Shutdown,
}

/// Bytes a read may bring in at once; a buffer with less room than [`MIN_READ_ROOM`] is given this much more.
const READ_SIZE: usize = 32 << 10;
const MIN_READ_ROOM: usize = 4 << 10;

/// One side of the relay: what has happened to its socket.
#[derive(Debug)]
struct Peer {
    /// No more frames are read from it: its close arrived, it broke a protocol rule, or it is gone.
    stopped_reading: bool,
    /// The socket is unusable: nothing more is written to it and what was queued is dropped.
    gone: bool,
    /// The close frame it sent, echoed to it if the other side cannot answer it.
    close_received: Option<BytesMut>,
    /// Frames queued toward it.
    outbox: Outbox,
}

impl Peer {
    fn new(role: Role) -> Self {
        Self {
            stopped_reading: false,
            gone: false,
            close_received: None,
            outbox: Outbox::new(role),
        }
    }

    fn reading(&self) -> bool {
        !self.stopped_reading && !self.gone
    }

    /// Nothing more to read from or write to it.
    fn is_done(&self) -> bool {
        self.gone || (self.stopped_reading && self.outbox.is_closed() && self.outbox.is_empty())
    }

    /// Whether frames relayed toward it should be read now: not while its outbox is at the limit. Frames toward
    /// a side that is gone are dropped, so they never hold reads back.
    fn accepts(&self, limit: usize) -> bool {
        self.gone || self.outbox.len() < limit
    }

    /// Queues frames relayed as received, unless the side is gone (or closed: the outbox then ignores them).
    fn relay(&mut self, frames: Bytes) {
        if !self.gone {
            self.outbox.push_framed(frames);
        }
    }

    /// Queues a control frame this side answers or sends itself.
    fn control(&mut self, opcode: OpCode, payload: &[u8]) {
        if !self.gone {
            self.outbox.push_control(opcode, payload);
        }
    }

    /// Queues a close if none was sent yet. A side that already sent its own close gets it echoed
    /// (RFC 6455 §5.5.1) instead of `with`.
    fn close(&mut self, with: Option<&CloseWith>) {
        if self.gone || self.outbox.is_closed() {
            return;
        }
        match &self.close_received {
            Some(payload) => self.outbox.push(true, OpCode::Close, payload.clone()),
            None => self.outbox.push_close(with),
        }
    }
}

/// Where frames come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Upstream,
}

/// The state of one relayed connection between its socket events; the sockets themselves stay in
/// [`handle_changes`], which feeds each event to one of these methods.
struct Relay<'a> {
    ctx: &'a RelayContext,
    subscription: SubscriberContext,
    client: Peer,
    upstream: Peer,
    /// Set at the first downstream message, when the upstream has registered the subscriber.
    subscribed: bool,
    acks: Option<AckTracker>,
    downstream_messages: Messages,
    client_messages: Messages,
    /// Where a client frame is unmasked to be read.
    scratch: Vec<u8>,
    outcome: Option<Outcome>,
}

impl Relay<'_> {
    fn peer(&mut self, side: Side) -> &mut Peer {
        match side {
            Side::Client => &mut self.client,
            Side::Upstream => &mut self.upstream,
        }
    }

    fn other(side: Side) -> Side {
        match side {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    }

    /// The first cause of the end is the one reported.
    fn ending(&mut self, outcome: Outcome) {
        self.outcome.get_or_insert(outcome);
    }

    fn is_done(&self) -> bool {
        self.client.is_done() && self.upstream.is_done()
    }

    /// Either side has ended or is being closed.
    fn is_closing(&self) -> bool {
        self.client.outbox.is_closed()
            || self.upstream.outbox.is_closed()
            || self.client.gone
            || self.upstream.gone
    }

    fn shutdown(&mut self) {
        self.ending(Outcome::Shutdown);
        let with = CloseWith::new(close::GOING_AWAY, "sidecar shutting down");
        self.client.close(Some(&with));
        self.upstream.close(Some(&with));
    }

    /// The subscriber's socket broke, or it stopped answering pings: its upstream is closed.
    fn client_gone(&mut self, outcome: Outcome, reason: &str) {
        self.client.gone = true;
        self.client.stopped_reading = true;
        self.ending(outcome);
        self.upstream
            .close(Some(&CloseWith::new(close::GOING_AWAY, reason)));
    }

    /// The upstream's socket broke or fell silent: the subscriber is told with 1011.
    fn upstream_gone(&mut self, outcome: Outcome, reason: &str) {
        self.upstream.gone = true;
        self.upstream.stopped_reading = true;
        self.ending(outcome);
        self.client
            .close(Some(&CloseWith::new(close::INTERNAL_ERROR, reason)));
    }

    /// A side broke the WebSocket protocol: it is closed with `with`, the other side is told.
    fn protocol_error(&mut self, source: Side, with: CloseWith) {
        self.peer(source).stopped_reading = true;
        self.peer(source).close(Some(&with));
        match source {
            Side::Upstream => {
                let reason = format!("Error: upstream: {}", with.reason);
                self.ending(Outcome::UpstreamProtocolError(with));
                self.client
                    .close(Some(&CloseWith::new(close::INTERNAL_ERROR, reason)));
            }
            Side::Client => {
                self.ending(Outcome::ClientProtocolError(with));
                self.upstream
                    .close(Some(&CloseWith::new(close::GOING_AWAY, "subscriber gone")));
            }
        }
    }

    /// Handles every complete frame at the front of `buf`, which holds what was read from `source`. Data frames
    /// are relayed as they came, headers included and without a copy; control frames are answered here.
    fn process(&mut self, source: Side, buf: &mut BytesMut) {
        let from_client = source == Side::Client;
        let max = self.ctx.settings.max_message_bytes;
        // Bytes at the front of `buf` that are whole data frames, relayed together.
        let mut frames = 0;
        let (mut data_frames, mut data_bytes) = (0u64, 0u64);
        while self.peer(source).reading() {
            let header = match ws::parse_header(&buf[frames..], from_client, max) {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(with) => {
                    debug!(side = ?source, reason = %with.reason, "bad frame");
                    self.relay(source, buf, &mut frames);
                    self.protocol_error(source, with);
                    break;
                }
            };
            let end = frames + header.frame_len();
            if buf.len() < end {
                // The frames before this one leave now; the buffer makes room for the rest of it.
                self.relay(source, buf, &mut frames);
                buf.reserve(header.frame_len() - buf.len());
                break;
            }
            if header.is_control() {
                self.relay(source, buf, &mut frames);
                let frame = buf.split_to(header.frame_len());
                let mut payload = BytesMut::from(&frame[header.len..]);
                if let Some(key) = header.mask {
                    fastwebsockets::unmask(&mut payload, key);
                }
                self.control(source, header.opcode, payload);
                continue;
            }
            self.data(source, &header, &buf[frames + header.len..end]);
            data_frames += 1;
            data_bytes += (end - frames - header.len) as u64;
            frames = end;
        }
        self.relay(source, buf, &mut frames);
        if data_frames > 0 {
            let direction = match source {
                Side::Upstream => crate::metrics::Direction::Downstream,
                Side::Client => crate::metrics::Direction::Upstream,
            };
            self.ctx
                .instruments
                .relayed(direction, data_frames, data_bytes);
        }
        if !self.peer(source).reading() {
            // Nothing after a close or a broken frame is read.
            buf.clear();
        }
    }

    /// Passes the first `frames` bytes of `buf` to the other side.
    fn relay(&mut self, source: Side, buf: &mut BytesMut, frames: &mut usize) {
        if *frames > 0 {
            let relayed = buf.split_to(std::mem::take(frames)).freeze();
            self.peer(Self::other(source)).relay(relayed);
        }
    }

    /// Reads what ack tracking needs from a data frame: commits going down, acks coming up.
    fn data(&mut self, source: Side, header: &ws::Header, payload: &[u8]) {
        match source {
            Side::Upstream => {
                if !self.subscribed {
                    // The upstream answers only once it has registered the subscriber (§5.3 4a).
                    self.subscribed = true;
                    self.acks = on_subscribed(self.ctx, &self.subscription);
                }
                if let Some(acks) = &mut self.acks {
                    self.downstream_messages
                        .push(header.fin, header.opcode, payload, |message| {
                            if let Downstream::Commit { id, watermark } = inspect(message) {
                                acks.sent_commit(id, watermark);
                            }
                        });
                }
            }
            Side::Client => {
                let Some(acks) = &mut self.acks else {
                    return;
                };
                // Frames too long to be part of an ack are not unmasked: only their length matters.
                let payload = match header.mask {
                    Some(key) if payload.len() <= ACK_INSPECT_LIMIT => {
                        self.scratch.clear();
                        self.scratch.extend_from_slice(payload);
                        fastwebsockets::unmask(&mut self.scratch, key);
                        &self.scratch[..]
                    }
                    _ => payload,
                };
                self.client_messages
                    .push(header.fin, header.opcode, payload, |message| {
                        if let Ok(id) = protocol::decode_ack(message) {
                            acks.acked(id);
                        }
                    });
            }
        }
    }

    /// Each hop keeps its own liveness: pings are answered here and never passed on; closes are passed on.
    fn control(&mut self, source: Side, opcode: OpCode, payload: BytesMut) {
        match opcode {
            OpCode::Ping => self.peer(source).control(OpCode::Pong, &payload),
            OpCode::Close => {
                self.peer(source).stopped_reading = true;
                match ws::read_close(payload) {
                    PeerClose::Valid { code, payload } => {
                        self.ending(match source {
                            Side::Upstream => Outcome::UpstreamClosed { code },
                            Side::Client => Outcome::ClientClosed { code },
                        });
                        self.peer(source).close_received = Some(payload.clone());
                        // Passed on as sent; the other side's answer goes back as the answer to it.
                        let other = self.peer(Self::other(source));
                        if other.gone {
                            self.peer(source).close(None);
                        } else {
                            other.outbox.push(true, OpCode::Close, payload);
                        }
                    }
                    PeerClose::Invalid(with) => self.protocol_error(source, with),
                }
            }
            _ => {}
        }
    }
}

/// Reads what the socket has into `buf`, making room first if it is nearly full. Cancel-safe.
async fn read_some<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < MIN_READ_ROOM {
        buf.reserve(READ_SIZE);
    }
    reader.read_buf(buf).await
}

/// Relays one subscription until either side ends it or the sidecar shuts down. `client` has just completed
/// its upgrade; `upstream` is the socket [`connect`] returned.
async fn handle_changes(
    ctx: RelayContext,
    subscription: SubscriberContext,
    client: WebSocket<Io>,
    upstream: Io,
) -> Outcome {
    let settings = ctx.settings.clone();
    let limit = settings.relay.max_buffered_bytes;
    let (mut client_reader, mut client_writer) = tokio::io::split(client.into_inner());
    let (mut upstream_reader, mut upstream_writer) = tokio::io::split(upstream);
    let mut from_client = BytesMut::new();
    let mut from_upstream = BytesMut::new();
    let linger = tokio::time::sleep(Duration::ZERO);
    // One shutdown future for the whole connection: creating one per loop turn would cost a lock each time.
    let shutdown = ctx.shutdown.cancelled();
    tokio::pin!(linger, shutdown);
    let mut lingering = false;
    let mut shutting_down = false;
    let mut client_liveness = Liveness::new(settings.ping_interval);
    let mut upstream_liveness = Liveness::new(settings.upstream.silence_timeout);
    // Reads held back since the last liveness check: silence then is not the peer's fault.
    let mut client_paused = false;
    let mut upstream_paused = false;

    let mut relay = Relay {
        ctx: &ctx,
        subscription,
        client: Peer::new(Role::Server),
        upstream: Peer::new(Role::Client),
        subscribed: false,
        acks: None,
        downstream_messages: Messages::new(settings.max_message_bytes),
        client_messages: Messages::new(ACK_INSPECT_LIMIT),
        scratch: Vec::new(),
        outcome: None,
    };

    while !relay.is_done() {
        // Once either side has ended, the rest of the close handshake gets a bounded time.
        if !lingering && relay.is_closing() {
            lingering = true;
            linger.as_mut().reset(Instant::now() + ws::CLOSE_LINGER);
        }
        let upstream_readable = relay.upstream.reading() && relay.client.accepts(limit);
        let client_readable = relay.client.reading() && relay.upstream.accepts(limit);
        upstream_paused |= relay.upstream.reading() && !upstream_readable;
        client_paused |= relay.client.reading() && !client_readable;

        // Reads come before flushes, so that what a read brought in leaves in one write; the timers and the
        // shutdown signal (a lock on a token every connection shares) only when nothing else is ready.
        tokio::select! {
            biased;
            _ = &mut linger, if lingering => break,
            read = read_some(&mut upstream_reader, &mut from_upstream), if upstream_readable => {
                match read {
                    Ok(n) if n > 0 => {
                        upstream_liveness.heard();
                        relay.process(Side::Upstream, &mut from_upstream);
                        release_if_idle(&mut from_upstream);
                    }
                    result => {
                        debug!(error = ?result.err(), "upstream connection lost");
                        relay.upstream_gone(Outcome::UpstreamGone, "Error: upstream connection lost");
                    }
                }
            }
            read = read_some(&mut client_reader, &mut from_client), if client_readable => {
                match read {
                    Ok(n) if n > 0 => {
                        client_liveness.heard();
                        relay.process(Side::Client, &mut from_client);
                        release_if_idle(&mut from_client);
                    }
                    result => {
                        debug!(error = ?result.err(), "subscriber connection lost");
                        relay.client_gone(Outcome::ClientGone, "subscriber gone");
                    }
                }
            }
            result = relay.client.outbox.flush(&mut client_writer),
                if !relay.client.outbox.is_empty() && !relay.client.gone =>
            {
                if let Err(err) = result {
                    debug!(error = %err, "subscriber connection lost");
                    relay.client_gone(Outcome::ClientGone, "subscriber gone");
                }
            }
            result = relay.upstream.outbox.flush(&mut upstream_writer),
                if !relay.upstream.outbox.is_empty() && !relay.upstream.gone =>
            {
                if let Err(err) = result {
                    debug!(error = %err, "upstream connection lost");
                    relay.upstream_gone(Outcome::UpstreamGone, "Error: upstream connection lost");
                }
            }
            alive = client_liveness.tick(), if relay.client.reading() => {
                // A subscriber with frames still queued toward it is slow to read, not silent; it is pinged
                // again once it has caught up.
                let excused = std::mem::take(&mut client_paused) || !relay.client.outbox.is_empty();
                if alive || excused {
                    if relay.client.outbox.is_empty() {
                        relay.client.control(OpCode::Ping, b"");
                    }
                } else {
                    // Like Zero's terminate(): no close handshake with a peer that stopped answering.
                    debug!("subscriber did not answer a ping");
                    relay.client_gone(Outcome::ClientUnresponsive, "subscriber unresponsive");
                }
            }
            alive = upstream_liveness.tick(), if relay.upstream.reading() => {
                let excused = std::mem::take(&mut upstream_paused);
                if !alive && !excused {
                    debug!("upstream silent");
                    relay.upstream_gone(Outcome::UpstreamSilent, "Error: upstream silent");
                }
            }
            _ = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                relay.shutdown();
            }
        }
    }
    let outcome = relay.outcome.take().unwrap_or(Outcome::ClientGone);
    drop(relay);
    info!(outcome = ?outcome, "subscription ended");
    outcome
}

/// An idle connection keeps no read buffer.
fn release_if_idle(buf: &mut BytesMut) {
    if buf.is_empty() {
        *buf = BytesMut::new();
    }
}

/// The upstream has answered the subscription: end the task's reservation if this is its first subscription after
/// a restore (whatever the mode, §11.6), and start tracking acks if the subscriber said where it stands.
fn on_subscribed(ctx: &RelayContext, subscription: &SubscriberContext) -> Option<AckTracker> {
    if subscription.initial {
        if let Some(task_id) = &subscription.task_id {
            if let Some(held) = ctx.registry.end_by_subscription(task_id, Instant::now()) {
                info!(task_id = %task_id, held = ?held, "reservation ended by its subscription");
            }
        }
    }
    let (Some(id), Some(replica_version), Some(watermark)) = (
        &subscription.id,
        &subscription.replica_version,
        &subscription.watermark,
    ) else {
        return None;
    };
    info!(
        id = %id,
        task_id = subscription.task_id.as_deref().unwrap_or(""),
        mode = subscription.mode.as_str(),
        watermark = %watermark,
        "subscribed"
    );
    let handle = ctx.subscribers.connect(SubscriberInfo {
        id: id.clone(),
        task_id: subscription.task_id.clone(),
        mode: subscription.mode.as_str().to_string(),
        replica_version: replica_version.clone(),
        watermark: watermark.clone(),
    });
    Some(AckTracker::new(
        handle,
        ctx.settings.relay.max_pending_commits,
    ))
}

/// Commits sent to one subscriber and not yet acknowledged, in id order (PROTOCOL.md §6.8).
struct AckTracker {
    handle: SubscriberHandle,
    pending: VecDeque<(u64, String)>,
    max_pending: usize,
}

impl AckTracker {
    fn new(handle: SubscriberHandle, max_pending: usize) -> Self {
        Self {
            handle,
            pending: VecDeque::new(),
            max_pending,
        }
    }

    fn sent_commit(&mut self, id: u64, watermark: String) {
        if self.pending.len() >= self.max_pending {
            merge_half(&mut self.pending);
        }
        self.pending.push_back((id, watermark));
    }

    /// An ack of message `id` means every message up to it was consumed (acks come in order): the newest commit
    /// at or before it is durable on the subscriber.
    fn acked(&mut self, id: u64) {
        let mut newest = None;
        while self
            .pending
            .front()
            .is_some_and(|(commit, _)| *commit <= id)
        {
            newest = self.pending.pop_front().map(|(_, watermark)| watermark);
        }
        if let Some(watermark) = newest {
            self.handle.ack(&watermark);
        }
    }
}

/// Drops every other pending commit, always keeping the newest: an ack then advances to the newest kept commit
/// at or before it, which lags the exact one by at most a few commits and never leads it.
fn merge_half(pending: &mut VecDeque<(u64, String)>) {
    let keep = pending.len() % 2;
    let mut index = 0;
    pending.retain(|_| {
        index += 1;
        index % 2 == keep
    });
}

/// Follows message boundaries across fragments and hands each complete text message, up to `limit` bytes, to an
/// inspection; the frames themselves are relayed as they came. Only a fragmented message is copied.
struct Messages {
    limit: usize,
    /// The text message being collected from fragments; `None` inside it once it grew past `limit`.
    partial: Option<Option<BytesMut>>,
}

impl Messages {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            partial: None,
        }
    }

    fn push(&mut self, fin: bool, opcode: OpCode, payload: &[u8], inspect: impl FnOnce(&[u8])) {
        match opcode {
            OpCode::Text | OpCode::Binary => {
                self.partial = None;
                if opcode != OpCode::Text {
                    if !fin {
                        self.partial = Some(None);
                    }
                } else if fin {
                    if payload.len() <= self.limit {
                        inspect(payload);
                    }
                } else {
                    self.partial =
                        Some((payload.len() <= self.limit).then(|| BytesMut::from(payload)));
                }
            }
            OpCode::Continuation => {
                let Some(partial) = &mut self.partial else {
                    return;
                };
                if let Some(buffer) = partial {
                    if buffer.len() + payload.len() > self.limit {
                        *partial = None;
                    } else {
                        buffer.extend_from_slice(payload);
                    }
                }
                if fin {
                    if let Some(Some(message)) = self.partial.take() {
                        inspect(&message);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collected(messages: &mut Messages, frames: &[(bool, OpCode, &str)]) -> Vec<String> {
        let mut seen = Vec::new();
        for (fin, opcode, payload) in frames {
            messages.push(*fin, *opcode, payload.as_bytes(), |m| {
                seen.push(String::from_utf8_lossy(m).into_owned())
            });
        }
        seen
    }

    #[test]
    fn fragments_are_joined_for_inspection_within_the_limit() {
        let mut messages = Messages::new(10);
        let seen = collected(
            &mut messages,
            &[
                (true, OpCode::Text, "whole"),
                (false, OpCode::Text, "{\"ack\""),
                (true, OpCode::Continuation, ":1}"),
                (false, OpCode::Text, "123456"),
                (true, OpCode::Continuation, "78901"),
                (true, OpCode::Text, "toolong-----"),
                (false, OpCode::Binary, "bin"),
                (true, OpCode::Continuation, "ary"),
                (true, OpCode::Continuation, "stray"),
                (false, OpCode::Text, "a"),
                (true, OpCode::Text, "b"),
            ],
        );
        assert_eq!(seen, ["whole", "{\"ack\":1}", "b"]);
    }

    #[test]
    fn merging_keeps_the_newest_commit() {
        let mut pending: VecDeque<(u64, String)> = (1..=5).map(|i| (i, format!("0{i}"))).collect();
        merge_half(&mut pending);
        assert_eq!(
            pending.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            [1, 3, 5]
        );
        let mut pending: VecDeque<(u64, String)> = (1..=4).map(|i| (i, format!("0{i}"))).collect();
        merge_half(&mut pending);
        assert_eq!(
            pending.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            [2, 4]
        );
    }

    #[test]
    fn acks_advance_to_the_newest_acknowledged_commit() {
        let subscribers = Subscribers::default();
        let handle = subscribers.connect(SubscriberInfo {
            id: "s".into(),
            task_id: None,
            mode: "serving".into(),
            replica_version: "01".into(),
            watermark: "0a".into(),
        });
        let mut acks = AckTracker::new(handle, 4);
        // status 1, begin 2, data 3, commit 4 (0b), begin 5, commit 6 (0c)
        acks.sent_commit(4, "0b".into());
        acks.sent_commit(6, "0c".into());
        for id in 1..=3 {
            acks.acked(id);
        }
        assert_eq!(subscribers.acked_by_id(), [("s".into(), "0a".into())]);
        acks.acked(4);
        assert_eq!(subscribers.acked_by_id(), [("s".into(), "0b".into())]);
        acks.acked(5);
        assert_eq!(subscribers.acked_by_id(), [("s".into(), "0b".into())]);
        acks.acked(6);
        assert_eq!(subscribers.acked_by_id(), [("s".into(), "0c".into())]);

        // Past the limit, pending commits are merged: acks still advance, never past what was acknowledged.
        for i in 0..10u64 {
            acks.sent_commit(10 + i, format!("1{i}"));
        }
        assert!(acks.pending.len() <= 4);
        acks.acked(14);
        let acked = subscribers.acked_by_id()[0].1.clone();
        assert!(acked.as_str() <= "14" && acked.as_str() >= "0c", "{acked}");
        acks.acked(19);
        assert_eq!(subscribers.acked_by_id(), [("s".into(), "19".into())]);
    }

    #[test]
    fn the_query_is_forwarded_with_only_initial_changed() {
        let q = "taskID=t1&id=a%2Fb&initial=true";
        assert_eq!(
            upstream_target("/replication/v3/changes", Some(q), true),
            "/replication/v3/changes?taskID=t1&id=a%2Fb&initial=false"
        );
        assert_eq!(
            upstream_target("/replication/v3/changes", Some(q), false),
            format!("/replication/v3/changes?{q}")
        );
        assert_eq!(
            upstream_target("/replication/v5/changes", None, true),
            "/replication/v5/changes"
        );
        assert_eq!(
            upstream_target("/replication/v5/changes", Some(""), true),
            "/replication/v5/changes?"
        );
    }
}
