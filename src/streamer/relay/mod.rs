//! The `/changes` relay: each subscription is a WebSocket to Zero's change-streamer, opened before the
//! subscriber's own upgrade is answered ([`serve`]), and every frame is relayed unchanged both ways
//! (docs/protocol.md, "The change stream" and "Relaying a subscription"). A subscription the sidecar cannot relay is
//! refused before the upgrade: HTTP 400 for a path or version no Zero serves, HTTP 502 when the upstream cannot be
//! reached, which makes Zero's client back off instead of reconnecting every 25 ms (docs/protocol.md, "Reconnect
//! storms after a rejected upgrade"). A version the upstream is known not to serve gets the same HTTP 400, without a
//! dial; the upstream's own refusal of a version teaches the sidecar its range (docs/protocol.md, "Protocol versions
//! the upstream serves").
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
//! The subscriber's socket is woken only once a few of the acks sure to come are there ([`crate::streamer::wakeup`]),
//! so a small transaction's acks are read and forwarded in one go; never later than the newest message's ack, and
//! never more than the subscriber is seen to send within `relay.ack_wakeup_wait`, nor for longer than that.
//!
//! The files:
//! - this one: the relay's context and settings, and the state machine of one relayed connection (`Relay`).
//! - `upstream`: dialing Zero's change-streamer (TCP, TLS, the WebSocket upgrade).
//! - `driver`: [`serve`], the upgrade answered, and the loop that drives one connection's sockets and timers.
//! - `acks`: the commits a subscriber has been sent and not yet acknowledged.
//! - `probe`: asking the upstream which protocol versions it serves, without a subscription.
//! - `tests/`: the state machine as a table (`table.rs`), ack tracking (`acks.rs`), the other pieces one at a time.

mod acks;
mod driver;
pub mod probe;
#[cfg(test)]
mod tests;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Role};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cleanup::reservations::Ticket;
use crate::net::ws::{self, Assembler, CloseWith, Inbox, Outbox, PeerClose};
use crate::protocol::inspect::{inspect, Downstream};
use crate::protocol::{self, close, SubscriberContext};
use crate::streamer::config::{RelayConfig, UpstreamConfig};
use crate::streamer::protocols::{Source, UpstreamProtocols};
use crate::streamer::wakeup::AckWakeups;

pub use driver::serve;

use acks::{track, AckTracker};

/// Client messages longer than this are not acks; they are relayed without being read.
const ACK_INSPECT_LIMIT: usize = 256;

/// Acks queued toward the upstream beyond this many bytes leave without waiting for the rest of their batch.
const ACK_BATCH_BYTES: usize = 4 << 10;

/// Everything a relayed connection needs besides its sockets.
#[derive(Clone)]
pub struct RelayContext {
    pub settings: Arc<Settings>,
    /// The registry a subscription ends its task's reservation in; the subscribers its acks are tracked in.
    pub handles: crate::cleanup::handles::Handles,
    /// Relayed frames and bytes, counted once per read.
    pub instruments: crate::ops::metrics::Instruments,
    /// What the upstream serves: checked before a dial, taught by its refusals.
    pub protocols: UpstreamProtocols,
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

