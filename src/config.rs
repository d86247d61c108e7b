//! Configuration: the `sidecar.toml` file, `LITESTREAM_SIDECAR__SECTION__KEY` environment overrides, and the one
//! place where strings become typed values.
//!
//! Loading and validation are separate so that `--check-config` can report every problem at once and tests can
//! build a config from a string. Nothing here touches the network.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::net::address::{host_port, parse_host_port, validate_host_port, validate_owner_address};

/// Prefix of the environment variables that override file keys: `LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL`
/// overrides `[litestream] backup_url`.
pub const ENV_PREFIX: &str = "LITESTREAM_SIDECAR";
/// Separator between prefix, section and key in environment variable names.
pub const ENV_SEPARATOR: &str = "__";
/// Files tried in order when no `--config` is given.
pub const DEFAULT_PATHS: [&str; 2] = ["./sidecar.toml", "/etc/litestream-sidecar/sidecar.toml"];

/// Zero's client drops a socket that has seen neither a ping nor a message within 33 s of opening it
/// (PROTOCOL.md §4.4), so a longer ping interval would lose every idle reservation.
const MAX_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Zero's server drops a client only after a whole 30 s ping interval without a pong or message, about 60 s after
/// its last sign of life at worst (PROTOCOL.md §4.4): the sidecar's default is no stricter.
const DEFAULT_PEER_TIMEOUT: &str = "60s";
/// Zero's `ws` peers accept 100 MiB messages; a smaller limit would break large transactions.
const MIN_MESSAGE_BYTES: u64 = 100 << 20;
/// Below this a relay buffer could not gather even a few small frames per write.
const MIN_BUFFERED_BYTES: u64 = 4096;
/// Far above what one replication-manager's view-syncers open (one reservation and one subscription each), and
/// under the file-descriptor limit the sidecar raises itself to where the system allows.
const DEFAULT_MAX_CONNECTIONS: u64 = 16_384;
/// Zero's requests carry a path, a query of a few short parameters and a dozen headers: well under 4 KiB.
const DEFAULT_MAX_HEADER_BYTES: u64 = 16 << 10;
/// hyper's smallest read buffer: it refuses a smaller limit.
const MIN_HEADER_BYTES: u64 = 8 << 10;

/// The file format as written by operators: strings where units matter, every field defaulted.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub server: RawServer,
    pub litestream: RawLitestream,
    pub backup: RawBackup,
    pub zero: RawZero,
    pub change_db: RawChangeDb,
    pub cleanup: RawCleanup,
    pub discovery: RawDiscovery,
    pub upstream: RawUpstream,
    pub relay: RawRelay,
    pub log: RawLog,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
    pub ping_interval: String,
    pub peer_timeout: String,
    pub max_message_bytes: u64,
    pub shutdown_grace: String,
    /// CIDR blocks allowed to open `/snapshot` and `/changes`; a TOML list, or one comma-separated string (as an
    /// environment variable can only be).
    #[serde(deserialize_with = "list_or_commas")]
    pub allow: Vec<String>,
    pub max_connections: u64,
    pub header_read_timeout: String,
    pub max_header_bytes: u64,
    pub tls_cert_file: String,
    pub tls_key_file: String,
    pub worker_threads: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLitestream {
    pub backup_url: String,
    pub metrics_url: String,
    pub check_interval: String,
    pub scrape_timeout: String,
    pub max_page_bytes: u64,
    pub db: String,
    pub name: String,
    pub proxy_listen: String,
    pub proxy_mode: ProxyMode,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawBackup {
    pub verify: bool,
    pub slack: String,
    pub stale_after: String,
    pub list_timeout: String,
    pub endpoint: String,
    pub region: String,
    pub force_path_style: bool,
    pub allow_http: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawZero {
    pub app_id: String,
    pub shard_num: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawChangeDb {
    pub url: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCleanup {
    pub enabled: bool,
    pub initial_delay: String,
    pub reservations: ReservationMode,
    pub reconnect_grace: String,
    pub without_subscribers: WithoutSubscribers,
    pub batch_rows: i64,
    pub state_file: String,
    pub restore_limit: String,
    pub hold_without_state: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDiscovery {
    pub mode: DiscoveryMode,
    pub advertise_address: String,
    pub interval: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUpstream {
    pub address: String,
    pub advertised_address: String,
    pub connect_timeout: String,
    pub silence_timeout: String,
    pub tls: bool,
    pub tls_ca_file: String,
    pub tls_server_name: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRelay {
    pub suppress_upstream_cleanup: bool,
    pub max_buffered_bytes: u64,
    pub max_pending_commits: u64,
    pub write_stall_timeout: String,
    pub ack_batch_window: String,
    pub ack_wakeup_bytes: u64,
    pub ack_wakeup_wait: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    pub format: String,
    pub filter: String,
}

/// `cleanup.without_subscribers`: what cleanup does while no subscriber is relayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithoutSubscribers {
    /// Hold (Zero's own rule, W1): with Zero 0.20 the replication-manager's backup replicator is relayed too, so no
    /// relayed subscriber means nothing shows that the replication-manager is past the backup.
    #[default]
    Hold,
    /// Purge below aged backups once `reconnect_grace` has passed since the last relayed subscriber left (and since
    /// the sidecar started). For Zero 0.22 and later, whose backup replicator connects to the change-streamer
    /// directly: a backed-up watermark then proves the replication-manager's replica passed it.
    AfterGrace,
}

/// `litestream.proxy_mode`: what Zero sees of the watermark gauge behind the metrics proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// No `litestream_replica_progress` at all: Zero never schedules a purge (Zero 0.20's deployment).
    #[default]
    Hide,
    /// One sample at the watermark the sidecar has already purged below, with its real backup time: Zero's backup
    /// verification, staleness checks and readiness see a live backup, and a purge it schedules deletes nothing.
    Clamp,
}

/// `cleanup.reservations`: how open snapshot reservations constrain cleanup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationMode {
    /// Each reservation pins the newest watermark known backed up when it opened: purges stay at or below every
    /// open reservation's floor, so a restore never loses the rows after the backup it restores.
    #[default]
    Pin,
    /// Zero's own rule: any open reservation pauses all cleanup (PROTOCOL.md §5.3 3, W5).
    Pause,
}

/// `discovery.mode`: whether the sidecar only reads `ownerAddress` or may replace it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryMode {
    /// Read `ownerAddress` and report; the operator points `ZERO_CHANGE_STREAMER_ADDRESS` at the sidecar.
    #[default]
    Verify,
    /// Replace the co-located change-streamer's address with the sidecar's (row-lock schemas only).
    Adopt,
    /// View-syncers reach the sidecar through `ZERO_CHANGE_STREAMER_URI` (Zero 0.22 and later) and `ownerAddress`
    /// keeps the replication-manager's own address (`upstream.advertised_address`): cleanup runs only while it
    /// does, for as long as the same replication-manager task (`owner`) holds it.
    Owner,
    /// No discovery: nothing is read, and cleanup does not depend on registration.
    Off,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:4851".into(),
            ping_interval: "10s".into(),
            peer_timeout: DEFAULT_PEER_TIMEOUT.into(),
            max_message_bytes: 128 << 20,
            shutdown_grace: "10s".into(),
            allow: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: "10s".into(),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            worker_threads: 1,
        }
    }
}

impl Default for RawLitestream {
    fn default() -> Self {
        Self {
            backup_url: String::new(),
            metrics_url: "http://127.0.0.1:4860/metrics".into(),
            check_interval: "60s".into(),
            scrape_timeout: "5s".into(),
            max_page_bytes: 4 << 20,
            db: String::new(),
            name: String::new(),
            proxy_listen: "localhost:4850".into(),
            proxy_mode: ProxyMode::Hide,
        }
    }
}

impl Default for RawBackup {
    fn default() -> Self {
        Self {
            verify: true,
            slack: "60s".into(),
            stale_after: "15m".into(),
            list_timeout: "10s".into(),
            endpoint: String::new(),
            region: String::new(),
            force_path_style: false,
            allow_http: false,
        }
    }
}

impl Default for RawZero {
    fn default() -> Self {
        Self {
            app_id: "zero".into(),
            shard_num: 0,
        }
    }
}

impl Default for RawChangeDb {
    fn default() -> Self {
        Self {
            url: "postgres://zero@127.0.0.1:5432/zero".into(),
        }
    }
}

impl Default for RawCleanup {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_delay: "30s".into(),
            reservations: ReservationMode::Pin,
            reconnect_grace: "30s".into(),
            without_subscribers: WithoutSubscribers::Hold,
            batch_rows: 10_000,
            state_file: String::new(),
            restore_limit: "auto".into(),
            hold_without_state: "auto".into(),
        }
    }
}

impl Default for RawDiscovery {
    fn default() -> Self {
        Self {
            mode: DiscoveryMode::Verify,
            advertise_address: String::new(),
            interval: "5s".into(),
        }
    }
}

impl Default for RawUpstream {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:4849".into(),
            advertised_address: String::new(),
            connect_timeout: "5s".into(),
            silence_timeout: "33s".into(),
            tls: false,
            tls_ca_file: String::new(),
            tls_server_name: String::new(),
        }
    }
}

