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

/// `relay.ack_wakeup_wait` in these tests, the budget: 500 us.
const WAIT: Duration = Duration::from_micros(500);

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// A subscription whose first message was acked at `t0` and read `pace` later: it follows one ack per message,
/// and its pace is `pace`.
fn confirmed_at(cap: u64, t0: Instant, pace: Duration) -> AckWakeups {
    let mut w = AckWakeups::new(cap, WAIT, 1);
    w.relayed(Some(br#"{"msg":["status"],"id":1}"#), t0);
    w.acked(1);
    w.read(t0 + pace);
    w
}

/// As quick as can be: every read at the same instant.
fn confirmed(cap: u64) -> (AckWakeups, Instant) {
    let t0 = Instant::now();
    (confirmed_at(cap, t0, Duration::ZERO), t0)
}

fn relay(w: &mut AckWakeups, n: u64, now: Instant) {
    for _ in 0..n {
        w.relayed(Some(br#"{"id":2,"msg":["data"]}"#), now);
    }
}

#[test]
fn waits_for_the_acks_in_flight_up_to_the_newest_message() {
    let (mut w, t) = confirmed(1024);
    assert_eq!(w.threshold(0), None, "nothing in flight");
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 6)));
    w.acked(2);
    w.acked(3);
    w.read(t);
    assert_eq!(w.threshold(0), Some(ack_bytes(4, 6)));
    for id in 4..=6 {
        w.acked(id);
    }
    w.read(t);
    assert_eq!(w.threshold(0), None, "all acked");
}

#[test]
fn never_more_acks_than_a_congestion_window_lets_through() {
    let (mut w, t) = confirmed(16 << 10);
    relay(&mut w, 100, t);
    assert_eq!(MAX_ACKS_AWAITED, 8);
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 9)));
    for id in 2..=9 {
        w.acked(id);
    }
    w.read(t);
    assert_eq!(w.threshold(0), Some(ack_bytes(10, 17)));
}

#[test]
fn the_threshold_is_capped() {
    let (mut w, t) = confirmed(100);
    relay(&mut w, 1_000, t);
    assert_eq!(w.threshold(0), Some(100));
}

/// With a budget of 500 us, as many acks are awaited as the subscriber is seen to send within it after the first.
#[test]
fn acks_awaited_follow_the_subscribers_pace() {
    for (pace, awaited) in [
        (us(0), 8),
        (us(50), 8),
        (us(100), 6),
        (us(250), 3),
        (us(400), 2),
        (us(500), 2),
        (us(501), 1),
        (us(5_000), 1),
    ] {
        let t0 = Instant::now();
        let mut w = confirmed_at(1024, t0, pace);
        relay(&mut w, 20, t0 + pace);
        // One ack awaited is a wake-up for anything: it comes in a segment of its own.
        let expected = if awaited == 1 {
            1
        } else {
            ack_bytes(2, 1 + awaited)
        };
        assert_eq!(w.threshold(0), Some(expected), "{pace:?}: {awaited} acks");
    }
}

#[test]
fn one_ack_at_a_time_until_the_pace_is_known() {
    let t = Instant::now();
    let mut w = AckWakeups::new(1024, WAIT, 1);
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1), "not confirmed");
    w.acked(1);
    assert_eq!(w.threshold(0), Some(1), "confirmed, not measured: one ack");
    w.read(t + us(10));
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 5)));
}

#[test]
fn a_slower_sample_counts_at_once_and_faster_ones_gradually() {
    let t0 = Instant::now();
    let mut w = confirmed_at(1024, t0, us(50));
    relay(&mut w, 1_000, t0 + us(50));
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 9)));
    // One ack took 500 us.
    let mut t = t0 + us(50) + us(500);
    w.acked(2);
    w.read(t);
    assert_eq!(w.threshold(0), Some(ack_bytes(3, 4)), "two acks");
    // Back to 50 us per ack: still slow after one read, all eight again after many.
    let mut id = 2;
    let mut next = |w: &mut AckWakeups| {
        id += 1;
        t += us(50);
        w.acked(id);
        w.read(t);
        id
    };
    let acked = next(&mut w);
    assert_eq!(w.threshold(0), Some(ack_bytes(acked + 1, acked + 2)));
    let mut acked = acked;
    for _ in 0..40 {
        acked = next(&mut w);
    }
    assert_eq!(w.threshold(0), Some(ack_bytes(acked + 1, acked + 8)));
}

