//! Litestream's metrics page misbehaving under a running sidecar: an error status, a hang, garbage, a page far
//! over `litestream.max_page_bytes`, a gauge at NaN or +Inf, and a gauge that goes backwards.
//!
//! Every faulty page tempts the sidecar with an aged backup at 0d while the only subscriber has acked past it: a
//! purge below 0d would mean it trusted a page it should not have. Each case then checks that a reservation still
//! gets its status, what the sidecar reports, and that cleanup goes on by itself once the page is healthy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use litestream_sidecar::cleanup::subscribers::{SubscriberHandle, SubscriberInfo};
use litestream_sidecar::cleanup::{Decision, HoldReason};
use litestream_sidecar::protocol::Mode;

use crate::support::pg::TestSchema;
use crate::support::*;

/// `litestream.max_page_bytes` in these cases.
const MAX_PAGE: u64 = 1 << 20;

/// A running sidecar over a change log of 0a..0e (two rows each) that has purged below 0b, the backup its
/// healthy litestream page reported, with one subscriber at 0c.
struct Bench {
    db: TestSchema,
    litestream: MetricsServer,
    sidecar: Sidecar,
    subscriber: SubscriberHandle,
}

impl Bench {
    async fn start() -> Bench {
        let db = TestSchema::create(Some(5), None).await;
        for w in ["0a", "0b", "0c", "0d", "0e"] {
            db.insert_transaction(w, 2).await;
        }
        let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
        let config = config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\nscrape_timeout = \"300ms\"\n\
             max_page_bytes = {MAX_PAGE}\n[cleanup]\nreconnect_grace = \"1s\"\nbatch_rows = 3\n\
             [discovery]\ninterval = \"1s\"\n",
            db.config(),
            litestream.url()
        ));
        let sidecar = start_aged(config, Duration::from_secs(60)).await;
        let subscriber = sidecar.subscribers.connect(SubscriberInfo {
            id: "vs-1".into(),
            task_id: None,
            mode: Mode::Serving,
            replica_version: "1rs".into(),
            watermark: "0c".into(),
        });
        let bench = Bench {
            db,
            litestream,
            sidecar,
            subscriber,
        };
        bench.rows_become(&["0b", "0c", "0d", "0e"]).await;
        // Ready once the change DB has been seen, so that /keepalive speaks of cleanup alone.
        eventually("change DB seen", || bench.sidecar.discovery.get().db_up).await;
        bench
    }

    async fn rows_become(&self, expected: &[&str]) {
        eventually_async(&format!("change log at {expected:?}"), || async {
            self.db.watermarks().await == expected
        })
        .await;
    }

    /// While the page is faulty: the subscriber moves past 0d, and nothing the page offers is purged below; the
    /// checks go on and report that where litestream's backup stands is unknown.
    async fn holds_through_the_fault(&self) {
        self.subscriber.ack("0e");
        // Four checks, of which the first may be the one that purged below 0b (still finishing when the rows
        // were seen gone): at least three held.
        assert_eq!(
            decisions(&self.sidecar, 4).await,
            Decision::Hold(HoldReason::BackupUnknown)
        );
        assert_eq!(self.db.watermarks().await, ["0b", "0c", "0d", "0e"]);
        assert_eq!(self.sidecar.status.get().last_purged(), Some("0b"));
        let (_, metrics) = http(self.sidecar.addr, "GET", "/metrics").await;
        assert!(
            metric(
                &metrics,
                "litestream_sidecar_cleanup_holds_total{reason=\"backup_unknown\"}"
            ) >= 3.0,
            "{metrics}"
        );
        assert_eq!(
            metric(&metrics, "litestream_sidecar_backup_position_known"),
            0.0
        );
        // Still ready: reservations and subscriptions are served; the body says why cleanup holds.
        let (code, body) = http(self.sidecar.addr, "GET", "/keepalive").await;
        assert_eq!(code, 200);
        assert!(
            body.starts_with("OK; cleanup held: litestream's backed-up position is unknown ("),
            "{body}"
        );
    }

    /// A reservation opened during the fault gets its status at once, pinned at the backup known before it.
    async fn reservation_is_served(&self, task: &str) -> Client {
        let mut ws = connect(&self.sidecar.snapshot_url(task)).await;
        assert_eq!(next_text(&mut ws).await, V3_STATUS);
        send_text(&mut ws, r#"{"ack":1}"#).await;
        let floor = self
            .sidecar
            .registry
            .open_reservations()
            .into_iter()
            .find(|r| r.task_id == task)
            .and_then(|r| r.floor);
        assert_eq!(floor.as_deref(), Some("0b"));
        ws
    }

    /// The page is healthy again with the backup at 0d: cleanup purges below it without a restart.
    async fn recovers(self, task: &str, reservation: Client) {
        drop(reservation);
        eventually("reservation closed", || self.sidecar.registry.is_empty()).await;
        // Its slot keeps its floor after the socket until its view-syncer, restored, subscribes.
        self.sidecar.registry.end_by_subscription(
            task,
            self.sidecar.registry.ticket(),
            tokio::time::Instant::now(),
        );
        self.litestream.set_status(200);
        self.litestream.set_page(&progress_page(&[("0d", aged())]));
        self.rows_become(&["0d", "0e"]).await;
        assert_eq!(self.sidecar.status.get().last_purged(), Some("0d"));
        let Bench {
            db,
            litestream,
            sidecar,
            subscriber,
        } = self;
        drop(subscriber);
        sidecar.stop().await;
        litestream.stop();
        db.drop().await;
    }
}

