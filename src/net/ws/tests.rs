use super::*;

/// A masked client frame with an all-zero mask (the payload stays readable).
fn client_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![(if fin { 0x80 } else { 0 }) | opcode];
    match payload.len() {
        n @ 0..=125 => frame.push(0x80 | n as u8),
        n @ 126..=0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test]
async fn a_cancelled_read_loses_nothing_and_an_idle_reader_holds_no_buffer() {
    use tokio::io::AsyncWriteExt;
    let (mut client, mut server) = tokio::io::duplex(1024);
    let mut inbox = Inbox::new(true, 1 << 20, Reads::Small);
    let frame = client_frame(true, 0x1, br#"{"ack":1}"#);
    client.write_all(&frame[..4]).await.unwrap();
    // The read is dropped half-way through the frame, as a `select!` does when a timer wins.
    assert!(
        tokio::time::timeout(Duration::from_millis(20), inbox.read_frame(&mut server))
            .await
            .is_err()
    );
    client.write_all(&frame[4..]).await.unwrap();
    let read = inbox.read_frame(&mut server).await.unwrap();
    assert_eq!(
        (read.opcode, &read.payload[..]),
        (OpCode::Text, &br#"{"ack":1}"#[..])
    );
    assert_eq!(inbox.buf.capacity(), 0, "an idle reader keeps no buffer");
    // A frame over the limit is refused from its header alone; a server-style unmasked frame is refused.
    let mut small = Inbox::new(true, 1024, Reads::Small);
    assert!(matches!(
        small
            .read_frame(&mut &b"\x81\xff\x00\x00\x00\x00\x10\x00\x00\x00"[..])
            .await,
        Err(ReadError::Protocol(CloseWith { code: 1009, .. }))
    ));
    // A header that claims a large frame reserves room for what arrived, not for the claim; the frame is
    // still read whole as its bytes come.
    let (mut sender, mut receiver) = tokio::io::duplex(1 << 16);
    let mut claim = Inbox::new(true, 100 << 20, Reads::Small);
    let big = client_frame(true, 0x2, &vec![7u8; 300_000]);
    sender.write_all(&big[..20]).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(20), claim.read_frame(&mut receiver))
            .await
            .is_err()
    );
    assert!(
        claim.buf.capacity() <= 4096,
        "a 300 KB claim reserved {} bytes",
        claim.buf.capacity()
    );
    let writer = tokio::spawn(async move {
        sender.write_all(&big[20..]).await.unwrap();
        sender
    });
    let read = claim.read_frame(&mut receiver).await.unwrap();
    assert_eq!(read.payload.len(), 300_000);
    assert!(read.payload.iter().all(|&b| b == 7));
    drop(writer.await.unwrap());
    let mut unmasked = Inbox::new(true, 1024, Reads::Small);
    assert!(matches!(
        unmasked.read_frame(&mut &b"\x81\x01x"[..]).await,
        Err(ReadError::Protocol(CloseWith { code: 1002, .. }))
    ));
    drop(client);
    assert!(matches!(
        inbox.read_frame(&mut server).await,
        Err(ReadError::Gone)
    ));
}

#[test]
fn frames_are_taken_in_place_as_received_or_one_at_a_time() {
    let mut bytes = client_frame(true, 0x1, b"a");
    bytes.extend_from_slice(&[0x89, 0x82, 1, 2, 3, 4, b'p' ^ 1, b'q' ^ 2]);
    bytes.extend_from_slice(&client_frame(false, 0x1, b"bc")[..4]);
    let mut inbox = Inbox::new(true, 100, Reads::Bulk);
    inbox.buf.extend_from_slice(&bytes);
    let first = inbox.header_at(0).unwrap().unwrap();
    let ping = inbox.header_at(first.frame_len()).unwrap().unwrap();
    assert_eq!(ping.opcode, OpCode::Ping);
    assert_eq!(&inbox.take_frames(first.frame_len())[..], &bytes[..7]);
    let ping = inbox.take_frame(&ping);
    assert_eq!((ping.opcode, &ping.payload[..]), (OpCode::Ping, &b"pq"[..]));
    // A partial header: more bytes are needed.
    assert_eq!(inbox.header_at(0), Ok(None));
    inbox.discard();
    assert_eq!(inbox.buf.capacity(), 0);
}

