//! The real binary: arguments, config errors and exit codes, signals, and the systemd unit.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_litestream-sidecar");

fn run(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        output.status.code().expect("exited normally"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn version_and_help() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, _) = run(&["--version"], dir.path(), &[]);
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!("litestream-sidecar {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, out, _) = run(&["--help"], dir.path(), &[]);
    assert_eq!(code, 0);
    for needle in [
        "--config",
        "--check-config",
        "LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL",
    ] {
        assert!(out.contains(needle), "help lacks {needle}:\n{out}");
    }
    let (code, _, err) = run(&["--bogus"], dir.path(), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("--bogus"), "{err}");
}

#[test]
fn check_config_prints_the_effective_config_without_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "sidecar.toml",
        "[litestream]\nbackup_url = \"s3://bucket/replica\"\n[change_db]\nurl = \"postgres://zero:hunter2@db:5432/zero\"\n\
         [discovery]\nadvertise_address = \"10.0.0.5:4851\"\n",
    );
    let (code, out, err) = run(
        &["--config", &path, "--check-config"],
        dir.path(),
        &[("LITESTREAM_SIDECAR__ZERO__SHARD_NUM", "7")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("hunter2"), "{out}");
    assert!(
        out.contains("postgres://zero:REDACTED@db:5432/zero"),
        "{out}"
    );
    assert!(
        out.contains("backup_url = \"s3://bucket/replica\""),
        "{out}"
    );
    assert!(out.contains("shard_num = 7"), "{out}");
    assert!(
        out.contains("ping_interval = \"10s\""),
        "defaults are shown:\n{out}"
    );
}

#[test]
fn check_config_reports_every_error_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "bad.toml",
        "[server]\nlisten = \"nowhere\"\nping_interval = \"1 fortnight\"\n[zero]\napp_id = \"My App\"\n",
    );
    let (code, out, err) = run(&["--config", &path, "--check-config"], dir.path(), &[]);
    assert_eq!(code, 2);
    assert!(out.is_empty(), "{out}");
    for key in [
        "server.listen",
        "server.ping_interval",
        "litestream.backup_url",
        "zero.app_id",
    ] {
        assert!(err.contains(key), "missing {key} in:\n{err}");
    }
    assert!(err.contains("^[a-z0-9_]+$"), "{err}");

    // Environment overrides are validated the same way.
    let good = write(
        dir.path(),
        "good.toml",
        "[litestream]\nbackup_url = \"s3://b/r\"\n",
    );
    let (code, _, err) = run(
        &["--config", &good, "--check-config"],
        dir.path(),
        &[("LITESTREAM_SIDECAR__ZERO__SHARD_NUM", "-4")],
    );
    assert_eq!(code, 2);
    assert!(err.contains("zero.shard_num"), "{err}");

    // Unknown keys and unreadable files name the problem.
    let typo = write(
        dir.path(),
        "typo.toml",
        "[litestream]\nbackup_url = \"s3://b/r\"\nbakup = 1\n",
    );
    let (code, _, err) = run(&["--config", &typo, "--check-config"], dir.path(), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("bakup"), "{err}");
    let (code, _, err) = run(
        &["--config", "/nonexistent/sidecar.toml", "--check-config"],
        dir.path(),
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/sidecar.toml"), "{err}");
}

/// What the components would refuse once running is refused with the config: a process that stays up without
/// listening is worse than one that exits.
#[test]
fn a_metrics_url_the_scraper_refuses_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "creds.toml",
        "[litestream]\nbackup_url = \"s3://b/r\"\nmetrics_url = \"http://admin:s3cret@127.0.0.1:4860/metrics\"\n\
         [discovery]\nmode = \"off\"\n",
    );
    let (code, out, err) = run(&["--config", &path, "--check-config"], dir.path(), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("litestream.metrics_url") && err.contains("credentials"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    let (code, _, err) = run(&["--config", &path], dir.path(), &[]);
    assert_eq!(code, 78, "{err}");
}

/// `run` refuses to start rather than serve without its scraper, and says why (`main` exits 1 on it).
#[tokio::test]
async fn run_stops_with_an_error_when_the_metrics_url_cannot_be_scraped() {
    let mut config = crate::support::config("");
    config.litestream.metrics_url = "http://admin:s3cret@127.0.0.1:4860/metrics"
        .parse()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        litestream_sidecar::App::new(config).run(listener, Vec::new(), shutdown),
    )
    .await
    .expect("run returns by itself");
    let err = ended.expect_err("run refuses the URL");
    assert!(
        matches!(err, litestream_sidecar::Error::MetricsUrl(_)),
        "{err}"
    );
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

#[test]
fn sidecar_toml_in_the_working_directory_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "sidecar.toml",
        "[litestream]\nbackup_url = \"file:///from/cwd\"\n[discovery]\nmode = \"off\"\n",
    );
    let (code, out, err) = run(&["--check-config"], dir.path(), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("file:///from/cwd"), "{out}");
}