/// The value of the sample whose line starts with `series` (name and labels) on a `/metrics` page.
fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} on the page"))
}

fn scrape_errors(bench: &Bench) -> u64 {
    bench.sidecar.status.get().scrape_errors
}

#[tokio::test]
async fn an_error_status_is_not_read_even_with_a_page_behind_it() {
    let bench = Bench::start().await;
    let errors = scrape_errors(&bench);
    bench.litestream.set_page(&progress_page(&[("0d", aged())]));
    bench.litestream.set_status(500);
    bench.holds_through_the_fault().await;
    assert!(scrape_errors(&bench) >= errors + 3);
    let reservation = bench.reservation_is_served("t-500").await;
    // Zero's own BackupMonitor, behind the proxy, sees litestream as down too.
    assert_eq!(
        http(bench.sidecar.proxy_addr, "GET", "/metrics").await.0,
        502
    );
    bench.recovers("t-500", reservation).await;
}

#[tokio::test]
async fn a_litestream_that_never_answers_times_out_every_check() {
    let bench = Bench::start().await;
    let errors = scrape_errors(&bench);
    bench.litestream.misbehave(Some(Misbehave::Hang));
    bench.holds_through_the_fault().await;
    assert!(scrape_errors(&bench) >= errors + 3);
    let reservation = bench.reservation_is_served("t-hang").await;
    assert_eq!(
        http(bench.sidecar.proxy_addr, "GET", "/metrics").await.0,
        502
    );

    // Headers and the start of a page that names 0d, then nothing: the part read is not used.
    let errors = scrape_errors(&bench);
    bench.litestream.misbehave(Some(Misbehave::HangMidBody {
        prefix: progress_page(&[("0d", aged())]),
    }));
    bench.holds_through_the_fault().await;
    assert!(scrape_errors(&bench) >= errors + 3);
    bench.recovers("t-hang", reservation).await;
}

#[tokio::test]
async fn garbage_instead_of_a_metrics_page_is_refused() {
    let bench = Bench::start().await;
    let errors = scrape_errors(&bench);
    let garbage: [&[u8]; 3] = [
        b"<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        b"\x00\x9f\x92\x96\xff binary \xfe\n",
        b"{\"watermark\": \"0d\", \"time\": 1746600000}\n",
    ];
    for page in garbage {
        bench
            .litestream
            .set_page(&String::from_utf8_lossy(page).replace('\u{fffd}', "\u{7f}"));
        bench.holds_through_the_fault().await;
    }
    assert!(scrape_errors(&bench) >= errors + 9);
    let reservation = bench.reservation_is_served("t-garbage").await;
    bench.recovers("t-garbage", reservation).await;
}

