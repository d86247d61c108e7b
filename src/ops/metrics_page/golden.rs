//! Whole pages for a few states, compared with the pages kept in `golden/`: a change to how figures are read must
//! leave every name, help text, label and value as it was, and a new metric shows in the kept pages' diff. Series
//! within a family come in hash order, so each family's samples are compared sorted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::*;
use crate::cleanup::change_db::{ChangeLogSize, FailureClass};
use crate::cleanup::slots::{Slot, SlotKind, SlotLimit, SlotName};
use crate::cleanup::status::{
    BackupStatus, ChangeLogReading, DrillOutcome, DrillStatus, HeldSince, PurgeFailure,
    PurgeFailures, Status,
};
use crate::cleanup::unservable::{Reason, Unservable};
use crate::cleanup::{HoldReason, LastPurge, Memory, PurgeRun};
use crate::litestream::destination::{ErrorKind, Listing};
use crate::litestream::drill::{Failure, Proof};
use crate::litestream::layout::{Chain, Layout};
use crate::ops::metrics::Direction;

fn at(seconds: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs_f64(seconds)
}

/// The page with each family's samples sorted.
pub(super) fn canonical(text: &str) -> String {
    let mut out = Vec::new();
    let mut samples: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort_unstable();
            out.append(&mut samples);
            out.push(line);
        } else {
            samples.push(line);
        }
    }
    samples.sort_unstable();
    out.append(&mut samples);
    let mut page = out.join("\n");
    page.push('\n');
    page
}

struct Case {
    name: &'static str,
    instruments: Instruments,
    status: Status,
    handles: HandleFigures,
    /// The wall clock at the scrape.
    wall: SystemTime,
    /// How long the hold in force has held at the scrape.
    held_for: Duration,
}

fn proof(watermark: &str, finished: f64) -> Proof {
    Proof {
        watermark: watermark.into(),
        replica_version: "01".into(),
        generation: Some("6876d0f712825346".into()),
        started: at(finished - 20.0),
        finished: at(finished),
        restore_took: Duration::from_millis(12_500),
        check_took: Duration::from_millis(3_250),
        bytes: 1_048_576,
    }
}

fn slot(kind: SlotKind, key: &str, holder: &str, connected: bool, age: u64, live: bool) -> Slot {
    Slot {
        kind,
        key: key.into(),
        task_id: None,
        subscriber_id: None,
        floor: Some("0a".into()),
        replica_version: Some("01".into()),
        holder: holder.into(),
        connected,
        age: Duration::from_secs(age),
        since_heartbeat: Duration::from_secs(1),
        restore_limit: None,
        live,
    }
}

fn busy_instruments() -> Instruments {
    let instruments = Instruments::default();
    instruments.reservation_seconds.observe(3.0);
    instruments.reservation_seconds.observe(100.0);
    instruments
        .relay_counters(Direction::Downstream)
        .relayed(2, 500);
    instruments
        .relay_counters(Direction::Upstream)
        .relayed(1, 9);
    instruments.upstream_connect_errors.inc();
    instruments.relay_write_stalls.inc_by(2);
    instruments
        .connections_refused
        .get_or_create(&crate::net::admission::Refusal::NotAllowed.label())
        .inc_by(3);
    instruments.tls_reloaded(true);
    instruments.tls_reloaded(false);
    instruments
}

