//! The ceiling a running purge asks before every batch: the lowest floor or tracked ack, or everything.

use super::*;

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