impl Default for RawRelay {
    fn default() -> Self {
        Self {
            suppress_upstream_cleanup: true,
            max_buffered_bytes: 64 << 10,
            max_pending_commits: 4096,
            write_stall_timeout: "60s".into(),
            ack_batch_window: "0s".into(),
            ack_wakeup_bytes: DEFAULT_ACK_WAKEUP_BYTES,
            ack_wakeup_wait: "20ms".into(),
        }
    }
}

impl Default for RawLog {
    fn default() -> Self {
        Self {
            format: "text".into(),
            filter: "warn,litestream_sidecar=info".into(),
        }
    }
}

/// The validated configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub litestream: LitestreamConfig,
    pub backup: BackupConfig,
    pub zero: ZeroConfig,
    pub change_db: ChangeDbConfig,
    pub cleanup: CleanupConfig,
    pub discovery: DiscoveryConfig,
    pub upstream: UpstreamConfig,
    pub relay: RelayConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where view-syncers reach the sidecar; default port 4851 sits next to Zero's 4848-4850.
    pub listen: SocketAddr,
    /// How often every downstream WebSocket is pinged.
    pub ping_interval: Duration,
    /// A downstream peer from which nothing (pong or any frame) arrived for this long is dropped, as seen at a
    /// ping time. Longer than `ping_interval`, so that one lost pong or a short network stall drops nobody.
    pub peer_timeout: Duration,
    /// Largest WebSocket message or frame accepted; larger ones close with 1009.
    pub max_message_bytes: usize,
    /// How long shutdown waits for connections to close before exiting anyway.
    pub shutdown_grace: Duration,
    /// Who may open `/snapshot` and `/changes`; the plain endpoints stay open to everyone.
    pub allow: crate::net::allow::AllowList,
    /// Connections open at once on the main listener, WebSockets included; past it new ones get a 503.
    pub max_connections: usize,
    /// A request head must arrive whole within this long of the connection opening or of the previous response,
    /// so it is also how long a plain HTTP connection may sit idle.
    pub header_read_timeout: Duration,
    /// Largest request line plus headers; a longer head gets a 431 and the connection is closed.
    pub max_header_bytes: usize,
    /// Threads that run the sidecar's work. One (the default) runs everything on one thread with no hand-offs
    /// between threads, which relays cheapest beside Zero on a small machine; more spread many busy subscribers
    /// over cores.
    pub worker_threads: usize,
    /// When set, the listener speaks TLS only: view-syncers are given one URL, so it is either `ws://` or `wss://`.
    pub tls: Option<ServerTlsFiles>,
}

/// `server.tls_cert_file` and `server.tls_key_file`: only paths here; [`crate::net::tls`] reads them at start and on
/// SIGHUP, so that `status` and `--check-config` users need no access to the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM: the certificate, then any intermediates.
    pub cert_file: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct LitestreamConfig {
    /// Sent verbatim as `backupURL` in every snapshot status; view-syncers restore from it.
    pub backup_url: String,
    /// litestream's own metrics page (its `addr:`), scraped for backed-up watermarks.
    pub metrics_url: hyper::Uri,
    /// How often litestream is scraped and cleanup decided.
    pub check_interval: Duration,
    pub scrape_timeout: Duration,
    /// A larger metrics page is refused rather than buffered.
    pub max_page_bytes: usize,
    /// Only samples with these `db` / `name` labels count (PROTOCOL.md W13: with several replicas, pick one).
    pub filter: Filter,
    /// `host:port` where Zero's BackupMonitor fetches `/metrics`; every address the host resolves to is bound.
    pub proxy_listen: String,
    pub proxy_mode: ProxyMode,
}

/// `litestream.db` / `litestream.name`: which samples count. With several databases or replicas on one litestream,
/// only the configured one may drive cleanup. `None` accepts any value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Required value of label `db`.
    pub db: Option<String>,
    /// Required value of label `name`.
    pub name: Option<String>,
}

impl Filter {
    /// Whether a sample with these `db` and `name` labels (empty when absent) is taken.
    pub fn matches(&self, db: &str, name: &str) -> bool {
        self.db.as_deref().is_none_or(|want| want == db)
            && self.name.as_deref().is_none_or(|want| want == name)
    }
}

/// `[backup]`: how litestream's claims are checked against the destination before a purge relies on them.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    /// Off: claims are trusted as litestream makes them, and snapshot statuses wait only for a first claim.
    pub verify: bool,
    /// A claim backed up at `T` is covered by an object last modified at or after `T - slack`.
    pub slack: Duration,
    /// The destination is stale when its newest object is this much older than litestream's newest claim.
    pub stale_after: Duration,
    /// One listing, every page of it, gives up after this long; cleanup then holds.
    pub list_timeout: Duration,
    /// Where the backup lives, parsed from `litestream.backup_url` (`None` with `verify` off).
    pub location: Option<crate::litestream::destination::Location>,
    pub s3: crate::litestream::destination::S3Settings,
}

#[derive(Debug, Clone)]
pub struct ZeroConfig {
    pub app_id: String,
    pub shard_num: u32,
}

impl ZeroConfig {
    /// The change DB schema, e.g. `zero_0/cdc`, unquoted (PROTOCOL.md §8.1).
    pub fn cdc_schema(&self) -> String {
        format!("{}_{}/cdc", self.app_id, self.shard_num)
    }
}

#[derive(Clone)]
pub struct ChangeDbConfig {
    /// Parsed connection settings; its `Debug` form hides the password.
    pub pg: tokio_postgres::Config,
}

impl fmt::Debug for ChangeDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeDbConfig")
            .field("pg", &self.pg)
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct CleanupConfig {
    /// Off: the sidecar decides and reports, but never deletes.
    pub enabled: bool,
    /// Lower bound of the cleanup delay, raised by long reservations (PROTOCOL.md §9.1); never below 30 s.
    pub initial_delay: Duration,
    pub reservations: ReservationMode,
    /// How long a departed subscriber's ack still holds cleanup back: Zero's clients reconnect within 10 s.
    pub reconnect_grace: Duration,
    pub without_subscribers: WithoutSubscribers,
    /// Rows per DELETE statement, so no statement holds locks or writes WAL without bound.
    pub batch_rows: i64,
    /// Where open reservations, the learned cleanup delay, the last purge and litestream's highest watermark
    /// survive a restart (see [`crate::cleanup::state`]); `None`: the operator chose to keep nothing (`"none"`).
    pub state_file: Option<std::path::PathBuf>,
    /// How long a restore may take: a reservation kept across a restart is honoured this long after it opened.
    pub restore_limit: RestoreLimit,
    /// How long a start without a state file holds cleanup: a restore begun before it may be in flight.
    pub hold_without_state: RestoreLimit,
}

/// The longest a restore is taken to last: a fixed duration, or scaled to the backup's size as Zero scales its own
/// wait for a first backup (an hour per 50 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreLimit {
    /// [`RestoreLimit::AUTO_PER`] per [`RestoreLimit::AUTO_UNIT`] of the largest database on litestream's page,
    /// never less than one hour; one hour while the size is unknown.
    Auto,
    Fixed(Duration),
}

impl RestoreLimit {
    pub const AUTO_PER: Duration = Duration::from_secs(3600);
    pub const AUTO_UNIT: u64 = 50 << 30;

    /// The limit for a backup of `db_bytes` (`None`: not known).
    pub fn for_size(self, db_bytes: Option<u64>) -> Duration {
        match self {
            RestoreLimit::Fixed(limit) => limit,
            RestoreLimit::Auto => {
                let units = db_bytes.unwrap_or(0).div_ceil(Self::AUTO_UNIT).max(1);
                Self::AUTO_PER.saturating_mul(u32::try_from(units).unwrap_or(u32::MAX))
            }
        }
    }
}

fn parse_restore_limit(text: &str) -> Result<RestoreLimit, String> {
    match text.trim() {
        "auto" => Ok(RestoreLimit::Auto),
        other => parse_duration(other)
            .map(RestoreLimit::Fixed)
            .map_err(|e| format!("{e}; or \"auto\"")),
    }
}

#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    pub mode: DiscoveryMode,
    /// `host:port` view-syncers use to reach the sidecar: what `ownerAddress` must say.
    pub advertise_address: String,
    /// How often the address table is read.
    pub interval: Duration,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `host:port` of Zero's change-streamer, where `/changes` subscriptions are relayed to.
    pub address: String,
    /// The address that change-streamer writes as `ownerAddress` when not told otherwise (its preferred
    /// interface's IP and port): the one `discovery.mode = "adopt"` replaces.
    pub advertised_address: String,
    /// How long connecting and the WebSocket handshake to the upstream may take before the subscriber is refused
    /// (HTTP 502).
    pub connect_timeout: Duration,
    /// An upstream from which nothing (message or ping) arrived during a whole period of this length is dropped.
    pub silence_timeout: Duration,
    /// `wss://` to the upstream, for a change-streamer behind a TLS-terminating proxy.
    pub tls: Option<UpstreamTlsConfig>,
}

