//! The running sidecar: its components built from the config, and the tasks that serve and clean up until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn, Instrument};

use crate::cleanup::reservations::Registry;
use crate::cleanup::subscribers::Subscribers;
use crate::config::Config;
use crate::server::{Context, Readiness};
use crate::streamer::relay::RelayContext;
use crate::streamer::snapshot::SnapshotContext;

/// Connections the metrics proxy holds at once: Zero's BackupMonitor fetches one page at a time.
const PROXY_MAX_CONNECTIONS: usize = 64;

/// Why [`App::run`] stopped with an error rather than after a drain; `main` exits 1 on any of them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `litestream.metrics_url` cannot be scraped (not an `http://` URL with a host): neither the monitor nor the
    /// metrics proxy could work.
    #[error("litestream.metrics_url: {0}")]
    MetricsUrl(#[source] crate::net::client::HttpError),
    /// A listener handed to [`App::run`] cannot say its address.
    #[error("listener: {0}")]
    Listener(#[source] std::io::Error),
    /// A certificate, key or CA file the config names cannot be used.
    #[error(transparent)]
    Tls(crate::net::tls::TlsError),
}

/// The one-line state systemd shows (`systemctl status`): what readiness waits for, else what cleanup does.
fn status_line(missing: &[&str], status: &crate::cleanup::status::Status) -> String {
    if !missing.is_empty() {
        return format!("waiting: {}", missing.join("; "));
    }
    if let Some(problem) = status.cleanup_problem() {
        return format!("ready; {problem}");
    }
    match status.last_decision.as_ref() {
        None => "ready; first cleanup check pending".to_string(),
        Some(crate::cleanup::Decision::Hold(reason)) => format!("ready; cleanup held: {reason}"),
        Some(crate::cleanup::Decision::Purge { before, bound }) => {
            format!("ready; last cleanup decision: purge below {before} (bound by {bound})")
        }
    }
}

/// Who this process is in the slot table: the host's name, the process and when it started.
fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    crate::cleanup::slots::holder_name(&host, std::process::id(), started)
}

/// The sidecar's components, built from a validated config. Tests keep clones of the handles (such as
/// [`App::registry`]) before calling [`App::run`].
pub struct App {
    config: Config,
    registry: Registry,
    subscribers: Subscribers,
    status: crate::cleanup::status::StatusHandle,
    discovery: crate::cleanup::discovery::StateHandle,
    instruments: crate::ops::metrics::Instruments,
    started: tokio::time::Instant,
    /// Who this sidecar is in the slot table.
    holder: String,
    /// Statuses wait for their reservation's row (see [`App::statuses_without_slots`]).
    slots_required: bool,
    /// Where the backup destination's `AWS_*` settings come from; `None`: the process environment.
    backup_env: Option<Vec<(String, String)>>,
    /// The TLS files the config names, once read ([`App::reloader`]); [`App::run`] reads them if nobody did.
    tls: Option<crate::net::tls::Tls>,
    /// What the upstream serves (`upstream.protocols`, or learned).
    protocols: crate::streamer::protocols::UpstreamProtocols,
    /// See [`App::log_unwritten_after`]; `None`: [`crate::cleanup::unservable::LOG_UNWRITTEN_AFTER`].
    log_unwritten_after: Option<std::time::Duration>,
}

impl App {
    /// The components; what the shard remembers (slots, the learned cleanup delay, the last purge) is read from
    /// the change DB once [`App::run`] has connected.
    pub fn new(config: Config) -> Self {
        let instruments = crate::ops::metrics::Instruments::default();
        let registry = Registry::with_durations(
            config.cleanup.initial_delay,
            instruments.reservation_seconds.clone(),
        );
        let status = crate::cleanup::status::StatusHandle::default();
        // Until the keeper has read the shard's memory, nothing is known of the restores in flight.
        status.update(|s| {
            s.memory = crate::cleanup::Memory::Loading;
        });
        let subscribers = Subscribers::default();
        // A status waits for a listing that finds something to restore.
        if config.backup.verify {
            registry.set_restorable(false);
        }
        Self {
            backup_env: None,
            tls: None,
            protocols: crate::streamer::protocols::UpstreamProtocols::new(
                &config.upstream.protocols,
            ),
            log_unwritten_after: None,
            holder: holder(),
            slots_required: true,
            instruments,
            config,
            registry,
            subscribers,
            status,
            discovery: crate::cleanup::discovery::StateHandle::default(),
            started: tokio::time::Instant::now(),
        }
    }