#[test]
fn starting_with_a_bad_config_exits_78_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.toml", "[zero]\napp_id = \"UPPER\"\n");
    let (code, _, err) = run(&["--config", &path], dir.path(), &[]);
    assert_eq!(code, 78);
    assert!(
        err.contains("zero.app_id") && err.contains("litestream.backup_url"),
        "{err}"
    );
}

#[test]
fn the_reference_config_is_accepted_by_the_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (code, out, err) = run(&["--config", "sidecar.toml", "--check-config"], root, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listen = \"0.0.0.0:4851\""), "{out}");
}

#[tokio::test]
async fn sigterm_closes_reservations_with_1001_and_exits_0() {
    // Statuses wait for a first backup.
    let litestream = crate::support::MetricsServer::start(&crate::support::progress_page(&[(
        "0a",
        crate::support::epoch_now() - 60.0,
    )]))
    .await;
    for signal in ["-TERM", "-INT"] {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "sidecar.toml",
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[litestream]\nbackup_url = \"s3://b/r\"\nproxy_listen = \"127.0.0.1:0\"\n\
                 metrics_url = \"{}\"\n[discovery]\nmode = \"off\"\n[log]\nformat = \"json\"\n\
                 [backup]\nverify = false\n",
                litestream.url()
            ),
        );
        let mut child = Reaped(
            std::process::Command::new(BIN)
                .args(["--config", &path])
                .env_clear()
                .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // The JSON log names the bound address.
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "exited before listening"
            );
            let event: serde_json::Value = serde_json::from_str(&line).expect("JSON log line");
            if event["message"] == "listening" {
                break event["addr"].as_str().unwrap().to_string();
            }
        };
        let drain = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
            rest
        });
        let url = format!("ws://{addr}/replication/v3/snapshot?taskID=t1");
        let mut ws = crate::support::connect(&url).await;
        // Without a change DB the reservation's row cannot commit: no status goes out, the socket stays open.
        assert!(
            tokio::time::timeout(
                Duration::from_millis(500),
                crate::support::next_text(&mut ws)
            )
            .await
            .is_err(),
            "a status went out with no change DB to keep its reservation"
        );

        Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert_eq!(
            crate::support::expect_close(&mut ws).await,
            Some((1001, "sidecar shutting down".into()))
        );
        drop(ws);
        let status = wait_with_timeout(&mut child, Duration::from_secs(10));
        assert_eq!(status, Some(0), "{signal}");
        let logs = drain.join().unwrap();
        assert!(logs.contains("shutting down"), "{logs}");
    }
}

/// A sidecar process that is killed when the test that started it ends, also when the test fails first.
struct Reaped(std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_with_timeout(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `systemd-analyze verify` checks the unit's syntax and directives. It needs the binary named in `ExecStart`
/// to exist, so the check runs on a copy that points at the freshly built one.
#[test]
fn systemd_unit_verifies() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: unit check skipped");
        return;
    };
    assert!(probe.status.success());
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/litestream-sidecar.service"),
    )
    .unwrap();
    assert!(unit.contains(
        "ExecStart=/usr/local/bin/litestream-sidecar --config /etc/litestream-sidecar/sidecar.toml"
    ));
    assert!(unit.contains("RestartPreventExitStatus=78"));
    // The learned cleanup delay survives restarts there (cleanup.state_file defaults to $STATE_DIRECTORY).
    assert!(unit.contains("\nStateDirectory=litestream-sidecar\n"));
    assert!(unit.contains("Type=notify") && unit.contains("WatchdogSec="));
    let dir = tempfile::tempdir().unwrap();
    let copy = write(
        dir.path(),
        "litestream-sidecar.service",
        &unit.replace("/usr/local/bin/litestream-sidecar", BIN),
    );
    let output = Command::new("systemd-analyze")
        .args(["verify", &copy])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze complained:\n{stderr}"
    );
}

