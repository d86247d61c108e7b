//! The `/changes` relay over real sockets: a tokio-tungstenite subscriber, the sidecar, and a stand-in upstream
//! playing Zero 0.20's change-streamer (msg-first frames, strict acks, Zero's close codes and reasons).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

fn begin(watermark: &str) -> String {
    format!(
        r#"["begin",{{"tag":"begin","commitLsn":"16/B374D9A0","commitTime":1746600001234567,"xid":8123,"json":"s"}},{{"commitWatermark":"{watermark}"}}]"#
    )
}

fn commit(watermark: &str) -> String {
    format!(
        r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","commitEndLsn":"16/B374D9D0","commitTime":1746600001234567}},{{"watermark":"{watermark}"}}]"#
    )
}

/// A data message with what a relay must not touch: an integer beyond 2^53, `\u0000`, and the word commit.
const DATA: &str = r#"["data",{"tag":"insert","relation":{"schema":"public","name":"issue","keyColumns":["id"],"replicaIdentity":"default"},"new":{"id":"i1","big":9007199254740993,"neg":-18446744073709551617,"f":1.0e+400,"s":"a\u0000b \"commit\" é"}}]"#;

/// Opens a subscription through the sidecar and returns both ends of it.
async fn open(sidecar: &Sidecar, upstream: &mut Upstream, path: &str) -> (Client, UpstreamConn) {
    let url = sidecar.url(path);
    tokio::join!(connect(&url), upstream.accept())
}

/// Opens a subscription through the sidecar; the upstream admits it like Zero and sends the status.
async fn subscribe(
    sidecar: &Sidecar,
    upstream: &mut Upstream,
    path: &str,
) -> (Client, UpstreamConn, String) {
    let (mut client, mut conn) = open(sidecar, upstream, path).await;
    assert!(conn.admit_like_zero().await, "{}", conn.target);
    let status = conn.send_msg(1, UPSTREAM_STATUS).await;
    assert_eq!(next_text(&mut client).await, status);
    (client, conn, status)
}

/// The upstream sends messages `first..`: a begin at `watermark`, `rows` data messages and the commit; the
/// subscriber reads them all.
async fn relay_transaction(
    conn: &mut UpstreamConn,
    client: &mut Client,
    first: u64,
    rows: u64,
    watermark: &str,
) {
    conn.send_msg(first, &begin(watermark)).await;
    for id in first + 1..=first + rows {
        conn.send_msg(id, DATA).await;
    }
    conn.send_msg(first + rows + 1, &commit(watermark)).await;
    for _ in first..=first + rows + 1 {
        next_text(client).await;
    }
}

