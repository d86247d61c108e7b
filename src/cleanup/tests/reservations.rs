//! Rule b: open reservations pause cleanup, or pin it below their floors.

use super::*;

use HoldReason::*;

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
