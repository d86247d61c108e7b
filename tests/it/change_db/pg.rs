use std::time::Duration;

use crate::support::lexi;
use crate::support::pg::{self, expected_rows, TestSchema};
use litestream_sidecar::cleanup::change_db::{
    purger_lock_key, ChangeDb, DbError, DbState, FailureClass, PurgeOutcome, PurgeStop,
    PurgeTarget, Purger, DEFAULT_PURGE_BATCH_ROWS,
};
use litestream_sidecar::protocol::shard::ZeroConfig;
use tokio::net::TcpListener;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

const SIDECAR: &str = "10.0.0.5:4851";
const RM: &str = "10.0.0.5:4849";

/// Five transactions of three rows each (begin, insert, commit) at watermarks whose lengths differ, so that byte
/// order and numeric order must agree for the purge to be right: 0u < 0z < 110 < 1zz < 2100.
fn watermarks() -> [String; 5] {
    [lexi(30), lexi(35), lexi(36), lexi(1295), lexi(1296)]
}

async fn with_log(schema: &TestSchema) -> [String; 5] {
    let w = watermarks();
    assert_eq!(w, ["0u", "0z", "110", "1zz", "2100"]);
    for wm in &w {
        schema.insert_transaction(wm, 1).await;
    }
    w
}

fn refs(w: &[String]) -> Vec<&str> {
    w.iter().map(String::as_str).collect()
}

async fn purge(db: &ChangeDb, before: &str, expected: Option<&str>, batch: i64) -> PurgeOutcome {
    db.purge(before, expected, batch, &CancellationToken::new())
        .await
        .expect("purge")
}

/// Polls `check` until it holds; the timeout only guards against a hang.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the sidecar's connection is blocked on a row lock.
async fn wait_until_blocked(schema: &TestSchema) {
    let app = schema.application_name();
    eventually("the purge batch waits on the row lock", || async {
        let row = schema
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&app],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1
    })
    .await;
}

#[tokio::test]
async fn purge_keeps_rows_at_and_above_the_target() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    let outcome = purge(&db, &w[2], Some(SIDECAR), DEFAULT_PURGE_BATCH_ROWS).await;
    assert_eq!(outcome.rows, 6);
    assert_eq!(outcome.batches, 1);
    assert!(outcome.is_complete(), "{outcome:?}");
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));

    // Nothing left below the target: a second purge deletes nothing and changes nothing.
    let again = purge(&db, &w[2], Some(SIDECAR), DEFAULT_PURGE_BATCH_ROWS).await;
    assert_eq!((again.rows, again.batches, again.stopped), (0, 1, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));

    // Without an expected address no ownership check runs.
    let unchecked = purge(&db, &w[3], None, DEFAULT_PURGE_BATCH_ROWS).await;
    assert_eq!(unchecked.rows, 3);
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[3..]), 3));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn purge_never_deletes_the_newest_watermark() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    // A target at max(watermark) keeps the newest transaction (docs/protocol.md, "Purging the newest transaction").
    let outcome = purge(&db, &w[4], Some(SIDECAR), DEFAULT_PURGE_BATCH_ROWS).await;
    assert_eq!(outcome.rows, 12);
    assert!(outcome.is_complete());
    assert_eq!(schema.rows().await, expected_rows(&[&w[4]], 3));

    // Again, with only the last transaction left: it stays.
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (0, None));
    assert_eq!(schema.rows().await, expected_rows(&[&w[4]], 3));
    shutdown.cancel();
    schema.drop().await;
}

/// A purge decided for one replica stops at the first batch that finds another: a resync while it ran started a new
/// log, which its bound says nothing of (the new log's rows may sit below it). Rows of the new log stay.
#[tokio::test]
async fn a_purge_decided_before_a_resync_deletes_nothing_of_the_new_log() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let (db, shutdown) = schema.connected().await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        schema.insert_transaction(w, 1).await;
    }
    let all = schema.rows().await;
    let current = db
        .replica_version()
        .await
        .unwrap()
        .expect("a replica version");

    let mut outcome = PurgeOutcome::default();
    db.purge_within(
        PurgeTarget {
            before: "0d",
            replica_version: Some("00-the-old-replica"),
            slots: None,
        },
        Some(SIDECAR),
        1,
        &CancellationToken::new(),
        || std::future::ready(litestream_sidecar::cleanup::Ceiling::None),
        &mut outcome,
    )
    .await
    .unwrap();
    assert_eq!(
        (outcome.rows, outcome.batches, outcome.stopped),
        (
            0,
            0,
            Some(PurgeStop::ReplicaChanged {
                found: Some(current.clone())
            })
        )
    );
    assert_eq!(schema.rows().await, all);

    // The same purge for the log's own replica goes ahead.
    let mut outcome = PurgeOutcome::default();
    db.purge_within(
        PurgeTarget {
            before: "0d",
            replica_version: Some(current.as_str()),
            slots: None,
        },
        Some(SIDECAR),
        3,
        &CancellationToken::new(),
        || std::future::ready(litestream_sidecar::cleanup::Ceiling::None),
        &mut outcome,
    )
    .await
    .unwrap();
    // Three transactions of three rows each (begin, one change, commit).
    assert_eq!((outcome.rows, outcome.stopped), (9, None));
    assert_eq!(schema.rows().await, expected_rows(&["0d", "0e"], 3));
    shutdown.cancel();
    schema.drop().await;
}

