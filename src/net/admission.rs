//! Which connections a listener takes on: a cap on how many are open at once (`server.max_connections`), the
//! refusal past it, and counts of every connection turned away, for `/metrics`. A connection holds its place
//! from accept until its socket closes, through a WebSocket upgrade: the place travels inside the socket
//! ([`Admitted`]), which hyper hands on to the upgraded connection.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// Why a connection or request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `server.max_connections` were open (HTTP 503).
    MaxConnections,
    /// The peer is outside `server.allow` (HTTP 403).
    NotAllowed,
    /// The request head did not arrive within `server.header_read_timeout` (connection closed).
    HeaderTimeout,
    /// The request head was longer than `server.max_header_bytes` (HTTP 431).
    HeaderTooLarge,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::NotAllowed => "not_allowed",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::HeaderTooLarge => "header_too_large",
        }
    }

    /// Its label in `litestream_sidecar_connections_refused_total`.
    pub fn label(self) -> RefusalLabel {
        RefusalLabel {
            reason: self.as_str(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabel {
    reason: &'static str,
}

/// Counts of refusals, by reason, and how many connections are open: shared by a listener's accept loop, its
/// router and `/metrics`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admission {
    places: Arc<Semaphore>,
    max: usize,
    refused: Family<RefusalLabel, Counter>,
    /// Refusal tasks writing a 503 right now: bounded too, or a flood past the cap would cost a task each.
    refusing: Arc<Semaphore>,
    log: Arc<Throttle>,
}

/// At most this many 503s are being written at once; past it a connection is closed without one.
const MAX_REFUSING: usize = 256;
/// How long a refused peer is given to take its 503.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

impl Admission {
    /// `refused` is where refusals are counted (the `/metrics` instrument, which several listeners may share).
    pub fn new(max_connections: usize, refused: Family<RefusalLabel, Counter>) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max_connections)),
            max: max_connections,
            refused,
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            log: Arc::new(Throttle::new(Duration::from_secs(10))),
        }
    }

    pub fn max_connections(&self) -> usize {
        self.max
    }

    /// Connections holding a place now.
    pub fn open(&self) -> usize {
        self.max - self.places.available_permits()
    }

    pub fn refused(&self) -> &Family<RefusalLabel, Counter> {
        &self.refused
    }

    /// Counts a refusal and logs it, at most once per interval per reason with the count since.
    pub fn count(&self, refusal: Refusal, detail: &dyn std::fmt::Display) {
        self.refused.get_or_create(&refusal.label()).inc();
        if let Some(suppressed) = self.log.allow(refusal) {
            warn!(reason = refusal.as_str(), suppressed, "refused: {detail}");
        }
    }

    /// Takes a place for a connection just accepted, or refuses it: a 503 written on its own short task (when
    /// fewer than [`MAX_REFUSING`] are being written), then the socket is closed.
    pub fn admit(&self, stream: TcpStream) -> Option<Admitted> {
        match self.places.clone().try_acquire_owned() {
            Ok(place) => Some(Admitted {
                stream,
                _place: place,
            }),
            Err(_) => {
                self.count(
                    Refusal::MaxConnections,
                    &format_args!("{} connections are open (server.max_connections)", self.max),
                );
                if let Ok(slot) = self.refusing.clone().try_acquire_owned() {
                    let body = format!(
                        "too many connections: {} are open (server.max_connections); retry later\n",
                        self.max
                    );
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(REFUSAL_LINGER, refuse(stream, body)).await;
                        drop(slot);
                    });
                }
                None
            }
        }
    }
}

/// Writes the 503 without reading the request, then waits briefly for the peer to close: closing a socket with
/// unread bytes in it would reset the connection and could lose the answer.
async fn refuse(mut stream: TcpStream, body: String) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream.write_all(body.as_bytes()).await.is_err()
        || stream.shutdown().await.is_err()
    {
        return;
    }
    let mut sink = [0u8; 1024];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// An accepted socket holding its place under the cap until it is dropped, whichever task owns it by then.
#[derive(Debug)]
pub struct Admitted {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What [`read_head`] found.
#[derive(Debug)]
pub enum Head {
    /// Everything read up to and including the blank line that ends the first request head (and whatever
    /// followed in the same reads).
    Complete(bytes::Bytes),
    /// The peer closed before sending a whole head.
    Closed,
    /// More than the limit arrived without the head ending.
    TooLarge,
}

/// Reads until the first request head is whole, in a buffer that grows with the bytes that arrive (from 256
/// bytes), never past `limit` and some slack. Blank lines before the request line are allowed, as RFC 9112
/// (section 2.2) asks; hyper parses what this returns.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    limit: usize,
) -> std::io::Result<Head> {
    let mut buf = bytes::BytesMut::new();
    loop {
        if buf.capacity() == buf.len() {
            // Doubling: what is reserved never exceeds what arrived (plus the first 256 bytes).
            buf.reserve(buf.len().max(256));
        }
        let scanned_to = buf.len().saturating_sub(3);
        if stream.read_buf(&mut buf).await? == 0 {
            return Ok(Head::Closed);
        }
        if head_end(&buf, scanned_to).is_some() {
            return Ok(Head::Complete(buf.freeze()));
        }
        if buf.len() > limit {
            return Ok(Head::TooLarge);
        }
    }
}