    /// The upstream ended it other than by refusing it (1002): it may be stopping, or another release taking its
    /// place, so what it serves is asked again.
    fn may_change_upstream(&self) -> bool {
        let refused = matches!(
            self,
            Self::UpstreamClosed {
                code: Some(close::PROTOCOL_ERROR)
            }
        );
        self.is_upstreams() && !refused
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

/// One relayed connection as a state machine without I/O: [`driver::handle_changes`] owns the sockets, asks what
/// to read and write ([`Relay::wants_read`], [`Relay::wants_write`], [`Relay::is_done`]), writes the outboxes, and
/// feeds every socket event to one of the `on_*` methods.
struct Relay<'a> {
    ctx: &'a RelayContext,
    /// The protocol version of the request's path.
    version: u64,
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
    /// Bytes of the subscriber's next frame already read, while it is not whole: part of the next ack awaited.
    client_partial: u64,
    /// Since when the acks queued toward the upstream have waited for the ones sure to follow, to leave in one
    /// write (see [`Relay::batch_acks`]); they wait `relay.ack_batch_window` at most.
    ack_held_since: Option<Instant>,
    counted: Counted,
    outcome: Option<SubscriptionEnd>,
}

/// The relay counters of both directions.
struct Counted {
    downstream: crate::ops::metrics::RelayCounters,
    upstream: crate::ops::metrics::RelayCounters,
}

impl<'a> Relay<'a> {
    fn new(
        ctx: &'a RelayContext,
        version: u64,
        subscription: SubscriberContext,
        requested: Ticket,
    ) -> Self {
        // Zero answers a subscription only once its storer has caught up, which under a large transaction can take
        // long: a lagging subscriber that reconnects must bound cleanup at its watermark from the handshake on, not
        // from that first frame.
        let acks = track(ctx, &subscription);
        Self {
            ctx,
            version,
            subscription,
            requested,
            client: Peer::new(Role::Server),
            upstream: Peer::new(Role::Client),
            subscribed: false,
            acks,
            downstream_messages: Assembler::new(ctx.settings.max_message_bytes),
            client_messages: Assembler::new(ACK_INSPECT_LIMIT),
            scratch: Vec::new(),
            wakeups: AckWakeups::new(
                ctx.settings.relay.ack_wakeup_bytes,
                ctx.settings.relay.ack_wakeup_wait,
                ctx.settings.relay.ack_wakeup_backlog,
            ),
            client_partial: 0,
            ack_held_since: None,
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
        let held = side == Side::Upstream && self.ack_held_since.is_some() && !self.is_closing();
        !peer.outbox.is_empty() && !peer.gone && !held
    }

    /// The subscriber's socket's receive low-water mark to set now: the bytes of the acks sure to come, 1 (wake
    /// for anything) once either side is closing or the subscriber is no longer read, `None` to leave it.
    fn ack_wakeup_threshold(&self) -> Option<u64> {
        if self.is_closing() || !self.client.reading() {
            Some(1)
        } else {
            self.wakeups.threshold(self.client_partial)
        }
    }

    /// The subscriber's acks waited `relay.ack_wakeup_wait` for the rest of theirs: read what came.
    fn on_ack_wakeup_wait_end(&mut self) {
        self.wakeups.waited_too_long();
    }

    /// Until when acks wait toward the upstream, if they do.
    fn ack_hold(&self) -> Option<Instant> {
        let window = self.ctx.settings.relay.ack_batch_window;
        self.ack_held_since.map(|since| since + window)
    }

    /// The acks' batch window has ended: they leave as they are.
    fn on_ack_window_end(&mut self) {
        self.release_acks();
    }

    fn release_acks(&mut self) {
        self.ack_held_since = None;
    }

    /// Decides, after a read from the subscriber, whether the acks queued toward the upstream leave now or wait
    /// for the ones sure to follow. Zero's client acks each message in its own write as it finishes it, so a
    /// transaction of five messages brings five acks, one read each; a generic proxy writes each upstream. The
    /// relay knows which messages are still unacknowledged, so while the newest ack is below the newest message
    /// relayed it holds them, and writes them together once the subscriber has acked everything relayed, within
    /// `relay.ack_batch_window` at most, or once they fill [`ACK_BATCH_BYTES`]. An ack that leaves nothing in flight
    /// is never held: it is the one an upstream pacing on acks waits for. Nor are acks held once the next read is
    /// not expected within the budget of the first held ([`AckWakeups::may_hold`]): a relayed subscriber's acks
    /// must not come later than a direct one's by more than that (docs/protocol.md, "Relayed subscribers dropped
    /// as too far behind"). Anything else from the subscriber (any other frame, a close) ends the wait, and so does
    /// an upstream ping, so no answer is ever delayed.
    ///
    /// `only_acks`: the read brought whole acks and nothing else, the newest `newest_ack`; `was_idle`: nothing
    /// waited toward the upstream before the read, beyond held acks.
    fn batch_acks(
        &mut self,
        only_acks: bool,
        newest_ack: Option<u64>,
        was_idle: bool,
        now: Instant,
    ) {
        let window = self.ctx.settings.relay.ack_batch_window;
        // Zero numbers a connection's messages 1, 2, 3…: an ack below the newest relayed is sure to have followers.
        let more_coming = newest_ack.is_some_and(|id| id < self.wakeups.messages_relayed());
        let held_since = self.ack_held_since.unwrap_or(now);
        if only_acks
            && more_coming
            && was_idle
            && !window.is_zero()
            && self.upstream.outbox.len() < ACK_BATCH_BYTES
            && self.wakeups.may_hold(held_since, now)
        {
            self.ack_held_since = Some(held_since);
        } else {
            self.release_acks();
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
        let now = Instant::now();
        // Bytes at the front of the inbox that are whole data frames, relayed together.
        let mut frames = 0;
        let (mut data_frames, mut data_bytes) = (0u64, 0u64);
        // For the subscriber's acks: whether the read brought only acks, and the newest.
        let was_idle = self.ack_held_since.is_some() || self.upstream.outbox.is_empty();
        let (mut only_acks, mut newest_ack) = (true, None);
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
            match self.data(
                source,
                &header,
                &inbox.buffered()[frames + header.len..end],
                now,
            ) {
                Some(id) => newest_ack = Some(id),
                None => only_acks = false,
            }
            data_frames += 1;
            data_bytes += (end - frames - header.len) as u64;
            frames = end;
        }
        self.relay(source, inbox, &mut frames);
        if source == Side::Client {
            self.wakeups.read(now);
            self.batch_acks(only_acks, newest_ack, was_idle, now);
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
        if source == Side::Client {
            self.client_partial = inbox.buffered().len() as u64;
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
    fn data(
        &mut self,
        source: Side,
        header: &ws::Header,
        payload: &[u8],
        now: Instant,
    ) -> Option<u64> {
        match source {
            Side::Upstream => {
                if header.fin {
                    self.wakeups
                        .relayed((header.opcode == OpCode::Text).then_some(payload), now);
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
                                acks.sent_commit(id, watermark, now);
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

    /// The upstream closed with 1002 before answering anything: if the reason is Zero's refusal of this
    /// subscription's version, its range is what the upstream serves (docs/protocol.md, "Protocol versions the
    /// upstream serves"), and clients it would refuse are refused before a dial from now on.
    fn learn_from_refusal(&self, reason: &[u8]) {
        if self.subscribed {
            return;
        }
        let refusal = std::str::from_utf8(reason)
            .ok()
            .and_then(protocol::versions::parse_refusal)
            .filter(|refusal| refusal.version == self.version);
        if let Some(refusal) = refusal {
            self.ctx
                .protocols
                .learned(refusal.supported, Source::Refusal);
        }
    }

    /// Each hop keeps its own liveness: pings are answered here and never passed on; closes are passed on.
    fn control(&mut self, source: Side, opcode: OpCode, payload: BytesMut) {
        match opcode {
            OpCode::Ping => {
                // The answer does not wait behind held acks.
                self.release_acks();
                self.peer(source).control(OpCode::Pong, &payload);
            }
            OpCode::Pong if source == Side::Client => self.wakeups.ponged(),
            OpCode::Close => {
                self.peer(source).stopped_reading = true;
                match ws::read_close(payload) {
                    PeerClose::Valid { code, payload } => {
                        if source == Side::Upstream && code == Some(close::PROTOCOL_ERROR) {
                            self.learn_from_refusal(&payload[2..]);
                        }
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

/// The upstream has answered the subscription: end the task's reservation if this is its first subscription after a
/// restore (whatever the mode: docs/protocol.md, "How a reservation ends").
///
/// The subscriber was tracked when the relay started ([`track`]): the cleanup policy reads reservations before
/// subscribers, so a check around this step sees the reservation still open or the subscriber already tracked,
/// never neither.
fn on_subscribed(ctx: &RelayContext, subscription: &SubscriberContext, requested: Ticket) {
    if subscription.initial {
        if let Some(task_id) = &subscription.task_id {
            if let Some(held) =
                ctx.handles
                    .registry
                    .end_by_subscription(task_id, requested, Instant::now())
            {
                info!(task_id = %task_id, held = ?held, "reservation ended by its subscription");
            }
        }
    }
}
