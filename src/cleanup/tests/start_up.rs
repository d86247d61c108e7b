//! Registration and rule d: nothing is purged until the sidecar has been registered, and up, for long enough.

use super::*;

use HoldReason::*;

// Ownership: only for the change-streamer the sidecar fronts, and only once its subscribers had time to arrive.

#[test]
fn holds_unless_registered_for_the_grace_plus_the_delay() {
    let not = Case {
        ownership: Ownership::NotRegistered,
        ..ready()
    };
    assert_eq!(not.decide(), Decision::Hold(NotRegistered));
    // 30 s grace + 60 s delay.
    let recent = Case {
        ownership: Ownership::RegisteredSince(at(NOW - 89)),
        ..ready()
    };
    assert_eq!(recent.decide(), Decision::Hold(RecentlyRegistered));
    let long_enough = Case {
        ownership: Ownership::RegisteredSince(at(NOW - 90)),
        ..ready()
    };
    assert_eq!(long_enough.decide(), purge("0a"));
    assert_eq!(
        Case {
            ownership: Ownership::Unchecked,
            ..ready()
        }
        .decide(),
        purge("0a")
    );
}

#[test]
fn registration_comes_before_every_other_reason() {
    for (ownership, reason) in [
        (Ownership::NotRegistered, NotRegistered),
        (Ownership::RegisteredSince(at(NOW)), RecentlyRegistered),
    ] {
        let d = Case {
            started: NOW,
            ownership,
            ..case()
        }
        .decide();
        assert_eq!(d, Decision::Hold(reason));
    }
}

// Rule d: uptime.

#[test]
fn a_reconnect_grace_longer_than_the_delay_lengthens_the_start_up_wait() {
    let young = Case {
        started: NOW - 89,
        grace: 90,
        ..ready()
    };
    assert_eq!(young.decide(), Decision::Hold(StartingUp));
    assert_ne!(
        Case {
            started: NOW - 90,
            ..young
        }
        .decide(),
        Decision::Hold(StartingUp)
    );
}

#[test]
fn holds_until_uptime_reaches_the_cleanup_delay() {
    let young = Case {
        started: NOW - 59,
        ..ready()
    };
    assert_eq!(young.decide(), Decision::Hold(StartingUp));
    let old_enough = Case {
        started: NOW - 60,
        ..ready()
    };
    assert_eq!(old_enough.decide(), purge("0a"));
}

#[test]
fn starting_up_comes_before_every_other_reason() {
    let d = Case {
        started: NOW,
        ..case()
    }
    .decide();
    assert_eq!(d, Decision::Hold(StartingUp));
}