/// Everything known: every optional family has its series.
fn rich(since: Instant) -> Case {
    let mut status = Status {
        checks: 40,
        purges: 4,
        purged_rows: 12345,
        scrape_errors: 1,
        newest_backup: Some(("718sh0nk8".into(), at(1_750_000_100.0))),
        purge_failures: PurgeFailures {
            consecutive: 3,
            total: 9,
            last: Some(PurgeFailure {
                class: FailureClass::Permission,
                sqlstate: Some("42501".into()),
                message: "permission denied".into(),
            }),
        },
        holds: [(HoldReason::NoSubscribers, 7), (HoldReason::Standby, 2)]
            .into_iter()
            .collect(),
        held_since: Some(HeldSince {
            reason: HoldReason::SubscriberBehind,
            since,
            since_wall: at(1_750_000_047.0),
        }),
        last_purge: Some(LastPurge {
            before: "0a".into(),
            backed_up_at: Some(at(1_749_999_000.0)),
            run: Some(PurgeRun {
                bound: "backup".into(),
                rows: 100,
                completed_at: at(1_750_000_000.25),
            }),
        }),
        change_log: Some(ChangeLogReading {
            size: ChangeLogSize {
                rows: 1234,
                exact: true,
            },
            read_at: at(1_750_000_140.0),
        }),
        backup: BackupStatus {
            verifying: true,
            listing: Some(Listing {
                objects: 3,
                newest: Some(at(1_746_600_000.5)),
                layout: Layout::Restorable(Chain {
                    generation: "6876d0f712825346".into(),
                    snapshot_index: 0,
                    last_index: 1,
                    newest: at(1_746_600_000.5),
                    objects: 2,
                }),
                uploads: Default::default(),
            }),
            verified: false,
            stale: Some((Some(at(1_746_600_000.5)), at(1_750_000_100.0))),
            errors: [(ErrorKind::Timeout, 2)].into_iter().collect(),
            failing: None,
        },
        standby: Some(true),
        memory: Memory::Kept,
        slots: vec![
            // Open here: not kept.
            slot(SlotKind::Reservation, "a", "us", true, 7200, true),
            // Closed here, kept across a restart, or another sidecar's: kept.
            slot(SlotKind::Reservation, "b", "us", false, 60, true),
            slot(SlotKind::Reservation, "c", "them", true, 100, true),
            // Not live: neither counted nor kept.
            slot(SlotKind::Reservation, "d", "them", false, 9000, false),
            slot(SlotKind::Subscriber, "us#1", "us", true, 30, true),
        ],
        bounding_slot: Some(SlotLimit::Malformed {
            slot: SlotName {
                kind: SlotKind::Reservation,
                key: "c".into(),
                holder: "them".into(),
            },
            problem: "not a watermark".into(),
        }),
        holder: "us".into(),
        backup_unknown: Some("litestream restarted".into()),
        backup_below_purge: Some(("0a".into(), "09".into())),
        drills: DrillStatus {
            interval: Some(Duration::from_secs(3600)),
            running_since: Some(at(1_750_000_130.0)),
            last: Some(DrillOutcome::Failed {
                failure: Failure::Check {
                    check: "quick_check",
                    detail: "row 3 missing from index".into(),
                },
                started: at(1_750_000_000.0),
                finished: at(1_750_000_050.0),
            }),
            last_proof: Some(proof("0b", 1_749_990_000.5)),
            runs: 5,
            failures: [("check", 2), ("restored_less", 1)].into_iter().collect(),
            restored_less: Some(Failure::RestoredLess {
                claimed: "0c".into(),
                restored: "0b".into(),
                generation: None,
                by: "gauge",
            }),
            ..Default::default()
        },
        ..Status::default()
    };
    for reason in [Reason::Ltx, Reason::LogNotWritten] {
        let found = Unservable {
            reason,
            detail: "found".into(),
        };
        status
            .unservable
            .set(reason, Some(found), at(1_750_000_000.0));
    }
    Case {
        name: "rich",
        instruments: busy_instruments(),
        status,
        handles: HandleFigures {
            reservations_open: 2,
            cleanup_delay: Duration::from_secs(45),
            subscribers: 3,
            registered: Some(true),
            change_db_up: true,
            upstream_up: false,
            connections_open: 0,
            max_connections: 16384,
        },
        wall: at(1_750_000_142.5),
        held_for: Duration::from_secs_f64(95.5),
    }
}

/// Nothing known yet, discovery off.
fn empty(_: Instant) -> Case {
    Case {
        name: "empty",
        instruments: Instruments::default(),
        status: Status::default(),
        handles: HandleFigures {
            reservations_open: 0,
            cleanup_delay: Duration::from_secs(30),
            subscribers: 0,
            // Discovery off.
            registered: None,
            change_db_up: false,
            upstream_up: true,
            connections_open: 0,
            max_connections: 100,
        },
        wall: at(1_750_000_000.0),
        held_for: Duration::ZERO,
    }
}

