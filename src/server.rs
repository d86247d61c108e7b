//! The HTTP front door: accept loop, hyper HTTP/1 with upgrades, and the endpoints.
//!
//! - `GET /` — liveness: 200 `OK` whenever the process serves requests.
//! - `GET /metrics` — the sidecar's own Prometheus metrics ([`crate::metrics`]).
//! - `GET /keepalive` — readiness: 200 `OK` when every readiness condition holds, else 503 naming what is missing.
//! - `GET /replication/v{N}/snapshot?taskID=…` — snapshot reservation WebSocket ([`crate::reservations`]).
//! - `GET /replication/v{N}/changes?…` — the change-stream relay ([`crate::relay`]), v1 to v6.
//!
//! Requests Zero would reject are refused with HTTP 400 *before* the upgrade, with Zero's own message as the body:
//! a 0.20 view-syncer whose snapshot socket is accepted and then closed without a status waits forever
//! (PROTOCOL.md W9), while a refused upgrade makes it fail and restart. Likewise a subscription is answered only
//! once its upstream WebSocket is open; if it cannot be opened the subscriber gets HTTP 502, which makes Zero's
//! client back off instead of reconnecting every 25 ms (W10).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, debug_span, info_span, warn, Instrument};

use crate::protocol::{self, Route};
use crate::relay::{self, RelayContext};
use crate::reservations::{self, SnapshotContext};

/// A client that has not sent its request head within this time is dropped (slow-loris protection).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Back-off after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Conditions `/keepalive` waits for: accepting connections, the change DB reachable with Zero's schema, and
/// (unless discovery is off) `ownerAddress` naming the sidecar.
pub struct Readiness {
    listening: AtomicBool,
    discovery_mode: crate::discovery::Mode,
    discovery: crate::discovery::StateHandle,
}

impl Readiness {
    pub fn new(
        discovery_mode: crate::discovery::Mode,
        discovery: crate::discovery::StateHandle,
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
        } else if self.discovery_mode != crate::discovery::Mode::Off
            && state.registration != Some(crate::discovery::Registration::Registered)
        {
            missing.push("ownerAddress does not name this sidecar");
        }
        missing
    }
}

/// Where `/metrics` reads its figures.
pub struct MetricsSources {
    pub instruments: crate::metrics::Instruments,
    pub registry: crate::reservations::Registry,
    pub subscribers: crate::subscribers::Subscribers,
    pub status: crate::monitor::StatusHandle,
    pub discovery_mode: crate::discovery::Mode,
    pub discovery: crate::discovery::StateHandle,
}

impl MetricsSources {
    pub fn snapshot(&self) -> crate::metrics::Snapshot {
        let status = self.status.get();
        let discovery = self.discovery.get();
        crate::metrics::Snapshot {
            reservations_open: self.registry.len() as u64,
            subscribers: self.subscribers.connected() as u64,
            newest_backup: status.newest_backup.map(|(watermark, at)| {
                let age = std::time::SystemTime::now()
                    .duration_since(at)
                    .unwrap_or_default()
                    .as_secs_f64();
                (watermark, age)
            }),
            cleanup_delay_seconds: self.registry.cleanup_delay().as_secs_f64(),
            purge_runs: status.purges,
            purged_rows: status.purged_rows,
            purge_failures: status.purge_failures.total,
            purge_consecutive_failures: status.purge_failures.consecutive,
            purge_failing: status.purge_failures.last.as_ref().map(|l| l.class),
            holds: status.holds,
            registered: (self.discovery_mode != crate::discovery::Mode::Off).then(|| {
                discovery.registration == Some(crate::discovery::Registration::Registered)
            }),
            change_db_up: discovery.db_up,
            scrape_errors: status.scrape_errors,
        }
    }
}

/// State every request handler reads.
pub struct Shared {
    pub metrics: MetricsSources,
    pub snapshot: SnapshotContext,
    pub relay: RelayContext,
    pub readiness: Readiness,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
}

/// Accepts connections until `shutdown` is cancelled. Connections already open are tracked in `shared.tracker`.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    shared.readiness.set_listening(true);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let span = debug_span!("conn", %peer);
        shared
            .tracker
            .spawn(serve_connection(stream, peer, shared.clone()).instrument(span));
    }
    shared.readiness.set_listening(false);
}

