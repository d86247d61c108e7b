//! `[upstream]` and `[relay]`: where `/changes` subscriptions are relayed to, and what the relay may hold.

use std::time::Duration;

use crate::keys::{self, Section};
use crate::net::address::{parse_host_port, validate_host_port, validate_owner_address};
use crate::net::tls::UpstreamTlsConfig;
use crate::protocol::versions::{intersect, Versions};
use crate::protocol::CHANGES_VERSIONS;

/// Longest `relay.ack_wakeup_wait`.
pub const MAX_ACK_WAKEUP_WAIT: Duration = Duration::from_secs(1);

/// `relay.ack_wakeup_bytes` by default: about 60 of Zero's acks, more than the most awaited at once
/// ([`crate::streamer::wakeup::MAX_ACKS_AWAITED`]), so that the count and the pace decide.
pub const DEFAULT_ACK_WAKEUP_BYTES: u64 = 1024;

/// Largest `relay.ack_wakeup_bytes`: far below a TCP receive buffer (Linux's default is 128 KiB), so that the kernel
/// never grows the buffer or clamps the window to honour it, and a few hundred acks at most wait together.
pub const MAX_ACK_WAKEUP_BYTES: u64 = 16 << 10;

/// Longest `relay.ack_batch_window`: Zero 1.x paces replication on acks, so a longer hold would slow it.
pub const MAX_ACK_BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Below this a relay buffer could not gather even a few small frames per write.
const MIN_BUFFERED_BYTES: u64 = 4096;

keys::section! {
    /// `[upstream]`: Zero's change-streamer.
    pub struct UpstreamConfig(s) {
        /// host:port of Zero's real change-streamer (the replication-manager's --change-streamer-port, 4849 by
        /// default). Every /changes subscription is relayed there; the replication-manager advertises the sidecar
        /// instead.
        address: String = key("127.0.0.1:4849", |text: String| validate_host_port(&text)),
        /// The address that change-streamer advertises as ownerAddress when not told otherwise (its preferred
        /// interface's IP and port, with ws:// or wss:// from Zero 0.22 on): the one discovery.mode = "adopt" replaces
        /// with the sidecar's, and the one discovery.mode = "owner" requires. "" = the same as address.
        advertised_address: String = key("", |text: String| match text.trim() {
            // A bad address is reported once, under its own key.
            "" => Ok(address.clone().unwrap_or_default()),
            other => validate_owner_address(other),
        }),
        /// How long connecting and the WebSocket handshake to the upstream may take; a subscriber that cannot be
        /// relayed is refused with HTTP 502 before its upgrade, which makes Zero's client back off.
        connect_timeout: Duration = key("5s", keys::positive_duration),
        /// An upstream that sends nothing (no message, no ping) for a whole period of this length is dropped. Zero
        /// pings every 30s; 33s is what Zero's own client allows.
        silence_timeout: Duration = key("33s", keys::positive_duration),
        /// The protocol versions the upstream change-streamer serves (Zero 0.20: 1..3, 1.9: 1..6, 1.10: 4..6). A client
        /// outside them is refused with HTTP 400 and Zero's own text before any snapshot status, and its /changes
        /// before the upstream is dialed. "auto": learned from the upstream's refusals, of a probe the sidecar sends to
        /// /replication/v0/changes (at start, and when the upstream was lost) or of a relayed subscription; until then,
        /// /snapshot serves v3 to v6 as the sidecar can. A range such as "4..6" (or "v4..v6") is used as written,
        /// nothing is learned; it must include a version from 1 to 6. See [docs/protocol.md, "Protocol versions the
        /// upstream serves"](protocol.md#protocol-versions-the-upstream-serves).
        protocols: Protocols = key("auto", parse_protocols),
        /// `wss://` to the upstream (`tls = true`), for a change-streamer behind a TLS-terminating proxy.
        tls: Option<UpstreamTlsConfig> = from(upstream_tls(s, address.as_deref())) reads {
            /// Connect to the upstream with TLS (wss://), e.g. when its change-streamer sits behind a TLS-terminating
            /// proxy.
            tls,
            /// With tls: PEM bundle of the CAs the upstream's certificate must chain to, trusted instead of the
            /// system's; re-read on SIGHUP. "" = the system's trust store (SSL_CERT_FILE and SSL_CERT_DIR are
            /// honoured).
            tls_ca_file,
            /// With tls: the name the upstream's certificate must carry, also sent as SNI. "" = the host of address.
            tls_server_name,
        },
    }
}

