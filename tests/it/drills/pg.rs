//! Drills and faults of the backup against a real PostgreSQL change log: what each fault holds (the exact decision,
//! the rows left in `changeLog`, the snapshot statuses withheld), what `/status` reports, and that no drill leaves
//! anything behind. The change log holds wm(1)..wm(n); the replica applies them as Zero's replicator would, never
//! ahead of the log.

use std::time::Duration;

use litestream_sidecar::cleanup::subscribers::SubscriberHandle;
use litestream_sidecar::cleanup::{Decision, HoldReason};
use litestream_sidecar::App;

use super::*;
use crate::support::litestream::{gauge_time, move_aside};
use crate::support::moto::Moto;
use crate::support::pg::{expected_rows, TestSchema};

/// A change log holding the transactions wm(1)..=wm(n), `rows` inserts each.
async fn change_log(n: u64, rows: i64) -> TestSchema {
    let db = TestSchema::create(Some(5), None).await;
    for i in 1..=n {
        db.insert_transaction(&wm(i), rows).await;
    }
    db
}

/// The change log's rows of wm(from)..=wm(to), `rows` inserts each (with begin and commit).
fn rows_of(from: u64, to: u64, rows: i64) -> Vec<(String, i64)> {
    let watermarks: Vec<String> = (from..=to).map(wm).collect();
    let refs: Vec<&str> = watermarks.iter().map(String::as_str).collect();
    expected_rows(&refs, rows + 2)
}

/// Applies wm(1)..=wm(4) and returns the segment that carried wm(2): in the middle of the last WAL index, at a
/// non-zero offset, where a missing segment shows in no listing and makes a restore stop early, at wm(1).
async fn middle_segment(rig: &Rig) -> crate::support::litestream::Segment {
    let mut carrying = Vec::new();
    for n in 1..=4 {
        rig.apply(n, 1).await;
        carrying.push(rig.dest.segments().pop().unwrap());
    }
    let gone = carrying[1].clone();
    assert!(
        gone.offset > 0 && gone.index == carrying[3].index && gone.offset < carrying[3].offset,
        "wm(2) in a middle segment of the last index: {carrying:#?}"
    );
    gone
}

/// A sidecar over `db` for `rig`, up long enough that no start-up hold applies.
async fn sidecar(
    rig: &Rig,
    db: &TestSchema,
    metrics_url: &str,
    requires: &str,
    extra: &str,
) -> Sidecar {
    start_aged(
        drill_config(rig, &db.config(), metrics_url, requires, extra),
        Duration::from_secs(60),
    )
    .await
}

/// A v6 snapshot reservation, as a view-syncer opens before it restores the backup.
async fn reserve(sidecar: &Sidecar, task: &str) -> RawClient {
    RawClient::connect(
        sidecar.addr,
        &format!("/replication/v6/snapshot?taskID={task}"),
    )
    .await
}

/// A subscriber still at wm(1), below every backup these tests claim: while it is tracked nothing can be purged,
/// however old the proof. A fault's test keeps it until the fault is in place and then lets it go
/// ([`let_go`]), so that the fault alone holds from there on: on a slow run the proof could otherwise age past
/// the cleanup delay (30 s) before the fault came, and be purged below before there was anything to hold.
fn behind(sidecar: &Sidecar) -> SubscriberHandle {
    sidecar.subscribers.connect(subscriber("vs-behind", &wm(1)))
}

/// Lets the subscriber from [`behind`] go, and waits until the policy no longer tracks it (past its reconnect
/// grace, 2 s): the checks that follow decide without it.
async fn let_go(sidecar: &Sidecar, behind: SubscriberHandle) {
    drop(behind);
    within(
        "the subscriber behind untracked",
        Duration::from_secs(10),
        || async {
            let tracked = sidecar
                .subscribers
                .for_policy(tokio::time::Instant::now(), Duration::from_secs(2));
            tracked.iter().all(|s| s.id != "vs-behind")
        },
    )
    .await;
}

/// Waits (up to 60 s) until the purge has left exactly `left` of `all`, failing as soon as more is seen gone, and
/// for the checks to settle with nothing more to purge.
async fn purged_to(
    sidecar: &Sidecar,
    db: &TestSchema,
    all: &[(String, i64)],
    left: &[(String, i64)],
) {
    within("the purge", Duration::from_secs(60), || async {
        let rows = db.rows().await;
        assert!(
            rows == all || rows == left,
            "purged past the proof: {rows:?}"
        );
        rows == left
    })
    .await;
    settles_on(sidecar, hold(HoldReason::NothingNew)).await;
    assert_eq!(db.rows().await, left);
}

/// No status on `raw` for `pings` pings (100 ms apart).
async fn withheld(raw: &mut RawClient, pings: usize) {
    for _ in 0..pings {
        let text = text_after_pings(raw, 1).await;
        assert_eq!(text, None, "a status was sent");
    }
}

/// The status `raw` gets, within 300 pings (30 s).
async fn status_of(raw: &mut RawClient) -> String {
    for _ in 0..300 {
        if let Some(text) = text_after_pings(raw, 1).await {
            return text;
        }
    }
    panic!("no status within 300 pings");
}

