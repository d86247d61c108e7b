//! The guards that hold any purge whatever the rules allow (standby, the shard's memory, restores or the replica
//! unknown, a reset, a wall clock step), each with its own reason.

use super::*;

use HoldReason::*;

/// A case that purges below 0c unless a guard holds it.
fn guarded() -> Case {
    Case {
        backups: vec![backup("0b", 600), backup("0c", 300)],
        subscribers: vec![sub("0d")],
        ..case()
    }
}

#[test]
fn each_guard_holds_with_its_own_reason_and_the_quiet_case_purges() {
    assert_eq!(guarded().decide(), purge("0c"));
    let with = |guards: Guards| {
        Case {
            guards,
            ..guarded()
        }
        .decide()
    };
    let held = Guards::default();
    assert_eq!(
        with(Guards {
            standby: true,
            ..held
        }),
        Decision::Hold(Standby)
    );
    assert_eq!(
        with(Guards {
            memory: Memory::Unreadable,
            ..held
        }),
        Decision::Hold(StateUnreadable)
    );
    assert_eq!(
        with(Guards {
            memory: Memory::Unwritable,
            ..held
        }),
        Decision::Hold(StateUnwritable)
    );
    // Before the shard's memory is read from the change DB, nothing is known of the restores in flight.
    assert_eq!(
        with(Guards {
            memory: Memory::Loading,
            ..held
        }),
        Decision::Hold(StateUnreadable)
    );
    assert_eq!(
        with(Guards {
            restores_unknown_until: Some(at(NOW + 1)),
            ..held
        }),
        Decision::Hold(RestoresUnknown)
    );
    assert_eq!(
        with(Guards {
            restores_unknown_until: Some(at(NOW)),
            ..held
        }),
        purge("0c")
    );
    assert_eq!(
        with(Guards {
            position_unknown: true,
            ..held
        }),
        Decision::Hold(BackupUnknown)
    );
    assert_eq!(
        with(Guards {
            restored_less: true,
            ..held
        }),
        Decision::Hold(RestoredLess)
    );
    assert_eq!(
        with(Guards {
            drill_disk: true,
            ..held
        }),
        Decision::Hold(DrillDisk)
    );
    assert_eq!(
        with(Guards {
            replica_unknown: true,
            ..held
        }),
        Decision::Hold(ReplicaUnknown)
    );
    assert_eq!(
        with(Guards {
            unservable: true,
            ..held
        }),
        Decision::Hold(Unservable)
    );
}

/// A deployment the sidecar cannot serve is the news, whatever else would hold: even a sidecar that is not
/// registered, just started and standby says so first.
#[test]
fn an_unservable_deployment_holds_before_every_other_reason() {
    let everything = Case {
        now: 10,
        started: 0,
        ownership: Ownership::NotRegistered,
        guards: Guards {
            unservable: true,
            standby: true,
            memory: Memory::Unreadable,
            position_unknown: true,
            replica_unknown: true,
            ..Guards::default()
        },
        ..guarded()
    };
    assert_eq!(everything.decide(), Decision::Hold(Unservable));
    let served = Case {
        guards: Guards {
            unservable: false,
            ..everything.guards
        },
        ..everything
    };
    assert_eq!(served.decide(), Decision::Hold(NotRegistered));
}

#[test]
fn after_a_reset_only_backups_taken_since_count_once_they_have_aged() {
    let reset = |secs_ago: u64| Guards {
        reset_at: Some(wall(NOW - secs_ago)),
        ..Guards::default()
    };
    // Reset 200 s ago: 0b and 0c are claims about the old replica; nothing of the new one yet.
    let mut case = Case {
        guards: reset(200),
        ..guarded()
    };
    assert_eq!(case.decide(), Decision::Hold(ReplicaReset));
    // A backup of the new replica, not yet aged (60 s delay).
    case.backups.push(backup("05", 30));
    assert_eq!(case.decide(), Decision::Hold(ReplicaReset));
    // Aged: the purge goes below it, never below an old claim, though those are higher.
    case.backups.push(backup("04", 100));
    assert_eq!(case.decide(), purge("04"));
}

#[test]
fn a_forward_step_of_the_wall_clock_ages_no_claim() {
    // The wall clock jumped an hour ahead; by the monotonic clock since the start it is still NOW - 3600.
    let case = Case {
        now: NOW,
        backups: vec![backup("0b", 3630)],
        subscribers: vec![sub("0d")],
        guards: Guards {
            steady_now: Some(wall(NOW - 3600)),
            ..Guards::default()
        },
        ..case()
    };
    assert_eq!(case.decide(), Decision::Hold(BackupTooRecent));
    let later = Case {
        guards: Guards {
            steady_now: Some(wall(NOW - 3500)),
            ..Guards::default()
        },
        ..case
    };
    assert_eq!(later.decide(), purge("0b"));
}