/// `upstream.tls = true`: how the upstream's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of the CAs trusted instead of the system's; `None`: the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// The name the certificate must carry, also sent as SNI (unless an IP address).
    pub server_name: rustls::pki_types::ServerName<'static>,
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Forward `initial=false` instead of `initial=true` so that Zero does not schedule its own change-log purge
    /// (PROTOCOL.md §11.6, W2).
    pub suppress_upstream_cleanup: bool,
    /// Bytes queued toward one socket before the relay stops reading the other: a slow reader slows only its own
    /// stream. A single larger frame still passes, one at a time.
    pub max_buffered_bytes: usize,
    /// Commits sent and not yet acknowledged that a subscriber's ack tracking keeps apart; past it older ones are
    /// merged, which can only delay the acknowledged watermark.
    pub max_pending_commits: usize,
    /// A subscriber toward which bytes have been queued this long without one being written has stopped reading:
    /// its subscription is ended rather than left to TCP's retransmission timeouts.
    pub write_stall_timeout: Duration,
    /// How long a subscriber's acks may wait to travel upstream together while later messages are still being
    /// consumed; zero (the default) sends each read's acks at once. An ack that leaves nothing in flight is never
    /// held.
    pub ack_batch_window: Duration,
    /// Most bytes of a subscriber's acks the relay asks the kernel to gather before waking it (`SO_RCVLOWAT`,
    /// [`crate::streamer::wakeup`]); 0 wakes it for each. It waits only for acks that are sure to come.
    pub ack_wakeup_bytes: u64,
    /// Longest a subscriber's acks wait in the kernel for the rest of theirs: past it the relay reads what came,
    /// so a subscriber that stalls mid-transaction, or closes, is heard anyway.
    pub ack_wakeup_wait: Duration,
}

/// Longest `relay.ack_wakeup_wait`.
pub const MAX_ACK_WAKEUP_WAIT: Duration = Duration::from_secs(1);

/// `relay.ack_wakeup_bytes` by default: about 60 of Zero's acks.
pub const DEFAULT_ACK_WAKEUP_BYTES: u64 = 1024;

/// Largest `relay.ack_wakeup_bytes`: far below a TCP receive buffer (Linux's default is 128 KiB), so that the kernel
/// never grows the buffer or clamps the window to honour it, and a few hundred acks at most wait together.
pub const MAX_ACK_WAKEUP_BYTES: u64 = 16 << 10;

/// Longest `relay.ack_batch_window`: Zero 1.x paces replication on acks, so a longer hold would slow it.
pub const MAX_ACK_BATCH_WINDOW: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `tracing_subscriber::EnvFilter` directives; `RUST_LOG` wins when set.
    pub filter: String,
}

/// One problem with one key. Validation collects all of them so an operator fixes the file in one pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct KeyError {
    pub key: &'static str,
    pub problem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    File {
        path: PathBuf,
        source: Box<config::ConfigError>,
    },
    #[error("config: {0}")]
    Load(Box<config::ConfigError>),
    #[error("{} invalid config key(s):\n{}", .0.len(), list(.0))]
    Invalid(Vec<KeyError>),
}

fn list(errors: &[KeyError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The problems [`RawConfig::validate`] finds, one per key, in the order the keys are checked.
#[derive(Default)]
struct Problems(Vec<KeyError>);

impl Problems {
    /// The checked value of `key`, or `None` with its problem recorded.
    fn field<T>(&mut self, key: &'static str, checked: Result<T, String>) -> Option<T> {
        checked
            .map_err(|problem| self.0.push(KeyError { key, problem }))
            .ok()
    }

    /// The config `build` assembles from the checked values when no key had a problem, else every problem. `build`
    /// returns `None` only when a value is missing, and a value is missing only when its problem was recorded.
    fn finish(self, build: impl FnOnce() -> Option<Config>) -> Result<Config, ConfigError> {
        match build() {
            Some(config) if self.0.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(self.0)),
        }
    }
}

/// Which file to read: the explicit one (must exist), else the first default that exists, else none (environment
/// and defaults only, as in a container).
pub fn resolve_path(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(path) => Some(path.to_path_buf()),
        None => DEFAULT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file()),
    }
}

/// Reads the file (if any) and the process environment into a [`RawConfig`].
pub fn load(path: Option<&Path>) -> Result<RawConfig, ConfigError> {
    let text = match path {
        None => None,
        Some(path) => {
            let unreadable = |reason: String| ConfigError::File {
                path: path.to_path_buf(),
                source: Box::new(config::ConfigError::Message(reason)),
            };
            if !path.is_file() {
                return Err(unreadable("no such file".into()));
            }
            Some(std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?)
        }
    };
    build(text.as_deref(), None).map_err(|source| match path {
        Some(path) => ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        },
        None => ConfigError::Load(Box::new(source)),
    })
}

/// Builds a [`RawConfig`] from TOML text and an explicit set of environment variables, through the same steps as
/// [`load`]: tests use it so they never touch the process environment.
pub fn from_toml_str(
    text: &str,
    env: Option<std::collections::HashMap<String, String>>,
) -> Result<RawConfig, ConfigError> {
    build(Some(text), env).map_err(|e| ConfigError::Load(Box::new(e)))
}

/// The file's text (if any) under the environment's overrides (`None`: the process environment).
fn build(
    text: Option<&str>,
    env: Option<std::collections::HashMap<String, String>>,
) -> Result<RawConfig, config::ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(text) = text {
        builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
    }
    builder
        .add_source(environment(env))
        .build()
        .and_then(|c| c.try_deserialize())
}

fn environment(source: Option<std::collections::HashMap<String, String>>) -> config::Environment {
    config::Environment::with_prefix(ENV_PREFIX)
        .prefix_separator(ENV_SEPARATOR)
        .separator(ENV_SEPARATOR)
        .source(source)
}