/// systemd's notify protocol, read off a socket the test owns as systemd would.
#[test]
fn systemd_notify_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let path = write(
        dir.path(),
        "sidecar.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n[litestream]\nbackup_url = \"s3://b/r\"\nproxy_listen = \"127.0.0.1:0\"\n\
         [discovery]\nmode = \"off\"\n[change_db]\nurl = \"postgres://nobody@127.0.0.1:9/none\"\n",
    );
    let mut child = Reaped(
        Command::new(BIN)
            .args(["--config", &path])
            .env_clear()
            .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
            .env("NOTIFY_SOCKET", &socket_path)
            .env("WATCHDOG_USEC", "200000")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut received = Vec::new();
    let next = || {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a datagram within 10s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first = next();
    assert!(first.starts_with("READY=1\n"), "{first}");
    // Watchdog keep-alives at half of WatchdogSec, and STATUS= saying what readiness waits for.
    let mut watchdogs = 0;
    let mut saw_waiting = false;
    while watchdogs < 3 || !saw_waiting {
        let message = next();
        watchdogs += message.lines().filter(|l| *l == "WATCHDOG=1").count();
        saw_waiting |= message.contains("STATUS=waiting: change DB");
        received.push(message);
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    loop {
        let message = next();
        if message.contains("STOPPING=1") {
            break;
        }
        received.push(message);
    }
    assert_eq!(
        wait_with_timeout(&mut child, Duration::from_secs(10)),
        Some(0),
        "{received:?}"
    );
}

/// Both log formats carry the same fields (span fields included), and the change DB password never appears.
#[tokio::test]
async fn logs_carry_fields_in_both_formats_and_never_the_password() {
    // Statuses wait for a first backup.
    let litestream = crate::support::MetricsServer::start(&crate::support::progress_page(&[(
        "0a",
        crate::support::epoch_now() - 60.0,
    )]))
    .await;
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "sidecar.toml",
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[litestream]\nbackup_url = \"s3://b/r\"\nproxy_listen = \"127.0.0.1:0\"\n\
                 metrics_url = \"{}\"\n\
                 [discovery]\nmode = \"off\"\n[change_db]\nurl = \"postgres://zero:hunter2secret@127.0.0.1:9/zero\"\n\
                 [log]\nformat = \"{format}\"\nfilter = \"debug\"\n[backup]\nverify = false\n",
                litestream.url()
            ),
        );
        let mut child = Reaped(
            std::process::Command::new(BIN)
                .args(["--config", &path])
                .env_clear()
                .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = Vec::new();
        let addr = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "exited early: {lines:?}"
            );
            lines.push(line.clone());
            if line.contains("listening") && !line.contains("metrics proxy") {
                let rest = line.split("addr").nth(1).unwrap();
                let addr: String = rest
                    .chars()
                    .skip_while(|c| !c.is_ascii_digit())
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                break addr;
            }
        };
        let drain = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
            rest
        });
        let ws = crate::support::connect(&format!(
            "ws://{addr}/replication/v3/snapshot?taskID=task-42"
        ))
        .await;
        // Without a change DB no status goes out; the reservation opens all the same, and logs so.
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(ws);
        tokio::time::sleep(Duration::from_millis(500)).await;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert_eq!(
            wait_with_timeout(&mut child, Duration::from_secs(10)),
            Some(0)
        );
        let logs = lines.concat() + &drain.join().unwrap();
        assert!(
            !logs.contains("hunter2secret"),
            "{format}: the password was logged:\n{logs}"
        );
        let opened = logs
            .lines()
            .find(|l| l.contains("reservation opened"))
            .unwrap_or_else(|| panic!("{format}: no reservation log:\n{logs}"));
        match format {
            "json" => {
                let event: serde_json::Value = serde_json::from_str(opened).unwrap();
                assert_eq!(event["span"]["task_id"], "task-42", "{opened}");
                assert!(event["span"]["peer"].as_str().is_some(), "{opened}");
            }
            _ => assert!(
                opened.contains("task_id=task-42") && opened.contains("peer="),
                "{opened}"
            ),
        }
        // The change DB is unreachable: that is logged, with where it was tried but not the secret.
        assert!(logs.contains("127.0.0.1"), "{logs}");
    }
}