#[tokio::test]
async fn a_stream_keeps_its_read_buffer_a_waiting_socket_or_a_grown_buffer_does_not() {
    let frame = client_frame(true, 0x1, b"ack");
    for (reads, kept) in [(Reads::Bulk, true), (Reads::Small, false)] {
        let mut inbox = Inbox::new(true, 1 << 20, reads);
        inbox.fill(&mut &frame[..]).await.unwrap();
        inbox.take_frames(frame.len());
        assert_eq!(inbox.buf.capacity() > 0, kept, "{reads:?}");
        inbox.release_if_idle();
        assert_eq!(inbox.buf.capacity(), 0, "{reads:?}");
    }
    // A frame larger than a read's room grows the buffer, which goes once the frame is taken.
    let big = client_frame(true, 0x2, &vec![7u8; 100 << 10]);
    let mut inbox = Inbox::new(true, 1 << 20, Reads::Bulk);
    let mut reader = &big[..];
    loop {
        inbox.fill(&mut reader).await.unwrap();
        let header = inbox.header_at(0).unwrap().unwrap();
        if inbox.buffered().len() >= header.frame_len() {
            inbox.take_frames(header.frame_len());
            break;
        }
        inbox.wait_for(&header);
    }
    assert_eq!(inbox.buf.capacity(), 0);
}

#[tokio::test]
async fn a_header_claiming_a_huge_payload_costs_memory_only_as_bytes_arrive() {
    // A 100 MiB binary frame under a 128 MiB limit, of which only the header and a few bytes ever come.
    let mut bytes = vec![0x82, 0xff];
    bytes.extend_from_slice(&(100u64 << 20).to_be_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 0, 1, 2, 3]);
    for reads in [Reads::Small, Reads::Bulk] {
        let mut inbox = Inbox::new(true, 128 << 20, reads);
        inbox.buf.extend_from_slice(&bytes);
        let header = inbox.header_at(0).unwrap().unwrap();
        assert_eq!(header.payload_len, 100 << 20);
        inbox.wait_for(&header);
        assert!(inbox.buf.capacity() <= 64 << 10, "{}", inbox.buf.capacity());
        let mut inbox = Inbox::new(true, 128 << 20, reads);
        assert!(matches!(
            inbox.read_frame(&mut &bytes[..]).await,
            Err(ReadError::Gone)
        ));
        assert!(inbox.buf.capacity() <= 64 << 10, "{}", inbox.buf.capacity());
    }
    // A whole large frame still arrives, its buffer growing with it.
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
    let mut frame = vec![0x82, 0xff];
    frame.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(&payload);
    let (mut client, mut server) = tokio::io::duplex(64 << 10);
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        client.write_all(&frame).await.unwrap();
        client
    });
    let mut inbox = Inbox::new(true, 128 << 20, Reads::Small);
    let read = inbox.read_frame(&mut server).await.unwrap();
    assert_eq!(&read.payload[..], &payload[..]);
    drop(writer.await.unwrap());
}

/// Every text message an assembler hands over, as a relay's inspection sees them.
fn texts(assembler: &mut Assembler, frames: &[(bool, OpCode, &str)]) -> Vec<String> {
    let mut seen = Vec::new();
    for (fin, opcode, payload) in frames {
        assembler.push(*fin, *opcode, payload.as_bytes(), |opcode, message| {
            if opcode == OpCode::Text {
                seen.push(String::from_utf8_lossy(message).into_owned())
            }
        });
    }
    seen
}

#[test]
fn fragments_are_joined_for_inspection_within_the_limit() {
    let mut assembler = Assembler::new(10);
    let seen = texts(
        &mut assembler,
        &[
            (true, OpCode::Text, "whole"),
            (false, OpCode::Text, "{\"ack\""),
            (true, OpCode::Continuation, ":1}"),
            (false, OpCode::Text, "123456"),
            (true, OpCode::Continuation, "78901"),
            (true, OpCode::Text, "toolong-----"),
            (false, OpCode::Binary, "bin"),
            (true, OpCode::Continuation, "ary"),
            (true, OpCode::Continuation, "stray"),
            (false, OpCode::Text, "a"),
            (true, OpCode::Text, "b"),
        ],
    );
    assert_eq!(seen, ["whole", "{\"ack\":1}", "b"]);
}

