use super::*;
use std::sync::OnceLock;
use std::time::UNIX_EPOCH;

use proptest::prelude::*;

use HoldReason::*;

/// Seconds since the test epoch at which most tests decide.
const NOW: u64 = 10_000;
/// The replica version every test subscriber asked for; below every test watermark.
const RV: &str = "01";

fn at(secs: u64) -> Instant {
    // A fixed base keeps the arithmetic readable; Instant has no zero.
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now) + Duration::from_secs(secs)
}

fn wall(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_746_600_000 + secs)
}

fn wm(s: &str) -> String {
    s.to_owned()
}

/// Backed up `secs_ago` seconds before [`NOW`].
fn backup(watermark: &str, secs_ago: u64) -> Backup {
    Backup {
        watermark: wm(watermark),
        backed_up_at: wall(NOW - secs_ago),
    }
}

fn reservation(task_id: &str, floor: Option<&str>) -> HeldReservation {
    HeldReservation {
        task_id: task_id.to_owned(),
        floor: floor.map(wm),
    }
}

fn sub(acked: &str) -> Subscriber {
    Subscriber {
        id: format!("vs-{acked}"),
        acked: wm(acked),
        replica_version: wm(RV),
        departed: None,
        awaits_upstream: false,
    }
}

/// Disconnected `secs_ago` seconds before [`NOW`].
fn departed(acked: &str, secs_ago: u64) -> Subscriber {
    Subscriber {
        departed: Some(at(NOW - secs_ago)),
        ..sub(acked)
    }
}

/// Owned inputs; defaults: long uptime, 60 s delay, 30 s grace, mode pin, nothing tracked.
struct Case {
    now: u64,
    started: u64,
    ownership: Ownership,
    delay: u64,
    grace: u64,
    mode: ReservationMode,
    without_subscribers: WithoutSubscribers,
    backups: Vec<Backup>,
    reservations: Vec<HeldReservation>,
    subscribers: Vec<Subscriber>,
    last_purged: Option<String>,
    /// The gauge: `(highest, current)`; unset, it reports the newest backup.
    gauge: Option<(&'static str, &'static str)>,
    destination: DestinationCheck,
    other_generation: Vec<String>,
    guards: Guards,
}

fn case() -> Case {
    Case {
        now: NOW,
        started: 0,
        ownership: Ownership::Unchecked,
        delay: 60,
        grace: 30,
        mode: ReservationMode::Pin,
        without_subscribers: WithoutSubscribers::Hold,
        backups: vec![],
        reservations: vec![],
        subscribers: vec![],
        last_purged: None,
        gauge: None,
        destination: DestinationCheck::Unchecked,
        other_generation: vec![],
        guards: Guards::default(),
    }
}

impl Case {
    fn decide(&self) -> Decision {
        let newest = self.backups.iter().map(|b| b.watermark.as_str()).max();
        let (highest, current) = self
            .gauge
            .map_or((newest, newest), |(h, c)| (Some(h), Some(c)));
        decide(&Inputs {
            now: at(self.now),
            wall_now: wall(self.now),
            started: at(self.started),
            ownership: self.ownership,
            cleanup_delay: Duration::from_secs(self.delay),
            reconnect_grace: Duration::from_secs(self.grace),
            mode: self.mode,
            without_subscribers: self.without_subscribers,
            backups: &self.backups,
            reservations: &self.reservations,
            subscribers: &self.subscribers,
            last_purged: self.last_purged.as_deref(),
            highest_backup: highest,
            current_backup: current,
            destination: self.destination,
            other_generation: &self.other_generation,
            guards: self.guards,
        })
    }
}

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

/// A purge below the newest aged backup, which nothing lowered.
fn purge(before: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Backup,
    }
}

/// A purge lowered to `before` by reservation `task_id`'s floor.
fn purge_at_floor(before: &str, task_id: &str, floor: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Reservation {
            task_id: wm(task_id),
            floor: wm(floor),
        },
    }
}

/// A purge lowered to `before` by the subscriber that acked `acked` (ids are `vs-{acked}`).
fn purge_at_ack(before: &str, acked: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Subscriber {
            id: format!("vs-{acked}"),
            acked: wm(acked),
        },
    }
}

/// One aged backup at "0a" and a caught-up subscriber: purges unless the test adds an obstacle.
fn ready() -> Case {
    Case {
        backups: vec![backup("0a", 120)],
        subscribers: vec![sub("0a")],
        ..case()
    }
}

#[test]
fn ready_case_purges_below_the_backup() {
    assert_eq!(ready().decide(), purge("0a"));
}

