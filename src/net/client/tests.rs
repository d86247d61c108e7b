use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const FORK: &str = include_str!("../../../tests/fixtures/litestream/zero-fork.prom");

// --- HttpClient

/// Serves each connection with `respond`; the task ends with the test's runtime.
pub(crate) async fn serve<F>(respond: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let respond = Arc::new(respond);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let respond = respond.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let response = respond(req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Answers each connection with `response` written as is, after the request head; `None` never answers.
async fn serve_raw(response: Option<&'static [u8]>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let Some(response) = response else {
                held.push(stream);
                continue;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(response).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

fn client(addr: SocketAddr, max_bytes: usize) -> HttpClient {
    let url: Uri = format!("http://{addr}/metrics").parse().unwrap();
    HttpClient::new(url, Duration::from_secs(5), max_bytes).unwrap()
}

pub(crate) fn fixture_server(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let host_ok = req
        .headers()
        .get(HOST)
        .is_some_and(|h| h.as_bytes().starts_with(b"127.0.0.1:"));
    let accept_ok = req.headers().get(ACCEPT).is_some_and(|h| h == "text/plain");
    let status = match (req.uri().path(), host_ok && accept_ok) {
        ("/metrics", true) => StatusCode::OK,
        ("/metrics", false) => StatusCode::BAD_REQUEST,
        _ => StatusCode::NOT_FOUND,
    };
    let body = if status == StatusCode::OK {
        Bytes::from_static(FORK.as_bytes())
    } else {
        Bytes::new()
    };
    Response::builder()
        .status(status)
        .body(Full::new(body))
        .unwrap()
}

#[tokio::test]
async fn fetch_returns_the_page_byte_for_byte() {
    let addr = serve(fixture_server).await;
    let page = client(addr, 1 << 20).fetch().await.unwrap();
    assert_eq!(page, FORK.as_bytes());
}

#[tokio::test]
async fn server_error_is_a_transient_http_error() {
    let addr = serve(|_| {
        Response::builder()
            .status(500)
            .body(Full::new(Bytes::from("boom")))
            .unwrap()
    })
    .await;
    let err = client(addr, 1 << 20).fetch().await.unwrap_err();
    assert!(
        matches!(
            err,
            HttpError::Http {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_transient());
    assert_eq!(
        err.to_string(),
        format!("scrape http://{addr}/metrics: HTTP status 500 Internal Server Error")
    );
}

#[tokio::test]
async fn not_found_is_not_transient() {
    let addr = serve(fixture_server).await;
    let url: Uri = format!("http://{addr}/wrong").parse().unwrap();
    let err = HttpClient::new(url, Duration::from_secs(5), 1 << 20)
        .unwrap()
        .fetch()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            HttpError::Http {
                status: StatusCode::NOT_FOUND,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn body_over_the_limit_is_too_large() {
    let addr = serve(fixture_server).await;
    let err = client(addr, FORK.len() - 1).fetch().await.unwrap_err();
    assert!(
        matches!(err, HttpError::TooLarge { limit, .. } if limit == FORK.len() - 1),
        "{err}"
    );
    assert!(!err.is_transient());
    assert_eq!(
        client(addr, FORK.len()).fetch().await.unwrap().len(),
        FORK.len()
    );
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_too_large() {
    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                             6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n";
    let addr = serve_raw(Some(CHUNKED)).await;
    let err = client(addr, 11).fetch().await.unwrap_err();
    assert!(
        matches!(err, HttpError::TooLarge { limit: 11, .. }),
        "{err}"
    );
    assert_eq!(
        client(addr, 12).fetch().await.unwrap(),
        &b"abcdefghijkl"[..]
    );
}

#[tokio::test]
async fn truncated_body_is_an_io_error() {
    const SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this";
    let addr = serve_raw(Some(SHORT)).await;
    let err = client(addr, 1 << 20).fetch().await.unwrap_err();
    assert!(matches!(err, HttpError::Io { .. }), "{err}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn silent_server_times_out() {
    let addr = serve_raw(None).await;
    let url: Uri = format!("http://{addr}/metrics").parse().unwrap();
    let scraper = HttpClient::new(url, Duration::from_millis(200), 1 << 20).unwrap();
    let started = Instant::now();
    let err = scraper.fetch().await.unwrap_err();
    assert!(
        matches!(err, HttpError::Timeout { after, .. } if after == Duration::from_millis(200)),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.is_transient());
}

#[tokio::test]
async fn closed_port_is_an_io_error() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let err = client(addr, 1 << 20).fetch().await.unwrap_err();
    match &err {
        HttpError::Io { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused)
        }
        other => panic!("expected Io, got {other}"),
    }
    assert!(err.is_transient());
    assert!(
        err.to_string()
            .starts_with(&format!("scrape http://{addr}/metrics: ")),
        "{err}"
    );
}

#[test]
fn only_plain_http_urls_are_accepted() {
    let new = |url: &str| HttpClient::new(url.parse().unwrap(), Duration::from_secs(1), 1);
    let reason = |url: &str| match new(url).unwrap_err() {
        HttpError::InvalidUrl { reason, .. } => reason,
        other => panic!("{other}"),
    };
    assert!(reason("https://localhost:4850/metrics").contains("https"));
    assert!(reason("localhost:4850").contains("http://"));
    assert!(reason("/metrics").contains("http://"));
    assert!(reason("http://user:secret@localhost:4850/metrics").contains("credentials"));
    let err = new("http://user:secret@localhost:4850/metrics")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("secret"), "{err}");

    let ok = new("http://[::1]:4860/metrics").unwrap();
    assert_eq!(
        (
            ok.connect_host.as_str(),
            ok.port,
            ok.host_header.to_str().unwrap()
        ),
        ("::1", 4860, "[::1]:4860")
    );
    let ok = new("http://localhost").unwrap();
    assert_eq!((ok.port, ok.target.to_string().as_str()), (80, "/"));
    assert_eq!(
        new("http://h:1/m?x=1").unwrap().target.to_string(),
        "/m?x=1"
    );
}
