//! The sidecar itself stopped in the middle of its work: restores in progress lose their reservations with the
//! process, so what protects them after a restart is the cleanup delay, which must survive it.

use std::time::Duration;

use litestream_sidecar::cleanup::state;
use litestream_sidecar::cleanup::{Decision, HoldReason};

use crate::support::pg::TestSchema;
use crate::support::process::{metric, Process};
use crate::support::*;

/// The shard's memory as its row in the change DB has it: the learned cleanup delay (seconds) and the last purge.
async fn shard_row(db: &TestSchema) -> Option<(f64, Option<String>)> {
    db.client
        .query_opt(
            &format!(
                "SELECT extract(epoch FROM cleanup_delay)::float8, last_purge FROM \"{}_0/sidecar\".shard",
                db.app_id
            ),
            &[],
        )
        .await
        .ok()
        .flatten()
        .map(|row| (row.get(0), row.get(1)))
}

#[tokio::test]
async fn a_learned_cleanup_delay_survives_a_restart_and_protects_restores_begun_before_it() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0c", seconds_ago(600.0))])).await;
    let config = || {
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [cleanup]\nreconnect_grace = \"1s\"\n",
            db.config(),
            litestream.url(),
        ))
    };

    // A restore took 45 s (its subscription ended the reservation then): the cleanup delay is now 45 s, and the
    // shard's row in the change DB says so within a check.
    let sidecar = start_aged(config(), Duration::from_secs(600)).await;
    let lease = sidecar.registry.open("vs-1", tokio::time::Instant::now());
    let started = sidecar.registry.open_reservations()[0].started;
    sidecar.registry.end_by_subscription(
        "vs-1",
        sidecar.registry.ticket(),
        started + Duration::from_secs(45),
    );
    drop(lease);
    eventually_async("the learned delay is in the change DB", || async {
        shard_row(&db).await.is_some_and(|(delay, _)| delay == 45.0)
    })
    .await;
    sidecar.stop().await;

    // Restarted 40 s ago: past the configured 30 s but not the learned 45 s. A restore that began before the
    // restart may still run, so cleanup waits, with every row kept.
    let sidecar = start_aged(config(), Duration::from_secs(40)).await;
    eventually("the learned delay is read back", || {
        sidecar.registry.cleanup_delay() == Duration::from_secs(45)
    })
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::StartingUp)
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c", "0d", "0e"]);
    sidecar.stop().await;

    // Once up for the learned delay it purges, and the last purge is kept too.
    let sidecar = start_aged(config(), Duration::from_secs(50)).await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    eventually_async("purged below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    eventually_async("the last purge is in the change DB", || async {
        shard_row(&db).await == Some((45.0, Some("0c".into())))
    })
    .await;
    sidecar.stop().await;

    // The next run resumes after it: nothing at or below it is purged again, and status shows it.
    let sidecar = start_aged(config(), Duration::from_secs(50)).await;
    eventually("the last purge is restored", || {
        sidecar.status.get().last_purged() == Some("0c")
    })
    .await;
    sidecar.stop().await;
    db.drop().await;
}

