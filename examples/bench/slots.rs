//! Slots in the change DB: the statements per second a sidecar sends to the change DB at its defaults with 500
//! open reservations and 100 acknowledging subscribers (counted on the wire by a proxy in front of PostgreSQL), and
//! a purge batch's time with the slot check (the shard's lock, `replicaVersion`, every live slot) beside one
//! without it, in alternating segments of one change log (ABBA, so that neither side gets the warmer cache).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use litestream_sidecar::cleanup::change_db::{
    ChangeDb, Options, PurgeOutcome, PurgeTarget, ReservationWrite, SlotCheck, SlotRule,
    SlotWrites, SubscriberRow, DEFAULT_PURGE_BATCH_ROWS,
};
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::protocol::shard::ZeroConfig;
use litestream_sidecar::protocol::Mode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use crate::util::{ms, Report};

const RESERVATIONS: usize = 500;
const SUBSCRIBERS: usize = 100;
/// How long statements are counted: one default check interval (60 s) and six heartbeats.
const WINDOW: Duration = Duration::from_secs(60);
const REPLICA: &str = "811110000";

pub async fn run(report: &mut Report) {
    println!("slots in the change DB");
    let Ok(url) = std::env::var("SIDECAR_TEST_DATABASE_URL") else {
        report.add(
            "slots",
            "skipped",
            "needs SIDECAR_TEST_DATABASE_URL (make bench)",
            None,
        );
        return;
    };
    statements(report, &url).await;
    batches(report, &url).await;
}

/// Zero's change DB tables for `zero`'s shard, with `transactions` transactions of ten rows each.
async fn change_db(client: &tokio_postgres::Client, zero: &ZeroConfig, transactions: i64) {
    crate::util::create_zero_tables(client, zero, REPLICA, None).await;
    let log = format!("\"{}\".\"changeLog\"", zero.cdc_schema());
    client
        .batch_execute(&format!(
            r#"
            INSERT INTO {log} (watermark, pos, change, precommit)
            SELECT watermark(g / 10), g % 10,
                   json_build_object('tag', 'insert', 'new', json_build_object('id', md5(g::text))),
                   CASE g % 10 WHEN 9 THEN watermark(g / 10) END
              FROM generate_series(0, {rows}) AS g;
            "#,
            rows = transactions * 10 - 1,
        ))
        .await
        .expect("fill the change log");
    // Separately: VACUUM refuses to run inside the implicit transaction of a multi-statement batch.
    client
        .batch_execute(&format!("VACUUM ANALYZE {log}"))
        .await
        .expect("vacuum the change log");
}

/// Drops the shard's two schemas, Zero's and the sidecar's.
async fn drop_schemas(client: &tokio_postgres::Client, zero: &ZeroConfig) {
    client
        .batch_execute(&format!(
            "DROP SCHEMA \"{}\" CASCADE; DROP SCHEMA \"{}\" CASCADE",
            zero.cdc_schema(),
            zero.sidecar_schema()
        ))
        .await
        .expect("drop the bench schemas");
}

/// The watermark of transaction `n`: canonical LexiVersions of nine digits (no leading zero; the slots' floors are
/// checked), as the change log above has them, for `n` below 948,575.
fn watermark(n: i64) -> String {
    format!("81111{:x}", 100_000 + n)
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = url
        .parse::<tokio_postgres::Config>()
        .expect("SIDECAR_TEST_DATABASE_URL")
        .connect(NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE OR REPLACE FUNCTION watermark(n bigint) RETURNS text LANGUAGE sql IMMUTABLE \
             AS $$ SELECT '81111' || to_hex(100000 + n) $$",
        )
        .await
        .expect("the watermark function");
    client
}

/// How often each statement was parsed, by its first words.
type Census = Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>;

