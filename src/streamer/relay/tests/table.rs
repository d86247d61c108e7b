//! The relay's state machine as a table: each row a connection driven through socket events as the I/O loop
//! drives it, and what it wrote to each side, how it ended and what it told cleanup.

use super::*;

/// One socket event, or a check of what the I/O loop would do next.
enum Step {
    /// These bytes are read from a side.
    Read(Side, Vec<u8>),
    Lost(Side),
    /// A side's liveness check, with whether it was heard within its timeout.
    Liveness(Side, bool),
    /// The write-stall check found bytes waiting toward the subscriber for the whole timeout.
    WriteStalled,
    Shutdown,
    /// Writes toward a side stop (its peer reads nothing), or resume.
    Stall(Side),
    Unstall(Side),
    /// Whether the loop reads the side now.
    Readable(Side, bool),
    /// The held acks' batch window ends.
    AckWindowEnds,
    /// Whether acks are held toward the upstream now.
    Holding(bool),
    /// The subscriber socket's low-water mark the relay asks for now (`None`: left as it is).
    LowWater(Option<u64>),
    /// The subscriber's acks waited `relay.ack_wakeup_wait`.
    AckWakeupWaitEnds,
    /// Time passes (the clock stands still otherwise).
    Advance(Duration),
}
use Step::*;

struct Row {
    name: &'static str,
    query: &'static str,
    steps: Vec<Step>,
    to_client: Vec<Written>,
    to_upstream: Vec<Written>,
    outcome: Option<SubscriptionEnd>,
    done: bool,
    /// The acknowledged watermarks the subscriber registry holds afterwards, by Zero's `id`.
    acked: &'static [(&'static str, &'static str)],
    /// Whether task t1's reservation, open before the connection, is still held.
    reservation_held: bool,
}

