//! Dialing Zero's change-streamer: the upstream WebSocket a subscription is relayed to, opened before the
//! subscriber's own upgrade is answered.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::net::tls::UpstreamTls;
use crate::net::ws::Io;
use crate::protocol;
use crate::streamer::config::UpstreamConfig;

/// Why a subscription could not be relayed; the subscriber gets an HTTP error before its upgrade.
#[derive(Debug, thiserror::Error)]
pub(super) enum DialError {
    #[error("upstream {addr} unreachable: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("upstream {addr} TLS handshake failed: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("upstream {addr} did not complete the WebSocket handshake within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("upstream {addr} refused the WebSocket upgrade: HTTP {status}")]
    Refused { addr: String, status: u16 },
    #[error("upstream {addr} WebSocket handshake failed: {reason}")]
    Handshake { addr: String, reason: String },
}

/// The request target sent upstream: the subscriber's path and query string, with `initial=true` turned into
/// `initial=false` when the sidecar owns cleanup.
pub(super) fn upstream_target(
    path: &str,
    query: Option<&str>,
    suppress_upstream_cleanup: bool,
) -> String {
    match query {
        None => path.to_string(),
        Some(query) if suppress_upstream_cleanup => {
            format!("{path}?{}", protocol::suppress_initial(query))
        }
        Some(query) => format!("{path}?{query}"),
    }
}

/// Opens the upstream WebSocket for `target` (path and query), under `upstream.connect_timeout`, which covers
/// the TLS handshake too.
pub(super) async fn connect(
    upstream: &UpstreamConfig,
    tls: Option<&UpstreamTls>,
    target: &str,
) -> Result<Io, DialError> {
    let addr = &upstream.address;
    tokio::time::timeout(upstream.connect_timeout, handshake(addr, tls, target))
        .await
        .unwrap_or_else(|_| {
            Err(DialError::Timeout {
                addr: addr.clone(),
                timeout: upstream.connect_timeout,
            })
        })
}

async fn handshake(addr: &str, tls: Option<&UpstreamTls>, target: &str) -> Result<Io, DialError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| DialError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    match tls {
        None => upgrade(addr, stream, target).await,
        Some(tls) => {
            let stream = tls.connect(stream).await.map_err(|source| DialError::Tls {
                addr: addr.to_string(),
                source,
            })?;
            upgrade(addr, stream, target).await
        }
    }
}

/// The WebSocket upgrade over an open connection, plain or TLS; either way the socket comes back as an [`Io`].
async fn upgrade<S>(addr: &str, stream: S, target: &str) -> Result<Io, DialError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let failed = |reason: String| DialError::Handshake {
        addr: addr.to_string(),
        reason,
    };
    let request = Request::get(target)
        .header(HOST, addr)
        .header(UPGRADE, "websocket")
        .header(CONNECTION, "Upgrade")
        .header(
            "Sec-WebSocket-Key",
            fastwebsockets::handshake::generate_key(),
        )
        .header("Sec-WebSocket-Version", "13")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(e.to_string()))?;
    // The connection future is driven here, in this task, until it hands the socket over; it finishes as soon as
    // a 101 arrives, possibly before the response future is polled again.
    let mut conn = std::pin::pin!(conn.with_upgrades());
    let mut conn_done = false;
    let mut send = std::pin::pin!(sender.send_request(request));
    let response = tokio::select! {
        biased;
        response = &mut send => response,
        result = &mut conn => {
            result.map_err(|e| failed(e.to_string()))?;
            conn_done = true;
            send.await
        }
    }
    .map_err(|e| failed(e.to_string()))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(DialError::Refused {
            addr: addr.to_string(),
            status: response.status().as_u16(),
        });
    }
    let upgrade_header = response
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok());
    if !upgrade_header.is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(failed("101 without Upgrade: websocket".into()));
    }
    let upgraded = if conn_done {
        hyper::upgrade::on(response).await
    } else {
        tokio::join!(hyper::upgrade::on(response), conn).0
    }
    .map_err(|e| failed(e.to_string()))?;
    Ok(TokioIo::new(upgraded))
}