/// A state file an earlier release left is imported once: its reservations become slots the purge honours, what
/// it remembered becomes the shard's memory, and the file is renamed so that no later start reads it again. A file
/// that cannot be read is left as it is for the operator and imports nothing.
#[tokio::test]
async fn a_state_file_of_an_earlier_release_is_imported_once_and_its_reservations_honoured() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0d", seconds_ago(600.0)),
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    // As the previous release wrote it: a restore in flight pinned at 0b, begun 20 minutes ago, and a delay of
    // 90 s learned.
    std::fs::write(
        &path,
        format!(
            r#"{{"version":2,"cleanup_delay_ms":90000,"last_purge":{{"watermark":"0a","backed_up_at_ms":1}},
                "highest_backup":"0d","replica_version":"1rs",
                "reservations":[{{"task_id":"vs-restoring","floor":"0b","protocol":6,"opened_at_ms":{}}}]}}"#,
            (epoch_now() as u64 - 1200) * 1000
        ),
    )
    .unwrap();
    let sidecar = start_aged(
        with_state(&db, &litestream, &path),
        Duration::from_secs(600),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    // Honoured: it purges below the imported reservation's floor, and no further.
    eventually_async("purged below the imported floor", || async {
        db.watermarks().await == ["0b", "0c", "0d", "0e"]
    })
    .await;
    settles_on(&sidecar, Decision::Hold(HoldReason::ReservationFloor)).await;
    assert_eq!(sidecar.registry.cleanup_delay(), Duration::from_secs(90));
    let status = sidecar.status.get();
    let slot = status
        .slots
        .iter()
        .find(|s| s.key == "vs-restoring")
        .expect("the imported reservation is a slot");
    assert_eq!(slot.floor.as_deref(), Some("0b"));
    assert!(slot.live && !slot.connected);
    assert!(slot.age >= Duration::from_secs(1190), "{:?}", slot.age);
    assert!(!path.exists());
    let imported = dir.path().join("state.json.imported");
    assert!(imported.exists());
    sidecar.stop().await;

    // Restarted with the renamed file beside it: nothing is imported twice, the slot is still there.
    let sidecar = start_aged(
        with_state(&db, &litestream, &path),
        Duration::from_secs(600),
    )
    .await;
    eventually("the slots are read", || {
        sidecar
            .status
            .get()
            .slots
            .iter()
            .any(|s| s.key == "vs-restoring")
    })
    .await;
    let reservations = sidecar
        .status
        .get()
        .slots
        .iter()
        .filter(|s| s.kind == litestream_sidecar::cleanup::slots::SlotKind::Reservation)
        .count();
    assert_eq!(reservations, 1);
    sidecar.stop().await;

    // A corrupt file is left as it is, and imports nothing.
    std::fs::write(&path, "{ not json").unwrap();
    let sidecar = start_aged(
        with_state(&db, &litestream, &path),
        Duration::from_secs(600),
    )
    .await;
    eventually("the slots are read", || {
        !sidecar.status.get().slots.is_empty()
    })
    .await;
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    sidecar.stop().await;
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    db.drop().await;
}

/// Slots that cannot be written hold cleanup, and statuses wait (their reservation's row would not commit), until
/// a write succeeds again.
#[tokio::test]
async fn slots_that_cannot_be_written_hold_cleanup_and_statuses_until_they_can() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    // Nothing below the only backup to purge yet.
    let litestream = MetricsServer::start(&progress_page(&[("0a", seconds_ago(600.0))])).await;
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start_aged(
        with_state(&db, &litestream, &dir.path().join("state.json")),
        Duration::from_secs(600),
    )
    .await;
    eventually("the slots are read", || {
        sidecar.status.get().memory == litestream_sidecar::cleanup::Memory::Kept
    })
    .await;
    // Another session holds the slot table against writes (reads still pass).
    let blocker = crate::support::pg::connect().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{}_0/sidecar\".slots IN EXCLUSIVE MODE",
            db.app_id
        ))
        .await
        .unwrap();
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    eventually("the write fails and says so", || {
        sidecar.status.get().memory == litestream_sidecar::cleanup::Memory::Unwritable
    })
    .await;
    // A backup to purge below: cleanup holds while the slots cannot be written.
    litestream.set_page(&progress_page(&[
        ("0a", seconds_ago(600.0)),
        ("0c", seconds_ago(600.0)),
    ]));
    let decision = decisions(&sidecar, 2).await;
    assert!(
        matches!(
            decision,
            Decision::Hold(HoldReason::StateUnwritable | HoldReason::StateUnreadable)
        ),
        "{decision:?}"
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c", "0d", "0e"]);
    // No status while its reservation cannot be written.
    let mut ws = connect(&sidecar.snapshot_url("vs-1")).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(2), next_text(&mut ws))
            .await
            .is_err(),
        "a status went out with its reservation unwritten"
    );
    // Once the table is free, the rows are written, the status goes out and cleanup resumes.
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert!(next_text(&mut ws).await.contains("backupURL"));
    eventually_async("purged below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    drop(ws);
    sidecar.stop().await;
    db.drop().await;
}