/// A list from TOML (`["10.0.0.0/8", "::1"]`) or from one string, split at commas and whitespace
/// (`LITESTREAM_SIDECAR__SERVER__ALLOW="10.0.0.0/8, ::1"`).
fn list_or_commas<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrString {
        List(Vec<String>),
        String(String),
    }
    Ok(match ListOrString::deserialize(deserializer)? {
        ListOrString::List(list) => list,
        ListOrString::String(text) => text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

impl RawConfig {
    /// Checks every key and converts it; returns all problems, not just the first.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let mut problems = Problems::default();

        let listen = problems.field("server.listen", parse_addr(&self.server.listen));
        let ping_interval = problems.field(
            "server.ping_interval",
            parse_duration(&self.server.ping_interval).and_then(|d| {
                if d < Duration::from_millis(10) || d > MAX_PING_INTERVAL {
                    Err(format!(
                        "{:?} is outside 10ms..=30s (Zero's client drops a socket silent for 33 s)",
                        self.server.ping_interval
                    ))
                } else {
                    Ok(d)
                }
            }),
        );
        let peer_timeout = problems.field(
            "server.peer_timeout",
            parse_duration(&self.server.peer_timeout).and_then(|d| match ping_interval {
                Some(ping) if d <= ping => Err(format!(
                    "{:?} must be longer than server.ping_interval ({:?}), or a peer is dropped before it \
                     could answer a ping",
                    self.server.peer_timeout, self.server.ping_interval
                )),
                _ => Ok(d),
            }),
        );
        let max_message_bytes = problems.field(
            "server.max_message_bytes",
            if self.server.max_message_bytes < MIN_MESSAGE_BYTES {
                Err(format!(
                    "{} is below {MIN_MESSAGE_BYTES} (Zero sends messages up to 100 MiB)",
                    self.server.max_message_bytes
                ))
            } else {
                usize::try_from(self.server.max_message_bytes).map_err(|e| e.to_string())
            },
        );
        let shutdown_grace = problems.field(
            "server.shutdown_grace",
            parse_duration(&self.server.shutdown_grace),
        );
        let allow = problems.field(
            "server.allow",
            crate::net::allow::AllowList::parse(&self.server.allow),
        );
        let max_connections = problems.field(
            "server.max_connections",
            match usize::try_from(self.server.max_connections) {
                Ok(0) | Err(_) => Err(format!(
                    "{} is not a number of connections from 1 up",
                    self.server.max_connections
                )),
                Ok(n) => Ok(n),
            },
        );
        let worker_threads = problems.field(
            "server.worker_threads",
            match self.server.worker_threads {
                n @ 1..=256 => Ok(n as usize),
                n => Err(format!("{n} is not a number of threads from 1 to 256")),
            },
        );
        let header_read_timeout = problems.field(
            "server.header_read_timeout",
            parse_duration(&self.server.header_read_timeout).and_then(|d| {
                if d < Duration::from_millis(100) {
                    Err(format!(
                        "{:?} is shorter than 100ms: clients on a slow link could not send a request",
                        self.server.header_read_timeout
                    ))
                } else {
                    Ok(d)
                }
            }),
        );
        let max_header_bytes = problems.field(
            "server.max_header_bytes",
            if !(MIN_HEADER_BYTES..=(1 << 20)).contains(&self.server.max_header_bytes) {
                Err(format!(
                    "{} is outside {MIN_HEADER_BYTES}..=1048576",
                    self.server.max_header_bytes
                ))
            } else {
                Ok(self.server.max_header_bytes as usize)
            },
        );
        let server_tls = match (
            self.server.tls_cert_file.trim(),
            self.server.tls_key_file.trim(),
        ) {
            ("", "") => Some(None),
            (_, "") => problems.field(
                "server.tls_key_file",
                Err("must be set with server.tls_cert_file".into()),
            ),
            ("", _) => problems.field(
                "server.tls_cert_file",
                Err("must be set with server.tls_key_file".into()),
            ),
            (cert, key) => Some(Some(ServerTlsFiles {
                cert_file: cert.into(),
                key_file: key.into(),
            })),
        };

        let backup_url = problems.field("litestream.backup_url", {
            let url = self.litestream.backup_url.trim();
            if url.is_empty() {
                Err("must not be empty: it is the backupURL every view-syncer restores from".into())
            } else if url.chars().any(char::is_control) {
                Err("must not contain control characters".into())
            } else {
                Ok(url.to_string())
            }
        });
        let metrics_url = problems.field(
            "litestream.metrics_url",
            parse_http_url(&self.litestream.metrics_url),
        );
        let check_interval = problems.field(
            "litestream.check_interval",
            parse_duration(&self.litestream.check_interval).and_then(|d| {
                if d < Duration::from_secs(1) {
                    Err(format!("{:?} is below 1s", self.litestream.check_interval))
                } else {
                    Ok(d)
                }
            }),
        );
        let scrape_timeout = problems.field(
            "litestream.scrape_timeout",
            parse_duration(&self.litestream.scrape_timeout).and_then(|d| {
                if d.is_zero() {
                    Err("must be above 0".to_string())
                } else {
                    Ok(d)
                }
            }),
        );
        let max_page_bytes = problems.field(
            "litestream.max_page_bytes",
            match usize::try_from(self.litestream.max_page_bytes) {
                Ok(n) if n >= 1024 => Ok(n),
                _ => Err(format!(
                    "{} is not a size of at least 1024 bytes",
                    self.litestream.max_page_bytes
                )),
            },
        );
        let proxy_listen = problems.field(
            "litestream.proxy_listen",
            parse_host_port(&self.litestream.proxy_listen),
        );
        if let (Some(url), Some((host, port))) = (&metrics_url, &proxy_listen) {
            problems.field("litestream.metrics_url", not_the_proxy(url, host, *port));
        }

        let slack = problems.field("backup.slack", parse_duration(&self.backup.slack));
        let stale_after = problems.field(
            "backup.stale_after",
            parse_positive_duration(&self.backup.stale_after).and_then(|d| match slack {
                Some(slack) if d <= slack => Err(format!(
                    "{:?} must be longer than backup.slack ({:?})",
                    self.backup.stale_after, self.backup.slack
                )),
                _ => Ok(d),
            }),
        );
        let list_timeout = problems.field(
            "backup.list_timeout",
            parse_positive_duration(&self.backup.list_timeout),
        );
        let location = problems.field(
            "litestream.backup_url",
            match (&backup_url, self.backup.verify) {
                (Some(url), true) => crate::litestream::destination::Location::parse(url).map(Some),
                _ => Ok(None),
            },
        );
        let endpoint = problems.field(
            "backup.endpoint",
            match self.backup.endpoint.trim() {
                "" => Ok(None),
                endpoint => parse_endpoint(endpoint, self.backup.allow_http).map(Some),
            },
        );
        let region = match self.backup.region.trim() {
            "" => None,
            region => Some(region.to_string()),
        };

        let app_id = problems.field(
            "zero.app_id",
            validate_app_id(&self.zero.app_id).map(|()| self.zero.app_id.clone()),
        );
        let shard_num = problems.field(
            "zero.shard_num",
            u32::try_from(self.zero.shard_num).map_err(|_| {
                format!(
                    "{} is not a shard number (0..=4294967295)",
                    self.zero.shard_num
                )
            }),
        );

        let pg = problems.field(
            "change_db.url",
            self.change_db
                .url
                .parse::<tokio_postgres::Config>()
                .map_err(|e| format!("not a PostgreSQL connection string: {e}")),
        );

        let initial_delay = problems.field(
            "cleanup.initial_delay",
            parse_duration(&self.cleanup.initial_delay),
        );
        let reconnect_grace = problems.field(
            "cleanup.reconnect_grace",
            parse_duration(&self.cleanup.reconnect_grace),
        );
        let restore_limit = problems.field(
            "cleanup.restore_limit",
            parse_restore_limit(&self.cleanup.restore_limit),
        );
        let hold_without_state = problems.field(
            "cleanup.hold_without_state",
            parse_restore_limit(&self.cleanup.hold_without_state),
        );
        let batch_rows = problems.field(
            "cleanup.batch_rows",
            if (1..=1_000_000).contains(&self.cleanup.batch_rows) {
                Ok(self.cleanup.batch_rows)
            } else {
                Err(format!(
                    "{} is outside 1..=1000000",
                    self.cleanup.batch_rows
                ))
            },
        );

        let discovery_interval = problems.field(
            "discovery.interval",
            parse_duration(&self.discovery.interval).and_then(|d| {
                if d < Duration::from_millis(100) {
                    Err(format!("{:?} is below 100ms", self.discovery.interval))
                } else {
                    Ok(d)
                }
            }),
        );
        let advertise = self.discovery.advertise_address.trim();
        let advertise_address = problems.field(
            "discovery.advertise_address",
            match (self.discovery.mode, advertise) {
                (DiscoveryMode::Off | DiscoveryMode::Owner, "") => Ok(String::new()),
                (_, "") => Err("must be set (the host:port view-syncers reach the sidecar at) unless mode = \"off\" or \"owner\"".into()),
                (_, address) => match validate_owner_address(address)
                    .and_then(|_| parse_host_port(host_port(address)))
                {
                    Ok((host, _)) if matches!(host.as_str(), "0.0.0.0" | "::") => {
                        Err(format!("{address:?} is not an address other hosts can connect to"))
                    }
                    Ok(_) => Ok(address.to_string()),
                    Err(problem) => Err(problem),
                },
            },
        );

        if let (Some(Some(_)), Some(address)) = (&server_tls, &advertise_address) {
            problems.field(
                "discovery.advertise_address",
                advertised_with_tls(self.discovery.mode, address),
            );
        }

        let address = problems.field(
            "upstream.address",
            validate_host_port(&self.upstream.address),
        );
        let upstream_tls = self.upstream_tls(&mut problems, address.as_deref());
        let advertised_address = problems.field(
            "upstream.advertised_address",
            match self.upstream.advertised_address.trim() {
                // Defaults to the address; a bad address is reported once, under its own key.
                "" => Ok(address.clone().unwrap_or_default()),
                other => validate_owner_address(other),
            },
        );
        let connect_timeout = problems.field(
            "upstream.connect_timeout",
            parse_positive_duration(&self.upstream.connect_timeout),
        );
        let silence_timeout = problems.field(
            "upstream.silence_timeout",
            parse_positive_duration(&self.upstream.silence_timeout),
        );
        let max_buffered_bytes = problems.field(
            "relay.max_buffered_bytes",
            if self.relay.max_buffered_bytes < MIN_BUFFERED_BYTES {
                Err(format!(
                    "{} is below {MIN_BUFFERED_BYTES}",
                    self.relay.max_buffered_bytes
                ))
            } else {
                usize::try_from(self.relay.max_buffered_bytes).map_err(|e| e.to_string())
            },
        );
        let max_pending_commits = problems.field(
            "relay.max_pending_commits",
            if self.relay.max_pending_commits < 2 {
                Err(format!("{} is below 2", self.relay.max_pending_commits))
            } else {
                usize::try_from(self.relay.max_pending_commits).map_err(|e| e.to_string())
            },
        );

        let write_stall_timeout = problems.field(
            "relay.write_stall_timeout",
            parse_positive_duration(&self.relay.write_stall_timeout),
        );
        let ack_batch_window = problems.field(
            "relay.ack_batch_window",
            parse_duration(&self.relay.ack_batch_window).and_then(|d| {
                at_most(&self.relay.ack_batch_window, d, MAX_ACK_BATCH_WINDOW)
                    .map_err(|e| format!("{e}: Zero paces replication on acks"))
            }),
        );

        let ack_wakeup_bytes = problems.field(
            "relay.ack_wakeup_bytes",
            if self.relay.ack_wakeup_bytes > MAX_ACK_WAKEUP_BYTES {
                Err(format!(
                    "{} is above {MAX_ACK_WAKEUP_BYTES}",
                    self.relay.ack_wakeup_bytes
                ))
            } else {
                Ok(self.relay.ack_wakeup_bytes)
            },
        );
        let ack_wakeup_wait = problems.field(
            "relay.ack_wakeup_wait",
            parse_positive_duration(&self.relay.ack_wakeup_wait)
                .and_then(|d| at_most(&self.relay.ack_wakeup_wait, d, MAX_ACK_WAKEUP_WAIT)),
        );

        let format = problems.field(
            "log.format",
            match self.log.format.as_str() {
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                other => Err(format!("{other:?} is neither \"text\" nor \"json\"")),
            },
        );
        let filter = problems.field(
            "log.filter",
            log_filter(&self.log.filter).map(|_| self.log.filter.clone()),
        );

        problems.finish(|| {
            Some(Config {
                server: ServerConfig {
                    listen: listen?,
                    ping_interval: ping_interval?,
                    peer_timeout: peer_timeout?,
                    max_message_bytes: max_message_bytes?,
                    shutdown_grace: shutdown_grace?,
                    allow: allow?,
                    max_connections: max_connections?,
                    header_read_timeout: header_read_timeout?,
                    max_header_bytes: max_header_bytes?,
                    worker_threads: worker_threads?,
                    tls: server_tls?,
                },
                litestream: LitestreamConfig {
                    backup_url: backup_url?,
                    metrics_url: metrics_url?,
                    check_interval: check_interval?,
                    scrape_timeout: scrape_timeout?,
                    max_page_bytes: max_page_bytes?,
                    filter: Filter {
                        db: Some(self.litestream.db.clone()).filter(|s| !s.is_empty()),
                        name: Some(self.litestream.name.clone()).filter(|s| !s.is_empty()),
                    },
                    proxy_listen: proxy_listen
                        .map(|_| self.litestream.proxy_listen.trim().to_string())?,
                    proxy_mode: self.litestream.proxy_mode,
                },
                backup: BackupConfig {
                    verify: self.backup.verify,
                    slack: slack?,
                    stale_after: stale_after?,
                    list_timeout: list_timeout?,
                    location: location?,
                    s3: crate::litestream::destination::S3Settings {
                        endpoint: endpoint?,
                        region,
                        force_path_style: self.backup.force_path_style,
                        allow_http: self.backup.allow_http,
                    },
                },
                zero: ZeroConfig {
                    app_id: app_id?,
                    shard_num: shard_num?,
                },
                change_db: ChangeDbConfig { pg: pg? },
                cleanup: CleanupConfig {
                    enabled: self.cleanup.enabled,
                    initial_delay: initial_delay?,
                    reservations: self.cleanup.reservations,
                    reconnect_grace: reconnect_grace?,
                    without_subscribers: self.cleanup.without_subscribers,
                    batch_rows: batch_rows?,
                    state_file: match self.cleanup.state_file.trim() {
                        "" => Some(default_state_file(
                            std::env::var("STATE_DIRECTORY").ok().as_deref(),
                        )),
                        "none" => None,
                        path => Some(path.into()),
                    },
                    restore_limit: restore_limit?,
                    hold_without_state: hold_without_state?,
                },
                discovery: DiscoveryConfig {
                    mode: self.discovery.mode,
                    advertise_address: advertise_address?,
                    interval: discovery_interval?,
                },
                upstream: UpstreamConfig {
                    address: address?,
                    advertised_address: advertised_address?,
                    connect_timeout: connect_timeout?,
                    silence_timeout: silence_timeout?,
                    tls: upstream_tls?,
                },
                relay: RelayConfig {
                    suppress_upstream_cleanup: self.relay.suppress_upstream_cleanup,
                    max_buffered_bytes: max_buffered_bytes?,
                    max_pending_commits: max_pending_commits?,
                    write_stall_timeout: write_stall_timeout?,
                    ack_batch_window: ack_batch_window?,
                    ack_wakeup_bytes: ack_wakeup_bytes?,
                    ack_wakeup_wait: ack_wakeup_wait?,
                },
                log: LogConfig {
                    format: format?,
                    filter: filter?,
                },
            })
        })
    }

    /// `upstream.tls*`: `Some(None)` without TLS; `None` when a problem was recorded. The server name defaults to
    /// the address's host, which is what a certificate for the upstream names when the address is a DNS name.
    fn upstream_tls(
        &self,
        problems: &mut Problems,
        address: Option<&str>,
    ) -> Option<Option<UpstreamTlsConfig>> {
        let upstream = &self.upstream;
        let ca_file = upstream.tls_ca_file.trim();
        let name = upstream.tls_server_name.trim();
        if !upstream.tls {
            let key = match (ca_file, name) {
                ("", "") => return Some(None),
                ("", _) => "upstream.tls_server_name",
                _ => "upstream.tls_ca_file",
            };
            return problems.field(key, Err("has no effect unless upstream.tls = true".into()));
        }
        let name = match name {
            // A bad address is reported once, under its own key.
            "" => parse_host_port(address?).ok()?.0,
            name => name.to_string(),
        };
        let server_name = problems.field(
            "upstream.tls_server_name",
            rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|_| format!("{name:?} is neither a DNS name nor an IP address")),
        )?;
        Some(Some(UpstreamTlsConfig {
            ca_file: (!ca_file.is_empty()).then(|| ca_file.into()),
            server_name,
        }))
    }

    /// The effective configuration as TOML, with any password in `change_db.url` replaced and any credentials
    /// in the other URLs.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = self.clone();
        shown.change_db.url = redact_db_url(&shown.change_db.url);
        for url in [
            &mut shown.litestream.backup_url,
            &mut shown.litestream.metrics_url,
            &mut shown.backup.endpoint,
            &mut shown.discovery.advertise_address,
            &mut shown.upstream.advertised_address,
        ] {
            *url = without_userinfo(url);
        }
        toml::to_string(&shown).expect("config serializes")
    }
}

