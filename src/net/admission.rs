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

impl Admitted {
    /// The socket, for a relay that reads and writes it directly (`net::upgraded`); the place is kept as long
    /// as this is.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }
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