    /// When the sidecar counts itself as started. Cleanup waits a full cleanup delay after it, so that restores
    /// that began before a restart are covered; tests move it back instead of waiting.
    pub fn started_at(mut self, started: tokio::time::Instant) -> Self {
        self.started = started;
        self
    }

    /// How long a relayed commit may stay out of the change log before the sidecar refuses the deployment as one
    /// whose log Zero does not write; tests shorten it instead of waiting.
    pub fn log_unwritten_after(mut self, after: std::time::Duration) -> Self {
        self.log_unwritten_after = Some(after);
        self
    }

    /// Lets snapshot statuses go out without their reservation's row in the change DB, and v3's without reading the
    /// change log: only for tests of the protocol that run without a database. A restore would otherwise depend on a
    /// reservation that only this process knows, which is what slots exist to prevent, and on a log nobody checked
    /// it can catch up from.
    pub fn statuses_without_slots(mut self) -> Self {
        self.slots_required = false;
        self
    }

    /// Takes the destination's `AWS_*` settings (credentials, region, endpoint) from `env` instead of the process
    /// environment: tests run side by side in one process.
    pub fn backup_env(mut self, env: Vec<(String, String)>) -> Self {
        self.backup_env = Some(env);
        self
    }

    pub fn status(&self) -> &crate::cleanup::status::StatusHandle {
        &self.status
    }