fn rows() -> Vec<Row> {
    use SubscriptionEnd as End;
    let refused = |code, reason: &str| CloseWith::new(code, reason);
    let split = s(true, CONTINUATION, b":1}");
    let commits = [STATUS.to_vec(), commit(2, "0b"), commit(3, "0c")];
    let ack = |id: u64| c(true, TEXT, format!(r#"{{"ack":{id}}}"#).as_bytes());
    let acked = |id: u64| whole(TEXT, format!(r#"{{"ack":{id}}}"#).as_bytes());
    let three = [
        s(true, TEXT, b"m1"),
        s(true, TEXT, b"m2"),
        s(true, TEXT, b"m3"),
    ]
    .concat();
    let zero_three_messages: [&[u8]; 3] = [
        br#"{"id":2,"msg":["begin"]}"#,
        br#"{"id":3,"msg":["data"]}"#,
        br#"{"msg":["commit"],"id":4}"#,
    ];
    let zero_three = zero_three_messages.map(|m| s(true, TEXT, m)).concat();
    // The status and those three, as the subscriber receives them.
    let zero_three_down = || {
        std::iter::once(STATUS)
            .chain(zero_three_messages)
            .map(|m| whole(TEXT, m))
            .collect::<Vec<_>>()
    };
    let awaited = |first, last| Some(crate::streamer::wakeup::ack_bytes(first, last));
    // Messages 2 to 11, as Zero 1.6 and later frame them.
    let ten: Vec<Vec<u8>> = (2..=11)
        .map(|id| format!(r#"{{"id":{id},"msg":["data"]}}"#).into_bytes())
        .collect();
    let ten_down: Vec<u8> = ten.iter().flat_map(|m| s(true, TEXT, m)).collect();
    vec![
        Row {
            name: "the subscriber's socket waits for the acks in flight; a ping, the wait limit and a close lower it",
            query: "",
            steps: vec![
                Read(Upstream, s(true, TEXT, STATUS)),
                LowWater(Some(1)),
                Read(Client, ack(1)),
                LowWater(None),
                Read(Upstream, zero_three.clone()),
                LowWater(awaited(2, 4)),
                Read(Client, ack(2)),
                LowWater(awaited(3, 4)),
                Liveness(Client, true),
                LowWater(Some(1)),
                Read(Client, c(true, PONG, b"")),
                LowWater(awaited(3, 4)),
                AckWakeupWaitEnds,
                LowWater(Some(1)),
                Read(Client, ack(3)),
                // One ack left in flight: woken for anything, as for any one ack.
                LowWater(Some(1)),
                Read(Client, c(true, CLOSE, &close_payload(1000, "done"))),
                LowWater(Some(1)),
            ],
            to_client: [zero_three_down(), vec![whole(PING, b"")]].concat(),
            to_upstream: vec![acked(1), acked(2), acked(3), closing(1000, "done")],
            outcome: Some(SubscriptionEnd::ClientClosed { code: Some(1000) }),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "the socket waits for eight acks at most, and is woken for each ack of a subscriber slower than the budget",
            query: "",
            steps: vec![
                Read(Upstream, s(true, TEXT, STATUS)),
                Read(Client, ack(1)),
                Read(Upstream, ten_down.clone()),
                LowWater(awaited(2, 9)),
                // relay.ack_wakeup_wait is 500us, the budget, and this ack took 600.
                Advance(Duration::from_micros(600)),
                Read(Client, ack(2)),
                LowWater(Some(1)),
                Advance(Duration::from_micros(100)),
                Read(Client, ack(3)),
                LowWater(Some(1)),
            ],
            to_client: std::iter::once(whole(TEXT, STATUS))
                .chain(ten.iter().map(|m| whole(TEXT, m)))
                .collect(),
            to_upstream: vec![acked(1), acked(2), acked(3)],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a subscriber that acks otherwise than one message at a time is woken for every byte",
            query: "",
            steps: vec![
                Read(Upstream, s(true, TEXT, STATUS)),
                Read(Client, ack(1)),
                Read(Upstream, zero_three.clone()),
                LowWater(awaited(2, 4)),
                Read(Client, ack(3)),
                LowWater(Some(1)),
                Read(Client, ack(4)),
                LowWater(Some(1)),
            ],
            to_client: zero_three_down(),
            to_upstream: vec![acked(1), acked(3), acked(4)],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "acks below the newest message relayed wait, and leave together with the one that catches up",
            query: "",
            steps: vec![
                Read(Upstream, three.clone()),
                Read(Client, ack(1)),
                Holding(true),
                Read(Client, ack(2)),
                Holding(true),
                Read(Client, ack(3)),
                Holding(false),
            ],
            to_client: vec![whole(TEXT, b"m1"), whole(TEXT, b"m2"), whole(TEXT, b"m3")],
            to_upstream: vec![acked(1), acked(2), acked(3)],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "held acks leave once the next read is not due within the budget of the first",
            query: "",
            steps: vec![
                Read(Upstream, three.clone()),
                Read(Client, ack(1)),
                Holding(true),
                // 400 us for this ack: the next is due 800 us after the first was held, past the 500 us budget.
                Advance(Duration::from_micros(400)),
                Read(Client, ack(2)),
                Holding(false),
                Read(Client, ack(3)),
                Holding(false),
            ],
            to_client: vec![whole(TEXT, b"m1"), whole(TEXT, b"m2"), whole(TEXT, b"m3")],
            to_upstream: vec![acked(1), acked(2), acked(3)],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "held acks leave when their window ends, and an ack with nothing after it is never held",
            query: "",
            steps: vec![
                Read(Upstream, three.clone()),
                Read(Client, [ack(1), ack(2)].concat()),
                AckWindowEnds,
                Holding(false),
                Read(Client, ack(3)),
                Holding(false),
                Read(Upstream, s(true, TEXT, b"m4")),
                Read(Client, ack(4)),
                Holding(false),
            ],
            to_client: vec![
                whole(TEXT, b"m1"),
                whole(TEXT, b"m2"),
                whole(TEXT, b"m3"),
                whole(TEXT, b"m4"),
            ],
            to_upstream: vec![acked(1), acked(2), acked(3), acked(4)],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "anything but an ack, an upstream ping or a close sends the held acks at once, in order",
            query: "",
            steps: vec![
                Read(Upstream, three.clone()),
                Read(Client, ack(1)),
                Holding(true),
                Read(Client, c(true, TEXT, b"not an ack")),
                Holding(false),
                Read(Client, ack(2)),
                Holding(true),
                Read(Upstream, s(true, PING, b"p")),
                Holding(false),
                Read(Client, [c(false, TEXT, br#"{"ack""#), c(true, CONTINUATION, b":3}")].concat()),
                Holding(false),
                Read(Upstream, s(true, TEXT, b"m4")),
                Read(Client, ack(4)),
                Holding(false),
                Read(Upstream, s(true, TEXT, b"m5")),
                Read(Upstream, s(true, TEXT, b"m6")),
                Read(Client, ack(5)),
                Holding(true),
                Read(Client, c(true, CLOSE, &close_payload(1000, "done"))),
            ],
            to_client: vec![
                whole(TEXT, b"m1"),
                whole(TEXT, b"m2"),
                whole(TEXT, b"m3"),
                whole(TEXT, b"m4"),
                whole(TEXT, b"m5"),
                whole(TEXT, b"m6"),
            ],
            to_upstream: vec![
                acked(1),
                whole(TEXT, b"not an ack"),
                acked(2),
                whole(PONG, b"p"),
                (false, TEXT, br#"{"ack""#.to_vec()),
                whole(CONTINUATION, b":3}"),
                acked(4),
                acked(5),
                closing(1000, "done"),
            ],
            outcome: Some(SubscriptionEnd::ClientClosed { code: Some(1000) }),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "data passes both ways as received; each hop answers its own pings",
            query: "id=s1",
            steps: vec![
                Read(
                    Upstream,
                    [s(true, TEXT, b"status"), s(true, PING, b"up")].concat(),
                ),
                Read(
                    Client,
                    [c(true, TEXT, b"ack"), c(true, PING, b"down")].concat(),
                ),
            ],
            to_client: vec![whole(TEXT, b"status"), whole(PONG, b"down")],
            to_upstream: vec![whole(PONG, b"up"), whole(TEXT, b"ack")],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "fragments pass as fragments; a frame split across reads leaves whole",
            query: "",
            steps: vec![
                Read(
                    Upstream,
                    [s(false, TEXT, b"{\"a\""), split[..3].to_vec()].concat(),
                ),
                Read(Upstream, split[3..].to_vec()),
            ],
            to_client: vec![
                (false, TEXT, b"{\"a\"".to_vec()),
                whole(CONTINUATION, b":1}"),
            ],
            to_upstream: vec![],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "the upstream's close reaches the subscriber, and the answer goes back",
            query: "",
            steps: vec![
                Read(Upstream, s(true, CLOSE, &close_payload(1000, "bye"))),
                Read(Client, c(true, CLOSE, &close_payload(1000, "bye"))),
            ],
            to_client: vec![closing(1000, "bye")],
            to_upstream: vec![closing(1000, "bye")],
            outcome: Some(End::UpstreamClosed { code: Some(1000) }),
            done: true,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "the subscriber's close reaches the upstream; nothing after it is read",
            query: "",
            steps: vec![
                Read(
                    Client,
                    [
                        c(true, TEXT, b"a"),
                        c(true, CLOSE, &close_payload(4000, "x")),
                        c(true, TEXT, b"b"),
                    ]
                    .concat(),
                ),
                Readable(Client, false),
                Read(Upstream, s(true, CLOSE, &close_payload(4000, "x"))),
            ],
            to_client: vec![closing(4000, "x")],
            to_upstream: vec![whole(TEXT, b"a"), closing(4000, "x")],
            outcome: Some(End::ClientClosed { code: Some(4000) }),
            done: true,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a lost subscriber's upstream is closed with 1001",
            query: "",
            steps: vec![Lost(Client), Read(Upstream, s(true, CLOSE, b""))],
            to_client: vec![],
            to_upstream: vec![closing(1001, "subscriber gone")],
            outcome: Some(End::ClientGone),
            done: true,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a lost upstream is reported to the subscriber with 1011",
            query: "",
            steps: vec![Lost(Upstream), Read(Client, c(true, CLOSE, b""))],
            to_client: vec![closing(1011, "Error: upstream connection lost")],
            to_upstream: vec![],
            outcome: Some(End::UpstreamGone),
            done: true,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a subscriber is pinged while it answers, dropped when it does not",
            query: "",
            steps: vec![Liveness(Client, true), Liveness(Client, false)],
            to_client: vec![whole(PING, b"")],
            to_upstream: vec![closing(1001, "subscriber unresponsive")],
            outcome: Some(End::ClientUnresponsive),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a silent upstream is dropped, the subscriber told with 1011",
            query: "",
            steps: vec![Liveness(Upstream, true), Liveness(Upstream, false)],
            to_client: vec![closing(1011, "Error: upstream silent")],
            to_upstream: vec![],
            outcome: Some(End::UpstreamSilent),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a slow subscriber holds its upstream back; neither is faulted for it",
            query: "",
            steps: vec![
                Stall(Client),
                Read(Upstream, s(true, TEXT, &[b'x'; 100])),
                Readable(Upstream, false),
                Liveness(Upstream, false),
                Liveness(Client, false),
                Unstall(Client),
                Readable(Upstream, true),
            ],
            to_client: vec![whole(TEXT, &[b'x'; 100])],
            to_upstream: vec![],
            outcome: None,
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a subscriber that stops reading is not faulted by liveness but ended by the stall rule",
            query: "id=s1",
            steps: vec![
                Stall(Client),
                Read(Upstream, s(true, TEXT, &[b'x'; 100])),
                Liveness(Client, false),
                Liveness(Client, false),
                Readable(Upstream, false),
                WriteStalled,
                Readable(Client, false),
                Readable(Upstream, true),
            ],
            to_client: vec![],
            to_upstream: vec![closing(1001, "subscriber stopped reading")],
            outcome: Some(End::ClientStalled),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "shutdown closes both sides with 1001",
            query: "",
            steps: vec![Shutdown],
            to_client: vec![closing(1001, "sidecar shutting down")],
            to_upstream: vec![closing(1001, "sidecar shutting down")],
            outcome: Some(End::Shutdown),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "an unmasked frame from the subscriber: 1002 to it, 1001 upstream",
            query: "",
            steps: vec![Read(Client, s(true, TEXT, b"{}"))],
            to_client: vec![closing(1002, "unmasked frame from a client")],
            to_upstream: vec![closing(1001, "subscriber gone")],
            outcome: Some(End::ClientProtocolError(refused(
                1002,
                "unmasked frame from a client",
            ))),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a masked frame from the upstream: 1002 to it, 1011 to the subscriber",
            query: "",
            steps: vec![Read(Upstream, c(true, TEXT, b"{}"))],
            to_client: vec![closing(1011, "Error: upstream: masked frame from a server")],
            to_upstream: vec![closing(1002, "masked frame from a server")],
            outcome: Some(End::UpstreamProtocolError(refused(
                1002,
                "masked frame from a server",
            ))),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a frame over server.max_message_bytes is refused from its header",
            query: "",
            steps: vec![Read(
                Client,
                c(true, TEXT, &[b'x'; MAX_MESSAGE + 1])[..8].to_vec(),
            )],
            to_client: vec![closing(1009, "message too big")],
            to_upstream: vec![closing(1001, "subscriber gone")],
            outcome: Some(End::ClientProtocolError(refused(1009, "message too big"))),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "a close with an invalid code is answered with 1002",
            query: "",
            steps: vec![Read(Client, c(true, CLOSE, &1005u16.to_be_bytes()))],
            to_client: vec![closing(1002, "invalid close code")],
            to_upstream: vec![closing(1001, "subscriber gone")],
            outcome: Some(End::ClientProtocolError(refused(
                1002,
                "invalid close code",
            ))),
            done: false,
            acked: &[],
            reservation_held: true,
        },
        Row {
            name: "an initial subscription's first answer ends its task's reservation",
            query: "taskID=t1&id=s1&replicaVersion=01&watermark=0a&initial=true",
            steps: vec![
                Read(
                    Upstream,
                    commits
                        .iter()
                        .map(|m| s(true, TEXT, m))
                        .collect::<Vec<_>>()
                        .concat(),
                ),
                // A fragmented ack counts too.
                Read(
                    Client,
                    [c(false, TEXT, b"{\"ack\""), c(true, CONTINUATION, b":2}")].concat(),
                ),
            ],
            to_client: commits.iter().map(|m| whole(TEXT, m)).collect(),
            to_upstream: vec![
                (false, TEXT, b"{\"ack\"".to_vec()),
                whole(CONTINUATION, b":2}"),
            ],
            outcome: None,
            done: false,
            acked: &[("s1", "0b")],
            reservation_held: false,
        },
        Row {
            name: "a subscription that is not initial leaves the reservation alone",
            query: "taskID=t1&id=s1&replicaVersion=01&watermark=0a",
            steps: vec![Read(Upstream, s(true, TEXT, STATUS))],
            to_client: vec![whole(TEXT, STATUS)],
            to_upstream: vec![],
            outcome: None,
            done: false,
            acked: &[("s1", "0a")],
            reservation_held: true,
        },
    ]
}

/// Drives one relayed connection through each row's events as the I/O loop would, writing every outbox after
/// each step unless its side is stalled. The clock moves only with `Advance`.
#[tokio::test(start_paused = true)]
async fn a_relayed_connection_answers_each_event() {
    for row in rows() {
        let name = row.name;
        let ctx = context();
        let _lease = ctx.handles.registry.open("t1", Instant::now());
        let mut relay = Relay::new(
            &ctx,
            3,
            protocol::parse_subscriber_context(Some(row.query)),
            ctx.handles.registry.ticket(),
        );
        let mut from_client = Inbox::new(true, MAX_MESSAGE, Reads::Bulk);
        let mut from_upstream = Inbox::new(false, MAX_MESSAGE, Reads::Bulk);
        let (mut to_client, mut to_upstream) = (Vec::new(), Vec::new());
        let (mut client_stalled, mut upstream_stalled) = (false, false);
        for step in row.steps {
            match step {
                Read(side, bytes) => {
                    assert!(relay.wants_read(side), "{name}: {side:?} is not read now");
                    let inbox = match side {
                        Client => &mut from_client,
                        Upstream => &mut from_upstream,
                    };
                    assert_eq!(inbox.fill(&mut &bytes[..]).await.unwrap(), bytes.len());
                    relay.on_read(side, inbox);
                }
                Lost(side) => relay.on_lost(side),
                Liveness(side, heard) => {
                    let excused = relay.excused(side);
                    relay.on_liveness_check(side, !heard && !excused)
                }
                WriteStalled => relay.on_write_stalled(),
                Shutdown => relay.on_shutdown(),
                Stall(Client) => client_stalled = true,
                Unstall(Client) => client_stalled = false,
                Stall(Upstream) => upstream_stalled = true,
                Unstall(Upstream) => upstream_stalled = false,
                Readable(side, expected) => {
                    assert_eq!(
                        relay.wants_read(side),
                        expected,
                        "{name}: {side:?} readable"
                    )
                }
                AckWindowEnds => relay.on_ack_window_end(),
                Holding(expected) => {
                    assert_eq!(relay.ack_hold().is_some(), expected, "{name}: holding")
                }
                LowWater(expected) => {
                    assert_eq!(relay.ack_wakeup_threshold(), expected, "{name}: low water")
                }
                AckWakeupWaitEnds => relay.on_ack_wakeup_wait_end(),
                Advance(by) => tokio::time::advance(by).await,
            }
            if relay.wants_write(Client) && !client_stalled {
                relay.client.outbox.flush(&mut to_client).await.unwrap();
            }
            if relay.wants_write(Upstream) && !upstream_stalled {
                relay.upstream.outbox.flush(&mut to_upstream).await.unwrap();
            }
        }
        assert_eq!(
            written(&to_client, false),
            row.to_client,
            "{name}: to the subscriber"
        );
        assert_eq!(
            written(&to_upstream, true),
            row.to_upstream,
            "{name}: to the upstream"
        );
        assert_eq!(relay.outcome, row.outcome, "{name}");
        assert_eq!(relay.is_done(), row.done, "{name}: done");
        let acked: Vec<(String, String)> = row
            .acked
            .iter()
            .map(|(id, w)| (id.to_string(), w.to_string()))
            .collect();
        assert_eq!(
            ctx.handles.subscribers.acked_by_id(),
            acked,
            "{name}: acked"
        );
        assert_eq!(
            ctx.handles.registry.len() == 1,
            row.reservation_held,
            "{name}: reservation"
        );
    }
}
