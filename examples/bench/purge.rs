//! Change-log purge: 1,000,000 rows of realistic changes in a real PostgreSQL, purged down to the newest
//! transaction through `ChangeDb::purge` in its default batches. The throwaway server runs with fsync off, so
//! the figures leave out WAL flushes a production server pays at each batch's commit.

use std::time::{Duration, Instant};

use litestream_sidecar::change_db::{ChangeDb, DbState, Options, DEFAULT_PURGE_BATCH_ROWS};
use litestream_sidecar::config::ZeroConfig;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::util::{ms, Report};

const ROWS: i64 = 1_000_000;
/// Rows per upstream transaction: begin, eight inserts, commit.
const ROWS_PER_TX: i64 = 10;
const ADDRESS: &str = "127.0.0.1:4851";

pub async fn run(report: &mut Report) {
    println!("change-log purge");
    let Ok(url) = std::env::var("SIDECAR_TEST_DATABASE_URL") else {
        report.add(
            "change-log purge",
            "skipped",
            "needs SIDECAR_TEST_DATABASE_URL (make bench)",
            None,
        );
        return;
    };
    let pg: tokio_postgres::Config = url.parse().expect("SIDECAR_TEST_DATABASE_URL");
    let (client, connection) = pg.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);

    let zero = ZeroConfig {
        app_id: format!("bench_{}", std::process::id()),
        shard_num: 0,
    };
    let schema = format!("\"{}\"", zero.cdc_schema());
    let log = format!("{schema}.\"changeLog\"");
    client
        .batch_execute(&format!(
            r#"
            CREATE SCHEMA {schema};
            CREATE TABLE {log} (
              watermark TEXT, pos INT8, change JSON NOT NULL, precommit TEXT, PRIMARY KEY (watermark, pos)
            );
            CREATE TABLE {schema}."replicationState" (
              "lastWatermark" TEXT NOT NULL, "owner" TEXT, "ownerAddress" TEXT,
              "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            CREATE TABLE {schema}."replicationConfig" (
              "replicaVersion" TEXT NOT NULL, "publications" TEXT[] NOT NULL, "resetRequired" BOOL,
              "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            INSERT INTO {schema}."replicationConfig" ("replicaVersion", "publications")
              VALUES ('8000000000', ARRAY['_zero_public_0']);
            INSERT INTO {schema}."replicationState" ("lastWatermark", "owner", "ownerAddress")
              VALUES ('8000000000', 'rm-task-1', '{ADDRESS}');
            "#
        ))
        .await
        .expect("create the change DB schema");

    // Server-side generation: LexiVersion-shaped commit watermarks, begin / insert / commit rows whose inserts
    // carry a ~300-byte row as Zero's change source writes them.
    let started = Instant::now();
    client
        .batch_execute(&format!(
            r#"
            INSERT INTO {log} (watermark, pos, change, precommit)
            SELECT w, p,
                   CASE p WHEN 0 THEN '{{"tag":"begin","json":"p"}}'::json
                          WHEN {last} THEN '{{"tag":"commit"}}'::json
                          ELSE json_build_object(
                            'tag', 'insert',
                            'relation', json_build_object('schema', 'public', 'name', 'issue',
                                                          'keyColumns', json_build_array('id'),
                                                          'replicaIdentity', 'default'),
                            'new', json_build_object('id', md5(g::text), 'title', 'Issue number ' || g,
                                                     'open', g % 3 = 0, 'modified', 1715000000000 + g,
                                                     'creatorID', md5((g * 7)::text)))
                   END,
                   CASE p WHEN {last} THEN w END
              FROM (SELECT g, '8' || lpad(to_hex(100000 + g / {ROWS_PER_TX}), 9, '0') AS w,
                           g % {ROWS_PER_TX} AS p
                      FROM generate_series(0, {max}) AS g) AS rows;
            "#,
            last = ROWS_PER_TX - 1,
            max = ROWS - 1,
        ))
        .await
        .expect("fill the change log");
    // Separately: VACUUM refuses to run inside the implicit transaction of a multi-statement batch.
    client
        .batch_execute(&format!("VACUUM ANALYZE {log}"))
        .await
        .expect("vacuum the change log");
    let filled = started.elapsed();
    let row = client
        .query_one(
            &format!(
                "SELECT max(watermark), avg(octet_length(change::text)) FILTER (WHERE pos = 1)::float8, \
                 pg_total_relation_size(to_regclass($1)) FROM {log}"
            ),
            &[&log],
        )
        .await
        .unwrap();
    let (newest, change_bytes, table_bytes): (String, f64, i64) =
        (row.get(0), row.get(1), row.get(2));
    report.add(
        format!("fill {ROWS} changeLog rows (setup, server-side)"),
        format!("{:.2} s", filled.as_secs_f64()),
        "",
        None,
    );
    report.add(
        "  insert change size, change log size",
        format!(
            "{change_bytes:.0} B, {:.0} MiB",
            table_bytes as f64 / (1 << 20) as f64
        ),
        "",
        None,
    );

    let shutdown = CancellationToken::new();
    let db = ChangeDb::start(pg, &zero, Options::default(), shutdown.clone());
    tokio::time::timeout(Duration::from_secs(10), db.ready())
        .await
        .expect("the sidecar connects");
    assert_eq!(db.status().await, DbState::Up);

    let started = Instant::now();
    let outcome = db
        .purge(
            &newest,
            Some(ADDRESS),
            DEFAULT_PURGE_BATCH_ROWS,
            &CancellationToken::new(),
        )
        .await
        .expect("purge");
    let took = started.elapsed();
    assert!(outcome.is_complete(), "{outcome:?}");
    assert_eq!(outcome.rows, (ROWS - ROWS_PER_TX) as u64);
    let left: i64 = client
        .query_one(&format!("SELECT count(*) FROM {log}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, ROWS_PER_TX, "only the newest transaction is left");

    let rate = outcome.rows as f64 / took.as_secs_f64();
    report.add(
        format!("purge to the newest transaction: slowest batch ({DEFAULT_PURGE_BATCH_ROWS} rows)"),
        ms(outcome.slowest_batch),
        "<= 250 ms",
        Some(outcome.slowest_batch <= Duration::from_millis(250)),
    );
    report.add(
        format!("  wall clock per batch ({} batches)", outcome.batches),
        ms(took / outcome.batches.max(1)),
        "",
        None,
    );
    report.add(
        format!("purge rate, {} rows", outcome.rows),
        format!("{rate:.0} rows/s"),
        ">= 100000 rows/s",
        Some(rate >= 100_000.0),
    );
    report.add(
        "purge total",
        format!("{:.2} s", took.as_secs_f64()),
        "",
        None,
    );

    shutdown.cancel();
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the bench schema");
}
