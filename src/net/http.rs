//! The sidecar's own HTTP answers, shared by the router and the WebSocket handlers: plain-text responses
//! (refusals included), and the upgrade of `/snapshot` and `/changes` requests, whose socket then runs on its
//! own tracked task. A leaf below the handlers, so that they need not import the server that calls them.

use std::future::Future;

use bytes::Bytes;
use fastwebsockets::upgrade::UpgradeFut;
use fastwebsockets::WebSocket;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use tokio_util::task::TaskTracker;
use tracing::{debug, Instrument, Span};

use crate::net::ws::Io;

/// A `text/plain` response: every answer the sidecar writes itself, refusals included.
pub(crate) fn plain(status: StatusCode, body: impl Into<Bytes>) -> Answer {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A response the sidecar writes itself.
pub(crate) type Answer = Response<Full<Bytes>>;

/// Accepts a WebSocket upgrade request: the `101` response to send and the socket to come, or why the request is
/// not a valid upgrade (answered with `400`).
pub(crate) fn accept_upgrade(req: &mut Request<Incoming>) -> Result<(Answer, UpgradeFut), String> {
    fastwebsockets::upgrade::upgrade(req)
        .map(|(response, upgrade)| (response.map(|_| Full::default()), upgrade))
        .map_err(|err| format!("bad WebSocket upgrade: {err}\n"))
}

/// Runs `handler` on the upgraded socket on `tracker`, in `span`, once the client has switched protocols.
pub(crate) fn spawn_upgraded<F, Fut>(
    tracker: &TaskTracker,
    upgrade: UpgradeFut,
    span: Span,
    handler: F,
) where
    F: FnOnce(WebSocket<Io>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tracker.spawn(
        async move {
            match upgrade.await {
                Ok(ws) => handler(ws).await,
                Err(err) => debug!(error = %err, "upgrade failed"),
            }
        }
        .instrument(span),
    );
}
