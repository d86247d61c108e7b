//! Shared bench helpers: the release binary as a child process, its resident memory, percentiles, the report.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One printed line: what was measured, the figure, and the target it is held against.
pub struct Row {
    pub name: String,
    pub value: String,
    pub target: String,
    pub ok: Option<bool>,
}

#[derive(Default)]
pub struct Report {
    rows: Vec<Row>,
}

impl Report {
    pub fn add(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
        target: impl Into<String>,
        ok: Option<bool>,
    ) {
        let row = Row {
            name: name.into(),
            value: value.into(),
            target: target.into(),
            ok,
        };
        println!("  {:<62} {:>16}   {}", row.name, row.value, row.target);
        self.rows.push(row);
    }

    pub fn print(&self) {
        println!();
        println!("{:<64} {:>16}   target", "benchmark", "figure");
        println!("{}", "-".repeat(110));
        for row in &self.rows {
            let flag = match row.ok {
                Some(true) => "ok",
                Some(false) => "OUTSIDE TARGET",
                None => "",
            };
            println!(
                "{:<64} {:>16}   {:<22} {}",
                row.name, row.value, row.target, flag
            );
        }
    }
}

pub fn release_binary() -> PathBuf {
    // Another build to measure, such as the last release's, for a comparison run by run.
    if let Some(binary) = std::env::var_os("BENCH_SIDECAR_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(binary);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--quiet",
            "--bin",
            "litestream-sidecar",
        ])
        .current_dir(root)
        .status()
        .expect("cargo build");
    assert!(status.success(), "building the release binary failed");
    // This bench runs from `<target>/release/examples/`, whatever the target directory is.
    let exe = std::env::current_exe().expect("the bench's own path");
    exe.parent()
        .and_then(Path::parent)
        .map(|release| release.join("litestream-sidecar"))
        .expect("the bench runs from <target>/release/examples")
}

/// The sidecar binary running with a config; killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts the release binary with `config`, in which `{addr}` stands for a free loopback address.
    pub fn start(config: &str) -> Daemon {
        Self::start_binary(&release_binary(), config)
    }

    /// Starts another build of the sidecar, `binary`, with `config` as in [`Daemon::start`].
    pub fn start_binary(binary: &Path, config: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.toml");
        let addr = free_addr();
        std::fs::write(&path, config.replace("{addr}", &addr)).unwrap();
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&path)
            // Each daemon its own state, gone with it: the default path is the host's, shared by every run.
            .env(
                "LITESTREAM_SIDECAR__CLEANUP__STATE_FILE",
                dir.path().join("state.json"),
            )
            .env(
                "RUST_LOG",
                std::env::var("BENCH_RUST_LOG").unwrap_or("warn,litestream_sidecar=info".into()),
            )
            // Statuses go out once their reservation's slot has committed: each daemon its own shard of the
            // bench's throwaway server (`make bench` starts it), so that no two share slots.
            .envs(
                std::env::var("SIDECAR_TEST_DATABASE_URL")
                    .ok()
                    .map(|url| ("LITESTREAM_SIDECAR__CHANGE_DB__URL".to_string(), url)),
            )
            .env(
                "LITESTREAM_SIDECAR__ZERO__APP_ID",
                format!(
                    "bench_{}_{}",
                    std::process::id(),
                    addr.replace(['.', ':'], "_")
                ),
            )
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the sidecar");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        // Keep draining the log so the sidecar never blocks on a full pipe; keep the start for error reports.
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let show = std::env::var_os("BENCH_SHOW_LOG").is_some();
                for line in stderr.lines().map_while(Result::ok) {
                    if show {
                        eprintln!("sidecar: {line}");
                    }
                    let mut log = log.lock().unwrap();
                    if log.len() < 50 {
                        log.push(line);
                    }
                }
            });
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || std::time::Instant::now() > deadline {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "sidecar did not start listening ({exited:?}):\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Resident memory in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        rss_kib_of(self.child.id())
    }
}

/// Resident memory of process `pid` in KiB (VmRSS).
pub fn rss_kib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// CPU time `pid` has spent in user space, its own code (`utime`). The rest of [`cpu_time_of`] is the kernel's work
/// on its behalf, which on loopback includes the receiving side's TCP processing of every segment it sends.
pub fn user_time_of(pid: u32) -> Duration {
    stat_ticks(pid, &[UTIME])
}

