//! The relay's state machine and its pieces, frames in, frames and outcomes out: the helpers every test here uses,
//! and the pieces tested one at a time. The state machine as a table is in `table.rs`, ack tracking in `acks.rs`.

mod acks;
mod table;

use super::upstream::upstream_target;
use super::*;
use crate::net::ws::Reads;
use Side::{Client, Upstream};

const TEXT: u8 = 0x1;
const CONTINUATION: u8 = 0x0;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xa;
/// `server.max_message_bytes` in every test here.
const MAX_MESSAGE: usize = 1024;

fn frame(fin: bool, opcode: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![if fin { 0x80 } else { 0 } | opcode];
    let masked = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n @ 0..=125 => frame.push(masked | n as u8),
        n @ 126..=0xffff => {
            frame.push(masked | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(masked | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mut payload = payload.to_vec();
    if let Some(key) = mask {
        frame.extend_from_slice(&key);
        fastwebsockets::unmask(&mut payload, key);
    }
    frame.extend_from_slice(&payload);
    frame
}

/// A frame as a subscriber sends it: masked.
fn c(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(fin, opcode, Some([0x11, 0x22, 0x33, 0x44]), payload)
}

/// A frame as the upstream sends it: unmasked.
fn s(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(fin, opcode, None, payload)
}

fn close_payload(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    payload
}

/// A frame as written, read back: fin, opcode, payload (unmasked).
type Written = (bool, u8, Vec<u8>);

fn whole(opcode: u8, payload: &[u8]) -> Written {
    (true, opcode, payload.to_vec())
}

fn closing(code: u16, reason: &str) -> Written {
    (true, CLOSE, close_payload(code, reason))
}

/// Parses written bytes back into frames, checking that they are masked exactly when `masked`.
fn written(mut bytes: &[u8], masked: bool) -> Vec<Written> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header = ws::parse_header(bytes, masked, usize::MAX >> 2)
            .expect("a valid frame")
            .expect("a whole header");
        let mut payload = bytes[header.len..header.frame_len()].to_vec();
        if let Some(key) = header.mask {
            fastwebsockets::unmask(&mut payload, key);
        }
        frames.push((header.fin, header.opcode as u8, payload));
        bytes = &bytes[header.frame_len()..];
    }
    frames
}

fn context() -> RelayContext {
    let config = crate::config::from_toml_str(
        "[litestream]\nbackup_url = \"s3://b/r\"\n[discovery]\nmode = \"off\"\n",
        Some(Default::default()),
    )
    .unwrap()
    .validate()
    .unwrap();
    let mut relay = config.relay;
    relay.max_buffered_bytes = 64;
    relay.ack_batch_window = Duration::from_millis(1);
    // The tables' transactions are a few messages: acks gathered from any backlog, since the wake-up's other rules
    // are what they test (the backlog itself: wakeup/tests.rs and tests/it/relay.rs).
    relay.ack_wakeup_backlog = 1;
    RelayContext {
        settings: Arc::new(Settings {
            upstream: config.upstream,
            upstream_tls: None,
            relay,
            ping_interval: Duration::from_secs(1),
            peer_timeout: Duration::from_secs(4),
            max_message_bytes: MAX_MESSAGE,
        }),
        handles: crate::cleanup::handles::Handles {
            registry: crate::cleanup::reservations::Registry::new(Duration::ZERO),
            subscribers: crate::cleanup::subscribers::Subscribers::default(),
            status: Default::default(),
            discovery: Default::default(),
        },
        instruments: crate::ops::metrics::Instruments::default(),
        protocols: crate::streamer::protocols::UpstreamProtocols::new(
            &crate::streamer::config::Protocols::Auto,
        ),
        shutdown: CancellationToken::new(),
    }
}

const STATUS: &[u8] = br#"{"id":1,"msg":["status",{"tag":"status"}]}"#;

fn commit(id: u64, watermark: &str) -> Vec<u8> {
    format!(r#"{{"id":{id},"msg":["commit",{{"tag":"commit"}},{{"watermark":"{watermark}"}}]}}"#)
        .into_bytes()
}

/// A cleanup check running beside the handover from reservation to subscription (reservations read first,
/// then subscribers, as the monitor reads them) finds every restore still covered by one or the other.
#[test]
fn a_check_during_the_handover_sees_the_reservation_or_the_subscriber() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    const ROUNDS: u64 = 2_000;
    let ctx = context();
    let opened = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let checker = scope.spawn(|| {
            let mut checks = 0u64;
            while !done.load(SeqCst) {
                let covered = opened.load(SeqCst);
                let reservations = ctx.handles.registry.for_policy().len() as u64;
                let subscribers = ctx.handles.subscribers.connected() as u64;
                assert!(
                    reservations + subscribers >= covered,
                    "after {covered} restores a check saw {reservations} reservations and {subscribers} \
                     subscribers"
                );
                checks += 1;
            }
            checks
        });
        let mut tracked = Vec::new();
        for round in 0..ROUNDS {
            let lease = ctx.handles.registry.open("t1", Instant::now());
            opened.fetch_add(1, SeqCst);
            let query =
                format!("taskID=t1&id=s{round}&replicaVersion=01&watermark=0a&initial=true");
            let subscription = protocol::parse_subscriber_context(Some(&query));
            let requested = ctx.handles.registry.ticket();
            let relay = Relay::new(&ctx, 3, subscription.clone(), requested);
            on_subscribed(&ctx, &subscription, requested);
            tracked.push(relay.acks);
            drop(lease);
        }
        done.store(true, SeqCst);
        assert!(checker.join().unwrap() > 0);
        assert_eq!(ctx.handles.subscribers.connected() as u64, ROUNDS);
    });
}

