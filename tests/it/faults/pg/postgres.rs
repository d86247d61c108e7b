//! PostgreSQL faults: the change DB restarted in the middle of a batched purge, and gone for a minute. Each case
//! runs its own cluster (see [`Cluster`]) so that restarting it disturbs no other test, and a real sidecar whose
//! change DB is a Zero schema on it.
//!
//! What is asserted is what an operator cares about: the exact rows left in `changeLog` (nothing at or above the
//! purge's watermark, or below a reservation's, ever deleted), reservations still served while PostgreSQL is away,
//! the failure reported, and the sidecar back at work without a restart once PostgreSQL is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use litestream_sidecar::cleanup::change_db::FailureClass;
use litestream_sidecar::cleanup::{Decision, HoldReason};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::support::cluster::Cluster;
use crate::support::pg::{expected_rows, TestSchema};
use crate::support::*;

/// A sidecar on `cluster`'s change DB with fast checks; `extra` is more TOML, starting in `[cleanup]`.
fn sidecar_config(
    cluster: &Cluster,
    db: &TestSchema,
    litestream: &MetricsServer,
    extra: &str,
) -> litestream_sidecar::Config {
    config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
         [discovery]\ninterval = \"200ms\"\n[cleanup]\nreconnect_grace = \"2s\"\n{extra}",
        db.config_at(&cluster.url()),
        litestream.url()
    ))
}

/// A relayed subscriber that has acknowledged `watermark`, as the relay registers one.
/// The value of the first sample of `name` (with its labels, if any) on a metrics page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}

async fn metrics(sidecar: &Sidecar) -> String {
    let (status, page) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{page}");
    page
}

/// What a reservation's client has seen so far.
#[derive(Debug, Clone, Default)]
struct Seen {
    pings: u64,
    texts: Vec<String>,
    /// The socket closed or failed.
    ended: bool,
}