/// CPU time process `pid` has used so far, user and system: the scheduler's nanosecond run time of each of its
/// threads, or, where the kernel does not keep it, the clock ticks of 10 ms (too coarse for short runs).
pub fn cpu_time_of(pid: u32) -> Duration {
    let run_time = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .map(|stat| {
            stat.split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
        })
        .sum::<Option<u64>>();
    if let Some(ns) = run_time.filter(|ns| *ns > 0) {
        return Duration::from_nanos(ns);
    }
    stat_ticks(pid, &[UTIME, STIME])
}

/// `utime` and `stime` among the fields of `/proc/PID/stat` after the command name.
const UTIME: usize = 11;
const STIME: usize = 12;

/// The sum of `fields` of `/proc/PID/stat`, in clock ticks of 10 ms. The kernel splits the scheduler's exact run
/// time by its tick samples, so over seconds the split is exact enough; 0 for a process that is gone.
fn stat_ticks(pid: u32, fields: &[usize]) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let after: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields
        .iter()
        .filter_map(|&i| after.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address no one listens on right now.
pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Stands in for litestream's metrics page (the Zero fork cannot run here): the real fork page, served on
/// loopback to every request. Returns the config keys that point the sidecar at it, for its `[litestream]`
/// section, with `[backup] verify = false` to follow (nothing serves the backup URL): reservations get their
/// status only once a backup is known.
pub async fn litestream_stand_in() -> String {
    const PAGE: &str = include_str!("../../tests/fixtures/litestream/zero-fork.prom");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{PAGE}",
                    PAGE.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    format!("metrics_url = \"http://{addr}/metrics\"\ncheck_interval = \"1s\"\n")
}

/// `[litestream]` and `[backup]` for a bench sidecar whose reservations get their status at once: call with the
/// result of [`litestream_stand_in`].
pub fn served(litestream: &str) -> String {
    format!(
        "[litestream]\nbackup_url = \"s3://bench/replica\"\nproxy_listen = \"127.0.0.1:0\"\n{litestream}\
         [backup]\nverify = false\n"
    )
}

/// Waits until a reservation on `addr` gets its status: the first scrape of litestream has happened.
pub async fn wait_for_status(addr: &str) {
    use futures_util::StreamExt;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let url = format!("ws://{addr}/replication/v3/snapshot?taskID=warm-up");
        if let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await {
            if let Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(_)))) =
                tokio::time::timeout(Duration::from_millis(500), ws.next()).await
            {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no status within 20 s"
        );
    }
}

/// Zero's change DB tables for `zero`'s shard, empty but for their one row each: the replica version and the owner
/// (`owner_address`, or none).
pub async fn create_zero_tables(
    client: &tokio_postgres::Client,
    zero: &litestream_sidecar::protocol::shard::ZeroConfig,
    replica_version: &str,
    owner_address: Option<&str>,
) {
    let schema = format!("\"{}\"", zero.cdc_schema());
    let owner = owner_address.map_or("NULL".to_string(), |a| format!("'{a}'"));
    client
        .batch_execute(&format!(
            r#"
            CREATE SCHEMA {schema};
            CREATE TABLE {schema}."changeLog" (
              watermark TEXT, pos INT8, change JSON NOT NULL, precommit TEXT, PRIMARY KEY (watermark, pos)
            );
            CREATE TABLE {schema}."replicationState" (
              "lastWatermark" TEXT NOT NULL, "owner" TEXT, "ownerAddress" TEXT,
              "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            CREATE TABLE {schema}."replicationConfig" (
              "replicaVersion" TEXT NOT NULL, "publications" TEXT[] NOT NULL, "resetRequired" BOOL,
              "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            INSERT INTO {schema}."replicationConfig" ("replicaVersion", "publications")
              VALUES ('{replica_version}', ARRAY['_zero_public_0']);
            INSERT INTO {schema}."replicationState" ("lastWatermark", "owner", "ownerAddress")
              VALUES ('{replica_version}', 'rm-task-1', {owner});
            "#
        ))
        .await
        .expect("create the change DB schema");
}
