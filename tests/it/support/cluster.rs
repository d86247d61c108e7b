//! A PostgreSQL cluster of one test's own, for faults that would disturb every other test on the shared server:
//! restarts and outages. Built from the server binaries `scripts/with-postgres.sh` names in `SIDECAR_TEST_PG_BIN`,
//! with that script's options (a temp directory, a free port on 127.0.0.1, `wal_level=logical`, `fsync=off`), run
//! as the `postgres` user when the tests run as root (PostgreSQL refuses root).
//!
//! The cluster is stopped (`-m immediate`) and its directory removed when the value drops, also when the test
//! panics, so nothing is left running behind a failed case.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub const BIN_ENV: &str = "SIDECAR_TEST_PG_BIN";

/// How long one `initdb` or `pg_ctl` may take before the test fails: a hang guard, not a timing assertion.
const COMMAND_GUARD: Duration = Duration::from_secs(120);

pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    /// Initialises a cluster in a fresh temp directory and starts it.
    pub async fn start() -> Cluster {
        let bin = PathBuf::from(std::env::var(BIN_ENV).unwrap_or_else(|_| {
            panic!(
                "{BIN_ENV} is not set: these tests run PostgreSQL clusters of their own. Run them as \
                 `scripts/with-postgres.sh cargo test --test it -- pg::`."
            )
        }));
        let dir = tempfile::Builder::new()
            .prefix("sidecar-cluster.")
            .tempdir()
            .expect("a temp directory for the cluster");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if running_as_root() {
            let chown = std::process::Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(chown.success(), "chown postgres {}", dir.path().display());
        }
        let cluster = Cluster {
            bin,
            dir,
            port: free_port(),
        };
        let data = cluster.data();
        cluster
            .run(
                "initdb",
                &[
                    "-D",
                    path(&data),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ],
            )
            .await;
        cluster.start_again().await;
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn server_log(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn server_options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c wal_level=logical -c max_connections=200",
            self.port,
            self.dir.path().display()
        )
    }

    /// `postgres://postgres@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn pg_config(&self) -> tokio_postgres::Config {
        self.url().parse().unwrap()
    }

    /// Starts the stopped cluster and waits until it accepts connections.
    pub async fn start_again(&self) {
        let (data, log, options) = (self.data(), self.server_log(), self.server_options());
        self.run(
            "pg_ctl",
            &[
                "-D",
                path(&data),
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        )
        .await;
    }

    /// `pg_ctl stop -m fast`: every session is terminated, the server checkpoints and exits; returns once it has.
    pub async fn stop(&self) {
        let data = self.data();
        self.run(
            "pg_ctl",
            &["-D", path(&data), "-m", "fast", "-w", "-t", "60", "stop"],
        )
        .await;
    }

    /// `pg_ctl restart -m fast`: every session is terminated, and the server is back (on the same port) when this
    /// returns.
    pub async fn restart_fast(&self) {
        let (data, log, options) = (self.data(), self.server_log(), self.server_options());
        self.run(
            "pg_ctl",
            &[
                "-D",
                path(&data),
                "-l",
                path(&log),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "restart",
            ],
        )
        .await;
    }

    /// The command line for one of the server's programs, as the `postgres` user when running as root.
    fn command(&self, program: &str, args: &[&str]) -> tokio::process::Command {
        let program = self.bin.join(program);
        let mut command = if running_as_root() {
            let mut c = tokio::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            tokio::process::Command::new(program)
        };
        command.args(args).current_dir(self.dir.path());
        command
    }

    /// Runs `program` to completion; panics with its output and the server log when it fails. Asynchronous, so the
    /// sidecar under test keeps running on the test's runtime meanwhile.
    async fn run(&self, program: &str, args: &[&str]) {
        let mut command = self.command(program, args);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let output = tokio::time::timeout(COMMAND_GUARD, command.output())
            .await
            .unwrap_or_else(|_| panic!("{program} {args:?} hung"))
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        if !output.status.success() {
            panic!(
                "{program} {args:?} failed ({}):\n{}{}\nserver log:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                std::fs::read_to_string(self.server_log()).unwrap_or_default()
            );
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

impl Drop for Cluster {
    /// Stops the server at once, whatever state it is in; the temp directory is removed after.
    fn drop(&mut self) {
        let data = self.data();
        let mut command = if running_as_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"));
            c
        } else {
            std::process::Command::new(self.bin.join("pg_ctl"))
        };
        let _ = command
            .args([
                "-D",
                path(&data),
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
                "stop",
            ])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
