//! docs/protocol.md's worked timeline, replayed through `decide` in both reservation modes.

use super::*;

use HoldReason::*;

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
