use super::*;
use crate::cleanup::status::HeldSince;
use crate::cleanup::subscribers::SubscriberInfo;
use crate::cleanup::{Bound, HoldReason};
use crate::cleanup::{LastPurge, PurgeRun};
use crate::ops::status_cli::render;
use crate::protocol::Mode;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A sidecar up for an hour, held for 5 minutes by a subscriber behind the backup, after a purge 10 minutes ago.
fn inputs(now: Instant, wall_now: SystemTime) -> ReportInputs {
    let status = Status {
        checks: 60,
        standby: Some(true),
        memory: crate::cleanup::Memory::Unwritable,
        state_problem: Some("cannot write /var/lib/x/state.json: denied".into()),
        last_decision: Some(Decision::Hold(HoldReason::SubscriberBehind)),
        held_since: Some(HeldSince {
            reason: HoldReason::SubscriberBehind,
            since: now - secs(300),
            since_wall: wall_now - secs(300),
        }),
        purges: 1,
        purged_rows: 42,
        last_purge: Some(LastPurge {
            before: "0c".into(),
            backed_up_at: Some(wall_now - secs(700)),
            run: Some(PurgeRun {
                bound: "the newest aged backup".into(),
                rows: 42,
                completed_at: wall_now - secs(600),
            }),
        }),
        newest_backup: Some(("0f".into(), wall_now - secs(90))),
        recent_backups: vec![
            Backup {
                watermark: "0f".into(),
                backed_up_at: wall_now - secs(90),
            },
            Backup {
                watermark: "0c".into(),
                backed_up_at: wall_now - secs(700),
            },
        ],
        backups_tracked: 2,
        change_log: Some(crate::cleanup::status::ChangeLogReading {
            size: crate::cleanup::change_db::ChangeLogSize {
                rows: 1234,
                exact: true,
            },
            read_at: wall_now - secs(20),
        }),
        ..Status::default()
    };
    ReportInputs {
        status,
        reservations: vec![
            Reservation {
                task_id: "restore-7".into(),
                started: now - secs(45),
                floor: Some("0c".into()),
                kept: false,
                withheld: Some("log_past_backup"),
            },
            Reservation {
                task_id: "restore-6".into(),
                started: now - secs(30),
                floor: Some("0b".into()),
                kept: true,
                withheld: None,
            },
        ],
        subscribers: vec![
            SubscriberView {
                info: SubscriberInfo {
                    id: "vs-slow".into(),
                    task_id: Some("task-1".into()),
                    mode: Mode::Serving,
                    replica_version: "01".into(),
                    watermark: "0b".into(),
                },
                acked: "0d".into(),
                connected: now - secs(1800),
                departed: None,
                unacked_since: Some(now - secs(75)),
            },
            SubscriberView {
                info: SubscriberInfo {
                    id: "vs-gone".into(),
                    task_id: None,
                    mode: Mode::Backup,
                    replica_version: "01".into(),
                    watermark: "0e".into(),
                },
                acked: "0g".into(),
                connected: now - secs(900),
                departed: Some(now - secs(10)),
                unacked_since: None,
            },
        ],
        newest_commit: Some(("0g".into(), now - secs(2))),
        upstream: UpstreamHealth::default(),
        upstream_address: "127.0.0.1:4849".into(),
        protocols: crate::protocol::versions::Known {
            versions: Some(4..=6),
            source: Some(crate::protocol::versions::Source::Probe),
            since: Some(wall_now - secs(600)),
            ..Default::default()
        },
        protocols_fixed: false,
        proxy_mode: Default::default(),
        cleanup_enabled: true,
        cleanup_delay: secs(120),
        started: now - secs(3600),
    }
}

pub(crate) fn report() -> Report {
    let now = Instant::now();
    let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
    build(&inputs(now, wall_now), now, wall_now)
}

