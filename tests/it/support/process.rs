//! The built binary run as operators run it (a config file, JSON logs on stderr), for cases that need a real
//! process: one that can be killed with SIGKILL, whose sockets and database sessions die with it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_litestream-sidecar");

/// A child process killed (SIGKILL) and reaped when the guard is dropped, also when the test fails first: no test
/// leaves a process behind.
pub struct Reaped(pub Child);

impl Reaped {
    /// SIGKILL, then waits for the exit: nothing of the process runs afterwards.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.kill();
        }
    }
}

/// One run of the sidecar binary.
pub struct Process {
    pub child: Reaped,
    /// Where it serves (`server.listen` is `127.0.0.1:0` in tests; the log names the port).
    pub addr: SocketAddr,
    /// Every log line so far, parsed (a line that is not JSON is kept as `{"message": line}`).
    logs: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Process {
    /// Starts the binary with `config` (a TOML file; `[log] format = "json"` is expected) and an empty environment,
    /// and waits until it listens.
    pub async fn spawn(config: &Path) -> Process {
        Self::spawn_with_env(config, &[]).await
    }

    /// [`Process::spawn`] with these environment variables (and no others but the state's: systemd's
    /// `STATE_DIRECTORY` is the config file's directory, so the state file is where it is by default and survives
    /// a restart of the process, and a first start holds no cleanup for restores it cannot know of; `env` may say
    /// otherwise).
    pub async fn spawn_with_env(config: &Path, env: &[(&str, &str)]) -> Process {
        let dir = config.parent().expect("the config is in a directory");
        let mut child = Reaped(
            Command::new(BIN)
                .arg("--config")
                .arg(config)
                .env_clear()
                .env("STATE_DIRECTORY", dir)
                .env("LITESTREAM_SIDECAR__CLEANUP__HOLD_WITHOUT_STATE", "0s")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the sidecar binary"),
        );
        let stderr = child.0.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let event: serde_json::Value = serde_json::from_str(&line)
                        .unwrap_or_else(|_| serde_json::json!({ "message": line }));
                    if event["message"] == "listening" {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(event["addr"].as_str().unwrap_or_default().to_string());
                        }
                    }
                    logs.lock().unwrap().push(event);
                }
            });
        }
        let addr = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("the sidecar listens within 10s")
            .unwrap_or_else(|_| panic!("the sidecar exited before listening"));
        Process {
            child,
            addr: addr.parse().expect("the logged address"),
            logs,
        }
    }

    /// `kill -9`: no shutdown, no drain, nothing written after it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// The log events with this message so far.
    pub fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["message"] == message)
            .cloned()
            .collect()
    }

    /// Every log line so far, for failure messages.
    pub fn log_text(&self) -> String {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .map(|e| format!("{e}\n"))
            .collect()
    }

    /// `GET /status`, parsed.
    pub async fn status(&self) -> serde_json::Value {
        let (status, body) = super::http(self.addr, "GET", "/status").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("/status is JSON")
    }

    /// `GET /metrics`.
    pub async fn metrics(&self) -> String {
        let (status, page) = super::http(self.addr, "GET", "/metrics").await;
        assert_eq!(status, 200, "{page}");
        page
    }
}

/// The value of the first sample of `series` (the metric name with its labels, if any) on a metrics page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}
