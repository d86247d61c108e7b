//! WebSocket plumbing for the snapshot and relay handlers, after fastwebsockets has done the upgrade: frame
//! headers, a cancel-safe reader, message assembly under a size limit, an outgoing frame queue with a cancel-safe
//! flush, ping liveness, a deadline for write progress, and the close code each protocol violation earns. Both
//! handlers read, assemble and write with the same pieces:
//!
//! | piece            | `/snapshot` (`streamer::snapshot`)           | `/changes` (`streamer::relay`)              |
//! |------------------|----------------------------------------------|---------------------------------------------|
//! | [`Inbox`]        | `read_frame`: a frame at a time; small reads | `fill`, frames taken in place; 32 KiB reads |
//! | [`parse_header`] | inside `read_frame`                          | `header_at`, over the frames of each read   |
//! | [`Assembler`]    | `push_checked`: the ack, rule breaks closed  | `push`: commits and acks across fragments   |
//! | [`Outbox`]       | status, pings, pongs, closes                 | relayed frames, pongs, pings, closes        |
//! | [`Liveness`]     | the subscriber's socket                      | both hops                                   |
//! | [`WriteStall`]   | none: only a few small frames                | the subscriber's socket                     |
//! | [`read_close`]   | the peer's close                             | each side's close                           |
//!
//! fastwebsockets' own `read_frame` is not cancel-safe (dropping it mid-frame loses header bytes) and keeps an
//! 8 KiB buffer per socket for its lifetime. An [`Inbox`] is cancel-safe and keeps no buffer between frames
//! beyond its pending read's room, and an [`Outbox`] none once flushed, which matters for thousands of idle
//! reservation sockets. Writing a frame is not cancel-safe either: a handler queues frames in an [`Outbox`] and
//! flushes it as one more `select!` branch, so it keeps reading while a peer is slow to read. Relayed frames are
//! never decoded and re-encoded: their headers are read in place and they are queued as received.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use fastwebsockets::{Frame, OpCode, Payload, Role};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::protocol::close;

pub type Io = TokioIo<Upgraded>;

/// How long a closing side waits for the peer's close frame before dropping the connection.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// A frame whose payload no longer borrows the reader.
#[derive(Debug)]
pub struct OwnedFrame {
    pub fin: bool,
    pub opcode: OpCode,
    pub payload: BytesMut,
}

/// Why a connection is being closed by this side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseWith {
    pub code: u16,
    pub reason: String,
}

impl CloseWith {
    pub fn new(code: u16, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
        }
    }
}

/// What a close frame from the peer means, after RFC 6455 validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerClose {
    /// A valid close: echo this payload back (an empty one, or code plus reason).
    Valid {
        code: Option<u16>,
        payload: BytesMut,
    },
    /// Malformed close frame: answer with this close instead.
    Invalid(CloseWith),
}

/// Validates a received close frame (RFC 6455, sections 5.5, 5.5.1 and 7.4).
pub fn read_close(payload: BytesMut) -> PeerClose {
    if payload.len() > 125 {
        return PeerClose::Invalid(CloseWith::new(
            close::PROTOCOL_ERROR,
            "control frame too long",
        ));
    }
    match payload.len() {
        0 => PeerClose::Valid {
            code: None,
            payload,
        },
        1 => PeerClose::Invalid(CloseWith::new(close::PROTOCOL_ERROR, "invalid close frame")),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !is_valid_close_code(code) {
                PeerClose::Invalid(CloseWith::new(close::PROTOCOL_ERROR, "invalid close code"))
            } else if std::str::from_utf8(&payload[2..]).is_err() {
                PeerClose::Invalid(CloseWith::new(
                    close::INVALID_PAYLOAD,
                    "invalid UTF-8 in close reason",
                ))
            } else {
                PeerClose::Valid {
                    code: Some(code),
                    payload,
                }
            }
        }
    }
}