#[tokio::test]
async fn a_hundred_mib_page_is_refused_without_being_read_whole() {
    let bench = Bench::start().await;
    let errors = scrape_errors(&bench);
    // It opens with a sample at 0d: a reader that parsed what it had read would find it.
    let prefix = progress_page(&[("0d", aged())]);
    for declared in [true, false] {
        bench.litestream.huge_most_sent.store(0, Ordering::SeqCst);
        bench.litestream.misbehave(Some(Misbehave::Huge {
            prefix: prefix.clone(),
            bytes: 100 << 20,
            declared,
        }));
        bench.holds_through_the_fault().await;
        // No response was drawn further than the limit plus what the socket buffers between the two hold: the
        // sidecar stopped reading (at once when the length was declared, at the limit otherwise) and hung up.
        let most = bench.litestream.huge_most_sent.load(Ordering::SeqCst);
        assert!(
            most < MAX_PAGE + (16 << 20),
            "declared {declared}: {most} bytes drawn"
        );
        if !declared {
            assert!(
                most > MAX_PAGE,
                "the chunked page was read up to the limit: {most}"
            );
        }
    }
    assert!(scrape_errors(&bench) >= errors + 6);
    let reservation = bench.reservation_is_served("t-huge").await;
    bench.recovers("t-huge", reservation).await;
}

#[tokio::test]
async fn a_gauge_at_nan_or_infinity_is_not_a_backup_time() {
    let bench = Bench::start().await;
    let errors = scrape_errors(&bench);
    for value in ["NaN", "+Inf", "-Inf"] {
        bench.litestream.set_page(&format!(
            "# TYPE litestream_replica_progress gauge\n\
             litestream_replica_progress{{db=\"/var/lib/zero/replica.db\",name=\"file\",watermark=\"0d\"}} {value}\n"
        ));
        bench.holds_through_the_fault().await;
        // The page itself was readable: the gauge keeps its last good value.
        assert_eq!(
            bench
                .sidecar
                .status
                .get()
                .newest_backup
                .map(|(w, _)| w)
                .as_deref(),
            Some("0b")
        );
    }
    assert_eq!(scrape_errors(&bench), errors);
    // A readable page without a usable sample says litestream lost its position (restarted, say): the backup a
    // restore would get is unknown, so a status waits for the gauge, and pins where it then is.
    let mut ws = connect(&bench.sidecar.snapshot_url("t-nan")).await;
    eventually("reserved", || bench.sidecar.registry.len() == 1).await;
    assert_eq!(bench.sidecar.registry.open_reservations()[0].floor, None);
    decisions(&bench.sidecar, 2).await;
    bench.litestream.set_page(&progress_page(&[("0d", aged())]));
    assert_eq!(next_text(&mut ws).await, V3_STATUS);
    assert_eq!(
        bench.sidecar.registry.open_reservations()[0]
            .floor
            .as_deref(),
        Some("0d")
    );
    drop(ws);
    eventually("reservation closed", || bench.sidecar.registry.is_empty()).await;
    bench.rows_become(&["0d", "0e"]).await;
    bench.sidecar.stop().await;
}

