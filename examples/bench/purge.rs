//! Change-log purge: 1,000,000 rows of realistic changes in a real PostgreSQL, purged down to the newest
//! transaction through `ChangeDb::purge` in its default batches, on every PostgreSQL major `make bench` started
//! (`SIDECAR_TEST_DATABASE_URLS`, 15 and 17 by default), one after the other with the same rows, then compared.
//! The throwaway servers run with fsync off, so the figures leave out WAL flushes a production server pays at each
//! batch's commit.

use std::time::{Duration, Instant};

use litestream_sidecar::cleanup::change_db::{
    ChangeDb, DbState, Options, DEFAULT_PURGE_BATCH_ROWS,
};
use litestream_sidecar::protocol::shard::ZeroConfig;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::util::{ms, Report};

const ROWS: i64 = 1_000_000;
/// Rows per upstream transaction: begin, eight inserts, commit.
const ROWS_PER_TX: i64 = 10;
const ADDRESS: &str = "127.0.0.1:4851";

/// What one server's run measured.
struct Figures {
    major: String,
    rate: f64,
    slowest_batch: Duration,
}

/// `(major, url)` of every server to measure: `SIDECAR_TEST_DATABASE_URLS` ("15=postgres://…,17=postgres://…"),
/// else the one `SIDECAR_TEST_DATABASE_URL`.
fn servers() -> Vec<(String, String)> {
    if let Ok(urls) = std::env::var("SIDECAR_TEST_DATABASE_URLS") {
        let servers: Vec<(String, String)> = urls
            .split(',')
            .filter_map(|entry| entry.split_once('='))
            .map(|(major, url)| (major.to_string(), url.to_string()))
            .collect();
        if !servers.is_empty() {
            return servers;
        }
    }
    std::env::var("SIDECAR_TEST_DATABASE_URL")
        .map(|url| vec![("?".to_string(), url)])
        .unwrap_or_default()
}

pub async fn run(report: &mut Report) {
    println!("change-log purge");
    let servers = servers();
    if servers.is_empty() {
        report.add(
            "change-log purge",
            "skipped",
            "needs SIDECAR_TEST_DATABASE_URL (make bench)",
            None,
        );
        return;
    }
    let mut figures = Vec::new();
    for (major, url) in &servers {
        figures.push(run_on(report, major, url).await);
    }
    if let [first, rest @ ..] = figures.as_slice() {
        for other in rest {
            report.add(
                format!(
                    "  PostgreSQL {} vs {}: purge rate, slowest batch",
                    other.major, first.major
                ),
                format!(
                    "x{:.2}, x{:.2}",
                    other.rate / first.rate,
                    other.slowest_batch.as_secs_f64() / first.slowest_batch.as_secs_f64()
                ),
                "",
                None,
            );
        }
    }
}

async fn run_on(report: &mut Report, major: &str, url: &str) -> Figures {
    let pg: tokio_postgres::Config = url.parse().expect("SIDECAR_TEST_DATABASE_URL");
    let (client, connection) = pg.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);

    let zero = ZeroConfig {
        app_id: format!("bench_{}", std::process::id()),
        shard_num: 0,
    };
    let schema = format!("\"{}\"", zero.cdc_schema());
    let log = format!("{schema}.\"changeLog\"");
    crate::util::create_zero_tables(&client, &zero, "8000000000", Some(ADDRESS)).await;

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
        format!("PostgreSQL {major}: fill {ROWS} changeLog rows (setup, server-side)"),
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
        format!("PostgreSQL {major}: purge, slowest batch ({DEFAULT_PURGE_BATCH_ROWS} rows)"),
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
        format!("PostgreSQL {major}: purge rate, {} rows", outcome.rows),
        format!("{rate:.0} rows/s"),
        ">= 100000 rows/s",
        Some(rate >= 100_000.0),
    );
    report.add(
        format!("PostgreSQL {major}: purge total"),
        format!("{:.2} s", took.as_secs_f64()),
        "",
        None,
    );

    shutdown.cancel();
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the bench schema");
    Figures {
        major: major.to_string(),
        rate,
        slowest_batch: outcome.slowest_batch,
    }
}