/// Codes a peer may put on the wire: 1000-1003, 1007-1011, 1012-1014 and the registered/private ranges.
fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Follows message boundaries across fragments (RFC 6455, section 5.4) and hands each whole message of at most `limit`
/// bytes to a callback: a frame's own payload when the frame is the whole message, else the fragments joined
/// (the only copy). Control frames are not part of messages; callers handle them before.
#[derive(Debug)]
pub struct Assembler {
    limit: usize,
    fragmented: Fragmented,
}

/// Where the assembler stands between two frames.
#[derive(Debug)]
enum Fragmented {
    /// Between messages.
    No,
    /// Inside a fragmented message, collecting it.
    Collecting { opcode: OpCode, buffer: BytesMut },
    /// Inside a fragmented message that grew past the limit: its fragments are followed, not kept.
    Skipping,
}

impl Assembler {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            fragmented: Fragmented::No,
        }
    }

    /// Takes one data frame from a peer whose frames are passed on, not policed (a relay): a message longer than
    /// the limit is skipped, a continuation outside a message ignored, and a new message starts afresh even
    /// inside a fragmented one. Returns what `on_message` returned, once a message is whole.
    pub fn push<T>(
        &mut self,
        fin: bool,
        opcode: OpCode,
        payload: &[u8],
        on_message: impl FnOnce(OpCode, &[u8]) -> T,
    ) -> Option<T> {
        match opcode {
            OpCode::Text | OpCode::Binary => {
                self.fragmented = if payload.len() > self.limit {
                    if fin {
                        Fragmented::No
                    } else {
                        Fragmented::Skipping
                    }
                } else if fin {
                    self.fragmented = Fragmented::No;
                    return Some(on_message(opcode, payload));
                } else {
                    Fragmented::Collecting {
                        opcode,
                        buffer: BytesMut::from(payload),
                    }
                };
                None
            }
            OpCode::Continuation => match &mut self.fragmented {
                Fragmented::No => None,
                Fragmented::Skipping => {
                    if fin {
                        self.fragmented = Fragmented::No;
                    }
                    None
                }
                Fragmented::Collecting { buffer, .. } => {
                    if buffer.len() + payload.len() > self.limit {
                        self.fragmented = if fin {
                            Fragmented::No
                        } else {
                            Fragmented::Skipping
                        };
                        return None;
                    }
                    buffer.extend_from_slice(payload);
                    if !fin {
                        return None;
                    }
                    let Fragmented::Collecting { opcode, buffer } =
                        std::mem::replace(&mut self.fragmented, Fragmented::No)
                    else {
                        unreachable!("matched as collecting above");
                    };
                    Some(on_message(opcode, &buffer))
                }
            },
            OpCode::Close | OpCode::Ping | OpCode::Pong => None,
        }
    }

    /// Takes one data frame from a peer this side serves and polices: a frame that breaks the fragmentation rules
    /// or makes its message longer than the limit, and a text message that is not UTF-8, are refused with the
    /// close they earn.
    pub fn push_checked<T>(
        &mut self,
        fin: bool,
        opcode: OpCode,
        payload: &[u8],
        on_message: impl FnOnce(OpCode, &[u8]) -> T,
    ) -> Result<Option<T>, CloseWith> {
        let protocol = |reason: &str| Err(CloseWith::new(close::PROTOCOL_ERROR, reason));
        let too_big = || Err(CloseWith::new(close::MESSAGE_TOO_BIG, "message too big"));
        match (opcode, &self.fragmented) {
            (
                OpCode::Text | OpCode::Binary,
                Fragmented::Collecting { .. } | Fragmented::Skipping,
            ) => {
                return protocol("new message inside a fragmented one");
            }
            (OpCode::Continuation, Fragmented::No) => {
                return protocol("continuation without a message");
            }
            (OpCode::Text | OpCode::Binary, _) if payload.len() > self.limit => return too_big(),
            (OpCode::Continuation, Fragmented::Collecting { buffer, .. })
                if buffer.len() + payload.len() > self.limit =>
            {
                return too_big();
            }
            _ => {}
        }
        self.push(fin, opcode, payload, |opcode, message| {
            if opcode == OpCode::Text && std::str::from_utf8(message).is_err() {
                return Err(CloseWith::new(close::INVALID_PAYLOAD, "invalid UTF-8"));
            }
            Ok(on_message(opcode, message))
        })
        .transpose()
    }
}