/// Runs the binary to completion without blocking the test's runtime, whose stand-ins keep answering meanwhile.
async fn run_async(args: &[&str], cwd: &Path) -> (i32, String, String) {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
        .output()
        .await
        .unwrap();
    (
        output.status.code().expect("exited normally"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn status_prints_the_running_daemons_reservations_subscribers_and_hold_reason() {
    let litestream = crate::support::MetricsServer::start(&crate::support::progress_page(&[(
        "0a",
        crate::support::epoch_now() - 60.0,
    )]))
    .await;
    let mut upstream = crate::support::Upstream::start().await;
    // A fixed port, so that `status` finds the daemon from the config alone.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "sidecar.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[litestream]\nbackup_url = \"s3://b/r\"\n\
             proxy_listen = \"127.0.0.1:0\"\nmetrics_url = \"{}\"\n[upstream]\naddress = \"{}\"\n\
             [change_db]\nurl = \"postgres://nobody@127.0.0.1:9/none\"\n[discovery]\nmode = \"off\"\n\
             [backup]\nverify = false\n[log]\nformat = \"json\"\n",
            litestream.url(),
            upstream.addr
        ),
    );
    let _child = Reaped(
        std::process::Command::new(BIN)
            .args(["--config", &path])
            .env_clear()
            .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    crate::support::wait_until_serving(
        format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_secs(30),
    )
    .await;

    let _reservation = crate::support::connect(&format!(
        "ws://127.0.0.1:{port}/replication/v3/snapshot?taskID=restore-42"
    ))
    .await;
    let changes = crate::support::changes_path(3, "task-7", "vs-cli", "0a", false);
    let url = format!("ws://127.0.0.1:{port}{changes}");
    let (mut client, mut conn) = tokio::join!(crate::support::connect(&url), upstream.accept());
    assert!(conn.admit_like_zero().await);
    conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    crate::support::next_text(&mut client).await;

    // Just started: cleanup holds until a full cleanup delay has passed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let json = loop {
        let (code, out, err) =
            run_async(&["status", "--config", &path, "--json"], dir.path()).await;
        assert_eq!(code, 0, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
        if json["cleanup"]["decision"] == "hold"
            && json["subscribers"].as_array().unwrap().len() == 1
            && json["reservations"].as_array().unwrap().len() == 1
        {
            break json;
        }
        assert!(std::time::Instant::now() < deadline, "{json:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(json["cleanup"]["hold_reason"], "starting_up");
    assert_eq!(json["reservations"][0]["task_id"], "restore-42");

    let (code, out, err) = run_async(&["status", "--config", &path], dir.path()).await;
    assert_eq!(code, 0, "{err}");
    for needle in [
        "RESERVATIONS (1)",
        "restore-42",
        "SUBSCRIBERS (1)",
        "vs-cli  task-7  serving  0a",
        "connected",
        "decision  hold: starting up (starting_up)",
        "since ",
        "BACKUPS (1 tracked)",
        "LAST PURGE\nnone yet",
        "CHANGE LOG",
    ] {
        assert!(out.contains(needle), "no {needle:?} in\n{out}");
    }
    // The same daemon by address, without a config.
    let (code, by_addr, err) = run_async(
        &["status", "--addr", &format!("127.0.0.1:{port}")],
        dir.path(),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(by_addr.contains("restore-42"), "{by_addr}");
    // Not ready (its change DB does not answer): the health check fails, naming the answer.
    let (code, out, err) = run_async(&["ready", "--config", &path], dir.path()).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(&format!(
            "litestream-sidecar ready: cannot reach the sidecar at 127.0.0.1:{port}: GET /keepalive answered HTTP 503"
        )),
        "{err}"
    );
}

#[test]
fn ready_without_a_daemon_exits_1_and_on_a_bad_config_78() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = run(&["ready", "--addr", "127.0.0.1:9"], dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("litestream-sidecar ready: cannot reach the sidecar at 127.0.0.1:9"),
        "{err}"
    );
    let path = write(dir.path(), "bad.toml", "[server]\nlisten = \"nowhere\"\n");
    let (code, _, err) = run(&["ready", "--config", &path], dir.path(), &[]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("server.listen"), "{err}");
    // The same file named by the environment, as the container image's health check finds it.
    let (code, _, err) = run(
        &["ready"],
        dir.path(),
        &[("LITESTREAM_SIDECAR_CONFIG", &path)],
    );
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("server.listen"), "{err}");
}

#[test]
fn status_without_a_daemon_says_so_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard): nothing listens there.
    let (code, out, err) = run(&["status", "--addr", "127.0.0.1:9"], dir.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("cannot reach the sidecar at 127.0.0.1:9"),
        "{err}"
    );
    assert!(err.contains("is the daemon running"), "{err}");
    // Without --addr the config names the daemon; an invalid one is a config error.
    let path = write(dir.path(), "bad.toml", "[server]\nlisten = \"nowhere\"\n");
    let (code, _, err) = run(&["status", "--config", &path], dir.path(), &[]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("server.listen"), "{err}");
    assert!(err.contains("--addr"), "{err}");
}