/// Where the first head ends: the blank line after at least one non-empty line, searched from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let from = from.max(start);
    buf[from..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| from + i + 4)
        .or_else(|| {
            // A bare LF line ending, which hyper's parser also takes.
            buf[from..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| from + i + 2)
        })
}

/// A socket with bytes already read from it put back in front: what [`read_head`] read, for hyper to parse.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: bytes::Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(prefix: bytes::Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let taken = self.prefix.split_to(n);
            buf.put_slice(&taken);
            if self.prefix.is_empty() {
                // Give the read buffer back: the connection may live for hours as a WebSocket.
                self.prefix = bytes::Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Log at most once per interval per reason: a flood of refusals must not become a flood of log lines.
#[derive(Debug)]
struct Throttle {
    interval: Duration,
    /// Per reason: when its last line was logged, and how many refusals went unlogged since.
    last: Mutex<std::collections::HashMap<Refusal, (Instant, u64)>>,
}

impl Throttle {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::default(),
        }
    }

    /// `Some(refusals of this reason not logged since its last line)` when this one should be logged.
    fn allow(&self, refusal: Refusal) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match last.get_mut(&refusal) {
            Some((at, suppressed)) if now.duration_since(*at) < self.interval => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                *at = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                last.insert(refusal, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_head_is_read_whole_as_it_trickles_in_and_handed_on_with_what_followed() {
        let request = b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\n";
        let (mut client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let head = read_head(&mut server, 8192).await.unwrap();
            (head, server)
        });
        for byte in request {
            client.write_all(&[*byte]).await.unwrap();
        }
        drop(client);
        let (head, server) = reader.await.unwrap();
        let Head::Complete(head) = head else {
            panic!("{head:?}")
        };
        assert!(
            head.len() >= 30,
            "the head, and whatever came with it: {head:?}"
        );
        let mut rewound = Rewind::new(head, server);
        let mut all = Vec::new();
        rewound.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, request);

        assert!(matches!(
            read_head(&mut &b"GET / HTTP/1.1\r\nHost: x\r\n"[..], 8192)
                .await
                .unwrap(),
            Head::Closed
        ));
        assert!(matches!(
            read_head(&mut &b"\r\n\r\n"[..], 8192).await.unwrap(),
            Head::Closed
        ));
        let endless = vec![b'a'; 20_000];
        assert!(matches!(
            read_head(&mut &endless[..], 8192).await.unwrap(),
            Head::TooLarge
        ));
    }

    #[tokio::test]
    async fn a_head_trickled_after_a_pause_loses_nothing() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client.write_all(b"GET / HTTP/1.1\r\nX-").await.unwrap();
        let mut buf_seen = 0;
        let read = read_head(&mut server, 16 << 10);
        tokio::pin!(read);
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut read)
            .await
            .is_err());
        // Bytes arrive one at a time; the future stays small and so does its buffer (checked via the result).
        for _ in 0..100 {
            client.write_all(b"a").await.unwrap();
            buf_seen += 1;
        }
        client.write_all(b": b\r\n\r\n").await.unwrap();
        let Head::Complete(head) = read.await.unwrap() else {
            panic!()
        };
        assert_eq!(head.len(), 18 + buf_seen + 7);
    }

    #[test]
    fn the_log_is_throttled_per_reason() {
        let throttle = Throttle::new(Duration::from_secs(3600));
        assert_eq!(throttle.allow(Refusal::NotAllowed), Some(0));
        assert_eq!(throttle.allow(Refusal::NotAllowed), None);
        assert_eq!(throttle.allow(Refusal::NotAllowed), None);
        // Another reason has its own line, and the count it reports is its own.
        assert_eq!(throttle.allow(Refusal::MaxConnections), Some(0));
        assert_eq!(throttle.allow(Refusal::MaxConnections), None);
        let quick = Throttle::new(Duration::ZERO);
        assert_eq!(quick.allow(Refusal::NotAllowed), Some(0));
        assert_eq!(quick.allow(Refusal::NotAllowed), Some(0));
        // Once the interval has passed, the line says how many went unlogged.
        let short = Throttle::new(Duration::from_millis(30));
        assert_eq!(short.allow(Refusal::HeaderTimeout), Some(0));
        assert_eq!(short.allow(Refusal::HeaderTimeout), None);
        assert_eq!(short.allow(Refusal::HeaderTimeout), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(short.allow(Refusal::HeaderTimeout), Some(2));
    }

    #[tokio::test]
    async fn places_are_held_until_the_socket_is_dropped_and_past_the_cap_a_503_is_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admission = Admission::new(1, Family::default());
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let first = admission.admit(listener.accept().await.unwrap().0);
        assert!(first.is_some());
        assert_eq!(admission.open(), 1);

        let mut c2 = TcpStream::connect(addr).await.unwrap();
        assert!(admission
            .admit(listener.accept().await.unwrap().0)
            .is_none());
        c2.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        c2.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(answer
            .ends_with("too many connections: 1 are open (server.max_connections); retry later\n"));
        let refused = admission
            .refused()
            .get_or_create(&Refusal::MaxConnections.label())
            .get();
        assert_eq!(refused, 1);

        drop(first);
        assert_eq!(admission.open(), 0);
        let _c3 = TcpStream::connect(addr).await.unwrap();
        assert!(admission
            .admit(listener.accept().await.unwrap().0)
            .is_some());
    }
}