/// A target above the newest watermark was not taken from this log (a bound left from before a resync onto a
/// cluster with lower LSNs, say): it deletes nothing, where purging below it would leave only the newest transaction.
#[tokio::test]
async fn a_target_above_the_newest_watermark_deletes_nothing() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let (db, shutdown) = schema.connected().await;

    // An empty log has no watermark to compare with.
    let outcome = purge(&db, "0c", Some(SIDECAR), 3).await;
    assert_eq!(
        (outcome.rows, outcome.batches, outcome.stopped),
        (0, 0, Some(PurgeStop::BeyondLog { newest: None }))
    );

    for w in ["0a", "0b", "0c", "0d", "0e"] {
        schema.insert_transaction(w, 1).await;
    }
    let all = schema.rows().await;
    // "0e0" is only just above "0e" as bytes.
    for before in ["0z", "0e0"] {
        let outcome = purge(&db, before, Some(SIDECAR), 3).await;
        assert_eq!(
            (outcome.rows, outcome.batches, outcome.stopped),
            (
                0,
                0,
                Some(PurgeStop::BeyondLog {
                    newest: Some("0e".into())
                })
            ),
            "{before}"
        );
        assert_eq!(schema.rows().await, all, "{before}");
    }

    // Targets within the log purge as before, up to the newest watermark itself.
    let outcome = purge(&db, "0c", Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (6, None));
    assert_eq!(schema.rows().await, expected_rows(&["0c", "0d", "0e"], 3));
    let outcome = purge(&db, "0e", Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (6, None));
    assert_eq!(schema.rows().await, expected_rows(&["0e"], 3));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn purge_runs_in_bounded_batches() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    // 12 rows below the newest watermark, 3 per batch: four full batches and a fifth that finds nothing.
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!(outcome.rows, 12);
    assert_eq!(outcome.batches, 5);
    assert!(outcome.is_complete());
    assert!(outcome.slowest_batch > Duration::ZERO);
    assert_eq!(schema.rows().await, expected_rows(&[&w[4]], 3));
    shutdown.cancel();
    schema.drop().await;

    // 9 rows below the target, 4 per batch: 4 + 4 + 1, the short batch ends the purge.
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;
    let outcome = purge(&db, &w[3], Some(SIDECAR), 4).await;
    assert_eq!((outcome.rows, outcome.batches), (9, 3));
    assert!(outcome.is_complete());
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[3..]), 3));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn purge_deletes_nothing_once_ownership_moved() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    let w = with_log(&schema).await;
    let all = schema.rows().await;
    let (db, shutdown) = schema.connected().await;

    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!(outcome.rows, 0);
    assert_eq!(outcome.batches, 0);
    assert_eq!(
        outcome.stopped,
        Some(PurgeStop::OwnershipMoved {
            found: Some(RM.into())
        })
    );
    assert_eq!(schema.rows().await, all);

    // After a resync `ownerAddress` is NULL until the replication-manager assumes ownership again.
    schema.set_owner_address(None).await;
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!(
        outcome.stopped,
        Some(PurgeStop::OwnershipMoved { found: None })
    );
    assert_eq!(schema.rows().await, all);

    // A later Zero may write the address with a scheme (docs/protocol.md, "What each Zero release changed"): still ours.
    schema
        .set_owner_address(Some(&format!("ws://{SIDECAR}")))
        .await;
    let outcome = purge(&db, &w[1], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[1..]), 3));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn ownership_is_checked_again_before_every_batch() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    // Hold a row of the second batch so the purge pauses there, then move ownership while it waits.
    let blocker = pg::connect().await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            &format!(
                "SELECT 1 FROM {} WHERE watermark = $1 AND pos = 1 FOR SHARE",
                schema.table("changeLog")
            ),
            &[&w[1]],
        )
        .await
        .unwrap();
    let task = {
        let db = db.clone();
        let newest = w[4].clone();
        tokio::spawn(async move { purge(&db, &newest, Some(SIDECAR), 3).await })
    };
    wait_until_blocked(&schema).await;
    schema.set_owner_address(Some("10.0.0.9:4849")).await;
    blocker.batch_execute("COMMIT").await.unwrap();

    let outcome = task.await.unwrap();
    // The batch in flight finished; the next one saw the new owner and deleted nothing.
    assert_eq!(outcome.rows, 6);
    assert_eq!(outcome.batches, 2);
    assert_eq!(
        outcome.stopped,
        Some(PurgeStop::OwnershipMoved {
            found: Some("10.0.0.9:4849".into())
        })
    );
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn stop_is_honoured_between_batches_never_inside_one() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    let blocker = pg::connect().await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            &format!(
                "SELECT 1 FROM {} WHERE watermark = $1 AND pos = 1 FOR SHARE",
                schema.table("changeLog")
            ),
            &[&w[1]],
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = {
        let (db, stop) = (db.clone(), stop.clone());
        let newest = w[4].clone();
        tokio::spawn(async move { db.purge(&newest, Some(SIDECAR), 3, &stop).await })
    };
    wait_until_blocked(&schema).await;
    stop.cancel();
    blocker.batch_execute("COMMIT").await.unwrap();

    let outcome = task.await.unwrap().unwrap();
    assert_eq!(outcome.rows, 6, "the second batch completed after the stop");
    assert_eq!(outcome.batches, 2);
    assert_eq!(outcome.stopped, Some(PurgeStop::Cancelled));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));

    // A token cancelled before the call deletes nothing.
    let outcome = db.purge(&w[4], Some(SIDECAR), 3, &stop).await.unwrap();
    assert_eq!((outcome.rows, outcome.batches), (0, 0));
    assert_eq!(outcome.stopped, Some(PurgeStop::Cancelled));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_locked_head_row_skips_the_round() {
    let schema = TestSchema::create(Some(6), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let all = schema.rows().await;
    let (db, shutdown) = schema.connected().await;

    // What an incoming replication-manager holds until it has assumed ownership (docs/protocol.md, "What each Zero release changed").
    let incoming = pg::connect().await;
    incoming.batch_execute("BEGIN").await.unwrap();
    incoming
        .query(
            &format!(
                "SELECT watermark FROM {} ORDER BY watermark, pos LIMIT 1 FOR SHARE",
                schema.table("changeLog")
            ),
            &[],
        )
        .await
        .unwrap();
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!(outcome.rows, 0);
    assert_eq!(outcome.stopped, Some(PurgeStop::Locked));
    assert_eq!(schema.rows().await, all);

    incoming.batch_execute("COMMIT").await.unwrap();
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (12, None));
    assert_eq!(schema.rows().await, expected_rows(&[&w[4]], 3));
    shutdown.cancel();
    schema.drop().await;
}

