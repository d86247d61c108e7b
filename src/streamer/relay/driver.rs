//! The relay's I/O: answering a `/changes` upgrade ([`serve`]) and the loop that drives one relayed connection's
//! sockets, timers and shutdown through the state machine.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use bytes::Bytes;
use fastwebsockets::WebSocket;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::cleanup::reservations::Ticket;
use crate::net::http::{accept_upgrade, plain, spawn_upgraded};
use crate::net::timer::PreciseTimer;
use crate::net::upgraded::Socket;
use crate::net::ws::{self, Inbox, Io, Liveness, Reads, WriteStall};
use crate::protocol::{self, SubscriberContext, Version};

use super::upstream::{connect, upstream_target};
use super::{Relay, RelayContext, Side, SubscriptionEnd};

/// Answers a `/changes` upgrade request. A version the upstream is known not to serve is refused (HTTP 400, the
/// upstream's own text) without a dial. The upstream WebSocket is opened first, inside the request, so that a
/// subscription the sidecar cannot relay is refused (HTTP 502) before the subscriber's upgrade completes; the
/// relay then runs on its own task in `tracker`.
pub async fn serve(
    mut req: Request<Incoming>,
    version: &Version,
    peer: SocketAddr,
    ctx: &RelayContext,
    tracker: &TaskTracker,
) -> Response<Full<Bytes>> {
    let version = match ctx.protocols.check_changes(version) {
        Ok(version) => version,
        Err(message) => {
            debug!(%message, "subscription refused");
            return plain(StatusCode::BAD_REQUEST, message);
        }
    };
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
    let requested = ctx.handles.registry.ticket();
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
            ctx.handles.subscribers.upstream_reached(Instant::now());
            ctx.instruments.upstream.update(|u| u.attempted(None));
            upstream
        }
        Err(err) => {
            ctx.handles.subscribers.upstream_lost();
            ctx.protocols.recheck();
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
        handle_changes(ctx, version, subscription, requested, ws, upstream, socket).await;
    });
    response
}

