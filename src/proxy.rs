//! The metrics proxy on Zero's litestream port: litestream's page with the `litestream_replica_progress` family
//! removed (`hide`) or reduced to the watermark the sidecar has already purged below (`clamp`), byte for byte
//! otherwise.
//!
//! Zero 0.20's replication-manager polls `http://localhost:{ZERO_LITESTREAM_PORT}/metrics` and purges the change
//! log on its own, blind to the reservations the sidecar holds. Behind this proxy it sees a healthy litestream
//! and never a watermark, so the sidecar alone decides cleanup (docs/protocol.md, "Two purgers"). When litestream
//! cannot be read the proxy answers 502, as a dead litestream would look to Zero.
//!
//! [`bind`] opens its listeners; [`crate::server::serve_http`] serves them with the [`Proxy`] handler.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::litestream::config::{Filter, ProxyMode};
use crate::litestream::filter::{clamp_progress_family, strip_progress_family};
use crate::net::client::HttpClient;
use crate::net::http::plain;
use crate::server::Handler;

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

/// The proxy's [`Handler`] for [`crate::server::serve_http`]: `GET /metrics` is litestream's page, filtered.
pub struct Proxy {
    pub scraper: HttpClient,
    pub mode: ProxyMode,
    pub filter: Filter,
    /// Where `clamp` reads the watermark purged below and its backup time.
    pub status: crate::cleanup::status::StatusHandle,
    /// `cleanup.requires = "restore"`: litestream may have no gauge of its own, and `clamp` makes one.
    pub fallback: Option<crate::litestream::filter::Fallback>,
}

impl Handler for Proxy {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        }
        if req.uri().path() != "/metrics" {
            return plain(
                StatusCode::NOT_FOUND,
                "not found: the metrics are at /metrics\n",
            );
        }
        match self.scraper.fetch().await {
            Ok(page) => {
                let filtered = match self.mode {
                    ProxyMode::Hide => strip_progress_family(&page),
                    ProxyMode::Clamp => {
                        let through = self.status.read(|s| s.purged_through.clone());
                        let through = through
                            .as_ref()
                            .map(|b| (b.watermark.as_str(), b.backed_up_at));
                        clamp_progress_family(&page, &self.filter, through, self.fallback.as_ref())
                    }
                };
                let body = match filtered {
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
                plain(
                    StatusCode::BAD_GATEWAY,
                    format!("litestream metrics unavailable: {err}\n"),
                )
            }
        }
    }
}