/// A frame header read in place from a buffer (RFC 6455, section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub fin: bool,
    pub opcode: OpCode,
    pub mask: Option<[u8; 4]>,
    /// Bytes of the header itself.
    pub len: usize,
    pub payload_len: usize,
}

impl Header {
    /// The whole frame: header and payload.
    pub fn frame_len(&self) -> usize {
        self.len + self.payload_len
    }

    pub fn is_control(&self) -> bool {
        matches!(self.opcode, OpCode::Close | OpCode::Ping | OpCode::Pong)
    }
}

/// Reads the frame header at the start of `buf`, for a relay that passes frames on without decoding them.
/// `Ok(None)`: more bytes are needed. `from_client`: the peer is a client, so its frames must be masked (and a
/// server's must not be). A frame whose payload exceeds `max_payload` is refused (1009) from its header alone.
pub fn parse_header(
    buf: &[u8],
    from_client: bool,
    max_payload: usize,
) -> Result<Option<Header>, CloseWith> {
    let protocol = |reason: &str| CloseWith::new(close::PROTOCOL_ERROR, reason);
    let [first, second, ..] = *buf else {
        return Ok(None);
    };
    if first & 0x70 != 0 {
        return Err(protocol("reserved bits set"));
    }
    let opcode = OpCode::try_from(first & 0x0f).map_err(|_| protocol("unknown opcode"))?;
    let fin = first & 0x80 != 0;
    let masked = second & 0x80 != 0;
    if masked != from_client {
        return Err(protocol(if from_client {
            "unmasked frame from a client"
        } else {
            "masked frame from a server"
        }));
    }
    let (payload_len, mut len) = match second & 0x7f {
        126 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => (u64::from_be_bytes(b.try_into().expect("8 bytes")), 10),
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    let is_control = matches!(opcode, OpCode::Close | OpCode::Ping | OpCode::Pong);
    if is_control && (!fin || payload_len > 125) {
        return Err(protocol("invalid control frame"));
    }
    // The bound on isize keeps `frame_len` and buffer reservations from overflowing whatever the limit is.
    let payload_len = match usize::try_from(payload_len) {
        Ok(n) if n <= max_payload && n <= isize::MAX as usize - 14 => n,
        _ => return Err(CloseWith::new(close::MESSAGE_TOO_BIG, "message too big")),
    };
    let mask = if masked {
        let Some(key) = buf.get(len..len + 4) else {
            return Ok(None);
        };
        len += 4;
        Some(key.try_into().expect("4 bytes"))
    } else {
        None
    };
    Ok(Some(Header {
        fin,
        opcode,
        mask,
        len,
        payload_len,
    }))
}

/// Why [`Inbox::read_frame`] stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The connection ended or failed: nobody to tell.
    Gone,
    /// The peer broke the protocol: close with this.
    Protocol(CloseWith),
}

/// How an [`Inbox`] sizes its reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// A socket that mostly waits and gets a few small frames (a reservation): room for 256 bytes at a time.
    Small,
    /// A socket carrying a stream (the relay): up to 32 KiB per read.
    Bulk,
}

impl Reads {
    /// Room a read is given, `(at least, else make this much)`.
    fn room(self) -> (usize, usize) {
        match self {
            Reads::Small => (64, 256),
            Reads::Bulk => (4 << 10, 32 << 10),
        }
    }
}

