//! The sidecar's own plain HTTP answers, shared by the router and the handlers that refuse a request before its
//! upgrade. A leaf, so that the handlers need not import the server that calls them.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// A `text/plain` response: every answer the sidecar writes itself, refusals included.
pub(crate) fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
