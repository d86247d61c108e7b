//! HTTP only: one accept loop ([`serve_http`]) for every listener, hyper HTTP/1 with upgrades, and the main
//! listener's router with its plain endpoints.
//!
//! - `GET /` — liveness: 200 `OK` whenever the process serves requests.
//! - `GET /metrics` — the sidecar's own Prometheus metrics ([`crate::ops::metrics`]).
//! - `GET /status` — the sidecar's state as JSON ([`crate::ops::status`]): backups, reservations, subscribers, cleanup.
//! - `GET /keepalive` — readiness: 200 `OK` when every readiness condition holds, else 503 naming what is missing.
//! - `GET /replication/v{N}/snapshot?taskID=…` — snapshot reservation WebSocket ([`crate::streamer::snapshot::serve`]).
//! - `GET /replication/v{N}/changes?…` — the change-stream relay ([`crate::streamer::relay::serve`]), v1 to v6.
//!
//! Each WebSocket job checks its request, upgrades it and starts its connection itself; the router only sends
//! there the upgrade requests for its paths, and refuses anything else on them with HTTP 400. The metrics proxy
//! ([`crate::proxy`]) is served by the same accept loop on its own listeners.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, debug_span, warn, Instrument};

use crate::net::admission::{Admission, Refusal};
use crate::net::head::{read_head, Head, Rewind};
use crate::net::http::plain;
use crate::net::sockopt::ClientSocket;
use crate::protocol::{self, Route};
use crate::streamer::relay::{self, RelayContext};
use crate::streamer::snapshot::{self, SnapshotContext};

/// Back-off after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Answers the requests of one listener; [`serve_http`] calls it for every request of every connection.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Full<Bytes>>> + Send;
}

/// What one listener's connections may cost before they are refused or dropped.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Counts open connections against the cap and every refusal.
    pub admission: Admission,
    /// A request head must arrive whole within this long of the connection opening or of the previous response
    /// (slow-loris protection, and the idle timeout of a kept-alive connection).
    pub header_read_timeout: Duration,
    /// Largest request line plus headers.
    pub max_header_bytes: usize,
}

impl Limits {
    pub fn from_config(server: &crate::net::config::ServerConfig, admission: Admission) -> Self {
        Self {
            admission,
            header_read_timeout: server.header_read_timeout,
            max_header_bytes: server.max_header_bytes,
        }
    }
}

/// Accepts connections on `listener` until `shutdown` is cancelled and serves each on its own task in `tracker`,
/// with `handler`, within `limits`, over TLS when given an acceptor. Open connections are then shut down
/// gracefully; upgraded WebSockets live on as their own tasks, which end themselves on `shutdown`.
pub async fn serve_http<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    limits: Limits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Each write leaves at once: with Nagle's algorithm a relayed message written while the previous one is
        // unacknowledged would wait for the subscriber's next ack to carry the TCP acknowledgement, a message's
        // processing time later (docs/protocol.md, "Relayed subscribers dropped as too far behind").
        if let Err(err) = stream.set_nodelay(true) {
            debug!(error = %err, "cannot set TCP_NODELAY on an accepted connection");
        }
        // Only a plain connection's: under TLS a record split across reads can leave fewer bytes to come than the
        // low-water mark the relay would set, and its last ack would wait for `relay.ack_wakeup_wait`.
        let socket = tls
            .is_none()
            .then(|| ClientSocket(std::os::fd::AsRawFd::as_raw_fd(&stream)));
        let Some(stream) = limits.admission.admit(stream) else {
            continue;
        };
        let span = debug_span!("conn", %peer);
        let (handler, limits, shutdown) = (handler.clone(), limits.clone(), shutdown.clone());
        match tls.clone() {
            None => tracker.spawn(
                serve_connection(stream, peer, socket, handler, limits, shutdown).instrument(span),
            ),
            // The handshake runs on the connection's task, bounded like a request head.
            Some(tls) => tracker.spawn(
                async move {
                    let within = limits.header_read_timeout;
                    let accepted = crate::net::tls::accept(&tls, stream, within, &shutdown).await;
                    if let Some(stream) = accepted {
                        serve_connection(stream, peer, socket, handler, limits, shutdown).await;
                    }
                }
                .instrument(span),
            ),
        };
    }
}

