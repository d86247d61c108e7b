//! The `/changes` relay: each subscription is a WebSocket to Zero's change-streamer, opened before the
//! subscriber's own upgrade is answered ([`serve`]), and every frame is relayed unchanged both ways
//! (docs/protocol.md, "The change stream" and "Relaying a subscription"). A subscription the sidecar cannot relay is
//! refused before the upgrade: HTTP 400 for a path or version no Zero serves, HTTP 502 when the upstream cannot be
//! reached, which makes Zero's client back off instead of reconnecting every 25 ms (docs/protocol.md, "Reconnect
//! storms after a rejected upgrade").
//!
//! What the relay owns: the upstream handshake, each hop's liveness (the subscriber is pinged and dropped after
//! `server.peer_timeout` of silence, a silent upstream is dropped), close codes passed through both ways,
//! back-pressure and its limit (a subscriber that stops reading is dropped after `relay.write_stall_timeout`), ending
//! the subscriber's snapshot reservation once the upstream has registered it (docs/protocol.md, "How a reservation
//! ends"), and each subscriber's acknowledged watermark for the cleanup policy (docs/protocol.md, "A subscriber's
//! acknowledged watermark"). What it does not: decide whether a subscription is valid;
//! the upstream does, and its answers (error frames, closes with Zero's reasons) reach the subscriber as sent.
//!
//! One task serves both directions of a connection: two [`Inbox`]es read, two [`Outbox`]es flushed as `select!`
//! branches, and the pings, all cancel-safe. What happens on each socket event is decided by the connection's state
//! machine (`Relay`, no I/O, tested as a table). Frames are not decoded and re-encoded: their headers are read in
//! place, data frames are passed on as received (a read's worth at a time, copied only when it is a few hundred
//! bytes, so that a read of acks does not pin the read buffer), and only control frames and what ack tracking needs
//! (through an [`Assembler`]) are looked at. A source is read only while the
//! outbox toward the other side holds less than `relay.max_buffered_bytes`, so a subscriber that reads slowly
//! stops the reads from its upstream and TCP does the rest; nothing else is buffered beyond the frame being read.
//! The subscriber's socket is woken only once the acks sure to come are there ([`crate::streamer::wakeup`]), so a
//! transaction's acks are read and forwarded in one go.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Role, WebSocket};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::cleanup::reservations::{Registry, Ticket};
use crate::cleanup::subscribers::{SubscriberHandle, SubscriberInfo, Subscribers};
use crate::net::http::{accept_upgrade, plain, spawn_upgraded};
use crate::net::tls::UpstreamTls;
use crate::net::ws::{
    self, Assembler, CloseWith, Inbox, Io, Liveness, Outbox, PeerClose, Reads, WriteStall,
};
use crate::protocol::inspect::{inspect, Downstream};
use crate::protocol::{self, close, SubscriberContext, Version};
use crate::streamer::config::{RelayConfig, UpstreamConfig};
use crate::streamer::wakeup::AckWakeups;

/// Client messages longer than this are not acks; they are relayed without being read.
const ACK_INSPECT_LIMIT: usize = 256;

/// Acks queued toward the upstream beyond this many bytes leave without waiting for the rest of their batch.
const ACK_BATCH_BYTES: usize = 4 << 10;

/// Everything a relayed connection needs besides its sockets.
#[derive(Clone)]
pub struct RelayContext {
    pub settings: Arc<Settings>,
    pub registry: Registry,
    pub subscribers: Subscribers,
    /// Relayed frames and bytes, counted once per read.
    pub instruments: crate::ops::metrics::Instruments,
    pub shutdown: CancellationToken,
}

/// The relay's slice of the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub upstream: UpstreamConfig,
    /// `upstream.tls`, loaded: the relay connects with `wss://`.
    pub upstream_tls: Option<Arc<crate::net::tls::UpstreamTls>>,
    pub relay: RelayConfig,
    /// How often the subscriber is pinged (`server.ping_interval`); its write progress is checked as often.
    pub ping_interval: Duration,
    /// A subscriber silent this long is dropped (`server.peer_timeout`).
    pub peer_timeout: Duration,
    /// Largest message or frame read from either side (`server.max_message_bytes`).
    pub max_message_bytes: usize,
}

/// Why a subscription could not be relayed; the subscriber gets an HTTP error before its upgrade.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("upstream {addr} unreachable: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("upstream {addr} TLS handshake failed: {source}")]
    Tls {
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
    let (response, upgrade) = match accept_upgrade(&mut req) {
        Ok(accepted) => accepted,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    let settings = &ctx.settings;
    let query = req.uri().query();
    let subscription = protocol::parse_subscriber_context(query);
    // Taken before anything can wait: only reservations open by now are this subscription's to end.
    let requested = ctx.registry.ticket();
    let target = upstream_target(
        req.uri().path(),
        query,
        settings.relay.suppress_upstream_cleanup,
    );
    let socket = req
        .extensions()
        .get::<crate::net::sockopt::ClientSocket>()
        .map(|socket| socket.0);
    let span = info_span!("relay", %peer, upstream = %settings.upstream.address);
    let upstream = match connect(
        &settings.upstream,
        settings.upstream_tls.as_deref(),
        &target,
    )
    .instrument(span.clone())
    .await
    {
        Ok(upstream) => {
            ctx.subscribers.upstream_reached(Instant::now());
            ctx.instruments.upstream.update(|u| u.attempted(None));
            upstream
        }
        Err(err) => {
            ctx.subscribers.upstream_lost();
            ctx.instruments.upstream_connect_errors.inc();
            ctx.instruments
                .upstream
                .update(|u| u.attempted(Some(err.to_string())));
            span.in_scope(|| warn!(error = %err, "subscription refused: upstream unavailable"));
            // The gateway could not reach a working upstream.
            return plain(StatusCode::BAD_GATEWAY, format!("{err}\n"));
        }
    };
    if ctx.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let ctx = ctx.clone();
    // A failed upgrade drops the upstream socket with the task: Zero sees the subscriber leave.
    spawn_upgraded(tracker, upgrade, span, move |ws| async move {
        handle_changes(ctx, subscription, requested, ws, upstream, socket).await;
    });
    response
}

/// The request target sent upstream: the subscriber's path and query string, with `initial=true` turned into
/// `initial=false` when the sidecar owns cleanup.
fn upstream_target(path: &str, query: Option<&str>, suppress_upstream_cleanup: bool) -> String {
    match query {
        None => path.to_string(),
        Some(query) if suppress_upstream_cleanup => {
            format!("{path}?{}", protocol::suppress_initial(query))
        }
        Some(query) => format!("{path}?{query}"),
    }
}

/// Opens the upstream WebSocket for `target` (path and query), under `upstream.connect_timeout`, which covers
/// the TLS handshake too.
async fn connect(
    upstream: &UpstreamConfig,
    tls: Option<&UpstreamTls>,
    target: &str,
) -> Result<Io, RelayError> {
    let addr = &upstream.address;
    tokio::time::timeout(upstream.connect_timeout, handshake(addr, tls, target))
        .await
        .unwrap_or_else(|_| {
            Err(RelayError::Timeout {
                addr: addr.clone(),
                timeout: upstream.connect_timeout,
            })
        })
}

async fn handshake(addr: &str, tls: Option<&UpstreamTls>, target: &str) -> Result<Io, RelayError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| RelayError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    match tls {
        None => upgrade(addr, stream, target).await,
        Some(tls) => {
            let stream = tls
                .connect(stream)
                .await
                .map_err(|source| RelayError::Tls {
                    addr: addr.to_string(),
                    source,
                })?;
            upgrade(addr, stream, target).await
        }
    }
}