/// What a v4+ status says the change log still holds from: its oldest watermark (the view-syncer catches up
/// from there), not the backup's.
fn min_watermark(watermark: &str) -> String {
    format!(r#""minWatermark":"{watermark}""#)
}

/// The floor `/status` shows for the reservation of `task`: no row at or above it is purged while it is open.
async fn floor(sidecar: &Sidecar, task: &str) -> Value {
    let json = report(sidecar).await;
    json["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["task_id"] == task)
        .unwrap_or_else(|| panic!("no reservation of {task}: {json:#}"))["floor"]
        .clone()
}

/// Waits (up to `guard`) until the monitor decides `expected`, then checks the next check decides it again.
async fn settles_within(sidecar: &Sidecar, expected: Decision, guard: Duration) {
    let deadline = tokio::time::Instant::now() + guard;
    loop {
        let decision = decisions(sidecar, 1).await;
        if decision == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {expected:?}; the last was {decision:?}"
        );
    }
    assert_eq!(decisions(sidecar, 1).await, expected, "a check later");
}

fn hold(reason: HoldReason) -> Decision {
    Decision::Hold(reason)
}

/// Until `/status` reports the destination's layout as `layout`.
async fn layout_is(sidecar: &Sidecar, layout: &str) -> Value {
    reported(
        sidecar,
        &format!("layout {layout}"),
        Duration::from_secs(20),
        |json| json["destination"]["layout"] == layout,
    )
    .await
}

#[tokio::test]
async fn restore_proofs_without_any_gauge_bound_the_purge_and_the_statuses() {
    // wm(1)..wm(5) logged; the replica has applied wm(1)..wm(3); litestream is not running yet.
    let db = change_log(5, 2).await;
    let all = db.rows().await;
    let mut rig = Rig::new(
        &litestream::v03(),
        None,
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    for n in 1..=3 {
        rig.replica.apply(&wm(n), 2);
    }
    // Upstream litestream's own page (no litestream_replica_progress): all the sidecar reads of litestream.
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(5)));

    // Nothing uploaded, nothing proven: no drill, no purge, no status.
    settles_on(&sidecar, hold(HoldReason::NoBackup)).await;
    let mut early = reserve(&sidecar, "vs-early").await;
    withheld(&mut early, 20).await;
    let json = report(&sidecar).await;
    assert_eq!(json["destination"]["layout"], "empty", "{json:#}");
    assert_eq!(json["drills"]["runs"], 0);
    assert_eq!(db.rows().await, all);

    rig.litestream.start();
    rig.litestream.uploaded(&wm(3)).await;
    let json = proves(&sidecar, &wm(3)).await;
    assert_eq!(json["drills"]["drive_cleanup"], true);
    // The reservation that waited gets its status now: the proof is the backup statuses stand on. Its
    // minWatermark is the change log's oldest (nothing purged yet), and it pins no higher than that.
    let status = status_of(&mut early).await;
    assert!(status.contains(&min_watermark(&wm(1))), "{status}");
    assert_eq!(sidecar.registry.newest_backup(), Some(wm(3)));
    assert_eq!(floor(&sidecar, "vs-early").await, wm(1));
    drop(early);
    eventually("the reservation's socket closed", || {
        sidecar.registry.is_empty()
    })
    .await;
    // Its slot holds until its view-syncer, restored, subscribes.
    sidecar.registry.end_by_subscription(
        "vs-early",
        sidecar.registry.ticket(),
        tokio::time::Instant::now(),
    );

    // The proof ages past the cleanup delay (30 s): the purge goes below wm(3), never further.
    purged_to(&sidecar, &db, &all, &rows_of(3, 5, 2)).await;
    let json = report(&sidecar).await;
    assert_eq!(json["last_purge"]["before"], wm(3), "{json:#}");
    assert_eq!(json["drills"]["last_proof"]["proven_watermark"], wm(3));
    // Purged below the proof, the log starts at it: a status now carries the proven watermark.
    let mut late = reserve(&sidecar, "vs-late").await;
    let status = status_of(&mut late).await;
    assert!(status.contains(&min_watermark(&wm(3))), "{status}");
    assert_eq!(floor(&sidecar, "vs-late").await, wm(3));
    drop(late);
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn a_wal_index_missing_from_the_chain_is_an_index_gap_that_holds_cleanup_unverified() {
    let db = change_log(4, 1).await;
    let all = db.rows().await;
    // A checkpoint after nearly every sync: each transaction starts a WAL index of its own.
    let rig = Rig::start(
        Options {
            db: vec!["min-checkpoint-page-count: 2".into()],
            ..Options::default()
        },
        0,
    );
    for n in 1..=4 {
        rig.apply(n, 1).await;
    }
    let segments = rig.dest.segments();
    let (first, last) = (segments[0].index, segments.last().unwrap().index);
    let middle = (first + last) / 2;
    assert!(first < middle && middle < last, "{segments:#?}");
    // litestream's claim, set only now that a restore got wm(4), at the time of the newest object.
    let claimed = gauge_time(rig.dest.newest().unwrap());
    let gauge = MetricsServer::start(&progress_page(&[(&wm(4), claimed)])).await;
    let sidecar = sidecar(&rig, &db, &gauge.url(), "listing", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(4)));
    let held = behind(&sidecar);
    // The whole chain: restorable and the claim covered, so held only by the claim's age or, once it has aged, by
    // the subscriber behind it.
    let young_or_behind = [
        hold(HoldReason::BackupTooRecent),
        hold(HoldReason::SubscriberBehind),
    ];
    within("held by age or behind", Duration::from_secs(30), || async {
        young_or_behind.contains(&decisions(&sidecar, 1).await)
    })
    .await;
    assert!(young_or_behind.contains(&decisions(&sidecar, 1).await));
    let json = report(&sidecar).await;
    assert_eq!(json["destination"]["layout"], "restorable", "{json:#}");
    assert_eq!(json["destination"]["last_wal_index"], last);
    // Drills (under "listing" they only report) start once the names show something restorable.
    proves(&sidecar, &wm(4)).await;

    // 1. The first segment of a middle index gone: the rest of the index cannot be applied.
    let head = segments
        .iter()
        .find(|s| s.index == middle && s.offset == 0)
        .expect("the index's first segment");
    let moved = move_aside(&head.path, &rig.aside().join("head"));
    let json = layout_is(&sidecar, "index_gap").await;
    let problem = json["destination"]["problem"].as_str().unwrap();
    assert!(problem.contains(&format!("{middle:08x}")), "{problem}");
    let mut reservation = reserve(&sidecar, "vs-1").await;
    withheld(&mut reservation, 10).await;
    // A real restore agrees (with drills under "listing", they only report).
    let last_drill = fails(&sidecar, "restore").await;
    let error = last_drill["error"].as_str().unwrap();
    assert!(error.contains("missing initial wal segment"), "{error}");
    drop(reservation);
    std::fs::rename(&moved, &head.path).unwrap();
    layout_is(&sidecar, "restorable").await;

    // 2. A whole middle index gone.
    let index: Vec<_> = segments.iter().filter(|s| s.index == middle).collect();
    let aside = rig.aside().join("index");
    let moved: Vec<_> = index.iter().map(|s| move_aside(&s.path, &aside)).collect();
    let json = layout_is(&sidecar, "index_gap").await;
    let problem = json["destination"]["problem"].as_str().unwrap();
    assert!(problem.contains(&format!("{middle:08x}")), "{problem}");
    // The latest drill may still be one from before the index went: wait for one that restored without it.
    reported(
        &sidecar,
        "a drill failing for the missing index",
        Duration::from_secs(90),
        |json| {
            json["drills"]["last"]["error_kind"] == "restore"
                && json["drills"]["last"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("missing WAL index"))
        },
    )
    .await;
    let mut reservation = reserve(&sidecar, "vs-2").await;
    withheld(&mut reservation, 10).await;
    // From here only the missing index holds.
    let_go(&sidecar, held).await;
    // The claim ages (30 s): still held, nothing restorable covers it.
    settles_within(
        &sidecar,
        hold(HoldReason::BackupUnverified),
        Duration::from_secs(60),
    )
    .await;
    withheld(&mut reservation, 5).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    let json = report(&sidecar).await;
    assert_eq!(json["destination"]["layout"], "index_gap", "{json:#}");
    assert_eq!(json["cleanup"]["hold_reason"], "backup_unverified");
    drop(reservation);

    // Back in place: the claim is covered again, and purged below.
    for (from, segment) in moved.iter().zip(&index) {
        std::fs::rename(from, &segment.path).unwrap();
    }
    within("the purge below wm(4)", Duration::from_secs(30), || async {
        db.rows().await == rows_of(4, 4, 1)
    })
    .await;
    settles_on(&sidecar, hold(HoldReason::NothingNew)).await;
    assert_eq!(db.rows().await, rows_of(4, 4, 1));
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn a_middle_wal_segment_deleted_under_restore_is_restored_less_until_a_drill_reaches_the_proof_again(
) {
    let db = change_log(4, 1).await;
    let all = db.rows().await;
    let rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    let gone = middle_segment(&rig).await;
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(4)));
    let held = behind(&sidecar);
    proves(&sidecar, &wm(4)).await;

    // wm(2)'s segment gone: the names still look whole, but a restore silently stops at wm(1). Less than the
    // last proof of the same generation: the backup lost objects, and no status may send a view-syncer to it.
    let moved = move_aside(&gone.path, &rig.aside());
    assert_eq!(rig.litestream.restored().await, Ok(wm(1)));
    let last = fails(&sidecar, "restored_less").await;
    let error = last["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "the backup claims {} (an earlier drill of the same generation), but a restore of generation {} \
             reaches only {}",
            wm(4),
            rig.dest.generation(),
            wm(1)
        )),
        "{error}"
    );
    settles_on(&sidecar, hold(HoldReason::RestoredLess)).await;
    let json = report(&sidecar).await;
    assert_eq!(json["destination"]["layout"], "restorable", "{json:#}");
    assert_eq!(
        json["drills"]["restored_less"]["claimed"],
        wm(4),
        "{json:#}"
    );
    assert_eq!(json["drills"]["restored_less"]["restored"], wm(1));
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::RestoredLess)).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    let mut reservation = reserve(&sidecar, "vs-2").await;
    withheld(&mut reservation, 20).await;
    drop(reservation);
    // The proof kept in the change DB no longer holds: a restart must not stand on it.
    within(
        "the broken proof forgotten",
        Duration::from_secs(10),
        || async { kept_proof(&db).await.is_none() },
    )
    .await;

    // Back in place: proven at wm(4) again, which clears it. A restore now gets what the first proof claimed, so
    // cleanup resumes from it: below wm(4) once that proof has aged (30 s), never further.
    std::fs::rename(&moved, &gone.path).unwrap();
    proves(&sidecar, &wm(4)).await;
    within("the proof kept again", Duration::from_secs(10), || async {
        kept_proof(&db).await.is_some_and(|(w, _)| w == wm(4))
    })
    .await;
    assert_eq!(
        report(&sidecar).await["drills"]["restored_less"],
        Value::Null
    );
    purged_to(&sidecar, &db, &all, &rows_of(4, 4, 1)).await;
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn a_deleted_snapshot_is_reported_fails_drills_and_holds_cleanup_and_statuses() {
    let db = change_log(3, 1).await;
    let all = db.rows().await;
    let rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    for n in 1..=3 {
        rig.apply(n, 1).await;
    }
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(3)));
    let held = behind(&sidecar);
    proves(&sidecar, &wm(3)).await;
    let mut before = reserve(&sidecar, "vs-before").await;
    let status = status_of(&mut before).await;
    assert!(status.contains(&min_watermark(&wm(1))), "{status}");
    assert_eq!(sidecar.registry.newest_backup(), Some(wm(3)));
    drop(before);

    let snapshots = rig.dest.snapshots();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    let moved = move_aside(&snapshots[0], &rig.aside());
    assert!(rig.litestream.restored().await.is_err());
    let json = layout_is(&sidecar, "no_snapshot").await;
    let problem = json["destination"]["problem"].as_str().unwrap();
    assert!(problem.contains("no snapshot"), "{problem}");
    let last = fails(&sidecar, "restore").await;
    let error = last["error"].as_str().unwrap();
    assert!(error.contains("snapshot"), "{error}");
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let json = report(&sidecar).await;
    let unknown = json["cleanup"]["backup_unknown"].as_str().unwrap();
    assert!(unknown.contains("restore drill failed"), "{json:#}");
    let mut after = reserve(&sidecar, "vs-after").await;
    withheld(&mut after, 20).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    left_nothing(&sidecar, &rig.drill_dir()).await;

    // Back in place: proven again, and the reservation that waited gets its status.
    std::fs::rename(&moved, &snapshots[0]).unwrap();
    proves(&sidecar, &wm(3)).await;
    let status = status_of(&mut after).await;
    assert!(status.contains(&min_watermark(&wm(1))), "{status}");
    reported(
        &sidecar,
        "the position known again",
        Duration::from_secs(10),
        |json| json["cleanup"]["backup_unknown"].is_null(),
    )
    .await;
    sidecar.stop().await;
    db.drop().await;
}