/// Serves one admitted connection: its first request head is read here, in a small buffer that grows as bytes
/// arrive, and only a connection that sent one whole gets hyper's state (two 8 KiB buffers and a connection
/// machine, boxed). A slow-loris client, which never finishes its head, so costs little more than its socket
/// until `header_read_timeout` drops it.
async fn serve_connection<H: Handler, IO>(
    mut stream: IO,
    peer: SocketAddr,
    socket: Option<ClientSocket>,
    handler: Arc<H>,
    limits: Limits,
    shutdown: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = tokio::select! {
        head = tokio::time::timeout(
            limits.header_read_timeout,
            read_head(&mut stream, limits.max_header_bytes),
        ) => head,
        _ = shutdown.cancelled() => return,
    };
    let head = match head {
        Ok(Ok(Head::Complete(head))) => head,
        Ok(Ok(Head::Closed)) | Ok(Err(_)) => return,
        Ok(Ok(Head::TooLarge)) => {
            limits.admission.count(
                Refusal::HeaderTooLarge,
                &format_args!("{peer} sent a request head over server.max_header_bytes"),
            );
            let _ =
                tokio::time::timeout(limits.header_read_timeout, stream.write_all(HEAD_TOO_LARGE))
                    .await;
            return;
        }
        Err(_) => {
            limits.admission.count(
                Refusal::HeaderTimeout,
                &format_args!(
                    "{peer} sent no whole request head in time (server.header_read_timeout)"
                ),
            );
            return;
        }
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes);
    let stream = Rewind::new(head, stream);
    Box::pin(serve_admitted(
        stream,
        peer,
        socket,
        handler,
        builder,
        limits.admission,
        shutdown,
    ))
    .await
}

/// The answer to a first request head over `server.max_header_bytes` (hyper answers later ones alike).
const HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

async fn serve_admitted<H: Handler, IO>(
    stream: Rewind<IO>,
    peer: SocketAddr,
    socket: Option<ClientSocket>,
    handler: Arc<H>,
    builder: hyper::server::conn::http1::Builder,
    admission: Admission,
    shutdown: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(socket) = socket {
            req.extensions_mut().insert(socket);
        }
        let response = handler.clone().handle(req, peer);
        async move { Ok::<_, Infallible>(response.await) }
    });
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    match result {
        Ok(()) => {}
        Err(err) if err.is_timeout() => admission.count(
            Refusal::HeaderTimeout,
            &format_args!("{peer} sent no whole request head in time (server.header_read_timeout)"),
        ),
        Err(err) if err.is_parse_too_large() => admission.count(
            Refusal::HeaderTooLarge,
            &format_args!("{peer} sent a request head over server.max_header_bytes"),
        ),
        Err(err) => debug!(error = %err, "connection ended with an error"),
    }
}

/// Conditions `/keepalive` waits for: accepting connections, the change DB reachable with Zero's schema, and
/// (unless discovery is off) `ownerAddress` naming the sidecar.
pub struct Readiness {
    listening: AtomicBool,
    discovery_mode: crate::cleanup::discovery::DiscoveryMode,
    discovery: crate::cleanup::discovery::StateHandle,
}

impl Readiness {
    pub fn new(
        discovery_mode: crate::cleanup::discovery::DiscoveryMode,
        discovery: crate::cleanup::discovery::StateHandle,
    ) -> Self {
        Self {
            listening: AtomicBool::new(false),
            discovery_mode,
            discovery,
        }
    }

    pub fn set_listening(&self, value: bool) {
        self.listening.store(value, Ordering::Relaxed);
    }

