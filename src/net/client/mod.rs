//! A plain HTTP/1.1 GET client ([`HttpClient`]): one request per call, no connection reuse, bounded in time and
//! size. It reads litestream's metrics page (for the monitor and the metrics proxy) and, for the `status`
//! subcommand, the daemon's `/status`.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, HOST, USER_AGENT};
use hyper::http::uri::Scheme;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tracing::debug;

#[cfg(test)]
pub(crate) mod tests;

/// Most a `Content-Length` header may pre-allocate, in bytes.
const INITIAL_CAPACITY: u64 = 1 << 20;

// Errors

/// Why a GET produced no page. The messages say `scrape`: every page the sidecar GETs is one it scrapes
/// (litestream's metrics, or `/status` for the `status` subcommand).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL cannot be fetched by [`HttpClient`]; `url` has any credentials removed.
    #[error("scrape {url}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("scrape {url}: HTTP status {status}")]
    Http { url: Uri, status: StatusCode },
    /// Connecting, writing the request or reading the response failed; the message includes hyper's cause.
    #[error("scrape {url}: {source}")]
    Io { url: Uri, source: std::io::Error },
    #[error("scrape {url}: no complete response within {after:?}")]
    Timeout { url: Uri, after: Duration },
    #[error("scrape {url}: body larger than {limit} bytes")]
    TooLarge { url: Uri, limit: usize },
}

impl HttpError {
    /// Worth retrying on the next tick without a human: litestream restarting, slow or briefly failing. The rest
    /// (a bad URL, a 404, an oversized or foreign page) will not fix itself.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Http { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::TOO_MANY_REQUESTS
                    || *status == StatusCode::REQUEST_TIMEOUT
            }
            Self::Io { .. } | Self::Timeout { .. } => true,
            Self::InvalidUrl { .. } | Self::TooLarge { .. } => false,
        }
    }
}

/// GETs one URL. Cheap to clone; holds no connection between calls.
#[derive(Debug, Clone)]
pub struct HttpClient {
    url: Uri,
    /// Host for `connect`, IPv6 brackets removed.
    connect_host: String,
    port: u16,
    /// The origin-form target sent on the request line.
    target: Uri,
    host_header: HeaderValue,
    /// Bounds connect, request and the whole body together.
    timeout: Duration,
    /// Largest body accepted, in bytes.
    max_bytes: usize,
    /// Set for `status` toward a daemon whose listener speaks TLS; litestream is always plain HTTP.
    tls: Option<ClientTls>,
}

/// TLS for a [`HttpClient`]: the connector and the name sent as SNI.
#[derive(Clone)]
struct ClientTls(
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ClientTls").field(&self.1).finish()
    }
}