#[tokio::test]
async fn frames_are_relayed_byte_for_byte_both_ways() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "serving-replicator-4242", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;

    let frames = [
        conn.send_msg(2, &begin("0b")).await,
        conn.send_msg(3, DATA).await,
        conn.send_msg(4, &commit("0b")).await,
    ];
    for frame in &frames {
        assert_eq!(next_text(&mut client).await.as_bytes(), frame.as_bytes());
    }
    // The id-first order of later Zero versions, odd whitespace, and a binary frame pass untouched as well.
    let id_first = format!("{{ \"id\" : 5 ,\n\"msg\":{DATA} }}");
    conn.send_text(&id_first).await;
    assert_eq!(next_text(&mut client).await, id_first);
    conn.ws
        .send(Message::Binary(vec![0u8, 1, 2, 255].into()))
        .await
        .unwrap();
    assert_eq!(
        next_message(&mut client).await,
        Some(Message::Binary(vec![0u8, 1, 2, 255].into()))
    );

    for ack in 1..=5 {
        send_text(&mut client, &format!(r#"{{"ack":{ack}}}"#)).await;
        assert_eq!(conn.next_ack().await, ack);
    }
    // Whatever else the subscriber sends reaches the upstream as sent; the upstream decides about it.
    let odd = r#"{"ack":6,"note":"big 9007199254740993 \u0000"}"#;
    send_text(&mut client, odd).await;
    assert_eq!(conn.next_text().await, odd);
    client
        .send(Message::Binary(vec![9u8, 8].into()))
        .await
        .unwrap();
    assert_eq!(
        conn.next_message().await,
        Some(Message::Binary(vec![9u8, 8].into()))
    );
    // Zero ends a stream after a bad ack with a close without a code; the subscriber sees exactly that.
    conn.close(None, "").await;
    assert_eq!(expect_close(&mut client).await, None);
    sidecar.stop().await;
}

#[tokio::test]
async fn hundred_mib_messages_pass_both_ways() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "big", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;

    let filler = "x".repeat(100 << 20);
    let down = format!(r#"{{"msg":["data",{{"tag":"insert","new":{{"s":"{filler}"}}}}],"id":2}}"#);
    assert!(down.len() > 100 << 20);
    conn.send_text(&down).await;
    let received = next_text(&mut client).await;
    assert!(received == down, "the 100 MiB message changed on the way");
    drop(received);

    let up = format!(r#"{{"note":"{filler}"}}"#);
    send_text(&mut client, &up).await;
    let received = conn.next_text().await;
    assert!(received == up, "the 100 MiB message changed on the way up");
    sidecar.stop().await;
}

#[tokio::test]
async fn the_query_is_forwarded_exactly_with_initial_rewritten_only_when_configured() {
    let query = "taskID=0042ea&id=rm-1%2Fbackup-replicator-1234&mode=backup&watermark=718sh0nk8\
                 &replicaVersion=618ocqq8&initial=true&x=%7E+y";
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    for version in 1..=6 {
        let path = format!("/replication/v{version}/changes?{query}");
        let (_client, conn) = open(&sidecar, &mut upstream, &path).await;
        assert_eq!(
            conn.target,
            format!(
                "/replication/v{version}/changes?{}",
                query.replace("initial=true", "initial=false")
            )
        );
    }
    // Without `initial=true` nothing changes.
    let other = "id=a%20b&initial=TRUE&replicaVersion=01&watermark=0a&initial=true";
    let path = format!("/replication/v3/changes?{other}");
    let (_client, conn) = open(&sidecar, &mut upstream, &path).await;
    assert_eq!(conn.target, path);
    sidecar.stop().await;

    let sidecar = start(upstream.config("[relay]\nsuppress_upstream_cleanup = false\n")).await;
    let path = format!("/replication/v3/changes?{query}");
    let (_client, conn) = open(&sidecar, &mut upstream, &path).await;
    assert_eq!(conn.target, path);
    sidecar.stop().await;
}

#[tokio::test]
async fn an_initial_subscription_ends_its_tasks_reservation_once_the_upstream_answers() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    for (task, mode) in [("vs-1", "serving"), ("rm-1", "backup")] {
        let mut reservation = connect(&sidecar.snapshot_url(task)).await;
        next_text(&mut reservation).await;
        eventually("reservation", || sidecar.registry.len() == 1).await;

        let path = format!(
            "/replication/v3/changes?taskID={task}&id=r&mode={mode}&watermark=0a&replicaVersion=01&initial=true"
        );
        let (mut client, mut conn) = open(&sidecar, &mut upstream, &path).await;
        // Not before the upstream has registered the subscriber, which its first message shows.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(sidecar.registry.len(), 1);
        conn.send_msg(1, UPSTREAM_STATUS).await;
        next_text(&mut client).await;
        // Zero closes the ended reservation without a status code.
        assert_eq!(expect_close(&mut reservation).await, None);
        assert!(sidecar.registry.is_empty());
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_subscription_answered_after_a_newer_reservation_leaves_it_open() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path =
        "/replication/v3/changes?taskID=vs-1&id=r&watermark=0a&replicaVersion=01&initial=true";
    // The subscription is requested; the upstream is slow to answer it.
    let (mut late, mut late_conn) = open(&sidecar, &mut upstream, path).await;
    // Meanwhile the task restores again and reserves.
    let mut reservation = connect(&sidecar.snapshot_url("vs-1")).await;
    next_text(&mut reservation).await;
    eventually("reservation", || sidecar.registry.len() == 1).await;

    late_conn.send_msg(1, UPSTREAM_STATUS).await;
    next_text(&mut late).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sidecar.registry.len(),
        1,
        "a subscription requested before the reservation opened ended it"
    );

    // The restore's own subscription, requested after it reserved, ends it.
    let (mut client, mut conn) = open(&sidecar, &mut upstream, path).await;
    conn.send_msg(1, UPSTREAM_STATUS).await;
    next_text(&mut client).await;
    assert_eq!(expect_close(&mut reservation).await, None);
    assert!(sidecar.registry.is_empty());
    sidecar.stop().await;
}

#[tokio::test]
async fn other_subscriptions_leave_reservations_alone() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let mut reservation = connect(&sidecar.snapshot_url("vs-1")).await;
    next_text(&mut reservation).await;
    eventually("reservation", || sidecar.registry.len() == 1).await;

    let mut open = Vec::new();
    for path in [
        changes_path(3, "vs-1", "a", "0a", false),
        changes_path(3, "", "b", "0a", true),
        changes_path(3, "vs-2", "c", "0a", true),
        "/replication/v3/changes?id=d&watermark=0a&replicaVersion=01&initial=true".to_string(),
    ] {
        open.push(subscribe(&sidecar, &mut upstream, &path).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sidecar.registry.len(), 1);
    sidecar.stop().await;
}

#[tokio::test]
async fn acknowledged_commits_reach_the_subscriber_registry() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", true);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    eventually("registered", || sidecar.subscribers.connected() == 1).await;
    let acked = |sidecar: &Sidecar| sidecar.subscribers.acked_by_id();
    assert_eq!(
        acked(&sidecar),
        [("serving-replicator-1".to_string(), "0a".to_string())]
    );

    conn.send_msg(2, &begin("0b")).await;
    conn.send_msg(3, DATA).await;
    conn.send_msg(4, &commit("0b")).await;
    conn.send_msg(5, &begin("0c")).await;
    conn.send_msg(6, &commit("0c")).await;
    for _ in 2..=6 {
        next_text(&mut client).await;
    }
    for ack in 1..=3 {
        send_text(&mut client, &format!(r#"{{"ack":{ack}}}"#)).await;
        assert_eq!(conn.next_ack().await, ack);
    }
    assert_eq!(acked(&sidecar)[0].1, "0a");
    send_text(&mut client, r#"{"ack":4}"#).await;
    assert_eq!(conn.next_ack().await, 4);
    assert_eq!(acked(&sidecar)[0].1, "0b");
    for ack in 5..=6 {
        send_text(&mut client, &format!(r#"{{"ack":{ack}}}"#)).await;
        assert_eq!(conn.next_ack().await, ack);
    }
    assert_eq!(acked(&sidecar)[0].1, "0c");

    // The subscriber leaves: it is remembered as departed, with what it had acknowledged.
    client.close(None).await.unwrap();
    assert_eq!(conn.expect_close().await, None);
    eventually("departed", || sidecar.subscribers.connected() == 0).await;
    let policy = sidecar
        .subscribers
        .for_policy(tokio::time::Instant::now(), Duration::from_secs(60));
    assert_eq!(policy.len(), 1);
    assert_eq!(policy[0].acked, "0c");
    assert!(policy[0].departed.is_some());
    sidecar.stop().await;
}

#[tokio::test]
async fn batched_acks_reach_the_upstream_in_order_even_when_no_more_come() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("[relay]\nack_batch_window = \"20ms\"\n")).await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    relay_transaction(&mut conn, &mut client, 2, 1, "0b").await;
    // Acks 1 and 2 leave messages in flight, so they are held; nothing follows them, and the window sends them.
    send_text(&mut client, r#"{"ack":1}"#).await;
    send_text(&mut client, r#"{"ack":2}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    assert_eq!(conn.next_ack().await, 2);
    send_text(&mut client, r#"{"ack":3}"#).await;
    send_text(&mut client, r#"{"ack":4}"#).await;
    assert_eq!(conn.next_ack().await, 3);
    assert_eq!(conn.next_ack().await, 4);
    sidecar.stop().await;
}

/// The relay asks the kernel not to wake it for a subscriber's acks until all those sure to come are there
/// (`relay.ack_wakeup_bytes`, SO_RCVLOWAT); they then leave together, in order. (A backlog of 1: the three messages
/// in flight here are below the default's.)
#[tokio::test]
async fn acks_wait_in_the_kernel_for_the_rest_of_theirs_then_leave_in_order() {
    let mut upstream = Upstream::start().await;
    let sidecar =
        start(upstream.config("[relay]\nack_wakeup_wait = \"1s\"\nack_wakeup_backlog = 1\n")).await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    // Ack 1 shows one ack per message; it leaves nothing in flight and goes at once.
    send_text(&mut client, r#"{"ack":1}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    relay_transaction(&mut conn, &mut client, 2, 1, "0b").await;
    send_text(&mut client, r#"{"ack":2}"#).await;
    send_text(&mut client, r#"{"ack":3}"#).await;
    let early = tokio::time::timeout(Duration::from_millis(300), conn.next_ack()).await;
    assert!(
        early.is_err(),
        "ack {early:?} left before the last one came"
    );
    send_text(&mut client, r#"{"ack":4}"#).await;
    for ack in 2..=4 {
        assert_eq!(conn.next_ack().await, ack);
    }
    sidecar.stop().await;
}

/// A subscriber that pauses mid-transaction has the acks it sent forwarded after `relay.ack_wakeup_wait`, and its
/// close is heard as soon, though the acks the relay waited for never come.
#[tokio::test]
async fn acks_and_a_close_from_a_subscriber_that_pauses_mid_transaction_are_heard_after_the_wait() {
    let mut upstream = Upstream::start().await;
    let sidecar =
        start(upstream.config("[relay]\nack_wakeup_wait = \"50ms\"\nack_wakeup_backlog = 1\n"))
            .await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    send_text(&mut client, r#"{"ack":1}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    relay_transaction(&mut conn, &mut client, 2, 1, "0b").await;
    // Well before the first ping (server.ping_interval, 10 s), which would also let them through.
    let within = Duration::from_secs(5);
    send_text(&mut client, r#"{"ack":2}"#).await;
    let ack = tokio::time::timeout(within, conn.next_ack()).await;
    assert_eq!(ack.ok(), Some(2));
    client
        .send(Message::Close(Some(CloseFrame {
            code: 1000.into(),
            reason: "".into(),
        })))
        .await
        .unwrap();
    let close = tokio::time::timeout(within, conn.expect_close()).await;
    assert_eq!(close.ok(), Some(Some((1000, String::new()))));
    sidecar.stop().await;
}

/// At the default `relay.ack_wakeup_backlog` (8), a live transaction of three messages does not repay a wait: each
/// of its acks leaves as it comes, though the wait limit is long.
#[tokio::test]
async fn a_small_transactions_acks_each_leave_as_they_come() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("[relay]\nack_wakeup_wait = \"1s\"\n")).await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    send_text(&mut client, r#"{"ack":1}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    relay_transaction(&mut conn, &mut client, 2, 1, "0b").await;
    for ack in 2..=4 {
        send_text(&mut client, &format!(r#"{{"ack":{ack}}}"#)).await;
        let left = tokio::time::timeout(Duration::from_millis(500), conn.next_ack()).await;
        assert_eq!(left.ok(), Some(ack), "ack {ack} waited for the next");
    }
    sidecar.stop().await;
}

/// With `relay.ack_wakeup_bytes = 0` each ack leaves as it comes.
#[tokio::test]
async fn with_ack_wakeups_off_each_ack_leaves_as_it_comes() {
    let mut upstream = Upstream::start().await;
    let sidecar =
        start(upstream.config("[relay]\nack_wakeup_bytes = 0\nack_wakeup_wait = \"1s\"\n")).await;
    let path = changes_path(3, "t1", "serving-replicator-1", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    send_text(&mut client, r#"{"ack":1}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    relay_transaction(&mut conn, &mut client, 2, 0, "0b").await;
    send_text(&mut client, r#"{"ack":2}"#).await;
    let ack = tokio::time::timeout(Duration::from_secs(1), conn.next_ack()).await;
    assert_eq!(ack.ok(), Some(2));
    sidecar.stop().await;
}

#[tokio::test]
async fn fragments_pass_as_fragments_and_a_fragmented_commit_still_counts() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "frag", "0a", false);
    let (mut raw, mut conn) =
        tokio::join!(RawClient::connect(sidecar.addr, &path), upstream.accept());
    conn.send_msg(1, UPSTREAM_STATUS).await;
    let frame = format!(r#"{{"msg":{},"id":2}}"#, commit("0b"));
    let (head, tail) = frame.split_at(20);
    let text = OpCode::Data(Data::Text);
    let more = OpCode::Data(Data::Continue);
    conn.ws
        .send(Message::Frame(Frame::message(
            head.as_bytes().to_vec(),
            text,
            false,
        )))
        .await
        .unwrap();
    conn.ws
        .send(Message::Frame(Frame::message(
            tail.as_bytes().to_vec(),
            more,
            true,
        )))
        .await
        .unwrap();
    // The subscriber gets the status, then the two fragments exactly as they were sent.
    assert_eq!(raw.read_frame().await.unwrap().0, 0x1);
    assert_eq!(
        raw.read_frame().await.unwrap(),
        (0x1, head.as_bytes().to_vec())
    );
    assert_eq!(
        raw.read_frame().await.unwrap(),
        (0x0, tail.as_bytes().to_vec())
    );
    raw.write_frame(true, 0x1, br#"{"ack":1}"#).await;
    raw.write_frame(true, 0x1, br#"{"ack":2}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    assert_eq!(conn.next_ack().await, 2);
    assert_eq!(
        sidecar.subscribers.acked_by_id(),
        [("frag".into(), "0b".into())]
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_subscription_without_its_position_is_relayed_but_not_tracked() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let (mut client, mut conn) = open(
        &sidecar,
        &mut upstream,
        "/replication/v3/changes?id=x&replicaVersion=01",
    )
    .await;
    // Zero rejects it, and the subscriber sees Zero's reason.
    assert!(!conn.admit_like_zero().await);
    assert_eq!(
        expect_close(&mut client).await,
        Some((
            1002,
            "Error: invalid querystring - missing watermark".into()
        ))
    );
    assert_eq!(sidecar.subscribers.connected(), 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn zeros_rejections_reach_the_subscriber_as_sent() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let cases = [
        (
            "/replication/v4/changes?id=a&replicaVersion=01&watermark=0a",
            "Error: Cannot service client at protocol v4. Supported protocols: [v1 ... v3]",
        ),
        (
            "/replication/v3/changes?replicaVersion=01&watermark=0a",
            "Error: invalid querystring - missing id",
        ),
        (
            "/replication/v3/changes?id=a&watermark=0a",
            "Error: invalid querystring - missing replicaVersion",
        ),
    ];
    for (path, reason) in cases {
        let (mut client, mut conn) = open(&sidecar, &mut upstream, path).await;
        assert!(!conn.admit_like_zero().await);
        assert_eq!(
            expect_close(&mut client).await,
            Some((1002, reason.to_string())),
            "{path}"
        );
    }

    // A wrong replica version: one error message, its ack, then a close without a code.
    let path = changes_path(3, "t1", "a", "0a", false);
    let (mut client, mut conn) = open(&sidecar, &mut upstream, &path).await;
    let error = conn
        .send_msg(
            1,
            r#"["error",{"type":1,"message":"current replica version is 02 (requested 01)"}]"#,
        )
        .await;
    assert_eq!(next_text(&mut client).await, error);
    send_text(&mut client, r#"{"ack":1}"#).await;
    assert_eq!(conn.next_ack().await, 1);
    conn.close(None, "").await;
    assert_eq!(expect_close(&mut client).await, None);

    // Any code and reason, both ways.
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    conn.close(Some(1011), "Error: internal").await;
    assert_eq!(
        expect_close(&mut client).await,
        Some((1011, "Error: internal".into()))
    );
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    client
        .close(Some(CloseFrame {
            code: close_code(4000),
            reason: "bye".into(),
        }))
        .await
        .unwrap();
    assert_eq!(conn.expect_close().await, Some((4000, "bye".into())));
    // The upstream's answer goes back to the subscriber.
    assert_eq!(expect_close(&mut client).await, Some((4000, "bye".into())));
    sidecar.stop().await;
}

#[tokio::test]
async fn versions_and_paths_no_zero_serves_are_refused_before_the_upgrade() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let cases = [
        (
            "/replication/v0/changes?id=a",
            "Error: Cannot service client at protocol v0. Supported protocols: [v1 ... v6]",
        ),
        (
            "/replication/v7/changes?id=a",
            "Error: Cannot service client at protocol v7. Supported protocols: [v1 ... v6]",
        ),
        (
            "/replication/latest/changes",
            "Error: invalid path: /replication/latest/changes",
        ),
    ];
    for (path, message) in cases {
        assert_eq!(
            refused(&sidecar.url(path)).await,
            (400, message.to_string()),
            "{path}"
        );
    }
    assert_eq!(
        refused(&sidecar.url("/replication/v3/changes/")).await.0,
        404
    );
    assert!(upstream.none_arrives().await);
    sidecar.stop().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_before_the_upgrade() {
    let sidecar = start(config(&format!(
        "\n[upstream]\naddress = \"{}\"\n",
        unused_addr()
    )))
    .await;
    let path = changes_path(3, "t1", "a", "0a", true);
    let (status, body) = refused(&sidecar.url(&path)).await;
    assert_eq!(status, 502);
    assert!(body.contains("upstream"), "{body}");
    sidecar.stop().await;

    // An upstream that accepts TCP but never answers the handshake: refused after the connect timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sidecar = start(config(&format!(
        "\n[upstream]\naddress = \"{}\"\nconnect_timeout = \"200ms\"\n",
        silent.local_addr().unwrap()
    )))
    .await;
    let (status, body) = refused(&sidecar.url(&path)).await;
    assert_eq!(status, 502);
    assert!(body.contains("did not complete"), "{body}");
    sidecar.stop().await;
}

#[tokio::test]
async fn an_upstream_refusing_the_upgrade_is_a_502() {
    let upstream = Upstream::refusing(404).await;
    let sidecar = start(upstream.config("")).await;
    let (status, body) = refused(&sidecar.url(&changes_path(3, "t1", "a", "0a", true))).await;
    assert_eq!(status, 502);
    assert!(body.contains("HTTP 404"), "{body}");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_vanishing_subscriber_closes_its_upstream_and_departs() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let mut raw = RawClient::connect(sidecar.addr, &path).await;
    let mut conn = upstream.accept().await;
    conn.send_msg(1, UPSTREAM_STATUS).await;
    raw.read_frame().await.unwrap();
    eventually("registered", || sidecar.subscribers.connected() == 1).await;

    drop(raw);
    assert_eq!(
        conn.expect_close().await,
        Some((1001, "subscriber gone".into()))
    );
    eventually("departed", || sidecar.subscribers.connected() == 0).await;
    assert!(sidecar
        .subscribers
        .for_policy(tokio::time::Instant::now(), Duration::from_secs(60))[0]
        .departed
        .is_some());
    sidecar.stop().await;
}

#[tokio::test]
async fn a_lost_upstream_is_reported_to_the_subscriber() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let (mut client, conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    drop(conn);
    assert_eq!(
        expect_close(&mut client).await,
        Some((1011, "Error: upstream connection lost".into()))
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn each_hop_keeps_its_own_liveness() {
    let mut upstream = Upstream::start().await;
    let sidecar =
        start(upstream.config("[server]\nping_interval = \"100ms\"\npeer_timeout = \"400ms\"\n"))
            .await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let (mut client, mut conn, _) = subscribe(&sidecar, &mut upstream, &path).await;

    // The sidecar pings the subscriber itself.
    let mut pings = 0;
    while pings < 3 {
        match tokio::time::timeout(Duration::from_secs(5), client.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => pings += 1,
            other => panic!("expected pings, got {other:?}"),
        }
    }
    // Upstream pings are answered by the sidecar, not passed on; the subscriber's pings likewise.
    conn.ws
        .send(Message::Ping(b"up".to_vec().into()))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), conn.ws.next()).await {
        Ok(Some(Ok(Message::Pong(payload)))) => assert_eq!(&payload[..], b"up"),
        other => panic!("expected a pong upstream, got {other:?}"),
    }
    client
        .send(Message::Ping(b"down".to_vec().into()))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), client.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => continue,
            Ok(Some(Ok(Message::Pong(payload)))) => {
                assert_eq!(&payload[..], b"down");
                break;
            }
            other => panic!("expected a pong, got {other:?}"),
        }
    }
    let marker = conn.send_msg(2, UPSTREAM_STATUS).await;
    assert_eq!(next_text(&mut client).await, marker);
    // The upstream saw neither ping nor pong of the subscriber's hop.
    send_text(&mut client, r#"{"ack":1}"#).await;
    match tokio::time::timeout(Duration::from_secs(5), conn.ws.next()).await {
        Ok(Some(Ok(Message::Text(text)))) => assert_eq!(text.as_str(), r#"{"ack":1}"#),
        other => panic!("expected only the ack upstream, got {other:?}"),
    }

    // A subscriber that never answers pings is dropped, and its upstream closed.
    let mut silent = RawClient::connect(sidecar.addr, &path).await;
    let mut silent_conn = upstream.accept().await;
    silent_conn.send_msg(1, UPSTREAM_STATUS).await;
    assert!(
        silent.is_dropped().await,
        "an unresponsive subscriber was kept"
    );
    assert_eq!(
        silent_conn.expect_close().await,
        Some((1001, "subscriber unresponsive".into()))
    );
    sidecar.stop().await;
}

/// The subscriber's side gets the same leniency as a reservation: dropped once nothing arrived from it for
/// `server.peer_timeout`, not at the first unanswered ping.
#[tokio::test]
async fn a_subscriber_outlives_unanswered_pings_until_the_peer_timeout() {
    let mut upstream = Upstream::start().await;
    let sidecar =
        start(upstream.config("[server]\nping_interval = \"1s\"\npeer_timeout = \"6s\"\n")).await;
    let path = changes_path(3, "t1", "silent", "0a", false);
    let opened = Instant::now();
    let mut silent = RawClient::connect(sidecar.addr, &path).await;
    let mut conn = upstream.accept().await;
    let status = conn.send_msg(1, UPSTREAM_STATUS).await;
    assert_eq!(silent.read_frame().await, Some((0x1, status.into_bytes())));
    for _ in 0..2 {
        assert_eq!(silent.read_frame().await, Some((0x9, Vec::new())));
    }
    tokio::time::sleep_until(opened + Duration::from_millis(2500)).await;
    assert_eq!(
        sidecar.subscribers.connected(),
        1,
        "dropped at a missed pong"
    );
    // Still relayed both ways.
    let marker = conn.send_msg(2, DATA).await;
    loop {
        match silent.read_frame().await {
            Some((0x9, _)) => continue,
            Some((0x1, text)) => {
                assert_eq!(text, marker.as_bytes());
                break;
            }
            other => panic!("expected the marker, got {other:?}"),
        }
    }
    // Six seconds without a pong: dropped, and its upstream closed, never sooner.
    assert!(
        silent.is_dropped().await,
        "an unresponsive subscriber was kept"
    );
    assert_eq!(
        conn.expect_close().await,
        Some((1001, "subscriber unresponsive".into()))
    );
    assert!(
        opened.elapsed() >= Duration::from_secs(6),
        "dropped after {:?}",
        opened.elapsed()
    );
    eventually("departed", || sidecar.subscribers.connected() == 0).await;
    sidecar.stop().await;
}

/// A subscriber that stops reading while the upstream streams to it: once bytes have waited
/// `relay.write_stall_timeout` without one written, its subscription ends by its own rule (not liveness: the pings
/// wait behind the data), the upstream is closed normally, and the stall is counted; others are served as before.
#[tokio::test]
async fn a_subscriber_that_stops_reading_is_ended_after_the_write_stall_timeout() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let mut upstream = Upstream::start().await;
    let sidecar = start(
        upstream
            .config("[server]\nping_interval = \"250ms\"\n[relay]\nwrite_stall_timeout = \"2s\"\n"),
    )
    .await;
    let (mut bystander, mut bystander_conn, _) = subscribe(
        &sidecar,
        &mut upstream,
        &changes_path(3, "t1", "bystander", "0a", false),
    )
    .await;

    // A subscriber that reads the status, then nothing.
    let path = changes_path(3, "t2", "stuck-replicator", "0a", false);
    let mut stuck = RawClient::connect(sidecar.addr, &path).await;
    let conn = upstream.accept().await;
    assert_eq!(conn.param("id").as_deref(), Some("stuck-replicator"));
    let (mut sink, mut stream) = conn.ws.split();
    sink.send(Message::Text(
        r#"{"msg":["status",{"tag":"status"}],"id":1}"#.into(),
    ))
    .await
    .unwrap();
    assert_eq!(stuck.read_frame().await.map(|f| f.0), Some(0x1));
    eventually("registered", || sidecar.subscribers.connected() == 2).await;

    // The upstream streams 64 KiB messages as fast as the relay takes them, far more than socket buffers hold,
    // until its connection fails; its reading half sees what the sidecar sends.
    const ATTEMPT: u64 = 512 << 20;
    let progress = Arc::new(std::sync::Mutex::new((0u64, Instant::now())));
    let pusher = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let filler = "z".repeat(64 << 10);
            let mut id = 2u64;
            loop {
                let frame = format!(r#"{{"msg":["data",{{"s":"{filler}"}}],"id":{id}}}"#);
                let len = frame.len() as u64;
                if sink.send(Message::Text(frame.into())).await.is_err() {
                    return;
                }
                let mut progress = progress.lock().unwrap();
                progress.0 += len;
                progress.1 = Instant::now();
                if progress.0 >= ATTEMPT {
                    return;
                }
                id += 1;
            }
        })
    };
    // The sidecar sends nothing else upstream: its close is the first frame there.
    let close = match tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the stalled subscription was not ended within 30s")
    {
        Some(Ok(Message::Close(frame))) => frame,
        Some(Ok(other)) => panic!("unexpected frame upstream: {other:?}"),
        Some(Err(err)) => panic!("upstream connection failed before a close: {err}"),
        None => panic!("upstream connection ended without a close"),
    };
    let ended_at = Instant::now();
    let (sent, last_sent) = *progress.lock().unwrap();
    assert!(sent < ATTEMPT, "the relay took everything: nothing stalled");
    assert!(
        sent > 4 << 20,
        "only {sent} bytes went out before the stall"
    );
    let close = close.expect("a close with a code");
    assert_eq!(
        (close.code, close.reason.as_str()),
        (CloseCode::Away, "subscriber stopped reading")
    );
    // Not before the stall timeout: the upstream's last write went out at most moments after the relay's last
    // write to the subscriber (socket buffers filling), and the rule waits two seconds from there.
    assert!(
        ended_at - last_sent >= Duration::from_secs(1),
        "ended {:?} after the upstream's last write",
        ended_at - last_sent
    );
    // The subscriber is dropped without a close (none could reach it): it reads what was queued, then the end.
    assert!(stuck.is_dropped().await, "the stalled subscriber was kept");
    eventually("departed", || sidecar.subscribers.connected() == 1).await;
    pusher.await.unwrap();
    let (_, metrics) = http(sidecar.addr, "GET", "/metrics").await;
    assert!(
        metrics.contains("litestream_sidecar_relay_write_stalls_total 1\n"),
        "{metrics}"
    );

    // The other subscription, and new ones, are served as before.
    let marker = bystander_conn.send_msg(2, DATA).await;
    assert_eq!(next_text(&mut bystander).await, marker);
    let (mut late, _late_conn, _) = subscribe(
        &sidecar,
        &mut upstream,
        &changes_path(3, "t3", "late", "0a", false),
    )
    .await;
    send_text(&mut late, r#"{"ack":1}"#).await;
    sidecar.stop().await;
}

#[tokio::test]
async fn a_silent_upstream_is_dropped() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(config(&format!(
        "\n[upstream]\naddress = \"{}\"\nsilence_timeout = \"200ms\"\n",
        upstream.addr
    )))
    .await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let (mut client, _conn) = open(&sidecar, &mut upstream, &path).await;
    assert_eq!(
        expect_close(&mut client).await,
        Some((1011, "Error: upstream silent".into()))
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn bad_frames_from_a_subscriber_close_only_its_own_relay() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "a", "0a", false);
    let (mut bystander, mut bystander_conn, _) = subscribe(&sidecar, &mut upstream, &path).await;

    let mut too_big = vec![0x81u8, 0x80 | 127];
    too_big.extend_from_slice(&((128u64 << 20) + 1).to_be_bytes());
    too_big.extend_from_slice(&[0, 0, 0, 0]);
    for (frame, code) in [
        // Unmasked, a reserved opcode, a ping too long to be one, more than server.max_message_bytes.
        (&[0x81u8, 0x02, b'{', b'}'][..], 1002),
        (&[0x83u8, 0x80, 0, 0, 0, 0][..], 1002),
        (&[0x89u8, 0x80 | 126, 0, 200, 0, 0, 0, 0][..], 1002),
        (&too_big[..], 1009),
    ] {
        let mut raw = RawClient::connect(sidecar.addr, &path).await;
        let mut conn = upstream.accept().await;
        conn.send_msg(1, UPSTREAM_STATUS).await;
        raw.read_frame().await.unwrap();
        use tokio::io::AsyncWriteExt;
        raw.stream.write_all(frame).await.unwrap();
        assert_eq!(raw.read_close().await.unwrap().0, code);
        assert_eq!(
            conn.expect_close().await,
            Some((1001, "subscriber gone".into()))
        );
    }
    // A fragmented ack is relayed as fragments and still counted.
    let mut raw = RawClient::connect(sidecar.addr, &path).await;
    let mut conn = upstream.accept().await;
    conn.send_msg(1, UPSTREAM_STATUS).await;
    raw.read_frame().await.unwrap();
    raw.write_frame(false, 0x1, b"{\"ack\"").await;
    raw.write_frame(true, 0x0, b":1}").await;
    assert_eq!(conn.next_ack().await, 1);

    let marker = bystander_conn.send_msg(2, DATA).await;
    assert_eq!(next_text(&mut bystander).await, marker);
    sidecar.stop().await;
}

#[tokio::test]
async fn shutdown_closes_subscribers_with_1001_and_their_upstreams() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let mut pairs = Vec::new();
    for i in 0..3 {
        let path = changes_path(3, &format!("t{i}"), &format!("s{i}"), "0a", false);
        pairs.push(subscribe(&sidecar, &mut upstream, &path).await);
    }
    sidecar.begin_shutdown();
    for (client, conn, _) in &mut pairs {
        assert_eq!(
            expect_close(client).await,
            Some((1001, "sidecar shutting down".into()))
        );
        assert_eq!(
            conn.expect_close().await,
            Some((1001, "sidecar shutting down".into()))
        );
    }
    let subscribers = sidecar.subscribers.clone();
    sidecar.stop().await;
    assert_eq!(subscribers.connected(), 0);
}

#[tokio::test]
async fn a_slow_subscriber_holds_back_only_its_own_upstream() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "slow", "0a", false);
    let (mut slow, conn, _) = subscribe(&sidecar, &mut upstream, &path).await;
    let (mut bystander, mut bystander_conn, _) = subscribe(&sidecar, &mut upstream, &path).await;

    // The upstream pushes 1 KiB messages as fast as the relay takes them; the subscriber reads nothing.
    const FRAME: usize = 1024;
    const ATTEMPT: u64 = 256 << 20;
    let sent = Arc::new(AtomicU64::new(0));
    let pusher = {
        let sent = sent.clone();
        let mut ws = conn.ws;
        tokio::spawn(async move {
            let filler = "y".repeat(FRAME - 40);
            let mut id = 2u64;
            while sent.load(Ordering::Relaxed) < ATTEMPT {
                let frame = format!(r#"{{"msg":["data",{{"s":"{filler}"}}],"id":{id}}}"#);
                let len = frame.len() as u64;
                if ws.send(Message::Text(frame.into())).await.is_err() {
                    return ws;
                }
                sent.fetch_add(len, Ordering::Relaxed);
                id += 1;
            }
            ws
        })
    };
    // Wait until the upstream's writes stall.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = sent.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        assert!(now < ATTEMPT, "the relay buffered everything");
        last = now;
    }
    // Socket buffers on three sockets and the relay's own bounded queue: far below what was offered.
    assert!(
        last < 64 << 20,
        "{} MiB went out before the upstream was held back",
        last >> 20
    );
    // Another subscription on the same sidecar is not slowed.
    let marker = bystander_conn.send_msg(2, DATA).await;
    assert_eq!(next_text(&mut bystander).await, marker);

    // Once the subscriber reads, everything arrives in order and the upstream moves again.
    let mut expected_id = 2u64;
    while expected_id < 2 + (last / FRAME as u64) + 100 {
        let text = next_text(&mut slow).await;
        assert!(
            text.ends_with(&format!(",\"id\":{expected_id}}}")),
            "out of order at {expected_id}"
        );
        expected_id += 1;
    }
    assert!(sent.load(Ordering::Relaxed) > last);
    pusher.abort();
    sidecar.stop().await;
}

/// A loopback address nothing listens on.
fn unused_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Zero answers a subscription only once its storer has caught up: a lagging subscriber that reconnects bounds
/// cleanup at its request's watermark from the moment its upstream connection is up, before any frame comes back.
#[tokio::test]
async fn a_subscriber_is_tracked_from_the_handshake_before_the_upstreams_first_frame() {
    let mut upstream = Upstream::start().await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "t1", "serving-replicator-4242", "0b", false);
    let (mut client, mut conn) = open(&sidecar, &mut upstream, &path).await;
    assert!(conn.admit_like_zero().await, "{}", conn.target);
    // The upstream has said nothing yet.
    let tracked = sidecar
        .subscribers
        .for_policy(tokio::time::Instant::now(), Duration::from_secs(60));
    assert_eq!(tracked.len(), 1, "{tracked:?}");
    assert_eq!(tracked[0].id, "serving-replicator-4242");
    assert_eq!(tracked[0].acked, "0b");
    assert!(tracked[0].is_connected());

    conn.send_msg(1, UPSTREAM_STATUS).await;
    next_text(&mut client).await;
    relay_transaction(&mut conn, &mut client, 2, 1, "0c").await;
    send_text(&mut client, r#"{"ack":4}"#).await;
    assert_eq!(conn.next_ack().await, 4);
    eventually("the ack moves it on", || {
        sidecar
            .subscribers
            .for_policy(tokio::time::Instant::now(), Duration::from_secs(60))[0]
            .acked
            == "0c"
    })
    .await;
    sidecar.stop().await;
}