// The destination: a claim counts only with an object behind it.

fn listed(secs_ago: Option<u64>) -> DestinationCheck {
    DestinationCheck::Listed {
        reaches: secs_ago.map(|ago| wall(NOW - ago)),
    }
}

#[test]
fn holds_unless_the_restorable_chain_reaches_the_claim() {
    let with = |destination| Case {
        destination,
        ..ready()
    };
    // "0a" was claimed 120 s ago: a chain whose newest object is from then or later covers it; one a second
    // older does not, with no slack for clocks.
    assert_eq!(with(listed(Some(120))).decide(), purge("0a"));
    assert_eq!(with(listed(Some(0))).decide(), purge("0a"));
    assert_eq!(
        with(listed(Some(121))).decide(),
        Decision::Hold(BackupUnverified)
    );
    assert_eq!(
        with(listed(None)).decide(),
        Decision::Hold(BackupUnverified)
    );
    assert_eq!(
        with(DestinationCheck::Unreadable).decide(),
        Decision::Hold(BackupUnverified)
    );
    assert_eq!(with(DestinationCheck::Unchecked).decide(), purge("0a"));
}

#[test]
fn claims_made_after_the_uploads_stopped_lower_the_purge_to_an_older_covered_one() {
    // Uploads stopped 300 s ago while the gauge went on: "0c" (claimed 120 s ago) has nothing behind it.
    let wedged = Case {
        backups: vec![backup("0a", 600), backup("0c", 120)],
        subscribers: vec![sub("0c")],
        destination: listed(Some(300)),
        ..case()
    };
    assert_eq!(
        wedged.decide(),
        Decision::Purge {
            before: wm("0a"),
            bound: Bound::Destination
        }
    );
}

#[test]
fn claims_of_another_generation_are_covered_by_none_of_today_s_objects() {
    // "0c" was first seen while a restore picked another generation: today's chain, newer than both claims, says
    // nothing of it, and the purge stays below the claim it does cover.
    let switched = Case {
        backups: vec![backup("0a", 600), backup("0c", 120)],
        subscribers: vec![sub("0c")],
        destination: listed(Some(0)),
        other_generation: vec![wm("0c")],
        ..case()
    };
    assert_eq!(
        switched.decide(),
        Decision::Purge {
            before: wm("0a"),
            bound: Bound::Destination
        }
    );
    let only = Case {
        other_generation: vec![wm("0a")],
        destination: listed(Some(0)),
        ..ready()
    };
    assert_eq!(only.decide(), Decision::Hold(BackupUnverified));
}

#[test]
fn unverified_comes_after_the_other_backup_reasons_and_before_floors_and_acks() {
    let young = Case {
        backups: vec![backup("0a", 10)],
        destination: DestinationCheck::Unreadable,
        ..ready()
    };
    assert_eq!(young.decide(), Decision::Hold(BackupTooRecent));
    let nothing_new = Case {
        last_purged: Some(wm("0a")),
        destination: DestinationCheck::Unreadable,
        ..ready()
    };
    assert_eq!(nothing_new.decide(), Decision::Hold(NothingNew));
    let floor_and_behind = Case {
        reservations: vec![reservation("t1", Some("05"))],
        subscribers: vec![sub("05")],
        destination: listed(None),
        ..ready()
    };
    assert_eq!(floor_and_behind.decide(), Decision::Hold(BackupUnverified));
    let ordered: Vec<_> = HoldReason::ALL.iter().map(HoldReason::as_str).collect();
    let at = |label| ordered.iter().position(|l| *l == label).unwrap();
    assert_eq!(at("backup_unverified"), at("backup_too_recent") + 1);
}

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

// Rule b: reservations.

#[test]
fn pause_mode_holds_while_any_reservation_is_open() {
    let d = Case {
        mode: ReservationMode::Pause,
        reservations: vec![reservation("t1", Some("0z"))],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(ReservationsOpen));
}

#[test]
fn pin_mode_purges_up_to_a_floor_at_or_above_the_backup() {
    let d = Case {
        reservations: vec![reservation("t1", Some("0a"))],
        ..ready()
    }
    .decide();
    assert_eq!(d, purge("0a"));
}

#[test]
fn reservation_without_floor_holds_everything_in_pin_mode() {
    let d = Case {
        reservations: vec![reservation("t1", Some("0z")), reservation("t2", None)],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(ReservationWithoutFloor));
}

