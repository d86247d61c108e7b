use std::time::Duration;

use crate::support::lexi;
use crate::support::pg::TestSchema;
use litestream_sidecar::cleanup::change_db::{
    ChangeDb, PurgeOutcome, PurgeStop, ReservationWrite, SlotWrites, SubscriberRow, SCHEMA_VERSION,
};
use litestream_sidecar::cleanup::slots::SlotKind;
use tokio_util::sync::CancellationToken;

/// Ten transactions of one row each, at lexi(100) … lexi(109).
async fn with_log(schema: &TestSchema) -> Vec<String> {
    let w: Vec<String> = (100..110).map(lexi).collect();
    schema.insert_transactions(&w, 0).await;
    w
}

async fn migrated(schema: &TestSchema) -> (ChangeDb, CancellationToken) {
    let (db, stop) = schema.connected().await;
    assert_eq!(db.migrate().await.unwrap(), SCHEMA_VERSION);
    (db, stop)
}

fn replica() -> String {
    lexi(1_000)
}

fn open(task: &str, floor: Option<&str>) -> ReservationWrite {
    ReservationWrite::Open {
        task_id: task.into(),
        lease: 1,
        floor: floor.map(Into::into),
        replica_version: Some(replica()),
        protocol: 6,
        connected: true,
        restore_limit: None,
        opened_ago: Duration::ZERO,
    }
}

async fn reserve(db: &ChangeDb, holder: &str, writes: Vec<ReservationWrite>) {
    db.write_slots(
        holder,
        &SlotWrites {
            reservations: writes,
            ..SlotWrites::default()
        },
    )
    .await
    .unwrap();
}

/// A purge below `before` with the slots checked in every batch, two rows a batch.
async fn purge(db: &ChangeDb, before: &str, limit_now: Option<Duration>) -> PurgeOutcome {
    crate::support::pg::purge_with_slots(db, before, &replica(), 2, limit_now).await
}

async fn watermarks_left(schema: &TestSchema) -> Vec<String> {
    let mut w: Vec<String> = schema.rows().await.into_iter().map(|(w, _)| w).collect();
    w.dedup();
    w
}

#[tokio::test]
async fn two_sidecars_migrating_at_once_apply_each_migration_once() {
    let schema = TestSchema::create(None, None).await;
    let (a, stop_a) = schema.connected().await;
    let (b, stop_b) = schema.connected().await;
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    assert_eq!((ra.unwrap(), rb.unwrap()), (SCHEMA_VERSION, SCHEMA_VERSION));
    let applied: i64 = schema
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM \"{}_0/sidecar\".migrations",
                schema.app_id
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied, i64::from(SCHEMA_VERSION));
    // Again: nothing to do.
    assert_eq!(a.migrate().await.unwrap(), SCHEMA_VERSION);
    stop_a.cancel();
    stop_b.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_role_without_create_gets_an_error_naming_the_statement_and_the_grant() {
    let schema = TestSchema::create(None, None).await;
    let role = format!("{}_norole", schema.app_id);
    schema
        .client
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw'; GRANT USAGE ON SCHEMA \"{s}\" TO \"{role}\"; \
             GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{s}\" TO \"{role}\"",
            s = schema.schema
        ))
        .await
        .unwrap();
    let mut config = crate::support::pg::pg_config();
    config.user(&role).password("pw");
    let (db, stop) = schema.start(config);
    db.ready().await;
    let err = db.migrate().await.expect_err("no CREATE on the database");
    let text = err.to_string();
    assert!(text.contains("CREATE SCHEMA"), "{text}");
    assert!(text.contains("GRANT CREATE ON DATABASE"), "{text}");
    assert_eq!(
        err.class(),
        litestream_sidecar::cleanup::change_db::FailureClass::Permission
    );
    stop.cancel();
    schema
        .client
        .batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await
        .unwrap();
    schema.drop().await;
}

