//! The sidecar's own Prometheus instruments, updated on the hot paths as things happen ([`Instruments`]:
//! reservation durations, relayed frames and bytes, upstream connect errors, refused connections, TLS reloads), and
//! the relay's view of the upstream ([`UpstreamHealth`]). The page that reads them is `metrics_page`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Which way a relayed frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the change-streamer to the subscriber.
    Downstream,
    /// From the subscriber (acks) to the change-streamer.
    Upstream,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Downstream => "downstream",
            Direction::Upstream => "upstream",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DirectionLabel {
    direction: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabel {
    result: &'static str,
}

/// Instruments updated where things happen. Cheap to clone (every field shares its value).
#[derive(Debug, Clone)]
pub struct Instruments {
    /// Seconds each reservation was held, however it ended.
    pub reservation_seconds: Histogram,
    pub relay_frames: Family<DirectionLabel, Counter>,
    pub relay_bytes: Family<DirectionLabel, Counter>,
    pub upstream_connect_errors: Counter,
    /// Subscriptions ended because the subscriber stopped reading (`relay.write_stall_timeout`).
    pub relay_write_stalls: Counter,
    /// The relay's last attempt to reach the upstream change-streamer.
    pub upstream: crate::shared::Cell<UpstreamHealth>,
    /// Connections and requests turned away, by [`crate::net::admission::Refusal`].
    pub connections_refused: Family<crate::net::admission::RefusalLabel, Counter>,
    /// SIGHUP re-reads of TLS files, by outcome: a failed one leaves the sidecar on certificates that may expire.
    pub tls_reloads: Family<ResultLabel, Counter>,
}

impl Default for Instruments {
    fn default() -> Self {
        Self {
            reservation_seconds: crate::cleanup::reservations::duration_histogram(),
            relay_frames: Family::default(),
            relay_bytes: Family::default(),
            upstream_connect_errors: Counter::default(),
            relay_write_stalls: Counter::default(),
            upstream: crate::shared::Cell::default(),
            connections_refused: Family::default(),
            tls_reloads: Family::default(),
        }
    }
}

/// One direction's relay counters, looked up once per connection: a lookup in their families takes a lock and
/// hashes the label, which the relay would otherwise pay on every read.
#[derive(Debug, Clone)]
pub struct RelayCounters {
    frames: Counter,
    bytes: Counter,
}

impl RelayCounters {
    /// Counts `frames` relayed frames carrying `bytes` payload bytes (the relay counts once per read).
    pub fn relayed(&self, frames: u64, bytes: u64) {
        self.frames.inc_by(frames);
        self.bytes.inc_by(bytes);
    }
}

impl Instruments {
    /// The counters of frames and bytes relayed in `direction`.
    pub fn relay_counters(&self, direction: Direction) -> RelayCounters {
        let label = DirectionLabel {
            direction: direction.as_str(),
        };
        RelayCounters {
            frames: self.relay_frames.get_or_create(&label).clone(),
            bytes: self.relay_bytes.get_or_create(&label).clone(),
        }
    }

    /// Counts one re-read of TLS files (the listener's pair, or the upstream's CAs).
    pub fn tls_reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.tls_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }
}

/// The outcome of the relay's last attempt to reach the upstream change-streamer. No periodic probe: every
/// subscription connects, so the last connect is as fresh as anyone relies on the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// Whether the last attempt succeeded; true before any, so that an idle sidecar does not alert.
    pub up: bool,
    /// Wall-clock time of the last attempt.
    pub last_attempt: Option<std::time::SystemTime>,
    /// Why the last attempt failed, while it is the last.
    pub last_error: Option<String>,
}

impl Default for UpstreamHealth {
    fn default() -> Self {
        Self {
            up: true,
            last_attempt: None,
            last_error: None,
        }
    }
}

impl UpstreamHealth {
    pub(crate) fn attempted(&mut self, error: Option<String>) {
        self.up = error.is_none();
        self.last_attempt = Some(std::time::SystemTime::now());
        self.last_error = error;
    }
}