/// Zero 0.20's storer (docs/protocol.md, "The storer's transactions"): SERIALIZABLE, reads replicationState at begin, inserts the
/// transaction's rows, and UPDATEs lastWatermark at commit.
struct Storer {
    client: tokio_postgres::Client,
    state: String,
    log: String,
}

impl Storer {
    async fn begin(schema: &TestSchema, watermark: &str) -> Storer {
        let storer = Storer {
            client: pg::connect().await,
            state: schema.table("replicationState"),
            log: schema.table("changeLog"),
        };
        storer
            .client
            .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            .await
            .unwrap();
        storer
            .client
            .query(&format!("SELECT * FROM {}", storer.state), &[])
            .await
            .unwrap();
        for (pos, change) in [(0i64, r#"{"tag":"begin"}"#), (1, r#"{"tag":"commit"}"#)] {
            storer
                .client
                .execute(
                    &format!(
                        "INSERT INTO {} (watermark, pos, change, precommit) VALUES ($1, $2, $3::text::json, $1)",
                        storer.log
                    ),
                    &[&watermark, &pos, &change],
                )
                .await
                .unwrap();
        }
        storer
    }

    async fn commit(self, watermark: &str) -> Result<(), tokio_postgres::Error> {
        let result = async {
            self.client
                .execute(
                    &format!(r#"UPDATE {} SET "lastWatermark" = $1"#, self.state),
                    &[&watermark],
                )
                .await?;
            self.client.batch_execute("COMMIT").await
        }
        .await;
        if result.is_err() {
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        result
    }
}

#[tokio::test]
async fn purge_and_unneeded_adopt_do_not_abort_a_serializable_storer() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;
    let next = lexi(2000);

    let storer = Storer::begin(&schema, &next).await;
    let outcome = purge(&db, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (12, None));
    // Already ours: matches no row, writes nothing.
    assert!(!db.adopt_address(RM, SIDECAR).await.unwrap());
    assert!(!db.adopt_address(SIDECAR, SIDECAR).await.unwrap());
    storer.commit(&next).await.expect("the storer commits");
    assert_eq!(
        schema.rows().await,
        [expected_rows(&[&w[4]], 3), expected_rows(&[&next], 2)].concat()
    );

    // Control: a real change of the row while the storer is open fails it, as Zero 0.20 does in production.
    let later = lexi(3000);
    let storer = Storer::begin(&schema, &later).await;
    assert!(db.adopt_address(SIDECAR, RM).await.unwrap());
    let err = storer.commit(&later).await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn adopt_and_restore_write_only_when_needed_and_never_owner() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    let (db, shutdown) = schema.connected().await;
    let (_, _, xmin0) = schema.replication_state().await;

    // Nothing to do: someone else's address, or the address already set. The row version stays the same.
    assert!(!db.adopt_address("10.0.0.9:4849", SIDECAR).await.unwrap());
    assert!(!db.adopt_address(RM, RM).await.unwrap());
    assert_eq!(
        schema.replication_state().await,
        (Some(RM.into()), Some("rm-task-1".into()), xmin0.clone())
    );

    assert!(db.adopt_address(RM, SIDECAR).await.unwrap());
    let (address, owner, xmin1) = schema.replication_state().await;
    assert_eq!(address.as_deref(), Some(SIDECAR));
    assert_eq!(owner.as_deref(), Some("rm-task-1"));
    assert_ne!(xmin1, xmin0);
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(SIDECAR));

    assert!(!db.adopt_address(RM, SIDECAR).await.unwrap());
    assert_eq!(schema.replication_state().await.2, xmin1);

    assert!(db.restore_address(SIDECAR, RM).await.unwrap());
    let (address, owner, xmin2) = schema.replication_state().await;
    assert_eq!(address.as_deref(), Some(RM));
    assert_eq!(owner.as_deref(), Some("rm-task-1"));
    assert!(!db.restore_address(SIDECAR, RM).await.unwrap());
    assert_eq!(schema.replication_state().await.2, xmin2);

    // After a resync ownerAddress is NULL: neither call claims the row.
    schema.set_owner_address(None).await;
    assert!(!db.adopt_address(RM, SIDECAR).await.unwrap());
    assert!(!db.restore_address(SIDECAR, RM).await.unwrap());
    assert_eq!(schema.replication_state().await.0, None);
    assert_eq!(db.owner_address().await.unwrap(), None);
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn reads_the_discovery_and_version_rows() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    let (db, shutdown) = schema.connected().await;
    assert_eq!(db.status().await, DbState::Up);
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));
    assert_eq!(db.replica_version().await.unwrap(), Some(lexi(1_000)));
    assert_eq!(db.data_version().await.unwrap(), Some(5));
    assert_eq!(db.min_watermark().await.unwrap(), None);
    let w = with_log(&schema).await;
    assert_eq!(
        db.min_watermark().await.unwrap().as_deref(),
        Some(w[0].as_str())
    );
    shutdown.cancel();
    schema.drop().await;

    // Zero 0.26's schema version; then no versionHistory at all, and no replicationState row.
    let schema = TestSchema::create(Some(6), None).await;
    let (db, shutdown) = schema.connected().await;
    assert_eq!(db.data_version().await.unwrap(), Some(6));
    assert_eq!(db.owner_address().await.unwrap(), None);
    shutdown.cancel();
    schema.drop().await;

    let schema = TestSchema::create(None, Some(RM)).await;
    let (db, shutdown) = schema.connected().await;
    assert_eq!(db.data_version().await.unwrap(), None);
    schema
        .client
        .batch_execute(&format!("DELETE FROM {}", schema.table("replicationState")))
        .await
        .unwrap();
    assert_eq!(db.owner_address().await.unwrap(), None);
    assert_eq!(db.status().await, DbState::Up);
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn a_missing_schema_is_reported_until_zero_creates_it() {
    let schema = TestSchema::empty().await;
    let (db, shutdown) = schema.connected().await;
    assert_eq!(db.status().await, DbState::SchemaMissing);
    let err = db.owner_address().await.unwrap_err();
    assert!(matches!(err, DbError::SchemaMissing { .. }), "{err}");
    assert!(!err.class().is_permanent(), "{err}");
    assert!(err.to_string().contains(&schema.schema), "{err}");
    assert!(matches!(
        db.purge("zzzz", Some(SIDECAR), 3, &CancellationToken::new())
            .await,
        Err(DbError::SchemaMissing { .. })
    ));
    assert!(matches!(
        db.adopt_address(RM, SIDECAR).await,
        Err(DbError::SchemaMissing { .. })
    ));
    assert_eq!(db.data_version().await.unwrap(), None);

    // A schema with only some of the tables is still missing.
    schema
        .client
        .batch_execute(&format!(
            "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".\"changeLog\" (watermark TEXT, pos INT8, change JSON NOT NULL, precommit TEXT, PRIMARY KEY (watermark, pos));",
            schema.schema
        ))
        .await
        .unwrap();
    assert_eq!(db.status().await, DbState::SchemaMissing);
    schema
        .client
        .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", schema.schema))
        .await
        .unwrap();

    schema.create_tables(Some(5), Some(RM)).await;
    assert_eq!(db.status().await, DbState::Up);
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));
    shutdown.cancel();
    schema.drop().await;
}