/// Makes `path` `len` bytes long, keeping its last-modified time (the name and time look as uploaded).
fn truncate(path: &Path, len: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    let modified = file.metadata().unwrap().modified().unwrap();
    file.set_len(len).unwrap();
    file.set_modified(modified).unwrap();
}

/// Writes `bytes` over `path`, keeping its last-modified time.
fn overwrite(path: &Path, bytes: &[u8]) {
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(modified).unwrap();
}

#[tokio::test]
async fn a_truncated_or_corrupted_object_fails_drills_and_holds_cleanup() {
    let db = change_log(3, 1).await;
    let all = db.rows().await;
    let rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    let mut carrying = Vec::new();
    for n in 1..=3 {
        rig.apply(n, 1).await;
        carrying.push(rig.dest.segments().pop().unwrap());
    }
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(3)));
    let held = behind(&sidecar);
    proves(&sidecar, &wm(3)).await;

    // wm(2)'s WAL segment cut in half, as an upload that stopped part-way: its name is as good as ever.
    let segment = &carrying[1].path;
    let whole = std::fs::read(segment).unwrap();
    truncate(segment, whole.len() as u64 / 2);
    assert!(rig.litestream.restored().await.is_err());
    let last = fails(&sidecar, "restore").await;
    let error = last["error"].as_str().unwrap();
    assert!(error.contains("unexpected EOF"), "{error}");
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    assert_eq!(
        report(&sidecar).await["destination"]["layout"],
        "restorable"
    );
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let mut reservation = reserve(&sidecar, "vs-2").await;
    withheld(&mut reservation, 10).await;
    drop(reservation);
    assert_eq!(db.rows().await, all, "nothing purged");

    // Whole again: proven again (held behind again until the next fault is in place).
    let held = behind(&sidecar);
    overwrite(segment, &whole);
    proves(&sidecar, &wm(3)).await;
    reported(
        &sidecar,
        "the position known again",
        Duration::from_secs(10),
        |json| json["cleanup"]["backup_unknown"].is_null(),
    )
    .await;

    // Sixteen bytes in the middle of the snapshot flipped: lz4's checksum catches it.
    let snapshot = rig.dest.snapshots().pop().unwrap();
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 16] {
        *byte ^= 0xff;
    }
    overwrite(&snapshot, &bytes);
    assert!(rig.litestream.restored().await.is_err());
    let last = fails(&sidecar, "restore").await;
    let error = last["error"].as_str().unwrap();
    assert!(error.contains("snapshot"), "{error}");
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let mut reservation = reserve(&sidecar, "vs-3").await;
    withheld(&mut reservation, 10).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn litestream_killed_mid_upload_leaves_a_proven_watermark_that_bounds_cleanup() {
    const N: u64 = 40;
    let db = change_log(N, 1).await;
    let mut rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(N)));

    // Steady writes: the replicator applies a transaction every 100 ms. The last five wait for litestream's kill,
    // so that some are never uploaded however slowly the machine runs.
    let path = rig.replica.path.clone();
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = std::thread::spawn({
        let killed = killed.clone();
        move || {
            let replica = Replica::open(&path);
            for n in 1..=N {
                while n > N - 5 && !killed.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                replica.apply(&wm(n), 1);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    // Once litestream has uploaded a few, it is killed wherever it is.
    within("a few uploads", Duration::from_secs(20), || async {
        rig.litestream
            .restored()
            .await
            .is_ok_and(|w| w.as_str() >= wm(3).as_str())
    })
    .await;
    rig.litestream.kill();
    let at_kill = rig.replica.state_version();
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
    assert_eq!(rig.replica.state_version(), wm(N));

    // Killed while it wrote a segment (a millisecond of every second), litestream leaves the segment's
    // temporary file (`<name>.tmp`), which its restores skip, and so does the listing: the layout still restores
    // (litestream's restart writes that segment again; here the file is removed).
    let partial: Vec<_> = rig
        .dest
        .objects()
        .into_iter()
        .filter(|o| !o.name.ends_with(".lz4"))
        .collect();
    if !partial.is_empty() {
        assert!(
            partial.iter().all(|o| o.name.ends_with(".tmp")),
            "{partial:#?}"
        );
        let json = layout_is(&sidecar, "restorable").await;
        assert_eq!(json["destination"]["problem"], Value::Null, "{json:#}");
        for tmp in &partial {
            std::fs::remove_file(&tmp.path).unwrap();
        }
    }
    // What the destination holds: a restore gets W, short of what the replica had when litestream died.
    let proven = rig.litestream.restored().await.unwrap();
    let w = (1..=N)
        .find(|&n| wm(n) == proven)
        .expect("a transaction's watermark");
    assert!(
        w >= 3 && proven <= at_kill && w < N,
        "W {proven}, at the kill {at_kill}"
    );
    proves(&sidecar, &proven).await;

    // However long litestream stays down, cleanup goes no further than W: the proof ages and the purge reaches
    // W exactly.
    within("the purge below W", Duration::from_secs(60), || async {
        let rows = db.rows().await;
        let lowest = rows.first().map(|(w, _)| w.clone()).unwrap();
        assert!(lowest <= proven, "purged past {proven}: {lowest}");
        lowest == proven
    })
    .await;
    settles_on(&sidecar, hold(HoldReason::NothingNew)).await;
    assert_eq!(db.rows().await, rows_of(w, N, 1));
    assert_eq!(report(&sidecar).await["last_purge"]["before"], proven);

    // Restarted, litestream carries on (in its generation or a new one) and drills prove the rest.
    let generations = rig.dest.generations();
    rig.litestream.start();
    rig.litestream.uploaded(&wm(N)).await;
    proves(&sidecar, &wm(N)).await;
    let after = rig.dest.generations();
    assert!(
        after.len() >= generations.len(),
        "{generations:?} {after:?}"
    );
    assert_eq!(db.rows().await, rows_of(w, N, 1));
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_s3_destination_fails_the_drill_and_holds_cleanup() {
    let moto = Moto::start().await;
    moto.create_bucket("acme-zero").await;
    let env = vec![
        ("AWS_ACCESS_KEY_ID".to_string(), "AKIAEXAMPLE".to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), "secret".to_string()),
    ];
    let mut rig = Rig::new(
        &litestream::v03(),
        Some("s3://acme-zero/zero/replica"),
        Options {
            replica: vec![
                format!("endpoint: \"{}\"", moto.endpoint()),
                "region: us-east-1".into(),
                "force-path-style: true".into(),
            ],
            env: env.clone(),
            metrics: true,
            ..Options::default()
        },
        0,
    );
    rig.litestream.start();
    let db = change_log(2, 1).await;
    let all = db.rows().await;
    for n in 1..=2 {
        rig.apply(n, 1).await;
    }
    let config = drill_config(
        &rig,
        &db.config(),
        &rig.litestream.metrics_url(),
        "restore",
        &format!(
            "[backup]\nendpoint = \"{}\"\nregion = \"us-east-1\"\nforce_path_style = true\nallow_http = true\n",
            moto.endpoint()
        ),
    );
    let started = tokio::time::Instant::now() - Duration::from_secs(60);
    let sidecar = start_app(App::new(config).backup_env(env).started_at(started)).await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(2)));
    let held = behind(&sidecar);
    let json = proves(&sidecar, &wm(2)).await;
    assert_eq!(json["destination"]["layout"], "restorable", "{json:#}");
    assert!(json["destination"]["objects"].as_u64().unwrap() >= 2);

    // The destination goes away.
    drop(moto);
    let last = fails(&sidecar, "restore").await;
    let error = last["error"].as_str().unwrap();
    assert!(error.contains("connection refused"), "{error}");
    let json = reported(
        &sidecar,
        "the listing failing",
        Duration::from_secs(20),
        |json| json["destination"]["error"].is_string(),
    )
    .await;
    assert_eq!(json["drills"]["last_proof"]["proven_watermark"], wm(2));
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::BackupUnknown)).await;
    let mut reservation = reserve(&sidecar, "vs-2").await;
    withheld(&mut reservation, 10).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn an_ltx_destination_is_refused_holds_cleanup_and_withholds_statuses() {
    let db = change_log(2, 1).await;
    let all = db.rows().await;
    // litestream 0.5.17 replicating the same replica: LTX files.
    let mut rig = Rig::new(&litestream::v05(), None, Options::default(), 0);
    rig.litestream.start();
    for n in 1..=2 {
        rig.apply(n, 1).await;
    }
    let objects = rig.dest.objects();
    assert!(
        !objects.is_empty() && objects.iter().all(|o| o.name.starts_with("ltx/")),
        "{objects:#?}"
    );
    let claimed = gauge_time(rig.dest.newest().unwrap());
    let gauge = MetricsServer::start(&progress_page(&[(&wm(2), claimed)])).await;
    let sidecar = sidecar(&rig, &db, &gauge.url(), "listing", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(2)));
    let json = layout_is(&sidecar, "ltx").await;
    let problem = json["destination"]["problem"].as_str().unwrap();
    assert!(
        problem.starts_with("refused") && problem.contains("LTX"),
        "{problem}"
    );
    // The refusal itself: what was found, why, what to do, since when.
    let json = reported(
        &sidecar,
        "the LTX refusal",
        Duration::from_secs(20),
        |json| json["unservable"][0]["reason"] == "ltx",
    )
    .await;
    let refusal = &json["unservable"][0];
    assert_eq!(
        refusal["detail"],
        "the backup destination (litestream.backup_url) holds litestream 0.5 (LTX) files",
        "{json:#}"
    );
    assert!(refusal["remedy"]
        .as_str()
        .unwrap()
        .contains("back up with litestream 0.3"));
    assert!(refusal["since"].is_string(), "{json:#}");
    assert_eq!(json["unservable"].as_array().unwrap().len(), 1, "{json:#}");
    let page = scrape(&sidecar).await;
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_unservable",
            Some(("reason", "ltx"))
        ),
        Some(1.0)
    );
    let mut reservation = reserve(&sidecar, "vs-1").await;
    withheld(&mut reservation, 20).await;
    settles_within(
        &sidecar,
        hold(HoldReason::Unservable),
        Duration::from_secs(20),
    )
    .await;
    // Still refused once the claim has aged (30 s), when only the refusal and the listing stand in the way.
    reported(&sidecar, "the claim aged", Duration::from_secs(60), |_| {
        epoch_now() - claimed >= 30.0
    })
    .await;
    assert_eq!(decisions(&sidecar, 1).await, hold(HoldReason::Unservable));
    withheld(&mut reservation, 5).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    let json = report(&sidecar).await;
    assert_eq!(
        json["drills"]["runs"], 0,
        "no drill of what would not restore"
    );
    assert_eq!(json["cleanup"]["hold_reason"], "unservable", "{json:#}");
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

