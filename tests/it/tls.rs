//! TLS over real sockets, with certificates made here (rcgen): `wss://` to the listener, the certificate swapped by
//! SIGHUP under open connections, `wss://` to the upstream, and the files checked before the daemon starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::support::process::{Process, BIN};
use crate::support::*;
use futures_util::{SinkExt, StreamExt};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

/// The cases whose reservations must get their status: they need the change DB.
mod pg;

/// A certificate authority of its own for each test, so that trusting one proves nothing about another.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate for `localhost` and 127.0.0.1, with its key.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, name: &str) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// Writes `text` to `path` by renaming a temporary file over it, as certificate renewals do.
fn replace(path: &Path, text: &str) {
    let temporary = path.with_extension("new");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// The listener's files in `dir`: `cert.pem` and `key.pem`.
fn install(dir: &Path, leaf: &Leaf) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    replace(&cert, &leaf.cert_pem);
    replace(&key, &leaf.key_pem);
    (cert, key)
}

fn tls_keys(cert: &Path, key: &Path) -> String {
    format!(
        "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        cert.display(),
        key.display()
    )
}

fn client_config(trusted: &[&Ca]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for ca in trusted {
        roots.add(ca.issuer.der().clone()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

type TlsClient = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// A TLS connection to `addr` checked against `trusted` for the name `localhost`, and the certificate the server
/// presented.
async fn tls_connect(
    addr: SocketAddr,
    trusted: &[&Ca],
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
)> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(Arc::new(client_config(trusted)))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok((tls, presented))
}

/// A `wss://` WebSocket to `path` on `addr`, and the certificate the server presented.
async fn wss(
    addr: SocketAddr,
    path: &str,
    trusted: &[&Ca],
) -> (TlsClient, CertificateDer<'static>) {
    let (tls, presented) = tls_connect(addr, trusted)
        .await
        .unwrap_or_else(|e| panic!("TLS to {addr}: {e}"));
    let url = format!("wss://localhost:{}{path}", addr.port());
    let (ws, response) =
        tokio_tungstenite::client_async_with_config(url.as_str(), tls, Some(large_ws_config()))
            .await
            .unwrap_or_else(|e| panic!("upgrade {url}: {e}"));
    assert_eq!(response.status(), 101);
    (ws, presented)
}

async fn text_of<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) -> String {
    match next_message(ws).await {
        Some(Message::Text(text)) => text.to_string(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// A ping from the sidecar (answered by the library): the connection is alive at the far end.
async fn a_ping_arrives<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("no ping within 10s");
        match next {
            Some(Ok(Message::Ping(_))) => return,
            Some(Ok(Message::Pong(_))) => continue,
            other => panic!("expected a ping, got {other:?}"),
        }
    }
}

/// `GET path` over TLS: status and body.
async fn https(addr: SocketAddr, path: &str, trusted: &[&Ca]) -> (u16, String) {
    let (mut tls, _) = tls_connect(addr, trusted).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // rustls reports a peer that closes without close_notify as an error; what was read is complete anyway.
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response))
        .await
        .expect("response within 10s");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn wss_clients_get_what_ws_clients_get_and_plain_ones_are_refused() {
    let ca = Ca::new("listener CA");
    let dir = tempfile::tempdir().unwrap();
    let leaf = ca.leaf("sidecar");
    let (cert, key) = install(dir.path(), &leaf);
    let sidecar = start(config(&format!("[server]\n{}", tls_keys(&cert, &key)))).await;

    let (mut ws, presented) = wss(sidecar.addr, "/replication/v3/snapshot?taskID=t1", &[&ca]).await;
    assert_eq!(presented, leaf.der);
    assert_eq!(text_of(&mut ws).await, V3_STATUS);
    ws.send(Message::Text(r#"{"ack":1}"#.into())).await.unwrap();
    eventually("reservation", || sidecar.registry.len() == 1).await;
    // The plain endpoints are on the same listener.
    assert_eq!(https(sidecar.addr, "/", &[&ca]).await, (200, "OK".into()));

    // A client speaking plain WebSocket (or plain HTTP) gets nowhere, and nothing is reserved for it.
    let plain = tokio_tungstenite::connect_async(sidecar.snapshot_url("plain")).await;
    assert!(plain.is_err(), "a plain ws:// client was served");
    let mut raw = TcpStream::connect(sidecar.addr).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut answer))
        .await
        .expect("the sidecar closes a plain connection");
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"),
        "plain HTTP was answered"
    );
    // A client that does not trust the certificate does not connect.
    assert!(tls_connect(sidecar.addr, &[&Ca::new("another CA")])
        .await
        .is_err());
    assert_eq!(sidecar.registry.len(), 1);

    // The reservation is held over TLS as over TCP: shutdown closes it with Zero's code.
    sidecar.begin_shutdown();
    match next_message(&mut ws).await {
        Some(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected a close frame, got {other:?}"),
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_client_that_never_says_hello_is_dropped() {
    let ca = Ca::new("listener CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = install(dir.path(), &ca.leaf("sidecar"));
    let sidecar = start(config(&format!("[server]\n{}", tls_keys(&cert, &key)))).await;
    assert!(tls_connect(sidecar.addr, &[&ca]).await.is_ok(), "no TLS");
    let started = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(sidecar.addr).await.unwrap();
    let mut buffer = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut buffer))
        .await
        .expect("a client that never sends its ClientHello is dropped");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The header-read timeout, 10 s.
    assert!(started.elapsed() >= Duration::from_secs(9));
    sidecar.stop().await;
}

/// A stand-in for Zero's change-streamer behind a TLS-terminating proxy: each accepted subscription with the
/// request target it was opened for.
struct TlsUpstream {
    addr: SocketAddr,
    conns: tokio::sync::mpsc::UnboundedReceiver<(String, WebSocketStream<TlsServerStream>)>,
    task: tokio::task::JoinHandle<()>,
}

type TlsServerStream = tokio_rustls::server::TlsStream<TcpStream>;

impl TlsUpstream {
    async fn start(leaf: &Leaf) -> TlsUpstream {
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], key)
        .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, conns) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let target = Arc::new(std::sync::Mutex::new(String::new()));
                    let seen = target.clone();
                    #[allow(clippy::result_large_err)]
                    let callback = move |request: &tungstenite::handshake::server::Request,
                                         response: tungstenite::handshake::server::Response| {
                        *seen.lock().unwrap() = request.uri().to_string();
                        Ok(response)
                    };
                    if let Ok(ws) = tokio_tungstenite::accept_hdr_async_with_config(
                        stream,
                        callback,
                        Some(large_ws_config()),
                    )
                    .await
                    {
                        let mut ws = ws;
                        let target = target.lock().unwrap().clone();
                        // The sidecar's probe, answered as Zero 1.9 would.
                        match answer_like_zero(&target, &ZERO_1_9) {
                            Answer::Refuse(reason) => close_with_refusal(&mut ws, reason).await,
                            _ => {
                                let _ = tx.send((target, ws));
                            }
                        }
                    }
                });
            }
        });
        TlsUpstream { addr, conns, task }
    }

    async fn accept(&mut self) -> (String, WebSocketStream<TlsServerStream>) {
        tokio::time::timeout(Duration::from_secs(10), self.conns.recv())
            .await
            .expect("no upstream connection within 10s")
            .expect("upstream stopped")
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn frames_cross_wss_on_both_hops_byte_for_byte() {
    let upstream_ca = Ca::new("upstream CA");
    let mut upstream = TlsUpstream::start(&upstream_ca.leaf("change-streamer")).await;
    let listener_ca = Ca::new("listener CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = install(dir.path(), &listener_ca.leaf("sidecar"));
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, upstream_ca.pem()).unwrap();
    // The certificate names 127.0.0.1, the host of upstream.address: no tls_server_name needed.
    let sidecar = start(config(&format!(
        "[server]\n{}[upstream]\naddress = \"{}\"\ntls = true\ntls_ca_file = \"{}\"\n",
        tls_keys(&cert, &key),
        upstream.addr,
        ca_file.display()
    )))
    .await;

    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let trusted: &[&Ca] = &[&listener_ca];
    let ((mut client, _), (target, mut conn)) =
        tokio::join!(wss(sidecar.addr, &path, trusted), upstream.accept());
    assert_eq!(target, path);
    let frames = [
        r#"{"msg":["status",{"tag":"status"}],"id":1}"#.to_string(),
        format!(
            "{{ \"id\" : 2 ,\n\"msg\":[\"data\",{{\"tag\":\"insert\",\"new\":{{\"big\":9007199254740993,\
             \"s\":\"a\\u0000b é {}\"}}}}] }}",
            "x".repeat(100_000)
        ),
    ];
    for frame in &frames {
        conn.send(Message::Text(frame.as_str().into()))
            .await
            .unwrap();
        assert!(text_of(&mut client).await == *frame, "changed on the way");
    }
    conn.send(Message::Binary(vec![0u8, 1, 2, 255].into()))
        .await
        .unwrap();
    assert_eq!(
        next_message(&mut client).await,
        Some(Message::Binary(vec![0u8, 1, 2, 255].into()))
    );
    for ack in [r#"{"ack":1}"#, r#"{"ack":2}"#] {
        client.send(Message::Text(ack.into())).await.unwrap();
        assert_eq!(text_of(&mut conn).await, ack);
    }
    eventually("subscriber acked", || sidecar.subscribers.connected() == 1).await;
    // Zero's close without a code reaches the subscriber as sent.
    conn.close(None).await.unwrap();
    assert_eq!(next_message(&mut client).await, Some(Message::Close(None)));
    sidecar.stop().await;
}

/// A litestream stand-in that reports a backup, without which reservations get no status: at the test schema's
/// replica version, where its empty change log starts, as a status waits while the log starts past the backup.
async fn litestream() -> MetricsServer {
    MetricsServer::start(&progress_page(&[(SEEDED_BACKUP, epoch_now() - 60.0)])).await
}

/// A config file for the binary: loopback, JSON logs, a fast ping so that an open connection shows it is alive.
/// `metrics_url` is litestream's.
fn binary_config(dir: &Path, metrics_url: &str, extra: &str) -> PathBuf {
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nping_interval = \"200ms\"\npeer_timeout = \"5s\"\n\
         [litestream]\nbackup_url = \"{BACKUP_URL}\"\nproxy_listen = \"127.0.0.1:0\"\n\
         metrics_url = \"{}\"\n[change_db]\nurl = \"postgres://nobody@127.0.0.1:9/none\"\n\
         [discovery]\nmode = \"off\"\n[backup]\nverify = false\n[log]\nformat = \"json\"\n\
         [cleanup]\nstate_file = \"{}\"\n",
        metrics_url,
        // Its own state, not the host's default path.
        dir.join("state.json").display()
    );
    let mut merged: toml::Table = base.parse().unwrap();
    for (section, values) in extra.parse::<toml::Table>().unwrap() {
        let target = merged
            .entry(section)
            .or_insert_with(|| toml::Value::Table(Default::default()))
            .as_table_mut()
            .unwrap();
        for (key, value) in values.as_table().unwrap() {
            target.insert(key.clone(), value.clone());
        }
    }
    let path = dir.join("sidecar.toml");
    std::fs::write(&path, toml::to_string(&merged).unwrap()).unwrap();
    path
}