#[test]
fn pin_mode_stops_at_the_lowest_floor() {
    let d = Case {
        backups: vec![backup("0a", 300), backup("0b", 200), backup("0c", 100)],
        subscribers: vec![sub("0c")],
        reservations: vec![reservation("t1", Some("0c")), reservation("t2", Some("0b"))],
        ..case()
    }
    .decide();
    assert_eq!(d, purge_at_floor("0b", "t2", "0b"));
}

#[test]
fn holds_when_every_aged_backup_is_above_a_floor() {
    let d = Case {
        reservations: vec![reservation("t1", Some("09"))],
        ..ready()
    }
    .decide();
    assert_eq!(d, Decision::Hold(ReservationFloor));
}

#[test]
fn pin_purges_below_the_older_floor_where_pause_holds_with_overlapping_reservations() {
    // A opened when "0a" was the newest backup, B after "0c" was backed up; both restores still run.
    let overlapping = Case {
        backups: vec![backup("0a", 600), backup("0c", 300), backup("0e", 120)],
        subscribers: vec![sub("0e")],
        reservations: vec![reservation("a", Some("0a")), reservation("b", Some("0c"))],
        ..case()
    };
    assert_eq!(overlapping.decide(), purge_at_floor("0a", "a", "0a"));
    let paused = Case {
        mode: ReservationMode::Pause,
        ..overlapping
    };
    assert_eq!(paused.decide(), Decision::Hold(ReservationsOpen));
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

fn watermarks(backlog: &Backlog) -> Vec<&str> {
    backlog
        .backups()
        .iter()
        .map(|b| b.watermark.as_str())
        .collect()
}

#[test]
fn a_gauge_going_back_forgets_the_backups_above_it_until_it_reaches_its_high() {
    let mut backlog = Backlog::default();
    let first = backlog.observe(&seen(&[backup("0b", 300)]));
    assert_eq!((first.added, first.gauge), (1, Some(GaugeMove::Steady)));
    backlog.observe(&seen(&[backup("0d", 200)]));
    backlog.purged("0b");
    assert_eq!(watermarks(&backlog), ["0b", "0d"]);
    assert_eq!(backlog.regression(), None);

    // Litestream restarted on an older generation: it reports 0c.
    let back = backlog.observe(&seen(&[backup("0c", 50)]));
    assert_eq!(
        back.gauge,
        Some(GaugeMove::Regressed {
            highest: "0d".into(),
            current: "0c".into(),
            dropped: 1
        })
    );
    assert_eq!(back.added, 1);
    assert_eq!(watermarks(&backlog), ["0b", "0c"]);
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    assert_eq!(backlog.current(), Some(&backup("0c", 50)));
    assert_eq!(backlog.highest(), Some("0d"));
    // Said once: the same value again is no news, and a scrape without a usable sample changes nothing.
    assert_eq!(
        backlog.observe(&seen(&[backup("0c", 40)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.observe(&[]).gauge, None);
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    // Lower still is news again; the floor of what is tracked follows it down, the last purge stays.
    assert_eq!(
        backlog.observe(&seen(&[backup("0a", 30)])).gauge,
        Some(GaugeMove::Regressed {
            highest: "0d".into(),
            current: "0a".into(),
            dropped: 2
        })
    );
    assert_eq!(watermarks(&backlog), Vec::<&str>::new());
    assert_eq!(backlog.last_purged(), Some("0b"));
    // At or below the last purge it is not tracked, but it is still where the gauge is, with the page's time.
    assert_eq!(backlog.current(), Some(&backup("0a", 30)));

    // Between the old high and now: still below it.
    assert_eq!(
        backlog.observe(&seen(&[backup("0c", 20)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    // The old high again, as a new upload: tracked with its new time, not the forgotten one.
    assert_eq!(
        backlog.observe(&seen(&[backup("0d", 10)])).gauge,
        Some(GaugeMove::Recovered {
            highest: "0d".into(),
            current: "0d".into()
        })
    );
    assert_eq!(backlog.regression(), None);
    assert_eq!(backlog.backups(), [backup("0c", 20), backup("0d", 10)]);
    assert_eq!(
        backlog.observe(&seen(&[backup("0e", 5)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.highest(), Some("0e"));
}

#[test]
fn the_gauge_is_the_newest_sample_of_a_page() {
    let mut backlog = Backlog::default();
    // Two replicas: the one ahead is where the gauge is (docs/protocol.md, "A watermark counted once one replica has it").
    backlog.observe(&seen(&[backup("0c", 20), backup("0e", 10)]));
    assert_eq!(backlog.current(), Some(&backup("0e", 10)));
    assert_eq!(backlog.regression(), None);
    // The replica ahead is gone from the page: what is left is below the high.
    let gone = backlog.observe(&seen(&[backup("0c", 20)]));
    assert!(matches!(gone.gauge, Some(GaugeMove::Regressed { .. })));
    assert_eq!(watermarks(&backlog), ["0c"]);
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

fn seen(backups: &[Backup]) -> Vec<(&str, SystemTime)> {
    backups
        .iter()
        .map(|b| (b.watermark.as_str(), b.backed_up_at))
        .collect()
}

#[test]
fn newest_backup_is_the_byte_wise_maximum() {
    let mut backlog = Backlog::default();
    assert_eq!(backlog.newest(), None);
    backlog.record(seen(&[backup("0z", 3), backup("110", 2), backup("09", 1)]));
    assert_eq!(backlog.newest(), Some(&backup("110", 2)));
}

#[test]
fn first_sighting_of_a_watermark_wins() {
    let mut backlog = Backlog::default();
    assert_eq!(backlog.record(seen(&[backup("0a", 300)])), 1);
    assert_eq!(
        backlog.record(seen(&[backup("0a", 200), backup("0b", 100)])),
        1
    );
    assert_eq!(backlog.backups(), [backup("0a", 300), backup("0b", 100)]);
}

#[test]
fn nothing_at_or_below_the_last_purge_is_tracked_again() {
    let mut backlog = Backlog::default();
    backlog.record(seen(&[backup("0a", 3), backup("0b", 2), backup("0c", 1)]));
    backlog.purged("0b");
    assert_eq!(backlog.last_purged(), Some("0b"));
    let left: Vec<_> = backlog
        .backups()
        .iter()
        .map(|b| b.watermark.as_str())
        .collect();
    assert_eq!(left, ["0b", "0c"]);
    assert_eq!(
        backlog.record(seen(&[backup("0a", 9), backup("0b", 9), backup("0d", 9)])),
        1
    );
    // Byte-wise order: "110" (36) is after "0z" (35).
    backlog.purged("0z");
    assert_eq!(backlog.record(seen(&[backup("110", 10)])), 1);
}

#[test]
fn a_running_purge_stops_at_the_lowest_floor_or_at_once() {
    use ReservationMode::{Pause, Pin};
    assert_eq!(ceiling(Pin, &[]), Ceiling::None);
    assert_eq!(ceiling(Pause, &[]), Ceiling::None);
    let floored = [reservation("c", Some("0c")), reservation("e", Some("0e"))];
    assert_eq!(ceiling(Pin, &floored), Ceiling::Below("0c".into()));
    // Mode pause: any open reservation pauses cleanup, a running purge included.
    assert_eq!(ceiling(Pause, &floored), Ceiling::Everything);
    let floorless = [reservation("c", Some("0c")), reservation("early", None)];
    assert_eq!(ceiling(Pin, &floorless), Ceiling::Everything);
}

#[test]
fn a_running_purge_also_stops_at_the_lowest_tracked_ack() {
    use ReservationMode::{Pause, Pin};
    let grace = Duration::from_secs(30);
    let ceiling = |mode, reservations: &[HeldReservation], subscribers: &[Subscriber]| {
        purge_ceiling(mode, reservations, subscribers, at(NOW), grace)
    };
    // A v4 view-syncer caught up from 0b, below a purge running towards 0d, and its reservation ended.
    let behind = [sub("0e"), sub("0b")];
    assert_eq!(ceiling(Pin, &[], &behind), Ceiling::Below("0b".into()));
    // Departed within the grace it still counts; past it, not.
    assert_eq!(
        ceiling(Pin, &[], &[sub("0e"), departed("0b", 29)]),
        Ceiling::Below("0b".into())
    );
    assert_eq!(
        ceiling(Pin, &[], &[sub("0e"), departed("0b", 30)]),
        Ceiling::Below("0e".into())
    );
    assert_eq!(ceiling(Pin, &[], &[]), Ceiling::None);
    // The lower of the floors and the acks; a reservation that protects everything still stops it.
    let floored = [reservation("c", Some("0c"))];
    assert_eq!(ceiling(Pin, &floored, &behind), Ceiling::Below("0b".into()));
    assert_eq!(
        ceiling(Pin, &floored, &[sub("0e")]),
        Ceiling::Below("0c".into())
    );
    assert_eq!(ceiling(Pause, &floored, &behind), Ceiling::Everything);
    assert_eq!(
        ceiling(Pin, &[reservation("early", None)], &behind),
        Ceiling::Everything
    );
}

#[test]
fn reservations_show_as_task_and_floor() {
    assert_eq!(reservation("a", Some("0c")).to_string(), "a=0c");
    assert_eq!(reservation("b", None).to_string(), "b=none");
}

// docs/protocol.md, "A worked timeline", adapted: the sidecar starts with the RM restore at 00:00 with a 4 min
// delay; litestream uploads W="0w" at 00:10; V reserves at 00:12 and subscribes at 00:19 (the delay becomes 7 min).
#[test]
fn worked_timeline() {
    let min = |m: u64| m * 60;
    let timeline = |now: u64, delay: u64, mode, reservations, subscribers| {
        Case {
            now,
            started: 0,
            delay,
            mode,
            backups: vec![Backup {
                watermark: wm("0w"),
                backed_up_at: wall(min(10)),
            }],
            reservations,
            subscribers,
            ..case()
        }
        .decide()
    };
    let rm_backup = || sub("0x");
    let v_reserved = || vec![reservation("v", Some("0w"))];
    for mode in [ReservationMode::Pin, ReservationMode::Pause] {
        // 00:03: still starting up.
        let d = timeline(min(3), min(4), mode, vec![], vec![rm_backup()]);
        assert_eq!(d, Decision::Hold(StartingUp));
        // 00:13, V reserving: W is 3 min old.
        let d = timeline(min(13), min(4), mode, v_reserved(), vec![rm_backup()]);
        let expected = match mode {
            ReservationMode::Pin => BackupTooRecent,
            ReservationMode::Pause => ReservationsOpen,
        };
        assert_eq!(d, Decision::Hold(expected));
        // 00:15, V restoring: pin may purge below V's floor; pause waits for V (Zero's behaviour).
        let d = timeline(min(15), min(4), mode, v_reserved(), vec![rm_backup()]);
        let expected = match mode {
            ReservationMode::Pin => purge("0w"),
            ReservationMode::Pause => Decision::Hold(ReservationsOpen),
        };
        assert_eq!(d, expected);
        // 00:20: V subscribed at W, its reservation ended, the delay is 7 min; W (00:10) is aged.
        let d = timeline(min(20), min(7), mode, vec![], vec![rm_backup(), sub("0w")]);
        assert_eq!(d, purge("0w"));
    }
}

#[test]
fn hold_reasons_have_distinct_labels_in_evaluation_order() {
    let labels: std::collections::HashSet<_> = HoldReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), HoldReason::ALL.len());
    for reason in HoldReason::ALL {
        let label = reason.as_str();
        assert!(
            label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{label}"
        );
        let phrase = reason.to_string();
        assert!(
            !phrase.is_empty() && phrase == phrase.to_lowercase(),
            "{phrase}"
        );
    }
    // The order decide checks them in, by name: each pair is one the rules depend on.
    let at = |reason| HoldReason::ALL.iter().position(|r| *r == reason).unwrap();
    assert_eq!(HoldReason::ALL[0], Unservable);
    for (earlier, later) in [
        (Unservable, NotRegistered),
        (NotRegistered, StartingUp),
        (StartingUp, BackupUnknown),
        (BackupUnknown, RestoredLess),
        (RestoredLess, BackupRegressed),
        (BackupRegressed, NoBackup),
        (BackupTooRecent, BackupUnverified),
        (BackupUnverified, ReservationFloor),
        (ReservationFloor, SubscriberBehind),
    ] {
        assert!(at(earlier) < at(later), "{earlier:?} before {later:?}");
    }
    assert_eq!(HoldReason::ALL.last(), Some(&SubscriberBehind));
}

// Property tests: a model of the monitor's view over random event sequences.

/// The LexiVersion of `n` (docs/protocol.md, "Watermarks"), to produce watermarks of varying length.
fn lexi(n: u64) -> String {
    let mut digits = Vec::new();
    let mut rest = n;
    loop {
        digits.push(std::char::from_digit((rest % 36) as u32, 36).unwrap());
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(std::char::from_digit(digits.len() as u32 - 1, 36).unwrap());
    digits.iter().rev().collect()
}

#[test]
fn lexi_matches_the_protocol_examples() {
    assert_eq!(lexi(0), "00");
    assert_eq!(lexi(10), "0a");
    assert_eq!(lexi(35), "0z");
    assert_eq!(lexi(36), "110");
    assert_eq!(lexi(46655), "2zzz");
}

#[derive(Debug, Clone)]
enum Event {
    /// The stream advances by `step` positions.
    Commit(u64),
    /// Litestream backs up the head (after a commit when `advance`, so possibly at the replica version when
    /// not), reported `lag` seconds ago (or ahead, with clock trouble). Skipped unless newer than every backup.
    Backup {
        advance: bool,
        lag: u64,
        future: bool,
    },
    /// A reservation opens with the newest backup known now as its floor.
    Open,
    Close(usize),
    /// A subscriber connects at some position reached so far.
    Connect(usize),
    /// A connected subscriber acks some position (only a newer one moves it).
    Ack(usize, usize),
    Leave(usize),
    Advance(u64),
    /// The monitor lists the destination: its newest object `ago` seconds old (`None`: empty), or the listing
    /// fails (`ago` unused), or verification is off.
    List {
        outcome: u8,
        ago: Option<u64>,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        2 => (1..400u64).prop_map(Event::Commit),
        3 => (prop::bool::weighted(0.8), 0..120u64, prop::bool::weighted(0.1))
            .prop_map(|(advance, lag, future)| Event::Backup { advance, lag, future }),
        1 => Just(Event::Open),
        2 => any::<usize>().prop_map(Event::Close),
        2 => any::<usize>().prop_map(Event::Connect),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(s, p)| Event::Ack(s, p)),
        1 => any::<usize>().prop_map(Event::Leave),
        4 => (0..90u64).prop_map(Event::Advance),
        2 => (0..3u8, prop::option::weighted(0.9, 0..200u64))
            .prop_map(|(outcome, ago)| Event::List { outcome, ago }),
    ]
}

struct Model {
    mode: ReservationMode,
    without_subscribers: WithoutSubscribers,
    delay: Duration,
    grace: Duration,
    clock: u64,
    head: u64,
    positions: Vec<String>,
    backups: Vec<Backup>,
    reservations: Vec<HeldReservation>,
    next_task: u32,
    subscribers: Vec<Subscriber>,
    last_purged: Option<String>,
    destination: DestinationCheck,
}

impl Model {
    fn new(
        mode: ReservationMode,
        without_subscribers: WithoutSubscribers,
        delay: u64,
        grace: u64,
        head: u64,
    ) -> Self {
        Model {
            mode,
            without_subscribers,
            delay: Duration::from_secs(delay),
            grace: Duration::from_secs(grace),
            clock: 0,
            head,
            positions: vec![lexi(head)],
            backups: vec![],
            reservations: vec![],
            next_task: 0,
            subscribers: vec![],
            last_purged: None,
            destination: DestinationCheck::Unchecked,
        }
    }

    fn replica_version(&self) -> &str {
        &self.positions[0]
    }

    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Commit(step) => {
                self.head += step;
                self.positions.push(lexi(self.head));
            }
            Event::Backup {
                advance,
                lag,
                future,
            } => {
                if advance {
                    self.head += 1;
                    self.positions.push(lexi(self.head));
                }
                let watermark = lexi(self.head);
                if self
                    .backups
                    .iter()
                    .map(|b| b.watermark.as_str())
                    .max()
                    .is_some_and(|newest| newest >= watermark.as_str())
                {
                    return;
                }
                let backed_up_at = if future {
                    wall(self.clock + lag + 1)
                } else {
                    wall(self.clock.saturating_sub(lag))
                };
                self.backups.push(Backup {
                    watermark,
                    backed_up_at,
                });
            }
            Event::Open => {
                self.next_task += 1;
                let floor = self.backups.iter().map(|b| b.watermark.clone()).max();
                self.reservations.push(HeldReservation {
                    task_id: format!("t{}", self.next_task),
                    floor,
                });
            }
            Event::Close(i) if !self.reservations.is_empty() => {
                let i = i % self.reservations.len();
                self.reservations.remove(i);
            }
            Event::Connect(p) => {
                let acked = self.positions[p % self.positions.len()].clone();
                let replica_version = self.replica_version().to_owned();
                self.subscribers.push(Subscriber {
                    id: format!("vs-{}", self.subscribers.len()),
                    acked,
                    replica_version,
                    departed: None,
                    awaits_upstream: false,
                });
            }
            Event::Ack(s, p) if !self.subscribers.is_empty() => {
                let position = self.positions[p % self.positions.len()].clone();
                let i = s % self.subscribers.len();
                let subscriber = &mut self.subscribers[i];
                if subscriber.is_connected() && position > subscriber.acked {
                    subscriber.acked = position;
                }
            }
            Event::Leave(s) if !self.subscribers.is_empty() => {
                let i = s % self.subscribers.len();
                let now = at(self.clock);
                self.subscribers[i].departed.get_or_insert(now);
            }
            Event::Advance(secs) => self.clock += secs,
            Event::List { outcome, ago } => {
                self.destination = match outcome {
                    0 => DestinationCheck::Unchecked,
                    1 => DestinationCheck::Unreadable,
                    _ => DestinationCheck::Listed {
                        reaches: ago.map(|ago| wall(self.clock.saturating_sub(ago))),
                    },
                }
            }
            Event::Close(_) | Event::Ack(..) | Event::Leave(_) => {}
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            now: at(self.clock),
            wall_now: wall(self.clock),
            started: at(0),
            ownership: Ownership::Unchecked,
            cleanup_delay: self.delay,
            reconnect_grace: self.grace,
            mode: self.mode,
            without_subscribers: self.without_subscribers,
            backups: &self.backups,
            reservations: &self.reservations,
            subscribers: &self.subscribers,
            last_purged: self.last_purged.as_deref(),
            // Backups only ever advance in this model: the gauge is at its highest.
            highest_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
            current_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
            destination: self.destination,
            other_generation: &[],
            guards: Guards::default(),
        }
    }

    fn tracked(&self) -> impl Iterator<Item = &Subscriber> {
        let now = at(self.clock);
        self.subscribers.iter().filter(move |s| match s.departed {
            None => true,
            Some(d) => now - d < self.grace,
        })
    }

    fn is_aged(&self, backup: &Backup) -> bool {
        backup.backed_up_at + self.delay <= wall(self.clock)
    }

    /// Every rule, written independently of `decide`, for purging below `w`.
    fn violations(&self, w: &str) -> Vec<&'static str> {
        let mut broken = vec![];
        if Duration::from_secs(self.clock) < self.delay.max(self.grace) {
            broken.push("purge before uptime reached the delay and the reconnect grace");
        }
        if self.mode == ReservationMode::Pause && !self.reservations.is_empty() {
            broken.push("purge in pause mode with a reservation open");
        }
        for r in &self.reservations {
            match &r.floor {
                None => broken.push("purge with a floorless reservation open"),
                Some(floor) if w > floor.as_str() => broken.push("purge above a reservation floor"),
                Some(_) => {}
            }
        }
        if !self.subscribers.iter().any(Subscriber::is_connected) {
            match self.without_subscribers {
                WithoutSubscribers::Hold => broken.push("purge without a connected subscriber"),
                WithoutSubscribers::AfterGrace => {
                    if self.tracked().next().is_some() {
                        broken.push("purge while a departed subscriber may still come back");
                    }
                    if Duration::from_secs(self.clock) < self.grace {
                        broken.push("purge without subscribers before the grace since start");
                    }
                }
            }
        }
        for s in self.tracked() {
            if w > s.acked.as_str() {
                broken.push("purge above a tracked subscriber's ack");
            }
            if s.acked == s.replica_version {
                broken.push("purge with a tracked subscriber at the replica version");
            }
        }
        if !self
            .backups
            .iter()
            .any(|b| b.watermark == w && self.is_aged(b))
        {
            broken.push("purge at a watermark that is not an aged backup");
        }
        if self.last_purged.as_deref().is_some_and(|last| w <= last) {
            broken.push("purge not above the last purge");
        }
        let claimed = self.backups.iter().find(|b| b.watermark == w);
        match (self.destination, claimed) {
            (DestinationCheck::Unchecked, _) | (_, None) => {}
            (DestinationCheck::Unreadable, _) => broken.push("purge on a failed listing"),
            (DestinationCheck::Listed { reaches: None }, _) => {
                broken.push("purge with nothing restorable in the destination")
            }
            (DestinationCheck::Listed { reaches: Some(n) }, Some(b)) => {
                if n < b.backed_up_at {
                    broken.push("purge at a claim with no object behind it")
                }
            }
        }
        broken
    }

    /// The bound names a constraint that really lowered the purge, and nothing else did after it.
    fn check_bound(&self, before: &str, bound: &Bound) -> Result<(), TestCaseError> {
        let newest_candidate = self
            .backups
            .iter()
            .filter(|b| self.is_aged(b))
            .filter(|b| {
                self.last_purged
                    .as_deref()
                    .is_none_or(|l| b.watermark.as_str() > l)
            })
            .map(|b| b.watermark.as_str())
            .max();
        match bound {
            Bound::Backup => {
                prop_assert_eq!(Some(before), newest_candidate, "bound by the backup alone")
            }
            Bound::Destination => {
                prop_assert!(
                    Some(before) < newest_candidate,
                    "the destination lowered it"
                );
                prop_assert!(!self
                    .violations(newest_candidate.unwrap_or_default())
                    .is_empty());
            }
            Bound::Reservation { task_id, floor } => {
                prop_assert!(before <= floor.as_str() && newest_candidate > Some(floor.as_str()));
                prop_assert!(self
                    .reservations
                    .iter()
                    .any(|r| &r.task_id == task_id && r.floor.as_ref() == Some(floor)));
            }
            Bound::Subscriber { acked, .. } => {
                prop_assert!(before <= acked.as_str() && newest_candidate > Some(acked.as_str()));
                prop_assert!(self.tracked().any(|s| &s.acked == acked));
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        let decision = decide(&self.inputs());
        // The largest backup that every rule allows, if any.
        let best = self
            .backups
            .iter()
            .map(|b| b.watermark.as_str())
            .filter(|w| self.violations(w).is_empty())
            .max()
            .map(str::to_owned);
        match decision {
            Decision::Purge { before, bound } => {
                let broken = self.violations(&before);
                self.check_bound(&before, &bound)?;
                prop_assert!(broken.is_empty(), "Purge({}) breaks {:?}", before, broken);
                prop_assert_eq!(Some(&before), best.as_ref(), "not the largest safe backup");
                self.last_purged = Some(before);
            }
            Decision::Hold(reason) => {
                prop_assert_eq!(best, None, "held ({}) although a backup was safe", reason);
            }
        }
        Ok(())
    }
}

fn mode() -> impl Strategy<Value = ReservationMode> {
    prop_oneof![Just(ReservationMode::Pin), Just(ReservationMode::Pause)]
}

fn without_subscribers() -> impl Strategy<Value = WithoutSubscribers> {
    prop_oneof![
        Just(WithoutSubscribers::Hold),
        Just(WithoutSubscribers::AfterGrace)
    ]
}

proptest! {
    #[test]
    fn decisions_over_random_histories_are_safe_and_maximal(
        mode in mode(),
        without in without_subscribers(),
        delay in 30..150u64,
        grace in 0..60u64,
        start in 1..1400u64,
        events in prop::collection::vec(event(), 1..100),
    ) {
        let mut model = Model::new(mode, without, delay, grace, start);
        model.check()?;
        for event in &events {
            model.apply(event);
            model.check()?;
        }
    }

    #[test]
    fn purges_the_newest_aged_backup_when_nothing_stands_in_the_way(
        mode in mode(),
        delay in 30..3600u64,
        ages in prop::collection::vec(0..7200u64, 1..6),
        start in 1..3000u64,
        steps in prop::collection::vec(1..2000u64, 6),
        uptime_extra in 0..3600u64,
    ) {
        // Backups at increasing watermarks, oldest first; at least the first is aged.
        let mut ages = ages;
        ages.sort_unstable_by(|a, b| b.cmp(a));
        ages[0] += delay;
        let now = 20_000;
        let mut head = start;
        let backups: Vec<Backup> = ages
            .iter()
            .zip(&steps)
            .map(|(&age, &step)| {
                head += step;
                Backup { watermark: lexi(head), backed_up_at: wall(now - age) }
            })
            .collect();
        let newest_aged = backups
            .iter()
            .zip(&ages)
            .rev()
            .find(|(_, age)| **age >= delay)
            .map(|(b, _)| b.watermark.clone())
            .unwrap();
        let subscribers = [Subscriber {
            id: "vs".into(),
            acked: lexi(head),
            replica_version: lexi(start),
            departed: None,
            awaits_upstream: false,
        }];
        let d = decide(&Inputs {
            now: at(now),
            wall_now: wall(now),
            started: at(now - delay - uptime_extra),
            cleanup_delay: Duration::from_secs(delay),
            reconnect_grace: Duration::from_secs(30),
            mode,
            without_subscribers: WithoutSubscribers::Hold,
            backups: &backups,
            reservations: &[],
            subscribers: &subscribers,
            last_purged: None,
            ownership: Ownership::Unchecked,
            highest_backup: backups.last().map(|b| b.watermark.as_str()),
            current_backup: backups.last().map(|b| b.watermark.as_str()),
            destination: DestinationCheck::Unchecked,
            other_generation: &[],
            guards: Guards::default(),
        });
        prop_assert_eq!(d, Decision::Purge { before: newest_aged, bound: Bound::Backup });
    }
}