#[test]
fn the_report_says_who_holds_cleanup_and_since_when() {
    let report = report();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["cleanup"]["decision"], "hold");
    assert_eq!(json["cleanup"]["hold_reason"], "subscriber_behind");
    assert_eq!(json["cleanup"]["held_since"], "2025-06-15T15:01:40Z");
    assert_eq!(json["cleanup"]["held_seconds"], 300.0);
    assert_eq!(json["cleanup"]["delay_seconds"], 120.0);
    assert_eq!(json["backups"][0]["watermark"], "0f");
    assert_eq!(json["backups"][0]["current"], true);
    assert_eq!(json["backups"][0]["age_seconds"], 90.0);
    assert_eq!(json["backups"][1]["current"], false);
    assert_eq!(json["reservations"][0]["task_id"], "restore-7");
    assert_eq!(json["reservations"][0]["age_seconds"], 45.0);
    assert_eq!(json["reservations"][0]["floor"], "0c");
    assert_eq!(json["reservations"][0]["kept"], false);
    assert_eq!(json["reservations"][0]["withheld"], "log_past_backup");
    assert_eq!(json["reservations"][1]["task_id"], "restore-6");
    assert_eq!(json["reservations"][1]["kept"], true);
    assert_eq!(json["reservations"][1]["withheld"], serde_json::Value::Null);
    let slow = &json["subscribers"][0];
    assert_eq!(
        (
            &slow["id"],
            &slow["state"],
            &slow["caught_up"],
            &slow["lag_seconds"]
        ),
        (
            &"vs-slow".into(),
            &"connected".into(),
            &false.into(),
            &75.0.into()
        )
    );
    let gone = &json["subscribers"][1];
    assert_eq!(gone["state"], "departed");
    assert_eq!(gone["departed_seconds"], 10.0);
    assert_eq!(gone["caught_up"], true);
    assert_eq!(json["last_purge"]["before"], "0c");
    assert_eq!(json["last_purge"]["rows"], 42);
    assert_eq!(json["last_purge"]["age_seconds"], 600.0);
    assert_eq!(json["change_log"]["rows"], 1234);
    assert_eq!(json["change_log"]["exact"], true);
    assert_eq!(json["upstream"]["up"], true);
    let protocols = &json["upstream"]["protocols"];
    assert_eq!(protocols["setting"], "auto");
    assert_eq!(
        (&protocols["min"], &protocols["max"]),
        (&4.into(), &6.into())
    );
    assert_eq!(protocols["source"], "probe");
    assert_eq!(protocols["since"], "2025-06-15T14:56:40Z");
    assert_eq!(protocols["probe_error"], serde_json::Value::Null);
    assert_eq!(json["newest_commit"]["watermark"], "0g");
    assert_eq!(json["unservable"], serde_json::json!([]));
}

/// A refusal is a top-level field, with what was found, why, what to do and since when, and the keepalive text
/// (`cleanup.problem`) leads with it.
#[test]
fn a_refused_deployment_says_why_and_since_when() {
    use crate::cleanup::unservable::{of_replicas, Reason, ReplicaRow};
    let now = Instant::now();
    let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
    let mut inputs = inputs(now, wall_now);
    let found = of_replicas(
        r#""zero_0"."replicas""#,
        &[ReplicaRow {
            id: "r2".into(),
            backup_path: Some("1761".into()),
            backup_v5: true,
        }],
    );
    inputs
        .status
        .unservable
        .set(Reason::BackupPath, found, wall_now - secs(300));
    inputs.status.last_decision = Some(Decision::Hold(HoldReason::Unservable));
    let json = serde_json::to_value(build(&inputs, now, wall_now)).unwrap();
    let refused = &json["unservable"][0];
    assert_eq!(refused["reason"], "backup_path", "{json:#}");
    assert_eq!(
        refused["detail"],
        r#"Zero records per-replica or v5 backups in "zero_0"."replicas": replica "r2" (backupPath "1761", backupV5 true)"#
    );
    assert!(refused["why"]
        .as_str()
        .unwrap()
        .contains("per-replica path"));
    assert!(refused["remedy"]
        .as_str()
        .unwrap()
        .contains("unset ZERO_LITESTREAM_BACKUP_USING_V5"));
    assert_eq!(refused["since"], "2025-06-15T15:01:40Z");
    assert_eq!(refused["since_seconds"], 300.0);
    assert_eq!(json["unservable"].as_array().unwrap().len(), 1);
    assert_eq!(json["cleanup"]["hold_reason"], "unservable");
    let problem = json["cleanup"]["problem"].as_str().unwrap();
    assert!(problem.starts_with("refused (backup_path): "), "{problem}");
}

#[test]
fn the_gauges_backup_is_listed_even_when_no_longer_tracked() {
    let now = Instant::now();
    let wall_now = SystemTime::now();
    let mut inputs = inputs(now, wall_now);
    inputs.status.recent_backups.clear();
    inputs.status.newest_backup = Some(("0a".into(), wall_now - secs(5)));
    let report = build(&inputs, now, wall_now);
    assert_eq!(report.backups.len(), 1);
    assert!(report.backups[0].current);
}