#[tokio::test]
async fn another_sidecars_reservation_bounds_every_batch() {
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (purger, stop) = migrated(&schema).await;
    let (other, stop_other) = schema.connected().await;
    // The other sidecar holds a reservation at w[4]: rows from w[4] on stay.
    reserve(&other, "sidecar-b", vec![open("vs-1", Some(&w[4]))]).await;
    let outcome = purge(&purger, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[4..].to_vec());
    match outcome.stopped {
        Some(PurgeStop::Slot { slot, floor }) => {
            assert_eq!(
                (slot.kind, slot.key.as_str(), slot.holder.as_str()),
                (SlotKind::Reservation, "vs-1", "sidecar-b")
            );
            assert_eq!(floor.as_deref(), Some(w[4].as_str()));
        }
        other => panic!("{other:?}"),
    }
    // A reservation that protects every row: nothing more goes.
    reserve(&other, "sidecar-b", vec![open("vs-2", None)]).await;
    let outcome = purge(&purger, &w[8], None).await;
    assert_eq!(outcome.rows, 0);
    assert!(
        matches!(&outcome.stopped, Some(PurgeStop::Slot { slot, floor: None }) if slot.key == "vs-2"),
        "{:?}",
        outcome.stopped
    );
    assert_eq!(watermarks_left(&schema).await, w[4..].to_vec());
    stop.cancel();
    stop_other.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_malformed_slot_stops_the_purge_and_is_named() {
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (db, stop) = migrated(&schema).await;
    let mut bad = open("vs-bad", Some("not-a-watermark"));
    reserve(&db, "sidecar-b", vec![bad.clone()]).await;
    let outcome = purge(&db, &w[8], None).await;
    assert_eq!(outcome.rows, 0);
    assert!(
        matches!(&outcome.stopped, Some(PurgeStop::SlotMalformed { slot, problem })
            if slot.key == "vs-bad" && problem.contains("not a watermark")),
        "{:?}",
        outcome.stopped
    );
    // A floor of another replica.
    if let ReservationWrite::Open {
        floor,
        replica_version,
        ..
    } = &mut bad
    {
        *floor = Some(w[2].clone());
        *replica_version = Some(lexi(999));
    }
    reserve(&db, "sidecar-b", vec![bad]).await;
    let outcome = purge(&db, &w[8], None).await;
    assert_eq!(outcome.rows, 0);
    assert!(
        matches!(&outcome.stopped, Some(PurgeStop::SlotMalformed { problem, .. }) if problem.contains("replica")),
        "{:?}",
        outcome.stopped
    );
    assert_eq!(watermarks_left(&schema).await, w);
    stop.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_reservation_opened_while_the_size_was_unknown_expires_only_once_a_size_gives_it_a_limit()
{
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (db, stop) = migrated(&schema).await;
    // Opened two hours ago (a restore still running across a restart), no limit fixed then.
    reserve(
        &db,
        "sidecar-a",
        vec![ReservationWrite::Open {
            task_id: "vs-big".into(),
            lease: 1,
            floor: Some(w[1].clone()),
            replica_version: Some(replica()),
            protocol: 6,
            connected: false,
            restore_limit: None,
            opened_ago: Duration::from_secs(2 * 3600),
        }],
    )
    .await;
    // The size is still unknown: longer than an hour-sized limit, and still honoured.
    let outcome = purge(&db, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[1..].to_vec());
    assert!(matches!(outcome.stopped, Some(PurgeStop::Slot { .. })));
    let slots = db.slots(None).await.unwrap();
    assert!(slots[0].live && !slots[0].connected);
    // A size that gives three hours: still honoured.
    purge(&db, &w[8], Some(Duration::from_secs(3 * 3600))).await;
    assert_eq!(watermarks_left(&schema).await, w[1..].to_vec());
    // A size that gives one hour: it has passed.
    let outcome = purge(&db, &w[8], Some(Duration::from_secs(3600))).await;
    assert_eq!(outcome.stopped, None);
    assert_eq!(watermarks_left(&schema).await, w[8..].to_vec());
    // Its row bounds nothing and is forgotten.
    assert_eq!(
        db.forget_dead_slots(Some(Duration::from_secs(3600)))
            .await
            .unwrap(),
        1
    );
    assert!(db.slots(None).await.unwrap().is_empty());
    stop.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_reservation_whose_socket_its_holder_vouches_for_outlives_its_restore_limit() {
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (db, stop) = migrated(&schema).await;
    // A restore two hours in under a one-hour limit, its socket still open at its holder (which has just written).
    let mut long = open("vs-long", Some(&w[1]));
    if let ReservationWrite::Open {
        opened_ago,
        restore_limit,
        ..
    } = &mut long
    {
        *opened_ago = Duration::from_secs(2 * 3600);
        *restore_limit = Some(Duration::from_secs(3600));
    }
    reserve(&db, "sidecar-a", vec![long]).await;
    purge(&db, &w[8], Some(Duration::from_secs(3600))).await;
    assert_eq!(watermarks_left(&schema).await, w[1..].to_vec());
    assert_eq!(
        db.forget_dead_slots(Some(Duration::from_secs(3600)))
            .await
            .unwrap(),
        0
    );
    // Its socket closed: the limit has passed, and it bounds nothing.
    reserve(
        &db,
        "sidecar-a",
        vec![ReservationWrite::Close {
            task_id: "vs-long".into(),
            lease: 1,
        }],
    )
    .await;
    purge(&db, &w[8], Some(Duration::from_secs(3600))).await;
    assert_eq!(watermarks_left(&schema).await, w[8..].to_vec());
    stop.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_subscription_through_another_sidecar_ends_the_reservation_and_writes_its_row_in_one_go()
{
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (a, stop_a) = migrated(&schema).await;
    let (b, stop_b) = schema.connected().await;
    reserve(&a, "sidecar-a", vec![open("vs-1", Some(&w[2]))]).await;
    let written = b
        .write_slots(
            "sidecar-b",
            &SlotWrites {
                subscribed: vec![("vs-1".into(), Duration::ZERO)],
                subscribers: Some((
                    vec![SubscriberRow {
                        key: "sidecar-b#1".into(),
                        task_id: Some("vs-1".into()),
                        subscriber_id: "vs-1-sub".into(),
                        floor: w[3].clone(),
                        replica_version: replica(),
                        connected: true,
                    }],
                    Duration::from_secs(60),
                )),
                ..SlotWrites::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(written.ended.len(), 1);
    assert_eq!(
        (written.ended[0].0.as_str(), written.ended[0].1.as_str()),
        ("vs-1", "sidecar-a")
    );
    let slots = a.slots(None).await.unwrap();
    assert_eq!(slots.len(), 1);
    assert_eq!(
        (
            slots[0].kind,
            slots[0].floor.as_deref(),
            slots[0].holder.as_str()
        ),
        (SlotKind::Subscriber, Some(w[3].as_str()), "sidecar-b")
    );
    // Sidecar A learns at its heartbeat that its row is gone.
    let back = a
        .write_slots(
            "sidecar-a",
            &SlotWrites {
                heartbeat: true,
                ..SlotWrites::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(back.own_reservations, Some(vec![]));
    // A subscription requested before a reservation opened does not end it: that is a new restore.
    reserve(&a, "sidecar-a", vec![open("vs-1", Some(&w[5]))]).await;
    let written = b
        .write_slots(
            "sidecar-b",
            &SlotWrites {
                subscribed: vec![("vs-1".into(), Duration::from_secs(30))],
                ..SlotWrites::default()
            },
        )
        .await
        .unwrap();
    assert!(written.ended.is_empty());
    // The subscriber's ack bounds the purge.
    purge(&a, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[3..].to_vec());
    stop_a.cancel();
    stop_b.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_subscriber_whose_holder_stopped_binds_for_its_grace_and_no_longer() {
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (db, stop) = migrated(&schema).await;
    let row = |floor: &str| SubscriberRow {
        key: "frozen#1".into(),
        task_id: None,
        subscriber_id: "vs".into(),
        floor: floor.into(),
        replica_version: replica(),
        connected: true,
    };
    db.write_slots(
        "frozen",
        &SlotWrites {
            subscribers: Some((vec![row(&w[2])], Duration::from_secs(2))),
            ..SlotWrites::default()
        },
    )
    .await
    .unwrap();
    purge(&db, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[2..].to_vec());
    // No heartbeat for longer than the grace: it bounds nothing any more.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    purge(&db, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[8..].to_vec());
    stop.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_holder_forgets_the_subscribers_it_no_longer_tracks() {
    let schema = TestSchema::create(None, None).await;
    let (db, stop) = migrated(&schema).await;
    let row = |key: &str| SubscriberRow {
        key: key.into(),
        task_id: None,
        subscriber_id: "vs".into(),
        floor: lexi(100),
        replica_version: replica(),
        connected: true,
    };
    let write = |rows: Vec<SubscriberRow>| SlotWrites {
        subscribers: Some((rows, Duration::from_secs(60))),
        ..SlotWrites::default()
    };
    db.write_slots("a", &write(vec![row("a#1"), row("a#2")]))
        .await
        .unwrap();
    db.write_slots("b", &write(vec![row("b#1")])).await.unwrap();
    db.write_slots("a", &write(vec![row("a#2")])).await.unwrap();
    let keys: Vec<String> = db
        .slots(None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.key)
        .collect();
    assert_eq!(keys, ["a#2", "b#1"]);
    stop.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_floor_written_before_its_writer_read_the_replica_version_is_of_the_logs_replica() {
    let schema = TestSchema::create(None, None).await;
    let w = with_log(&schema).await;
    let (db, stop) = migrated(&schema).await;
    let mut early = open("vs-early", Some(&w[3]));
    if let ReservationWrite::Open {
        replica_version, ..
    } = &mut early
    {
        *replica_version = None;
    }
    reserve(&db, "sidecar-a", vec![early]).await;
    let slots = db.slots(None).await.unwrap();
    assert_eq!(
        slots[0].replica_version.as_deref(),
        Some(replica().as_str())
    );
    // So it bounds the purge at its floor, not at every row.
    purge(&db, &w[8], None).await;
    assert_eq!(watermarks_left(&schema).await, w[3..].to_vec());
    // Without a floor there is no watermark to tag.
    reserve(&db, "sidecar-a", vec![open("vs-none", None)]).await;
    let slots = db.slots(None).await.unwrap();
    assert_eq!(
        slots.iter().find(|s| s.key == "vs-none").unwrap().floor,
        None
    );
    stop.cancel();
    schema.drop().await;
}