#[tokio::test]
async fn reconnects_after_its_backend_is_terminated() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    let (db, shutdown) = schema.connected().await;
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));

    let terminated = schema
        .client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&schema.application_name()],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(terminated, 1);

    // The next call may still race the supervisor noticing; either way it fails as unavailable, never hangs.
    match db.owner_address().await {
        Ok(address) => assert_eq!(address.as_deref(), Some(RM)),
        Err(err) => assert!(!err.class().is_permanent(), "{err}"),
    }
    eventually("the sidecar reconnects", || async {
        db.status().await == DbState::Up
    })
    .await;
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));
    shutdown.cancel();
    schema.drop().await;
}

/// Forwards every connection accepted on `listener` to the test server.
fn forward(listener: TcpListener, upstream: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut down, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    })
}

#[tokio::test]
async fn unavailable_until_a_server_appears() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    let real = url::Url::parse(&pg::database_url()).unwrap();
    let upstream = format!(
        "{}:{}",
        real.host_str().unwrap(),
        real.port().unwrap_or(5432)
    );
    // A port nobody listens on, for now.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut url = real.clone();
    url.set_port(Some(addr.port())).unwrap();
    let (db, shutdown) = schema.start(url.as_str().parse().unwrap());

    let err = db.owner_address().await.unwrap_err();
    assert!(matches!(err, DbError::Unavailable { .. }), "{err}");
    assert!(!err.class().is_permanent(), "{err}");
    eventually("the status says why it is down", || async {
        matches!(db.status().await, DbState::Down(reason) if reason.contains("connect"))
    })
    .await;

    let proxy = forward(TcpListener::bind(addr).await.unwrap(), upstream);
    tokio::time::timeout(Duration::from_secs(10), db.ready())
        .await
        .expect("connects once the server is there");
    assert_eq!(db.status().await, DbState::Up);
    assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));

    // Losing the server again: unavailable, not an error of the statement.
    proxy.abort();
    let _ = proxy.await;
    shutdown.cancel();
    eventually("calls fail as unavailable after shutdown", || async {
        matches!(db.owner_address().await, Err(DbError::Unavailable { .. }))
    })
    .await;
    schema.drop().await;
}