/// Relays one subscription until either side ends it or the sidecar shuts down. `client` has just completed
/// its upgrade; `upstream` is the socket [`connect`] returned.
pub(super) async fn handle_changes(
    ctx: RelayContext,
    version: u64,
    subscription: SubscriberContext,
    requested: Ticket,
    client: WebSocket<Io>,
    upstream: Io,
    mut client_socket: Option<RawFd>,
) -> SubscriptionEnd {
    let settings = ctx.settings.clone();
    let mut client = Socket::take(client.into_inner());
    let mut upstream = Socket::take(upstream);
    let (mut client_reader, mut client_writer) = client.split();
    let (mut upstream_reader, mut upstream_writer) = upstream.split();
    let mut from_client = Inbox::new(true, settings.max_message_bytes, Reads::Bulk);
    let mut from_upstream = Inbox::new(false, settings.max_message_bytes, Reads::Bulk);
    let linger = tokio::time::sleep(Duration::ZERO);
    // The end of the held acks' batch window, armed only when a new hold starts.
    let ack_window = tokio::time::sleep(Duration::ZERO);
    let mut ack_window_at = None;
    // The subscriber's socket's low-water mark as set, and the limit on how long acks wait under it: a timer to
    // the microsecond, made when the first wait starts, since Tokio's millisecond ticks would add up to a
    // millisecond to every wait cut short.
    let mut low_water = 1;
    let mut ack_wakeup_timer: Option<PreciseTimer> = None;
    let mut ack_wakeup_waiting = false;
    // One shutdown future for the whole connection: creating one per loop turn would cost a lock each time.
    let shutdown = ctx.shutdown.cancelled();
    tokio::pin!(linger, ack_window, shutdown);
    let mut lingering = false;
    let mut shutting_down = false;
    let mut client_liveness = Liveness::new(settings.ping_interval, settings.peer_timeout);
    // The upstream is never pinged (Zero pings it); it is only checked, every silence timeout.
    let silence = settings.upstream.silence_timeout;
    let mut upstream_liveness = Liveness::new(silence, silence);
    let mut client_writes = WriteStall::new(settings.relay.write_stall_timeout);
    let mut relay = Relay::new(&ctx, version, subscription, requested);

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
                if wanted > 1 && ack_wakeup_timer.is_none() {
                    match PreciseTimer::new() {
                        Ok(timer) => ack_wakeup_timer = Some(timer),
                        Err(err) => {
                            // Out of file descriptors: this subscription is woken for every ack instead.
                            warn!(error = %err, "cannot make the ack wake-up timer");
                            client_socket = None;
                            continue;
                        }
                    }
                }
                let bytes = wanted.try_into().unwrap_or(u32::MAX);
                match crate::net::sockopt::set_receive_low_water(fd, bytes) {
                    Ok(()) => {
                        low_water = wanted;
                        // A wait that ended leaves no limit behind for the next one.
                        ack_wakeup_waiting &= wanted > 1;
                    }
                    Err(err) => {
                        // Not expected of a TCP socket; the relay then wakes as the kernel decides.
                        warn!(error = %err, "cannot set the subscriber socket's low-water mark");
                        client_socket = None;
                        continue;
                    }
                }
            }
            // Armed when a wait starts and again after each read from the subscriber: the acks awaited are those
            // sent since, so none of them waits in the kernel longer than the limit. Arming replaces the deadline
            // and any expiry not waited for; one left running after a read may wake the relay once, for nothing.
            if low_water > 1 && !ack_wakeup_waiting {
                ack_wakeup_waiting = true;
                let armed = ack_wakeup_timer
                    .as_ref()
                    .map(|timer| timer.arm(settings.relay.ack_wakeup_wait));
                if let Some(Err(err)) = armed {
                    // Not expected of a timer just made; acks are not left waiting without one.
                    warn!(error = %err, "cannot arm the ack wake-up timer");
                    let _ = crate::net::sockopt::set_receive_low_water(fd, 1);
                    low_water = 1;
                    ack_wakeup_waiting = false;
                    client_socket = None;
                }
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
                        if from_upstream.drained() {
                            write_through(&mut relay, Side::Client, &mut client_writer).await;
                        }
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
                        ack_wakeup_waiting = false;
                        if from_client.drained() {
                            write_through(&mut relay, Side::Upstream, &mut upstream_writer).await;
                        }
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
            _ = fired(ack_wakeup_timer.as_ref()), if ack_wakeup_waiting => {
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
        ctx.handles.subscribers.upstream_lost();
    }
    if outcome.may_change_upstream() {
        ctx.protocols.recheck();
    }
    drop(relay);
    info!(outcome = ?outcome, "subscription ended");
    outcome
}

/// Writes what a read just queued toward `side` in the same turn of the loop, rather than in the next: the read
/// took all the socket had, so nothing more would join it, and a turn polls every socket and timer again. What the
/// socket does not take now is left to the loop's flush. The loop's checks (held acks, a gone side) apply alike.
async fn write_through<W: tokio::io::AsyncWrite + Unpin>(
    relay: &mut Relay<'_>,
    side: Side,
    writer: &mut W,
) {
    if !relay.wants_write(side) {
        return;
    }
    if let Some(Err(err)) = relay.peer(side).outbox.flush_now(writer).await {
        debug!(error = %err, ?side, "connection lost");
        relay.on_lost(side);
    }
}

/// When `timer` fires; never without one. A timer that cannot be read ends the wait as if it had fired: the acks
/// are read at once rather than left waiting.
async fn fired(timer: Option<&PreciseTimer>) {
    match timer {
        Some(timer) => {
            if let Err(err) = timer.fired().await {
                debug!(error = %err, "the ack wake-up timer failed");
            }
        }
        None => std::future::pending().await,
    }
}