/// Bytes read from one peer's socket and not yet taken out as frames. The buffer is given back whenever it
/// empties, so an idle socket (a snapshot reservation waiting hours for its restore, a quiet subscription) holds
/// only the room its pending read is given ([`Reads`]). Cancel-safe: bytes leave the buffer only as whole frames,
/// and a read loses nothing when dropped, so [`Inbox::fill`] and [`Inbox::read_frame`] may sit in a `select!`
/// beside timers and signals.
///
/// Two ways to take frames out: [`Inbox::read_frame`], one whole frame at a time, unmasked and owned; or, for a
/// relay passing frames on as received, [`Inbox::header_at`] over [`Inbox::buffered`] to walk the frames of a
/// read in place, then [`Inbox::take_frames`] (data frames as received) and [`Inbox::take_frame`] (one frame
/// to answer).
#[derive(Debug)]
pub struct Inbox {
    buf: BytesMut,
    /// The peer is a client: its frames must be masked (and a server's must not be).
    from_client: bool,
    /// Largest payload accepted in one frame; a larger one is refused (1009) from its header alone.
    max_payload: usize,
    reads: Reads,
    /// The buffer was grown for a frame larger than a read's room: it is given back as soon as it empties.
    grown: bool,
    /// The last read left room in the buffer: the socket had nothing more at that moment.
    drained: bool,
}

impl Inbox {
    pub fn new(from_client: bool, max_payload: usize, reads: Reads) -> Self {
        Self {
            buf: BytesMut::new(),
            from_client,
            max_payload,
            reads,
            grown: false,
            drained: false,
        }
    }

    /// Reads what the socket has, making room first if the buffer is nearly full. `Ok(0)`: the peer closed the
    /// connection. Cancel-safe.
    pub async fn fill<R: AsyncRead + Unpin>(&mut self, reader: &mut R) -> std::io::Result<usize> {
        let (min_room, room) = self.reads.room();
        // A stream keeps its buffer, so it asks for a whole read's room each time (reclaimed in place once what was
        // taken from the buffer has been written): a read into whatever is left after the last frames were taken
        // would be a fraction of one, and cost as many more reads.
        let wanted = match self.reads {
            Reads::Small => min_room,
            Reads::Bulk => room,
        };
        if self.buf.capacity() - self.buf.len() < wanted {
            self.buf.reserve(room);
        }
        let offered = self.buf.capacity() - self.buf.len();
        let read = reader.read_buf(&mut self.buf).await;
        self.drained = matches!(read, Ok(n) if n < offered);
        read
    }

    /// Whether the last read took everything the socket had (it left room in the buffer): what it brought can be
    /// written on at once, as no more is waiting to join it in the same write.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// The bytes read and not yet taken out.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// The header of the frame starting `at` bytes into [`Inbox::buffered`] (see [`parse_header`]).
    pub fn header_at(&self, at: usize) -> Result<Option<Header>, CloseWith> {
        parse_header(&self.buf[at..], self.from_client, self.max_payload)
    }

    /// Makes room for more of the frame at the front, whose `header` has arrived: at most as much again as has
    /// arrived (at least a read's room), never the whole length the header claims. A peer that announces a
    /// 100 MiB frame and sends nothing more then costs what it sent, not what it claimed; a real large frame
    /// costs a few doublings on its way in.
    pub fn wait_for(&mut self, header: &Header) {
        let missing = header.frame_len().saturating_sub(self.buf.len());
        let (_, room) = self.reads.room();
        self.buf.reserve(missing.min(self.buf.len().max(room)));
        self.grown |= header.frame_len() > room;
    }

    /// Takes out the first `len` bytes, whole frames, exactly as received (headers and masks included).
    pub fn take_frames(&mut self, len: usize) -> Bytes {
        let frames = self.buf.split_to(len).freeze();
        self.release_if_empty();
        frames
    }

    /// Takes out the whole frame at the front, whose `header` was read, with its payload unmasked. A control
    /// frame's payload (at most 125 bytes) is copied, so that keeping it (a close to echo) does not keep the
    /// read buffer.
    pub fn take_frame(&mut self, header: &Header) -> OwnedFrame {
        let mut frame = self.buf.split_to(header.frame_len());
        let mut payload = if header.is_control() {
            BytesMut::from(&frame[header.len..])
        } else {
            frame.split_off(header.len)
        };
        if let Some(key) = header.mask {
            fastwebsockets::unmask(&mut payload, key);
        }
        self.release_if_empty();
        OwnedFrame {
            fin: header.fin,
            opcode: header.opcode,
            payload,
        }
    }

