//! litestream-sidecar: runs beside litestream on Zero's replication-manager host, serves Zero's snapshot
//! reservations, and decides when the change log may be purged.
//!
//! Modules, one job each:
//! - [`address`]: what a `host:port` is and when two addresses name the same endpoint.
//! - [`backup`]: listing the backup destination, to check litestream's claims against what it holds.
//! - [`config`]: `sidecar.toml` and environment overrides, validated into typed values.
//! - [`protocol`]: Zero's change-streamer wire protocol without I/O (paths, versions, frames, acks, reasons).
//! - [`inspect`]: the little of a relayed change-stream frame that ack tracking reads.
//! - [`ws`]: WebSocket plumbing shared by the handlers (cancel-safe reads and flushes, limits, liveness, closing).
//! - [`reservations`]: the reservation registry and the `/snapshot` WebSocket, from its upgrade on.
//! - [`server`]: the HTTP accept loop for every listener, routing and the plain endpoints.
//! - `http`: the answers the router and the handlers write themselves: plain text, and WebSocket upgrades.
//! - [`relay`]: the `/changes` relay to Zero's change-streamer, from the subscriber's upgrade on.
//! - [`ack_wakeup`]: how many bytes of a subscriber's acks are worth waking the relay for, without I/O.
//! - `sockopt`: the socket a request came in on, and the option the threshold is set with (the only `unsafe`).
//! - [`subscribers`]: relayed subscribers and their acknowledged watermarks.
//! - [`litestream`]: scraping litestream's metrics for backed-up watermarks; the proxy's page filter.
//! - [`cleanup`]: the pure decision when the change log may be purged.
//! - [`change_db`]: Zero's change DB in PostgreSQL: supervised connection, `ownerAddress`, batched purge.
//! - [`monitor`]: the loop that scrapes, decides and purges.
//! - [`discovery`]: registration in the shard's address table (`ownerAddress`).
//! - [`notify`]: systemd's readiness, status and watchdog notifications.
//! - [`proxy`]: litestream's metrics page for Zero, without the watermark gauge or with it clamped.
//! - [`metrics`]: the sidecar's own Prometheus metrics: instruments, the state read at scrape time, the page.
//! - [`shared`]: state one loop writes and others read, and the rhythm of the periodic loops.
//! - [`status`]: `GET /status` (the state as JSON) and the table `litestream-sidecar status` prints from it.
//! - [`state`]: what survives a restart (open reservations, tracked subscribers, the learned delay, the last purge,
//!   the highest watermark, the replica version): the file's format and its atomic replacement.
//! - [`keeper`]: keeps the state file current as reservations open and end.
//! - [`tls`]: TLS for the listener (reloaded on SIGHUP), toward the upstream, and for `status`.

// Denied rather than forbidden so that `sockopt` alone can allow it.
#![deny(unsafe_code)]

pub mod ack_wakeup;
pub mod address;
pub mod admission;
pub mod allow;
pub mod backup;
pub mod change_db;
pub mod cleanup;
pub mod config;
pub mod discovery;
mod http;
pub mod inspect;
pub mod keeper;
pub mod litestream;
pub mod metrics;
pub mod monitor;
pub mod notify;
pub mod protocol;
pub mod proxy;
pub mod relay;
pub mod reservations;
pub mod server;
pub mod shared;
mod sockopt;
pub mod state;
pub mod status;
pub mod subscribers;
pub mod tls;
pub mod ws;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, info_span, warn, Instrument};

pub use config::Config;
use relay::RelayContext;
use reservations::{Registry, SnapshotContext};
use server::{Context, Readiness};
use subscribers::Subscribers;

/// Connections the metrics proxy holds at once: Zero's BackupMonitor fetches one page at a time.
const PROXY_MAX_CONNECTIONS: usize = 64;