/// What a checked push gives: `Ok(None)` while a message is incomplete, the whole message, or the close.
fn checked(
    assembler: &mut Assembler,
    fin: bool,
    opcode: OpCode,
    payload: &[u8],
) -> Result<Option<(OpCode, Vec<u8>)>, CloseWith> {
    assembler.push_checked(fin, opcode, payload, |opcode, message| {
        (opcode, message.to_vec())
    })
}

#[test]
fn fragments_are_joined_within_the_limit() {
    let mut a = Assembler::new(10);
    assert_eq!(checked(&mut a, false, OpCode::Text, b"{\"ack\""), Ok(None));
    // A control frame between fragments is not part of the message.
    assert_eq!(checked(&mut a, true, OpCode::Ping, b""), Ok(None));
    assert_eq!(
        checked(&mut a, true, OpCode::Continuation, b":1}"),
        Ok(Some((OpCode::Text, b"{\"ack\":1}".to_vec())))
    );
    assert_eq!(checked(&mut a, false, OpCode::Text, b"12345"), Ok(None));
    let err = checked(&mut a, true, OpCode::Continuation, b"678901").unwrap_err();
    assert_eq!(err.code, close::MESSAGE_TOO_BIG);
}

#[test]
fn fragment_protocol_errors() {
    let mut a = Assembler::new(100);
    assert_eq!(
        checked(&mut a, true, OpCode::Continuation, b"x")
            .unwrap_err()
            .code,
        close::PROTOCOL_ERROR
    );
    checked(&mut a, false, OpCode::Text, b"a").unwrap();
    assert_eq!(
        checked(&mut a, true, OpCode::Text, b"b").unwrap_err().code,
        close::PROTOCOL_ERROR
    );
    let mut a = Assembler::new(100);
    checked(&mut a, false, OpCode::Text, &[0xe2, 0x82]).unwrap();
    assert_eq!(
        checked(&mut a, true, OpCode::Continuation, &[0xff])
            .unwrap_err()
            .code,
        close::INVALID_PAYLOAD
    );
    // Binary messages are handed over as they are.
    assert_eq!(
        checked(&mut a, true, OpCode::Binary, &[0xff]),
        Ok(Some((OpCode::Binary, vec![0xff])))
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
    let mut long = BytesMut::from(&1000u16.to_be_bytes()[..]);
    long.extend_from_slice(&[b'x'; 124]);
    assert!(matches!(
        read_close(long),
        PeerClose::Invalid(CloseWith { code: 1002, .. })
    ));
    assert!(matches!(
        read_close(BytesMut::from(&4000u16.to_be_bytes()[..])),
        PeerClose::Valid {
            code: Some(4000),
            ..
        }
    ));
}

/// A writer that takes at most `step` bytes per call and is not ready every other call.
struct Trickle {
    out: Vec<u8>,
    step: usize,
    ready: bool,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.ready = !self.ready;
        if !self.ready {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = buf.len().min(self.step);
        self.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A written frame parsed back: fin, opcode, mask, unmasked payload.
type Decoded = (bool, u8, Option<[u8; 4]>, Vec<u8>);

fn parse(mut bytes: &[u8]) -> Vec<Decoded> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let fin = bytes[0] & 0x80 != 0;
        let opcode = bytes[0] & 0x0f;
        let masked = bytes[1] & 0x80 != 0;
        let (len, mut at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        let mask = masked.then(|| {
            let key: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
            at += 4;
            key
        });
        let mut payload = bytes[at..at + len].to_vec();
        if let Some(key) = mask {
            fastwebsockets::unmask(&mut payload, key);
        }
        frames.push((fin, opcode, mask, payload));
        bytes = &bytes[at + len..];
    }
    frames
}

fn queue_mixed(outbox: &mut Outbox, big: &[u8]) {
    outbox.push(true, OpCode::Text, BytesMut::from(&b"abc"[..]));
    outbox.push(false, OpCode::Text, BytesMut::from(big));
    outbox.push_control(OpCode::Ping, b"p");
    outbox.push(true, OpCode::Continuation, BytesMut::from(&b"tail"[..]));
    outbox.push(true, OpCode::Binary, BytesMut::from(&vec![7u8; 70_000][..]));
    outbox.push_close(Some(&CloseWith::new(1002, "Error: no")));
    // Nothing is queued after a close.
    outbox.push(true, OpCode::Text, BytesMut::from(&b"late"[..]));
}

#[tokio::test]
async fn outbox_writes_frames_in_order_through_partial_writes() {
    let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let mut outbox = Outbox::new(Role::Server);
    queue_mixed(&mut outbox, &big);
    assert!(outbox.is_closed());
    let queued = outbox.len();
    let mut writer = Trickle {
        out: Vec::new(),
        step: 7,
        ready: false,
    };
    outbox.flush(&mut writer).await.unwrap();
    assert!(outbox.is_empty());
    assert_eq!(writer.out.len(), queued);
    let frames = parse(&writer.out);
    let mut close = 1002u16.to_be_bytes().to_vec();
    close.extend_from_slice(b"Error: no");
    assert_eq!(
        frames,
        vec![
            (true, 0x1, None, b"abc".to_vec()),
            (false, 0x1, None, big.clone()),
            (true, 0x9, None, b"p".to_vec()),
            (true, 0x0, None, b"tail".to_vec()),
            (true, 0x2, None, vec![7u8; 70_000]),
            (true, 0x8, None, close),
        ]
    );
    assert_eq!(&writer.out[..5], b"\x81\x03abc");
}

#[tokio::test]
async fn relayed_reads_keep_their_order_and_small_ones_do_not_pin_the_readers_buffer() {
    let small = Bytes::from_static(b"\x81\x03ack");
    let big = Bytes::from(vec![0x82u8; 2000]);
    let mut reader_buffer = BytesMut::with_capacity(64);
    let allocation = reader_buffer.as_ptr();
    reader_buffer.extend_from_slice(b"\x81\x02hi");
    let from_reader = reader_buffer.split().freeze();
    let mut outbox = Outbox::new(Role::Server);
    outbox.push_framed(from_reader);
    outbox.push_framed(big.clone());
    outbox.push_framed(small.clone());
    // The small read was copied: the reader's buffer is its own again and is reused in place.
    reader_buffer.reserve(64);
    assert_eq!(reader_buffer.as_ptr(), allocation);
    let mut out = Vec::new();
    outbox.flush(&mut out).await.unwrap();
    assert_eq!(out, [&b"\x81\x02hi"[..], &big, &small].concat());
}

#[tokio::test]
async fn a_stream_inbox_offers_every_read_a_whole_reads_room() {
    let frame = client_frame(true, 0x1, &[b'a'; 100]);
    let mut inbox = Inbox::new(true, 1 << 20, Reads::Bulk);
    for _ in 0..3 {
        inbox.fill(&mut &frame[..]).await.unwrap();
        let header = inbox.header_at(0).unwrap().unwrap();
        assert_eq!(header.frame_len(), frame.len());
        assert!(inbox.buf.capacity() - inbox.buf.len() >= (32 << 10) - frame.len());
        drop(inbox.take_frames(frame.len()));
    }
}

/// The relay writes a read on in the same turn only when the read took everything there was ([`Inbox::drained`]):
/// a read that filled its room leaves more in the socket to join the same write.
#[tokio::test]
async fn a_read_that_fills_its_room_is_not_drained() {
    let frame = client_frame(true, 0x1, &[b'a'; 100]);
    let mut inbox = Inbox::new(true, 1 << 20, Reads::Small);
    let mut source = &frame[..];
    inbox.fill(&mut source).await.unwrap();
    // 256 bytes of room, 106 bytes there: all of it.
    assert!(inbox.drained());
    drop(inbox.take_frames(frame.len()));
    let long = vec![0u8; 4096];
    let mut source = &long[..];
    let n = inbox.fill(&mut source).await.unwrap();
    assert_eq!(n, inbox.buffered().len());
    assert!(n < long.len(), "the read took only its room");
    assert!(!inbox.drained());
}

/// `flush_now` writes what the writer takes at once and leaves the rest to `flush`, losing nothing.
#[tokio::test]
async fn flush_now_writes_what_the_socket_takes_and_leaves_the_rest() {
    use tokio::io::AsyncReadExt;
    let mut outbox = Outbox::new(Role::Server);
    outbox.push_framed(Bytes::from(vec![0x81u8; 100]));
    let (mut writer, mut reader) = tokio::io::duplex(64);
    // The pipe takes 64 of the 100 bytes: not everything left.
    assert!(outbox.flush_now(&mut writer).await.is_none());
    assert_eq!(outbox.len(), 36);
    let mut first = vec![0u8; 64];
    reader.read_exact(&mut first).await.unwrap();
    assert!(matches!(outbox.flush_now(&mut writer).await, Some(Ok(()))));
    assert!(outbox.is_empty());
    let mut rest = vec![0u8; 36];
    reader.read_exact(&mut rest).await.unwrap();
    assert_eq!([first, rest].concat(), vec![0x81u8; 100]);
}

#[tokio::test]
async fn a_client_outbox_masks_every_frame() {
    let big = vec![b'x'; 5000];
    let mut outbox = Outbox::new(Role::Client);
    queue_mixed(&mut outbox, &big);
    let mut out = Vec::new();
    outbox.flush(&mut out).await.unwrap();
    let frames = parse(&out);
    assert_eq!(frames.len(), 6);
    assert!(frames.iter().all(|f| f.2.is_some()));
    assert_eq!(frames[0].3, b"abc");
    assert_eq!(frames[1].3, big);
    assert_eq!(frames[4].3, vec![7u8; 70_000]);
}

#[tokio::test]
async fn a_cancelled_flush_resumes_where_it_stopped() {
    let mut outbox = Outbox::new(Role::Server);
    for i in 0..100u8 {
        outbox.push(
            true,
            OpCode::Text,
            BytesMut::from(&[b'a' + i % 26; 300][..]),
        );
    }
    let total = outbox.len();
    let mut writer = Trickle {
        out: Vec::new(),
        step: 1000,
        ready: false,
    };
    // Poll a flush once, five times over, dropping it each time.
    for _ in 0..5 {
        let mut flush = std::pin::pin!(outbox.flush(&mut writer));
        let _ =
            std::future::poll_fn(|cx| Poll::Ready(std::future::Future::poll(flush.as_mut(), cx)))
                .await;
    }
    assert!(
        !writer.out.is_empty() && writer.out.len() < total,
        "{} of {total}",
        writer.out.len()
    );
    outbox.flush(&mut writer).await.unwrap();
    let frames = parse(&writer.out);
    assert_eq!(frames.len(), 100);
    assert!(frames
        .iter()
        .enumerate()
        .all(|(i, f)| f.3 == vec![b'a' + (i as u8) % 26; 300]));
}

#[test]
fn headers_are_parsed_in_place() {
    let server = |bytes: &[u8]| parse_header(bytes, false, 1 << 20);
    assert_eq!(server(&[]), Ok(None));
    assert_eq!(server(&[0x81]), Ok(None));
    assert_eq!(
        server(&[0x81, 3, b'a', b'b', b'c']),
        Ok(Some(Header {
            fin: true,
            opcode: OpCode::Text,
            mask: None,
            len: 2,
            payload_len: 3
        }))
    );
    assert_eq!(server(&[0x01, 126, 1]), Ok(None));
    assert_eq!(
        server(&[0x01, 126, 1, 0]).unwrap().unwrap().payload_len,
        256
    );
    let mut long = vec![0x82, 127];
    long.extend_from_slice(&70_000u64.to_be_bytes());
    let header = server(&long).unwrap().unwrap();
    assert_eq!((header.len, header.payload_len), (10, 70_000));
    assert_eq!(server(&long[..9]), Ok(None));

    let client = |bytes: &[u8]| parse_header(bytes, true, 100);
    assert_eq!(client(&[0x89, 0x81, 1, 2, 3]), Ok(None));
    assert_eq!(
        client(&[0x89, 0x81, 1, 2, 3, 4]),
        Ok(Some(Header {
            fin: true,
            opcode: OpCode::Ping,
            mask: Some([1, 2, 3, 4]),
            len: 6,
            payload_len: 1
        }))
    );
    let code = |r: Result<Option<Header>, CloseWith>| r.unwrap_err().code;
    assert_eq!(code(client(&[0x81, 0x01])), 1002, "unmasked from a client");
    assert_eq!(code(server(&[0x81, 0x81])), 1002, "masked from a server");
    assert_eq!(code(server(&[0xc1, 0x00])), 1002, "reserved bit");
    assert_eq!(code(server(&[0x83, 0x00])), 1002, "reserved opcode");
    assert_eq!(code(server(&[0x09, 0x00])), 1002, "fragmented ping");
    assert_eq!(code(server(&[0x88, 126, 0, 126])), 1002, "long close");
    assert_eq!(code(client(&[0x81, 0x80 | 101])), 1009, "over the limit");
    let mut huge = vec![0x81, 127];
    huge.extend_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(code(server(&huge)), 1009);
    assert_eq!(code(parse_header(&huge, false, usize::MAX)), 1009);
}

fn secs(base: Instant, s: u64) -> Instant {
    base + Duration::from_secs(s)
}

#[test]
fn a_peer_is_gone_only_after_a_whole_timeout_of_silence() {
    let t0 = Instant::now();
    // Pinged every second, gone after four silent seconds.
    let mut silence = Silence::new(t0, Duration::from_secs(4));
    // Never answering: kept through three pings, gone at the fourth.
    let checks: Vec<bool> = (1..=4).map(|s| silence.check(secs(t0, s), false)).collect();
    assert_eq!(checks, [false, false, false, true]);

    // A sign of life at any time before a check restarts the count from that check.
    let mut silence = Silence::new(t0, Duration::from_secs(4));
    assert!(!silence.check(secs(t0, 1), false));
    assert!(!silence.check(secs(t0, 2), false));
    silence.heard();
    assert!(!silence.check(secs(t0, 3), false));
    for s in 4..=6 {
        assert!(!silence.check(secs(t0, s), false), "{s}");
    }
    assert!(silence.check(secs(t0, 7), false));

    // Answering every ping keeps a peer forever; being excused counts as heard.
    let mut silence = Silence::new(t0, Duration::from_secs(4));
    for s in 1..=100 {
        if s % 3 == 0 {
            silence.heard();
        }
        assert!(!silence.check(secs(t0, s), s % 3 == 1), "{s}");
    }
}

#[test]
fn a_write_stall_is_counted_from_the_last_byte_written() {
    let t0 = Instant::now();
    let mut stall = WriteStall::new(Duration::from_secs(2));
    // Checked every second. Nothing waiting: never stalled.
    assert!(!stall.check(secs(t0, 1), 0, 0));
    // Bytes waiting from the check at 2 on, none written: stalled two seconds later, not before.
    assert!(!stall.check(secs(t0, 2), 100, 0));
    assert!(!stall.check(secs(t0, 3), 300, 0));
    assert!(stall.check(secs(t0, 4), 300, 0));

    // Some progress between checks starts the count again, however much still waits.
    let mut stall = WriteStall::new(Duration::from_secs(2));
    assert!(!stall.check(secs(t0, 1), 100, 0));
    assert!(!stall.check(secs(t0, 2), 5000, 10));
    assert!(!stall.check(secs(t0, 3), 5000, 10));
    assert!(stall.check(secs(t0, 4), 5000, 10));

    // Everything written: the next wait starts afresh.
    let mut stall = WriteStall::new(Duration::from_secs(2));
    assert!(!stall.check(secs(t0, 1), 100, 0));
    assert!(!stall.check(secs(t0, 2), 0, 100));
    assert!(!stall.check(secs(t0, 3), 10, 100));
    assert!(!stall.check(secs(t0, 4), 10, 100));
    assert!(stall.check(secs(t0, 5), 10, 100));
}

#[tokio::test]
async fn the_outbox_counts_what_it_wrote_through_cancelled_flushes() {
    let mut outbox = Outbox::new(Role::Server);
    outbox.push(true, OpCode::Text, BytesMut::from(&[b'x'; 1000][..]));
    let total = outbox.len() as u64;
    let mut writer = Trickle {
        out: Vec::new(),
        step: 100,
        ready: false,
    };
    {
        let mut flush = std::pin::pin!(outbox.flush(&mut writer));
        for _ in 0..4 {
            let _ = std::future::poll_fn(|cx| {
                Poll::Ready(std::future::Future::poll(flush.as_mut(), cx))
            })
            .await;
        }
    }
    assert_eq!(outbox.written(), writer.out.len() as u64);
    assert!(outbox.written() > 0 && outbox.written() < total);
    outbox.flush(&mut writer).await.unwrap();
    assert_eq!(outbox.written(), total);
}

proptest::proptest! {
    #[test]
    fn header_parsing_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..16)) {
        for from_client in [false, true] {
            if let Ok(Some(header)) = parse_header(&bytes, from_client, 1000) {
                proptest::prop_assert!(header.len <= 14 && header.payload_len <= 1000);
            }
        }
    }
}