#[tokio::test]
async fn sslmode_prefer_and_disable_work_without_tls_and_require_refuses() {
    let schema = TestSchema::create(Some(5), Some(RM)).await;
    for mode in ["disable", "prefer"] {
        let mut config = pg::pg_config();
        config.ssl_mode(match mode {
            "disable" => tokio_postgres::config::SslMode::Disable,
            _ => tokio_postgres::config::SslMode::Prefer,
        });
        let (db, shutdown) = schema.start(config);
        tokio::time::timeout(Duration::from_secs(10), db.ready())
            .await
            .unwrap_or_else(|_| panic!("sslmode={mode} connects"));
        assert_eq!(db.owner_address().await.unwrap().as_deref(), Some(RM));
        shutdown.cancel();
    }

    // The test server has no TLS: `require` must not fall back to plain text.
    let mut config = pg::pg_config();
    config.ssl_mode(tokio_postgres::config::SslMode::Require);
    let (db, shutdown) = schema.start(config);
    eventually("sslmode=require reports the missing TLS", || async {
        matches!(db.status().await, DbState::Down(reason) if reason.contains("TLS"))
    })
    .await;
    assert!(matches!(
        db.owner_address().await,
        Err(DbError::Unavailable { .. })
    ));
    shutdown.cancel();
    schema.drop().await;
}

/// LexiVersions are `[0-9a-z]` with a length prefix; Zero compares them with the column's collation. The common
/// collations agree with byte order on such strings, which is what lets the sidecar use the primary-key index.
#[tokio::test]
async fn watermark_order_is_byte_order_under_the_server_collations() {
    let client = pg::connect().await;
    let mut values: Vec<u64> = vec![
        0,
        1,
        9,
        10,
        35,
        36,
        37,
        100,
        1295,
        1296,
        46655,
        46656,
        618_000_000,
        (0x16 << 32) | 0xB374_D848,
        u64::MAX,
    ];
    values.extend((0..200u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (i % 60)));
    values.sort();
    values.dedup();
    let numeric: Vec<String> = values.iter().map(|v| lexi(*v)).collect();
    let mut bytes = numeric.clone();
    bytes.sort();
    assert_eq!(bytes, numeric, "lexi-versions sort numerically as bytes");
    assert_eq!(lexi(618_000_000).len(), 7);
    assert_eq!(lexi((0x16 << 32) | 0xB374_D848), "718sh0nk8");

    let default: String = client
        .query_one(
            "SELECT datcollate FROM pg_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut collations = vec!["default".to_string()];
    for row in client
        .query(
            "SELECT collname FROM pg_collation WHERE collname IN \
             ('C', 'POSIX', 'C.utf8', 'ucs_basic', 'en_US', 'en_US.utf8', 'de_DE.utf8', 'und-x-icu', 'en-US-x-icu') \
             AND collencoding IN (-1, (SELECT encoding FROM pg_database WHERE datname = current_database()))",
            &[],
        )
        .await
        .unwrap()
    {
        collations.push(row.get(0));
    }
    let mut shuffled = numeric.clone();
    shuffled.reverse();
    shuffled.rotate_left(numeric.len() / 3);
    for collation in &collations {
        let sorted: Vec<String> = client
            .query(
                &format!(
                    "SELECT w FROM unnest($1::text[]) AS w ORDER BY w COLLATE \"{collation}\""
                ),
                &[&shuffled],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            sorted, numeric,
            "collation {collation} (database default {default})"
        );
        for (a, b) in [("0z", "110"), ("9", "a"), ("1zz", "2100"), ("0a", "0b")] {
            let less: bool = client
                .query_one(
                    &format!("SELECT $1::text < $2::text COLLATE \"{collation}\""),
                    &[&a, &b],
                )
                .await
                .unwrap()
                .get(0);
            assert!(less, "{a} < {b} under {collation}");
        }
    }
    eprintln!("watermark order checked under {collations:?} (database default {default})");
}

#[tokio::test]
async fn the_purge_walks_the_primary_key_without_scanning_the_table() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let log = schema.table("changeLog");
    // Enough rows for the planner to prefer a sequential scan if the statement let it.
    schema
        .client
        .batch_execute(&format!(
            "INSERT INTO {log} SELECT '8' || lpad(to_hex(g / 10), 9, '0'), g % 10, '{{\"tag\":\"insert\"}}'::json, NULL \
             FROM generate_series(0, 49999) AS g; ANALYZE {log};"
        ))
        .await
        .unwrap();
    let scans = || async {
        let row = schema
            .client
            .query_one(
                "SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
                &[&log],
            )
            .await
            .unwrap();
        (
            row.get::<_, i64>(0),
            row.get::<_, Option<i64>>(1).unwrap_or(0),
        )
    };
    // Counts from this setup session must be in the view before the baseline is taken.
    schema
        .client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    let (seq_before, idx_before) = scans().await;
    let (db, shutdown) = schema.connected().await;
    let outcome = purge(&db, "8000000fa0", Some(SIDECAR), DEFAULT_PURGE_BATCH_ROWS).await;
    assert_eq!(outcome.rows, 40_000);
    assert_eq!(outcome.batches, 5);
    // An idle backend flushes its statistics only every 10 s; one that exits flushes them at once.
    shutdown.cancel();
    eventually("the purge's index scans are counted", || async {
        scans().await.1 > idx_before
    })
    .await;
    assert_eq!(
        scans().await.0,
        seq_before,
        "the purge scanned changeLog sequentially"
    );
    schema.drop().await;
}