/// The filter of `log.filter` or `RUST_LOG`, each comma-separated directive trimmed first: tracing-subscriber finds
/// a directive's parts in its trimmed text but cuts them from the untrimmed one, which garbles a directive after
/// `, ` and panics when a cut falls inside a multi-byte character.
pub fn log_filter(directives: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let trimmed: Vec<&str> = directives.split(',').map(str::trim).collect();
    tracing_subscriber::EnvFilter::try_new(trimmed.join(",")).map_err(|e| e.to_string())
}

/// Zero refuses other app IDs (PROTOCOL.md §8.1); the ID also becomes part of a quoted SQL identifier.
pub fn validate_app_id(app_id: &str) -> Result<(), String> {
    if app_id.is_empty() {
        return Err("must not be empty".into());
    }
    if !app_id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "{app_id:?} must match ^[a-z0-9_]+$ (lower-case letters, digits and '_', as Zero requires)"
        ));
    }
    Ok(())
}

/// With a TLS listener, what `ownerAddress` tells view-syncers must make them speak TLS: Zero's clients use `ws://`
/// for a bare address, so the sidecar may write only a `wss://` one (`adopt`), and a `ws://` one is wrong in any
/// mode.
fn advertised_with_tls(mode: DiscoveryMode, address: &str) -> Result<(), String> {
    let bare = !address.contains("://");
    if address.starts_with("ws://") || (bare && mode == DiscoveryMode::Adopt) {
        return Err(format!(
            "{address:?} would have view-syncers speak plain WebSocket to a TLS listener (server.tls_cert_file is set): \
             write wss://{}",
            host_port(address)
        ));
    }
    Ok(())
}

/// Accepts `30s`, `5m`, `1h 30m`, `250ms`; a bare number is refused because its unit would be a guess.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like \"30s\" or \"5m\": {e}"))
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| {
        if d.is_zero() {
            Err(format!("{text:?} must be longer than zero"))
        } else {
            Ok(d)
        }
    })
}

/// `d`, parsed from `text`, unless it is longer than `max`.
fn at_most(text: &str, d: Duration, max: Duration) -> Result<Duration, String> {
    if d > max {
        Err(format!("{text:?} is longer than {max:?}"))
    } else {
        Ok(d)
    }
}

fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("{text:?} is not a socket address like \"0.0.0.0:4851\" or \"[::1]:4851\"")
    })
}

/// Scraping the proxy would read a page with the watermarks already removed: cleanup would never run.
fn not_the_proxy(url: &hyper::Uri, proxy_host: &str, proxy_port: u16) -> Result<(), String> {
    let local = |h: &str| {
        matches!(
            h,
            "localhost" | "127.0.0.1" | "::1" | "[::1]" | "0.0.0.0" | "[::]"
        )
    };
    let host = url.host().unwrap_or("");
    let same_host = host == proxy_host || (local(host) && local(proxy_host));
    if same_host && url.port_u16().unwrap_or(80) == proxy_port {
        return Err(format!(
            "{url} is the sidecar's own metrics proxy (litestream.proxy_listen): point it at litestream's real addr, \
             e.g. http://127.0.0.1:4860/metrics"
        ));
    }
    Ok(())
}

/// An `http://host:port/path` URL; litestream serves plain HTTP on loopback.
fn parse_http_url(text: &str) -> Result<hyper::Uri, String> {
    // Errors show the URL without any `user:password@`.
    let shown = without_userinfo(text.trim());
    let uri: hyper::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "{shown:?} must be an http:// URL with a host, e.g. http://127.0.0.1:4860/metrics"
        ));
    }
    // The scraper is the judge of what it can scrape: whatever it would refuse once running is refused here.
    crate::net::client::HttpClient::new(uri.clone(), Duration::ZERO, 0)
        .map_err(|e| e.to_string())?;
    Ok(uri)
}

