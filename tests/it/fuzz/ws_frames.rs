//! WebSocket frames.

use super::*;

/// One frame as a peer may put it on the wire, honest or not.
#[derive(Debug, Clone)]
struct FrameSpec {
    fin: bool,
    /// The three reserved bits.
    rsv: u8,
    opcode: u8,
    /// Whether a mask is sent; a peer sending the wrong kind breaks the protocol.
    masked: bool,
    mask: [u8; 4],
    payload: Vec<u8>,
    /// A length other than the payload's: more (a frame that never completes) or less.
    claimed: Option<u64>,
    /// 0: the shortest length encoding; 1: 16 bits; 2: 64 bits (allowed, if wasteful).
    encoding: u8,
}

impl FrameSpec {
    fn is_valid(&self, from_client: bool, limit: usize) -> bool {
        let control = self.opcode >= 8;
        self.rsv == 0
            && matches!(self.opcode, 0 | 1 | 2 | 8 | 9 | 10)
            && self.masked == from_client
            && self.claimed.is_none()
            && (!control || (self.fin && self.payload.len() <= 125))
            && self.payload.len() <= limit
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push((u8::from(self.fin) << 7) | ((self.rsv & 7) << 4) | (self.opcode & 0x0f));
        let len = self.claimed.unwrap_or(self.payload.len() as u64);
        let mask_bit = if self.masked { 0x80 } else { 0 };
        match (self.encoding, len) {
            (0, 0..=125) => out.push(mask_bit | len as u8),
            (0 | 1, 0..=0xffff) => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&len.to_be_bytes());
            }
        }
        if self.masked {
            out.extend_from_slice(&self.mask);
            out.extend(
                self.payload
                    .iter()
                    .enumerate()
                    .map(|(i, b)| b ^ self.mask[i % 4]),
            );
        } else {
            out.extend_from_slice(&self.payload);
        }
    }
}

fn close_payload() -> impl Strategy<Value = Vec<u8>> + Clone {
    let code = prop_oneof![
        select(
            &[1000u16, 1001, 1002, 1003, 1005, 1006, 1007, 1011, 1015, 2999, 3000, 4999, 5000][..]
        ),
        any::<u16>(),
    ];
    let reason = prop_oneof![
        "[a-z ]{0,20}".prop_map(String::into_bytes),
        "\\PC{0,10}".prop_map(String::into_bytes),
        vec(any::<u8>(), 0..8),
        Just(vec![b'x'; 124]),
    ];
    prop_oneof![
        1 => vec(any::<u8>(), 0..3),
        4 => (code, reason).prop_map(|(code, reason)| {
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice(&reason);
            payload
        }),
    ]
}

/// Payloads: what the peers send (acks, change-stream messages), any bytes, and sometimes a lot of them.
fn frame_payload() -> impl Strategy<Value = Vec<u8>> + Clone {
    prop_oneof![
        4 => vec(any::<u8>(), 0..64),
        2 => any::<u64>().prop_map(|n| format!("{{\"ack\":{n}}}").into_bytes()),
        2 => change_frame().prop_map(|(text, _)| text.into_bytes()),
        1 => vec(any::<u8>(), 126..2000),
        1 => (1usize..70_000).prop_map(|n| vec![b'a'; n]),
    ]
}

fn frame_spec(from_client: bool) -> impl Strategy<Value = FrameSpec> + Clone {
    let opcode = prop_oneof![
        8 => select(&[0u8, 1, 2][..]),
        3 => select(&[8u8, 9, 10][..]),
        1 => 0u8..16,
    ];
    let claimed = prop_oneof![
        12 => Just(None),
        1 => (0u64..100_000).prop_map(Some),
        1 => select(&[100u64 << 20, 128 << 20, (128 << 20) + 1, 1 << 40, u64::MAX][..]).prop_map(Some),
        1 => any::<u64>().prop_map(Some),
    ];
    (
        prop_oneof![3 => Just(true), 1 => Just(false)],
        prop_oneof![20 => Just(0u8), 1 => 0u8..8],
        opcode,
        prop_oneof![20 => Just(from_client), 1 => Just(!from_client)],
        any::<[u8; 4]>(),
        frame_payload(),
        close_payload(),
        claimed,
        prop_oneof![6 => Just(0u8), 1 => 1u8..3],
    )
        .prop_map(
            move |(fin, rsv, opcode, masked, mask, payload, close, claimed, encoding)| {
                let control = opcode >= 8;
                FrameSpec {
                    // Mostly honest control frames: final, and a close carries a code and reason.
                    fin: fin || (control && rsv == 0),
                    rsv,
                    opcode,
                    masked,
                    mask,
                    payload: match opcode {
                        8 => close,
                        9 | 10 => payload.into_iter().take(125).collect(),
                        _ => payload,
                    },
                    claimed,
                    encoding,
                }
            },
        )
}