#[test]
fn a_purge_decision_has_its_bound_and_no_hold() {
    let now = Instant::now();
    let wall_now = SystemTime::now();
    let mut inputs = inputs(now, wall_now);
    inputs.status.last_decision = Some(Decision::Purge {
        before: "0d".into(),
        bound: Bound::Reservation {
            task_id: "restore-7".into(),
            floor: "0d".into(),
        },
    });
    inputs.status.held_since = None;
    let cleanup = build(&inputs, now, wall_now).cleanup.unwrap();
    assert_eq!(cleanup.decision, "purge");
    assert_eq!(cleanup.purge_before.as_deref(), Some("0d"));
    assert_eq!(
        cleanup.purge_bound.as_deref(),
        Some("reservation restore-7 at floor 0d")
    );
    assert_eq!((cleanup.hold_reason, cleanup.held_since), (None, None));
}

/// With `backup.verify` on, each claim says whether the destination covers it, and the destination is shown.
#[test]
fn claims_say_whether_the_destination_holds_them() {
    let now = Instant::now();
    let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
    let mut inputs = inputs(now, wall_now);
    inputs.status.backup = crate::cleanup::status::BackupStatus {
        verifying: true,
        // The chain's newest object was written 5 minutes ago: it covers the claim of 11m 40s ago, not the one of
        // 1m 30s ago.
        listing: Some(crate::litestream::destination::Listing {
            objects: 3,
            newest: Some(wall_now - secs(300)),
            layout: crate::litestream::layout::Layout::Restorable(
                crate::litestream::layout::Chain {
                    generation: "6876d0f712825346".into(),
                    snapshot_index: 0,
                    last_index: 1,
                    newest: wall_now - secs(300),
                    objects: 3,
                },
            ),
            uploads: Default::default(),
        }),
        stale: Some((Some(wall_now - secs(300)), wall_now - secs(90))),
        ..Default::default()
    };
    let report = build(&inputs, now, wall_now);
    let verified: Vec<_> = report.backups.iter().map(|b| b.verified).collect();
    assert_eq!(verified, [Some(false), Some(true)]);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["destination"]["objects"], 3);
    assert_eq!(json["destination"]["stale"], true);
    assert_eq!(json["destination"]["layout"], "restorable");
    assert_eq!(json["destination"]["last_wal_index"], 1);
    let text = render(&report);
    for needle in [
        "0f         2025-06-15T15:05:10Z  1m 30s   NO              current",
        "0c         2025-06-15T14:55:00Z  11m 40s  yes",
        "destination: 3 objects, newest object 2025-06-15T15:01:40Z (5m ago); STALE",
        "layout: generation 6876d0f712825346, snapshot 00000000, WAL to index 00000001, a restore reaches \
         2025-06-15T15:01:40Z",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
    // Verification off: no verdicts, no destination.
    let report = build(&self::inputs(now, wall_now), now, wall_now);
    assert!(report.backups.iter().all(|b| b.verified.is_none()));
    assert_eq!(report.destination, None);
}

/// The latest drill and the latest proof, as JSON and as the `DRILLS` table.
#[test]
fn drills_show_the_proven_watermark_and_the_latest_failure() {
    use crate::cleanup::status::{DrillOutcome, DrillStatus};
    use crate::litestream::drill::{Failure, Proof};
    let now = Instant::now();
    let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
    let mut inputs = inputs(now, wall_now);
    let proof = Proof {
        watermark: "0f".into(),
        replica_version: "01".into(),
        generation: Some("6876d0f712825346".into()),
        started: wall_now - secs(3700),
        finished: wall_now - secs(3600),
        restore_took: secs(90),
        check_took: secs(10),
        bytes: 1 << 30,
    };
    inputs.status.drills = DrillStatus {
        interval: Some(secs(3600)),
        drives_cleanup: true,
        last: Some(DrillOutcome::Failed {
            failure: Failure::Restore {
                status: "exit status: 1".into(),
                stderr: "no snapshots available".into(),
            },
            started: wall_now - secs(70),
            finished: wall_now - secs(60),
        }),
        last_proof: Some(proof),
        runs: 2,
        failures: [("restore", 1)].into_iter().collect(),
        ..DrillStatus::default()
    };
    let report = build(&inputs, now, wall_now);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["drills"]["last"]["ok"], false);
    assert_eq!(json["drills"]["last"]["error_kind"], "restore");
    assert_eq!(json["drills"]["last_proof"]["proven_watermark"], "0f");
    assert_eq!(json["drills"]["last_proof"]["bytes"], 1u64 << 30);
    assert_eq!(json["drills"]["failures"], 1);
    let text = render(&report);
    for needle in [
        "DRILLS (every 1h, 2 run, 1 failed; proofs drive cleanup)",
        "last:   FAILED at 2025-06-15T15:05:40Z (1m ago): litestream restore exited with exit status: 1: no \
         snapshots available",
        "proven: restored watermark 0f at 2025-06-15T14:06:40Z (1h ago): restore 1m 30s, check 10s, 1073741824 bytes",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
}

