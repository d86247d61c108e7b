//! The built binary run as operators run it (a config file, JSON logs on stderr), for cases that need a real
//! process: one that can be killed with SIGKILL, whose sockets and database sessions die with it.
//!
//! With `SIDECAR_IMAGE` set (`make test-image`), the same cases run the container image instead, under podman with
//! runc, on the host's network, with a read-only root filesystem: the config's directory is mounted at the same
//! path and is the state's volume, owned by the image's user.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_litestream-sidecar");

/// The image's user and group (the Dockerfile's and scripts/image.sh's).
const IMAGE_USER: &str = "65532:65532";

/// The container image the processes run as, when the tests are asked to (`SIDECAR_IMAGE`).
fn image() -> Option<String> {
    std::env::var("SIDECAR_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Names the containers of one test run apart.
static CONTAINERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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

/// One run of the sidecar binary, or of its container image.
pub struct Process {
    /// The binary, or the `podman run` that runs the container in the foreground.
    pub child: Reaped,
    /// The container's name, when the image runs: signals go to it, and it is removed with the guard.
    container: Option<String>,
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
        let mut vars = vec![
            ("STATE_DIRECTORY", dir.to_str().expect("a UTF-8 path")),
            ("LITESTREAM_SIDECAR__CLEANUP__HOLD_WITHOUT_STATE", "0s"),
        ];
        vars.extend_from_slice(env);
        let (mut command, container) = match image() {
            None => {
                let mut command = Command::new(BIN);
                command
                    .arg("--config")
                    .arg(config)
                    .env_clear()
                    .envs(vars.iter().copied());
                (command, None)
            }
            Some(image) => {
                let name = format!(
                    "litestream-sidecar-test-{}-{}",
                    std::process::id(),
                    CONTAINERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                let owned = Command::new("chown")
                    .args(["-R", IMAGE_USER])
                    .arg(dir)
                    .status()
                    .expect("chown");
                assert!(owned.success(), "chown {}", dir.display());
                let mut command = Command::new("podman");
                let volume = format!("{0}:{0}", dir.display());
                command.args([
                    "run",
                    "--rm",
                    "--name",
                    &name,
                    "--runtime",
                    "runc",
                    "--network",
                    "host",
                    "--read-only",
                    // The image's health check is run by the tests (`podman healthcheck run`), not on podman's
                    // timer: this machine has no systemd to schedule it.
                    "--health-interval",
                    "disable",
                    // A process may not raise its own limits here: runc is given them.
                    "--ulimit",
                    "nofile=1024:1024",
                    "--ulimit",
                    "nproc=1024:1024",
                    "--volume",
                    &volume,
                ]);
                // The config by the environment, not by an argument: the image's health check reads it too. It
                // finds the daemon at `server.listen`, so that is a free port rather than the tests' port 0.
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|listener| listener.local_addr())
                    .expect("a free port")
                    .port();
                command
                    .arg("--env")
                    .arg(format!("LITESTREAM_SIDECAR_CONFIG={}", config.display()))
                    .arg("--env")
                    .arg(format!(
                        "LITESTREAM_SIDECAR__SERVER__LISTEN=127.0.0.1:{port}"
                    ));
                for (key, value) in &vars {
                    command.arg("--env").arg(format!("{key}={value}"));
                }
                command.arg(&image);
                (command, Some(name))
            }
        };
        let mut child = Reaped(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the sidecar"),
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
        // A container takes longer to start than the binary.
        let addr = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("the sidecar listens within 30s")
            .unwrap_or_else(|_| panic!("the sidecar exited before listening"));
        Process {
            child,
            container,
            addr: addr.parse().expect("the logged address"),
            logs,
        }
    }

    /// `kill -9`: no shutdown, no drain, nothing written after it.
    pub fn kill(&mut self) {
        if self.container.is_some() {
            self.signal("KILL");
        }
        self.child.kill();
    }

    /// `kill -TERM`: the shutdown operators (and systemd, and container engines) ask for.
    pub fn terminate(&mut self) {
        self.signal("TERM");
    }

    /// `kill -STOP`: frozen, its sockets and database sessions open but silent, until [`Process::thaw`].
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// `kill -CONT` after [`Process::freeze`].
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let status = match &self.container {
            None => Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(self.child.id().to_string())
                .status(),
            Some(name) => Command::new("podman")
                .args(["kill", "--signal", signal, name])
                .stdout(Stdio::null())
                .status(),
        };
        assert!(status.expect("send a signal").success(), "SIG{signal}");
    }

    /// The exit code, once the process (or container) has exited within `timeout`; `None` if it has not.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.0.try_wait().expect("wait") {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The health check a supervisor would run: `litestream-sidecar ready` beside the binary, the image's own
    /// `HEALTHCHECK` in the container.
    pub fn healthy(&self) -> bool {
        let status = match &self.container {
            None => Command::new(BIN)
                .args(["ready", "--addr", &self.addr.to_string()])
                .stdout(Stdio::null())
                .status(),
            Some(name) => Command::new("podman")
                .args(["healthcheck", "run", name])
                .stdout(Stdio::null())
                .status(),
        };
        status.expect("run the health check").success()
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

    /// Waits until the process has logged `message` at least `count` times, and returns the latest such event: for
    /// tests of what a line says (an operator is told X), never to learn that something happened, which `/status`
    /// or `/metrics` says ([`Process::wait_for_status`]). The log is read from stderr by a thread of its own, so a
    /// line can come after what the process served: a test that saw the effect waits here for the line rather than
    /// reading [`Process::logged`] at once.
    pub async fn wait_logged(&self, message: &str, count: usize) -> serde_json::Value {
        let what = format!("{count} log lines {message:?}");
        super::eventually(&what, || self.logged(message).len() >= count).await;
        self.logged(message).pop().expect("waited for it")
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
        super::status_at(self.addr).await
    }

    /// Polls `/status` until `check` holds of it, and returns that document ([`super::until`]).
    pub async fn wait_for_status(
        &self,
        what: &str,
        guard: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        super::wait_for_status(self.addr, what, guard, check).await
    }

    /// `GET /metrics`.
    pub async fn metrics(&self) -> String {
        let (status, page) = super::http(self.addr, "GET", "/metrics").await;
        assert_eq!(status, 200, "{page}");
        page
    }

    /// Polls `/metrics` until `check` holds of the page, and returns that page ([`super::until`]).
    pub async fn wait_for_metrics(
        &self,
        what: &str,
        guard: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        super::until(what, guard, || self.metrics(), |page: &String| check(page)).await
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Also when the test failed first: no container is left behind.
        if let Some(name) = &self.container {
            let _ = Command::new("podman")
                .args(["rm", "--force", "--time", "0", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The value of the first sample of `series` (the metric name with its labels, if any) on a metrics page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}