    pub fn discovery(&self) -> &crate::cleanup::discovery::StateHandle {
        &self.discovery
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Who this sidecar is in the slot table.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The relayed subscribers and their acknowledged watermarks.
    pub fn subscribers(&self) -> &Subscribers {
        &self.subscribers
    }

    /// The protocol versions the upstream serves, as far as the sidecar knows.
    pub fn protocols(&self) -> &crate::streamer::protocols::UpstreamProtocols {
        &self.protocols
    }

    /// Reads the TLS files the config names, now rather than in [`App::run`], so that a process can refuse to
    /// start on them; the handle re-reads them (SIGHUP) while the app runs.
    pub fn reloader(&mut self) -> Result<Reloader, crate::net::tls::TlsError> {
        let tls = match &self.tls {
            Some(tls) => tls.clone(),
            None => crate::net::tls::Tls::load(
                self.config.server.tls.as_ref(),
                self.config.upstream.tls.as_ref(),
            )?,
        };
        self.tls = Some(tls.clone());
        Ok(Reloader {
            tls,
            instruments: self.instruments.clone(),
        })
    }

    /// Binds the metrics proxy's listeners (every address `litestream.proxy_listen` resolves to).
    pub async fn bind_proxy(&self) -> std::io::Result<Vec<TcpListener>> {
        crate::proxy::bind(&self.config.litestream.proxy_listen).await
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
            None => crate::net::tls::Tls::load(
                self.config.server.tls.as_ref(),
                self.config.upstream.tls.as_ref(),
            )
            .map_err(Error::Tls)?,
        };
        let tracker = TaskTracker::new();
        // The change DB connection outlives the other tasks: it is closed after the drain below.
        let db_shutdown = CancellationToken::new();
        let change_db = crate::cleanup::change_db::ChangeDb::start(
            self.config.change_db.url.clone(),
            &self.config.zero,
            crate::cleanup::change_db::Options::default(),
            db_shutdown.clone(),
        );
        self.spawn_proxy(proxy_listeners, &change_db, &shutdown, &tracker)?;
        self.spawn_cleanup(&change_db, &shutdown, &tracker);

        let admission = crate::net::admission::Admission::new(
            self.config.server.max_connections,
            self.instruments.connections_refused.clone(),
        );
        let context =
            Arc::new(self.router(&tls, change_db, admission.clone(), &shutdown, &tracker));
        if !self.protocols.is_fixed() {
            tracker.spawn(
                crate::streamer::relay::probe::run(
                    context.relay.settings.clone(),
                    self.protocols.clone(),
                    shutdown.clone(),
                )
                .instrument(info_span!("probe", upstream = %self.config.upstream.address)),
            );
        }
        let addr = listener.local_addr().map_err(Error::Listener)?;
        info!(%addr, tls = tls.server.is_some(), "listening");
        context.readiness.set_listening(true);
        crate::ops::notify::ready("listening");
        {
            let context = context.clone();
            let status = self.status.clone();
            tracker.spawn(
                crate::ops::notify::run(shutdown.clone(), move || {
                    let missing = context.readiness.missing();
                    status.read(|s| status_line(&missing, s))
                })
                .instrument(info_span!("notify")),
            );
        }
        crate::server::serve_http(
            listener,
            tls.server.as_ref().map(|server| server.acceptor()),
            context.clone(),
            crate::server::Limits::from_config(&self.config.server, admission),
            shutdown.clone(),
            tracker.clone(),
        )
        .instrument(info_span!("server", %addr))
        .await;
        context.readiness.set_listening(false);
        crate::ops::notify::stopping();

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

    /// The metrics proxy for Zero on each of `listeners`: `[litestream]`, and a small cap of its own so that
    /// nothing on it can take places from view-syncers (it only ever serves the local replication-manager).
    fn spawn_proxy(
        &self,
        listeners: Vec<TcpListener>,
        change_db: &crate::cleanup::change_db::ChangeDb,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<(), Error> {
        let litestream = &self.config.litestream;
        let scraper = crate::net::client::HttpClient::new(
            litestream.metrics_url.clone(),
            litestream.scrape_timeout,
            litestream.max_page_bytes,
        )
        .map_err(Error::MetricsUrl)?;
        let proxy = Arc::new(crate::proxy::Proxy {
            scraper,
            mode: litestream.proxy_mode,
            filter: litestream.filter.clone(),
            status: self.status.clone(),
            change_db: Some(change_db.clone()),
            fallback: crate::litestream::filter::Fallback {
                name: replica_type(&litestream.backup_url),
            },
        });
        let limits = crate::server::Limits::from_config(
            &self.config.server,
            crate::net::admission::Admission::new(
                PROXY_MAX_CONNECTIONS,
                self.instruments.connections_refused.clone(),
            ),
        );
        for listener in listeners {
            let addr = listener.local_addr().map_err(Error::Listener)?;
            info!(%addr, "metrics proxy listening");
            tracker.spawn(
                crate::server::serve_http(
                    listener,
                    None,
                    proxy.clone(),
                    limits.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                )
                .instrument(info_span!("proxy", %addr)),
            );
        }
        Ok(())
    }

    /// The cleanup loop, the state file's keeper and discovery: `[cleanup]`, `[discovery]`, `[litestream]`,
    /// `[backup]`, and the upstream's advertised address.
    fn spawn_cleanup(
        &self,
        change_db: &crate::cleanup::change_db::ChangeDb,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
    ) {
        let config = &self.config;
        let (resumed, resumed_from) = tokio::sync::watch::channel(None);
        let monitor = crate::cleanup::monitor::Monitor::new(
            crate::cleanup::monitor::MonitorConfig {
                cleanup: &config.cleanup,
                litestream: &config.litestream,
                backup: &config.backup,
                discovery: &config.discovery,
                upstream_address: &config.upstream.advertised_address,
            },
            self.registry.clone(),
            self.subscribers.clone(),
            change_db.clone(),
            self.status.clone(),
            self.started,
            self.discovery.clone(),
        )
        .resuming_from(resumed_from);
        let monitor = match self.backup_env.clone() {
            Some(env) => monitor.with_backup_env(env),
            None => monitor,
        };
        let monitor = match self.log_unwritten_after {
            Some(after) => monitor.with_log_unwritten_after(after),
            None => monitor,
        };
        tracker.spawn(
            monitor
                .run(shutdown.clone())
                .instrument(info_span!("monitor")),
        );
        let mut drill = config.backup.drill(&config.litestream.backup_url);
        if let Some(env) = self.backup_env.clone() {
            drill.env = env;
        }
        let drills = crate::cleanup::drills::Drills::new(
            drill,
            config.backup.drill_interval,
            config.cleanup.requires == crate::cleanup::config::Requires::Restore,
            config.backup.location.is_some(),
            self.status.clone(),
        );
        tracker.spawn(
            drills
                .run(shutdown.clone())
                .instrument(info_span!("drills")),
        );
        let keeper = crate::cleanup::keeper::Keeper {
            db: change_db.clone(),
            holder: self.holder.clone(),
            registry: self.registry.clone(),
            subscribers: self.subscribers.clone(),
            reconnect_grace: config.cleanup.reconnect_grace,
            restore_limit: config.cleanup.restore_limit,
            status: self.status.clone(),
            import_from: config.cleanup.state_file.clone(),
            resumed,
        };
        // Statuses wait for the keeper's writes from the first one on (the server is not listening yet).
        if self.slots_required {
            self.registry.kept_on_disk();
        }
        tracker.spawn(keeper.run(shutdown.clone()).instrument(info_span!("slots")));
        let discovery = crate::cleanup::discovery::Discovery {
            mode: config.discovery.mode,
            ours: config.discovery.advertise_address.clone(),
            upstream: config.upstream.advertised_address.clone(),
            interval: config.discovery.interval,
            db: change_db.clone(),
            state: self.discovery.clone(),
            started: self.started,
        };
        tracker.spawn(
            discovery
                .run(shutdown.clone())
                .instrument(info_span!("discovery")),
        );
    }

    /// What the main listener's routes serve from: `[server]`, `[upstream]`, `[relay]` and the shared handles.
    fn router(
        &self,
        tls: &crate::net::tls::Tls,
        change_db: crate::cleanup::change_db::ChangeDb,
        admission: crate::net::admission::Admission,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Context {
        let config = &self.config;
        Context {
            metrics: crate::ops::metrics_page::MetricsSources {
                instruments: self.instruments.clone(),
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                status: self.status.clone(),
                discovery_mode: config.discovery.mode,
                discovery: self.discovery.clone(),
                admission: admission.clone(),
            },
            status: crate::ops::status::Sources {
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                status: self.status.clone(),
                upstream: self.instruments.upstream.clone(),
                upstream_address: config.upstream.address.clone(),
                protocols: self.protocols.watch(),
                protocols_fixed: self.protocols.is_fixed(),
                cleanup_enabled: config.cleanup.enabled,
                reconnect_grace: config.cleanup.reconnect_grace,
                started: self.started,
            },
            snapshot: SnapshotContext {
                registry: self.registry.clone(),
                change_db: Some(change_db),
                v3_without_log: !self.slots_required,
                backup_url: config.litestream.backup_url.as_str().into(),
                status: self.status.clone(),
                protocols: self.protocols.clone(),
                protocols_wait: config.upstream.connect_timeout,
                ping_interval: config.server.ping_interval,
                peer_timeout: config.server.peer_timeout,
                shutdown: shutdown.clone(),
            },
            readiness: Readiness::new(config.discovery.mode, self.discovery.clone()),
            relay: RelayContext {
                settings: Arc::new(crate::streamer::relay::Settings {
                    upstream: config.upstream.clone(),
                    upstream_tls: tls.upstream.clone(),
                    relay: config.relay.clone(),
                    ping_interval: config.server.ping_interval,
                    peer_timeout: config.server.peer_timeout,
                    max_message_bytes: config.server.max_message_bytes,
                }),
                registry: self.registry.clone(),
                subscribers: self.subscribers.clone(),
                instruments: self.instruments.clone(),
                protocols: self.protocols.clone(),
                shutdown: shutdown.clone(),
            },
            allow: config.server.allow.clone(),
            admission,
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        }
    }
}

/// Re-reads the TLS files of a running [`App`] (SIGHUP), counting each outcome in its metrics.
#[derive(Clone)]
pub struct Reloader {
    tls: crate::net::tls::Tls,
    instruments: crate::ops::metrics::Instruments,
}

impl Reloader {
    pub fn reload(&self) {
        self.tls
            .reload(|reloaded| self.instruments.tls_reloaded(reloaded));
    }
}

/// The replica's type as litestream names a replica by default: the backup URL's scheme (`file`, `s3`, ...).
fn replica_type(backup_url: &str) -> String {
    backup_url
        .split_once("://")
        .map_or("file", |(scheme, _)| scheme)
        .to_string()
}