#[test]
fn acks_in_one_read_share_its_time() {
    let t0 = Instant::now();
    let mut w = confirmed_at(1024, t0, Duration::ZERO);
    relay(&mut w, 20, t0);
    for id in 2..=6 {
        w.acked(id);
    }
    // Five acks in 500 us: 100 us each.
    w.read(t0 + us(500));
    assert_eq!(w.threshold(0), Some(ack_bytes(7, 12)));
}

#[test]
fn idle_time_is_not_taken_for_work() {
    let t0 = Instant::now();
    let mut w = confirmed_at(1024, t0, us(50));
    // Nothing in flight for 10 ms; then a message, acked 50 us later.
    let t1 = t0 + Duration::from_millis(10);
    relay(&mut w, 1, t1);
    w.acked(2);
    w.read(t1 + us(50));
    relay(&mut w, 20, t1 + us(50));
    assert_eq!(w.threshold(0), Some(ack_bytes(3, 10)));
}

#[test]
fn a_read_without_acks_leaves_the_measurement_running() {
    let t0 = Instant::now();
    let mut w = confirmed_at(1024, t0, Duration::ZERO);
    relay(&mut w, 20, t0);
    // A pong read 100 us in; the next ack 200 us in: 200 us for that ack, so three acks per wait.
    w.pinged();
    w.ponged();
    w.read(t0 + us(100));
    w.acked(2);
    w.read(t0 + us(200));
    assert_eq!(w.threshold(0), Some(ack_bytes(3, 5)));
}

#[test]
fn the_part_of_a_frame_already_read_counts_toward_the_wait() {
    let (mut w, t) = confirmed(1024);
    relay(&mut w, 3, t);
    assert_eq!(w.threshold(7), Some(ack_bytes(2, 4) - 7));
    assert_eq!(w.threshold(1_000), Some(1));
}

#[test]
fn held_acks_wait_only_for_a_read_due_within_the_budget() {
    let t0 = Instant::now();
    let unmeasured = AckWakeups::new(0, WAIT, 1);
    assert!(!unmeasured.may_hold(t0, t0), "pace unknown");

    // 100 us per ack, woken for each (ack_wakeup_bytes = 0): the next read is due 100 us after the last.
    let mut w = AckWakeups::new(0, WAIT, 1);
    w.relayed(Some(br#"{"id":1,"msg":["status"]}"#), t0);
    w.acked(1);
    w.read(t0 + us(100));
    relay(&mut w, 10, t0 + us(100));
    let held = t0 + us(100);
    assert!(w.may_hold(held, held));
    assert!(w.may_hold(held, held + us(400)));
    assert!(!w.may_hold(held, held + us(401)));

    // Woken for six acks at a time (100 us each): the next read is due 600 us later, beyond the budget.
    let mut w = confirmed_at(1024, t0, us(100));
    relay(&mut w, 10, t0 + us(100));
    assert!(!w.may_hold(t0 + us(100), t0 + us(100)));
    // Two in flight: due in 200 us.
    let mut w = confirmed_at(1024, t0, us(100));
    relay(&mut w, 2, t0 + us(100));
    assert!(w.may_hold(t0 + us(100), t0 + us(400)));
    assert!(!w.may_hold(t0 + us(100), t0 + us(401)));
}

#[test]
fn nothing_is_awaited_until_the_first_ack_shows_one_ack_per_message() {
    let t = Instant::now();
    let mut w = AckWakeups::new(1024, WAIT, 1);
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1));
    w.acked(1);
    w.read(t);
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 5)));
}

