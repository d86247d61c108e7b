//! WebSocket plumbing shared by the snapshot and relay handlers: a cancel-safe way to read frames, message
//! assembly under a size limit, ping liveness, the close code each protocol violation earns, and a polite close.
//!
//! fastwebsockets' `read_frame` is not cancel-safe: dropping it mid-frame loses header bytes. So a read is a future
//! that owns the read half and hands it back with the frame ([`next_frame`]); a handler keeps that one future
//! pinned across `select!` iterations instead of re-creating it, and needs no extra task or channel per socket.

use std::time::Duration;

use bytes::BytesMut;
use fastwebsockets::{
    Frame, OpCode, Payload, WebSocket, WebSocketError, WebSocketRead, WebSocketWrite,
};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::protocol::close;

pub type Io = TokioIo<Upgraded>;
pub type Reader<S = Io> = WebSocketRead<ReadHalf<S>>;
pub type Writer<S = Io> = WebSocketWrite<WriteHalf<S>>;

/// How long a closing side waits for the peer's close frame before dropping the connection.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// A frame whose payload no longer borrows the reader.
#[derive(Debug)]
pub struct OwnedFrame {
    pub fin: bool,
    pub opcode: OpCode,
    pub payload: BytesMut,
}

/// Splits an upgraded socket; pings and closes are answered by the handler, not by the crate, because the
/// handler owns the write half.
pub fn split<S>(mut ws: WebSocket<S>, max_message_bytes: usize) -> (Reader<S>, Writer<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.set_auto_pong(false);
    ws.set_auto_close(false);
    // The crate refuses frames of `limit` bytes or more; the sidecar's limit is inclusive.
    ws.set_max_message_size(max_message_bytes.saturating_add(1));
    ws.split(tokio::io::split)
}

/// Reads one frame, returning the reader with it so the caller can start the next read.
pub async fn next_frame<S>(mut reader: Reader<S>) -> (Reader<S>, Result<OwnedFrame, WebSocketError>)
where
    S: tokio::io::AsyncRead + Unpin,
{
    // With auto pong and auto close off the crate never has an obligated frame to send.
    let mut no_send = |_: Frame<'_>| async { Ok::<(), std::convert::Infallible>(()) };
    let result = reader
        .read_frame(&mut no_send)
        .await
        .map(|frame| OwnedFrame {
            fin: frame.fin,
            opcode: frame.opcode,
            payload: match frame.payload {
                Payload::Bytes(bytes) => bytes,
                other => BytesMut::from(&other[..]),
            },
        });
    (reader, result)
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

/// The close a read error earns, or `None` when the peer is simply gone and there is nobody to tell.
pub fn close_for_error(err: &WebSocketError) -> Option<CloseWith> {
    use WebSocketError as E;
    match err {
        E::FrameTooLarge => Some(CloseWith::new(close::MESSAGE_TOO_BIG, "message too big")),
        E::InvalidUTF8 => Some(CloseWith::new(close::INVALID_PAYLOAD, "invalid UTF-8")),
        E::UnexpectedEOF
        | E::IoError(_)
        | E::ConnectionClosed
        | E::SendError(_)
        | E::HTTPError(_) => None,
        other => Some(CloseWith::new(close::PROTOCOL_ERROR, other.to_string())),
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

/// Validates a received close frame (RFC 6455 §5.5.1, §7.4).
pub fn read_close(payload: BytesMut) -> PeerClose {
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
pub fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Collects a message from a frame and its continuations, refusing to grow past the limit.
#[derive(Debug)]
pub struct Assembler {
    limit: usize,
    partial: Option<(OpCode, BytesMut)>,
}

/// One step of message assembly.
#[derive(Debug)]
pub enum Assembled {
    /// A complete text or binary message.
    Message(OpCode, BytesMut),
    /// A fragment was buffered; more must follow.
    Incomplete,
    /// A control frame, passed through untouched (it may arrive between fragments).
    Control(OwnedFrame),
}

impl Assembler {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            partial: None,
        }
    }

    pub fn push(&mut self, frame: OwnedFrame) -> Result<Assembled, CloseWith> {
        match frame.opcode {
            OpCode::Close | OpCode::Ping | OpCode::Pong => Ok(Assembled::Control(frame)),
            OpCode::Text | OpCode::Binary => {
                if self.partial.is_some() {
                    return Err(CloseWith::new(
                        close::PROTOCOL_ERROR,
                        "new message inside a fragmented one",
                    ));
                }
                if frame.fin {
                    return finish(frame.opcode, frame.payload);
                }
                self.partial = Some((frame.opcode, frame.payload));
                Ok(Assembled::Incomplete)
            }
            OpCode::Continuation => {
                let Some((opcode, mut buffer)) = self.partial.take() else {
                    return Err(CloseWith::new(
                        close::PROTOCOL_ERROR,
                        "continuation without a message",
                    ));
                };
                if buffer.len() + frame.payload.len() > self.limit {
                    return Err(CloseWith::new(close::MESSAGE_TOO_BIG, "message too big"));
                }
                buffer.extend_from_slice(&frame.payload);
                if frame.fin {
                    finish(opcode, buffer)
                } else {
                    self.partial = Some((opcode, buffer));
                    Ok(Assembled::Incomplete)
                }
            }
        }
    }
}

fn finish(opcode: OpCode, payload: BytesMut) -> Result<Assembled, CloseWith> {
    if opcode == OpCode::Text && std::str::from_utf8(&payload).is_err() {
        return Err(CloseWith::new(close::INVALID_PAYLOAD, "invalid UTF-8"));
    }
    Ok(Assembled::Message(opcode, payload))
}

/// Ping-based liveness for a socket this side serves: a ping every `interval`; a peer that sent nothing (pong or
/// any frame) between two pings is gone.
pub struct Liveness {
    ticker: Interval,
    heard: bool,
}

impl Liveness {
    pub fn new(interval: Duration) -> Self {
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            ticker,
            heard: true,
        }
    }

    /// Records that the peer is alive.
    pub fn heard(&mut self) {
        self.heard = true;
    }

    /// Waits for the next ping time; returns `false` when the peer has not answered the previous ping.
    pub async fn tick(&mut self) -> bool {
        self.ticker.tick().await;
        std::mem::replace(&mut self.heard, false)
    }
}

pub fn ping() -> Frame<'static> {
    Frame::new(true, OpCode::Ping, None, Payload::Owned(Vec::new()))
}