fn hangup(process: &Process) {
    let status = Command::new("kill")
        .args(["-HUP", &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `litestream-sidecar status --json` for the daemon at `addr`, with the TLS settings of `config`.
async fn status_json(addr: SocketAddr, config: &Path) -> serde_json::Value {
    let output = tokio::process::Command::new(BIN)
        .args(["status", "--json", "--addr", &addr.to_string(), "--config"])
        .arg(config)
        .env_clear()
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "status failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn a_wrong_upstream_ca_is_a_502_and_a_log_line() {
    let upstream_ca = Ca::new("upstream CA");
    let _upstream = TlsUpstream::start(&upstream_ca.leaf("change-streamer")).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, Ca::new("some other CA").pem()).unwrap();
    let process = Process::spawn(&binary_config(
        dir.path(),
        NO_LITESTREAM,
        &format!(
            "[upstream]\naddress = \"{}\"\ntls = true\ntls_ca_file = \"{}\"\n",
            _upstream.addr,
            ca_file.display()
        ),
    ))
    .await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let (status, body) = refused(&format!("ws://{}{path}", process.addr)).await;
    assert_eq!(status, 502);
    assert!(body.contains("TLS handshake failed"), "{body}");
    let line = process
        .wait_logged("subscription refused: upstream unavailable", 1)
        .await;
    let error = line["error"].as_str().unwrap();
    assert!(error.contains("TLS handshake failed"), "{line}");
    assert!(error.contains("certificate"), "{line}");

    // An upstream without TLS is refused the same way rather than spoken to in clear.
    let mut plain = Upstream::start().await;
    let process = Process::spawn(&binary_config(
        dir.path(),
        NO_LITESTREAM,
        &format!(
            "[upstream]\naddress = \"{}\"\ntls = true\ntls_ca_file = \"{}\"\n",
            plain.addr,
            ca_file.display()
        ),
    ))
    .await;
    let (status, body) = refused(&format!("ws://{}{path}", process.addr)).await;
    assert_eq!(status, 502);
    assert!(body.contains("TLS handshake failed"), "{body}");
    assert!(plain.none_arrives().await);
}

fn check_config(config: &Path) -> (i32, String) {
    let output = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .arg("--check-config")
        .env_clear()
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn unusable_tls_files_are_config_errors() {
    let ca = Ca::new("CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = install(dir.path(), &ca.leaf("sidecar"));
    let missing = dir.path().join("missing.pem");
    let stray_key = dir.path().join("stray.pem");
    std::fs::write(&stray_key, ca.leaf("stray").key_pem).unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();

    let good = binary_config(
        dir.path(),
        NO_LITESTREAM,
        &format!("[server]\n{}", tls_keys(&cert, &key)),
    );
    assert_eq!(check_config(&good), (0, String::new()));

    for (server, key_named, needle) in [
        (
            tls_keys(&missing, &key),
            "server.tls_cert_file",
            "No such file",
        ),
        (
            tls_keys(&cert, &missing),
            "server.tls_key_file",
            "No such file",
        ),
        (
            tls_keys(&not_pem, &key),
            "server.tls_cert_file",
            "no PEM certificate",
        ),
        (
            tls_keys(&cert, &not_pem),
            "server.tls_key_file",
            "no PEM private key",
        ),
        (
            tls_keys(&cert, &stray_key),
            "server.tls_key_file",
            "is not the private key",
        ),
        (
            format!("tls_key_file = \"{}\"\n", key.display()),
            "server.tls_cert_file",
            "must be set with server.tls_key_file",
        ),
    ] {
        let config = binary_config(dir.path(), NO_LITESTREAM, &format!("[server]\n{server}"));
        let (code, err) = check_config(&config);
        assert_eq!(code, 2, "{server}: {err}");
        assert!(err.contains(key_named), "{server}: {err}");
        assert!(err.contains(needle), "{server}: {err}");
    }
    let config = binary_config(
        dir.path(),
        NO_LITESTREAM,
        &format!(
            "[upstream]\ntls = true\ntls_ca_file = \"{}\"\n",
            missing.display()
        ),
    );
    let (code, err) = check_config(&config);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("upstream.tls_ca_file"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");

    // The daemon refuses to start on them, before it listens.
    let config = binary_config(
        dir.path(),
        NO_LITESTREAM,
        &format!("[server]\n{}", tls_keys(&cert, &stray_key)),
    );
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .env_clear()
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{err}");
    assert!(err.contains("is not the private key"), "{err}");
    assert!(!err.contains("\"listening\""), "{err}");
}
