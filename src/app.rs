//! The running sidecar: its components built from the config, and the tasks that serve and clean up until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn, Instrument};

use crate::cleanup::change_db::{self, ChangeDb};
use crate::cleanup::config::Requires;
use crate::cleanup::discovery::{self, Discovery};
use crate::cleanup::drills::Drills;
use crate::cleanup::handles::{Handles, Hooks};
use crate::cleanup::keeper::Keeper;
use crate::cleanup::monitor::{Monitor, MonitorConfig};
use crate::cleanup::reservations::Registry;
use crate::cleanup::status::{Status, StatusHandle};
use crate::cleanup::subscribers::Subscribers;
use crate::cleanup::{Decision, Memory};
use crate::config::Config;
use crate::litestream::config::ProxyMode;
use crate::net::admission::Admission;
use crate::net::client::HttpClient;
use crate::net::tls::{Tls, TlsError};
use crate::ops::metrics::Instruments;
use crate::protocol::versions::Source;
use crate::server::{Context, Limits, Readiness};
use crate::streamer::protocols::UpstreamProtocols;
use crate::streamer::relay::{self, RelayContext};
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
    Tls(TlsError),
    /// The upstream answered the start's probe with a range behind which `litestream.proxy_mode` cannot work
    /// ([`crate::ops::hidden_gauge`]): refused before serving, since the deployment would go down at its next
    /// initial sync.
    #[error("refusing to start: {0}")]
    NeverReady(String),
}