    /// Drops everything buffered: nothing after a close or a broken frame is read.
    pub fn discard(&mut self) {
        self.buf = BytesMut::new();
        self.grown = false;
    }

    /// Gives the allocation back once everything read has been taken, when the socket is one that mostly waits
    /// ([`Reads::Small`]) or the buffer was grown for a large frame. A stream's usual buffer ([`Reads::Bulk`]) is
    /// kept for the next reads, which then fill the rest of it, or all of it again once what was taken from it has
    /// been written and dropped, with no allocation per read; [`Inbox::release_if_idle`] gives it back when the
    /// stream goes quiet.
    fn release_if_empty(&mut self) {
        if self.buf.is_empty() && (self.reads == Reads::Small || self.grown) {
            self.discard();
        }
    }

    /// Gives the allocation back if nothing is buffered: for a stream that has gone quiet.
    pub fn release_if_idle(&mut self) {
        if self.buf.is_empty() {
            self.discard();
        }
    }

    /// The next whole frame, unmasked.
    pub async fn read_frame<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
    ) -> Result<OwnedFrame, ReadError> {
        loop {
            if let Some(header) = self.header_at(0).map_err(ReadError::Protocol)? {
                if self.buf.len() >= header.frame_len() {
                    return Ok(self.take_frame(&header));
                }
                self.wait_for(&header);
            }
            match self.fill(reader).await {
                Ok(0) | Err(_) => return Err(ReadError::Gone),
                Ok(_) => {}
            }
        }
    }
}

/// Payloads up to this size are copied next to their header so that many small frames leave in one write; larger
/// ones are queued as they are and written with `writev`, never copied.
const COPY_MAX: usize = 4096;
/// Relayed frames up to this many bytes are copied into an outbox rather than referenced.
const SMALL_FRAMES_COPIED: usize = 512;
/// Slices handed to one `writev` call.
const MAX_SLICES: usize = 64;

/// Frames queued for one socket, in order, written by [`Outbox::flush`]. Queuing never blocks and flushing is
/// cancel-safe (a partly written frame stays queued and is finished by the next flush), so a handler can flush as
/// one `select!` branch while it keeps reading. The outbox does not limit itself: the caller stops queuing data
/// (stops reading its source) while [`Outbox::len`] is at its limit, and control frames are small.
pub struct Outbox {
    /// A client masks every frame it sends; a server sends them as they are.
    mask: bool,
    /// Frames ready to write, oldest first; the first may be partly written already.
    chunks: VecDeque<Bytes>,
    /// Small frames gathered after `chunks`.
    tail: BytesMut,
    len: usize,
    /// Bytes written since the outbox was made: write progress, also through cancelled flushes.
    written: u64,
    closed: bool,
}

impl Outbox {
    /// `role` is this side's role on the socket.
    pub fn new(role: Role) -> Self {
        Self {
            mask: role == Role::Client,
            chunks: VecDeque::new(),
            tail: BytesMut::new(),
            len: 0,
            written: 0,
            closed: false,
        }
    }

