//! The sidecar's build, snapshot reservations, the relay and the main listener's connections.

use prometheus_client::metrics::info::Info;

use super::{HandleFigures, Instruments, Page};

pub(super) fn register(page: &mut Page, instruments: &Instruments, handles: &HandleFigures) {
    page.add(
        "build",
        "Version of this sidecar",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    page.gauge(
        "reservations_open",
        "Snapshot reservations open now",
        handles.reservations_open as f64,
    );
    page.add(
        "reservation_duration_seconds",
        "How long reservations were held, however they ended",
        instruments.reservation_seconds.clone(),
    );
    page.gauge(
        "relayed_subscribers",
        "Change-stream subscribers relayed now",
        handles.subscribers as f64,
    );
    page.add(
        "relay_frames",
        "WebSocket frames relayed, by direction",
        instruments.relay_frames.clone(),
    );
    page.add(
        "relay_bytes",
        "Payload bytes relayed, by direction",
        instruments.relay_bytes.clone(),
    );
    page.add(
        "upstream_connect_errors",
        "Subscriptions refused because the change-streamer could not be reached or refused the upgrade",
        instruments.upstream_connect_errors.clone(),
    );
    page.gauge(
        "connections_open",
        "Connections open on the main listener, WebSockets included",
        handles.connections_open as f64,
    );
    page.gauge(
        "max_connections",
        "server.max_connections: past it, new connections get HTTP 503",
        handles.max_connections as f64,
    );
    page.add(
        "connections_refused",
        "Connections and requests turned away, by reason: max_connections (503), not_allowed (403, server.allow), \
         header_timeout (closed), header_too_large (431)",
        instruments.connections_refused.clone(),
    );
    page.add(
        "relay_write_stalls",
        "Subscriptions ended because the subscriber stopped reading: bytes waited relay.write_stall_timeout",
        instruments.relay_write_stalls.clone(),
    );
    page.add(
        "tls_reloads",
        "Re-reads of TLS certificates, keys and CAs on SIGHUP, by result; a failed one keeps the previous ones",
        instruments.tls_reloads.clone(),
    );
}
