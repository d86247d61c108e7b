//! Reading a request's head before hyper sees it ([`read_head`]), bounded in size, and handing the bytes read on in
//! front of the socket ([`Rewind`]).

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

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

    /// The bytes not read back yet, and the socket.
    pub fn into_parts(self) -> (bytes::Bytes, S) {
        (self.prefix, self.inner)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

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
}