/// Writes the config of a real sidecar process on `db` (its sessions named `db.application_name()`), purging
/// without relayed subscribers once `reconnect_grace` has passed, checking every second, in batches of
/// `batch_rows`, keeping its state in `state`.
fn write_process_config(
    dir: &std::path::Path,
    db: &TestSchema,
    litestream: &MetricsServer,
    state: &std::path::Path,
    batch_rows: i64,
) -> std::path::PathBuf {
    let url = crate::support::pg::database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}application_name={}", db.application_name());
    // The destination holds a generation that began an hour ago (its snapshot: the claims are its) and a fresh
    // segment: the claimed backups are verified as in production.
    let backup = dir.join("backup");
    let generation = backup.join("generations/0a1b2c3d");
    std::fs::create_dir_all(generation.join("snapshots")).unwrap();
    std::fs::create_dir_all(generation.join("wal")).unwrap();
    let snapshot = generation.join("snapshots/00000000.snapshot.lz4");
    std::fs::write(&snapshot, b"snapshot").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&snapshot)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    std::fs::write(generation.join("wal/00000000_00000000.wal.lz4"), b"wal").unwrap();
    let text = format!(
        "{}[server]\nlisten = \"127.0.0.1:0\"\n\
         [litestream]\nbackup_url = \"file://{}\"\nproxy_listen = \"127.0.0.1:0\"\nmetrics_url = \"{}\"\n\
         check_interval = \"1s\"\n\
         [discovery]\nmode = \"off\"\n\
         [cleanup]\nwithout_subscribers = \"after_grace\"\nreconnect_grace = \"1s\"\nbatch_rows = {batch_rows}\n\
         state_file = \"{}\"\n\
         [log]\nformat = \"json\"\n",
        db.config_at(&url),
        backup.display(),
        litestream.url(),
        state.display()
    );
    let path = dir.join("sidecar.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn row_count(db: &TestSchema) -> usize {
    let count: i64 = db
        .client
        .query_one(
            &format!("SELECT count(*) FROM {}", db.table("changeLog")),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    count as usize
}

/// Waits until PostgreSQL has ended every session of the killed process: a COMMIT it sent just before the kill
/// may still land until then, so only afterwards are the rows final.
async fn sessions_gone(db: &TestSchema) {
    let name = db.application_name();
    within(
        "the killed process's sessions to end",
        Duration::from_secs(30),
        || async {
            let count: i64 = db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            count == 0
        },
    )
    .await;
}

/// Whether `status` shows `task`'s reservation ended by its subscription: no reservation slot is left, and its
/// subscriber's slot is there, which the same transaction writes (docs/operations.md, "Slots"). A reservation ends
/// otherwise only at its restore limit, an hour at least for these tests' replica.
fn ended_by_subscription(status: &serde_json::Value, task: &str) -> bool {
    let slots = status["slots"].as_array().map_or(&[][..], Vec::as_slice);
    !slots.iter().any(|s| s["kind"] == "reservation")
        && slots
            .iter()
            .any(|s| s["kind"] == "subscriber" && s["task_id"] == task)
}

fn holds(page: &str, reason: HoldReason) -> f64 {
    metric(
        page,
        &format!(
            "litestream_sidecar_cleanup_holds_total{{reason=\"{}\"}}",
            reason.as_str()
        ),
    )
    .unwrap_or_else(|| panic!("no {reason:?} holds on the page:\n{page}"))
}

/// The binary killed with SIGKILL in the middle of a purge of thousands of one-row batches: every committed batch
/// stays committed, the one in flight dies with its session, and no row at or above the purge's watermark is
/// deleted. Nothing records the purge as done, so the restarted process — once its start-up hold is over — purges
/// the rest by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_purge_keeps_every_row_from_its_watermark_and_the_restarted_process_finishes_it(
) {
    const TRANSACTIONS: u64 = 40;
    const DATA_ROWS: i64 = 100;
    let db = TestSchema::create(Some(5), None).await;
    let watermarks: Vec<String> = (0..TRANSACTIONS).map(|i| lexi(50_000 + i)).collect();
    db.insert_transactions(&watermarks, DATA_ROWS).await;
    let all = db.rows().await;
    assert_eq!(all.len() as u64, TRANSACTIONS * (DATA_ROWS as u64 + 2));
    // Aged backups at the 11th and 31st transactions: the purge deletes the 30 before the newest, 3060 rows.
    let target = watermarks[30].clone();
    let kept: Vec<(String, i64)> = all.iter().filter(|(w, _)| *w >= target).cloned().collect();
    let litestream = MetricsServer::start(&progress_page(&[
        (&watermarks[10], seconds_ago(600.0)),
        (&target, seconds_ago(600.0)),
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let state_path = dir.path().join("state.json");
    let config = write_process_config(dir.path(), &db, &litestream, &state_path, 1);

    // After its 30 s start-up hold the process purges; it is killed once the first batches are gone.
    let mut first = Process::spawn(&config).await;
    within("the purge to begin", Duration::from_secs(60), || async {
        row_count(&db).await < all.len()
    })
    .await;
    first.kill();
    sessions_gone(&db).await;
    let after_kill = db.rows().await;
    let (below, at_or_above): (Vec<_>, Vec<_>) =
        after_kill.iter().cloned().partition(|(w, _)| *w < target);
    assert_eq!(
        at_or_above, kept,
        "no row at or above the purge's watermark is deleted"
    );
    assert!(
        !below.is_empty(),
        "the purge finished before the kill: this case needs more rows\n{}",
        first.log_text()
    );
    // What is left below it is a tail of the log: committed batches delete in key order, none half.
    assert_eq!(
        below,
        all[all.len() - kept.len() - below.len()..all.len() - kept.len()]
    );
    // The interrupted purge is not remembered as done: a restart that skipped it would leave these rows for good.
    let (_, last_purge) = shard_row(&db)
        .await
        .expect("the first start wrote the shard's memory");
    assert_eq!(last_purge, None);
    assert!(first.logged("change log purged").is_empty());

    // Restarted: held for its own first cleanup delay (a restore may have begun before the kill), then it
    // finishes the purge by itself, and counts exactly the rows the first run left.
    let second = Process::spawn(&config).await;
    within("a start-up hold", Duration::from_secs(10), || async {
        holds(&second.metrics().await, HoldReason::StartingUp) >= 1.0
    })
    .await;
    let page = second.metrics().await;
    assert_eq!(
        metric(&page, "litestream_sidecar_purge_runs_total"),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        db.rows().await,
        after_kill,
        "nothing purged while starting up"
    );
    // A hang guard: the start-up hold, then batches, on a machine that may be busy with other suites.
    within("the purge finished", Duration::from_secs(180), || async {
        db.rows().await == kept
    })
    .await;
    let page = second
        .wait_for_metrics("the purge counted", Duration::from_secs(10), |page| {
            metric(page, "litestream_sidecar_purge_runs_total") >= Some(1.0)
        })
        .await;
    assert_eq!(
        metric(&page, "litestream_sidecar_purged_rows_total"),
        Some(below.len() as f64),
        "{page}"
    );
    // One purge went all the way to the target, and it deleted every row the first run left: none ended early
    // and left the rest to another.
    let status = second
        .wait_for_status("the purge recorded", Duration::from_secs(10), |s| {
            s["last_purge"]["before"] == target.as_str()
        })
        .await;
    assert_eq!(
        status["last_purge"]["rows"],
        below.len() as u64,
        "{status:#}"
    );
    within("the purge remembered", Duration::from_secs(10), || async {
        shard_row(&db)
            .await
            .and_then(|(_, last)| last)
            .is_some_and(|last| last == target)
    })
    .await;
    drop(second);
    db.drop().await;
}

/// The binary killed with SIGKILL while a view-syncer restores, with the settings a deployment has by default (the
/// slots in the change DB): the view-syncer has its status and never opens its snapshot socket again, and its
/// restore outlasts the restarted process's start-up wait. The reservation survives as its slot: the restarted
/// process purges what it may, never its floor, lists the slot, and ends it when the view-syncer's subscription
/// arrives, with every row from the view-syncer's watermark still there (no `WatermarkTooOld`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_restore_the_restarted_process_keeps_the_reservation_until_its_subscription(
) {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e", "0f"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0c", seconds_ago(600.0)),
    ]))
    .await;
    let mut upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_default_process_config(dir.path(), &db, &litestream, &upstream);

    let mut first = Process::spawn(&config).await;
    let mut restore = connect(&format!(
        "ws://{}/replication/v3/snapshot?taskID=restoring",
        first.addr
    ))
    .await;
    assert!(next_text(&mut restore).await.contains("\"backupURL\""));
    // The status went out only once its reservation's row had committed, pinned at the newest backup.
    let rows = db
        .client
        .query(
            &format!(
                "SELECT key, floor, protocol, connected FROM \"{}_0/sidecar\".slots WHERE kind = 'reservation'",
                db.app_id
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].get::<_, String>(0),
            rows[0].get::<_, Option<String>>(1),
            rows[0].get::<_, i32>(2),
            rows[0].get::<_, bool>(3)
        ),
        ("restoring".to_string(), Some("0c".to_string()), 3, true)
    );
    // A newer backup, aged: without the reservation, rows below 0e could go.
    litestream.set_page(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0c", seconds_ago(600.0)),
        ("0e", seconds_ago(600.0)),
    ]));
    within("the newer backup seen", Duration::from_secs(10), || async {
        first
            .metrics()
            .await
            .contains("litestream_sidecar_backup_watermark{watermark=\"0e\"} 1")
    })
    .await;
    first.kill();
    // The restore's socket dies with the process, without a close; the view-syncer goes on restoring.
    assert_eq!(next_message(&mut restore).await, None);
    sessions_gone(&db).await;

    let second = Process::spawn(&config).await;
    second
        .wait_for_status(
            "the slots and the shard's memory read from the change DB",
            Duration::from_secs(10),
            |s| s["cleanup"]["state"] == "kept",
        )
        .await;
    second
        .wait_for_metrics(
            "the kept reservation listed",
            Duration::from_secs(10),
            |page| metric(page, "litestream_sidecar_reservations_kept") == Some(1.0),
        )
        .await;
    let status = second.status().await;
    assert_eq!(status["slots"][0]["key"], "restoring", "{status}");
    assert_eq!(status["slots"][0]["kind"], "reservation", "{status}");
    assert_eq!(status["slots"][0]["this"], false, "{status}");
    assert_eq!(status["slots"][0]["live"], true, "{status}");
    assert_eq!(status["slots"][0]["floor"], "0c", "{status}");

    // Past its start-up wait it purges, but only below the kept reservation's floor.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while db.watermarks().await != ["0c", "0d", "0e", "0f"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no purge below the floor: rows {:?}, status {}, log {}",
            db.watermarks().await,
            second.status().await,
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    within("held at the floor", Duration::from_secs(10), || async {
        second.status().await["cleanup"]["hold_reason"] == "reservation_floor"
    })
    .await;
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e", "0f"]);

    // Restored, the view-syncer subscribes from the backup's watermark: every row from it is there, and its
    // subscription ends the kept reservation.
    let path =
        "/replication/v3/changes?id=vs-restoring&taskID=restoring&replicaVersion=1rs&watermark=0c\
                &initial=true&mode=serving";
    let url = format!("ws://{}{path}", second.addr);
    let (mut subscriber, mut conn) = tokio::join!(connect(&url), upstream.accept());
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e", "0f"]);
    let status = conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    assert_eq!(next_text(&mut subscriber).await, status);
    second
        .wait_for_status(
            "the kept reservation ended by its subscription",
            Duration::from_secs(10),
            |s| ended_by_subscription(s, "restoring"),
        )
        .await;
    // The subscriber, tracked at 0c, still bounds cleanup: nothing at or above its watermark goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e", "0f"]);
    drop(second);
    db.drop().await;
}