#[test]
fn off_is_off() {
    let t = Instant::now();
    let mut w = AckWakeups::new(0, WAIT, 1);
    relay(&mut w, 5, t);
    w.acked(1);
    w.read(t);
    assert_eq!(w.threshold(0), Some(1));
}

#[test]
fn a_skipped_or_repeated_ack_turns_it_off_for_good() {
    let t = Instant::now();
    for acks in [&[1, 3][..], &[1, 2, 2], &[2]] {
        let mut w = AckWakeups::new(1024, WAIT, 1);
        relay(&mut w, 10, t);
        for &id in acks {
            w.acked(id);
        }
        w.read(t);
        relay(&mut w, 10, t);
        for id in acks.last().unwrap() + 1..=5 {
            w.acked(id);
        }
        w.read(t);
        assert_eq!(w.threshold(0), Some(1), "{acks:?}");
    }
}

#[test]
fn an_ack_of_a_message_not_yet_relayed_turns_it_off() {
    let (mut w, t) = confirmed(1024);
    w.acked(2);
    w.read(t);
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1));
}

#[test]
fn other_frames_and_other_streams_turn_it_off_for_good() {
    let (mut w, t) = confirmed(1024);
    w.not_an_ack();
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1));

    let mut w = AckWakeups::new(1024, WAIT, 1);
    w.relayed(
        Some(br#"{"control":"stream-options","capabilities":["cumulative-ack-v1"]}"#),
        t,
    );
    w.relayed(Some(br#"{"id":1,"msg":["status"]}"#), t);
    w.acked(1);
    w.read(t);
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1));

    let (mut w, t) = confirmed(1024);
    w.relayed(None, t);
    relay(&mut w, 5, t);
    assert_eq!(w.threshold(0), Some(1));
}

#[test]
fn a_pending_pong_and_the_wait_limit_each_lower_it() {
    let (mut w, t) = confirmed(1024);
    relay(&mut w, 5, t);
    let raised = w.threshold(0);
    assert!(raised > Some(1));

    w.pinged();
    assert_eq!(w.threshold(0), Some(1));
    w.ponged();
    assert_eq!(w.threshold(0), raised);

    w.waited_too_long();
    assert_eq!(w.threshold(0), Some(1));
    w.read(t);
    assert_eq!(w.threshold(0), raised);

    // A pong owed is awaited with nothing in flight too.
    for id in 2..=6 {
        w.acked(id);
    }
    w.read(t);
    assert_eq!(w.threshold(0), None);
    w.pinged();
    assert_eq!(w.threshold(0), Some(1));
}

/// Below the backlog each ack is read as it comes (no mark, no limit to arm); from it on, the acks in flight are
/// awaited together as before, and it falls back as they are read.
#[test]
fn a_few_messages_in_flight_wake_for_each_ack() {
    let t = Instant::now();
    let mut w = AckWakeups::new(1024, WAIT, 8);
    w.relayed(Some(br#"{"id":1,"msg":["status"]}"#), t);
    w.acked(1);
    w.read(t);
    relay(&mut w, 7, t);
    assert_eq!(
        w.threshold(0),
        Some(1),
        "7 in flight, below the backlog of 8"
    );
    relay(&mut w, 1, t);
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 9)), "8 in flight");
    w.acked(2);
    w.read(t);
    assert_eq!(w.threshold(0), Some(1), "7 in flight again");
    // A backlog of 0 is taken as 1: whatever is in flight is awaited.
    let mut w = AckWakeups::new(1024, WAIT, 0);
    w.relayed(Some(br#"{"id":1,"msg":["status"]}"#), t);
    w.acked(1);
    w.read(t);
    relay(&mut w, 2, t);
    assert_eq!(w.threshold(0), Some(ack_bytes(2, 3)));
}