#[tokio::test]
async fn a_collation_that_misorders_watermarks_falls_back_to_byte_order() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let log = schema.table("changeLog");
    // Estonian sorts "z" between "s" and "t": 2s00 < 2z00 < 2t00, where bytes say 2s00 < 2t00 < 2z00.
    let available: bool = schema
        .client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'et-x-icu')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(available, "the test server needs ICU collations (et-x-icu)");
    schema
        .client
        .batch_execute(&format!(
            r#"ALTER TABLE {log} ALTER COLUMN watermark TYPE TEXT COLLATE "et-x-icu""#
        ))
        .await
        .unwrap();
    for w in ["2s00", "2t00", "2z00"] {
        schema.insert_transaction(w, 1).await;
    }
    let naive: Vec<String> = schema
        .client
        .query(
            &format!("SELECT DISTINCT watermark FROM {log} ORDER BY watermark"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(naive, ["2s00", "2z00", "2t00"], "the column misorders");
    let (db, shutdown) = schema.connected().await;

    let outcome = purge(&db, "2t00", Some(SIDECAR), 2).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&["2t00", "2z00"], 3));
    assert_eq!(db.min_watermark().await.unwrap().as_deref(), Some("2t00"));

    // The newest watermark as bytes is 2z00, not the column's max(watermark) 2t00: a target at it is in the log.
    let outcome = purge(&db, "2z00", Some(SIDECAR), 2).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&["2z00"], 3));
    shutdown.cancel();
    schema.drop().await;
}

/// `make test` runs the suite once per PostgreSQL major (scripts/test.sh): each run must be on the major it says,
/// or a matrix that silently fell back to one server would pass for all of them.
#[tokio::test]
async fn the_server_is_the_major_the_test_run_names() {
    let client = pg::connect().await;
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    let Ok(major) = std::env::var("SIDECAR_TEST_PG_MAJOR") else {
        eprintln!("SIDECAR_TEST_PG_MAJOR unset: server_version_num {version}");
        return;
    };
    assert_eq!(version / 10_000, major.parse::<i32>().unwrap());
    assert!(
        (15..=18).contains(&(version / 10_000)),
        "the sidecar supports PostgreSQL 15 to 18, the server is {version}"
    );
}

/// A database whose default collation comes from ICU: the column's collation is `default`, which the sidecar
/// names from `pg_database` (PostgreSQL 16 removed the `lc_collate` setting it once read) and probes for byte
/// order like any other; ICU's root order agrees with bytes on LexiVersions, so the index serves the purge.
#[tokio::test]
async fn a_database_with_an_icu_default_collation_reads_and_purges() {
    let admin = pg::connect().await;
    let name = format!("icu_{}", pg::unique_app_id());
    admin
        .batch_execute(&format!(
            "CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu \
             ICU_LOCALE 'und' LOCALE 'C.UTF-8'"
        ))
        .await
        .expect("create a database with an ICU default collation");
    let provider: String = admin
        .query_one(
            "SELECT datlocprovider::text FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(provider, "i");
    let mut config = pg::pg_config();
    config.dbname(&name);
    let app_id = pg::unique_app_id();
    let schema = TestSchema {
        schema: format!("{app_id}_0/cdc"),
        app_id,
        client: pg::connect_with(&config).await,
    };
    schema.create_tables(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.start(config);
    tokio::time::timeout(Duration::from_secs(10), db.ready())
        .await
        .expect("connects");

    assert_eq!(db.min_watermark().await.unwrap().as_deref(), Some("0u"));
    let outcome = purge(&db, "110", Some(SIDECAR), 2).await;
    assert_eq!((outcome.rows, outcome.stopped), (6, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));
    assert_eq!(db.min_watermark().await.unwrap().as_deref(), Some("110"));

    shutdown.cancel();
    drop(schema);
    // The sidecar's connection closes on shutdown; wait for it before dropping the database.
    eventually("the database can be dropped", || async {
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
            .await
            .is_ok()
    })
    .await;
}

/// A role that may read Zero's tables but not delete from them: the purge fails as a permission problem, with its
/// SQLSTATE, and deletes nothing.
#[tokio::test]
async fn a_purge_the_role_may_not_run_is_a_permanent_permission_failure() {
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let role = format!("reader_{}", schema.app_id);
    schema
        .client
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; GRANT USAGE ON SCHEMA \"{s}\" TO \"{role}\"; \
             GRANT SELECT ON ALL TABLES IN SCHEMA \"{s}\" TO \"{role}\";",
            s = schema.schema
        ))
        .await
        .unwrap();
    let mut config = pg::pg_config();
    config.user(&role);
    let (db, shutdown) = schema.start(config);
    tokio::time::timeout(Duration::from_secs(10), db.ready())
        .await
        .expect("connects");

    assert_eq!(db.min_watermark().await.unwrap().as_deref(), Some("0u"));
    let err = db
        .purge("1zz", Some(SIDECAR), 2, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Permission, "{err}");
    assert!(err.class().is_permanent());
    assert_eq!(
        err.sqlstate(),
        Some(SqlState::INSUFFICIENT_PRIVILEGE.code())
    );
    assert_eq!(schema.rows().await, expected_rows(&refs(&w), 3));

    shutdown.cancel();
    schema
        .client
        .batch_execute(&format!(
            "REVOKE ALL ON ALL TABLES IN SCHEMA \"{s}\" FROM \"{role}\"; \
             REVOKE ALL ON SCHEMA \"{s}\" FROM \"{role}\";",
            s = schema.schema
        ))
        .await
        .unwrap();
    let client = pg::connect().await;
    schema.drop().await;
    eventually("the role can be dropped", || async {
        client
            .batch_execute(&format!("DROP ROLE IF EXISTS \"{role}\""))
            .await
            .is_ok()
    })
    .await;
}