/// Bytes a peer sends, cut into the reads that deliver them.
#[derive(Debug, Clone)]
struct Stream {
    from_client: bool,
    limit: usize,
    bytes: Text,
    chunks: Vec<usize>,
    /// Every frame is valid and whole and nothing was mutated: what both readers must find, in order.
    frames: Option<Vec<(bool, u8, Text)>>,
}

fn stream() -> impl Strategy<Value = Stream> + Clone {
    let limit = select(&[125usize, 4096, 128 << 20][..]);
    let chunks = vec(
        prop_oneof![1usize..8, 8usize..512, Just(1usize << 20)],
        1..8,
    );
    let specs = any::<bool>()
        .prop_flat_map(|from_client| (Just(from_client), vec(frame_spec(from_client), 0..6)));
    let framed =
        (specs, limit.clone(), chunks.clone()).prop_map(|((from_client, specs), limit, chunks)| {
            let mut bytes = Vec::new();
            for spec in &specs {
                spec.encode(&mut bytes);
            }
            let frames = specs
                .iter()
                .all(|s| s.is_valid(from_client, limit))
                .then(|| {
                    specs
                        .iter()
                        .map(|s| (s.fin, s.opcode, Text(s.payload.clone())))
                        .collect()
                });
            Stream {
                from_client,
                limit,
                bytes: Text(bytes),
                chunks,
                frames,
            }
        });
    let broken = (
        framed.clone(),
        vec(mutation(b"\x00\x7e\x7f\x80\x81\x82\x88\x89\x8a\xff"), 1..5),
    )
        .prop_map(|(stream, edits)| Stream {
            bytes: Text(mutate(stream.bytes.0, &edits)),
            frames: None,
            ..stream
        });
    let arbitrary = (
        any::<bool>(),
        limit,
        bytes(b"\x00\x7e\x7f\x80\x81\x82\x88\x89\x8a\xff", 300),
        chunks,
    )
        .prop_map(|(from_client, limit, bytes, chunks)| Stream {
            from_client,
            limit,
            bytes: Text(bytes),
            chunks,
            frames: None,
        });
    prop_oneof![4 => framed, 2 => broken, 1 => arbitrary]
}

/// A socket whose reads return the stream's bytes in the given chunk sizes, then end. Never pending, so a read
/// completes on its first poll.
struct Chunked<'a> {
    bytes: &'a [u8],
    chunks: &'a [usize],
    reads: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let chunk = self.chunks[self.reads % self.chunks.len()];
        let n = chunk.min(self.bytes.len()).min(buf.remaining());
        buf.put_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        self.reads += 1;
        Poll::Ready(Ok(()))
    }
}

fn now<F: Future>(future: F) -> F::Output {
    future
        .now_or_never()
        .expect("a read from a socket that is never pending completes at once")
}

/// Frames as read, hashed in order without keeping them (keeping them would count against the bound).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Digest(u64, usize);

impl Digest {
    fn frame(&mut self, fin: bool, opcode: OpCode, payload: impl IntoIterator<Item = u8>) {
        let mut h = self.0 ^ 0xcbf2_9ce4_8422_2325;
        for b in [u8::from(fin), opcode as u8].into_iter().chain(payload) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        *self = Digest(h, self.1 + 1);
    }
}

/// What each side does with a whole message: a reservation decodes acks; the relay inspects commits going down
/// and acks coming up.
fn on_message(from_client: bool, opcode: OpCode, message: &[u8]) {
    if opcode == OpCode::Text {
        if from_client {
            let _ = protocol::decode_ack(message);
        } else {
            let _ = inspect::inspect(message);
        }
    }
}

/// A reservation's reader: whole frames one at a time, messages policed.
fn read_frames(stream: &Stream) -> Result<(Digest, Option<ReadError>), TestCaseError> {
    let mut inbox = Inbox::new(stream.from_client, stream.limit, Reads::Small);
    let mut assembler = Assembler::new(stream.limit);
    let mut socket = Chunked {
        bytes: &stream.bytes,
        chunks: &stream.chunks,
        reads: 0,
    };
    let mut digest = Digest::default();
    let mut policed = true;
    let end = loop {
        let frame = match now(inbox.read_frame(&mut socket)) {
            Ok(frame) => frame,
            Err(end) => break end,
        };
        digest.frame(frame.fin, frame.opcode, frame.payload.iter().copied());
        match frame.opcode {
            OpCode::Close => match ws::read_close(frame.payload) {
                PeerClose::Valid { .. } => {}
                PeerClose::Invalid(with) => message_is_clear("read_close", &with.reason)?,
            },
            OpCode::Ping | OpCode::Pong => {}
            opcode if policed => {
                let pushed = assembler.push_checked(frame.fin, opcode, &frame.payload, |op, m| {
                    on_message(stream.from_client, op, m)
                });
                if let Err(with) = pushed {
                    message_is_clear("push_checked", &with.reason)?;
                    policed = false;
                }
            }
            _ => {}
        }
    };
    Ok((
        digest,
        match end {
            ReadError::Gone => None,
            protocol => Some(protocol),
        },
    ))
}