    /// Bytes written so far, in total.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes queued and not yet written.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True once a close frame is queued: nothing is queued after it.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Queues one frame as given (fragments keep their `fin` and opcode). Ignored after a close.
    pub fn push(&mut self, fin: bool, opcode: OpCode, payload: BytesMut) {
        if self.closed {
            return;
        }
        if opcode == OpCode::Close {
            self.closed = true;
        }
        let mut frame = Frame::new(fin, opcode, None, Payload::Bytes(payload));
        if self.mask {
            // A fresh random key, applied in place: the payload is ours.
            frame.mask();
        }
        let mut head = [0u8; 14];
        let head_len = frame.fmt_head(&mut head);
        let Payload::Bytes(payload) = frame.payload else {
            unreachable!("the payload stays the BytesMut it was built from");
        };
        self.len += head_len + payload.len();
        if payload.len() <= COPY_MAX {
            self.tail.extend_from_slice(&head[..head_len]);
            self.tail.extend_from_slice(&payload);
        } else {
            if !self.tail.is_empty() {
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.chunks
                .push_back(Bytes::copy_from_slice(&head[..head_len]));
            self.chunks.push_back(payload.freeze());
        }
    }

    /// Queues frames exactly as they were received, headers included (a relay passing a peer's frames on).
    /// A few small frames (a read of acks) are copied after what is queued, so that they do not keep the reader's
    /// buffer from being reused while they wait, and a run of them leaves in one contiguous write. Ignored after
    /// a close.
    pub fn push_framed(&mut self, frames: Bytes) {
        if self.closed || frames.is_empty() {
            return;
        }
        self.len += frames.len();
        if frames.len() <= SMALL_FRAMES_COPIED {
            self.tail.extend_from_slice(&frames);
            return;
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.chunks.push_back(frames);
    }

    /// Queues a control frame with a copy of `payload` (at most 125 bytes by the protocol).
    pub fn push_control(&mut self, opcode: OpCode, payload: &[u8]) {
        self.push(true, opcode, BytesMut::from(payload));
    }

    /// Queues a close frame: `None` sends one without a status code (the peer reports 1005).
    pub fn push_close(&mut self, with: Option<&CloseWith>) {
        let mut payload = BytesMut::new();
        if let Some(with) = with {
            payload.extend_from_slice(&with.code.to_be_bytes());
            payload.extend_from_slice(crate::protocol::close_reason(&with.reason).as_bytes());
        }
        self.push(true, OpCode::Close, payload);
    }

    /// Writes everything queued. Cancel-safe: progress is kept in the outbox.
    pub async fn flush<W: AsyncWrite + Unpin>(&mut self, writer: &mut W) -> std::io::Result<()> {
        std::future::poll_fn(|cx| self.poll_flush(cx, writer)).await
    }

    /// Writes what the socket takes now, without waiting: `None` when it took less than everything (the task is
    /// then woken once it can take more, and [`Outbox::flush`] goes on from there). Cancel-safe, like `flush`.
    pub async fn flush_now<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
    ) -> Option<std::io::Result<()>> {
        match std::future::poll_fn(|cx| Poll::Ready(self.poll_flush(cx, writer))).await {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        }
    }

    fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        writer: &mut W,
    ) -> Poll<std::io::Result<()>> {
        while self.len > 0 {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let mut count = 0;
            for chunk in self.chunks.iter().take(MAX_SLICES - 1) {
                slices[count] = IoSlice::new(chunk);
                count += 1;
            }
            if count < MAX_SLICES - 1 && !self.tail.is_empty() {
                slices[count] = IoSlice::new(&self.tail);
                count += 1;
            }
            // One buffer (what a relay's read brings, most of the time) goes out with a plain send: a vectored
            // write costs the kernel an iovec import for nothing.
            let written = if count == 1 {
                ready!(Pin::new(&mut *writer).poll_write(cx, &slices[0]))?
            } else {
                ready!(Pin::new(&mut *writer).poll_write_vectored(cx, &slices[..count]))?
            };
            if written == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.consume(written);
        }
        // An idle outbox keeps no buffer: a reservation's socket writes a frame every ping interval at most.
        self.tail = BytesMut::new();
        Pin::new(writer).poll_flush(cx)
    }

    fn consume(&mut self, mut written: usize) {
        self.len -= written;
        self.written += written as u64;
        while written > 0 {
            match self.chunks.front_mut() {
                Some(chunk) if chunk.len() <= written => {
                    written -= chunk.len();
                    self.chunks.pop_front();
                }
                Some(chunk) => {
                    chunk.advance(written);
                    return;
                }
                None => {
                    self.tail.advance(written);
                    return;
                }
            }
        }
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("mask", &self.mask)
            .field("len", &self.len)
            .field("closed", &self.closed)
            .finish()
    }
}