#[tokio::test]
async fn relayed_frames_are_not_re_encoded() {
    // A 5-byte payload under a 16-bit length, which no encoder writes: passed on exactly as it came.
    let odd = [&[0x81u8, 126, 0, 5][..], b"hello"].concat();
    let ctx = context();
    let mut relay = Relay::new(
        &ctx,
        3,
        SubscriberContext::default(),
        ctx.handles.registry.ticket(),
    );
    let mut inbox = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
    inbox.fill(&mut &odd[..]).await.unwrap();
    relay.on_read(Side::Upstream, &mut inbox);
    let mut out = Vec::new();
    relay.client.outbox.flush(&mut out).await.unwrap();
    assert_eq!(out, odd);
}

#[tokio::test]
async fn with_no_ack_batch_window_each_reads_acks_leave_at_once() {
    let mut ctx = context();
    let mut settings = (*ctx.settings).clone();
    settings.relay.ack_batch_window = Duration::ZERO;
    ctx.settings = Arc::new(settings);
    let mut relay = Relay::new(
        &ctx,
        3,
        protocol::parse_subscriber_context(None),
        ctx.handles.registry.ticket(),
    );
    let mut from_client = Inbox::new(true, MAX_MESSAGE, Reads::Bulk);
    let mut from_upstream = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
    let messages = [s(true, TEXT, b"m1"), s(true, TEXT, b"m2")].concat();
    from_upstream.fill(&mut &messages[..]).await.unwrap();
    relay.on_read(Upstream, &mut from_upstream);
    let ack = c(true, TEXT, br#"{"ack":1}"#);
    from_client.fill(&mut &ack[..]).await.unwrap();
    relay.on_read(Client, &mut from_client);
    assert_eq!(relay.ack_hold(), None);
    assert!(relay.wants_write(Upstream));
}

#[test]
fn the_query_is_forwarded_with_only_initial_changed() {
    let q = "taskID=t1&id=a%2Fb&initial=true";
    assert_eq!(
        upstream_target("/replication/v3/changes", Some(q), true),
        "/replication/v3/changes?taskID=t1&id=a%2Fb&initial=false"
    );
    assert_eq!(
        upstream_target("/replication/v3/changes", Some(q), false),
        format!("/replication/v3/changes?{q}")
    );
    assert_eq!(
        upstream_target("/replication/v5/changes", None, true),
        "/replication/v5/changes"
    );
    assert_eq!(
        upstream_target("/replication/v5/changes", Some(""), true),
        "/replication/v5/changes?"
    );
}

/// Zero refuses a version by closing with 1002 before anything else: that close, for the subscription's own version,
/// teaches the upstream's range; any other close teaches nothing. Either way it reaches the subscriber as sent.
#[tokio::test]
async fn an_upstreams_refusal_of_the_version_teaches_its_range() {
    let refusal = "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]";
    for (version, answered_first, code, reason, learned) in [
        (3, false, 1002, refusal, Some(4..=6)),
        // Another version's refusal, another code, a stream the upstream had answered, another reason.
        (4, false, 1002, refusal, None),
        (3, false, 1011, refusal, None),
        (3, true, 1002, refusal, None),
        (
            3,
            false,
            1002,
            "Error: invalid querystring - missing id",
            None,
        ),
    ] {
        let ctx = context();
        let mut relay = Relay::new(
            &ctx,
            version,
            SubscriberContext::default(),
            ctx.handles.registry.ticket(),
        );
        let mut bytes = Vec::new();
        if answered_first {
            bytes.extend(s(true, TEXT, STATUS));
        }
        bytes.extend(s(true, CLOSE, &close_payload(code, reason)));
        let mut inbox = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
        inbox.fill(&mut &bytes[..]).await.unwrap();
        relay.on_read(Upstream, &mut inbox);
        let case = format!("v{version} {code} {reason:?} answered first: {answered_first}");
        assert_eq!(ctx.protocols.versions(), learned, "{case}");
        let mut out = Vec::new();
        relay.client.outbox.flush(&mut out).await.unwrap();
        assert_eq!(
            written(&out, false).last(),
            Some(&closing(code, reason)),
            "{case}"
        );
    }
}

/// The upstream's first frame often shares a segment with its 101: it is read from the dialed socket first, which
/// is taken back from hyper as plain TCP.
#[tokio::test]
async fn a_dialed_upstream_is_taken_back_as_tcp_with_the_frame_that_came_with_its_101() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut upstream = context().settings.upstream.clone();
    upstream.address = listener.local_addr().unwrap().to_string();
    let zero = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut chunk = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the dial closed before its request ended");
            request.extend_from_slice(&chunk[..n]);
        }
        let mut answer =
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
                .to_vec();
        answer.extend_from_slice(&s(true, TEXT, STATUS));
        socket.write_all(&answer).await.unwrap();
        let mut rest = Vec::new();
        socket.read_to_end(&mut rest).await.unwrap();
        rest
    });
    let io = super::upstream::connect(&upstream, None, "/replication/v6/changes")
        .await
        .unwrap();
    let mut socket = crate::net::upgraded::Socket::take(io);
    assert!(socket.is_plain());
    let (mut reader, mut writer) = socket.split();
    let expected = s(true, TEXT, STATUS);
    let mut read = vec![0u8; expected.len()];
    tokio::time::timeout(Duration::from_secs(10), reader.read_exact(&mut read))
        .await
        .expect("the status within 10 s")
        .unwrap();
    assert_eq!(read, expected);
    writer.write_all(b"ack").await.unwrap();
    drop((reader, writer));
    drop(socket);
    assert_eq!(zero.await.unwrap(), b"ack");
}