async fn serve_connection(stream: tokio::net::TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let service = {
        let shared = shared.clone();
        hyper::service::service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(handle(req, peer, &shared).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = shared.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        debug!(error = %err, "connection ended with an error");
    }
}

async fn handle(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    let route = protocol::route(req.uri().path());
    match route {
        Route::Root => plain(StatusCode::OK, "OK"),
        Route::Keepalive => {
            let missing = shared.readiness.missing();
            if missing.is_empty() && !shared.shutdown.is_cancelled() {
                // Still ready while purges fail: reservations and subscriptions are served as before, and taking
                // the sidecar out of rotation would cut view-syncers off. The body says what is wrong.
                match shared.metrics.status.get().cleanup_problem() {
                    None => plain(StatusCode::OK, "OK"),
                    Some(problem) => plain(StatusCode::OK, format!("OK; {problem}\n")),
                }
            } else if shared.shutdown.is_cancelled() {
                plain(StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n")
            } else {
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", missing.join(", ")),
                )
            }
        }
        Route::Metrics => {
            let text = crate::metrics::render(&shared.metrics.instruments, &shared.metrics.snapshot());
            let mut response = plain(StatusCode::OK, text);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            );
            response
        }
        Route::NotFound => plain(StatusCode::NOT_FOUND, "not found\n"),
        Route::Snapshot(_) | Route::Changes(_) if !fastwebsockets::upgrade::is_upgrade_request(&req) => plain(
            StatusCode::BAD_REQUEST,
            "this path serves Zero's change-streamer protocol over WebSocket: send a WebSocket upgrade request\n",
        ),
        Route::Snapshot(version) => {
            let (version, task_id) = match protocol::check_snapshot(&version, req.uri().query()) {
                Ok(checked) => checked,
                Err(message) => {
                    debug!(%message, "snapshot request refused");
                    return plain(StatusCode::BAD_REQUEST, message);
                }
            };
            if shared.shutdown.is_cancelled() {
                return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
            }
            let (response, upgrade) = match fastwebsockets::upgrade::upgrade(&mut req) {
                Ok(pair) => pair,
                Err(err) => return plain(StatusCode::BAD_REQUEST, format!("bad WebSocket upgrade: {err}\n")),
            };
            let ctx = shared.snapshot.clone();
            let span = info_span!("reservation", task_id = %task_id, %peer);
            shared.tracker.spawn(
                async move {
                    match upgrade.await {
                        Ok(ws) => {
                            reservations::handle_snapshot(ctx, version, task_id, ws).await;
                        }
                        Err(err) => debug!(error = %err, "upgrade failed"),
                    }
                }
                .instrument(span),
            );
            response.map(|_| Full::default())
        }
        Route::Changes(version) => handle_changes(req, version, peer, shared).await,
    }
}

/// Opens the upstream WebSocket first, inside the request, so that a subscription the sidecar cannot relay is
/// refused before the subscriber's upgrade completes.
async fn handle_changes(
    mut req: Request<Incoming>,
    version: protocol::Version,
    peer: SocketAddr,
    shared: &Arc<Shared>,
) -> Response<Full<Bytes>> {
    if let Err(message) = protocol::check_changes(&version) {
        debug!(%message, "subscription refused");
        return plain(StatusCode::BAD_REQUEST, message);
    }
    if shared.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let (response, upgrade) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(pair) => pair,
        Err(err) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("bad WebSocket upgrade: {err}\n"),
            )
        }
    };
    let ctx = shared.relay.clone();
    let settings = &ctx.settings;
    let query = req.uri().query();
    let subscription = protocol::parse_subscriber_context(query);
    let target = relay::upstream_target(
        req.uri().path(),
        query,
        settings.relay.suppress_upstream_cleanup,
    );
    let span = info_span!("relay", %peer, upstream = %settings.upstream.address);
    let upstream = match relay::connect(&settings.upstream, &target)
        .instrument(span.clone())
        .await
    {
        Ok(upstream) => upstream,
        Err(err) => {
            shared.metrics.instruments.upstream_connect_errors.inc();
            span.in_scope(|| warn!(error = %err, "subscription refused: upstream unavailable"));
            return plain(err.status(), format!("{err}\n"));
        }
    };
    if shared.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    shared.tracker.spawn(
        async move {
            match upgrade.await {
                Ok(ws) => {
                    relay::handle_changes(ctx, subscription, ws, upstream).await;
                }
                // The upstream socket is dropped with the task: Zero sees the subscriber leave.
                Err(err) => debug!(error = %err, "upgrade failed"),
            }
        }
        .instrument(span),
    );
    response.map(|_| Full::default())
}

fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