/// Ping-based liveness for a socket: a ping every `interval`, and the peer counts as gone once nothing (pong or any
/// frame) arrived from it for `timeout`, as seen at a ping time. One unanswered ping is no reason to drop a peer:
/// a network stall of a few seconds would then cost a view-syncer its reservation, which Zero 0.20 never asks for
/// again. Zero's own server drops a client only when a whole 30 s ping interval brought nothing (docs/protocol.md,
/// "Liveness").
pub struct Liveness {
    ticker: Interval,
    silence: Silence,
}

impl Liveness {
    /// `timeout` should exceed `interval`, or a peer is dropped before it could answer a single ping.
    pub fn new(interval: Duration, timeout: Duration) -> Self {
        let start = Instant::now();
        let mut ticker = tokio::time::interval_at(start + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            ticker,
            silence: Silence::new(start, timeout),
        }
    }

    /// Records that the peer is alive. Only a flag: it is called on every read.
    pub fn heard(&mut self) {
        self.silence.heard();
    }

    /// Waits for the next ping time and returns it (as scheduled, so that checks are spaced exactly).
    pub async fn tick(&mut self) -> Instant {
        self.ticker.tick().await
    }

    /// Whether the peer is gone at ping time `at` (see [`Silence::check`]).
    pub fn is_silent(&mut self, at: Instant, excused: bool) -> bool {
        self.silence.check(at, excused)
    }
}

/// When a peer was last heard from, as seen at ping times: the decision of [`Liveness`] without its timer.
#[derive(Debug, Clone)]
pub struct Silence {
    timeout: Duration,
    /// The check at which the peer was last known alive (the socket's start until then).
    last: Instant,
    /// Something arrived since the previous check.
    heard: bool,
}

impl Silence {
    pub fn new(start: Instant, timeout: Duration) -> Self {
        Self {
            timeout,
            last: start,
            heard: false,
        }
    }

    pub fn heard(&mut self) {
        self.heard = true;
    }

    /// At the check at `now`: true when nothing arrived for at least `timeout`. A sign of life counts from the
    /// check that sees it, not from when it came, which errs toward keeping the peer (by at most one interval)
    /// and keeps the clock off the read path. `excused`: the peer could not have answered (its pings were stuck
    /// behind data it is still reading); that counts as heard.
    pub fn check(&mut self, now: Instant, excused: bool) -> bool {
        if std::mem::take(&mut self.heard) || excused {
            self.last = now;
        }
        now.saturating_duration_since(self.last) >= self.timeout
    }
}

/// Write progress toward a peer that is sent more than it reads: how long bytes have waited for it without any
/// being written, as seen at checks (the relay checks at each ping time, so that watching costs nothing on the
/// write path). A subscriber that stops reading answers no pings either, but its pings wait behind the data
/// queued toward it, so liveness excuses it; without this rule only TCP's retransmission timeouts, many minutes
/// later, would end it, while its upstream stays open and held back.
#[derive(Debug, Clone)]
pub struct WriteStall {
    timeout: Duration,
    /// Bytes written so far, as of the previous check.
    written: u64,
    /// The first check that saw bytes waiting with none written since; `None` while nothing waits.
    waiting_since: Option<Instant>,
}

impl WriteStall {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            written: 0,
            waiting_since: None,
        }
    }

    /// At the check at `now`, with `queued` bytes waiting and `written` written in total: true once bytes have
    /// waited for at least `timeout` without a byte written. Progress counts from the check that sees it, so with
    /// checks every `interval` a stall is found within `timeout + 2 × interval` of the last byte written.
    pub fn check(&mut self, now: Instant, queued: usize, written: u64) -> bool {
        let progressed = std::mem::replace(&mut self.written, written) != written;
        if queued == 0 {
            self.waiting_since = None;
            return false;
        }
        let since = match self.waiting_since {
            Some(since) if !progressed => since,
            _ => now,
        };
        self.waiting_since = Some(since);
        now.saturating_duration_since(since) >= self.timeout
    }
}

#[cfg(test)]
mod tests;