/// A real sidecar process's config with the settings a deployment keeps by default — the state file where
/// systemd puts it ([`Process::spawn`] sets `STATE_DIRECTORY` to `dir`) — but for what a test must shorten: checks
/// every second, discovery off, cleanup without relayed subscribers once a one-second grace has passed.
/// The process as operators run it (under `make test-image`, the container image): ready on `/keepalive` and to
/// its health check, a reservation and a relayed subscription served, and SIGTERM ending both sockets with 1001,
/// the upstream's with them, and the process with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_is_ready_serves_and_ends_its_sockets_with_1001_on_sigterm() {
    let db = TestSchema::create(Some(5), None).await;
    db.insert_transaction("0a", 2).await;
    let litestream = MetricsServer::start(&progress_page(&[("0a", seconds_ago(600.0))])).await;
    let mut upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_default_process_config(dir.path(), &db, &litestream, &upstream);
    let mut sidecar = Process::spawn(&config).await;
    within("ready", Duration::from_secs(20), || async {
        http(sidecar.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    assert!(sidecar.healthy(), "{}", sidecar.log_text());

    let mut restore = connect(&format!(
        "ws://{}/replication/v3/snapshot?taskID=restoring",
        sidecar.addr
    ))
    .await;
    assert!(next_text(&mut restore).await.contains("\"backupURL\""));
    let path = changes_path(3, "task-7", "vs-1", "0a", false);
    let url = format!("ws://{}{path}", sidecar.addr);
    let (mut subscriber, mut conn) = tokio::join!(connect(&url), upstream.accept());
    assert!(conn.admit_like_zero().await);
    let status = conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    assert_eq!(next_text(&mut subscriber).await, status);

    sidecar.terminate();
    let going_away = Some((1001, "sidecar shutting down".to_string()));
    assert_eq!(expect_close(&mut restore).await, going_away);
    assert_eq!(expect_close(&mut subscriber).await, going_away);
    assert_eq!(conn.expect_close().await, going_away);
    assert_eq!(
        sidecar.wait(Duration::from_secs(20)),
        Some(0),
        "{}",
        sidecar.log_text()
    );
    db.drop().await;
}

fn write_default_process_config(
    dir: &std::path::Path,
    db: &TestSchema,
    litestream: &MetricsServer,
    upstream: &Upstream,
) -> std::path::PathBuf {
    let url = crate::support::pg::database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}application_name={}", db.application_name());
    let text = format!(
        "{}[server]\nlisten = \"127.0.0.1:0\"\n\
         [litestream]\nbackup_url = \"file://{}/backup\"\nproxy_listen = \"127.0.0.1:0\"\nmetrics_url = \"{}\"\n\
         check_interval = \"1s\"\n\
         [upstream]\naddress = \"{}\"\n\
         [discovery]\nmode = \"off\"\n\
         [backup]\nverify = false\n\
         [cleanup]\nwithout_subscribers = \"after_grace\"\nreconnect_grace = \"1s\"\n\
         [log]\nformat = \"json\"\n",
        db.config_at(&url),
        dir.display(),
        litestream.url(),
        upstream.addr,
    );
    let path = dir.join("sidecar.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Across a restart the highest gauge and the last purge are kept: litestream coming back below the last purge (a
/// restore of an older backup, a host rolled back) is a regression and an alarm, not a fresh start.
#[tokio::test]
async fn a_first_gauge_below_the_last_purge_after_a_restart_raises_the_alarm() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0d", "0e", "0f"] {
        db.insert_transaction(w, 2).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    state::store(
        &path,
        &state::Saved {
            cleanup_delay: Duration::from_secs(30),
            last_purge: Some(litestream_sidecar::cleanup::Backup {
                watermark: "0d".into(),
                backed_up_at: std::time::SystemTime::now() - Duration::from_secs(900),
            }),
            highest_backup: Some("0e".into()),
            ..state::Saved::default()
        },
    )
    .unwrap();
    let litestream = MetricsServer::start(&progress_page(&[("0b", seconds_ago(600.0))])).await;
    let sidecar = start_aged(
        with_state(&db, &litestream, &path),
        Duration::from_secs(600),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0f"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::BackupRegressed)
    );
    let status = sidecar.status.get();
    assert_eq!(
        status.backup_below_purge,
        Some(("0d".to_string(), "0b".to_string()))
    );
    assert_eq!(
        status.backup_regressed,
        Some(("0e".to_string(), "0b".to_string()))
    );
    let problem = status.cleanup_problem().unwrap_or_default();
    assert!(problem.contains("below the last purge (0d)"), "{problem}");
    let (_, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(
        metric(&page, "litestream_sidecar_backup_below_last_purge"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(db.watermarks().await, ["0d", "0e", "0f"]);
    sidecar.stop().await;
}

/// An in-process sidecar on `db` and `litestream`, checking every second, keeping its state in `path`.
fn with_state(
    db: &TestSchema,
    litestream: &MetricsServer,
    path: &std::path::Path,
) -> litestream_sidecar::Config {
    config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
         [cleanup]\nreconnect_grace = \"1s\"\nstate_file = \"{}\"\n",
        db.config(),
        litestream.url(),
        path.display()
    ))
}

/// Two sidecars of one shard on one PostgreSQL, as the Zero 1.9 guide deploys them behind one address: a
/// view-syncer reserves through the one that purges, which is then frozen (SIGSTOP) while its session holding the
/// purger lock is ended (a failover, a network blip). The other takes the lock and purges at once, but never a row
/// at or above the frozen sidecar's reservation, which it reads from the slot table; and the view-syncer's
/// subscription through it ends that reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_while_the_purger_is_frozen_keeps_every_row_its_reservation_needs() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e", "0f"] {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0c", seconds_ago(600.0)),
    ]))
    .await;
    let mut upstream = Upstream::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config_a = write_default_process_config(dir_a.path(), &db, &litestream, &upstream);
    let config_b = write_default_process_config(dir_b.path(), &db, &litestream, &upstream);

    let mut a = Process::spawn(&config_a).await;
    within(
        "A purges for the shard",
        Duration::from_secs(20),
        || async { a.status().await["cleanup"]["role"] == "purger" },
    )
    .await;
    let b = Process::spawn(&config_b).await;
    within("B is standby", Duration::from_secs(20), || async {
        b.status().await["cleanup"]["role"] == "standby"
    })
    .await;
    // A standby serves: it is ready, and its reservations are slots like any other.
    within("B is ready", Duration::from_secs(10), || async {
        http(b.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;

    let mut restore = connect(&format!(
        "ws://{}/replication/v3/snapshot?taskID=restoring",
        a.addr
    ))
    .await;
    assert!(next_text(&mut restore).await.contains("\"backupURL\""));
    // A newer backup, aged: without the reservation, rows below 0e could go.
    litestream.set_page(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0c", seconds_ago(600.0)),
        ("0e", seconds_ago(600.0)),
    ]));
    within(
        "B lists A's reservation",
        Duration::from_secs(10),
        || async {
            let status = b.status().await;
            status["slots"].as_array().is_some_and(|slots| {
                slots
                    .iter()
                    .any(|s| s["key"] == "restoring" && s["floor"] == "0c" && s["this"] == false)
            })
        },
    )
    .await;

    // A freezes, and the session holding its purger lock (this shard's: other tests' sidecars share the server)
    // ends.
    let (class, key) = litestream_sidecar::cleanup::change_db::purger_lock_key(&db.zero());
    a.freeze();
    let ended: i64 = db
        .client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' \
             AND classid = ($1::int4)::oid AND objid = ($2::int4)::oid AND objsubid = 2 AND granted",
            &[&class, &key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1);
    within("B takes over", Duration::from_secs(20), || async {
        b.status().await["cleanup"]["role"] == "purger"
    })
    .await;
    // Past its start-up wait B purges, below the frozen sidecar's floor and no further.
    within(
        "B purges below the floor",
        Duration::from_secs(90),
        || async { db.watermarks().await == ["0c", "0d", "0e", "0f"] },
    )
    .await;
    let status = b.status().await;
    assert_eq!(status["slot_bound"]["key"], "restoring", "{status}");
    assert_eq!(status["slot_bound"]["floor"], "0c", "{status}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e", "0f"]);

    // Restored, the view-syncer subscribes through B: every row from its watermark is there, and the subscription
    // ends the reservation the frozen sidecar holds.
    let path =
        "/replication/v3/changes?id=vs-restoring&taskID=restoring&replicaVersion=1rs&watermark=0c\
                &initial=true&mode=serving";
    let url = format!("ws://{}{path}", b.addr);
    let (mut subscriber, mut conn) = tokio::join!(connect(&url), upstream.accept());
    let status = conn.send_msg(1, r#"["status",{"tag":"status"}]"#).await;
    assert_eq!(next_text(&mut subscriber).await, status);
    b.wait_for_status(
        "the reservation ended by its subscription",
        Duration::from_secs(10),
        |s| ended_by_subscription(s, "restoring"),
    )
    .await;
    // Its subscriber's slot (at 0c) bounds the purge from now on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e", "0f"]);
    a.thaw();
    a.kill();
    drop(restore);
    drop(b);
    db.drop().await;
}