/// `upstream.protocols`: where the sidecar's knowledge of the upstream's protocol versions comes from
/// (docs/protocol.md, "Protocol versions the upstream serves").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protocols {
    /// Learned from the upstream's own refusals: of a probe, or of a relayed subscription.
    Auto,
    /// Fixed by the operator; nothing is learned, and no probe is made.
    Fixed(Versions),
}

/// `"auto"`, or a range `"A..B"` as in `"4..6"` (each bound may be written `v4`, as Zero writes them). A range must
/// hold a version the relay forwards: one without any would refuse every client.
fn parse_protocols(text: String) -> Result<Protocols, String> {
    let text = text.trim();
    if text == "auto" {
        return Ok(Protocols::Auto);
    }
    let form = || {
        format!("{text:?} is neither \"auto\" nor a range of protocol versions such as \"4..6\"")
    };
    let bound = |b: &str| {
        let digits = b.strip_prefix('v').unwrap_or(b);
        let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        plain.then(|| digits.parse::<u64>().ok()).flatten()
    };
    let (min, max) = text.split_once("..").ok_or_else(form)?;
    let (Some(min), Some(max)) = (bound(min), bound(max)) else {
        return Err(form());
    };
    if min > max {
        return Err(format!("{text:?} is empty: v{min} is above v{max}"));
    }
    if min == 0 {
        return Err(format!("{text:?}: protocol versions start at v1"));
    }
    let versions = min..=max;
    if intersect(&versions, &CHANGES_VERSIONS).is_none() {
        return Err(format!(
            "{text:?} holds no version the sidecar relays (v{} to v{}): every client would be refused",
            CHANGES_VERSIONS.start(),
            CHANGES_VERSIONS.end()
        ));
    }
    Ok(Protocols::Fixed(versions))
}

/// `tls`, `tls_ca_file` and `tls_server_name`: `Some(None)` without TLS; `None` when a problem was recorded. The
/// server name defaults to the address's host, which is what a certificate for the upstream names when the address
/// is a DNS name.
fn upstream_tls(s: &mut Section<'_>, address: Option<&str>) -> Option<Option<UpstreamTlsConfig>> {
    let tls = s.value("tls", false)?;
    let ca_file = s.value("tls_ca_file", String::new())?;
    let name = s.value("tls_server_name", String::new())?;
    let (ca_file, name) = (ca_file.trim(), name.trim());
    if !tls {
        let key = match (ca_file, name) {
            ("", "") => return Some(None),
            ("", _) => "tls_server_name",
            _ => "tls_ca_file",
        };
        return s.problem(key, "has no effect unless upstream.tls = true".into());
    }
    let name = match name {
        // A bad address is reported once, under its own key.
        "" => parse_host_port(address?).ok()?.0,
        name => name.to_string(),
    };
    let server_name = match rustls::pki_types::ServerName::try_from(name.clone()) {
        Ok(server_name) => server_name,
        Err(_) => {
            return s.problem(
                "tls_server_name",
                format!("{name:?} is neither a DNS name nor an IP address"),
            )
        }
    };
    Some(Some(UpstreamTlsConfig {
        ca_file: (!ca_file.is_empty()).then(|| ca_file.into()),
        server_name,
    }))
}

