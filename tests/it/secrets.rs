//! No secret leaves the process: the change DB's password, credentials in any configured URL and the AWS
//! credentials from the environment appear in no log line, no page the sidecar serves, no `--check-config`
//! output and no config error. The real binary, with every path that could print them exercised: an
//! unreachable change DB, a litestream that fails, a backup destination that refuses, a refused peer.

use std::path::Path;
use std::process::Command;

use crate::support::process::Process;

const BIN: &str = env!("CARGO_BIN_EXE_litestream-sidecar");

/// Every secret the configs below carry; none may appear anywhere.
const SECRETS: &[&str] = &[
    "pgSecretPW1",
    "metricsSecretPW2",
    "endpointSecretPW3",
    "awsSecretPW4",
    "ftpSecretPW5",
    "dbSecretPW6",
    "sessionSecretPW7",
    "kvSecretPW8",
];

const AWS_ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
    ("AWS_SECRET_ACCESS_KEY", "awsSecretPW4"),
    ("AWS_SESSION_TOKEN", "sessionSecretPW7"),
];

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows {secret}:\n{text}");
    }
}

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("sidecar.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn run(args: &[&str]) -> (i32, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_clear()
        .envs(AWS_ENV.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn no_secret_in_logs_pages_check_config_or_errors() {
    let litestream = crate::support::MetricsServer::start(&crate::support::progress_page(&[(
        "0a",
        crate::support::epoch_now() - 60.0,
    )]))
    .await;
    let metrics_url = litestream.url();
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nallow = [\"10.0.0.0/8\"]\n\
             [litestream]\nbackup_url = \"s3://acme/replica\"\nproxy_listen = \"127.0.0.1:0\"\n\
             metrics_url = \"{metrics_url}\"\ncheck_interval = \"1s\"\n\
             [backup]\nverify = true\nendpoint = \"http://127.0.0.1:9\"\nallow_http = true\n\
             list_timeout = \"1s\"\n\
             [discovery]\nmode = \"off\"\n[change_db]\nurl = \"postgres://zero:pgSecretPW1@127.0.0.1:9/zero\"\n\
             [log]\nformat = \"json\"\nfilter = \"trace\"\n"
        ),
    );

    // --check-config shows the effective config, secrets replaced.
    let (code, shown) = run(&["--config", &config, "--check-config"]);
    assert_eq!(code, 0, "{shown}");
    assert_no_secret("--check-config", &shown);
    assert!(shown.contains("REDACTED"), "{shown}");

    // The daemon at work: the change DB unreachable, litestream failing then answering, the destination
    // unreachable, a peer refused by server.allow (this test's peer is loopback, outside 10.0.0.0/8).
    let sidecar = Process::spawn_with_env(Path::new(&config), AWS_ENV).await;
    litestream.set_status(500);
    sidecar
        .wait_logged("cannot read litestream metrics", 1)
        .await;
    litestream.set_status(200);
    sidecar
        .wait_logged("litestream metrics readable again", 1)
        .await;
    assert_eq!(refused_upgrade(sidecar.addr).await, 403);
    for path in ["/metrics", "/status", "/keepalive", "/"] {
        let (_, page) = crate::support::http(sidecar.addr, "GET", path).await;
        assert_no_secret(path, &page);
    }
    let proxy = sidecar.logged("metrics proxy listening")[0]["addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (_, proxied) = crate::support::http(proxy, "GET", "/metrics").await;
    assert_no_secret("the metrics proxy", &proxied);
    let (code, status) = run(&["status", "--addr", &sidecar.addr.to_string()]);
    assert_eq!(code, 0, "{status}");
    assert_no_secret("litestream-sidecar status", &status);

    let logs = sidecar.log_text();
    assert_no_secret("the log", &logs);
    // The paths that could have shown them did run.
    for logged in ["change DB", "scrape", "refused"] {
        assert!(logs.contains(logged), "no {logged:?} line:\n{logs}");
    }
    drop(sidecar);

    // Config errors name the key and what is wrong, not the secret in the value.
    for (key, value) in [
        (
            "litestream.metrics_url",
            "ftp://scraper:ftpSecretPW5@127.0.0.1/metrics",
        ),
        (
            "change_db.url",
            "postgres://zero:dbSecretPW6@db:notaport/zero",
        ),
        (
            "change_db.url",
            "host=db password=kvSecretPW8 port=notaport",
        ),
        ("backup.endpoint", "minio:endpointSecretPW3@127.0.0.1"),
        // Credentials for the destination come from the environment only.
        (
            "backup.endpoint",
            "http://minio:endpointSecretPW3@127.0.0.1:9",
        ),
    ] {
        let (section, name) = key.split_once('.').unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut table: toml::Table =
            "[litestream]\nbackup_url = \"s3://acme/replica\"\n[discovery]\nmode = \"off\"\n"
                .parse()
                .unwrap();
        table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(Default::default()))
            .as_table_mut()
            .unwrap()
            .insert(name.into(), value.into());
        let path = write(dir.path(), &toml::to_string(&table).unwrap());
        for args in [
            vec!["--config", &path, "--check-config"],
            vec!["--config", &path],
        ] {
            let (code, text) = run(&args);
            assert_ne!(code, 0, "{key} = {value:?} was accepted: {text}");
            assert!(text.contains(key), "{key}: {text}");
            assert_no_secret(&format!("the error for {key}"), &text);
        }
    }
}

/// The status code a WebSocket upgrade of `/snapshot` gets.
async fn refused_upgrade(addr: std::net::SocketAddr) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET /replication/v3/snapshot?taskID=t HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).await.unwrap();
    std::str::from_utf8(&answer[9..12])
        .unwrap()
        .parse()
        .unwrap()
}
