//! A relayed WebSocket's socket taken back from hyper once the upgrade is done.
//!
//! hyper hands an upgraded connection over as [`Upgraded`](hyper::upgrade::Upgraded): every read passes its buffer through a boxed,
//! dynamically dispatched socket and two adapters between hyper's and Tokio's I/O traits, and
//! `tokio::io::split` then takes a lock on every poll of either half. A relay polls its four halves on every
//! wake-up, so on Zero's traffic (a wake-up for every few messages) these layers were a tenth of its own CPU
//! (docs/benchmarks.md, "The relay on Zero's own stream"). A connection that is plain TCP underneath (accepted
//! by the listener without TLS, or dialed to the upstream without TLS) is taken back as its [`TcpStream`] and
//! split by borrowing, which costs nothing per poll; anything else keeps the layers.
//!
//! Bytes hyper read past the upgrade's head (a subscriber's first frames sent along with its request, the
//! upstream's first message in the 101's segment) come back with the socket and are read first.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, TcpStream};

use super::admission::Admitted;
use super::head::Rewind;
use super::ws::Io;

/// An upgraded connection's socket, as plain as it could be taken back.
pub enum Socket {
    /// Plain TCP: the stream (kept in whatever holds it, an admitted connection keeps its place under
    /// `server.max_connections`) and the bytes already read from it.
    Tcp { owner: Owner, early: Bytes },
    /// TLS, or a socket of a type not known here: read and written through hyper's layers.
    Layered(Io),
}

/// What owns a plain connection's [`TcpStream`].
pub enum Owner {
    /// Accepted by the listener.
    Accepted(Admitted),
    /// Dialed to the upstream.
    Dialed(TcpStream),
}

impl Owner {
    fn stream(&mut self) -> &mut TcpStream {
        match self {
            Owner::Accepted(admitted) => admitted.stream_mut(),
            Owner::Dialed(stream) => stream,
        }
    }
}

/// The socket types hyper is given by this crate: the listener's plain connections (`server.rs`) and the
/// upstream's plain dials (`streamer::relay::upstream`).
type AcceptedIo = TokioIo<Rewind<Admitted>>;
type DialedIo = TokioIo<TcpStream>;

impl Socket {
    /// Takes `io` back from hyper's layers when it is plain TCP underneath.
    pub fn take(io: Io) -> Socket {
        let upgraded = match io.into_inner().downcast::<AcceptedIo>() {
            Ok(parts) => {
                let (unread, admitted) = parts.io.into_inner().into_parts();
                // hyper read what it holds from the front of the rewound bytes; what it did not read comes after.
                let early = if unread.is_empty() {
                    parts.read_buf
                } else {
                    [parts.read_buf, unread].concat().into()
                };
                return Socket::Tcp {
                    owner: Owner::Accepted(admitted),
                    early,
                };
            }
            Err(upgraded) => upgraded,
        };
        match upgraded.downcast::<DialedIo>() {
            Ok(parts) => Socket::Tcp {
                owner: Owner::Dialed(parts.io.into_inner()),
                early: parts.read_buf,
            },
            Err(upgraded) => Socket::Layered(TokioIo::new(upgraded)),
        }
    }

    /// Whether the socket was taken back as plain TCP.
    #[cfg(test)]
    pub fn is_plain(&self) -> bool {
        matches!(self, Socket::Tcp { .. })
    }

    /// The reading and writing halves, usable at once from one task.
    pub fn split(&mut self) -> (Reader<'_>, Writer<'_>) {
        match self {
            Socket::Tcp { owner, early } => {
                let early = std::mem::take(early);
                let (read, write) = owner.stream().split();
                (Reader::Tcp { read, early }, Writer::Tcp(write))
            }
            Socket::Layered(io) => {
                let (read, write) = tokio::io::split(io);
                (Reader::Layered(read), Writer::Layered(write))
            }
        }
    }
}

/// The reading half of a [`Socket`].
pub enum Reader<'a> {
    Tcp {
        read: tcp::ReadHalf<'a>,
        /// Read before the socket.
        early: Bytes,
    },
    Layered(tokio::io::ReadHalf<&'a mut Io>),
}

/// The writing half of a [`Socket`].
pub enum Writer<'a> {
    Tcp(tcp::WriteHalf<'a>),
    Layered(tokio::io::WriteHalf<&'a mut Io>),
}

impl AsyncRead for Reader<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Reader::Tcp { read, early } if early.is_empty() => Pin::new(read).poll_read(cx, buf),
            Reader::Tcp { early, .. } => {
                let n = early.len().min(buf.remaining());
                buf.put_slice(&early[..n]);
                early.advance(n);
                Poll::Ready(Ok(()))
            }
            Reader::Layered(read) => Pin::new(read).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Writer<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Writer::Tcp(write) => Pin::new(write).poll_write(cx, buf),
            Writer::Layered(write) => Pin::new(write).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Writer::Tcp(write) => Pin::new(write).poll_write_vectored(cx, bufs),
            Writer::Layered(write) => Pin::new(write).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Writer::Tcp(write) => write.is_write_vectored(),
            Writer::Layered(write) => write.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(write) => Pin::new(write).poll_flush(cx),
            Writer::Layered(write) => Pin::new(write).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(write) => Pin::new(write).poll_shutdown(cx),
            Writer::Layered(write) => Pin::new(write).poll_shutdown(cx),
        }
    }
}