/// A WAL segment gone from the middle of the newest index: the names still look whole and the claim covered, and a
/// restore stops early without a word. Under "listing" (the default) the drill compares what it restored with the
/// claim the listing covered as it started: `restored_less`, which holds cleanup and statuses until a drill
/// restores as far again, here from a new generation litestream starts once its local state is gone.
#[tokio::test]
async fn a_middle_wal_segment_deleted_is_restored_less_which_holds_until_a_later_generation_restores_it(
) {
    let db = change_log(6, 1).await;
    let all = db.rows().await;
    let mut rig = Rig::start(Options::default(), 0);
    let gone = middle_segment(&rig).await;
    let claimed = gauge_time(rig.dest.newest().unwrap());
    let gauge = MetricsServer::start(&progress_page(&[(&wm(4), claimed)])).await;
    let sidecar = sidecar(&rig, &db, &gauge.url(), "listing", "").await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(6)));
    let held = behind(&sidecar);
    let json = proves(&sidecar, &wm(4)).await;
    let generation = rig.dest.generation();
    assert_eq!(json["drills"]["last"]["generation"], generation.as_str());
    assert_eq!(json["drills"]["restored_less"], Value::Null);

    let moved = move_aside(&gone.path, &rig.aside());
    assert_eq!(
        rig.litestream.restored().await,
        Ok(wm(1)),
        "a restore stops at wm(1)"
    );
    let last = fails(&sidecar, "restored_less").await;
    let error = last["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "the backup claims {} (litestream's gauge, covered by the destination's objects), but a restore of \
             generation {generation} reaches only {}",
            wm(4),
            wm(1)
        )),
        "{error}"
    );
    let json = report(&sidecar).await;
    let less = &json["drills"]["restored_less"];
    assert_eq!(less["claimed"], wm(4), "{json:#}");
    assert_eq!(less["restored"], wm(1));
    assert_eq!(less["generation"], generation.as_str());
    // The names still say it restores: only the drill knows.
    assert_eq!(json["destination"]["layout"], "restorable");
    settles_on(&sidecar, hold(HoldReason::RestoredLess)).await;
    let_go(&sidecar, held).await;
    settles_on(&sidecar, hold(HoldReason::RestoredLess)).await;
    let json = report(&sidecar).await;
    assert!(
        json["cleanup"]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("the backup claims")),
        "{json:#}"
    );
    let metrics = http(sidecar.addr, "GET", "/metrics").await.1;
    assert!(
        metrics.contains("litestream_sidecar_drill_failing{kind=\"restored_less\"} 1"),
        "{metrics}"
    );
    let mut reservation = reserve(&sidecar, "vs-2").await;
    withheld(&mut reservation, 20).await;
    let json = report(&sidecar).await;
    let entry = json["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["task_id"] == "vs-2")
        .cloned()
        .unwrap_or_else(|| panic!("{json:#}"));
    assert_eq!(entry["withheld"], "restored_less", "{json:#}");
    // Aged past the cleanup delay, the claim would be purged below: it is not.
    tokio::time::sleep(Duration::from_secs(30)).await;
    settles_on(&sidecar, hold(HoldReason::RestoredLess)).await;
    withheld(&mut reservation, 5).await;
    drop(reservation);
    assert_eq!(db.rows().await, all, "nothing purged");

    // The drill command says the same, and exits 1.
    let config = rig.dir.path().join("sidecar.toml");
    std::fs::write(
        &config,
        format!(
            "[litestream]\nbackup_url = \"{}\"\nmetrics_url = \"{}\"\n[discovery]\nmode = \"off\"\n\
             [change_db]\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n\
             [backup]\nlitestream = \"{}\"\ndrill_dir = \"{}\"\ndrill_reserve = 0\n",
            rig.url,
            gauge.url(),
            rig.litestream.bin.display(),
            rig.aside().join("cli-drills").display(),
        ),
    )
    .unwrap();
    let (code, out) = drill_command(&config).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with(&format!(
            "drill FAILED (restored_less): the backup claims {} (litestream's gauge, covered by the destination's \
             objects), but a restore of generation {generation} reaches only {}",
            wm(4),
            wm(1)
        )),
        "{out}"
    );

    // litestream loses its local state (a new volume, say) and starts a new generation; writes go on. A drill of
    // that generation restores past the claim: cleanup and statuses resume.
    rig.litestream.kill();
    let shadow = rig.replica.path.with_file_name(".replica.db-litestream");
    std::fs::remove_dir_all(&shadow).unwrap_or_else(|e| panic!("{}: {e}", shadow.display()));
    rig.litestream.start();
    rig.apply(5, 1).await;
    let newer = rig.dest.generation();
    assert_ne!(newer, generation, "a new generation");
    gauge.set_page(&progress_page(&[
        (&wm(4), claimed),
        (&wm(5), gauge_time(rig.dest.newest().unwrap())),
    ]));
    let json = proves(&sidecar, &wm(5)).await;
    assert_eq!(json["drills"]["last"]["generation"], newer.as_str());
    assert_eq!(json["drills"]["restored_less"], Value::Null);
    let mut reservation = reserve(&sidecar, "vs-3").await;
    let status = status_of(&mut reservation).await;
    assert!(status.contains(r#""tag":"status""#), "{status}");
    // Restored, its view-syncer subscribes: its reservation no longer bounds the purge.
    drop(reservation);
    sidecar.registry.end_by_subscription(
        "vs-3",
        sidecar.registry.ticket(),
        tokio::time::Instant::now(),
    );
    within("the purge below wm(5)", Duration::from_secs(60), || async {
        db.rows().await == rows_of(5, 6, 1)
    })
    .await;
    drop(moved);
    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    db.drop().await;
}

/// The newest proof kept in the change DB: its watermark and generation.
async fn kept_proof(db: &TestSchema) -> Option<(String, String)> {
    db.client
        .query_opt(
            &format!(
                "SELECT watermark, generation FROM \"{}_0/sidecar\".proofs ORDER BY finished_at DESC LIMIT 1",
                db.app_id
            ),
            &[],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// Under "restore", a restart stands on the last proof at once: it is kept in the change DB with its generation,
/// and statuses go out from it (here the new run's drills cannot even run). Once a restore picks another generation
/// the kept proof binds nothing: cleanup holds and statuses wait for a drill of that generation.
#[tokio::test]
async fn a_restart_under_restore_stands_on_the_kept_proof_while_its_generation_is_the_one_restored()
{
    let db = change_log(4, 1).await;
    let mut rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        0,
    );
    for n in 1..=3 {
        rig.apply(n, 1).await;
    }
    let generation = rig.dest.generation();
    let first = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", "").await;
    let json = proves(&first, &wm(3)).await;
    assert_eq!(json["drills"]["last_proof"]["kept"], false);
    within(
        "the proof kept in the change DB",
        Duration::from_secs(10),
        || async { kept_proof(&db).await == Some((wm(3), generation.clone())) },
    )
    .await;
    first.stop().await;

    // The next run's drills cannot run at all: only the kept proof can prove anything.
    let second = sidecar(
        &rig,
        &db,
        &rig.litestream.metrics_url(),
        "restore",
        "[backup]\nlitestream = \"/nonexistent/litestream\"\n",
    )
    .await;
    let json = reported(&second, "the kept proof", Duration::from_secs(20), |json| {
        json["drills"]["last_proof"]["kept"] == true
    })
    .await;
    assert_eq!(
        json["drills"]["last_proof"]["proven_watermark"],
        wm(3),
        "{json:#}"
    );
    assert_eq!(
        json["drills"]["last_proof"]["generation"],
        generation.as_str()
    );
    let mut reservation = reserve(&second, "vs-1").await;
    let status = status_of(&mut reservation).await;
    assert!(status.contains(&min_watermark(&wm(1))), "{status}");
    assert_eq!(floor(&second, "vs-1").await, wm(1));
    fails(&second, "setup").await;
    assert_eq!(
        second.registry.newest_backup(),
        Some(wm(3)),
        "the failed drill leaves the proof standing"
    );
    drop(reservation);

    // litestream loses its local state and starts a new generation: a restore now gets that one.
    rig.litestream.kill();
    let shadow = rig.replica.path.with_file_name(".replica.db-litestream");
    std::fs::remove_dir_all(&shadow).unwrap_or_else(|e| panic!("{}: {e}", shadow.display()));
    rig.litestream.start();
    rig.apply(4, 1).await;
    let newer = rig.dest.generation();
    assert_ne!(newer, generation);
    settles_on(&second, hold(HoldReason::BackupUnknown)).await;
    let json = report(&second).await;
    let why = json["cleanup"]["backup_unknown"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains(&format!(
            "the last drill's proof is of generation {generation}, and a restore now picks generation {newer}"
        )),
        "{json:#}"
    );
    let mut reservation = reserve(&second, "vs-2").await;
    withheld(&mut reservation, 20).await;
    drop(reservation);
    second.stop().await;
    db.drop().await;
}

/// Under "restore", drills that cannot run for want of disk hold cleanup with a reason of their own, which says how
/// much the drill needs and where: nothing will be proven until there is room.
#[tokio::test]
async fn too_little_disk_for_a_drill_holds_cleanup_under_restore_with_its_own_reason() {
    let db = change_log(2, 1).await;
    let rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        4 << 20,
    );
    rig.apply(1, 1).await;
    let small = Tmpfs::mount(&rig.dir.path().join("small"), "2m");
    let extra = format!(
        "[backup]\ndrill_dir = \"{}\"\ndrill_reserve = 65536\n",
        small.dir.display()
    );
    let sidecar = sidecar(&rig, &db, &rig.litestream.metrics_url(), "restore", &extra).await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(2)));
    fails(&sidecar, "disk").await;
    settles_on(&sidecar, hold(HoldReason::DrillDisk)).await;
    let json = report(&sidecar).await;
    assert_eq!(json["cleanup"]["hold_reason"], "drill_disk", "{json:#}");
    let problem = json["cleanup"]["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains(&format!("not enough disk in {}", small.dir.display())),
        "{json:#}"
    );
    sidecar.stop().await;
    drop(small);
    db.drop().await;
}

