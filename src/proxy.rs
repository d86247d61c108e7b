//! The metrics proxy on Zero's litestream port: litestream's page with the `litestream_replica_progress` family
//! removed, byte for byte otherwise.
//!
//! Zero 0.20's replication-manager polls `http://localhost:{ZERO_LITESTREAM_PORT}/metrics` and purges the change
//! log on its own, blind to the reservations the sidecar holds. Behind this proxy it sees a healthy litestream
//! and never a watermark, so the sidecar alone decides cleanup (PROTOCOL.md §11.6). When litestream cannot be
//! read the proxy answers 502, as a dead litestream would look to Zero.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::litestream::{self, Scraper};

/// The Prometheus text format litestream serves by default.
const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds every address `host:port` resolves to: Zero fetches `localhost`, which may be 127.0.0.1, ::1 or both.
pub async fn bind(listen: &str) -> std::io::Result<Vec<TcpListener>> {
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen).await?.collect();
    addrs.sort();
    addrs.dedup();
    let mut listeners = Vec::with_capacity(addrs.len());
    for addr in addrs {
        match TcpListener::bind(addr).await {
            Ok(listener) => listeners.push(listener),
            // ::1 may resolve on a host without IPv6; serving the other addresses is still right.
            Err(err) if addr.is_ipv6() && !listeners.is_empty() => {
                warn!(%addr, error = %err, "metrics proxy cannot listen on this address; skipped");
            }
            Err(err) => {
                return Err(std::io::Error::new(
                    err.kind(),
                    format!("metrics proxy on {addr}: {err}"),
                ));
            }
        }
    }
    if listeners.is_empty() {
        return Err(std::io::Error::other(format!(
            "{listen} resolves to no address"
        )));
    }
    Ok(listeners)
}

/// Serves the proxy on every listener until `shutdown`.
pub async fn serve(
    listeners: Vec<TcpListener>,
    scraper: Scraper,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let scraper = Arc::new(scraper);
    for listener in listeners {
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "metrics proxy listening");
        }
        let scraper = scraper.clone();
        let shutdown = shutdown.clone();
        let connections = tracker.clone();
        tracker.spawn(async move {
            loop {
                let stream = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(err) => {
                            warn!(error = %err, "metrics proxy accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let scraper = scraper.clone();
                let shutdown = shutdown.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let scraper = scraper.clone();
                        async move { Ok::<_, Infallible>(handle(req, &scraper).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(std::time::Duration::from_secs(10))
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    let result = tokio::select! {
                        result = conn.as_mut() => result,
                        _ = shutdown.cancelled() => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    };
                    if let Err(err) = result {
                        debug!(error = %err, "metrics proxy connection ended with an error");
                    }
                });
            }
        });
    }
}

async fn handle(req: Request<Incoming>, scraper: &Scraper) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".into(),
        );
    }
    if req.uri().path() != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n".into(),
        );
    }
    match scraper.fetch().await {
        Ok(page) => {
            let body = match litestream::strip_progress_family(&page) {
                std::borrow::Cow::Borrowed(_) => page,
                std::borrow::Cow::Owned(stripped) => Bytes::from(stripped),
            };
            let mut response = Response::new(Full::new(body));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
            response
        }
        Err(err) => {
            debug!(error = %err, "metrics proxy: litestream unreadable");
            text(
                StatusCode::BAD_GATEWAY,
                format!("litestream metrics unavailable: {err}\n"),
            )
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