/// A view-syncer's snapshot reservation, read on its own task for as long as the test holds it: pings are
/// answered (tungstenite queues the pong and sends it with the next read), so it stays open through a long outage;
/// dropping it closes the socket.
struct Reservation {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Reservation {
    async fn open(sidecar: &Sidecar, path: &str) -> Reservation {
        let mut ws = connect(&sidecar.url(path)).await;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let message = ws.next().await;
                let mut seen = record.lock().unwrap();
                match message {
                    Some(Ok(Message::Ping(_))) => seen.pings += 1,
                    Some(Ok(Message::Text(text))) => seen.texts.push(text.to_string()),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        seen.ended = true;
                        return;
                    }
                    Some(Ok(_)) => {}
                }
            }
        });
        Reservation { seen, task }
    }

    fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    /// The status frame, once it has arrived.
    async fn status(&self, guard: Duration) -> String {
        within("the reservation's status", guard, || async {
            !self.seen().texts.is_empty()
        })
        .await;
        let seen = self.seen();
        assert_eq!(seen.texts.len(), 1, "one status and nothing else: {seen:?}");
        seen.texts[0].clone()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `minWatermark` of a v4 status frame, which must otherwise be exactly what the test schema implies.
fn min_watermark(status: &str) -> String {
    status
        .strip_prefix(V4_STATUS)
        .and_then(|rest| rest.strip_suffix("}]}"))
        .and_then(|rest| rest.strip_suffix(REPLICA_SIZE).or(Some(rest)))
        .and_then(|quoted| quoted.strip_prefix('"')?.strip_suffix('"'))
        .unwrap_or_else(|| panic!("not a v4 status for the test schema: {status}"))
        .to_string()
}

/// `pg_ctl restart -m fast` while a purge of thousands of one-row batches runs: the batch in flight is rolled back
/// with its session, every committed batch stays committed, and no row at or above the purge's watermark is
/// deleted. The failure is counted and reported, reservations keep being served, and the next checks finish the
/// purge on a new connection — the sidecar is never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_batched_purge_keeps_every_row_from_its_watermark_and_the_next_check_finishes_it(
) {
    const TRANSACTIONS: u64 = 40;
    const DATA_ROWS: i64 = 30;
    let cluster = Cluster::start().await;
    let mut db = TestSchema::create_on(&cluster.pg_config(), Some(5), None).await;
    let watermarks: Vec<String> = (0..TRANSACTIONS).map(|i| lexi(50_000 + i)).collect();
    db.insert_transactions(&watermarks, DATA_ROWS).await;
    let all = db.rows().await;
    assert_eq!(all.len() as u64, TRANSACTIONS * (DATA_ROWS as u64 + 2));
    // Backed up (and aged) through the 31st transaction: the purge deletes the 30 before it, 960 rows, one per
    // batch.
    let target = watermarks[30].clone();
    let kept: Vec<(String, i64)> = all.iter().filter(|(w, _)| *w >= target).cloned().collect();
    assert_eq!(
        kept,
        expected_rows(
            &watermarks[30..]
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            DATA_ROWS + 2
        )
    );

    let litestream = MetricsServer::start(&progress_page(&[(&target, aged())])).await;
    let sidecar = start_aged(
        sidecar_config(&cluster, &db, &litestream, "batch_rows = 1\n"),
        Duration::from_secs(60),
    )
    .await;
    // Every failure the sidecar reports, as it reports it: the counters clear once a purge succeeds.
    let reported = Arc::new(Mutex::new(Vec::new()));
    let watcher = {
        let status = sidecar.status.clone();
        let reported = reported.clone();
        tokio::spawn(async move {
            loop {
                if let Some(last) = status.get().purge_failures.last {
                    let mut reported = reported.lock().unwrap();
                    if !reported.contains(&last.class) {
                        reported.push(last.class);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let _sub = sidecar
        .subscribers
        .connect(subscriber("vs-1", watermarks.last().unwrap()));

    // The purge has begun once the first batch is gone.
    within("the purge to begin", Duration::from_secs(30), || async {
        let count: i64 = db
            .client
            .query_one(
                &format!("SELECT count(*) FROM {}", db.table("changeLog")),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        count < all.len() as i64
    })
    .await;
    // Restart now; a view-syncer reserves a snapshot meanwhile. Its status reads where the change log starts, so it
    // follows once the change DB answers again (the supervisor's backoff then is a few seconds).
    let ((), during) = tokio::join!(cluster.restart_fast(), async {
        let reservation =
            Reservation::open(&sidecar, "/replication/v3/snapshot?taskID=during").await;
        assert_eq!(reservation.status(Duration::from_secs(30)).await, V3_STATUS);
        reservation
    });
    db.reconnect(&cluster.pg_config()).await;
    let rows = db.rows().await;
    let (below, at_or_above): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(w, _)| *w < target);
    assert_eq!(
        at_or_above, kept,
        "no row at or above the purge's watermark is deleted"
    );
    // Whatever is left below it is a tail of the log: batches delete in key order.
    assert_eq!(
        below,
        all[all.len() - kept.len() - below.len()..all.len() - kept.len()]
    );

    // Without a restart of the sidecar, the next checks finish the job: up to 960 one-row batches, slow on a busy
    // machine.
    within(
        "the purge finished after the restart",
        Duration::from_secs(120),
        || async { db.rows().await == kept },
    )
    .await;
    within(
        "the failure cleared by a purge that worked",
        Duration::from_secs(30),
        || async {
            let status = sidecar.status.get();
            status.purge_failures.consecutive == 0
                && status.purge_failures.last.is_none()
                && status.last_purged() == Some(target.as_str())
        },
    )
    .await;
    watcher.abort();
    let status = sidecar.status.get();
    assert!(status.purge_failures.total >= 1, "{status:?}");
    // Every row the sidecar deleted is counted once, the interrupted purge's committed batches too.
    let purged = (all.len() - kept.len()) as u64;
    assert_eq!(status.purged_rows, purged, "{status:?}");
    let reported = reported.lock().unwrap().clone();
    assert!(!reported.is_empty(), "the interrupted purge was reported");
    assert!(
        reported
            .iter()
            .all(|c| matches!(c, FailureClass::Unavailable | FailureClass::Transient)),
        "a restart is a failure that heals by itself: {reported:?}"
    );
    let page = metrics(&sidecar).await;
    assert!(
        metric(&page, "litestream_sidecar_purge_failures_total") >= Some(1.0),
        "{page}"
    );
    assert_eq!(
        metric(&page, "litestream_sidecar_purged_rows_total"),
        Some(purged as f64),
        "{page}"
    );
    assert_eq!(
        metric(&page, "litestream_sidecar_purge_consecutive_failures"),
        Some(0.0),
        "{page}"
    );

    // Reservations were served throughout: the one opened during the restart is still held, and a v4 one gets the
    // change DB's state after it.
    assert!(!during.seen().ended);
    assert!(sidecar
        .registry
        .open_reservations()
        .iter()
        .any(|r| r.task_id == "during"));
    let after = Reservation::open(&sidecar, "/replication/v4/snapshot?taskID=after").await;
    assert_eq!(
        min_watermark(&after.status(Duration::from_secs(30)).await),
        target
    );
    within("ready", Duration::from_secs(30), || async {
        http(sidecar.addr, "GET", "/keepalive").await == (200, "OK".to_string())
    })
    .await;
    assert_eq!(db.rows().await, kept);
    drop((during, after));
    sidecar.stop().await;
}

/// Without the change DB cleanup holds, since this sidecar's slots cannot be written, or decides and its purges fail
/// for want of a connection.
fn nothing_purged_for_want_of_the_database(
    status: &litestream_sidecar::cleanup::status::Status,
) -> bool {
    matches!(
        status.last_decision,
        Some(Decision::Hold(
            HoldReason::StateUnreadable | HoldReason::StateUnwritable
        ))
    ) || status
        .purge_failures
        .last
        .as_ref()
        .is_some_and(|l| l.class == FailureClass::Unavailable)
}

/// PostgreSQL stopped for a minute, then started again. Meanwhile the sidecar serves its health endpoints, reports
/// readiness as missing the database and cleanup as held (its slots cannot be read), purges nothing, and holds
/// every reservation's status back (pinging it): a status goes out only once its reservation's row has committed,
/// and v4's `minWatermark` lives in the change DB too. Once PostgreSQL is back the sidecar reconnects by itself:
/// both reservations get their statuses, and the next purge succeeds within what the reservations protect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_without_postgresql_serves_reservations_reports_it_and_recovers_by_itself() {
    const OUTAGE: Duration = Duration::from_secs(60);
    let all = ["0a", "0b", "0c", "0d", "0e", "0f", "0g", "0h"];
    let cluster = Cluster::start().await;
    let mut db = TestSchema::create_on(&cluster.pg_config(), Some(5), None).await;
    for w in all {
        db.insert_transaction(w, 2).await;
    }
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let sidecar = start_aged(
        sidecar_config(
            &cluster,
            &db,
            &litestream,
            "batch_rows = 3\n[server]\nping_interval = \"1s\"\n",
        ),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0h"));
    within("the purge below 0c", Duration::from_secs(30), || async {
        db.watermarks().await == all[2..]
    })
    .await;
    within("the purge recorded", Duration::from_secs(10), || async {
        sidecar.status.get().last_purged() == Some("0c")
    })
    .await;
    within("ready", Duration::from_secs(10), || async {
        http(sidecar.addr, "GET", "/keepalive").await == (200, "OK".to_string())
    })
    .await;
    let purges_before = sidecar.status.get().purges;

    let down = Instant::now();
    cluster.stop().await;
    // A newer backup has aged as well: from now on every check holds (this sidecar's slots cannot be written) or
    // decides to purge below 0e and fails without the database.
    litestream.set_page(&progress_page(&[("0c", old), ("0e", old)]));
    within(
        "cleanup held (the slots cannot be written) or purges failing as unavailable",
        Duration::from_secs(30),
        || async { nothing_purged_for_want_of_the_database(&sidecar.status.get()) },
    )
    .await;
    assert_eq!(
        http(sidecar.addr, "GET", "/").await,
        (200, "OK".to_string())
    );
    let (status, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("change DB unreachable"), "{body}");
    let page = metrics(&sidecar).await;
    assert_eq!(
        metric(&page, "litestream_sidecar_change_db_up"),
        Some(0.0),
        "{page}"
    );

    // A status goes out only once its reservation's row has committed: v3's waits as v4's does (whose
    // minWatermark lives in the change DB too), each socket pinged meanwhile.
    let v3 = Reservation::open(&sidecar, "/replication/v3/snapshot?taskID=v3-outage").await;
    let v4 = Reservation::open(&sidecar, "/replication/v4/snapshot?taskID=v4-outage").await;
    while down.elapsed() < OUTAGE {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = sidecar.status.get();
        assert_eq!(status.purges, purges_before, "nothing purged while down");
        assert_eq!(status.last_purged(), Some("0c"));
        assert!(v4.seen().texts.is_empty(), "{:?}", v4.seen());
        assert!(v3.seen().texts.is_empty(), "{:?}", v3.seen());
        assert!(!v3.seen().ended && !v4.seen().ended);
    }
    let seen = v4.seen();
    assert!(
        seen.pings >= 3,
        "the held-back reservation is pinged: {seen:?}"
    );
    assert_eq!(sidecar.registry.len(), 2);
    assert!(
        nothing_purged_for_want_of_the_database(&sidecar.status.get()),
        "{:?}",
        sidecar.status.get().last_decision
    );

    cluster.start_again().await;
    db.reconnect(&cluster.pg_config()).await;
    assert_eq!(
        db.watermarks().await,
        all[2..],
        "nothing was purged while down"
    );
    // The supervisor reconnects (its backoff is at most 10 s) and the v4 status is sent: minWatermark is 0c, or
    // 0e if the first purge after the outage came first (the reservation protected 0e, the newest backup, until
    // then).
    let min = min_watermark(&v4.status(Duration::from_secs(60)).await);
    assert_eq!(v3.status(Duration::from_secs(30)).await, V3_STATUS);
    assert!(min == "0c" || min == "0e", "{min}");
    // Protected from its minWatermark while it is open, whatever the purges do meanwhile: every transaction after
    // it whole, and of the one at it what was there when it was read (batches delete in key order, so a purge
    // that stopped inside it may have left only its tail; catch-up skips the rows at the subscriber's watermark).
    let announced = db.rows().await;
    let from = all.iter().position(|w| *w == min).unwrap();
    let (at_min, after): (Vec<_>, Vec<_>) = announced.iter().cloned().partition(|(w, _)| *w == min);
    assert_eq!(after, expected_rows(&all[from + 1..], 4), "{announced:?}");
    let whole = expected_rows(&all[from..=from], 4);
    assert!(
        !at_min.is_empty() && at_min[..] == whole[whole.len() - at_min.len()..],
        "{announced:?}"
    );
    for _ in 0..3 {
        let checks = sidecar.status.get().checks;
        within("a check", Duration::from_secs(10), || async {
            sidecar.status.get().checks > checks
        })
        .await;
        assert_eq!(db.rows().await, announced);
    }

    // Once it ends (its socket closes, and its view-syncer, restored, subscribes), cleanup goes on to the newest
    // aged backup; the v3 reservation (pinned at 0e, the backup it restores) and the subscriber keep the rest.
    drop(v4);
    sidecar.registry.end_by_subscription(
        "v4-outage",
        sidecar.registry.ticket(),
        tokio::time::Instant::now(),
    );
    within("the purge below 0e", Duration::from_secs(30), || async {
        db.rows().await == expected_rows(&all[4..], 4)
    })
    .await;
    within(
        "the failures cleared by a purge that worked",
        Duration::from_secs(30),
        || async {
            let status = sidecar.status.get();
            status.purge_failures.consecutive == 0
                && status.purge_failures.last.is_none()
                && status.last_purged() == Some("0e")
        },
    )
    .await;
    within("ready again", Duration::from_secs(30), || async {
        http(sidecar.addr, "GET", "/keepalive").await == (200, "OK".to_string())
    })
    .await;
    let page = metrics(&sidecar).await;
    assert_eq!(
        metric(&page, "litestream_sidecar_purge_consecutive_failures"),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        metric(
            &page,
            "litestream_sidecar_purge_failing{class=\"unavailable\"}"
        ),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        metric(&page, "litestream_sidecar_change_db_up"),
        Some(1.0),
        "{page}"
    );
    assert!(!v3.seen().ended);
    assert_eq!(v3.seen().texts, [V3_STATUS]);
    assert_eq!(
        sidecar
            .registry
            .open_reservations()
            .iter()
            .map(|r| r.task_id.as_str())
            .collect::<Vec<_>>(),
        ["v3-outage"]
    );
    drop(v3);
    sidecar.stop().await;
}