/// A TCP proxy in front of PostgreSQL that counts the statements its clients run: every Query (simple protocol)
/// and every Execute (extended protocol) message. Returns the URL through it and the count.
async fn counting_proxy(url: &str) -> (String, Arc<AtomicU64>, Census) {
    let config: tokio_postgres::Config = url.parse().expect("SIDECAR_TEST_DATABASE_URL");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let server = format!("127.0.0.1:{port}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let census: Census = Arc::default();
    let kept = census.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = tokio::net::TcpStream::connect(&server).await else {
                continue;
            };
            // No Nagle on either side: each message passes at once, as it would without the proxy.
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let count = counted.clone();
            let census = kept.clone();
            tokio::spawn(async move {
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = upstream.into_split();
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                let mut pending: Vec<u8> = Vec::new();
                let mut typed = false;
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    pending.extend_from_slice(&buf[..n]);
                    // Whole messages: the startup ones have no type byte (an SSL request first, then the
                    // startup message), every later one has.
                    loop {
                        let header = if typed { 5 } else { 4 };
                        if pending.len() < header {
                            break;
                        }
                        let at = header - 4;
                        let len =
                            u32::from_be_bytes(pending[at..at + 4].try_into().unwrap()) as usize;
                        let whole = at + len;
                        if pending.len() < whole {
                            break;
                        }
                        if typed {
                            if matches!(pending[0], b'Q' | b'E') {
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                            // Parse: a name, then the statement's text.
                            if pending[0] == b'P' {
                                let body = &pending[5..whole];
                                if let Some(text) = body
                                    .iter()
                                    .position(|&b| b == 0)
                                    .and_then(|end| body.get(end + 1..))
                                    .and_then(|rest| rest.split(|&b| b == 0).next())
                                {
                                    let text = String::from_utf8_lossy(text);
                                    let key: String = text
                                        .split_whitespace()
                                        .take(6)
                                        .collect::<Vec<_>>()
                                        .join(" ");
                                    *census.lock().unwrap().entry(key).or_insert(0u64) += 1;
                                }
                            }
                        } else {
                            let code = u32::from_be_bytes(pending[4..8].try_into().unwrap());
                            typed = code == 196_608;
                        }
                        pending.drain(..whole);
                    }
                }
                down.abort();
            });
        }
    });
    let user = config.get_user().unwrap_or("postgres").to_string();
    let dbname = config.get_dbname().unwrap_or("postgres").to_string();
    (
        format!("postgres://{user}@{proxied}/{dbname}?sslmode=disable"),
        count,
        census,
    )
}