impl HttpClient {
    /// Only `http://` URLs: litestream serves plain HTTP, on localhost in Zero's deployment; the sidecar's own
    /// listener speaks TLS only through [`HttpClient::with_tls`].
    pub fn new(url: Uri, timeout: Duration, max_bytes: usize) -> Result<Self, HttpError> {
        let invalid = |reason| HttpError::InvalidUrl {
            url: redacted(&url),
            reason,
        };
        match url.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            Some(scheme) if *scheme == Scheme::HTTPS => {
                return Err(invalid("https is not supported, only http"))
            }
            _ => return Err(invalid("only http:// URLs are supported")),
        }
        let Some(authority) = url.authority() else {
            return Err(invalid("no host"));
        };
        if authority.as_str().contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        let connect_host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_owned();
        let host_header = HeaderValue::from_str(authority.as_str())
            .map_err(|_| invalid("host is not a valid header"))?;
        let target = url
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
        Ok(Self {
            port: authority.port_u16().unwrap_or(80),
            url,
            connect_host,
            target,
            host_header,
            timeout,
            max_bytes,
            tls: None,
        })
    }

    /// Speaks TLS through `connector` after connecting; the URL keeps its `http://` scheme, as the request does.
    pub fn with_tls(mut self, connector: tokio_rustls::TlsConnector) -> Self {
        let name = rustls::pki_types::ServerName::try_from(self.connect_host.clone())
            .unwrap_or_else(|_| {
                rustls::pki_types::ServerName::try_from("localhost").expect("a DNS name")
            });
        self.tls = Some(ClientTls(connector, name));
        self
    }

    /// The URL this client GETs.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// The page's raw bytes, for the proxy to forward untouched. Any 2xx counts; the body is read whole.
    pub async fn fetch(&self) -> Result<Bytes, HttpError> {
        match tokio::time::timeout(self.timeout, self.fetch_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(HttpError::Timeout {
                url: self.url.clone(),
                after: self.timeout,
            }),
        }
    }

    async fn fetch_unbounded(&self) -> Result<Bytes, HttpError> {
        let stream = TcpStream::connect((self.connect_host.as_str(), self.port))
            .await
            .map_err(|source| self.io_error(source))?;
        match &self.tls {
            None => self.exchange(stream).await,
            Some(ClientTls(connector, name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|source| self.io_error(source))?;
                self.exchange(stream).await
            }
        }
    }

    /// The request and its answer over an open connection, plain or TLS.
    async fn exchange<S>(&self, stream: S) -> Result<Bytes, HttpError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| self.hyper_error(&err))?;
        // Aborted on every way out (done, error, timeout): a peer that never answers must not keep the task and
        // socket alive after the scrape has given up.
        let _connection = AbortOnDrop(tokio::spawn(async move {
            if let Err(err) = connection.await {
                debug!(error = %err, "metrics connection ended");
            }
        }));

        let request = Request::get(self.target.clone())
            .header(HOST, self.host_header.clone())
            .header(ACCEPT, "text/plain")
            .header(
                USER_AGENT,
                concat!("litestream-sidecar/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::<Bytes>::new())
            .expect("request built from validated parts");
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| self.hyper_error(&err))?;
        let status = response.status();
        if !status.is_success() {
            return Err(HttpError::Http {
                url: self.url.clone(),
                status,
            });
        }
        let too_large = || HttpError::TooLarge {
            url: self.url.clone(),
            limit: self.max_bytes,
        };
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.max_bytes as u64) {
            return Err(too_large());
        }

        let mut body = response.into_body();
        // A declared length only sizes the first allocation, and only up to a point: the frames decide.
        let mut page =
            BytesMut::with_capacity(declared.map_or(0, |len| len.min(INITIAL_CAPACITY) as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| self.hyper_error(&err))?;
            if let Ok(data) = frame.into_data() {
                if page.len() + data.len() > self.max_bytes {
                    return Err(too_large());
                }
                page.extend_from_slice(&data);
            }
        }
        debug!(url = %self.url, bytes = page.len(), "metrics page fetched");
        Ok(page.freeze())
    }

    fn io_error(&self, source: std::io::Error) -> HttpError {
        HttpError::Io {
            url: self.url.clone(),
            source,
        }
    }

    /// hyper's `Display` omits the cause ("connection error" alone), so the chain is spelled out here; the io kind
    /// underneath, if any, is kept.
    fn hyper_error(&self, err: &hyper::Error) -> HttpError {
        let mut message = err.to_string();
        let mut kind = std::io::ErrorKind::Other;
        let mut cause = std::error::Error::source(err);
        while let Some(inner) = cause {
            let _ = write!(message, ": {inner}");
            if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                kind = io.kind();
            }
            cause = inner.source();
        }
        self.io_error(std::io::Error::new(kind, message))
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `url` as text without any `user:password@`, for error messages.
fn redacted(url: &Uri) -> String {
    let text = url.to_string();
    match url.authority().map(|a| a.as_str()) {
        Some(authority) if authority.contains('@') => {
            let host_port = authority.rsplit('@').next().unwrap_or_default();
            text.replacen(authority, &format!("***@{host_port}"), 1)
        }
        _ => text,
    }
}
