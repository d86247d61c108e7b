//! Rules e and g: tracked subscribers' acks bound the purge within their reconnect grace, and one at its replica
//! version holds it.

use super::*;

use HoldReason::*;

// Rule e: subscribers.

#[test]
fn without_subscribers_after_grace_purges_once_the_last_one_had_its_grace() {
    let after_grace = |subscribers: Vec<Subscriber>| Case {
        without_subscribers: WithoutSubscribers::AfterGrace,
        subscribers,
        ..ready()
    };
    // Nobody ever relayed: the backup alone vouches for the replication-manager.
    assert_eq!(after_grace(vec![]).decide(), purge("0a"));
    // One left 5 s ago (grace 30 s): it may come back from its ack.
    assert_eq!(
        after_grace(vec![departed("0a", 5)]).decide(),
        Decision::Hold(NoSubscribers)
    );
    // Gone for longer than the grace: forgotten.
    assert_eq!(after_grace(vec![departed("09", 31)]).decide(), purge("0a"));
    // A sidecar up for less than the grace waits for the subscribers of its previous run: its start-up wait
    // covers the grace.
    let young = Case {
        started: NOW - 29,
        delay: 20,
        backups: vec![backup("0a", 120)],
        ..after_grace(vec![])
    };
    assert_eq!(young.decide(), Decision::Hold(StartingUp));
    assert_eq!(
        Case {
            started: NOW - 30,
            ..young
        }
        .decide(),
        purge("0a")
    );
    // Connected subscribers still bound the purge as always.
    let behind = Case {
        backups: vec![backup("0a", 300), backup("0c", 200)],
        ..after_grace(vec![sub("0b")])
    };
    assert_eq!(behind.decide(), purge_at_ack("0a", "0b"));
}

#[test]
fn no_connected_subscriber_holds_even_with_a_departed_one_in_its_grace() {
    let none = Case {
        subscribers: vec![],
        ..ready()
    };
    assert_eq!(none.decide(), Decision::Hold(NoSubscribers));
    let only_departed = Case {
        subscribers: vec![departed("0a", 5)],
        ..ready()
    };
    assert_eq!(only_departed.decide(), Decision::Hold(NoSubscribers));
}

#[test]
fn holds_when_a_subscriber_is_behind_every_aged_backup() {
    let d = Case {
        subscribers: vec![sub("0a"), sub("09")],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(SubscriberBehind));
}

#[test]
fn slow_subscriber_lowers_the_purge_to_an_older_backup() {
    let d = Case {
        backups: vec![backup("0a", 300), backup("0c", 200), backup("0e", 100)],
        subscribers: vec![sub("0e"), sub("0d")],
        ..case()
    }
    .decide();
    assert_eq!(d, purge_at_ack("0c", "0d"));
}

#[test]
fn departed_subscriber_within_the_grace_still_bounds_the_purge() {
    let d = Case {
        backups: vec![backup("0a", 300), backup("0c", 200)],
        subscribers: vec![sub("0c"), departed("0b", 29)],
        ..case()
    }
    .decide();
    assert_eq!(d, purge_at_ack("0a", "0b"));
}

#[test]
fn departed_subscriber_outside_the_grace_is_ignored() {
    let d = Case {
        backups: vec![backup("0a", 300), backup("0c", 200)],
        subscribers: vec![sub("0c"), departed("0b", 30)],
        ..case()
    }
    .decide();
    assert_eq!(d, purge("0c"));
}

// Rule g: replica version.

#[test]
fn subscriber_at_its_replica_version_holds_even_where_acks_allow() {
    // Purging below RV itself would pass the ack rule; rule g alone holds it.
    let d = Case {
        backups: vec![backup(RV, 120)],
        subscribers: vec![sub("0a"), sub(RV)],
        ..case()
    }
    .decide();
    assert_eq!(d, Decision::Hold(SubscriberAtReplicaVersion));
}

#[test]
fn departed_subscriber_at_replica_version_holds_only_within_the_grace() {
    let within = Case {
        subscribers: vec![sub("0a"), departed(RV, 10)],
        ..ready()
    };
    assert_eq!(within.decide(), Decision::Hold(SubscriberAtReplicaVersion));
    let after = Case {
        subscribers: vec![sub("0a"), departed(RV, 31)],
        ..ready()
    };
    assert_eq!(after.decide(), purge("0a"));
}
