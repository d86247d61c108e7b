//! `GET /metrics` on the main listener, through prometheus-client. The page reads the cleanup loop's [`Status`]
//! itself, plus the few figures only the handles keep ([`HandleFigures`]) and the live instruments, so a new status
//! fact needs no copy here: each metric's value is computed where it is registered. [`render`] is pure over them and
//! a [`Clock`], so it is tested by parsing its output, and against whole pages kept in `golden/`.
//!
//! By theme, in the page's order: `relay` (reservations, the relay, connections), `cleanup` (purges, holds,
//! registration, and the signals that stop cleanup or serving), `slots`, `destination` (`backup.verify`), `drills`.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use crate::cleanup::status::Status;

use super::metrics::Instruments;

mod cleanup;
mod destination;
mod drills;
#[cfg(test)]
mod golden;
mod relay;
mod slots;
#[cfg(test)]
mod tests;

/// The label of families by kind: of slot, of listing error, of drill failure.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// What the status does not hold: the handles' figures, read at the same instant as the status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandleFigures {
    pub reservations_open: usize,
    pub cleanup_delay: Duration,
    /// Relayed subscribers connected now.
    pub subscribers: usize,
    /// Whether the shard's `ownerAddress` names this sidecar; `None` when discovery is off.
    pub registered: Option<bool>,
    pub change_db_up: bool,
    pub upstream_up: bool,
    /// Connections open on the main listener, and its cap (`server.max_connections`).
    pub connections_open: usize,
    pub max_connections: usize,
}

/// The scrape's instant: the wall clock dates the newest backup, the monotonic one the hold in force (immune to
/// wall-clock steps).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub wall: SystemTime,
    pub now: tokio::time::Instant,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            wall: SystemTime::now(),
            now: tokio::time::Instant::now(),
        }
    }
}

/// Where a scrape reads its figures: the instruments, the status and the handles of [`HandleFigures`].
pub struct MetricsSources {
    pub instruments: Instruments,
    pub handles: crate::cleanup::handles::Handles,
    pub discovery_mode: crate::cleanup::discovery::DiscoveryMode,
    /// The main listener's connection counts.
    pub admission: crate::net::admission::Admission,
}

impl MetricsSources {
    /// The handles' figures, read now.
    pub fn handle_figures(&self) -> HandleFigures {
        let (registered, change_db_up) = self.handles.discovery.read(|discovery| {
            let registered = (self.discovery_mode != crate::cleanup::discovery::DiscoveryMode::Off)
                .then(|| {
                    discovery.registration
                        == Some(crate::cleanup::discovery::Registration::Registered)
                });
            (registered, discovery.db_up)
        });
        HandleFigures {
            reservations_open: self.handles.registry.len(),
            cleanup_delay: self.handles.registry.cleanup_delay(),
            subscribers: self.handles.subscribers.connected(),
            registered,
            change_db_up,
            upstream_up: self.instruments.upstream.read(|upstream| upstream.up),
            connections_open: self.admission.open(),
            max_connections: self.admission.max_connections(),
        }
    }

    /// The page `GET /metrics` serves.
    pub fn render(&self) -> String {
        let status = self.handles.status.get();
        let handles = self.handle_figures();
        render(&self.instruments, &status, &handles, Clock::now())
    }
}

/// The Prometheus text exposition of everything above (with `# EOF`, as OpenMetrics ends a page). Families come in
/// the order they are registered here, which is the page's: keep it when adding one.
pub fn render(
    instruments: &Instruments,
    status: &Status,
    handles: &HandleFigures,
    clock: Clock,
) -> String {
    let mut page = Page(Registry::with_prefix("litestream_sidecar"));
    relay::register(&mut page, instruments, handles);
    cleanup::purges(&mut page, status, handles, clock);
    slots::register(&mut page, status);
    cleanup::signals(&mut page, status, handles);
    if status.backup.verifying {
        destination::register(&mut page, &status.backup);
    }
    drills::register(&mut page, &status.drills, status.last_proof());

    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &page.0)
        .expect("writing to a String cannot fail");
    out
}

/// The registry a page is built in, with the shapes its single-valued metrics take.
struct Page(Registry);

impl Page {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.0.register(name, help, metric);
    }

    /// A gauge of a count, seconds or a timestamp (printed with a fraction).
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let gauge: Gauge<f64, AtomicU64> = Gauge::default();
        gauge.set(value);
        self.add(name, help, gauge);
    }

    /// A gauge of 1 or 0.
    fn flag(&mut self, name: &str, help: &str, on: bool) {
        self.gauge(name, help, if on { 1.0 } else { 0.0 });
    }

    /// A gauge of a whole number (printed without a fraction).
    fn integer(&mut self, name: &str, help: &str, value: i64) {
        let gauge: Gauge = Gauge::default();
        gauge.set(value);
        self.add(name, help, gauge);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        let counter: Counter = Counter::default();
        counter.inc_by(value);
        self.add(name, help, counter);
    }
}

/// Epoch seconds; `None` before the epoch.
fn epoch_seconds(t: SystemTime) -> Option<f64> {
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}