keys::section! {
    /// `[relay]`: what one relayed subscription may hold.
    pub struct RelayConfig(s) {
        /// Forward initial=false instead of initial=true so that Zero schedules no change-log purge of its own and the
        /// sidecar is the only cleanup authority (the recommended deployment). Set false to leave the query untouched.
        suppress_upstream_cleanup: bool = key(true),
        /// Bytes queued toward one socket before the relay stops reading the other side, per direction and
        /// connection: a slow subscriber slows only its own stream, down to TCP. A single larger message still
        /// passes. At least 4096.
        max_buffered_bytes: usize = key(64u64 << 10, |n: u64| {
            if n < MIN_BUFFERED_BYTES {
                Err(format!("{n} is below {MIN_BUFFERED_BYTES}"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// Sent commits awaiting a subscriber's ack that are tracked one by one; beyond this they are merged, which can
        /// only make the subscriber's acknowledged watermark lag. At least 2.
        max_pending_commits: usize = key(4096u64, |n: u64| {
            if n < 2 {
                Err(format!("{n} is below 2"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// A subscriber toward which bytes have waited this long without a single one being written has stopped reading
        /// (a hung process, a dead peer whose kernel still holds the connection): its subscription is ended, the
        /// upstream connection closed with 1001, and relay_write_stalls_total counted. Without it only TCP's
        /// retransmission timeouts, many minutes later, would end it. Checked at each ping (server.ping_interval).
        /// Pings wait behind the data queued toward such a subscriber, so server.peer_timeout does not apply to it
        /// while bytes are waiting.
        write_stall_timeout: Duration = key("60s", keys::positive_duration),
        /// Zero's view-syncers ack every message in a write of its own as they apply it, so a transaction of five
        /// changes brings five acks. With a window, while a subscriber's newest ack is below the newest message relayed
        /// to it (more acks are sure to follow), the relay holds them and writes them upstream together, once the
        /// subscriber has acked everything relayed, or after this long at most: fewer reads for Zero's change-streamer,
        /// a Node process. An ack that leaves nothing in flight, the one an upstream pacing on acks waits for, is never
        /// held, nor are acks once the next is not expected within `ack_wakeup_wait` of the first held; any other
        /// frame, a close, or an upstream ping sends what is held at once. Off by default: measured on a 2-core
        /// machine, holding cost the sidecar more CPU than the writes it saved. At most 20ms, e.g. "1ms"; "0s" writes
        /// each read's acks at once.
        ack_batch_window: Duration = key("0s", |text: String| {
            keys::at_most(text, MAX_ACK_BATCH_WINDOW).map_err(|e| format!("{e}: Zero paces replication on acks"))
        }),
        /// Zero's subscribers ack every message in a frame of its own (`{"ack":N}`, 15 bytes or more). The relay knows
        /// how many messages it passed down are not acked yet, so it asks the kernel (the socket's SO_RCVLOWAT) not to
        /// wake it before several of those acks are there, up to this many bytes, and then forwards them upstream in
        /// one write: one wake-up per small transaction or per 8 acks instead of one per message, the largest part of
        /// the relay's CPU. It waits for 8 acks at most (a subscriber's TCP may hold back more until they are
        /// acknowledged), for no more than the subscriber is seen to send within `ack_wakeup_wait`, never past the
        /// newest message relayed (the ack Zero's flow control waits for), only while the subscriber is seen to ack one
        /// message at a time, and never for a pong or once either side is closing. Not for subscribers connected over
        /// the listener's TLS. 0 wakes the relay for each ack. At most 16384.
        ack_wakeup_bytes: u64 = key(DEFAULT_ACK_WAKEUP_BYTES, |n: u64| {
            if n > MAX_ACK_WAKEUP_BYTES {
                Err(format!("{n} is above {MAX_ACK_WAKEUP_BYTES}"))
            } else {
                Ok(n)
            }
        }),
        /// Fewest messages in flight (relayed, not yet acked) for which `ack_wakeup_bytes` gathers a subscriber's
        /// acks; with fewer, each ack is read as it comes. A wait has fixed costs (arming its time limit, a timer the
        /// kernel programs, which is dear in a virtual machine; setting the mark; a wake-up for nothing when the limit
        /// passes) that the few reads a live transaction of a few messages saves do not repay: measured on Zero's own
        /// stream, gathering such acks cost the relay more CPU than waking for each. A subscriber catching up, or a
        /// large transaction, has many in flight and gathers. From 1 (gather whatever is in flight) to 1024.
        ack_wakeup_backlog: u64 = key(8u64, |n: u64| {
            if (1..=1024).contains(&n) {
                Ok(n)
            } else {
                Err(format!("{n} is not between 1 and 1024"))
            }
        }),
        /// Longest acks wait under `ack_wakeup_bytes` for the ones after them, counted from the relay's last read (on a
        /// timer to the microsecond): a subscriber that pauses mid-transaction (a slow commit) or closes is heard after
        /// this long at most. It is also the most the relay plans for the first ack of a wait to wait for the last, for
        /// `ack_wakeup_bytes` and `ack_batch_window` alike. Zero 1.10 drops a subscriber whose acks keep arriving later
        /// than the others' (StreamTooFarBehind, [docs/protocol.md, "Relayed subscribers dropped as too far
        /// behind"](protocol.md#relayed-subscribers-dropped-as-too-far-behind)): 500us keeps a relayed subscriber's
        /// acks within a millisecond of a direct one's, with room for a busy machine's wake-ups. Longer lets the relay
        /// sleep through more acks of a slow subscriber, for less CPU, where no subscriber connects to the upstream
        /// directly or Zero is older than 1.10. Longer than zero, at most 1s.
        ack_wakeup_wait: Duration = key("500us", |text: String| {
            keys::positive_duration(text.clone()).and_then(|_| keys::at_most(text, MAX_ACK_WAKEUP_WAIT))
        }),
    }
}
