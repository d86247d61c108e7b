//! The loop's state machine as tables: each row one reading handed to [`Knowledge`], and what it says happened.
//! No database, no page server, no clock: what the PostgreSQL tests reach only through a running loop.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::knowledge::{Knowledge, LockMove, PositionSeen};
use super::Resumed;
use crate::cleanup::status::Status;
use crate::cleanup::{GaugeMove, LastPurge, PurgeRun};
use crate::litestream::drill::{Failure, Proof};
use crate::litestream::page::{Parsed, Progress};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// One reading.
enum Step {
    /// A page from the litestream process started at `.0`, with samples `(watermark, uploaded at)`.
    Page(Option<f64>, &'static [(&'static str, u64)]),
    Unreadable,
    /// The change DB's replica version, read at `.1`.
    Replica(&'static str, u64),
    /// The drills' latest failure and proof `(watermark, replica version, generation, started)`.
    Proof(
        Option<Failure>,
        Option<(&'static str, &'static str, Option<&'static str>, u64)>,
    ),
    Purged(&'static str),
    Resumed {
        last_purge: Option<&'static str>,
        highest: Option<&'static str>,
        replica: Option<&'static str>,
    },
}

fn page(started: Option<f64>, samples: &[(&str, u64)]) -> Parsed {
    Parsed {
        progress: samples
            .iter()
            .map(|&(watermark, secs)| Progress {
                watermark: watermark.to_owned(),
                backed_up_at: at(secs),
                db: "/data/replica.db".into(),
                name: "s3".into(),
            })
            .collect(),
        process_started: started,
        ..Parsed::default()
    }
}

/// What a change of position says, in one line: the words of the table's second column.
fn said(seen: PositionSeen) -> String {
    let mut parts = Vec::new();
    if let Some(why) = seen.lost {
        parts.push(format!("lost: {why}"));
    }
    if seen.forget_backup {
        parts.push("forget".into());
    }
    if seen.restarted {
        parts.push("restarted".into());
    }
    if let Some(was) = seen.found {
        parts.push(format!("found (was: {was})"));
    }
    if let Some(taken) = seen.taken {
        let gauge = match taken.gauge {
            Some(GaugeMove::Regressed {
                highest, current, ..
            }) => format!(" regressed {highest}->{current}"),
            Some(GaugeMove::Recovered { highest, current }) => {
                format!(" recovered {highest}->{current}")
            }
            Some(GaugeMove::Steady) | None => String::new(),
        };
        let below = taken
            .below_purge
            .map(|(purged, gauge)| format!(" below purge {purged}>{gauge}"))
            .unwrap_or_default();
        parts.push(format!("at {}{gauge}{below}", taken.current));
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

fn apply(k: &mut Knowledge, step: &Step) -> String {
    match step {
        Step::Page(started, samples) => said(k.on_page(&page(*started, samples))),
        Step::Unreadable => said(k.on_unreadable_page("connection refused")),
        Step::Replica(version, secs) => {
            match k.on_replica_version(version.to_string(), at(*secs)) {
                Some(old) => format!("reset from {old}"),
                None => "nothing".into(),
            }
        }
        Step::Proof(failure, proof) => {
            let proof = proof.map(|(watermark, replica_version, generation, started)| Proof {
                watermark: watermark.into(),
                replica_version: replica_version.into(),
                generation: generation.map(Into::into),
                started: at(started),
                finished: at(started + 10),
                restore_took: Duration::from_secs(5),
                check_took: Duration::from_secs(1),
                bytes: 4096,
            });
            said(k.on_proof(failure.as_ref(), proof.as_ref()))
        }
        Step::Purged(before) => {
            k.on_purged(
                before,
                PurgeRun {
                    bound: "backup".into(),
                    rows: 10,
                    completed_at: at(1000),
                },
            );
            "nothing".into()
        }
        Step::Resumed {
            last_purge,
            highest,
            replica,
        } => {
            let resumed = Resumed {
                last_purge: last_purge.map(LastPurge::remembered),
                highest_backup: highest.map(Into::into),
                replica_version: replica.map(Into::into),
                restores_unknown_since: None,
            };
            match k.on_resumed(&resumed, at(500)) {
                Some((remembered, current)) => format!("other replica {remembered}, now {current}"),
                None => "nothing".into(),
            }
        }
    }
}

/// Runs `table` from nothing known, checking each row; returns the knowledge as published.
fn run(table: &[(Step, &str)]) -> Status {
    let mut k = Knowledge::new(false);
    for (row, (step, expected)) in table.iter().enumerate() {
        assert_eq!(apply(&mut k, step), *expected, "row {row}");
    }
    let mut status = Status::default();
    k.publish(&mut status);
    status
}

#[test]
fn a_restart_loses_the_position_until_the_new_process_reports_a_backup() {
    let s = run(&[
        (Step::Page(Some(1.0), &[("0b", 10)]), "at 0b"),
        (Step::Page(Some(1.0), &[("0c", 20)]), "at 0c"),
        (
            Step::Page(Some(2.0), &[]),
            "lost: litestream restarted and has not reported a backup since; forget",
        ),
        // The first reason stays: a page without samples after it says less.
        (Step::Page(Some(2.0), &[]), "forget"),
        (
            Step::Page(Some(2.0), &[("0c", 20)]),
            "found (was: litestream restarted and has not reported a backup since); at 0c",
        ),
    ]);
    assert_eq!(s.backup_unknown, None);
    assert_eq!(s.newest_backup.map(|(w, _)| w).as_deref(), Some("0c"));
    // A restart seen on a page that already reports a backup is said as such.
    run(&[
        (Step::Page(Some(1.0), &[("0b", 10)]), "at 0b"),
        (Step::Page(Some(2.0), &[("0c", 20)]), "restarted; at 0c"),
    ]);
}

#[test]
fn a_page_without_samples_or_unreadable_loses_the_position_only_once_a_backup_was_known() {
    let s = run(&[
        (Step::Unreadable, "nothing"),
        (Step::Page(None, &[]), "nothing"),
        (Step::Page(None, &[("0b", 10)]), "at 0b"),
        // Unreadable says nothing of the backup itself: the registry keeps it.
        (
            Step::Unreadable,
            "lost: its page cannot be read: connection refused",
        ),
        (Step::Page(None, &[]), "forget"),
    ]);
    assert_eq!(
        s.backup_unknown.as_deref(),
        Some("its page cannot be read: connection refused")
    );
}

#[test]
fn a_gauge_that_goes_back_is_a_regression_until_it_reaches_its_highest_again() {
    let s = run(&[
        (Step::Page(None, &[("0c", 10)]), "at 0c"),
        (Step::Page(None, &[("0a", 20)]), "at 0a regressed 0c->0a"),
        (Step::Page(None, &[("0b", 30)]), "at 0b"),
    ]);
    assert_eq!(s.backup_regressed, Some(("0c".into(), "0b".into())));
    assert_eq!(s.highest_backup.as_deref(), Some("0c"));
    let s = run(&[
        (Step::Page(None, &[("0c", 10)]), "at 0c"),
        (Step::Page(None, &[("0a", 20)]), "at 0a regressed 0c->0a"),
        (Step::Page(None, &[("0d", 30)]), "at 0d recovered 0c->0d"),
    ]);
    assert_eq!(s.backup_regressed, None);
}

#[test]
fn a_resync_forgets_the_old_replica_and_its_samples() {
    let s = run(&[
        (Step::Replica("v1", 0), "nothing"),
        (Step::Page(None, &[("0b", 10)]), "at 0b"),
        (Step::Purged("0b"), "nothing"),
        (Step::Replica("v1", 50), "nothing"),
        (Step::Replica("v2", 100), "reset from v1"),
        // Uploaded before the reset: of the old replica.
        (Step::Page(None, &[("0c", 90)]), "nothing"),
        (Step::Page(None, &[("0c", 110)]), "at 0c"),
    ]);
    assert_eq!(s.replica_version.as_deref(), Some("v2"));
    assert_eq!(s.replica_reset, Some(("v1".into(), "v2".into(), at(100))));
    assert_eq!(s.last_purge, None, "the old replica's purge is forgotten");
    assert_eq!(s.highest_backup.as_deref(), Some("0c"));
}

#[test]
fn the_first_gauge_after_a_start_below_the_last_purge_is_said_and_stands_until_the_gauge_passes_it()
{
    let s = run(&[
        (
            Step::Resumed {
                last_purge: Some("0c"),
                highest: Some("0c"),
                replica: Some("v1"),
            },
            "nothing",
        ),
        (
            Step::Page(None, &[("0b", 10)]),
            "at 0b regressed 0c->0b below purge 0c>0b",
        ),
        // Not the first page any more: still below, not said again.
        (Step::Page(None, &[("0b", 10)]), "at 0b"),
    ]);
    assert_eq!(s.backup_below_purge, Some(("0c".into(), "0b".into())));
    assert_eq!(s.last_purge.map(|p| p.before).as_deref(), Some("0c"));
    let s = run(&[
        (
            Step::Resumed {
                last_purge: Some("0c"),
                highest: Some("0c"),
                replica: Some("v1"),
            },
            "nothing",
        ),
        (
            Step::Page(None, &[("0b", 10)]),
            "at 0b regressed 0c->0b below purge 0c>0b",
        ),
        (Step::Page(None, &[("0d", 20)]), "at 0d recovered 0c->0d"),
    ]);
    assert_eq!(s.backup_below_purge, None);
}

#[test]
fn memory_of_another_replica_is_left_out() {
    let s = run(&[
        (Step::Replica("v2", 0), "nothing"),
        (
            Step::Resumed {
                last_purge: Some("0c"),
                highest: Some("0c"),
                replica: Some("v1"),
            },
            "other replica v1, now v2",
        ),
    ]);
    assert_eq!(s.last_purge, None);
    assert_eq!(s.highest_backup, None);
    assert_eq!(s.replica_version.as_deref(), Some("v2"));
    // Of the same replica, or read before the change DB answered: taken in.
    let s = run(&[(
        Step::Resumed {
            last_purge: Some("0c"),
            highest: Some("0d"),
            replica: Some("v1"),
        },
        "nothing",
    )]);
    assert_eq!(s.replica_version.as_deref(), Some("v1"));
    assert_eq!(s.highest_backup.as_deref(), Some("0d"));
}

#[test]
fn proofs_stand_for_their_replica_and_fall_with_a_failed_drill() {
    let broken = Failure::Nothing {
        stderr: "no backups".into(),
    };
    let less = Failure::RestoredLess {
        claimed: "0d".into(),
        restored: "0b".into(),
        generation: None,
        by: "litestream's gauge",
    };
    run(&[
        (Step::Replica("v1", 0), "nothing"),
        (Step::Proof(None, None), "nothing"),
        (Step::Proof(None, Some(("0b", "v1", None, 10))), "at 0b"),
        (
            Step::Proof(Some(broken.clone()), None),
            "lost: the last restore drill failed: the restore produced no database (litestream found no backup \
             to restore): no backups; forget",
        ),
        (
            Step::Proof(None, Some(("0c", "v1", None, 20))),
            "found (was: the last restore drill failed: the restore produced no database (litestream found no \
             backup to restore): no backups); at 0c",
        ),
        // Restoring less than claimed holds cleanup by a reason of its own: the position stands.
        (Step::Proof(Some(less), None), "nothing"),
        (
            Step::Proof(None, Some(("0d", "v0", None, 30))),
            "lost: the last drill's proof is of another replica version; forget",
        ),
    ]);
}

#[test]
fn a_running_purge_stops_when_the_gauge_or_the_proof_falls() {
    let mut k = Knowledge::new(false);
    k.on_page(&page(Some(1.0), &[("0c", 10)]));
    let watch = k.gauge_watch();
    let steady = watch.judge_page(Ok(&page(Some(1.0), &[("0c", 10), ("0d", 20)])));
    assert_eq!((steady.moved, steady.saw.as_deref()), (None, Some("0d")));
    let back = watch.judge_page(Ok(&page(Some(1.0), &[("0b", 30)])));
    assert_eq!(back.moved.as_deref(), Some("it went back from 0c to 0b"));
    assert_eq!(back.saw.as_deref(), Some("0b"), "reservations pin at it");
    assert!(!back.forget_backup);
    let restarted = watch.judge_page(Ok(&page(Some(2.0), &[("0c", 10)])));
    assert_eq!(restarted.moved.as_deref(), Some("litestream restarted"));
    assert!(restarted.forget_backup);
    let empty = watch.judge_page(Ok(&page(Some(1.0), &[])));
    assert!(empty.forget_backup && empty.moved.is_some());
    let unreadable = watch.judge_page(Err("timed out".into()));
    assert_eq!(
        (unreadable.moved.as_deref(), unreadable.forget_backup),
        (Some("its page cannot be read: timed out"), false)
    );
    let proof = |watermark: &str| Proof {
        watermark: watermark.into(),
        replica_version: "v1".into(),
        generation: None,
        started: at(0),
        finished: at(1),
        restore_took: Duration::ZERO,
        check_took: Duration::ZERO,
        bytes: 0,
    };
    assert_eq!(watch.judge_proof(None, Some(&proof("0c"))).moved, None);
    assert_eq!(
        watch.judge_proof(None, Some(&proof("0b"))).moved.as_deref(),
        Some("a restore drill proved only 0b (below 0c)")
    );
    let failed = watch.judge_proof(Some(&Failure::Timeout(Duration::from_secs(1))), None);
    assert!(failed.moved.is_some() && failed.forget_backup);
}

#[test]
fn the_purger_lock_moving_is_said_once_each_way() {
    let mut k = Knowledge::new(false);
    let moves: Vec<LockMove> = [false, false, true, true, false]
        .into_iter()
        .map(|standby| k.on_lock(standby))
        .collect();
    assert_eq!(
        moves,
        [
            LockMove::Took,
            LockMove::Same,
            LockMove::Lost,
            LockMove::Same,
            LockMove::Took
        ]
    );
    assert_eq!(Knowledge::new(false).on_lock(true), LockMove::Lost);
}

#[test]
fn a_purge_is_kept_in_one_form_and_published_with_what_it_did() {
    let s = run(&[
        (Step::Page(None, &[("0b", 10), ("0c", 20)]), "at 0c"),
        (Step::Purged("0b"), "nothing"),
    ]);
    assert_eq!(s.last_purged(), Some("0b"));
    let purge = s.last_purge.expect("published");
    assert_eq!(purge.before, "0b");
    assert_eq!(purge.backed_up_at, Some(at(10)));
    assert_eq!(purge.run.map(|r| r.rows), Some(10));
    assert_eq!(
        s.backups_tracked, 2,
        "the backup at the purge stays tracked"
    );
}

#[test]
fn the_policy_hears_the_memory_kept_only_once_the_loop_has_taken_it_in() {
    use super::gather::memory_guard;
    use crate::cleanup::Memory;
    // The keeper says "kept" before it hands the memory over: a check in between holds as while loading.
    assert_eq!(memory_guard(Memory::Kept, false, false), Memory::Loading);
    assert_eq!(memory_guard(Memory::Kept, true, false), Memory::Kept);
    assert_eq!(memory_guard(Memory::Kept, true, true), Memory::Unreadable);
    assert_eq!(
        memory_guard(Memory::Unwritable, false, true),
        Memory::Unwritable
    );
    let mut k = Knowledge::new(false);
    assert!(!k.resumed());
    k.on_resumed(&Resumed::default(), at(0));
    assert!(k.resumed());
}
