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
        /// `host:port` of Zero's change-streamer, where `/changes` subscriptions are relayed to.
        address: String = key("127.0.0.1:4849", |text: String| validate_host_port(&text)),
        /// The address that change-streamer writes as `ownerAddress` when not told otherwise (its preferred
        /// interface's IP and port): the one `discovery.mode = "adopt"` replaces. Defaults to `address`.
        advertised_address: String = key("", |text: String| match text.trim() {
            // A bad address is reported once, under its own key.
            "" => Ok(address.clone().unwrap_or_default()),
            other => validate_owner_address(other),
        }),
        /// How long connecting and the WebSocket handshake to the upstream may take before the subscriber is
        /// refused (HTTP 502).
        connect_timeout: Duration = key("5s", keys::positive_duration),
        /// An upstream from which nothing (message or ping) arrived during a whole period of this length is dropped.
        silence_timeout: Duration = key("33s", keys::positive_duration),
        /// The protocol versions the upstream serves: learned from it, or fixed by the operator.
        protocols: Protocols = key("auto", parse_protocols),
        /// `wss://` to the upstream (`tls = true`), for a change-streamer behind a TLS-terminating proxy.
        tls: Option<UpstreamTlsConfig> = from(upstream_tls(s, address.as_deref())),
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
        /// Forward `initial=false` instead of `initial=true` so that Zero does not schedule its own change-log
        /// purge (docs/protocol.md, "Two purgers" and "The purge-on-subscribe signal").
        suppress_upstream_cleanup: bool = key(true),
        /// Bytes queued toward one socket before the relay stops reading the other: a slow reader slows only its
        /// own stream. A single larger frame still passes, one at a time.
        max_buffered_bytes: usize = key(64u64 << 10, |n: u64| {
            if n < MIN_BUFFERED_BYTES {
                Err(format!("{n} is below {MIN_BUFFERED_BYTES}"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// Commits sent and not yet acknowledged that a subscriber's ack tracking keeps apart; past it older ones
        /// are merged, which can only delay the acknowledged watermark.
        max_pending_commits: usize = key(4096u64, |n: u64| {
            if n < 2 {
                Err(format!("{n} is below 2"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// A subscriber toward which bytes have been queued this long without one being written has stopped
        /// reading: its subscription is ended rather than left to TCP's retransmission timeouts.
        write_stall_timeout: Duration = key("60s", keys::positive_duration),
        /// How long a subscriber's acks may wait to travel upstream together while later messages are still being
        /// consumed; zero (the default) sends each read's acks at once. An ack that leaves nothing in flight is
        /// never held, nor are acks once the next is not expected within `ack_wakeup_wait` of the first.
        ack_batch_window: Duration = key("0s", |text: String| {
            keys::at_most(text, MAX_ACK_BATCH_WINDOW).map_err(|e| format!("{e}: Zero paces replication on acks"))
        }),
        /// Most bytes of a subscriber's acks the relay asks the kernel to gather before waking it (`SO_RCVLOWAT`,
        /// [`crate::streamer::wakeup`]); 0 wakes it for each. It waits only for acks that are sure to come, and
        /// only for as many as neither TCP nor the subscriber's pace would keep waiting long.
        ack_wakeup_bytes: u64 = key(DEFAULT_ACK_WAKEUP_BYTES, |n: u64| {
            if n > MAX_ACK_WAKEUP_BYTES {
                Err(format!("{n} is above {MAX_ACK_WAKEUP_BYTES}"))
            } else {
                Ok(n)
            }
        }),
        /// Longest a subscriber's acks wait in the kernel for the ones after them: past it the relay reads what
        /// came, so a subscriber that stalls mid-transaction, or closes, is heard anyway. It is also the budget the
        /// wake-ups and ack batching plan with. Zero 1.10 drops a subscriber whose acks keep coming later than the
        /// others' (docs/protocol.md, "Relayed subscribers dropped as too far behind"): 500 us leaves room for the
        /// wake-ups of a busy machine within a millisecond.
        ack_wakeup_wait: Duration = key("500us", |text: String| {
            keys::positive_duration(text.clone()).and_then(|_| keys::at_most(text, MAX_ACK_WAKEUP_WAIT))
        }),
    }
}