/// A purge by the sidecar's address, three rows a batch, asking `ceiling` before every batch.
async fn purge_under(
    db: &ChangeDb,
    before: &str,
    ceiling: impl Fn() -> litestream_sidecar::cleanup::Ceiling,
) -> PurgeOutcome {
    let mut outcome = PurgeOutcome::default();
    db.purge_within(
        PurgeTarget {
            before,
            replica_version: None,
            slots: None,
        },
        Some(SIDECAR),
        3,
        &CancellationToken::new(),
        || std::future::ready(ceiling()),
        &mut outcome,
    )
    .await
    .unwrap();
    outcome
}

/// The ceiling is asked before every batch: a reservation that appears between two batches limits the batches
/// after it to its floor, and one that protects everything stops the purge; rows at and above the floor stay.
#[tokio::test]
async fn a_reservation_opened_mid_purge_limits_the_batches_after_it() {
    use std::sync::atomic::{AtomicU32, Ordering};

    use litestream_sidecar::cleanup::Ceiling;

    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let (db, shutdown) = schema.connected().await;

    // Three rows a batch: the first batch takes all of 0u, then a reservation at floor 0z (= w[1]) appears.
    let asked = AtomicU32::new(0);
    let outcome = purge_under(&db, &w[4], || {
        if asked.fetch_add(1, Ordering::SeqCst) == 0 {
            Ceiling::None
        } else {
            Ceiling::Below(w[1].clone())
        }
    })
    .await;
    assert_eq!(outcome.rows, 3);
    assert_eq!(
        outcome.stopped,
        Some(PurgeStop::Reserved {
            floor: Some(w[1].clone())
        })
    );
    assert!(!outcome.is_complete());
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[1..]), 3));

    // A reservation that protects every row: nothing more is deleted.
    let outcome = purge_under(&db, &w[4], || Ceiling::Everything).await;
    assert_eq!(
        (outcome.rows, outcome.stopped),
        (0, Some(PurgeStop::Reserved { floor: None }))
    );
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[1..]), 3));

    // A floor above the target changes nothing.
    let outcome = purge_under(&db, &w[2], || Ceiling::Below(w[4].clone())).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));
    shutdown.cancel();
    schema.drop().await;
}

/// A sidecar's handle for `zero` under its own `application_name`, so that its backend can be told apart from
/// another sidecar's on the same shard.
async fn sidecar(zero: &ZeroConfig, application_name: &str) -> (ChangeDb, CancellationToken) {
    let mut config = pg::pg_config();
    config.application_name(application_name);
    let shutdown = CancellationToken::new();
    let db = ChangeDb::start(config, zero, pg::fast_options(), shutdown.clone());
    tokio::time::timeout(Duration::from_secs(10), db.ready())
        .await
        .expect("the sidecar connects to the test server");
    (db, shutdown)
}

/// A test schema whose purger lock key has a negative hashed half, or a positive one.
async fn schema_with_lock_key(negative: bool) -> TestSchema {
    loop {
        let app_id = pg::unique_app_id();
        let zero = ZeroConfig {
            app_id: app_id.clone(),
            shard_num: 0,
        };
        if (purger_lock_key(&zero).1 < 0) == negative {
            let schema = TestSchema {
                schema: zero.cdc_schema(),
                app_id,
                client: pg::connect().await,
            };
            schema.create_tables(Some(5), Some(SIDECAR)).await;
            return schema;
        }
    }
}

/// How many of the backends named `application_name` hold `zero`'s purger lock, as `pg_locks` shows it: the keys
/// as `oid`, so a negative int4 as itself plus 2^32.
async fn purger_locks(
    admin: &tokio_postgres::Client,
    application_name: &str,
    zero: &ZeroConfig,
) -> i64 {
    let (class, key) = purger_lock_key(zero);
    admin
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
              WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.granted \
                AND l.classid = $2 AND l.objid = $3 AND l.objsubid = 2",
            &[&application_name, &(class as u32), &(key as u32)],
        )
        .await
        .unwrap()
        .get(0)
}

/// Terminates the backend of the sidecar named `application_name`, and waits until `db` is connected again.
async fn terminate_and_reconnect(
    admin: &tokio_postgres::Client,
    db: &ChangeDb,
    application_name: &str,
) {
    // With a timeout, pg_terminate_backend waits until the backend has exited.
    let terminated: bool = admin
        .query_one(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated, "{application_name} terminated");
    eventually("the sidecar reconnects", || async {
        db.status().await == DbState::Up
    })
    .await;
}