pub fn text(payload: impl Into<Vec<u8>>) -> Frame<'static> {
    Frame::text(Payload::Owned(payload.into()))
}

pub fn close_frame(with: &CloseWith) -> Frame<'static> {
    let reason = crate::protocol::close_reason(&with.reason);
    Frame::close(with.code, reason.as_bytes())
}

/// Sends a close frame (`None`: a close without a status code, which the peer reports as 1005), then waits briefly
/// for the peer's close so that the frame is not lost to a reset, then drops the connection.
pub async fn close_and_linger<S, F>(
    writer: &mut Writer<S>,
    pending_read: F,
    with: Option<&CloseWith>,
) where
    S: tokio::io::AsyncWrite + tokio::io::AsyncRead + Unpin,
    F: std::future::Future<Output = (Reader<S>, Result<OwnedFrame, WebSocketError>)>,
{
    let frame = match with {
        Some(with) => close_frame(with),
        None => Frame::close_raw(Payload::Owned(Vec::new())),
    };
    if writer.write_frame(frame).await.is_err() {
        return;
    }
    let linger = async {
        let (mut reader, mut result) = pending_read.await;
        loop {
            match result {
                Ok(frame) if frame.opcode == OpCode::Close => return,
                Ok(_) => {}
                Err(_) => return,
            }
            (reader, result) = next_frame(reader).await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_LINGER, linger).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: OpCode, payload: &[u8]) -> OwnedFrame {
        OwnedFrame {
            fin,
            opcode,
            payload: BytesMut::from(payload),
        }
    }

    #[test]
    fn fragments_are_joined_within_the_limit() {
        let mut a = Assembler::new(10);
        assert!(matches!(
            a.push(frame(false, OpCode::Text, b"{\"ack\"")),
            Ok(Assembled::Incomplete)
        ));
        assert!(matches!(
            a.push(frame(true, OpCode::Ping, b"")),
            Ok(Assembled::Control(_))
        ));
        match a.push(frame(true, OpCode::Continuation, b":1}")) {
            Ok(Assembled::Message(OpCode::Text, payload)) => {
                assert_eq!(&payload[..], b"{\"ack\":1}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.push(frame(false, OpCode::Text, b"12345")),
            Ok(Assembled::Incomplete)
        ));
        let err = a
            .push(frame(true, OpCode::Continuation, b"678901"))
            .unwrap_err();
        assert_eq!(err.code, close::MESSAGE_TOO_BIG);
    }

    #[test]
    fn fragment_protocol_errors() {
        let mut a = Assembler::new(100);
        assert_eq!(
            a.push(frame(true, OpCode::Continuation, b"x"))
                .unwrap_err()
                .code,
            close::PROTOCOL_ERROR
        );
        a.push(frame(false, OpCode::Text, b"a")).unwrap();
        assert_eq!(
            a.push(frame(true, OpCode::Text, b"b")).unwrap_err().code,
            close::PROTOCOL_ERROR
        );
        let mut a = Assembler::new(100);
        a.push(frame(false, OpCode::Text, &[0xe2, 0x82])).unwrap();
        assert_eq!(
            a.push(frame(true, OpCode::Continuation, &[0xff]))
                .unwrap_err()
                .code,
            close::INVALID_PAYLOAD
        );
    }

    #[test]
    fn close_frames_are_validated() {
        assert_eq!(
            read_close(BytesMut::new()),
            PeerClose::Valid {
                code: None,
                payload: BytesMut::new()
            }
        );
        assert!(matches!(
            read_close(BytesMut::from(&[3u8][..])),
            PeerClose::Invalid(_)
        ));
        assert!(matches!(
            read_close(BytesMut::from(&1005u16.to_be_bytes()[..])),
            PeerClose::Invalid(CloseWith { code: 1002, .. })
        ));
        let mut bad_reason = BytesMut::from(&1000u16.to_be_bytes()[..]);
        bad_reason.extend_from_slice(&[0xff]);
        assert!(matches!(
            read_close(bad_reason),
            PeerClose::Invalid(CloseWith { code: 1007, .. })
        ));
        assert!(matches!(
            read_close(BytesMut::from(&4000u16.to_be_bytes()[..])),
            PeerClose::Valid {
                code: Some(4000),
                ..
            }
        ));
    }

    #[test]
    fn read_errors_map_to_close_codes() {
        assert_eq!(
            close_for_error(&WebSocketError::FrameTooLarge)
                .unwrap()
                .code,
            1009
        );
        assert_eq!(
            close_for_error(&WebSocketError::InvalidUTF8).unwrap().code,
            1007
        );
        assert_eq!(
            close_for_error(&WebSocketError::ReservedBitsNotZero)
                .unwrap()
                .code,
            1002
        );
        assert!(close_for_error(&WebSocketError::UnexpectedEOF).is_none());
    }
}