/// An `https://host[:port]` endpoint; `http://` only with `allow_http`, since request signatures and listings
/// would cross the network in clear.
fn parse_endpoint(text: &str, allow_http: bool) -> Result<String, String> {
    if without_userinfo(text) != text {
        // Shown without them: whatever is there may be a secret.
        return Err(format!(
            "{:?}: credentials in the endpoint are not used; they come from the environment \
             (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...)",
            without_userinfo(text)
        ));
    }
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if url.host_str().is_none() || !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!(
            "{text:?} must be scheme://host[:port] with no path, e.g. https://minio.internal:9000"
        ));
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => {
            return Err(format!(
                "{text:?} is plain http: set backup.allow_http = true for a loopback or trusted-network endpoint"
            ))
        }
        other => return Err(format!("{text:?}: scheme {other:?} is neither https nor http")),
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// `text` with any `user:password@` before its host replaced by `***@`, for anything that shows a configured
/// URL: the scheme, if any, is kept, and the userinfo is whatever precedes the last `@` of the authority.
pub fn without_userinfo(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let authority = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority].rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => text.to_string(),
    }
}

/// Hides the password of a `postgres://` URL or a `password=` pair of a key-value connection string.
pub fn redact_db_url(text: &str) -> String {
    if let Ok(mut url) = url::Url::parse(text) {
        if url.password().is_some() {
            let _ = url.set_password(Some("REDACTED"));
        }
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "REDACTED".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        if pairs.iter().any(|(k, _)| k == "password") {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        return url.to_string();
    }
    text.split_whitespace()
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.trim() == "password" => "password=REDACTED".to_string(),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where the state lives when a config names none: systemd's `StateDirectory=` (passed as `$STATE_DIRECTORY`,
/// possibly several paths separated by `:`), else [`DEFAULT_STATE_DIR`].
fn default_state_file(state_directory: Option<&str>) -> std::path::PathBuf {
    let dir = state_directory
        .and_then(|dirs| dirs.split(':').next())
        .map(str::trim)
        .filter(|dir| !dir.is_empty())
        .unwrap_or(DEFAULT_STATE_DIR);
    std::path::Path::new(dir).join("state.json")
}

/// The state's directory outside systemd: the same path systemd's `StateDirectory=litestream-sidecar` gives.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/litestream-sidecar";

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str =
        "[litestream]\nbackup_url = \"s3://bucket/replica\"\n[discovery]\nadvertise_address = \"10.0.0.5:4851\"\n";

    fn errors_of(text: &str) -> Vec<KeyError> {
        match from_toml_str(text, Some(Default::default()))
            .unwrap()
            .validate()
        {
            Err(ConfigError::Invalid(errors)) => errors,
            other => panic!("expected invalid config, got {other:?}"),
        }
    }

    fn keys(errors: &[KeyError]) -> Vec<&'static str> {
        errors.iter().map(|e| e.key).collect()
    }

    #[test]
    fn reference_file_is_valid_and_matches_the_defaults() {
        let text = include_str!("../sidecar.toml");
        let raw = from_toml_str(text, Some(Default::default())).unwrap();
        let config = raw.validate().unwrap();
        assert_eq!(config.server.listen, "0.0.0.0:4851".parse().unwrap());
        assert_eq!(config.server.ping_interval, Duration::from_secs(10));
        assert_eq!(config.server.peer_timeout, Duration::from_secs(60));
        assert_eq!(config.server.max_message_bytes, 128 << 20);
        assert_eq!(config.relay.write_stall_timeout, Duration::from_secs(60));
        // Every default written in the reference file is the code's default: only backup_url has none.
        let mut from_file = toml::Value::try_from(&raw).unwrap();
        let mut defaults = toml::Value::try_from(RawConfig::default()).unwrap();
        for (section, key) in [
            ("litestream", "backup_url"),
            ("discovery", "advertise_address"),
        ] {
            from_file[section][key] = "".into();
            defaults[section][key] = "".into();
        }
        assert_eq!(from_file, defaults);
    }

    /// Every key the code accepts is written in the reference file, under a comment saying what it is for.
    #[test]
    fn reference_file_documents_every_key() {
        let text = include_str!("../sidecar.toml");
        let written: toml::Table = text.parse().unwrap();
        let accepted = toml::Value::try_from(RawConfig::default()).unwrap();
        let accepted = accepted.as_table().unwrap();
        let sections = |t: &toml::Table| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(sections(&written), sections(accepted), "sections");
        for (section, keys) in accepted {
            let keys = keys.as_table().unwrap();
            let in_file = written[section].as_table().unwrap();
            assert_eq!(sections(in_file), sections(keys), "keys of [{section}]");
            // The line before each key is a comment (the key's documentation).
            let body = text.split(&format!("[{section}]\n")).nth(1).unwrap();
            for key in keys.keys() {
                let at = body
                    .find(&format!("\n{key} = "))
                    .unwrap_or_else(|| panic!("{section}.{key}"));
                let previous = body[..at].lines().last().unwrap_or("");
                assert!(
                    previous.starts_with('#'),
                    "{section}.{key} has no comment above it"
                );
            }
        }
    }

    #[test]
    fn default_port_is_none_of_zeros() {
        let port = RawServer::default()
            .listen
            .parse::<SocketAddr>()
            .unwrap()
            .port();
        assert!(![4848, 4849, 4850].contains(&port));
    }

    #[test]
    fn minimal_file_is_valid() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(config.litestream.backup_url, "s3://bucket/replica");
        assert_eq!(config.zero.cdc_schema(), "zero_0/cdc");
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let errors = errors_of(
            r#"
            [server]
            listen = "localhost"
            ping_interval = "31s"
            max_message_bytes = 1000
            shutdown_grace = "soon"
            [litestream]
            backup_url = ""
            [zero]
            app_id = "Zero-App"
            shard_num = -1
            [cleanup]
            initial_delay = "30"
            [upstream]
            address = "localhost"
            connect_timeout = "0s"
            silence_timeout = "33"
            [relay]
            max_buffered_bytes = 100
            max_pending_commits = 1
            ack_batch_window = "1s"
            ack_wakeup_bytes = 16385
            ack_wakeup_wait = "2s"
            [log]
            format = "xml"
            "#,
        );
        assert_eq!(
            keys(&errors),
            [
                "server.listen",
                "server.ping_interval",
                "server.max_message_bytes",
                "server.shutdown_grace",
                "litestream.backup_url",
                "zero.app_id",
                "zero.shard_num",
                "cleanup.initial_delay",
                "discovery.advertise_address",
                "upstream.address",
                "upstream.connect_timeout",
                "upstream.silence_timeout",
                "relay.max_buffered_bytes",
                "relay.max_pending_commits",
                "relay.ack_batch_window",
                "relay.ack_wakeup_bytes",
                "relay.ack_wakeup_wait",
                "log.format",
            ]
        );
        let app_id = errors.iter().find(|e| e.key == "zero.app_id").unwrap();
        assert!(app_id.problem.contains("^[a-z0-9_]+$"), "{app_id}");
    }

    #[test]
    fn log_filters_with_spaces_and_wide_characters_are_read_not_panicked_on() {
        // tracing-subscriber alone panics on this one (a cut inside 'é').
        assert!(log_filter(" \u{e9}\u{e9}=info").is_ok());
        let filter = log_filter("info, litestream_sidecar=debug").unwrap();
        assert_eq!(filter.to_string(), "litestream_sidecar=debug,info");
        let errors = errors_of(&format!(
            "{MINIMAL}[log]\nfilter = \" \u{e9}\u{e9}=info,=\"\n"
        ));
        assert_eq!(keys(&errors), ["log.filter"]);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = from_toml_str(
            "[litestream]\nbackup_url = \"s3://b\"\nbackup_ulr = \"x\"\n",
            Some(Default::default()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("backup_ulr"), "{err}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = [
            (
                "LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL",
                "file:///backups/replica",
            ),
            ("LITESTREAM_SIDECAR__ZERO__SHARD_NUM", "3"),
            ("LITESTREAM_SIDECAR__SERVER__PING_INTERVAL", "15s"),
            ("UNRELATED", "ignored"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = from_toml_str(MINIMAL, Some(env))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(config.litestream.backup_url, "file:///backups/replica");
        assert_eq!(config.zero.shard_num, 3);
        assert_eq!(config.zero.cdc_schema(), "zero_3/cdc");
        assert_eq!(config.server.ping_interval, Duration::from_secs(15));
    }

    #[test]
    fn access_and_connection_limits_parse_from_the_file_or_the_environment() {
        let text = format!(
            "{MINIMAL}[server]\nallow = [\"10.0.0.0/8\", \"::1\"]\nmax_connections = 100\n"
        );
        let config = from_toml_str(&text, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert!(config.server.allow.allows("10.1.1.1".parse().unwrap()));
        assert!(!config.server.allow.allows("192.168.1.1".parse().unwrap()));
        assert_eq!(config.server.max_connections, 100);
        assert_eq!(config.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(config.server.max_header_bytes, 16 << 10);

        let env = [(
            "LITESTREAM_SIDECAR__SERVER__ALLOW".to_string(),
            "127.0.0.0/8, 192.168.0.0/16 ::1".to_string(),
        )];
        let config = from_toml_str(MINIMAL, Some(env.into_iter().collect()))
            .unwrap()
            .validate()
            .unwrap();
        for (ip, allowed) in [
            ("127.0.0.1", true),
            ("192.168.7.7", true),
            ("::1", true),
            ("10.0.0.1", false),
        ] {
            assert_eq!(
                config.server.allow.allows(ip.parse().unwrap()),
                allowed,
                "{ip}"
            );
        }
        let defaults = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert!(
            defaults.server.allow.is_open(),
            "no list: everyone, as before"
        );

        let errors = errors_of(&format!(
            "{MINIMAL}[server]\nallow = [\"10.0.0.0/8\", \"10.1.0.0/8\", \"example.com\"]\nmax_connections = 0\n\
             header_read_timeout = \"1ms\"\nmax_header_bytes = 100\n"
        ));
        assert_eq!(
            keys(&errors),
            [
                "server.allow",
                "server.max_connections",
                "server.header_read_timeout",
                "server.max_header_bytes"
            ]
        );
        let allow = errors[0].to_string();
        assert!(
            allow.contains("did you mean 10.0.0.0/8?") && allow.contains("\"example.com\""),
            "{allow}"
        );
    }

    #[test]
    fn userinfo_is_hidden_wherever_it_sits() {
        for (text, shown) in [
            ("http://u:p@host:1/x", "http://***@host:1/x"),
            ("https://a@b@host/", "https://***@host/"),
            (
                "s3://KEY:SECRET@bucket/path/x@y",
                "s3://***@bucket/path/x@y",
            ),
            ("minio:secret@127.0.0.1", "***@127.0.0.1"),
            ("http://host/p?u=a@b", "http://host/p?u=a@b"),
            ("s3://bucket/replica", "s3://bucket/replica"),
            ("", ""),
        ] {
            assert_eq!(without_userinfo(text), shown, "{text}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_db_url("postgres://zero:s3cret@db:5432/zero?sslmode=require"),
            "postgres://zero:REDACTED@db:5432/zero?sslmode=require"
        );
        assert_eq!(
            redact_db_url("postgres://db/zero?user=zero&password=s3cret"),
            "postgres://db/zero?user=zero&password=REDACTED"
        );
        assert_eq!(
            redact_db_url("host=db user=zero password=s3cret dbname=zero"),
            "host=db user=zero password=REDACTED dbname=zero"
        );
        let mut raw = from_toml_str(MINIMAL, Some(Default::default())).unwrap();
        raw.change_db.url = "postgres://zero:s3cret@db/zero".into();
        let shown = raw.to_redacted_toml();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
        assert!(!format!("{:?}", raw.validate().unwrap()).contains("s3cret"));
    }

    #[test]
    fn scraping_the_proxy_itself_is_refused() {
        let errors = errors_of(
            "[litestream]\nbackup_url = \"s3://b\"\nmetrics_url = \"http://localhost:4850/metrics\"\n\
             [discovery]\nmode = \"off\"\n",
        );
        assert_eq!(keys(&errors), ["litestream.metrics_url"]);
        let errors = errors_of(
            "[litestream]\nbackup_url = \"s3://b\"\nmetrics_url = \"https://x/metrics\"\nproxy_listen = \"4850\"\n\
             check_interval = \"500ms\"\n[cleanup]\nbatch_rows = 0\nreservations = \"pin\"\n\
             [discovery]\nadvertise_address = \"0.0.0.0:4851\"\n",
        );
        assert_eq!(
            keys(&errors),
            [
                "litestream.metrics_url",
                "litestream.check_interval",
                "litestream.proxy_listen",
                "cleanup.batch_rows",
                "discovery.advertise_address"
            ]
        );
    }

    #[test]
    fn reservation_mode_is_pin_or_pause() {
        let config = from_toml_str(
            &format!("{MINIMAL}[cleanup]\nreservations = \"pause\"\n"),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(config.cleanup.reservations, ReservationMode::Pause);
        let err = from_toml_str(
            &format!("{MINIMAL}[cleanup]\nreservations = \"stop\"\n"),
            Some(Default::default()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("stop"), "{err}");
    }

    #[test]
    fn without_subscribers_holds_unless_told_otherwise() {
        let parse = |extra: &str| {
            from_toml_str(&format!("{MINIMAL}{extra}"), Some(Default::default()))
                .map(|raw| raw.validate().unwrap().cleanup.without_subscribers)
        };
        assert_eq!(parse("").unwrap(), WithoutSubscribers::Hold);
        assert_eq!(
            parse("[cleanup]\nwithout_subscribers = \"after_grace\"\n").unwrap(),
            WithoutSubscribers::AfterGrace
        );
        let err = parse("[cleanup]\nwithout_subscribers = \"always\"\n").unwrap_err();
        assert!(err.to_string().contains("always"), "{err}");
    }

    #[test]
    fn reservation_mode_parses_lowercase_and_defaults_to_pin() {
        #[derive(Deserialize)]
        struct Cfg {
            reservations: ReservationMode,
        }
        let parse = |s: &str| toml::from_str::<Cfg>(s).map(|c| c.reservations);
        assert_eq!(
            parse(r#"reservations = "pin""#).unwrap(),
            ReservationMode::Pin
        );
        assert_eq!(
            parse(r#"reservations = "pause""#).unwrap(),
            ReservationMode::Pause
        );
        assert!(parse(r#"reservations = "Pause""#).is_err());
        assert_eq!(ReservationMode::default(), ReservationMode::Pin);
    }

    #[test]
    fn relay_defaults_suppress_zeros_cleanup() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert!(config.relay.suppress_upstream_cleanup);
        assert_eq!(config.upstream.address, "127.0.0.1:4849");
        assert_eq!(config.upstream.advertised_address, "127.0.0.1:4849");
        assert_eq!(config.upstream.silence_timeout, Duration::from_secs(33));
        assert_eq!(config.relay.max_buffered_bytes, 64 << 10);

        let env = [
            (
                "LITESTREAM_SIDECAR__RELAY__SUPPRESS_UPSTREAM_CLEANUP",
                "false",
            ),
            ("LITESTREAM_SIDECAR__RELAY__MAX_BUFFERED_BYTES", "131072"),
            ("LITESTREAM_SIDECAR__UPSTREAM__ADDRESS", "zero-rm:4849"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = from_toml_str(MINIMAL, Some(env))
            .unwrap()
            .validate()
            .unwrap();
        assert!(!config.relay.suppress_upstream_cleanup);
        assert_eq!(config.relay.max_buffered_bytes, 128 << 10);
        assert_eq!(config.upstream.address, "zero-rm:4849");
    }

    #[test]
    fn one_thread_and_no_ack_batching_by_default() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(config.server.worker_threads, 1);
        assert_eq!(config.relay.ack_batch_window, Duration::ZERO);
        assert_eq!(config.relay.ack_wakeup_bytes, 1024);
        assert_eq!(config.relay.ack_wakeup_wait, Duration::from_millis(20));

        let config = from_toml_str(
            &format!(
                "{MINIMAL}[server]\nworker_threads = 4\n[relay]\nack_batch_window = \"2ms\"\nack_wakeup_bytes = 0\n"
            ),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(config.server.worker_threads, 4);
        assert_eq!(config.relay.ack_batch_window, Duration::from_millis(2));
        assert_eq!(config.relay.ack_wakeup_bytes, 0);

        let errors = errors_of(&format!(
            "{MINIMAL}[server]\nworker_threads = 0\n[relay]\nack_batch_window = \"21ms\"\n"
        ));
        assert_eq!(
            keys(&errors),
            ["server.worker_threads", "relay.ack_batch_window"]
        );
        let errors = errors_of(&format!("{MINIMAL}[server]\nworker_threads = 257\n"));
        assert_eq!(keys(&errors), ["server.worker_threads"]);
    }

    #[test]
    fn peers_get_at_least_zeros_leniency_by_default() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        // Zero drops a client about 60 s after its last pong or message at worst (PROTOCOL.md §4.4).
        assert!(config.server.peer_timeout >= Duration::from_secs(60));
        assert!(config.server.peer_timeout > config.server.ping_interval);
        assert_eq!(config.relay.write_stall_timeout, Duration::from_secs(60));

        let parse = |extra: &str| {
            from_toml_str(&format!("{MINIMAL}{extra}"), Some(Default::default()))
                .unwrap()
                .validate()
        };
        let config = parse("[server]\nping_interval = \"1s\"\npeer_timeout = \"4s\"\n").unwrap();
        assert_eq!(config.server.peer_timeout, Duration::from_secs(4));
        for (ping, timeout) in [("10s", "10s"), ("10s", "5s"), ("1s", "500ms")] {
            let errors = errors_of(&format!(
                "{MINIMAL}[server]\nping_interval = \"{ping}\"\npeer_timeout = \"{timeout}\"\n"
            ));
            assert_eq!(keys(&errors), ["server.peer_timeout"], "{ping} {timeout}");
            assert!(
                errors[0]
                    .problem
                    .contains("longer than server.ping_interval"),
                "{}",
                errors[0]
            );
        }
        // A timeout shorter than the default ping interval is refused too, with nothing else set.
        assert_eq!(
            keys(&errors_of(&format!(
                "{MINIMAL}[server]\npeer_timeout = \"5s\"\n"
            ))),
            ["server.peer_timeout"]
        );
        assert_eq!(
            keys(&errors_of(&format!(
                "{MINIMAL}[relay]\nwrite_stall_timeout = \"0s\"\n"
            ))),
            ["relay.write_stall_timeout"]
        );
    }

    #[test]
    fn backup_verification_is_on_by_default_and_checked_clearly() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert!(config.backup.verify);
        assert_eq!(config.backup.slack, Duration::from_secs(60));
        assert_eq!(config.backup.stale_after, Duration::from_secs(900));
        assert_eq!(
            config.backup.location,
            Some(crate::litestream::destination::Location::S3 {
                bucket: "bucket".into(),
                prefix: "replica".into()
            })
        );
        let errors = errors_of(
            "[litestream]\nbackup_url = \"gcs://b/r\"\n[discovery]\nmode = \"off\"\n\
             [backup]\nendpoint = \"http://127.0.0.1:9000\"\nslack = \"5m\"\nstale_after = \"1m\"\n",
        );
        assert_eq!(
            keys(&errors),
            [
                "backup.stale_after",
                "litestream.backup_url",
                "backup.endpoint"
            ]
        );
        assert!(
            errors[1].problem.contains("backup.verify = false"),
            "{errors:?}"
        );
        assert!(errors[2].problem.contains("allow_http"), "{errors:?}");
        // Not verified, a gcs:// destination is fine; a loopback http endpoint needs allow_http.
        let ok = from_toml_str(
            "[litestream]\nbackup_url = \"gcs://b/r\"\n[discovery]\nmode = \"off\"\n\
             [backup]\nverify = false\nendpoint = \"http://127.0.0.1:9000/\"\nallow_http = true\n",
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(ok.backup.location, None);
        assert_eq!(
            ok.backup.s3.endpoint.as_deref(),
            Some("http://127.0.0.1:9000")
        );
    }

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn the_state_is_kept_by_default_in_systemds_state_directory_or_var_lib() {
        let path = std::path::PathBuf::from;
        assert_eq!(
            default_state_file(None),
            path("/var/lib/litestream-sidecar/state.json")
        );
        assert_eq!(
            default_state_file(Some("")),
            path("/var/lib/litestream-sidecar/state.json")
        );
        assert_eq!(
            default_state_file(Some("/run/state/sidecar")),
            path("/run/state/sidecar/state.json")
        );
        assert_eq!(
            default_state_file(Some("/var/lib/a:/var/lib/b")),
            path("/var/lib/a/state.json")
        );
        let cleanup = |text: &str| {
            from_toml_str(
                &format!("{MINIMAL}[cleanup]\n{text}"),
                Some(Default::default()),
            )
            .unwrap()
            .validate()
            .map(|c| c.cleanup)
        };
        // Opting out is explicit.
        assert_eq!(cleanup("state_file = \"none\"\n").unwrap().state_file, None);
        assert_eq!(
            cleanup("state_file = \"/srv/s.json\"\n")
                .unwrap()
                .state_file,
            Some(path("/srv/s.json"))
        );
        let defaults = cleanup("").unwrap();
        assert!(defaults.state_file.is_some());
        assert_eq!(defaults.restore_limit, RestoreLimit::Auto);
        assert_eq!(defaults.hold_without_state, RestoreLimit::Auto);
        let set = cleanup("restore_limit = \"3h\"\nhold_without_state = \"0s\"\n").unwrap();
        assert_eq!(
            set.restore_limit,
            RestoreLimit::Fixed(Duration::from_secs(3 * 3600))
        );
        assert_eq!(set.hold_without_state, RestoreLimit::Fixed(Duration::ZERO));
        let err = cleanup("restore_limit = \"soon\"\n").unwrap_err();
        assert!(
            format!("{err:?}").contains("cleanup.restore_limit"),
            "{err:?}"
        );
    }

    #[test]
    fn an_automatic_restore_limit_is_an_hour_per_50_gib_and_at_least_an_hour() {
        let hour = Duration::from_secs(3600);
        assert_eq!(RestoreLimit::Auto.for_size(None), hour);
        assert_eq!(RestoreLimit::Auto.for_size(Some(0)), hour);
        assert_eq!(RestoreLimit::Auto.for_size(Some(50 << 30)), hour);
        assert_eq!(RestoreLimit::Auto.for_size(Some((50 << 30) + 1)), 2 * hour);
        assert_eq!(RestoreLimit::Auto.for_size(Some(189 << 30)), 4 * hour);
        let fixed = RestoreLimit::Fixed(Duration::from_secs(90));
        assert_eq!(fixed.for_size(Some(1 << 40)), Duration::from_secs(90));
    }

    #[test]
    fn tls_is_off_by_default_and_its_files_come_in_pairs() {
        let config = from_toml_str(MINIMAL, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(config.server.tls, None);
        assert_eq!(config.upstream.tls, None);

        let both = format!(
            "{MINIMAL}[server]\ntls_cert_file = \" /etc/s/cert.pem \"\ntls_key_file = \"/etc/s/key.pem\"\n"
        );
        let config = from_toml_str(&both, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            config.server.tls,
            Some(ServerTlsFiles {
                cert_file: "/etc/s/cert.pem".into(),
                key_file: "/etc/s/key.pem".into(),
            })
        );
        let errors = errors_of(&format!(
            "{MINIMAL}[server]\ntls_key_file = \"/etc/s/key.pem\"\n"
        ));
        assert_eq!(keys(&errors), ["server.tls_cert_file"]);
        assert!(errors[0].problem.contains("tls_key_file"), "{errors:?}");
        let errors = errors_of(&format!(
            "{MINIMAL}[server]\ntls_cert_file = \"/etc/s/cert.pem\"\n"
        ));
        assert_eq!(keys(&errors), ["server.tls_key_file"]);
    }

    #[test]
    fn a_tls_listener_is_never_advertised_as_plain() {
        let tls = "[server]\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n";
        let with = |mode: &str, address: &str| {
            format!(
                "[litestream]\nbackup_url = \"s3://b/r\"\n{tls}[discovery]\nmode = \"{mode}\"\n\
                 advertise_address = \"{address}\"\n"
            )
        };
        for (mode, address) in [
            ("verify", "10.0.0.5:4851"),
            ("verify", "wss://sidecar.internal:4851"),
            ("adopt", "wss://10.0.0.5:4851"),
            ("owner", ""),
        ] {
            let text = with(mode, address);
            let result = from_toml_str(&text, Some(Default::default()))
                .unwrap()
                .validate();
            assert!(result.is_ok(), "{mode} {address}: {result:?}");
        }
        for (mode, address) in [
            ("verify", "ws://10.0.0.5:4851"),
            ("adopt", "10.0.0.5:4851"),
            ("adopt", "ws://10.0.0.5:4851"),
        ] {
            let errors = errors_of(&with(mode, address));
            assert_eq!(
                keys(&errors),
                ["discovery.advertise_address"],
                "{mode} {address}"
            );
            assert!(
                errors[0].problem.contains("wss://10.0.0.5:4851"),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn upstream_tls_names_the_address_host_unless_told_otherwise() {
        let tls = |extra: &str| {
            from_toml_str(
                &format!(
                    "{MINIMAL}[upstream]\naddress = \"rm.internal:4849\"\ntls = true\n{extra}"
                ),
                Some(Default::default()),
            )
            .unwrap()
            .validate()
        };
        let upstream = tls("").unwrap().upstream.tls.unwrap();
        assert_eq!(upstream.server_name.to_str(), "rm.internal");
        assert_eq!(upstream.ca_file, None);
        let upstream = tls("tls_ca_file = \"/etc/ca.pem\"\ntls_server_name = \"10.1.2.3\"\n")
            .unwrap()
            .upstream
            .tls
            .unwrap();
        assert_eq!(upstream.server_name.to_str(), "10.1.2.3");
        assert_eq!(upstream.ca_file, Some("/etc/ca.pem".into()));
        let upstream = from_toml_str(
            &format!("{MINIMAL}[upstream]\naddress = \"[::1]:4849\"\ntls = true\n"),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap()
        .upstream
        .tls
        .unwrap();
        assert_eq!(upstream.server_name.to_str(), "::1");

        let errors = errors_of(&format!(
            "{MINIMAL}[upstream]\ntls = true\ntls_server_name = \"not a name\"\n"
        ));
        assert_eq!(keys(&errors), ["upstream.tls_server_name"]);
        for key in ["tls_ca_file", "tls_server_name"] {
            let errors = errors_of(&format!("{MINIMAL}[upstream]\n{key} = \"x\"\n"));
            assert_eq!(keys(&errors), [format!("upstream.{key}")]);
            assert!(errors[0].problem.contains("upstream.tls = true"));
        }
    }
}