/// The other side of each rule: a listing without objects, a purge remembered from an earlier run, a backup dated
/// after the scrape, a proof as the latest drill, this sidecar the purger, its memory loading.
fn partial(since: Instant) -> Case {
    let proved = proof("0d", 1_750_000_050.0);
    let status = Status {
        newest_backup: Some(("0d".into(), at(1_750_000_200.0))),
        purge_failures: PurgeFailures {
            consecutive: 0,
            total: 2,
            last: None,
        },
        held_since: Some(HeldSince {
            reason: HoldReason::NoSubscribers,
            since,
            since_wall: at(1_750_000_000.0),
        }),
        last_purge: Some(LastPurge::remembered("0c")),
        change_log: Some(ChangeLogReading {
            size: ChangeLogSize {
                rows: 250_000,
                exact: false,
            },
            read_at: at(1_750_000_000.0),
        }),
        backup: BackupStatus {
            verifying: true,
            listing: Some(Listing {
                objects: 0,
                newest: None,
                layout: Layout::Empty,
                uploads: Default::default(),
            }),
            verified: true,
            ..Default::default()
        },
        standby: Some(false),
        memory: Memory::Loading,
        bounding_slot: Some(SlotLimit::Clear),
        drills: DrillStatus {
            interval: None,
            last: Some(DrillOutcome::Proved(proved.clone())),
            last_proof: Some(proved),
            runs: 1,
            ..Default::default()
        },
        ..Status::default()
    };
    Case {
        name: "partial",
        instruments: Instruments::default(),
        status,
        handles: HandleFigures {
            reservations_open: 1,
            cleanup_delay: Duration::from_secs(600),
            subscribers: 0,
            // Another address is registered.
            registered: Some(false),
            change_db_up: true,
            upstream_up: true,
            connections_open: 0,
            max_connections: 16384,
        },
        wall: at(1_750_000_100.0),
        held_for: Duration::from_secs(3),
    }
}

/// `backup.verify` on but nothing listed yet; the latest drill timed out.
fn unlisted(_: Instant) -> Case {
    let status = Status {
        backup: BackupStatus {
            verifying: true,
            errors: [(ErrorKind::Denied, 4)].into_iter().collect(),
            ..Default::default()
        },
        drills: DrillStatus {
            interval: Some(Duration::from_millis(1500)),
            last: Some(DrillOutcome::Failed {
                failure: Failure::Timeout(Duration::from_secs(60)),
                started: at(1_750_000_000.0),
                finished: at(1_750_000_060.0),
            }),
            runs: 1,
            failures: [("timeout", 1)].into_iter().collect(),
            ..Default::default()
        },
        ..Status::default()
    };
    Case {
        name: "unlisted",
        instruments: Instruments::default(),
        status,
        handles: HandleFigures {
            reservations_open: 0,
            cleanup_delay: Duration::from_secs(30),
            subscribers: 1,
            // Nothing registered yet.
            registered: Some(false),
            change_db_up: false,
            upstream_up: true,
            connections_open: 0,
            max_connections: 1,
        },
        wall: at(1_750_000_100.0),
        held_for: Duration::ZERO,
    }
}

const CASES: [fn(Instant) -> Case; 4] = [rich, empty, partial, unlisted];

/// Compares `text` with the kept page of `name`; with `METRICS_GOLDEN_WRITE` set, keeps `text` instead (after a
/// deliberate change to the page: review the diff of `golden/`).
fn check(name: &str, text: &str) {
    let path = format!(
        "{}/src/ops/metrics_page/golden/{name}.prom",
        env!("CARGO_MANIFEST_DIR")
    );
    let page = canonical(text).replace(env!("CARGO_PKG_VERSION"), "@VERSION@");
    if std::env::var_os("METRICS_GOLDEN_WRITE").is_some() {
        std::fs::write(&path, page).unwrap();
        return;
    }
    let kept = std::fs::read_to_string(&path).unwrap();
    if let Some((line, (kept, now))) = kept
        .lines()
        .zip(page.lines())
        .enumerate()
        .find(|(_, (kept, now))| kept != now)
    {
        panic!(
            "{name}: line {} was\n{kept}\nis\n{now}\nin\n{page}",
            line + 1
        );
    }
    assert_eq!(
        kept.lines().count(),
        page.lines().count(),
        "{name}: lines added or lost in\n{page}"
    );
}

#[test]
fn every_page_is_the_kept_one() {
    for case in CASES {
        let since = Instant::now();
        let case = case(since);
        let clock = Clock {
            wall: case.wall,
            now: since + case.held_for,
        };
        check(
            case.name,
            &render(&case.instruments, &case.status, &case.handles, clock),
        );
    }
}