/// Two writers on one path: a second litestream, replicating an older copy of the replica, starts a generation
/// before litestream claims wm(3), and writes again after it. A restore then picks the second generation (its
/// snapshot older than the claim, its WAL newer, at its snapshot's index, which is what litestream compares), which
/// reaches only wm(2) (the first writer stopped after the claim). The claim was made by the first writer, whose
/// object is the newest before it: the second's
/// objects, however new, do not cover it, and cleanup holds (drills are off here, so the names alone decide).
#[tokio::test]
async fn a_claim_is_covered_only_by_objects_of_the_generation_that_made_it() {
    let db = change_log(3, 1).await;
    let all = db.rows().await;
    let mut rig = Rig::start(Options::default(), 0);
    rig.apply(1, 1).await;
    let first = rig.dest.generation();
    // The second writer: an older copy of the replica, on the same path, that never checkpoints here (its WAL
    // stays at its snapshot's index).
    std::fs::create_dir_all(rig.dir.path().join("second")).unwrap();
    let second =
        litestream::Replica::create(&rig.dir.path().join("second/replica.db"), REPLICA_VERSION);
    second.apply(&wm(1), 1);
    second.checkpoint();
    let mut other = Litestream::configure(
        &litestream::v03(),
        &second.path,
        &rig.url,
        Options {
            db: vec!["checkpoint-interval: 1h".into()],
            ..Options::default()
        },
    );
    other.start();
    within("the second generation", Duration::from_secs(20), || async {
        rig.dest.generations().len() == 2
    })
    .await;
    let newest_of = |generation: &str| {
        let prefix = format!("generations/{generation}/");
        rig.dest
            .objects()
            .into_iter()
            .filter(|o| o.name.starts_with(&prefix) && !o.name.ends_with(".tmp"))
            .map(|o| o.modified)
            .max()
    };
    // The first writer goes on to wm(3): the claim is stamped at its newest object.
    let before = newest_of(&first);
    rig.replica.apply(&wm(2), 1);
    rig.replica.apply(&wm(3), 1);
    within(
        "the first writer's upload of wm(3)",
        Duration::from_secs(20),
        || async { newest_of(&first) > before },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first writer stops there (its host gone, say): no object of its generation comes after the claim, so the
    // second's next upload is the newest whatever the machine's load, and a restore picks the second.
    rig.litestream.kill();
    let claimed_at = newest_of(&first).unwrap();
    // The second writes again: a restore picks its generation, which reaches wm(2).
    second.apply(&wm(2), 1);
    let second_generation = rig
        .dest
        .generations()
        .into_iter()
        .find(|g| *g != first)
        .unwrap();
    within(
        "the second writer's upload",
        Duration::from_secs(20),
        || async { newest_of(&second_generation) > Some(claimed_at) },
    )
    .await;
    // On a loaded machine a restore right after that upload was seen to stop at wm(1): the second generation's
    // newest object was not yet wm(2)'s. It is asked again until wm(2) is up; a restore of the first generation
    // would give wm(3) every time, and fail this.
    within(
        "a restore of the second generation at wm(2)",
        Duration::from_secs(20),
        || async { rig.litestream.restored().await == Ok(wm(2)) },
    )
    .await;

    let gauge = MetricsServer::start(&progress_page(&[(&wm(3), gauge_time(claimed_at))])).await;
    let sidecar = sidecar(
        &rig,
        &db,
        &gauge.url(),
        "listing",
        "[backup]\ndrill_interval = \"off\"\n",
    )
    .await;
    let _subscriber = sidecar.subscribers.connect(subscriber("vs-1", &wm(3)));
    let json = reported(&sidecar, "the listing", Duration::from_secs(20), |json| {
        json["destination"]["generation"] == second_generation.as_str()
    })
    .await;
    assert_eq!(json["destination"]["layout"], "restorable", "{json:#}");
    // Aged past the cleanup delay, the claim is covered by no object of the generation a restore picks.
    let aged = claimed_at + Duration::from_secs(31);
    if let Ok(wait) = aged.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    settles_on(&sidecar, hold(HoldReason::BackupUnverified)).await;
    assert_eq!(db.rows().await, all, "nothing purged");
    other.kill();
    sidecar.stop().await;
    db.drop().await;
}
