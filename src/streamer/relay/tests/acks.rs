//! Following a subscriber's acknowledged commits: the merge that bounds what is remembered, and the watermark the
//! acks advance.

use std::collections::VecDeque;

use super::super::acks::merge_half;
use super::*;
use crate::cleanup::subscribers::{SubscriberInfo, Subscribers};

#[test]
fn merging_keeps_the_newest_commit() {
    let mut pending: VecDeque<(u64, String)> = (1..=5).map(|i| (i, format!("0{i}"))).collect();
    merge_half(&mut pending);
    assert_eq!(
        pending.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [1, 3, 5]
    );
    let mut pending: VecDeque<(u64, String)> = (1..=4).map(|i| (i, format!("0{i}"))).collect();
    merge_half(&mut pending);
    assert_eq!(
        pending.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [2, 4]
    );
}

#[test]
fn acks_advance_to_the_newest_acknowledged_commit() {
    let subscribers = Subscribers::default();
    let handle = subscribers.connect(SubscriberInfo {
        id: "s".into(),
        task_id: None,
        mode: protocol::Mode::Serving,
        replica_version: "01".into(),
        watermark: "0a".into(),
    });
    let mut acks = AckTracker::new(handle, 4);
    // status 1, begin 2, data 3, commit 4 (0b), begin 5, commit 6 (0c)
    acks.sent_commit(4, "0b".into(), Instant::now());
    acks.sent_commit(6, "0c".into(), Instant::now());
    for id in 1..=3 {
        acks.acked(id);
    }
    assert_eq!(subscribers.acked_by_id(), [("s".into(), "0a".into())]);
    acks.acked(4);
    assert_eq!(subscribers.acked_by_id(), [("s".into(), "0b".into())]);
    acks.acked(5);
    assert_eq!(subscribers.acked_by_id(), [("s".into(), "0b".into())]);
    acks.acked(6);
    assert_eq!(subscribers.acked_by_id(), [("s".into(), "0c".into())]);

    // Past the limit, pending commits are merged: acks still advance, never past what was acknowledged.
    for i in 0..10u64 {
        acks.sent_commit(10 + i, format!("1{i}"), Instant::now());
    }
    assert!(acks.pending.len() <= 4);
    acks.acked(14);
    let acked = subscribers.acked_by_id()[0].1.clone();
    assert!(acked.as_str() <= "14" && acked.as_str() >= "0c", "{acked}");
    acks.acked(19);
    assert_eq!(subscribers.acked_by_id(), [("s".into(), "19".into())]);
}