/// Why [`App::run`] stopped with an error rather than after a drain; `main` exits 1 on any of them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `litestream.metrics_url` cannot be scraped (not an `http://` URL with a host): neither the monitor nor the
    /// metrics proxy could work.
    #[error("litestream.metrics_url: {0}")]
    MetricsUrl(#[source] litestream::ScrapeError),
    /// A listener handed to [`App::run`] cannot say its address.
    #[error("listener: {0}")]
    Listener(#[source] std::io::Error),
    /// A certificate, key or CA file the config names cannot be used.
    #[error(transparent)]
    Tls(tls::Error),
}

/// The one-line state systemd shows (`systemctl status`): what readiness waits for, else what cleanup does.
fn status_line(missing: &[&str], status: &monitor::Status) -> String {
    if !missing.is_empty() {
        return format!("waiting: {}", missing.join("; "));
    }
    if let Some(problem) = status.cleanup_problem() {
        return format!("ready; {problem}");
    }
    match status.last_decision.as_ref() {
        None => "ready; first cleanup check pending".to_string(),
        Some(cleanup::Decision::Hold(reason)) => format!("ready; cleanup held: {reason}"),
        Some(cleanup::Decision::Purge { before, bound }) => {
            format!("ready; last cleanup decision: purge below {before} (bound by {bound})")
        }
    }
}

/// What the previous run left in the state file, as the start needs it.
struct Start {
    saved: Option<state::Saved>,
    memory: cleanup::Memory,
    /// Why the file cannot be used, when it cannot.
    problem: Option<String>,
    /// No file says which restores were in flight: this start is when that became so.
    restores_unknown: bool,
}

/// Reads the state the previous run left in `path` (`None`: the operator keeps none). A file that cannot be read is
/// no reason not to start, but nothing is guessed around it: cleanup holds until the operator has looked.
fn restore_state(path: Option<&std::path::Path>) -> Start {
    let Some(path) = path else {
        info!(
            "cleanup.state_file = \"none\": open reservations and the learned cleanup delay will not survive a \
             restart; each start holds cleanup for cleanup.hold_without_state"
        );
        return Start {
            saved: None,
            memory: cleanup::Memory::OptedOut,
            problem: None,
            restores_unknown: true,
        };
    };
    match state::load(path) {
        Ok(Some(saved)) => {
            info!(
                path = %path.display(),
                cleanup_delay = ?saved.cleanup_delay,
                last_purge = saved.last_purge.as_ref().map_or("", |b| b.watermark.as_str()),
                highest_backup = saved.highest_backup.as_deref().unwrap_or(""),
                replica_version = saved.replica_version.as_deref().unwrap_or(""),
                reservations = saved.reservations.len(),
                "state restored"
            );
            Start {
                restores_unknown: !saved.knows_reservations,
                saved: Some(saved),
                memory: cleanup::Memory::Kept,
                problem: None,
            }
        }
        Ok(None) => {
            warn!(
                path = %path.display(),
                "no state file (a first start, or the file was lost): a restore begun before this start may be in \
                 flight unseen, so cleanup holds for cleanup.hold_without_state"
            );
            Start {
                saved: None,
                memory: cleanup::Memory::Kept,
                problem: None,
                restores_unknown: true,
            }
        }
        Err(err) => {
            let problem = format!(
                "{err}; which restores were in flight is unknown. Once no view-syncer is restoring, move the file \
                 aside and restart (cleanup then holds for cleanup.hold_without_state)"
            );
            error!(error = %problem, "state file unusable: cleanup holds; the sidecar serves on");
            Start {
                saved: None,
                memory: cleanup::Memory::Unreadable,
                problem: Some(problem),
                restores_unknown: true,
            }
        }
    }
}

/// The sidecar's components, built from a validated config. Tests keep clones of the handles (such as
/// [`App::registry`]) before calling [`App::run`].
pub struct App {
    config: Config,
    registry: Registry,
    subscribers: Subscribers,
    status: monitor::StatusHandle,
    discovery: discovery::StateHandle,
    instruments: metrics::Instruments,
    started: tokio::time::Instant,
    /// What the previous run left in the state file.
    resumed: monitor::Resumed,
    /// Where the backup destination's `AWS_*` settings come from; `None`: the process environment.
    backup_env: Option<Vec<(String, String)>>,
    /// The TLS files the config names, once read ([`App::reloader`]); [`App::run`] reads them if nobody did.
    tls: Option<tls::Tls>,
}

impl App {
    /// Reads the state file, if any: a cleanup delay learned before a restart still protects restores that began
    /// before it.
    pub fn new(config: Config) -> Self {
        let instruments = metrics::Instruments::default();
        let start = restore_state(config.cleanup.state_file.as_deref());
        let saved = start.saved.unwrap_or_default();
        let registry = Registry::with_durations(
            config.cleanup.initial_delay.max(saved.cleanup_delay),
            instruments.reservation_seconds.clone(),
        );
        let status = monitor::StatusHandle::default();
        status.update(|s| {
            s.memory = start.memory;
            s.state_problem = start.problem;
        });
        if !saved.reservations.is_empty() {
            for kept in &saved.reservations {
                info!(
                    task_id = %kept.task_id,
                    floor = kept.floor.as_deref().unwrap_or(""),
                    opened_at = %humantime::format_rfc3339_seconds(kept.opened_at),
                    "reservation kept from before the restart: honoured until its task subscribes or \
                     cleanup.restore_limit passes"
                );
            }
            registry.keep(
                saved.reservations.clone(),
                tokio::time::Instant::now(),
                std::time::SystemTime::now(),
            );
        }
        let subscribers = Subscribers::default();
        if !saved.subscribers.is_empty() {
            info!(
                subscribers = saved.subscribers.len(),
                "subscribers of the previous run kept: each is waited for as if it had just left"
            );
            subscribers.keep(saved.subscribers.clone(), tokio::time::Instant::now());
        }
        let resumed = monitor::Resumed {
            last_purge: saved.last_purge.clone(),
            highest_backup: saved.highest_backup.clone(),
            replica_version: saved.replica_version.clone(),
            // A first start, a lost file, an old one, or none kept: which restores were in flight is unknown from
            // now, or still from an earlier start whose hold a restart interrupted.
            restores_unknown_since: if start.restores_unknown {
                Some(std::time::SystemTime::now())
            } else {
                saved.restores_unknown_since
            },
        };
        // A status waits for a listing that finds something to restore.
        if config.backup.verify {
            registry.set_restorable(false);
        }
        Self {
            backup_env: None,
            tls: None,
            resumed,
            instruments,
            config,
            registry,
            subscribers,
            status,
            discovery: discovery::StateHandle::default(),
            started: tokio::time::Instant::now(),
        }
    }

    /// When the sidecar counts itself as started. Cleanup waits a full cleanup delay after it, so that restores
    /// that began before a restart are covered; tests move it back instead of waiting.
    pub fn started_at(mut self, started: tokio::time::Instant) -> Self {
        self.started = started;
        self
    }

    /// Takes the destination's `AWS_*` settings (credentials, region, endpoint) from `env` instead of the process
    /// environment: tests run side by side in one process.
    pub fn backup_env(mut self, env: Vec<(String, String)>) -> Self {
        self.backup_env = Some(env);
        self
    }

    pub fn status(&self) -> &monitor::StatusHandle {
        &self.status
    }

    pub fn discovery(&self) -> &discovery::StateHandle {
        &self.discovery
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The relayed subscribers and their acknowledged watermarks.
    pub fn subscribers(&self) -> &Subscribers {
        &self.subscribers
    }

    /// Reads the TLS files the config names, now rather than in [`App::run`], so that a process can refuse to
    /// start on them; the handle re-reads them (SIGHUP) while the app runs.
    pub fn reloader(&mut self) -> Result<Reloader, tls::Error> {
        let tls = match &self.tls {
            Some(tls) => tls.clone(),
            None => tls::Tls::load(&self.config)?,
        };
        self.tls = Some(tls.clone());
        Ok(Reloader {
            tls,
            instruments: self.instruments.clone(),
        })
    }

    /// Binds the metrics proxy's listeners (every address `litestream.proxy_listen` resolves to).
    pub async fn bind_proxy(&self) -> std::io::Result<Vec<TcpListener>> {
        proxy::bind(&self.config.litestream.proxy_listen).await
    }

    /// Serves on `listener` (and the proxy on `proxy_listeners`) until `shutdown` is cancelled, then closes every
    /// WebSocket (1001) and waits up to `server.shutdown_grace` for connections to finish. Every long-lived task
    /// runs in its own span on one [`TaskTracker`], which the drain waits for.
    pub async fn run(
        self,
        listener: TcpListener,
        proxy_listeners: Vec<TcpListener>,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let tls = match self.tls.clone() {
            Some(tls) => tls,
            None => tls::Tls::load(&self.config).map_err(Error::Tls)?,
        };
        let tracker = TaskTracker::new();
        let litestream = &self.config.litestream;
        let scraper = litestream::Scraper::new(
            litestream.metrics_url.clone(),
            litestream.scrape_timeout,
            litestream.max_page_bytes,
        )
        .map_err(Error::MetricsUrl)?;
        let proxy = Arc::new(proxy::Proxy {
            scraper,
            mode: litestream.proxy_mode,
            filter: litestream.filter.clone(),
            status: self.status.clone(),
        });
        // The proxy only ever serves the local replication-manager: a small cap of its own, so that nothing on
        // it can take places from view-syncers.
        let proxy_limits = server::Limits::from_config(
            &self.config.server,
            admission::Admission::new(
                PROXY_MAX_CONNECTIONS,
                self.instruments.connections_refused.clone(),
            ),
        );
        for listener in proxy_listeners {
            let addr = listener.local_addr().map_err(Error::Listener)?;
            info!(%addr, "metrics proxy listening");
            tracker.spawn(
                server::serve_http(
                    listener,
                    None,
                    proxy.clone(),
                    proxy_limits.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                )
                .instrument(info_span!("proxy", %addr)),
            );
        }
        let admission = admission::Admission::new(
            self.config.server.max_connections,
            self.instruments.connections_refused.clone(),
        );

        // The change DB connection outlives the other tasks: it is closed after the drain below.
        let db_shutdown = CancellationToken::new();
        let change_db = change_db::ChangeDb::start(
            self.config.change_db.pg.clone(),
            &self.config.zero,
            change_db::Options::default(),
            db_shutdown.clone(),
        );
        let monitor = monitor::Monitor::new(
            &self.config,
            self.registry.clone(),
            self.subscribers.clone(),
            change_db.clone(),
            self.status.clone(),
            self.started,
            self.discovery.clone(),
        )
        .resuming(self.resumed.clone());
        let monitor = match self.backup_env.clone() {
            Some(env) => monitor.with_backup_env(&self.config, env),
            None => monitor,
        };
        tracker.spawn(
            monitor
                .run(shutdown.clone())
                .instrument(info_span!("monitor")),
        );
        // An unusable file is left as it is for the operator: writing over it would erase what it may still say.
        if let (Some(path), false) = (
            self.config.cleanup.state_file.clone(),
            self.status.get().memory == cleanup::Memory::Unreadable,
        ) {
            let keeper = keeper::Keeper {
                path,
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                reconnect_grace: self.config.cleanup.reconnect_grace,
                status: self.status.clone(),
            };
            tracker.spawn(keeper.run(shutdown.clone()).instrument(info_span!("state")));
        }
        let discovery = discovery::Discovery {
            mode: self.config.discovery.mode,
            ours: self.config.discovery.advertise_address.clone(),
            upstream: self.config.upstream.advertised_address.clone(),
            interval: self.config.discovery.interval,
            db: change_db.clone(),
            state: self.discovery.clone(),
            started: self.started,
        };
        tracker.spawn(
            discovery
                .run(shutdown.clone())
                .instrument(info_span!("discovery")),
        );
        let context = Arc::new(Context {
            metrics: metrics::Sources {
                instruments: self.instruments.clone(),
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                status: self.status.clone(),
                discovery_mode: self.config.discovery.mode,
                discovery: self.discovery.clone(),
                admission: admission.clone(),
            },
            status: status::Sources {
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                status: self.status.clone(),
                upstream: self.instruments.upstream.clone(),
                upstream_address: self.config.upstream.address.clone(),
                cleanup_enabled: self.config.cleanup.enabled,
                reconnect_grace: self.config.cleanup.reconnect_grace,
                started: self.started,
            },
            snapshot: SnapshotContext {
                registry: self.registry.clone(),
                change_db: Some(change_db.clone()),
                backup_url: self.config.litestream.backup_url.as_str().into(),
                ping_interval: self.config.server.ping_interval,
                peer_timeout: self.config.server.peer_timeout,
                shutdown: shutdown.clone(),
            },
            readiness: Readiness::new(self.config.discovery.mode, self.discovery.clone())
                .with_status(self.status.clone()),
            relay: RelayContext {
                settings: Arc::new(relay::Settings {
                    upstream: self.config.upstream.clone(),
                    upstream_tls: tls.upstream.clone(),
                    relay: self.config.relay.clone(),
                    ping_interval: self.config.server.ping_interval,
                    peer_timeout: self.config.server.peer_timeout,
                    max_message_bytes: self.config.server.max_message_bytes,
                }),
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                instruments: self.instruments.clone(),
                shutdown: shutdown.clone(),
            },
            allow: self.config.server.allow.clone(),
            admission: admission.clone(),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        });
        let addr = listener.local_addr().map_err(Error::Listener)?;
        info!(%addr, tls = tls.server.is_some(), "listening");
        context.readiness.set_listening(true);
        notify::ready("listening");
        {
            let context = context.clone();
            let status = self.status.clone();
            tracker.spawn(
                notify::run(shutdown.clone(), move || {
                    status_line(&context.readiness.missing(), &status.get())
                })
                .instrument(info_span!("notify")),
            );
        }
        server::serve_http(
            listener,
            tls.server.as_ref().map(|server| server.acceptor()),
            context.clone(),
            server::Limits::from_config(&self.config.server, admission),
            shutdown.clone(),
            tracker.clone(),
        )
        .instrument(info_span!("server", %addr))
        .await;
        context.readiness.set_listening(false);
        notify::stopping();

        tracker.close();
        let grace = self.config.server.shutdown_grace;
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            warn!(
                still_running = tracker.len(),
                grace = ?grace,
                "connections still open after the shutdown grace period; exiting anyway"
            );
        }
        db_shutdown.cancel();
        info!("stopped");
        Ok(())
    }
}

/// Re-reads the TLS files of a running [`App`] (SIGHUP), counting each outcome in its metrics.
#[derive(Clone)]
pub struct Reloader {
    tls: tls::Tls,
    instruments: metrics::Instruments,
}

impl Reloader {
    pub fn reload(&self) {
        self.tls.reload(&self.instruments);
    }
}