#[tokio::test]
async fn a_gauge_gone_backwards_holds_cleanup_and_pins_reservations_no_higher_until_it_is_back() {
    let bench = Bench::start().await;
    let floors = || -> Vec<(String, Option<String>)> {
        bench
            .sidecar
            .registry
            .open_reservations()
            .into_iter()
            .map(|r| (r.task_id, r.floor))
            .collect()
    };
    // Backed up to 0d; the subscriber at 0c holds the purge below it.
    bench.litestream.set_page(&progress_page(&[("0d", aged())]));
    eventually("0d seen", || {
        bench.sidecar.registry.newest_backup().as_deref() == Some("0d")
    })
    .await;
    assert_eq!(
        decisions(&bench.sidecar, 1).await,
        Decision::Hold(HoldReason::SubscriberBehind)
    );
    let mut before = connect(&bench.sidecar.snapshot_url("before")).await;
    assert_eq!(next_text(&mut before).await, V3_STATUS);
    assert_eq!(floors(), [("before".into(), Some("0d".into()))]);

    // Litestream restarts on an older generation: a restore started now gets 0c.
    bench
        .litestream
        .set_page(&progress_page(&[("0c", epoch_now() - 100.0)]));
    eventually("regression seen", || {
        bench.sidecar.status.get().backup_regressed.is_some()
    })
    .await;
    assert_eq!(
        bench.sidecar.status.get().backup_regressed,
        Some(("0d".into(), "0c".into()))
    );
    // The open reservation is lowered to the gauge, and one opened now is pinned there; both are served.
    assert_eq!(floors(), [("before".into(), Some("0c".into()))]);
    let mut during = connect(&bench.sidecar.snapshot_url("during")).await;
    assert_eq!(next_text(&mut during).await, V3_STATUS);
    assert_eq!(
        floors(),
        [
            ("before".into(), Some("0c".into())),
            ("during".into(), Some("0c".into()))
        ]
    );
    // The subscriber passes 0d: trusting the old high (aged, above every floor but the lowered one) would purge.
    bench.subscriber.ack("0e");
    assert_eq!(
        decisions(&bench.sidecar, 3).await,
        Decision::Hold(HoldReason::BackupRegressed)
    );
    assert_eq!(bench.db.watermarks().await, ["0b", "0c", "0d", "0e"]);
    assert_eq!(
        bench
            .sidecar
            .status
            .get()
            .newest_backup
            .map(|(w, _)| w)
            .as_deref(),
        Some("0c")
    );
    let (_, metrics) = http(bench.sidecar.addr, "GET", "/metrics").await;
    assert!(
        metric(
            &metrics,
            "litestream_sidecar_cleanup_holds_total{reason=\"backup_regressed\"}"
        ) >= 3.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("litestream_sidecar_backup_watermark{watermark=\"0c\"} 1"),
        "{metrics}"
    );
    let (status, keepalive) = http(bench.sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(status, 200);
    assert!(keepalive.contains("went back from 0d to 0c"), "{keepalive}");

    // Past the old high again: cleanup resumes by itself, within the lowered floors.
    bench.litestream.set_page(&progress_page(&[("0e", aged())]));
    bench.rows_become(&["0c", "0d", "0e"]).await;
    assert_eq!(bench.sidecar.status.get().backup_regressed, None);
    assert_eq!(
        http(bench.sidecar.addr, "GET", "/keepalive").await,
        (200, "OK".into())
    );
    settles_on(&bench.sidecar, Decision::Hold(HoldReason::ReservationFloor)).await;
    drop((before, during));
    eventually("reservations closed", || bench.sidecar.registry.is_empty()).await;
    // Their slots outlive their sockets; their view-syncers, restored, subscribe.
    for task in ["before", "during"] {
        bench.sidecar.registry.end_by_subscription(
            task,
            bench.sidecar.registry.ticket(),
            tokio::time::Instant::now(),
        );
    }
    // The newest row always stays (docs/protocol.md, "Purging the newest transaction").
    bench.rows_become(&["0e"]).await;
    let Bench {
        db,
        litestream,
        sidecar,
        subscriber,
    } = bench;
    drop(subscriber);
    sidecar.stop().await;
    litestream.stop();
    db.drop().await;
}

/// litestream's gauge goes back while a long purge runs: the page is read again before every batch, so the purge
/// stops at the next one, and no row at or above the regressed backup goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gauge_that_goes_back_mid_purge_stops_the_purge_before_its_next_batch() {
    const TRANSACTIONS: u64 = 60;
    let db = TestSchema::create(Some(5), None).await;
    let watermarks: Vec<String> = (0..TRANSACTIONS).map(|i| lexi(60_000 + i)).collect();
    db.insert_transactions(&watermarks, 50).await;
    let target = watermarks[50].clone();
    let back = watermarks[10].clone();
    let litestream =
        MetricsServer::start(&progress_page(&[(&back, aged()), (&target, aged())])).await;
    let sidecar = start_aged(
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [cleanup]\nreconnect_grace = \"1s\"\nbatch_rows = 1\nwithout_subscribers = \"after_grace\"\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(600),
    )
    .await;
    let total = db.rows().await.len();
    eventually_async("the purge under way", || async {
        db.rows().await.len() < total - 20
    })
    .await;
    litestream.set_page(&progress_page(&[(&back, aged())]));
    let after = db.rows().await.len();
    eventually("the purge stopped", || {
        sidecar.status.get().backup_regressed.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = db.rows().await;
    // At most the batch in flight when the page changed went after it; far from the target.
    assert!(
        rows.len() + 5 >= after,
        "{} rows left of {after}",
        rows.len()
    );
    assert!(
        rows.iter().any(|(w, _)| *w < target),
        "the purge ran on to its target"
    );
    assert_eq!(
        sidecar.status.get().last_decision,
        Some(Decision::Hold(HoldReason::BackupRegressed))
    );
    sidecar.stop().await;
    db.drop().await;
}
