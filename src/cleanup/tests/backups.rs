//! Rules a and f: which backup a purge may go below, by its age, by progress since the last purge, by byte-wise
//! order, and not while the gauge is below its old high.

use super::*;

use HoldReason::*;

#[test]
fn ready_case_purges_below_the_backup() {
    assert_eq!(ready().decide(), purge("0a"));
}

// Rule a: backup age.

#[test]
fn no_backup_holds() {
    let d = Case {
        subscribers: vec![sub("0a")],
        ..case()
    }
    .decide();
    assert_eq!(d, Decision::Hold(NoBackup));
}

// The gauge going backwards.

#[test]
fn a_gauge_below_its_old_high_holds_even_an_otherwise_ready_purge() {
    // Everything else allows a purge below 0c.
    let ready = Case {
        backups: vec![backup("0a", 300), backup("0c", 120)],
        subscribers: vec![sub("0d")],
        ..case()
    };
    assert_eq!(ready.decide(), purge("0c"));
    let regressed = Case {
        gauge: Some(("0c", "0b")),
        ..ready
    };
    assert_eq!(regressed.decide(), Decision::Hold(BackupRegressed));
    // Back at the old high: nothing holds it any more.
    let back = Case {
        gauge: Some(("0c", "0c")),
        ..regressed
    };
    assert_eq!(back.decide(), purge("0c"));
    // Byte-wise, like every comparison: "110" (36) is above "0z" (35).
    let longer = Case {
        gauge: Some(("0z", "110")),
        ..back
    };
    assert_eq!(longer.decide(), purge("0c"));
}

#[test]
fn a_regression_is_checked_after_reservations_and_before_no_backup() {
    // Nothing tracked (the regression dropped it all): the regression is what is reported.
    let empty = Case {
        gauge: Some(("0c", "0b")),
        subscribers: vec![sub("0d")],
        ..case()
    };
    assert_eq!(empty.decide(), Decision::Hold(BackupRegressed));
    let floorless = Case {
        reservations: vec![reservation("t1", None)],
        ..empty
    };
    assert_eq!(floorless.decide(), Decision::Hold(ReservationWithoutFloor));
    let young = Case {
        started: NOW - 10,
        reservations: vec![],
        ..floorless
    };
    assert_eq!(young.decide(), Decision::Hold(StartingUp));
    // Reasons after it in the order do not hide it.
    let without_subscribers = Case {
        started: 0,
        backups: vec![backup("0a", 10)],
        subscribers: vec![],
        ..young
    };
    assert_eq!(
        without_subscribers.decide(),
        Decision::Hold(BackupRegressed)
    );
}

#[test]
fn backup_younger_than_the_delay_is_not_a_candidate() {
    let d = Case {
        backups: vec![backup("0a", 59)],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(BackupTooRecent));
    let exactly = Case {
        backups: vec![backup("0a", 60)],
        ..ready()
    };
    assert_eq!(exactly.decide(), purge("0a"));
}

#[test]
fn newest_aged_backup_wins_over_a_newer_young_one() {
    let d = Case {
        backups: vec![backup("0a", 120), backup("0b", 10)],
        subscribers: vec![sub("0b")],
        ..case()
    }
    .decide();
    assert_eq!(d, purge("0a"));
}

#[test]
fn backup_time_in_the_future_is_not_aged() {
    let d = Case {
        backups: vec![Backup {
            watermark: wm("0a"),
            backed_up_at: wall(NOW + 3600),
        }],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(BackupTooRecent));
}

// Rule f: progress.

#[test]
fn holds_when_nothing_new_was_backed_up_since_the_last_purge() {
    let d = Case {
        last_purged: Some(wm("0a")),
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(NothingNew));
}

#[test]
fn purges_a_backup_newer_than_the_last_purge() {
    let d = Case {
        backups: vec![backup("0a", 300), backup("0b", 200)],
        subscribers: vec![sub("0b")],
        last_purged: Some(wm("0a")),
        ..case()
    }
    .decide();
    assert_eq!(d, purge("0b"));
}

#[test]
fn an_already_purged_backup_does_not_hide_the_real_obstacle() {
    // "0a" was purged last time and is still tracked; it must not turn the reason into NothingNew.
    let too_recent = Case {
        backups: vec![backup("0a", 300), backup("0b", 10)],
        subscribers: vec![sub("0b")],
        last_purged: Some(wm("0a")),
        ..case()
    };
    assert_eq!(too_recent.decide(), Decision::Hold(BackupTooRecent));
    let behind = Case {
        backups: vec![backup("0a", 300), backup("0b", 200)],
        subscribers: vec![sub("0a")],
        last_purged: Some(wm("0a")),
        ..case()
    };
    assert_eq!(behind.decide(), Decision::Hold(SubscriberBehind));
    let above_floor = Case {
        backups: vec![backup("0a", 300), backup("0b", 200)],
        subscribers: vec![sub("0b")],
        reservations: vec![reservation("t1", Some("0a"))],
        last_purged: Some(wm("0a")),
        ..case()
    };
    assert_eq!(above_floor.decide(), Decision::Hold(ReservationFloor));
}

// Watermark ordering.

#[test]
fn watermarks_compare_byte_wise_across_lengths() {
    // "0z" (35) < "110" (36): byte-wise order is numeric order for lexi-versions.
    let d = Case {
        backups: vec![backup("110", 100), backup("0z", 200)],
        subscribers: vec![sub("0z")],
        ..case()
    }
    .decide();
    assert_eq!(d, purge_at_ack("0z", "0z"));
    let caught_up = Case {
        backups: vec![backup("110", 100), backup("0z", 200)],
        subscribers: vec![sub("110")],
        last_purged: Some(wm("0z")),
        ..case()
    };
    assert_eq!(caught_up.decide(), purge("110"));
}