    /// What is still missing, empty when ready.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.listening.load(Ordering::Relaxed) {
            missing.push("not accepting connections");
        }
        let state = self.discovery.get();
        if !state.db_up {
            missing.push("change DB unreachable or Zero's schema not there yet");
        } else if state.registration != Some(crate::cleanup::discovery::Registration::Registered) {
            match self.discovery_mode {
                crate::cleanup::discovery::DiscoveryMode::Off => {}
                // View-syncers reach the sidecar by URI whoever owns the log: serving them is what lets a new
                // replication-manager take over, so only cleanup waits for the owner.
                crate::cleanup::discovery::DiscoveryMode::Owner => {}
                crate::cleanup::discovery::DiscoveryMode::Verify
                | crate::cleanup::discovery::DiscoveryMode::Adopt => {
                    missing.push("ownerAddress does not name this sidecar")
                }
            }
        }
        missing
    }
}

/// What the main listener's requests read: the router's [`Handler`].
pub struct Context {
    pub metrics: crate::ops::metrics_page::MetricsSources,
    pub status: crate::ops::status::Sources,
    pub snapshot: SnapshotContext,
    pub relay: RelayContext,
    pub readiness: Readiness,
    /// Who may open the WebSocket paths (`server.allow`).
    pub allow: crate::net::allow::AllowList,
    /// The main listener's connection counts, where refusals are counted.
    pub admission: Admission,
    pub shutdown: CancellationToken,
    /// Where upgraded WebSockets run, so that the shutdown drain waits for them.
    pub tracker: TaskTracker,
}

impl Handler for Context {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        route(req, peer, &self).await
    }
}

/// The answer to a request on a WebSocket path that does not ask for an upgrade.
const NOT_AN_UPGRADE: &str =
    "this path serves Zero's change-streamer protocol over WebSocket: send a WebSocket upgrade request\n";

