//! Test harness: the real sidecar on 127.0.0.1:0 (here: its config, start, waits and the facts tests read), and, a
//! file each, what it talks to, by what each stands in for: view-syncers (`clients`), Zero's change-streamer
//! behind the relay (`upstream`), litestream's metrics page with the fork's gauge (`gauge`), the real litestream
//! and its destination (`litestream`), an S3 server (`moto`), PostgreSQL (`pg`, `cluster`), and the sidecar's
//! own process (`process`).

pub mod cluster;
pub mod litestream;
pub mod moto;
pub mod pg;
pub mod process;

mod clients;
mod gauge;
mod upstream;

pub use clients::*;
pub use gauge::*;
pub use upstream::*;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use litestream_sidecar::cleanup::reservations::Registry;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::cleanup::subscribers::Subscribers;
use litestream_sidecar::cleanup::Decision;
use litestream_sidecar::protocol::Mode;
use litestream_sidecar::{config, App, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

pub const BACKUP_URL: &str = "s3://acme-zero/replica";

/// The snapshot status a v3 reservation gets first, with the test config's [`BACKUP_URL`].
pub const V3_STATUS: &str =
    r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#;

/// The v4 status up to `minWatermark`'s value; the test schema's replica version is `lexi(1000)` = `1rs`.
pub const V4_STATUS: &str = r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica","replicaVersion":"1rs","minWatermark":"#;

/// The replica size [`progress_page`]'s `litestream_db_size` gives, as a v4+ status carries it.
pub const REPLICA_SIZE: &str = r#","replicaSize":12288"#;

/// The whole v4+ status for the test schema with `min_watermark`, from a page made by [`progress_page`].
pub fn v4_status(min_watermark: &str) -> String {
    format!("{V4_STATUS}\"{min_watermark}\"{REPLICA_SIZE}}}]}}")
}

/// The whole v4+ status for the test schema with `min_watermark`, the replica's size unknown (no litestream page).
pub fn v4_status_unsized(min_watermark: &str) -> String {
    format!("{V4_STATUS}\"{min_watermark}\"}}]}}")
}

/// The status message a stand-in upstream sends first (in Zero's msg-first frame: [`UpstreamConn::send_msg`]).
pub const UPSTREAM_STATUS: &str = r#"["status",{"tag":"status"}]"#;

/// The default config's litestream: nothing listens there (port 9, discard).
pub const NO_LITESTREAM: &str = "http://127.0.0.1:9/metrics";

/// A config for tests: loopback listeners on free ports, `extra` (TOML) merged over it. Claims are not checked
/// against the destination (`backup.verify = false`: nothing serves [`BACKUP_URL`]); the tests of that turn it on.
pub fn config(extra: &str) -> Config {
    let base = format!(
        "[litestream]\nbackup_url = \"{BACKUP_URL}\"\nproxy_listen = \"127.0.0.1:0\"\n\
         metrics_url = \"{NO_LITESTREAM}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [change_db]\nurl = \"{NO_CHANGE_DB}\"\n[discovery]\nmode = \"off\"\n\
         [backup]\nverify = false\n[cleanup]\nstate_file = \"none\"\nhold_without_state = \"0s\"\n"
    );
    let mut merged: toml::Table = base.parse().unwrap();
    let extra: toml::Table = extra.parse().expect("extra config is TOML");
    for (section, values) in extra {
        let target = merged
            .entry(section)
            .or_insert_with(|| toml::Value::Table(Default::default()));
        for (key, value) in values.as_table().expect("extra config has sections") {
            target
                .as_table_mut()
                .unwrap()
                .insert(key.clone(), value.clone());
        }
    }
    config::from_toml_str(&toml::to_string(&merged).unwrap(), Some(Default::default()))
        .expect("test config parses")
        .validate()
        .expect("test config is valid")
}

pub struct Sidecar {
    pub addr: SocketAddr,
    pub proxy_addr: SocketAddr,
    pub registry: Registry,
    pub subscribers: Subscribers,
    pub status: litestream_sidecar::cleanup::status::StatusHandle,
    pub discovery: litestream_sidecar::cleanup::discovery::StateHandle,
    pub protocols: litestream_sidecar::streamer::protocols::UpstreamProtocols,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), litestream_sidecar::Error>>,
}

pub async fn start(config: Config) -> Sidecar {
    start_app(App::new(config)).await
}

/// The change DB of [`config`]: nothing listens there.
const NO_CHANGE_DB: &str = "postgres://nobody@127.0.0.1:9/none";
const NO_CHANGE_DB_PORTS: &[u16] = &[9];

