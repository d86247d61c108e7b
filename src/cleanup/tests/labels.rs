//! How holds and reservations are named in logs, metrics and `/status`: distinct labels, in the order `decide`
//! checks them.

use super::*;

use HoldReason::*;

#[test]
fn reservations_show_as_task_and_floor() {
    assert_eq!(reservation("a", Some("0c")).to_string(), "a=0c");
    assert_eq!(reservation("b", None).to_string(), "b=none");
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