/// The WebSocket upgrade over an open connection, plain or TLS; either way the socket comes back as an [`Io`].
async fn upgrade<S>(addr: &str, stream: S, target: &str) -> Result<Io, RelayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let failed = |reason: String| RelayError::Handshake {
        addr: addr.to_string(),
        reason,
    };
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
enum SubscriptionEnd {
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
    /// Nothing arrived from the subscriber for `server.peer_timeout`, while nothing waited toward it.
    ClientUnresponsive,
    /// Bytes waited toward the subscriber for `relay.write_stall_timeout` without one written: it stopped reading.
    ClientStalled,
    /// The upstream sent something that is not WebSocket; it was closed with this.
    UpstreamProtocolError(CloseWith),
    /// The subscriber sent something that is not WebSocket; it was closed with this.
    ClientProtocolError(CloseWith),
    Shutdown,
}

impl SubscriptionEnd {
    /// The upstream ended it: closed, broke, fell silent or broke the protocol.
    fn is_upstreams(&self) -> bool {
        matches!(
            self,
            Self::UpstreamClosed { .. }
                | Self::UpstreamGone
                | Self::UpstreamSilent
                | Self::UpstreamProtocolError(_)
        )
    }
}

/// One side of the relay: what has happened to its socket.
#[derive(Debug)]
struct Peer {
    /// No more frames are read from it: its close arrived, it broke a protocol rule, or it is gone.
    stopped_reading: bool,
    /// The socket is unusable: nothing more is written to it and what was queued is dropped.
    gone: bool,
    /// The close frame it sent, echoed to it if the other side cannot answer it.
    close_received: Option<BytesMut>,
    /// Reads from it were held back (the other side's outbox was full) since its last liveness check: silence
    /// then is not its fault.
    held_back: bool,
    /// Frames queued toward it.
    outbox: Outbox,
}

impl Peer {
    fn new(role: Role) -> Self {
        Self {
            stopped_reading: false,
            gone: false,
            close_received: None,
            held_back: false,
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
    /// (RFC 6455, section 5.5.1) instead of `with`.
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

/// One side of a relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The subscriber.
    Client,
    /// Zero's change-streamer.
    Upstream,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    }
}

/// One relayed connection as a state machine without I/O: [`handle_changes`] owns the sockets, asks what to read
/// and write ([`Relay::wants_read`], [`Relay::wants_write`], [`Relay::is_done`]), writes the outboxes, and feeds
/// every socket event to one of the `on_*` methods.
struct Relay<'a> {
    ctx: &'a RelayContext,
    subscription: SubscriberContext,
    /// Where the reservation registry stood when the subscription was requested.
    requested: Ticket,
    client: Peer,
    upstream: Peer,
    /// Set at the first downstream message, when the upstream has registered the subscriber.
    subscribed: bool,
    /// Tracked from the start: the upstream connection is up, and the subscriber resumes at its request's watermark
    /// whether or not the upstream has answered yet.
    acks: Option<AckTracker>,
    /// Downstream messages, followed for the commits in them.
    downstream_messages: Assembler,
    /// The subscriber's messages, followed for its acks.
    client_messages: Assembler,
    /// Where a client frame is unmasked to be read.
    scratch: Vec<u8>,
    /// How many bytes of the subscriber's acks are worth waking up for; it also counts the messages passed down.
    wakeups: AckWakeups,
    /// Until when the acks queued toward the upstream wait for the ones sure to follow, to leave in one write
    /// (see [`Relay::batch_acks`]).
    ack_hold: Option<Instant>,
    counted: Counted,
    outcome: Option<SubscriptionEnd>,
}

/// The relay counters of both directions.
struct Counted {
    downstream: crate::ops::metrics::RelayCounters,
    upstream: crate::ops::metrics::RelayCounters,
}

impl<'a> Relay<'a> {
    fn new(ctx: &'a RelayContext, subscription: SubscriberContext, requested: Ticket) -> Self {
        // Zero answers a subscription only once its storer has caught up, which under a large transaction can take
        // long: a lagging subscriber that reconnects must bound cleanup at its watermark from the handshake on, not
        // from that first frame.
        let acks = track(ctx, &subscription);
        Self {
            ctx,
            subscription,
            requested,
            client: Peer::new(Role::Server),
            upstream: Peer::new(Role::Client),
            subscribed: false,
            acks,
            downstream_messages: Assembler::new(ctx.settings.max_message_bytes),
            client_messages: Assembler::new(ACK_INSPECT_LIMIT),
            scratch: Vec::new(),
            wakeups: AckWakeups::new(ctx.settings.relay.ack_wakeup_bytes),
            ack_hold: None,
            counted: Counted {
                downstream: ctx
                    .instruments
                    .relay_counters(crate::ops::metrics::Direction::Downstream),
                upstream: ctx
                    .instruments
                    .relay_counters(crate::ops::metrics::Direction::Upstream),
            },
            outcome: None,
        }
    }

    fn peer(&mut self, side: Side) -> &mut Peer {
        match side {
            Side::Client => &mut self.client,
            Side::Upstream => &mut self.upstream,
        }
    }

    fn peer_ref(&self, side: Side) -> &Peer {
        match side {
            Side::Client => &self.client,
            Side::Upstream => &self.upstream,
        }
    }