/// Starts a sidecar that behaves as if it had been up for `ago` already (the cleanup delay counts from start).
pub async fn start_aged(config: Config, ago: Duration) -> Sidecar {
    let started = tokio::time::Instant::now()
        .checked_sub(ago)
        .expect("the clock goes back that far");
    start_app(App::new(config).started_at(started)).await
}

/// The watermark a sidecar without a litestream stand-in starts out knowing as backed up: statuses are withheld
/// until a backup is known, and most tests are not about that. It is the test schema's replica version
/// (`lexi(1000)`), at or above every watermark those tests write, as a backup is at or above the change log's
/// oldest row: a status waits while the log starts past the newest backup.
pub const SEEDED_BACKUP: &str = "1rs";

pub async fn start_app(app: App) -> Sidecar {
    // Without a change DB no reservation's row can commit: tests of the protocol alone let statuses go out.
    let app = if app.config().change_db.url.get_ports() == NO_CHANGE_DB_PORTS {
        app.statuses_without_slots()
    } else {
        app
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = app.registry().clone();
    if app.config().litestream.metrics_url == NO_LITESTREAM {
        registry.saw_backup(SEEDED_BACKUP);
    }
    let subscribers = app.subscribers().clone();
    let status = app.status().clone();
    let discovery = app.discovery().clone();
    let protocols = app.protocols().clone();
    let proxy = app.bind_proxy().await.expect("metrics proxy binds");
    let proxy_addr = proxy[0].local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(listener, proxy, shutdown.clone()));
    Sidecar {
        addr,
        proxy_addr,
        registry,
        subscribers,
        status,
        discovery,
        protocols,
        shutdown,
        task,
    }
}

impl Sidecar {
    pub fn url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    pub fn snapshot_url(&self, task_id: &str) -> String {
        self.url(&format!("/replication/v3/snapshot?taskID={task_id}"))
    }

    /// Cancels and waits for a clean exit; the timeout only guards against a hang.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(15), self.task).await;
        result
            .expect("shutdown hung")
            .expect("run panicked")
            .expect("run failed");
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// Polls `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually_async<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(what, Duration::from_secs(20), check).await;
}

/// [`eventually_async`] with a guard of its own, for waits that include a reconnect's backoff or a start-up hold.
pub async fn within<F, Fut>(what: &str, guard: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + guard;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// LexiVersion of `n` (docs/protocol.md, "Watermarks"): base 36 with a length prefix, so byte order is numeric order.
pub fn lexi(n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    let mut rest = n;
    loop {
        digits.push(DIGITS[(rest % 36) as usize]);
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(DIGITS[digits.len() - 1]);
    digits.reverse();
    String::from_utf8(digits).unwrap()
}

/// A subscriber in serving mode at `watermark`, of no task, as the relay registers it.
pub fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: id.into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "1rs".into(),
        watermark: watermark.into(),
    }
}

/// The monitor's decision once it has checked `ticks` more times.
pub async fn decisions(sidecar: &Sidecar, ticks: u64) -> Decision {
    let target = sidecar.status.get().checks + ticks;
    eventually("monitor checks", || sidecar.status.get().checks >= target).await;
    sidecar.status.get().last_decision.expect("a decision")
}

/// Waits until the monitor decides `expected`, then asserts that the next check decides it again: a settled state,
/// never one read in passing. After a purge whose rows were seen gone, a fixed number of checks is not enough: the
/// purging check may still be finishing, and a purge that stopped early (its gauge or ceiling moved between
/// batches) is decided again by the next check even when nothing is left to delete.
pub async fn settles_on(sidecar: &Sidecar, expected: Decision) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let decision = decisions(sidecar, 1).await;
        if decision == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the decision {expected:?}; the last was {decision:?}"
        );
    }
    assert_eq!(decisions(sidecar, 1).await, expected, "a check later");
}

/// A backup time `secs` seconds ago, for metrics pages.
pub fn seconds_ago(secs: f64) -> f64 {
    epoch_now() - secs
}

/// Backed up two minutes ago: older than the 30 s minimum cleanup delay.
pub fn aged() -> f64 {
    seconds_ago(120.0)
}

/// Now as epoch seconds, for backup times in metrics pages.
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `GET /metrics`, parsed.
pub async fn scrape(sidecar: &Sidecar) -> prometheus_parse::Scrape {
    let (status, body) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("a metrics page")
}

/// The value of `name`'s first sample (with `label`, if given); a histogram's count.
pub fn value(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref buckets) => {
                buckets.last().map_or(0.0, |b| b.count)
            }
            ref other => panic!("{name}: {other:?}"),
        })
}