async fn statements(report: &mut Report, url: &str) {
    let client = connect(url).await;
    let zero = ZeroConfig {
        app_id: format!("bench_slots_{}", std::process::id()),
        shard_num: 0,
    };
    change_db(&client, &zero, 100).await;
    let (proxied, count, census) = counting_proxy(url).await;
    let litestream = crate::util::litestream_stand_in().await;
    // The stand-in's keys, less its short interval: the sidecar at its defaults.
    let metrics_url = litestream
        .lines()
        .find(|l| l.starts_with("metrics_url"))
        .expect("the stand-in's metrics_url");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [litestream]\nbackup_url = \"s3://bench/replica\"\nproxy_listen = \"127.0.0.1:0\"\n{metrics_url}\n\
         [backup]\nverify = false\n[discovery]\nmode = \"off\"\n[cleanup]\nstate_file = \"none\"\n\
         [zero]\napp_id = \"{}\"\n[change_db]\nurl = \"{proxied}\"\n",
        zero.app_id
    );
    let config = litestream_sidecar::config::from_toml_str(&text, Some(Default::default()))
        .expect("bench config")
        .validate()
        .expect("bench config is valid");
    let app = litestream_sidecar::App::new(config);
    let registry = app.registry().clone();
    let subscribers = app.subscribers().clone();
    let status = app.status().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = app.bind_proxy().await.expect("proxy listeners");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(listener, proxy, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while status.read(|s| s.memory) != litestream_sidecar::cleanup::Memory::Kept {
        assert!(
            Instant::now() < deadline,
            "the slots were not read within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let now = tokio::time::Instant::now();
    let leases: Vec<_> = (0..RESERVATIONS)
        .map(|i| registry.open_for(&format!("restore-{i}"), 6, now))
        .collect();
    let handles: Vec<_> = (0..SUBSCRIBERS)
        .map(|i| {
            subscribers.connect(SubscriberInfo {
                id: format!("vs-{i}"),
                task_id: Some(format!("task-{i}")),
                mode: Mode::Serving,
                replica_version: REPLICA.into(),
                watermark: watermark(0),
            })
        })
        .collect();
    // Live traffic: every subscriber acknowledges a new commit ten times a second.
    let acking = {
        let handles = Arc::new(handles);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                n += 1;
                for handle in handles.iter() {
                    handle.ack(&watermark(n));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Settled: every reservation written, a heartbeat or two.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let before = count.load(Ordering::Relaxed);
    census.lock().unwrap().clear();
    tokio::time::sleep(WINDOW).await;
    let sent = count.load(Ordering::Relaxed) - before;
    let rate = sent as f64 / WINDOW.as_secs_f64();
    report.add(
        format!(
            "statements to the change DB at the defaults, {RESERVATIONS} reservations + {SUBSCRIBERS} subscribers"
        ),
        format!("{rate:.2}/s ({sent} in {} s)", WINDOW.as_secs()),
        "",
        None,
    );
    let mut most: Vec<(String, u64)> = census.lock().unwrap().clone().into_iter().collect();
    most.sort_by_key(|m| std::cmp::Reverse(m.1));
    for (text, n) in most.iter().take(5) {
        report.add(
            format!("  {:.1}/s: {text}", *n as f64 / WINDOW.as_secs_f64()),
            "",
            "",
            None,
        );
    }
    shutdown.cancel();
    let _ = acking.await;
    drop(leases);
    let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    drop_schemas(&client, &zero).await;
}

async fn batches(report: &mut Report, url: &str) {
    const TRANSACTIONS: i64 = 40_000;
    const SEGMENTS: i64 = 8;
    let client = connect(url).await;
    let zero = ZeroConfig {
        app_id: format!("bench_batch_{}", std::process::id()),
        shard_num: 0,
    };
    change_db(&client, &zero, TRANSACTIONS).await;
    let shutdown = CancellationToken::new();
    let db = ChangeDb::start(
        url.parse().unwrap(),
        &zero,
        Options::default(),
        shutdown.clone(),
    );
    db.ready().await;
    db.migrate().await.expect("the sidecar's schema");
    // 500 reservations and 100 subscribers of two sidecars, all at the newest transaction: read by every batch,
    // bounding none of them.
    let newest = watermark(TRANSACTIONS - 1);
    let reservations = (0..RESERVATIONS)
        .map(|i| ReservationWrite::Open {
            task_id: format!("restore-{i}"),
            lease: i as i64,
            floor: Some(newest.clone()),
            replica_version: Some(REPLICA.into()),
            protocol: 6,
            connected: true,
            restore_limit: None,
            opened_ago: Duration::ZERO,
        })
        .collect();
    db.write_slots(
        "bench-a",
        &SlotWrites {
            reservations,
            ..SlotWrites::default()
        },
    )
    .await
    .expect("reservation slots");
    let rows = (0..SUBSCRIBERS)
        .map(|i| SubscriberRow {
            key: format!("bench-b#{i}"),
            task_id: None,
            subscriber_id: format!("vs-{i}"),
            floor: newest.clone(),
            replica_version: REPLICA.into(),
            connected: true,
        })
        .collect();
    db.write_slots(
        "bench-b",
        &SlotWrites {
            subscribers: Some((rows, Duration::from_secs(3600))),
            ..SlotWrites::default()
        },
    )
    .await
    .expect("subscriber slots");

    let (mut plain, mut checked) = (Vec::new(), Vec::new());
    for segment in 0..SEGMENTS {
        // A B B A A B B A
        let with_slots = matches!(segment % 4, 1 | 2);
        let before = watermark((segment + 1) * TRANSACTIONS / SEGMENTS - 1);
        let mut outcome = PurgeOutcome::default();
        let started = Instant::now();
        db.purge_within(
            PurgeTarget {
                before: &before,
                replica_version: Some(REPLICA),
                slots: with_slots.then_some(SlotCheck {
                    rule: SlotRule {
                        pause: false,
                        restore_limit_now: None,
                    },
                    own: None,
                }),
            },
            None::<&str>,
            DEFAULT_PURGE_BATCH_ROWS,
            &CancellationToken::new(),
            || std::future::ready(litestream_sidecar::cleanup::Ceiling::None),
            &mut outcome,
        )
        .await
        .expect("purge");
        assert!(outcome.is_complete(), "{outcome:?}");
        let per_batch = started.elapsed() / outcome.batches.max(1);
        if with_slots {
            checked.push(per_batch);
        } else {
            plain.push(per_batch);
        }
    }
    let mean = |d: &[Duration]| d.iter().sum::<Duration>() / d.len().max(1) as u32;
    let (plain, checked) = (mean(&plain), mean(&checked));
    let ratio = checked.as_secs_f64() / plain.as_secs_f64();
    report.add(
        format!(
            "purge batch ({DEFAULT_PURGE_BATCH_ROWS} rows) with the slot check ({} slots) vs without",
            RESERVATIONS + SUBSCRIBERS
        ),
        format!("{} vs {}: x{ratio:.2}", ms(checked), ms(plain)),
        "<= x1.10",
        Some(ratio <= 1.10),
    );
    shutdown.cancel();
    drop_schemas(&client, &zero).await;
}
