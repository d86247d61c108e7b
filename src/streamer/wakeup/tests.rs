use super::*;

/// The acks Zero's client writes: `JSON.stringify({ack: id})`, masked.
fn zero_ack_len(id: u64) -> u64 {
    6 + format!(r#"{{"ack":{id}}}"#).len() as u64
}

#[test]
fn ack_lengths_are_those_of_zeros_acks() {
    for id in [1, 9, 10, 99, 100, 12_345, u64::MAX] {
        assert_eq!(ack_frame_len(id), zero_ack_len(id), "{id}");
    }
    let sum = |a: u64, b: u64| (a..=b).map(zero_ack_len).sum::<u64>();
    for (first, last) in [(1, 1), (1, 9), (5, 15), (8, 1_234), (99_990, 100_010)] {
        assert_eq!(ack_bytes(first, last), sum(first, last), "{first}..={last}");
    }
    assert_eq!(ack_bytes(3, 2), 0);
    assert_eq!(
        ack_bytes(u64::MAX - 1, u64::MAX),
        2 * ack_frame_len(u64::MAX)
    );
}

#[test]
fn single_messages_are_zeros_two_framings() {
    assert!(is_single_message(br#"{"msg":["status",{}],"id":1}"#));
    assert!(is_single_message(br#"{"id":1,"msg":["status",{}]}"#));
    assert!(!is_single_message(
        br#"{"control":"stream-options","capabilities":["cumulative-ack-v1"]}"#
    ));
    assert!(!is_single_message(br#"{"batch":[{"id":1,"msg":[]}]}"#));
    assert!(!is_single_message(br#"{ "id":1}"#));
}

fn confirmed(cap: u64) -> AckWakeups {
    let mut w = AckWakeups::new(cap);
    w.relayed(Some(br#"{"msg":["status"],"id":1}"#));
    w.acked(1);
    w
}

fn relay(w: &mut AckWakeups, n: u64) {
    for _ in 0..n {
        w.relayed(Some(br#"{"id":2,"msg":["data"]}"#));
    }
}

#[test]
fn waits_for_the_acks_of_everything_in_flight() {
    let mut w = confirmed(1024);
    assert_eq!(w.threshold(), None, "nothing in flight");
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(ack_bytes(2, 6)));
    w.acked(2);
    w.acked(3);
    assert_eq!(w.threshold(), Some(ack_bytes(4, 6)));
    for id in 4..=6 {
        w.acked(id);
    }
    assert_eq!(w.threshold(), None, "all acked");
}

#[test]
fn the_threshold_is_capped() {
    let mut w = confirmed(100);
    relay(&mut w, 1_000);
    assert_eq!(w.threshold(), Some(100));
}

#[test]
fn nothing_is_awaited_until_the_first_ack_shows_one_ack_per_message() {
    let mut w = AckWakeups::new(1024);
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(1));
    w.acked(1);
    assert_eq!(w.threshold(), Some(ack_bytes(2, 5)));
}

#[test]
fn off_is_off() {
    let mut w = AckWakeups::new(0);
    relay(&mut w, 5);
    w.acked(1);
    assert_eq!(w.threshold(), Some(1));
}

#[test]
fn a_skipped_or_repeated_ack_turns_it_off_for_good() {
    for acks in [&[1, 3][..], &[1, 2, 2], &[2]] {
        let mut w = AckWakeups::new(1024);
        relay(&mut w, 10);
        for &id in acks {
            w.acked(id);
        }
        relay(&mut w, 10);
        for id in acks.last().unwrap() + 1..=5 {
            w.acked(id);
        }
        assert_eq!(w.threshold(), Some(1), "{acks:?}");
    }
}

#[test]
fn an_ack_of_a_message_not_yet_relayed_turns_it_off() {
    let mut w = confirmed(1024);
    w.acked(2);
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(1));
}

#[test]
fn other_frames_and_other_streams_turn_it_off_for_good() {
    let mut w = confirmed(1024);
    w.not_an_ack();
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(1));

    let mut w = AckWakeups::new(1024);
    w.relayed(Some(
        br#"{"control":"stream-options","capabilities":["cumulative-ack-v1"]}"#,
    ));
    w.relayed(Some(br#"{"id":1,"msg":["status"]}"#));
    w.acked(1);
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(1));

    let mut w = confirmed(1024);
    w.relayed(None);
    relay(&mut w, 5);
    assert_eq!(w.threshold(), Some(1));
}

#[test]
fn a_pending_pong_and_the_wait_limit_each_lower_it() {
    let mut w = confirmed(1024);
    relay(&mut w, 5);
    let raised = w.threshold();
    assert!(raised > Some(1));

    w.pinged();
    assert_eq!(w.threshold(), Some(1));
    w.ponged();
    assert_eq!(w.threshold(), raised);

    w.waited_too_long();
    assert_eq!(w.threshold(), Some(1));
    w.read();
    assert_eq!(w.threshold(), raised);

    // A pong owed is awaited with nothing in flight too.
    for id in 2..=6 {
        w.acked(id);
    }
    assert_eq!(w.threshold(), None);
    w.pinged();
    assert_eq!(w.threshold(), Some(1));
}