#[test]
fn the_upstreams_protocols_say_whether_they_are_configured_learned_or_unknown() {
    let now = Instant::now();
    let wall_now = SystemTime::UNIX_EPOCH + secs(1_750_000_000);
    let mut inputs = inputs(now, wall_now);
    inputs.protocols_fixed = true;
    inputs.protocols.source = Some(crate::protocol::versions::Source::Config);
    let protocols = build(&inputs, now, wall_now)
        .upstream
        .unwrap()
        .protocols
        .unwrap();
    assert_eq!(protocols.setting, "4..6");
    assert_eq!(protocols.source.as_deref(), Some("config"));
    inputs.protocols_fixed = false;
    inputs.protocols = crate::protocol::versions::Known {
        probe_error: Some("upstream 127.0.0.1:4849 unreachable: refused".into()),
        ..Default::default()
    };
    let protocols = build(&inputs, now, wall_now)
        .upstream
        .unwrap()
        .protocols
        .unwrap();
    assert_eq!(protocols.setting, "auto");
    assert_eq!((protocols.min, protocols.max), (None, None));
    assert_eq!(
        protocols.probe_error.as_deref(),
        Some("upstream 127.0.0.1:4849 unreachable: refused")
    );
}

#[test]
fn every_slot_of_the_shard_is_listed_with_the_one_that_bounds_purges() {
    use crate::cleanup::slots::{Slot, SlotKind, SlotLimit, SlotName};
    let now = Instant::now();
    let wall_now = SystemTime::now();
    let mut inputs = inputs(now, wall_now);
    let slot = |kind, key: &str, floor: Option<&str>, holder: &str, connected| Slot {
        kind,
        key: key.into(),
        task_id: None,
        subscriber_id: None,
        floor: floor.map(Into::into),
        replica_version: Some("01".into()),
        holder: holder.into(),
        connected,
        age: secs(4000),
        since_heartbeat: secs(3),
        restore_limit: None,
        live: true,
    };
    inputs.status.holder = "host-a/7/1".into();
    inputs.status.slots = vec![
        slot(
            SlotKind::Reservation,
            "vs-9",
            Some("0a"),
            "host-b/8/2",
            false,
        ),
        slot(
            SlotKind::Subscriber,
            "host-a/7/1#3",
            Some("0e"),
            "host-a/7/1",
            true,
        ),
    ];
    inputs.status.bounding_slot = Some(SlotLimit::Below {
        floor: "0a".into(),
        slot: SlotName {
            kind: SlotKind::Reservation,
            key: "vs-9".into(),
            holder: "host-b/8/2".into(),
        },
    });
    let report = build(&inputs, now, wall_now);
    assert_eq!(report.slots.len(), 2);
    assert_eq!(
        (
            report.slots[0].holder.as_str(),
            report.slots[0].this,
            report.slots[0].connected,
            report.slots[0].restore_limit_seconds
        ),
        ("host-b/8/2", false, false, None)
    );
    assert!(report.slots[1].this);
    let bound = report.slot_bound.clone().unwrap();
    assert_eq!(
        (bound.key.as_str(), bound.floor.as_deref(), bound.problem),
        ("vs-9", Some("0a"), None)
    );
    // The document reads back as it was written.
    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
    let text = render(&report);
    assert!(
        text.contains("SLOTS (2 live of 2, in the change DB; this sidecar is host-a/7/1)"),
        "{text}"
    );
    assert!(text.contains("host-a/7/1 (this)"), "{text}");
    assert!(text.contains("closed, kept"), "{text}");
    assert!(
        text.contains("bounding purges: reservation vs-9 held by host-b/8/2, at 0a"),
        "{text}"
    );
}