/// The main listener's router: the plain endpoints are answered here, the WebSocket paths by their jobs.
async fn route(req: Request<Incoming>, peer: SocketAddr, ctx: &Context) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    match protocol::route(req.uri().path()) {
        Route::Root => plain(StatusCode::OK, "OK"),
        Route::Keepalive => keepalive(ctx),
        Route::Metrics => {
            let mut response = plain(StatusCode::OK, ctx.metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        Route::Status => {
            let mut response = plain(StatusCode::OK, ctx.status.render_json());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Route::NotFound => plain(StatusCode::NOT_FOUND, "not found\n"),
        // Before anything else about the request is looked at, so that a refused peer learns nothing more.
        Route::Snapshot(_) | Route::Changes(_) if !ctx.allow.allows(peer.ip()) => {
            ctx.admission.count(
                Refusal::NotAllowed,
                &format_args!("{} is not in server.allow", peer.ip().to_canonical()),
            );
            let mut response = plain(
                StatusCode::FORBIDDEN,
                "forbidden: this address may not open the change-streamer protocol (server.allow)\n",
            );
            // Nothing else is served to it on this connection: its place goes to someone allowed.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            response
        }
        Route::Snapshot(_) | Route::Changes(_)
            if !fastwebsockets::upgrade::is_upgrade_request(&req) =>
        {
            plain(StatusCode::BAD_REQUEST, NOT_AN_UPGRADE)
        }
        Route::Snapshot(version) => {
            snapshot::serve(req, &version, peer, &ctx.snapshot, &ctx.tracker).await
        }
        Route::Changes(version) => {
            relay::serve(req, &version, peer, &ctx.relay, &ctx.tracker).await
        }
    }
}

fn keepalive(ctx: &Context) -> Response<Full<Bytes>> {
    if ctx.shutdown.is_cancelled() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down\n",
        );
    }
    let missing = ctx.readiness.missing();
    if !missing.is_empty() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join(", ")),
        );
    }
    // Still ready while purges fail: reservations and subscriptions are served as before, and taking the sidecar
    // out of rotation would cut view-syncers off. The body says what is wrong.
    match ctx.metrics.handles.status.read(|s| s.cleanup_problem()) {
        None => plain(StatusCode::OK, "OK"),
        Some(problem) => plain(StatusCode::OK, format!("OK; {problem}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::family::Family;
    use tokio::io::AsyncReadExt;

    /// Answers with whether the connection's socket has `TCP_NODELAY` set.
    struct NoDelayProbe;

    impl Handler for NoDelayProbe {
        async fn handle(
            self: Arc<Self>,
            req: Request<Incoming>,
            _: SocketAddr,
        ) -> Response<Full<Bytes>> {
            let socket = req
                .extensions()
                .get::<ClientSocket>()
                .expect("a plain connection's socket");
            let set = crate::net::sockopt::no_delay(socket.0).expect("getsockopt");
            plain(StatusCode::OK, format!("nodelay={set}"))
        }
    }

    /// Upgrades any request and, on the upgraded socket, writes whether it was taken back as plain TCP, then
    /// echoes what it reads.
    struct UpgradeProbe {
        tracker: TaskTracker,
    }

    impl Handler for UpgradeProbe {
        async fn handle(
            self: Arc<Self>,
            mut req: Request<Incoming>,
            _: SocketAddr,
        ) -> Response<Full<Bytes>> {
            let (response, upgrade) = crate::net::http::accept_upgrade(&mut req).unwrap();
            crate::net::http::spawn_upgraded(
                &self.tracker,
                upgrade,
                tracing::Span::none(),
                |ws| async move {
                    let mut socket = crate::net::upgraded::Socket::take(ws.into_inner());
                    let said = format!("plain={}\n", socket.is_plain());
                    let (mut reader, mut writer) = socket.split();
                    writer.write_all(said.as_bytes()).await.unwrap();
                    tokio::io::copy(&mut reader, &mut writer).await.unwrap();
                },
            );
            response
        }
    }

    /// Serves `handler` on a loopback port: its address, the shutdown signal and the server's task.
    async fn serve<H: Handler>(
        handler: H,
        tracker: TaskTracker,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            admission: Admission::new(4, Family::default()),
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 8192,
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_http(
            listener,
            None,
            Arc::new(handler),
            limits,
            shutdown.clone(),
            tracker,
        ));
        (addr, shutdown, server)
    }

    #[tokio::test]
    async fn a_plain_upgraded_socket_is_taken_back_with_the_bytes_sent_along_with_its_request() {
        let tracker = TaskTracker::new();
        let probe = UpgradeProbe {
            tracker: tracker.clone(),
        };
        let (addr, shutdown, server) = serve(probe, tracker).await;
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The request and the first bytes after it in one write: the server reads them together.
        client
            .write_all(
                b"GET /ws HTTP/1.1\r\nHost: sidecar\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nearly",
            )
            .await
            .unwrap();
        let mut received = Vec::new();
        let mut chunk = [0u8; 1024];
        let expected = b"plain=true\nearly late";
        let mut sent_late = false;
        while !received.ends_with(expected) {
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .expect("the probe's answer within 10 s")
                .unwrap();
            assert!(
                n > 0,
                "closed early: {}",
                String::from_utf8_lossy(&received)
            );
            received.extend_from_slice(&chunk[..n]);
            if !sent_late && received.ends_with(b"early") {
                sent_late = true;
                client.write_all(b" late").await.unwrap();
            }
        }
        let received = String::from_utf8_lossy(&received);
        assert!(received.starts_with("HTTP/1.1 101"), "{received}");
        let body = &received[received.find("\r\n\r\n").unwrap() + 4..];
        assert_eq!(body, "plain=true\nearly late");
        shutdown.cancel();
        drop(client);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn accepted_connections_send_each_write_at_once() {
        let (addr, shutdown, server) = serve(NoDelayProbe, TaskTracker::new()).await;
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        client.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("nodelay=true"), "{response}");
        shutdown.cancel();
        server.await.unwrap();
    }
}
