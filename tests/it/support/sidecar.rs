//! The sidecar itself, in this process: the test config (loopback listeners on free ports, nothing behind the
//! change DB or litestream unless a test puts a stand-in there), starting and stopping it, and what its snapshot
//! statuses say under that config.

use super::*;

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

    /// How `run` ended by itself (it does only when it cannot start); the timeout only guards against a hang.
    pub async fn ended(self) -> Result<(), litestream_sidecar::Error> {
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("run did not end by itself")
            .expect("run panicked")
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}