/// Two sidecars of one shard: one holds the purger lock, the other stands by. Claiming again never stacks the
/// lock (one release frees it), and when the holder's session ends the other's next claim takes it over.
#[tokio::test]
async fn one_sidecar_per_shard_holds_the_purger_lock() {
    let admin = pg::connect().await;
    // Both signs of the hashed half: `pg_locks` shows a negative one as a large oid.
    for negative in [false, true] {
        let schema = schema_with_lock_key(negative).await;
        let zero = schema.zero();
        let (a_name, b_name) = (
            format!("{}-a", schema.app_id),
            format!("{}-b", schema.app_id),
        );
        let (a, stop_a) = sidecar(&zero, &a_name).await;
        let (b, stop_b) = sidecar(&zero, &b_name).await;

        assert_eq!(a.claim_purger().await.unwrap(), Purger::Held);
        assert_eq!(b.claim_purger().await.unwrap(), Purger::Standby);
        for _ in 0..3 {
            assert_eq!(a.claim_purger().await.unwrap(), Purger::Held);
        }
        assert_eq!(b.claim_purger().await.unwrap(), Purger::Standby);
        assert_eq!(purger_locks(&admin, &a_name, &zero).await, 1);
        assert_eq!(purger_locks(&admin, &b_name, &zero).await, 0);

        // One release frees it: the claims did not stack.
        assert!(a.release_purger().await.unwrap());
        assert_eq!(purger_locks(&admin, &a_name, &zero).await, 0);
        assert!(!a.release_purger().await.unwrap());
        assert_eq!(b.claim_purger().await.unwrap(), Purger::Held);
        assert_eq!(a.claim_purger().await.unwrap(), Purger::Standby);

        // The holder shuts down: its session ends, and the other's next claim takes the lock over.
        stop_b.cancel();
        eventually("the standby takes the lock over", || async {
            a.claim_purger().await.unwrap() == Purger::Held
        })
        .await;
        assert_eq!(purger_locks(&admin, &a_name, &zero).await, 1);
        stop_a.cancel();
        schema.drop().await;
    }
}

/// The lock goes with the session: a holder whose backend is terminated reconnects without it, so its purge
/// batches delete nothing until it claims again, and meanwhile the standby may take over.
#[tokio::test]
async fn a_purger_that_lost_its_session_deletes_nothing_until_it_claims_again() {
    let admin = pg::connect().await;
    let schema = TestSchema::create(Some(5), Some(SIDECAR)).await;
    let w = with_log(&schema).await;
    let all = schema.rows().await;
    let zero = schema.zero();
    let (a_name, b_name) = (
        format!("{}-a", schema.app_id),
        format!("{}-b", schema.app_id),
    );
    let (a, stop_a) = sidecar(&zero, &a_name).await;
    let (b, stop_b) = sidecar(&zero, &b_name).await;
    let not_purger = (0, 0, Some(PurgeStop::NotPurger));

    assert_eq!(a.claim_purger().await.unwrap(), Purger::Held);
    assert_eq!(b.claim_purger().await.unwrap(), Purger::Standby);
    let outcome = purge(&b, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.batches, outcome.stopped), not_purger);
    assert_eq!(schema.rows().await, all);

    // The new session does not hold the lock, although nobody else has it.
    terminate_and_reconnect(&admin, &a, &a_name).await;
    let outcome = purge(&a, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.batches, outcome.stopped), not_purger);
    assert_eq!(schema.rows().await, all);
    assert_eq!(a.claim_purger().await.unwrap(), Purger::Held);
    let outcome = purge(&a, &w[1], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[1..]), 3));

    // Lost again: this time the standby takes over before the old holder claims.
    terminate_and_reconnect(&admin, &a, &a_name).await;
    assert_eq!(b.claim_purger().await.unwrap(), Purger::Held);
    assert_eq!(a.claim_purger().await.unwrap(), Purger::Standby);
    let outcome = purge(&a, &w[4], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.batches, outcome.stopped), not_purger);
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[1..]), 3));
    let outcome = purge(&b, &w[2], Some(SIDECAR), 3).await;
    assert_eq!((outcome.rows, outcome.stopped), (3, None));
    assert_eq!(schema.rows().await, expected_rows(&refs(&w[2..]), 3));
    stop_a.cancel();
    stop_b.cancel();
    schema.drop().await;
}

/// The lock is the shard's: another shard of the app, or the same shard of another app on the same database, has
/// its own, and each is still held against a second sidecar of that shard.
#[tokio::test]
async fn each_shard_and_app_has_its_own_purger_lock() {
    let (app, other) = (pg::unique_app_id(), pg::unique_app_id());
    let shards = [(app.clone(), 0), (app, 1), (other, 0)]
        .map(|(app_id, shard_num)| ZeroConfig { app_id, shard_num });
    let mut holders = Vec::new();
    for (i, zero) in shards.iter().enumerate() {
        let (db, stop) = sidecar(zero, &format!("{}-{i}", zero.app_id)).await;
        assert_eq!(
            db.claim_purger().await.unwrap(),
            Purger::Held,
            "{}",
            zero.cdc_schema()
        );
        holders.push((db, stop));
    }
    for (i, zero) in shards.iter().enumerate() {
        let (db, stop) = sidecar(zero, &format!("{}-{i}-second", zero.app_id)).await;
        assert_eq!(
            db.claim_purger().await.unwrap(),
            Purger::Standby,
            "{}",
            zero.cdc_schema()
        );
        stop.cancel();
    }
    for (_, stop) in holders {
        stop.cancel();
    }
}