/// The relay's reader: the frames of each read walked in place, data frames passed on as received, control
/// frames taken out to answer, the rest of a frame waited for.
fn walk_frames(stream: &Stream) -> Result<(Digest, bool), TestCaseError> {
    let mut inbox = Inbox::new(stream.from_client, stream.limit, Reads::Bulk);
    let mut assembler = Assembler::new(stream.limit);
    let mut socket = Chunked {
        bytes: &stream.bytes,
        chunks: &stream.chunks,
        reads: 0,
    };
    let mut digest = Digest::default();
    let mut scratch = Vec::new();
    loop {
        let read = now(inbox.fill(&mut socket)).expect("the test socket never fails");
        if read == 0 {
            return Ok((digest, true));
        }
        let mut frames = 0;
        loop {
            let header = match inbox.header_at(frames) {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(with) => {
                    prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
                    message_is_clear("header_at", &with.reason)?;
                    return Ok((digest, false));
                }
            };
            let end = frames + header.frame_len();
            if inbox.buffered().len() < end {
                if frames > 0 {
                    drop(inbox.take_frames(std::mem::take(&mut frames)));
                }
                inbox.wait_for(&header);
                break;
            }
            if header.is_control() {
                if frames > 0 {
                    drop(inbox.take_frames(std::mem::take(&mut frames)));
                }
                let frame = inbox.take_frame(&header);
                digest.frame(frame.fin, frame.opcode, frame.payload.iter().copied());
                if frame.opcode == OpCode::Close {
                    if let PeerClose::Invalid(with) = ws::read_close(frame.payload) {
                        message_is_clear("read_close", &with.reason)?;
                    }
                }
                continue;
            }
            let payload = &inbox.buffered()[frames + header.len..end];
            let key = header.mask.unwrap_or_default();
            digest.frame(
                header.fin,
                header.opcode,
                payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]),
            );
            // The relay unmasks a client's frame into scratch space only when it may be part of an ack.
            let payload = match header.mask {
                Some(key) if payload.len() <= 4096 => {
                    scratch.clear();
                    scratch.extend_from_slice(payload);
                    fastwebsockets::unmask(&mut scratch, key);
                    &scratch[..]
                }
                _ => payload,
            };
            assembler.push(header.fin, header.opcode, payload, |op, m| {
                on_message(stream.from_client, op, m)
            });
            frames = end;
        }
        if frames > 0 {
            drop(inbox.take_frames(frames));
        }
    }
}

/// Both readers over one stream. Their memory follows the bytes that arrived, never a frame's claimed length: the
/// read buffer at most doubles per wait (starting from 32 KiB and a read's room of up to 32 KiB), a fragmented
/// message is copied once into a buffer that doubles, and a reallocation briefly holds old and new. Hence 192 KiB
/// plus 8 bytes per input byte; before the buffer grew with the bytes, one header claiming 100 MiB cost 100 MiB.
#[test]
fn ws_frames() {
    const BOUND: (usize, usize) = (192 << 10, 8);
    fuzz("ws_frames", stream(), |stream| {
        let len = stream.bytes.len();
        let (read, end) = bounded("Inbox::read_frame", len, BOUND, || read_frames(&stream))??;
        let (walked, whole) = bounded("Inbox::header_at", len, BOUND, || walk_frames(&stream))??;
        if let Some(ReadError::Protocol(with)) = &end {
            prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
            message_is_clear("read_frame", &with.reason)?;
        }
        if let Some(frames) = &stream.frames {
            let mut expected = Digest::default();
            for (fin, opcode, payload) in frames {
                let opcode = OpCode::try_from(*opcode).expect("a valid opcode");
                expected.frame(*fin, opcode, payload.iter().copied());
            }
            prop_assert!(end.is_none(), "a valid stream ended with {end:?}");
            prop_assert!(whole, "a valid stream was refused");
            prop_assert_eq!(read, expected, "read_frame");
            prop_assert_eq!(walked, expected, "header_at");
        }
        Ok(())
    });
}