    /// The first cause of the end is the one reported.
    fn ending(&mut self, outcome: SubscriptionEnd) {
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

    /// Frames are still read from `side`: its liveness is checked.
    fn is_reading(&self, side: Side) -> bool {
        self.peer_ref(side).reading()
    }

    /// Whether `side` should be read now: not while the outbox toward the other side is at
    /// `relay.max_buffered_bytes`. A read held back is remembered for `side`'s next liveness check.
    fn wants_read(&mut self, side: Side) -> bool {
        let limit = self.ctx.settings.relay.max_buffered_bytes;
        let reading = self.peer_ref(side).reading();
        let readable = reading && self.peer_ref(side.other()).accepts(limit);
        self.peer(side).held_back |= reading && !readable;
        readable
    }

    /// Whether frames are queued toward `side` and can be written: not acks waiting for their batch, unless the
    /// connection is closing.
    fn wants_write(&self, side: Side) -> bool {
        let peer = self.peer_ref(side);
        let held = side == Side::Upstream && self.ack_hold.is_some() && !self.is_closing();
        !peer.outbox.is_empty() && !peer.gone && !held
    }

    /// The subscriber's socket's receive low-water mark to set now: the bytes of the acks sure to come, 1 (wake
    /// for anything) once either side is closing or the subscriber is no longer read, `None` to leave it.
    fn ack_wakeup_threshold(&self) -> Option<u64> {
        if self.is_closing() || !self.client.reading() {
            Some(1)
        } else {
            self.wakeups.threshold()
        }
    }

    /// The subscriber's acks waited `relay.ack_wakeup_wait` for the rest of theirs: read what came.
    fn on_ack_wakeup_wait_end(&mut self) {
        self.wakeups.waited_too_long();
    }

    /// Until when acks wait toward the upstream, if they do.
    fn ack_hold(&self) -> Option<Instant> {
        self.ack_hold
    }

    /// The acks' batch window has ended: they leave as they are.
    fn on_ack_window_end(&mut self) {
        self.ack_hold = None;
    }

    /// Decides, after a read from the subscriber, whether the acks queued toward the upstream leave now or wait
    /// for the ones sure to follow. Zero's client acks each message in its own write as it finishes it, so a
    /// transaction of five messages brings five acks, one read each; a generic proxy writes each upstream. The
    /// relay knows which messages are still unacknowledged, so while the newest ack is below the newest message
    /// relayed it holds them, and writes them together once the subscriber has acked everything relayed, within
    /// `relay.ack_batch_window` at most, or once they fill [`ACK_BATCH_BYTES`]. An ack that leaves nothing in flight
    /// is never held: it is the one an upstream pacing on acks waits for. Anything else from the subscriber (any
    /// other frame, a close) ends the wait, and so does an upstream ping, so no answer is ever delayed.
    ///
    /// `only_acks`: the read brought whole acks and nothing else, the newest `newest_ack`; `was_idle`: nothing
    /// waited toward the upstream before the read, beyond held acks.
    fn batch_acks(&mut self, only_acks: bool, newest_ack: Option<u64>, was_idle: bool) {
        let window = self.ctx.settings.relay.ack_batch_window;
        // Zero numbers a connection's messages 1, 2, 3…: an ack below the newest relayed is sure to have followers.
        let more_coming = newest_ack.is_some_and(|id| id < self.wakeups.messages_relayed());
        if only_acks
            && more_coming
            && was_idle
            && !window.is_zero()
            && self.upstream.outbox.len() < ACK_BATCH_BYTES
        {
            self.ack_hold.get_or_insert_with(|| Instant::now() + window);
        } else {
            self.ack_hold = None;
        }
    }

    /// The sidecar is shutting down: both sides are closed with 1001.
    fn on_shutdown(&mut self) {
        self.ending(SubscriptionEnd::Shutdown);
        let with = CloseWith::new(close::GOING_AWAY, "sidecar shutting down");
        self.client.close(Some(&with));
        self.upstream.close(Some(&with));
    }

    /// `side`'s connection broke: a read ended or failed, or a write failed.
    fn on_lost(&mut self, side: Side) {
        match side {
            Side::Client => self.client_gone(SubscriptionEnd::ClientGone, "subscriber gone"),
            Side::Upstream => self.upstream_gone(
                SubscriptionEnd::UpstreamGone,
                "Error: upstream connection lost",
            ),
        }
    }

    /// Whether `side` could not have answered since its previous liveness check, which then counts as hearing
    /// from it: reads from it were held back (the other side's outbox was full), or, for the subscriber, frames
    /// still wait toward it, its pings among them. A subscriber that stops reading is the write-stall rule's
    /// ([`Relay::on_write_stalled`]), with its own outcome and log.
    fn excused(&mut self, side: Side) -> bool {
        let peer = self.peer(side);
        let held_back = std::mem::take(&mut peer.held_back);
        held_back || (side == Side::Client && !peer.outbox.is_empty())
    }

    /// `side`'s liveness check at a ping time; `silent`: nothing arrived from it for the peer (or upstream silence)
    /// timeout, and it was not excused. The subscriber is pinged, or dropped when silent; a silent upstream is
    /// dropped.
    fn on_liveness_check(&mut self, side: Side, silent: bool) {
        match (side, silent) {
            (Side::Client, false) => {
                // A subscriber still reading what is queued gets its ping once it has caught up.
                if self.client.outbox.is_empty() {
                    self.client.control(OpCode::Ping, b"");
                    self.wakeups.pinged();
                }
            }
            (Side::Client, true) => {
                // Like Zero's terminate(): no close handshake with a peer that stopped answering.
                debug!("subscriber silent for server.peer_timeout");
                self.client_gone(
                    SubscriptionEnd::ClientUnresponsive,
                    "subscriber unresponsive",
                );
            }
            (Side::Upstream, false) => {}
            (Side::Upstream, true) => {
                debug!("upstream silent");
                self.upstream_gone(SubscriptionEnd::UpstreamSilent, "Error: upstream silent");
            }
        }
    }

    /// Bytes waited toward the subscriber for `relay.write_stall_timeout` without one written: it stopped
    /// reading. It is dropped with what was queued for it (no close could reach it), and its upstream closed
    /// normally.
    fn on_write_stalled(&mut self) {
        let queued = self.client.outbox.len();
        warn!(
            id = self.subscription.id.as_deref().unwrap_or(""),
            task_id = self.subscription.task_id.as_deref().unwrap_or(""),
            queued,
            timeout = ?self.ctx.settings.relay.write_stall_timeout,
            "subscriber stopped reading: subscription ended"
        );
        self.ctx.instruments.relay_write_stalls.inc();
        self.client_gone(SubscriptionEnd::ClientStalled, "subscriber stopped reading");
    }

    /// The subscriber's socket broke, or it stopped answering pings: its upstream is closed.
    fn client_gone(&mut self, outcome: SubscriptionEnd, reason: &str) {
        self.client.gone = true;
        self.client.stopped_reading = true;
        self.ending(outcome);
        self.upstream
            .close(Some(&CloseWith::new(close::GOING_AWAY, reason)));
    }

    /// The upstream's socket broke or fell silent: the subscriber is told with 1011.
    fn upstream_gone(&mut self, outcome: SubscriptionEnd, reason: &str) {
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
                self.ending(SubscriptionEnd::UpstreamProtocolError(with));
                self.client
                    .close(Some(&CloseWith::new(close::INTERNAL_ERROR, reason)));
            }
            Side::Client => {
                self.ending(SubscriptionEnd::ClientProtocolError(with));
                self.upstream
                    .close(Some(&CloseWith::new(close::GOING_AWAY, "subscriber gone")));
            }
        }
    }

    /// Bytes from `source` arrived in `inbox`: every whole frame at its front is handled. Data frames are relayed
    /// as they came, headers included and without a copy, a read's worth at a time; control frames are answered
    /// here.
    fn on_read(&mut self, source: Side, inbox: &mut Inbox) {
        // Bytes at the front of the inbox that are whole data frames, relayed together.
        let mut frames = 0;
        let (mut data_frames, mut data_bytes) = (0u64, 0u64);
        // For the subscriber's acks: whether the read brought only acks, and the newest.
        let was_idle = self.ack_hold.is_some() || self.upstream.outbox.is_empty();
        let (mut only_acks, mut newest_ack) = (true, None);
        if source == Side::Client {
            self.wakeups.read();
        }
        while self.peer(source).reading() {
            let header = match inbox.header_at(frames) {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(with) => {
                    debug!(side = ?source, reason = %with.reason, "bad frame");
                    self.relay(source, inbox, &mut frames);
                    self.protocol_error(source, with);
                    break;
                }
            };
            let end = frames + header.frame_len();
            if inbox.buffered().len() < end {
                // The frames before this one leave now; the inbox makes room for the rest of it.
                self.relay(source, inbox, &mut frames);
                inbox.wait_for(&header);
                break;
            }
            if header.is_control() {
                only_acks = false;
                self.relay(source, inbox, &mut frames);
                let frame = inbox.take_frame(&header);
                self.control(source, frame.opcode, frame.payload);
                continue;
            }
            match self.data(source, &header, &inbox.buffered()[frames + header.len..end]) {
                Some(id) => newest_ack = Some(id),
                None => only_acks = false,
            }
            data_frames += 1;
            data_bytes += (end - frames - header.len) as u64;
            frames = end;
        }
        self.relay(source, inbox, &mut frames);
        if source == Side::Client {
            self.batch_acks(only_acks, newest_ack, was_idle);
        }
        if data_frames > 0 {
            match source {
                Side::Upstream => self.counted.downstream.relayed(data_frames, data_bytes),
                Side::Client => self.counted.upstream.relayed(data_frames, data_bytes),
            }
        }
        if !self.peer(source).reading() {
            // Nothing after a close or a broken frame is read.
            inbox.discard();
        }
    }

    /// Passes the first `frames` bytes of the inbox to the other side.
    fn relay(&mut self, source: Side, inbox: &mut Inbox, frames: &mut usize) {
        if *frames > 0 {
            let relayed = inbox.take_frames(std::mem::take(frames));
            self.peer(source.other()).relay(relayed);
        }
    }

    /// Reads what ack tracking and batching need from a data frame: messages and commits going down, acks coming
    /// up. Returns the ack a subscriber's frame completed, if it did.
    fn data(&mut self, source: Side, header: &ws::Header, payload: &[u8]) -> Option<u64> {
        match source {
            Side::Upstream => {
                if header.fin {
                    self.wakeups
                        .relayed((header.opcode == OpCode::Text).then_some(payload));
                }
                if !self.subscribed {
                    // The upstream answers only once it has registered the subscriber (docs/protocol.md, "How a
                    // reservation ends").
                    self.subscribed = true;
                    on_subscribed(self.ctx, &self.subscription, self.requested);
                }
                if let Some(acks) = &mut self.acks {
                    self.downstream_messages.push(
                        header.fin,
                        header.opcode,
                        payload,
                        |opcode, message| {
                            if opcode != OpCode::Text {
                                return;
                            }
                            if let Downstream::Commit { id, watermark } = inspect(message) {
                                acks.sent_commit(id, watermark);
                            }
                        },
                    );
                }
                None
            }
            Side::Client => {
                // Frames too long to be part of an ack are not unmasked: only their length matters.
                let payload = match header.mask {
                    Some(key) if payload.len() <= ACK_INSPECT_LIMIT => {
                        self.scratch.clear();
                        self.scratch.extend_from_slice(payload);
                        fastwebsockets::unmask(&mut self.scratch, key);
                        &self.scratch[..]
                    }
                    Some(_) => payload,
                    None => return None,
                };
                let mut ack = None;
                match &mut self.acks {
                    Some(acks) => {
                        self.client_messages.push(
                            header.fin,
                            header.opcode,
                            payload,
                            |opcode, message| {
                                if opcode != OpCode::Text {
                                    return;
                                }
                                if let Ok(id) = protocol::decode_ack(message) {
                                    acks.acked(id);
                                    ack = Some(id);
                                }
                            },
                        );
                    }
                    None if header.fin
                        && header.opcode == OpCode::Text
                        && payload.len() <= ACK_INSPECT_LIMIT =>
                    {
                        ack = protocol::decode_ack(payload).ok();
                    }
                    None => {}
                }
                match ack {
                    Some(id) => self.wakeups.acked(id),
                    None => self.wakeups.not_an_ack(),
                }
                ack
            }
        }
    }

    /// Each hop keeps its own liveness: pings are answered here and never passed on; closes are passed on.
    fn control(&mut self, source: Side, opcode: OpCode, payload: BytesMut) {
        match opcode {
            OpCode::Ping => {
                // The answer does not wait behind held acks.
                self.ack_hold = None;
                self.peer(source).control(OpCode::Pong, &payload);
            }
            OpCode::Pong if source == Side::Client => self.wakeups.ponged(),
            OpCode::Close => {
                self.peer(source).stopped_reading = true;
                match ws::read_close(payload) {
                    PeerClose::Valid { code, payload } => {
                        self.ending(match source {
                            Side::Upstream => SubscriptionEnd::UpstreamClosed { code },
                            Side::Client => SubscriptionEnd::ClientClosed { code },
                        });
                        self.peer(source).close_received = Some(payload.clone());
                        // Passed on as sent; the other side's answer goes back as the answer to it.
                        let other = self.peer(source.other());
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

/// Relays one subscription until either side ends it or the sidecar shuts down. `client` has just completed
/// its upgrade; `upstream` is the socket [`connect`] returned.
async fn handle_changes(
    ctx: RelayContext,
    subscription: SubscriberContext,
    requested: Ticket,
    client: WebSocket<Io>,
    upstream: Io,
    mut client_socket: Option<RawFd>,
) -> SubscriptionEnd {
    let settings = ctx.settings.clone();
    let (mut client_reader, mut client_writer) = tokio::io::split(client.into_inner());
    let (mut upstream_reader, mut upstream_writer) = tokio::io::split(upstream);
    let mut from_client = Inbox::new(true, settings.max_message_bytes, Reads::Bulk);
    let mut from_upstream = Inbox::new(false, settings.max_message_bytes, Reads::Bulk);
    let linger = tokio::time::sleep(Duration::ZERO);
    // The end of the held acks' batch window, armed only when a new hold starts.
    let ack_window = tokio::time::sleep(Duration::ZERO);
    let mut ack_window_at = None;
    // The subscriber's socket's low-water mark as set, and the limit on how long acks wait under it.
    let mut low_water = 1;
    let ack_wakeup_wait = tokio::time::sleep(Duration::ZERO);
    let mut ack_wakeup_waiting = false;
    // One shutdown future for the whole connection: creating one per loop turn would cost a lock each time.
    let shutdown = ctx.shutdown.cancelled();
    tokio::pin!(linger, ack_window, ack_wakeup_wait, shutdown);
    let mut lingering = false;
    let mut shutting_down = false;
    let mut client_liveness = Liveness::new(settings.ping_interval, settings.peer_timeout);
    // The upstream is never pinged (Zero pings it); it is only checked, every silence timeout.
    let silence = settings.upstream.silence_timeout;
    let mut upstream_liveness = Liveness::new(silence, silence);
    let mut client_writes = WriteStall::new(settings.relay.write_stall_timeout);
    let mut relay = Relay::new(&ctx, subscription, requested);

    while !relay.is_done() {
        // Once either side has ended, the rest of the close handshake gets a bounded time.
        if !lingering && relay.is_closing() {
            lingering = true;
            linger.as_mut().reset(Instant::now() + ws::CLOSE_LINGER);
        }
        if relay.ack_hold() != ack_window_at {
            ack_window_at = relay.ack_hold();
            if let Some(until) = ack_window_at {
                ack_window.as_mut().reset(until);
            }
        }
        if let Some(fd) = client_socket {
            if let Some(wanted) = relay.ack_wakeup_threshold().filter(|w| *w != low_water) {
                let bytes = wanted.try_into().unwrap_or(u32::MAX);
                match crate::net::sockopt::set_receive_low_water(fd, bytes) {
                    Ok(()) => low_water = wanted,
                    Err(err) => {
                        // Not expected of a TCP socket; the relay then wakes as the kernel decides.
                        warn!(error = %err, "cannot set the subscriber socket's low-water mark");
                        client_socket = None;
                        continue;
                    }
                }
            }
            // Armed when a wait starts, not moved while it lasts: it fires at most once per limit.
            if low_water > 1 && !ack_wakeup_waiting {
                ack_wakeup_waiting = true;
                ack_wakeup_wait
                    .as_mut()
                    .reset(Instant::now() + settings.relay.ack_wakeup_wait);
            }
        }
        let upstream_readable = relay.wants_read(Side::Upstream);
        let client_readable = relay.wants_read(Side::Client);
        let client_writable = relay.wants_write(Side::Client);
        let upstream_writable = relay.wants_write(Side::Upstream);

        // Reads come before flushes, so that what a read brought in leaves in one write; the timers and the
        // shutdown signal (a lock on a token every connection shares) only when nothing else is ready.
        tokio::select! {
            biased;
            _ = &mut linger, if lingering => break,
            read = from_upstream.fill(&mut upstream_reader), if upstream_readable => {
                match read {
                    Ok(n) if n > 0 => {
                        upstream_liveness.heard();
                        relay.on_read(Side::Upstream, &mut from_upstream);
                    }
                    result => {
                        debug!(error = ?result.err(), "upstream connection lost");
                        relay.on_lost(Side::Upstream);
                    }
                }
            }
            read = from_client.fill(&mut client_reader), if client_readable => {
                match read {
                    Ok(n) if n > 0 => {
                        client_liveness.heard();
                        relay.on_read(Side::Client, &mut from_client);
                    }
                    result => {
                        debug!(error = ?result.err(), "subscriber connection lost");
                        relay.on_lost(Side::Client);
                    }
                }
            }
            result = relay.client.outbox.flush(&mut client_writer), if client_writable => {
                if let Err(err) = result {
                    debug!(error = %err, "subscriber connection lost");
                    relay.on_lost(Side::Client);
                }
            }
            result = relay.upstream.outbox.flush(&mut upstream_writer), if upstream_writable => {
                if let Err(err) = result {
                    debug!(error = %err, "upstream connection lost");
                    relay.on_lost(Side::Upstream);
                }
            }
            _ = &mut ack_window, if ack_window_at.is_some() => relay.on_ack_window_end(),
            _ = &mut ack_wakeup_wait, if ack_wakeup_waiting => {
                ack_wakeup_waiting = false;
                if low_water > 1 {
                    relay.on_ack_wakeup_wait_end();
                }
            }
            at = client_liveness.tick(), if relay.is_reading(Side::Client) => {
                // At each ping an empty read buffer is given back: a quiet subscription keeps none.
                from_client.release_if_idle();
                from_upstream.release_if_idle();
                let outbox = &relay.client.outbox;
                if client_writes.check(at, outbox.len(), outbox.written()) {
                    relay.on_write_stalled();
                } else {
                    let excused = relay.excused(Side::Client);
                    relay.on_liveness_check(Side::Client, client_liveness.is_silent(at, excused));
                }
            }
            at = upstream_liveness.tick(), if relay.is_reading(Side::Upstream) => {
                let excused = relay.excused(Side::Upstream);
                relay.on_liveness_check(Side::Upstream, upstream_liveness.is_silent(at, excused));
            }
            _ = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                relay.on_shutdown();
            }
        }
    }
    let outcome = relay.outcome.take().unwrap_or(SubscriptionEnd::ClientGone);
    if outcome.is_upstreams() {
        // Its other subscribers are likely dropped too, and back off before they return.
        ctx.subscribers.upstream_lost();
    }
    drop(relay);
    info!(outcome = ?outcome, "subscription ended");
    outcome
}

/// The upstream has answered the subscription: end the task's reservation if this is its first subscription after a
/// restore (whatever the mode: docs/protocol.md, "How a reservation ends").
///
/// The subscriber was tracked when the relay started ([`track`]): the cleanup policy reads reservations before
/// subscribers, so a check around this step sees the reservation still open or the subscriber already tracked,
/// never neither.
fn on_subscribed(ctx: &RelayContext, subscription: &SubscriberContext, requested: Ticket) {
    if subscription.initial {
        if let Some(task_id) = &subscription.task_id {
            if let Some(held) = ctx
                .registry
                .end_by_subscription(task_id, requested, Instant::now())
            {
                info!(task_id = %task_id, held = ?held, "reservation ended by its subscription");
            }
        }
    }
}

/// Registers the subscriber with the watermark it subscribed from, if its query said where it stands.
fn track(ctx: &RelayContext, subscription: &SubscriberContext) -> Option<AckTracker> {
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
        mode: subscription.mode,
        replica_version: replica_version.clone(),
        watermark: watermark.clone(),
    });
    Some(AckTracker::new(
        handle,
        ctx.settings.relay.max_pending_commits,
    ))
}

/// Commits sent to one subscriber and not yet acknowledged, in id order (docs/protocol.md, "A subscriber's
/// acknowledged watermark"), with when each was relayed: the oldest one's age is how far the subscriber lags.
struct AckTracker {
    handle: SubscriberHandle,
    pending: VecDeque<(u64, String, Instant)>,
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
        let now = Instant::now();
        self.handle.sent(&watermark, now);
        self.pending.push_back((id, watermark, now));
    }

    /// An ack of message `id` means every message up to it was consumed (acks come in order): the newest commit
    /// at or before it is durable on the subscriber.
    fn acked(&mut self, id: u64) {
        let mut newest = None;
        while self
            .pending
            .front()
            .is_some_and(|(commit, _, _)| *commit <= id)
        {
            newest = self.pending.pop_front().map(|(_, watermark, _)| watermark);
        }
        if let Some(watermark) = newest {
            let oldest_pending = self.pending.front().map(|(_, _, at)| *at);
            self.handle.ack_with_pending(&watermark, oldest_pending);
        }
    }
}

/// Drops every other pending commit, always keeping the newest: an ack then advances to the newest kept commit
/// at or before it, which lags the exact one by at most a few commits and never leads it.
fn merge_half<T>(pending: &mut VecDeque<T>) {
    let keep = pending.len() % 2;
    let mut index = 0;
    pending.retain(|_| {
        index += 1;
        index % 2 == keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: u8 = 0x1;
    const CONTINUATION: u8 = 0x0;
    const CLOSE: u8 = 0x8;
    const PING: u8 = 0x9;
    const PONG: u8 = 0xa;
    /// `server.max_message_bytes` in the table below.
    const MAX_MESSAGE: usize = 1024;

    fn frame(fin: bool, opcode: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![if fin { 0x80 } else { 0 } | opcode];
        let masked = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n @ 0..=125 => frame.push(masked | n as u8),
            n @ 126..=0xffff => {
                frame.push(masked | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(masked | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mut payload = payload.to_vec();
        if let Some(key) = mask {
            frame.extend_from_slice(&key);
            fastwebsockets::unmask(&mut payload, key);
        }
        frame.extend_from_slice(&payload);
        frame
    }

    /// A frame as a subscriber sends it: masked.
    fn c(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        frame(fin, opcode, Some([0x11, 0x22, 0x33, 0x44]), payload)
    }

    /// A frame as the upstream sends it: unmasked.
    fn s(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        frame(fin, opcode, None, payload)
    }

    fn close_payload(code: u16, reason: &str) -> Vec<u8> {
        let mut payload = code.to_be_bytes().to_vec();
        payload.extend_from_slice(reason.as_bytes());
        payload
    }

    /// A frame as written, read back: fin, opcode, payload (unmasked).
    type Written = (bool, u8, Vec<u8>);

    fn whole(opcode: u8, payload: &[u8]) -> Written {
        (true, opcode, payload.to_vec())
    }

    fn closing(code: u16, reason: &str) -> Written {
        (true, CLOSE, close_payload(code, reason))
    }

    /// Parses written bytes back into frames, checking that they are masked exactly when `masked`.
    fn written(mut bytes: &[u8], masked: bool) -> Vec<Written> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let header = ws::parse_header(bytes, masked, usize::MAX >> 2)
                .expect("a valid frame")
                .expect("a whole header");
            let mut payload = bytes[header.len..header.frame_len()].to_vec();
            if let Some(key) = header.mask {
                fastwebsockets::unmask(&mut payload, key);
            }
            frames.push((header.fin, header.opcode as u8, payload));
            bytes = &bytes[header.frame_len()..];
        }
        frames
    }

    /// One socket event, or a check of what the I/O loop would do next.
    enum Step {
        /// These bytes are read from a side.
        Read(Side, Vec<u8>),
        Lost(Side),
        /// A side's liveness check, with whether it was heard within its timeout.
        Liveness(Side, bool),
        /// The write-stall check found bytes waiting toward the subscriber for the whole timeout.
        WriteStalled,
        Shutdown,
        /// Writes toward a side stop (its peer reads nothing), or resume.
        Stall(Side),
        Unstall(Side),
        /// Whether the loop reads the side now.
        Readable(Side, bool),
        /// The held acks' batch window ends.
        AckWindowEnds,
        /// Whether acks are held toward the upstream now.
        Holding(bool),
        /// The subscriber socket's low-water mark the relay asks for now (`None`: left as it is).
        LowWater(Option<u64>),
        /// The subscriber's acks waited `relay.ack_wakeup_wait`.
        AckWakeupWaitEnds,
    }
    use Side::{Client, Upstream};
    use Step::*;

    struct Row {
        name: &'static str,
        query: &'static str,
        steps: Vec<Step>,
        to_client: Vec<Written>,
        to_upstream: Vec<Written>,
        outcome: Option<SubscriptionEnd>,
        done: bool,
        /// The acknowledged watermarks the subscriber registry holds afterwards, by Zero's `id`.
        acked: &'static [(&'static str, &'static str)],
        /// Whether task t1's reservation, open before the connection, is still held.
        reservation_held: bool,
    }

    fn context() -> RelayContext {
        let config = crate::config::from_toml_str(
            "[litestream]\nbackup_url = \"s3://b/r\"\n[discovery]\nmode = \"off\"\n",
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap();
        let mut relay = config.relay;
        relay.max_buffered_bytes = 64;
        relay.ack_batch_window = Duration::from_millis(1);
        RelayContext {
            settings: Arc::new(Settings {
                upstream: config.upstream,
                upstream_tls: None,
                relay,
                ping_interval: Duration::from_secs(1),
                peer_timeout: Duration::from_secs(4),
                max_message_bytes: MAX_MESSAGE,
            }),
            registry: Registry::new(Duration::ZERO),
            subscribers: Subscribers::default(),
            instruments: crate::ops::metrics::Instruments::default(),
            shutdown: CancellationToken::new(),
        }
    }

    const STATUS: &[u8] = br#"{"id":1,"msg":["status",{"tag":"status"}]}"#;

    fn commit(id: u64, watermark: &str) -> Vec<u8> {
        format!(
            r#"{{"id":{id},"msg":["commit",{{"tag":"commit"}},{{"watermark":"{watermark}"}}]}}"#
        )
        .into_bytes()
    }

    fn rows() -> Vec<Row> {
        use SubscriptionEnd as End;
        let refused = |code, reason: &str| CloseWith::new(code, reason);
        let split = s(true, CONTINUATION, b":1}");
        let commits = [STATUS.to_vec(), commit(2, "0b"), commit(3, "0c")];
        let ack = |id: u64| c(true, TEXT, format!(r#"{{"ack":{id}}}"#).as_bytes());
        let acked = |id: u64| whole(TEXT, format!(r#"{{"ack":{id}}}"#).as_bytes());
        let three = [
            s(true, TEXT, b"m1"),
            s(true, TEXT, b"m2"),
            s(true, TEXT, b"m3"),
        ]
        .concat();
        let zero_three_messages: [&[u8]; 3] = [
            br#"{"id":2,"msg":["begin"]}"#,
            br#"{"id":3,"msg":["data"]}"#,
            br#"{"msg":["commit"],"id":4}"#,
        ];
        let zero_three = zero_three_messages.map(|m| s(true, TEXT, m)).concat();
        // The status and those three, as the subscriber receives them.
        let zero_three_down = || {
            std::iter::once(STATUS)
                .chain(zero_three_messages)
                .map(|m| whole(TEXT, m))
                .collect::<Vec<_>>()
        };
        let awaited = |first, last| Some(crate::streamer::wakeup::ack_bytes(first, last));
        vec![
            Row {
                name: "the subscriber's socket waits for the acks in flight; a ping, the wait limit and a close lower it",
                query: "",
                steps: vec![
                    Read(Upstream, s(true, TEXT, STATUS)),
                    LowWater(Some(1)),
                    Read(Client, ack(1)),
                    LowWater(None),
                    Read(Upstream, zero_three.clone()),
                    LowWater(awaited(2, 4)),
                    Read(Client, ack(2)),
                    LowWater(awaited(3, 4)),
                    Liveness(Client, true),
                    LowWater(Some(1)),
                    Read(Client, c(true, PONG, b"")),
                    LowWater(awaited(3, 4)),
                    AckWakeupWaitEnds,
                    LowWater(Some(1)),
                    Read(Client, ack(3)),
                    LowWater(awaited(4, 4)),
                    Read(Client, c(true, CLOSE, &close_payload(1000, "done"))),
                    LowWater(Some(1)),
                ],
                to_client: [zero_three_down(), vec![whole(PING, b"")]].concat(),
                to_upstream: vec![acked(1), acked(2), acked(3), closing(1000, "done")],
                outcome: Some(SubscriptionEnd::ClientClosed { code: Some(1000) }),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a subscriber that acks otherwise than one message at a time is woken for every byte",
                query: "",
                steps: vec![
                    Read(Upstream, s(true, TEXT, STATUS)),
                    Read(Client, ack(1)),
                    Read(Upstream, zero_three.clone()),
                    LowWater(awaited(2, 4)),
                    Read(Client, ack(3)),
                    LowWater(Some(1)),
                    Read(Client, ack(4)),
                    LowWater(Some(1)),
                ],
                to_client: zero_three_down(),
                to_upstream: vec![acked(1), acked(3), acked(4)],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "acks below the newest message relayed wait, and leave together with the one that catches up",
                query: "",
                steps: vec![
                    Read(Upstream, three.clone()),
                    Read(Client, ack(1)),
                    Holding(true),
                    Read(Client, ack(2)),
                    Holding(true),
                    Read(Client, ack(3)),
                    Holding(false),
                ],
                to_client: vec![whole(TEXT, b"m1"), whole(TEXT, b"m2"), whole(TEXT, b"m3")],
                to_upstream: vec![acked(1), acked(2), acked(3)],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "held acks leave when their window ends, and an ack with nothing after it is never held",
                query: "",
                steps: vec![
                    Read(Upstream, three.clone()),
                    Read(Client, [ack(1), ack(2)].concat()),
                    AckWindowEnds,
                    Holding(false),
                    Read(Client, ack(3)),
                    Holding(false),
                    Read(Upstream, s(true, TEXT, b"m4")),
                    Read(Client, ack(4)),
                    Holding(false),
                ],
                to_client: vec![
                    whole(TEXT, b"m1"),
                    whole(TEXT, b"m2"),
                    whole(TEXT, b"m3"),
                    whole(TEXT, b"m4"),
                ],
                to_upstream: vec![acked(1), acked(2), acked(3), acked(4)],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "anything but an ack, an upstream ping or a close sends the held acks at once, in order",
                query: "",
                steps: vec![
                    Read(Upstream, three.clone()),
                    Read(Client, ack(1)),
                    Holding(true),
                    Read(Client, c(true, TEXT, b"not an ack")),
                    Holding(false),
                    Read(Client, ack(2)),
                    Holding(true),
                    Read(Upstream, s(true, PING, b"p")),
                    Holding(false),
                    Read(Client, [c(false, TEXT, br#"{"ack""#), c(true, CONTINUATION, b":3}")].concat()),
                    Holding(false),
                    Read(Upstream, s(true, TEXT, b"m4")),
                    Read(Client, ack(4)),
                    Holding(false),
                    Read(Upstream, s(true, TEXT, b"m5")),
                    Read(Upstream, s(true, TEXT, b"m6")),
                    Read(Client, ack(5)),
                    Holding(true),
                    Read(Client, c(true, CLOSE, &close_payload(1000, "done"))),
                ],
                to_client: vec![
                    whole(TEXT, b"m1"),
                    whole(TEXT, b"m2"),
                    whole(TEXT, b"m3"),
                    whole(TEXT, b"m4"),
                    whole(TEXT, b"m5"),
                    whole(TEXT, b"m6"),
                ],
                to_upstream: vec![
                    acked(1),
                    whole(TEXT, b"not an ack"),
                    acked(2),
                    whole(PONG, b"p"),
                    (false, TEXT, br#"{"ack""#.to_vec()),
                    whole(CONTINUATION, b":3}"),
                    acked(4),
                    acked(5),
                    closing(1000, "done"),
                ],
                outcome: Some(SubscriptionEnd::ClientClosed { code: Some(1000) }),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "data passes both ways as received; each hop answers its own pings",
                query: "id=s1",
                steps: vec![
                    Read(
                        Upstream,
                        [s(true, TEXT, b"status"), s(true, PING, b"up")].concat(),
                    ),
                    Read(
                        Client,
                        [c(true, TEXT, b"ack"), c(true, PING, b"down")].concat(),
                    ),
                ],
                to_client: vec![whole(TEXT, b"status"), whole(PONG, b"down")],
                to_upstream: vec![whole(PONG, b"up"), whole(TEXT, b"ack")],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "fragments pass as fragments; a frame split across reads leaves whole",
                query: "",
                steps: vec![
                    Read(
                        Upstream,
                        [s(false, TEXT, b"{\"a\""), split[..3].to_vec()].concat(),
                    ),
                    Read(Upstream, split[3..].to_vec()),
                ],
                to_client: vec![
                    (false, TEXT, b"{\"a\"".to_vec()),
                    whole(CONTINUATION, b":1}"),
                ],
                to_upstream: vec![],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "the upstream's close reaches the subscriber, and the answer goes back",
                query: "",
                steps: vec![
                    Read(Upstream, s(true, CLOSE, &close_payload(1000, "bye"))),
                    Read(Client, c(true, CLOSE, &close_payload(1000, "bye"))),
                ],
                to_client: vec![closing(1000, "bye")],
                to_upstream: vec![closing(1000, "bye")],
                outcome: Some(End::UpstreamClosed { code: Some(1000) }),
                done: true,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "the subscriber's close reaches the upstream; nothing after it is read",
                query: "",
                steps: vec![
                    Read(
                        Client,
                        [
                            c(true, TEXT, b"a"),
                            c(true, CLOSE, &close_payload(4000, "x")),
                            c(true, TEXT, b"b"),
                        ]
                        .concat(),
                    ),
                    Readable(Client, false),
                    Read(Upstream, s(true, CLOSE, &close_payload(4000, "x"))),
                ],
                to_client: vec![closing(4000, "x")],
                to_upstream: vec![whole(TEXT, b"a"), closing(4000, "x")],
                outcome: Some(End::ClientClosed { code: Some(4000) }),
                done: true,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a lost subscriber's upstream is closed with 1001",
                query: "",
                steps: vec![Lost(Client), Read(Upstream, s(true, CLOSE, b""))],
                to_client: vec![],
                to_upstream: vec![closing(1001, "subscriber gone")],
                outcome: Some(End::ClientGone),
                done: true,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a lost upstream is reported to the subscriber with 1011",
                query: "",
                steps: vec![Lost(Upstream), Read(Client, c(true, CLOSE, b""))],
                to_client: vec![closing(1011, "Error: upstream connection lost")],
                to_upstream: vec![],
                outcome: Some(End::UpstreamGone),
                done: true,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a subscriber is pinged while it answers, dropped when it does not",
                query: "",
                steps: vec![Liveness(Client, true), Liveness(Client, false)],
                to_client: vec![whole(PING, b"")],
                to_upstream: vec![closing(1001, "subscriber unresponsive")],
                outcome: Some(End::ClientUnresponsive),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a silent upstream is dropped, the subscriber told with 1011",
                query: "",
                steps: vec![Liveness(Upstream, true), Liveness(Upstream, false)],
                to_client: vec![closing(1011, "Error: upstream silent")],
                to_upstream: vec![],
                outcome: Some(End::UpstreamSilent),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a slow subscriber holds its upstream back; neither is faulted for it",
                query: "",
                steps: vec![
                    Stall(Client),
                    Read(Upstream, s(true, TEXT, &[b'x'; 100])),
                    Readable(Upstream, false),
                    Liveness(Upstream, false),
                    Liveness(Client, false),
                    Unstall(Client),
                    Readable(Upstream, true),
                ],
                to_client: vec![whole(TEXT, &[b'x'; 100])],
                to_upstream: vec![],
                outcome: None,
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a subscriber that stops reading is not faulted by liveness but ended by the stall rule",
                query: "id=s1",
                steps: vec![
                    Stall(Client),
                    Read(Upstream, s(true, TEXT, &[b'x'; 100])),
                    Liveness(Client, false),
                    Liveness(Client, false),
                    Readable(Upstream, false),
                    WriteStalled,
                    Readable(Client, false),
                    Readable(Upstream, true),
                ],
                to_client: vec![],
                to_upstream: vec![closing(1001, "subscriber stopped reading")],
                outcome: Some(End::ClientStalled),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "shutdown closes both sides with 1001",
                query: "",
                steps: vec![Shutdown],
                to_client: vec![closing(1001, "sidecar shutting down")],
                to_upstream: vec![closing(1001, "sidecar shutting down")],
                outcome: Some(End::Shutdown),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "an unmasked frame from the subscriber: 1002 to it, 1001 upstream",
                query: "",
                steps: vec![Read(Client, s(true, TEXT, b"{}"))],
                to_client: vec![closing(1002, "unmasked frame from a client")],
                to_upstream: vec![closing(1001, "subscriber gone")],
                outcome: Some(End::ClientProtocolError(refused(
                    1002,
                    "unmasked frame from a client",
                ))),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a masked frame from the upstream: 1002 to it, 1011 to the subscriber",
                query: "",
                steps: vec![Read(Upstream, c(true, TEXT, b"{}"))],
                to_client: vec![closing(1011, "Error: upstream: masked frame from a server")],
                to_upstream: vec![closing(1002, "masked frame from a server")],
                outcome: Some(End::UpstreamProtocolError(refused(
                    1002,
                    "masked frame from a server",
                ))),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a frame over server.max_message_bytes is refused from its header",
                query: "",
                steps: vec![Read(
                    Client,
                    c(true, TEXT, &[b'x'; MAX_MESSAGE + 1])[..8].to_vec(),
                )],
                to_client: vec![closing(1009, "message too big")],
                to_upstream: vec![closing(1001, "subscriber gone")],
                outcome: Some(End::ClientProtocolError(refused(1009, "message too big"))),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "a close with an invalid code is answered with 1002",
                query: "",
                steps: vec![Read(Client, c(true, CLOSE, &1005u16.to_be_bytes()))],
                to_client: vec![closing(1002, "invalid close code")],
                to_upstream: vec![closing(1001, "subscriber gone")],
                outcome: Some(End::ClientProtocolError(refused(
                    1002,
                    "invalid close code",
                ))),
                done: false,
                acked: &[],
                reservation_held: true,
            },
            Row {
                name: "an initial subscription's first answer ends its task's reservation",
                query: "taskID=t1&id=s1&replicaVersion=01&watermark=0a&initial=true",
                steps: vec![
                    Read(
                        Upstream,
                        commits
                            .iter()
                            .map(|m| s(true, TEXT, m))
                            .collect::<Vec<_>>()
                            .concat(),
                    ),
                    // A fragmented ack counts too.
                    Read(
                        Client,
                        [c(false, TEXT, b"{\"ack\""), c(true, CONTINUATION, b":2}")].concat(),
                    ),
                ],
                to_client: commits.iter().map(|m| whole(TEXT, m)).collect(),
                to_upstream: vec![
                    (false, TEXT, b"{\"ack\"".to_vec()),
                    whole(CONTINUATION, b":2}"),
                ],
                outcome: None,
                done: false,
                acked: &[("s1", "0b")],
                reservation_held: false,
            },
            Row {
                name: "a subscription that is not initial leaves the reservation alone",
                query: "taskID=t1&id=s1&replicaVersion=01&watermark=0a",
                steps: vec![Read(Upstream, s(true, TEXT, STATUS))],
                to_client: vec![whole(TEXT, STATUS)],
                to_upstream: vec![],
                outcome: None,
                done: false,
                acked: &[("s1", "0a")],
                reservation_held: true,
            },
        ]
    }

    /// Drives one relayed connection through each row's events as the I/O loop would, writing every outbox after
    /// each step unless its side is stalled.
    #[tokio::test]
    async fn a_relayed_connection_answers_each_event() {
        for row in rows() {
            let name = row.name;
            let ctx = context();
            let _lease = ctx.registry.open("t1", Instant::now());
            let mut relay = Relay::new(
                &ctx,
                protocol::parse_subscriber_context(Some(row.query)),
                ctx.registry.ticket(),
            );
            let mut from_client = Inbox::new(true, MAX_MESSAGE, Reads::Bulk);
            let mut from_upstream = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
            let (mut to_client, mut to_upstream) = (Vec::new(), Vec::new());
            let (mut client_stalled, mut upstream_stalled) = (false, false);
            for step in row.steps {
                match step {
                    Read(side, bytes) => {
                        assert!(relay.wants_read(side), "{name}: {side:?} is not read now");
                        let inbox = match side {
                            Client => &mut from_client,
                            Upstream => &mut from_upstream,
                        };
                        assert_eq!(inbox.fill(&mut &bytes[..]).await.unwrap(), bytes.len());
                        relay.on_read(side, inbox);
                    }
                    Lost(side) => relay.on_lost(side),
                    Liveness(side, heard) => {
                        let excused = relay.excused(side);
                        relay.on_liveness_check(side, !heard && !excused)
                    }
                    WriteStalled => relay.on_write_stalled(),
                    Shutdown => relay.on_shutdown(),
                    Stall(Client) => client_stalled = true,
                    Unstall(Client) => client_stalled = false,
                    Stall(Upstream) => upstream_stalled = true,
                    Unstall(Upstream) => upstream_stalled = false,
                    Readable(side, expected) => {
                        assert_eq!(
                            relay.wants_read(side),
                            expected,
                            "{name}: {side:?} readable"
                        )
                    }
                    AckWindowEnds => relay.on_ack_window_end(),
                    Holding(expected) => {
                        assert_eq!(relay.ack_hold().is_some(), expected, "{name}: holding")
                    }
                    LowWater(expected) => {
                        assert_eq!(relay.ack_wakeup_threshold(), expected, "{name}: low water")
                    }
                    AckWakeupWaitEnds => relay.on_ack_wakeup_wait_end(),
                }
                if relay.wants_write(Client) && !client_stalled {
                    relay.client.outbox.flush(&mut to_client).await.unwrap();
                }
                if relay.wants_write(Upstream) && !upstream_stalled {
                    relay.upstream.outbox.flush(&mut to_upstream).await.unwrap();
                }
            }
            assert_eq!(
                written(&to_client, false),
                row.to_client,
                "{name}: to the subscriber"
            );
            assert_eq!(
                written(&to_upstream, true),
                row.to_upstream,
                "{name}: to the upstream"
            );
            assert_eq!(relay.outcome, row.outcome, "{name}");
            assert_eq!(relay.is_done(), row.done, "{name}: done");
            let acked: Vec<(String, String)> = row
                .acked
                .iter()
                .map(|(id, w)| (id.to_string(), w.to_string()))
                .collect();
            assert_eq!(ctx.subscribers.acked_by_id(), acked, "{name}: acked");
            assert_eq!(
                ctx.registry.len() == 1,
                row.reservation_held,
                "{name}: reservation"
            );
        }
    }

    /// A cleanup check running beside the handover from reservation to subscription (reservations read first,
    /// then subscribers, as the monitor reads them) finds every restore still covered by one or the other.
    #[test]
    fn a_check_during_the_handover_sees_the_reservation_or_the_subscriber() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        const ROUNDS: u64 = 2_000;
        let ctx = context();
        let opened = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let checker = scope.spawn(|| {
                let mut checks = 0u64;
                while !done.load(SeqCst) {
                    let covered = opened.load(SeqCst);
                    let reservations = ctx.registry.for_policy().len() as u64;
                    let subscribers = ctx.subscribers.connected() as u64;
                    assert!(
                        reservations + subscribers >= covered,
                        "after {covered} restores a check saw {reservations} reservations and {subscribers} \
                         subscribers"
                    );
                    checks += 1;
                }
                checks
            });
            let mut tracked = Vec::new();
            for round in 0..ROUNDS {
                let lease = ctx.registry.open("t1", Instant::now());
                opened.fetch_add(1, SeqCst);
                let query =
                    format!("taskID=t1&id=s{round}&replicaVersion=01&watermark=0a&initial=true");
                let subscription = protocol::parse_subscriber_context(Some(&query));
                let requested = ctx.registry.ticket();
                let relay = Relay::new(&ctx, subscription.clone(), requested);
                on_subscribed(&ctx, &subscription, requested);
                tracked.push(relay.acks);
                drop(lease);
            }
            done.store(true, SeqCst);
            assert!(checker.join().unwrap() > 0);
            assert_eq!(ctx.subscribers.connected() as u64, ROUNDS);
        });
    }

    #[tokio::test]
    async fn relayed_frames_are_not_re_encoded() {
        // A 5-byte payload under a 16-bit length, which no encoder writes: passed on exactly as it came.
        let odd = [&[0x81u8, 126, 0, 5][..], b"hello"].concat();
        let ctx = context();
        let mut relay = Relay::new(&ctx, SubscriberContext::default(), ctx.registry.ticket());
        let mut inbox = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
        inbox.fill(&mut &odd[..]).await.unwrap();
        relay.on_read(Side::Upstream, &mut inbox);
        let mut out = Vec::new();
        relay.client.outbox.flush(&mut out).await.unwrap();
        assert_eq!(out, odd);
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

    #[tokio::test]
    async fn with_no_ack_batch_window_each_reads_acks_leave_at_once() {
        let mut ctx = context();
        let mut settings = (*ctx.settings).clone();
        settings.relay.ack_batch_window = Duration::ZERO;
        ctx.settings = Arc::new(settings);
        let mut relay = Relay::new(
            &ctx,
            protocol::parse_subscriber_context(None),
            ctx.registry.ticket(),
        );
        let mut from_client = Inbox::new(true, MAX_MESSAGE, Reads::Bulk);
        let mut from_upstream = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
        let messages = [s(true, TEXT, b"m1"), s(true, TEXT, b"m2")].concat();
        from_upstream.fill(&mut &messages[..]).await.unwrap();
        relay.on_read(Upstream, &mut from_upstream);
        let ack = c(true, TEXT, br#"{"ack":1}"#);
        from_client.fill(&mut &ack[..]).await.unwrap();
        relay.on_read(Client, &mut from_client);
        assert_eq!(relay.ack_hold(), None);
        assert!(relay.wants_write(Upstream));
    }

    #[test]
    fn acks_advance_to_the_newest_acknowledged_commit() {
        let subscribers = Subscribers::default();
        let handle = subscribers.connect(SubscriberInfo {
            id: "s".into(),
            task_id: None,
            mode: protocol::Mode::Serving,
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