/// The one-line state systemd shows (`systemctl status`): what readiness waits for, else what cleanup does.
fn status_line(missing: &[&str], status: &Status) -> String {
    if !missing.is_empty() {
        return format!("waiting: {}", missing.join("; "));
    }
    if let Some(problem) = status.cleanup_problem() {
        return format!("ready; {problem}");
    }
    match status.last_decision.as_ref() {
        None => "ready; first cleanup check pending".to_string(),
        Some(Decision::Hold(reason)) => format!("ready; cleanup held: {reason}"),
        Some(Decision::Purge { before, bound }) => {
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
    handles: Handles,
    hooks: Hooks,
    instruments: Instruments,
    /// What the upstream serves (`upstream.protocols`, or learned).
    protocols: UpstreamProtocols,
    started: tokio::time::Instant,
    /// Who this sidecar is in the slot table.
    holder: String,
    /// The TLS files the config names, once read ([`App::reloader`]); [`App::run`] reads them if nobody did.
    tls: Option<Tls>,
}

/// What every long-lived component of a running sidecar is handed, built once in [`App::run`]: the shared handles,
/// the instruments, what the upstream serves, and the shutdown every task watches and the tracker the drain waits
/// for. Each component takes what it needs from it, with its own config section whole.
struct Runtime {
    handles: Handles,
    instruments: Instruments,
    protocols: UpstreamProtocols,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl App {
    /// The components; what the shard remembers (slots, the learned cleanup delay, the last purge) is read from
    /// the change DB once [`App::run`] has connected.
    pub fn new(config: Config) -> Self {
        let instruments = Instruments::default();
        let registry = Registry::with_durations(
            config.cleanup.initial_delay,
            instruments.reservation_seconds.clone(),
        );
        let status = StatusHandle::default();
        // Until the keeper has read the shard's memory, nothing is known of the restores in flight.
        status.update(|s| s.memory = Memory::Loading);
        // A status waits for a listing that finds something to restore.
        if config.backup.verify {
            registry.set_restorable(false);
        }
        Self {
            handles: Handles {
                registry,
                subscribers: Subscribers::default(),
                status,
                discovery: discovery::StateHandle::default(),
            },
            hooks: Hooks::default(),
            protocols: UpstreamProtocols::new(&config.upstream.protocols),
            instruments,
            started: tokio::time::Instant::now(),
            holder: holder(),
            tls: None,
            config,
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
        self.hooks.log_unwritten_after = after;
        self
    }

    /// Lets snapshot statuses go out without their reservation's row in the change DB, and v3's without reading the
    /// change log: only for tests of the protocol that run without a database. A restore would otherwise depend on a
    /// reservation that only this process knows, which is what slots exist to prevent, and on a log nobody checked
    /// it can catch up from.
    pub fn statuses_without_slots(mut self) -> Self {
        self.hooks.statuses_without_slots = true;
        self
    }

    /// Takes the destination's `AWS_*` settings (credentials, region, endpoint) from `env` instead of the process
    /// environment: tests run side by side in one process.
    pub fn backup_env(mut self, env: Vec<(String, String)>) -> Self {
        self.hooks.backup_env = Some(env);
        self
    }

    pub fn status(&self) -> &StatusHandle {
        &self.handles.status
    }

    pub fn discovery(&self) -> &discovery::StateHandle {
        &self.handles.discovery
    }

    pub fn registry(&self) -> &Registry {
        &self.handles.registry
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
        &self.handles.subscribers
    }

    /// The protocol versions the upstream serves, as far as the sidecar knows.
    pub fn protocols(&self) -> &UpstreamProtocols {
        &self.protocols
    }

    /// Reads the TLS files the config names, now rather than in [`App::run`], so that a process can refuse to
    /// start on them; the handle re-reads them (SIGHUP) while the app runs.
    pub fn reloader(&mut self) -> Result<Reloader, TlsError> {
        let tls = match &self.tls {
            Some(tls) => tls.clone(),
            None => Tls::load(
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
            None => Tls::load(
                self.config.server.tls.as_ref(),
                self.config.upstream.tls.as_ref(),
            )
            .map_err(Error::Tls)?,
        };
        self.refuse_a_hidden_gauge(&tls).await?;
        let rt = Runtime {
            handles: self.handles.clone(),
            instruments: self.instruments.clone(),
            protocols: self.protocols.clone(),
            shutdown: shutdown.clone(),
            tracker: TaskTracker::new(),
        };
        // The change DB connection outlives the other tasks: it is closed after the drain below.
        let db_shutdown = CancellationToken::new();
        let change_db = ChangeDb::start(
            self.config.change_db.url.clone(),
            &self.config.zero,
            change_db::Options::default(),
            db_shutdown.clone(),
        );
        self.spawn_proxy(&rt, proxy_listeners, &change_db)?;
        self.spawn_cleanup(&rt, &change_db);

        let admission = Admission::new(
            self.config.server.max_connections,
            rt.instruments.connections_refused.clone(),
        );
        let context = Arc::new(self.router(&rt, &tls, change_db, admission.clone()));
        if !rt.protocols.is_fixed() {
            rt.tracker.spawn(
                relay::probe::run(
                    context.relay.settings.clone(),
                    rt.protocols.clone(),
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
            let status = rt.handles.status.clone();
            rt.tracker.spawn(
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
            Limits::from_config(&self.config.server, admission),
            shutdown.clone(),
            rt.tracker.clone(),
        )
        .instrument(info_span!("server", %addr))
        .await;
        context.readiness.set_listening(false);
        crate::ops::notify::stopping();

        let tracker = rt.tracker;
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
        rt: &Runtime,
        listeners: Vec<TcpListener>,
        change_db: &ChangeDb,
    ) -> Result<(), Error> {
        let litestream = &self.config.litestream;
        let scraper = HttpClient::new(
            litestream.metrics_url.clone(),
            litestream.scrape_timeout,
            litestream.max_page_bytes,
        )
        .map_err(Error::MetricsUrl)?;
        let proxy = Arc::new(crate::proxy::Proxy {
            scraper,
            mode: litestream.proxy_mode,
            filter: litestream.filter.clone(),
            status: rt.handles.status.clone(),
            change_db: Some(change_db.clone()),
            fallback: crate::litestream::filter::Fallback {
                name: replica_type(&litestream.backup_url),
            },
        });
        let limits = Limits::from_config(
            &self.config.server,
            Admission::new(
                PROXY_MAX_CONNECTIONS,
                rt.instruments.connections_refused.clone(),
            ),
        );
        for listener in listeners {
            let addr = listener.local_addr().map_err(Error::Listener)?;
            info!(%addr, "metrics proxy listening");
            rt.tracker.spawn(
                crate::server::serve_http(
                    listener,
                    None,
                    proxy.clone(),
                    limits.clone(),
                    rt.shutdown.clone(),
                    rt.tracker.clone(),
                )
                .instrument(info_span!("proxy", %addr)),
            );
        }
        rt.tracker.spawn(crate::ops::hidden_gauge::watch(
            litestream.proxy_mode,
            rt.protocols.watch(),
            rt.shutdown.clone(),
        ));
        Ok(())
    }

    /// The cleanup loop, the drills, the keeper of slots and the shard's memory, and discovery.
    fn spawn_cleanup(&self, rt: &Runtime, change_db: &ChangeDb) {
        let config = &self.config;
        let (resumed, resumed_from) = tokio::sync::watch::channel(None);
        let monitor = Monitor::new(
            MonitorConfig {
                cleanup: &config.cleanup,
                litestream: &config.litestream,
                backup: &config.backup,
                discovery: &config.discovery,
                upstream_address: &config.upstream.advertised_address,
            },
            &rt.handles,
            change_db.clone(),
            self.started,
            &self.hooks,
        )
        .resuming_from(resumed_from);
        rt.tracker.spawn(
            monitor
                .run(rt.shutdown.clone())
                .instrument(info_span!("monitor")),
        );
        let mut drill = config.backup.drill(&config.litestream.backup_url);
        if let Some(env) = self.hooks.backup_env.clone() {
            drill.env = env;
        }
        let drills = Drills::new(
            drill,
            config.backup.drill_interval,
            config.cleanup.requires == Requires::Restore,
            config.backup.location.is_some(),
            rt.handles.status.clone(),
        );
        rt.tracker.spawn(
            drills
                .run(rt.shutdown.clone())
                .instrument(info_span!("drills")),
        );
        let keeper = Keeper {
            db: change_db.clone(),
            holder: self.holder.clone(),
            handles: rt.handles.clone(),
            cleanup: config.cleanup.clone(),
            resumed,
        };
        // Statuses wait for the keeper's writes from the first one on (the server is not listening yet).
        if !self.hooks.statuses_without_slots {
            rt.handles.registry.kept_on_disk();
        }
        rt.tracker.spawn(
            keeper
                .run(rt.shutdown.clone())
                .instrument(info_span!("slots")),
        );
        let discovery = Discovery {
            config: config.discovery.clone(),
            upstream: config.upstream.advertised_address.clone(),
            db: change_db.clone(),
            state: rt.handles.discovery.clone(),
            started: self.started,
        };
        rt.tracker.spawn(
            discovery
                .run(rt.shutdown.clone())
                .instrument(info_span!("discovery")),
        );
    }

    fn relay_settings(&self, tls: &Tls) -> Arc<relay::Settings> {
        let config = &self.config;
        Arc::new(relay::Settings {
            upstream: config.upstream.clone(),
            upstream_tls: tls.upstream.clone(),
            relay: config.relay.clone(),
            ping_interval: config.server.ping_interval,
            peer_timeout: config.server.peer_timeout,
            max_message_bytes: config.server.max_message_bytes,
        })
    }

    /// With `proxy_mode = "hide"` and the upstream's versions to be learned, asks the upstream once before serving:
    /// a range it cannot work with is refused here, where the operator sees it, rather than found at the next
    /// initial sync. An upstream that cannot be asked yet (it often starts after the sidecar) delays nothing more;
    /// what the probe learns later is said in the log and `/status` instead. (A configured range is checked with
    /// the config.)
    async fn refuse_a_hidden_gauge(&self, tls: &Tls) -> Result<(), Error> {
        let mode = self.config.litestream.proxy_mode;
        if mode != ProxyMode::Hide || self.protocols.is_fixed() {
            return Ok(());
        }
        match relay::probe::once(&self.relay_settings(tls)).await {
            Ok(versions) => {
                self.protocols.learned(versions.clone(), Source::Probe);
                match crate::ops::hidden_gauge::never_ready(mode, &versions) {
                    Some(why) => Err(Error::NeverReady(why)),
                    None => Ok(()),
                }
            }
            Err(error) => {
                info!(%error, "could not ask the upstream which protocol versions it serves before serving; asked again in the background");
                Ok(())
            }
        }
    }

    /// What the main listener's routes serve from: the runtime, and `[server]`, `[upstream]`, `[relay]`.
    fn router(
        &self,
        rt: &Runtime,
        tls: &Tls,
        change_db: ChangeDb,
        admission: Admission,
    ) -> Context {
        let config = &self.config;
        Context {
            metrics: crate::ops::metrics_page::MetricsSources {
                instruments: rt.instruments.clone(),
                handles: rt.handles.clone(),
                discovery_mode: config.discovery.mode,
                admission: admission.clone(),
            },
            status: crate::ops::status::Sources {
                handles: rt.handles.clone(),
                upstream: rt.instruments.upstream.clone(),
                upstream_address: config.upstream.address.clone(),
                protocols: rt.protocols.watch(),
                protocols_fixed: rt.protocols.is_fixed(),
                proxy_mode: config.litestream.proxy_mode,
                cleanup: config.cleanup.clone(),
                started: self.started,
            },
            snapshot: SnapshotContext {
                handles: rt.handles.clone(),
                change_db: Some(change_db),
                v3_without_log: self.hooks.statuses_without_slots,
                backup_url: config.litestream.backup_url.as_str().into(),
                protocols: rt.protocols.clone(),
                protocols_wait: config.upstream.connect_timeout,
                ping_interval: config.server.ping_interval,
                peer_timeout: config.server.peer_timeout,
                shutdown: rt.shutdown.clone(),
            },
            readiness: Readiness::new(config.discovery.mode, rt.handles.discovery.clone()),
            relay: RelayContext {
                settings: self.relay_settings(tls),
                handles: rt.handles.clone(),
                instruments: rt.instruments.clone(),
                protocols: rt.protocols.clone(),
                shutdown: rt.shutdown.clone(),
            },
            allow: config.server.allow.clone(),
            admission,
            shutdown: rt.shutdown.clone(),
            tracker: rt.tracker.clone(),
        }
    }
}

/// Re-reads the TLS files of a running [`App`] (SIGHUP), counting each outcome in its metrics.
#[derive(Clone)]
pub struct Reloader {
    tls: Tls,
    instruments: Instruments,
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