fn header_bytes() -> impl Strategy<Value = (Text, bool, usize)> + Clone {
    let limit = select(&[0usize, 125, 1000, 128 << 20, usize::MAX][..]);
    let from_spec = any::<bool>()
        .prop_flat_map(|from_client| (Just(from_client), frame_spec(from_client), any::<Index>()))
        .prop_map(|(from_client, spec, cut)| {
            let mut bytes = Vec::new();
            FrameSpec {
                payload: Vec::new(),
                claimed: Some(spec.claimed.unwrap_or(spec.payload.len() as u64)),
                ..spec
            }
            .encode(&mut bytes);
            // Sometimes only part of the header has arrived.
            let keep = if cut.index(4) == 0 {
                cut.index(bytes.len() + 1)
            } else {
                bytes.len()
            };
            bytes.truncate(keep);
            (bytes, from_client)
        });
    (
        prop_oneof![(vec(any::<u8>(), 0..16), any::<bool>()), from_spec,],
        limit,
    )
        .prop_map(|((bytes, from_client), limit)| (Text(bytes), from_client, limit))
}

/// A header is read in place: nothing is allocated but an error's reason.
#[test]
fn ws_header() {
    fuzz(
        "ws_header",
        header_bytes(),
        |(bytes, from_client, limit)| {
            match bounded("parse_header", bytes.len(), (256, 0), || {
                ws::parse_header(&bytes, from_client, limit)
            })? {
                Ok(Some(header)) => {
                    prop_assert!(matches!(header.len, 2 | 4 | 6 | 8 | 10 | 14));
                    prop_assert!(header.len <= bytes.len());
                    prop_assert!(header.payload_len <= limit);
                    prop_assert_eq!(header.mask.is_some(), from_client);
                    if header.is_control() {
                        prop_assert!(header.fin && header.payload_len <= 125);
                    }
                    prop_assert!(header.frame_len() >= header.payload_len);
                }
                // A header is at most 14 bytes: with 14 it is whole or wrong.
                Ok(None) => prop_assert!(bytes.len() < 14),
                Err(with) => {
                    prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
                    message_is_clear("parse_header", &with.reason)?;
                }
            }
            Ok(())
        },
    );
}

/// A close frame's payload is validated in place; only an error's reason is allocated.
#[test]
fn ws_close() {
    let payload = prop_oneof![close_payload(), vec(any::<u8>(), 0..200)].prop_map(Text);
    fuzz("ws_close", payload, |payload| {
        let frame = BytesMut::from(&payload[..]);
        match bounded("read_close", payload.len(), (256, 0), || {
            ws::read_close(frame)
        })? {
            PeerClose::Valid {
                code,
                payload: echo,
            } => {
                prop_assert!(payload.len() <= 125);
                prop_assert_eq!(&echo[..], &payload[..]);
                match code {
                    None => prop_assert!(payload.is_empty()),
                    Some(code) => {
                        prop_assert_eq!(code, u16::from_be_bytes([payload[0], payload[1]]));
                        prop_assert!(std::str::from_utf8(&payload[2..]).is_ok());
                    }
                }
            }
            PeerClose::Invalid(with) => {
                prop_assert!(matches!(with.code, 1002 | 1007), "close code {}", with.code);
                message_is_clear("read_close", &with.reason)?;
            }
        }
        Ok(())
    });
}

/// Close reasons as an upstream sends them: Zero's refusal of a version, other reasons, and mutations of both.
fn close_reason() -> impl Strategy<Value = String> + Clone {
    let number = prop_oneof![
        4 => (0u64..10).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => select(&["", "00", "07", "NaN", "1e+21", "-1", "+4", " 4"][..]).prop_map(String::from),
    ];
    let refusal =
        (number.clone(), number.clone(), number, any::<bool>()).prop_map(|(v, a, b, prefix)| {
            format!(
                "{}Cannot service client at protocol v{v}. Supported protocols: [v{a} ... v{b}]",
                if prefix { "Error: " } else { "" }
            )
        });
    prop_oneof![
        4 => refusal.clone(),
        1 => select(&["", "Error: invalid path: /replication/x/changes", "Error: upstream connection lost"][..])
            .prop_map(String::from),
        1 => any::<String>(),
        2 => mutated(refusal.prop_map(String::into_bytes), b"v.[] 0123456789").prop_map(lossy),
    ]
}

/// Zero's refusal read back: nothing is allocated, and what is read is what Zero would have written.
#[test]
fn version_refusal() {
    fuzz("version_refusal", close_reason(), |reason| {
        let read = bounded("parse_refusal", reason.len(), (0, 0), || {
            protocol::versions::parse_refusal(&reason)
        })?;
        if let Some(refusal) = read {
            prop_assert!(refusal.supported.start() <= refusal.supported.end());
            prop_assert!(!refusal.supported.contains(&refusal.version));
            let written = protocol::unsupported_version(refusal.version, &refusal.supported);
            prop_assert!(
                written == reason || written.strip_prefix("Error: ") == Some(reason.as_str()),
                "{reason:?} read as {refusal:?}"
            );
        }
        Ok(())
    });
}
