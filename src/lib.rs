//! litestream-sidecar: runs beside litestream on Zero's replication-manager host, serves Zero's snapshot
//! reservations, and decides when the change log may be purged.
//!
//! Modules, one job each:
//! - [`config`]: `sidecar.toml` and environment overrides, validated into typed values.
//! - [`protocol`]: Zero's change-streamer wire protocol without I/O (paths, versions, frames, acks, reasons).
//! - [`inspect`]: the little of a relayed change-stream frame that ack tracking reads.
//! - [`ws`]: WebSocket plumbing shared by the handlers (cancel-safe reads and flushes, limits, liveness, closing).
//! - [`reservations`]: the reservation registry and the `/snapshot` handler.
//! - [`server`]: accept loop, HTTP routing and health endpoints.
//! - [`relay`]: the `/changes` relay to Zero's change-streamer.
//! - [`subscribers`]: relayed subscribers and their acknowledged watermarks.
//! - [`litestream`]: scraping litestream's metrics for backed-up watermarks; the proxy's page filter.
//! - [`cleanup`]: the pure decision when the change log may be purged.

#![forbid(unsafe_code)]

pub mod cleanup;
pub mod config;
pub mod inspect;
pub mod litestream;
pub mod protocol;
pub mod relay;
pub mod reservations;
pub mod server;
pub mod subscribers;
pub mod ws;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use config::Config;
use relay::RelayContext;
use reservations::{Registry, SnapshotContext};
use server::{Readiness, Shared};
use subscribers::Subscribers;

/// The sidecar's components, built from a validated config. Tests keep clones of the handles (such as
/// [`App::registry`]) before calling [`App::run`].
pub struct App {
    config: Config,
    registry: Registry,
    subscribers: Subscribers,
}

impl App {
    pub fn new(config: Config) -> Self {
        let registry = Registry::new(config.cleanup.initial_delay);
        Self {
            config,
            registry,
            subscribers: Subscribers::default(),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The relayed subscribers and their acknowledged watermarks.
    pub fn subscribers(&self) -> &Subscribers {
        &self.subscribers
    }

    /// Serves on `listener` until `shutdown` is cancelled, then closes every WebSocket (1001) and waits up to
    /// `server.shutdown_grace` for connections to finish.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let tracker = TaskTracker::new();
        let shared = Arc::new(Shared {
            snapshot: SnapshotContext {
                registry: self.registry.clone(),
                backup_url: self.config.litestream.backup_url.as_str().into(),
                ping_interval: self.config.server.ping_interval,
                max_message_bytes: self.config.server.max_message_bytes,
                shutdown: shutdown.clone(),
            },
            relay: RelayContext {
                settings: Arc::new(relay::Settings {
                    upstream: self.config.upstream.clone(),
                    relay: self.config.relay.clone(),
                    ping_interval: self.config.server.ping_interval,
                    max_message_bytes: self.config.server.max_message_bytes,
                }),
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                shutdown: shutdown.clone(),
            },
            readiness: Readiness::default(),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        });
        info!(addr = %listener.local_addr()?, "listening");
        server::serve(listener, shared).await;

        tracker.close();
        let grace = self.config.server.shutdown_grace;
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            warn!(
                still_running = tracker.len(),
                grace = ?grace,
                "connections still open after the shutdown grace period; exiting anyway"
            );
        }
        info!("stopped");
        Ok(())
    }
}
