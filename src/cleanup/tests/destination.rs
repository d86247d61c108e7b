//! Verification against the destination: a backup's claim counts only with a restorable object behind it.

use super::*;

use HoldReason::*;

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
