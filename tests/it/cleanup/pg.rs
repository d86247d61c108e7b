use std::time::Duration;

use crate::support::pg::TestSchema;
use crate::support::*;
use litestream_sidecar::cleanup::{Bound, Decision, HoldReason};

/// Fast checks; the 30 s minimum delay is satisfied by backup times in the past and a start time moved back.
fn cleanup_config(
    db: &TestSchema,
    litestream: &MetricsServer,
    extra: &str,
) -> litestream_sidecar::Config {
    config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"2s\"\nbatch_rows = 3\n{extra}",
        db.config(),
        litestream.url()
    ))
}

async fn seeded() -> TestSchema {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    db
}

/// Waits until the monitor has decided at least `ticks` more times and returns the last decision.
#[tokio::test]
async fn purges_below_the_aged_backup_that_every_subscriber_has_passed() {
    let db = seeded().await;
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));

    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    assert_eq!(db.rows().await.len(), 12);
    // The purge's last batch commits before the check that ran it records it.
    eventually("the status to record the purge", || {
        sidecar.status.get().last_purged() == Some("0c")
    })
    .await;
    // Nothing newer is backed up: the next checks hold with nothing new to purge.
    settles_on(&sidecar, Decision::Hold(HoldReason::NothingNew)).await;

    // A newer backup that has aged, but above every watermark in the log: the purge refuses a bound the log has
    // never reached, rather than delete all but the newest transaction.
    sub.ack("0z");
    litestream.set_page(&progress_page(&[("0z", old)]));
    eventually("the policy allows 0z", || {
        matches!(sidecar.status.get().last_decision, Some(Decision::Purge { before, .. }) if before == "0z")
    })
    .await;
    // The check that decided it has purged once it completes.
    decisions(&sidecar, 1).await;
    assert_eq!(db.watermarks().await, ["0c", "0d", "0e"]);

    // Once the log holds 0z the purge goes up to it; the newest watermark itself always stays (docs/operations.md, "Cleanup: when the change log is purged").
    db.insert_transaction("0z", 2).await;
    eventually_async("purge up to the newest row", || async {
        db.watermarks().await == ["0z"]
    })
    .await;
    drop(sub);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_subscriber_behind_the_backup_holds_the_purge_at_its_ack() {
    let db = seeded().await;
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0b", old), ("0d", old)])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let slow = sidecar.subscribers.connect(subscriber("slow", "0b"));
    let _fast = sidecar.subscribers.connect(subscriber("fast", "0e"));

    eventually_async("purge below 0b only", || async {
        db.watermarks().await == ["0b", "0c", "0d", "0e"]
    })
    .await;
    settles_on(&sidecar, Decision::Hold(HoldReason::SubscriberBehind)).await;
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d", "0e"]);
    slow.ack("0d");
    eventually_async("purge below 0d", || async {
        db.watermarks().await == ["0d", "0e"]
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn nothing_is_purged_without_a_subscriber_or_with_a_young_backup() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0d", aged())])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::NoSubscribers)
    );

    // A backup younger than the 30 s delay does not count.
    let db2 = seeded().await;
    let litestream2 = MetricsServer::start(&progress_page(&[("0d", epoch_now() - 5.0)])).await;
    let sidecar2 = start_aged(
        cleanup_config(&db2, &litestream2, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar2.subscribers.connect(subscriber("vs", "0e"));
    assert_eq!(
        decisions(&sidecar2, 2).await,
        Decision::Hold(HoldReason::BackupTooRecent)
    );
    assert_eq!(db.rows().await.len(), 20);
    assert_eq!(db2.rows().await.len(), 20);
    sidecar.stop().await;
    sidecar2.stop().await;
}

#[tokio::test]
async fn a_fresh_start_waits_for_the_cleanup_delay() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0d", aged())])).await;
    let sidecar = start(cleanup_config(&db, &litestream, "")).await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::StartingUp)
    );
    assert_eq!(db.rows().await.len(), 20);
    sidecar.stop().await;
}

#[tokio::test]
async fn an_open_reservation_pins_its_floor_or_pauses_everything() {
    for (mode, expected) in [
        ("pin", vec!["0b", "0c", "0d", "0e"]),
        ("pause", vec!["0a", "0b", "0c", "0d", "0e"]),
    ] {
        let db = seeded().await;
        let old = aged();
        let litestream = MetricsServer::start(&progress_page(&[("0b", old)])).await;
        let sidecar = start_aged(
            cleanup_config(&db, &litestream, &format!("reservations = \"{mode}\"\n")),
            Duration::from_secs(60),
        )
        .await;
        // Let the sidecar learn 0b, then a view-syncer reserves: its restore yields 0b or newer.
        eventually("backup seen", || {
            sidecar
                .status
                .get()
                .newest_backup
                .map(|(w, _)| w)
                .as_deref()
                == Some("0b")
        })
        .await;
        let mut reservation = connect(&sidecar.snapshot_url("vs-2")).await;
        next_text(&mut reservation).await;
        eventually("reserved", || sidecar.registry.len() == 1).await;
        let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0e"));
        litestream.set_page(&progress_page(&[("0b", old), ("0d", old)]));
        let decision = decisions(&sidecar, 3).await;
        assert_eq!(db.watermarks().await, expected, "{mode}: {decision:?}");
        if mode == "pause" {
            assert_eq!(decision, Decision::Hold(HoldReason::ReservationsOpen));
        }
        // Its socket closes: the row stays, as a view-syncer restores without its socket.
        drop(reservation);
        eventually("the socket's reservation gone", || {
            sidecar.registry.is_empty()
        })
        .await;
        decisions(&sidecar, 2).await;
        assert_eq!(
            db.watermarks().await,
            expected,
            "{mode}: the closed reservation still holds"
        );
        // Its task subscribes: the row ends, and cleanup proceeds to the newest aged backup.
        sidecar.registry.end_by_subscription(
            "vs-2",
            sidecar.registry.ticket(),
            tokio::time::Instant::now(),
        );
        eventually_async("purge below 0d", || async {
            db.watermarks().await == ["0d", "0e"]
        })
        .await;
        sidecar.stop().await;
    }
}

#[tokio::test]
async fn bad_metrics_pages_and_a_dead_litestream_never_purge() {
    let db = seeded().await;
    let old = aged();
    let litestream = MetricsServer::start("").await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    let family = "# TYPE litestream_replica_progress gauge\n";
    let sample = |w: &str, v: &str| {
        format!("litestream_replica_progress{{db=\"/r.db\",name=\"s3\",watermark=\"{w}\"}} {v}\n")
    };
    for page in [
        format!("{family}{}", sample("0d", "NaN")),
        format!("{family}{}", sample("0d", "+Inf")),
        format!("{family}{}", sample("0d", "-1746600000")),
        format!("{family}{}", sample("0d", "0")),
        format!("{family}{}", sample("0D", &old.to_string())),
        format!("{family}{}", sample("not-a-version", &old.to_string())),
        format!(
            "{family}{}{}",
            sample("0d", &old.to_string()),
            sample("0d", &old.to_string())
        ),
        format!(
            "# TYPE litestream_replica_progress counter\n{}",
            sample("0d", &old.to_string())
        ),
        "<html>not metrics</html>".to_string(),
    ] {
        litestream.set_page(&page);
        let decision = decisions(&sidecar, 2).await;
        assert_eq!(decision, Decision::Hold(HoldReason::NoBackup), "{page}");
    }
    let big = format!(
        "{family}{}# {}\n",
        sample("0d", &old.to_string()),
        "x".repeat(5 << 20)
    );
    litestream.set_page(&big);
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::NoBackup)
    );
    litestream.set_status(503);
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::NoBackup)
    );
    litestream.stop();
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::NoBackup)
    );
    assert!(sidecar.status.get().scrape_errors >= 3);
    assert_eq!(db.rows().await.len(), 20);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_change_db_without_zeros_schema_is_waited_for() {
    let db = TestSchema::empty().await;
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    decisions(&sidecar, 2).await;
    assert!(sidecar.status.get().last_purged().is_none());
    // Zero initialises the schema: the sidecar picks it up without a restart.
    db.create_tables(Some(5), None).await;
    for w in ["0a", "0b", "0c", "0d"] {
        db.insert_transaction(w, 1).await;
    }
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d"]
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn a_subscriber_still_at_the_replica_version_holds_cleanup() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _fresh = sidecar.subscribers.connect(subscriber("fresh", "1rs"));
    let _other = sidecar.subscribers.connect(subscriber("other", "0e"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Hold(HoldReason::SubscriberAtReplicaVersion)
    );
    assert_eq!(db.rows().await.len(), 20);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_departed_subscriber_holds_cleanup_for_the_reconnect_grace() {
    let db = seeded().await;
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0b", old), ("0d", old)])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _connected = sidecar.subscribers.connect(subscriber("up-to-date", "0e"));
    let left = sidecar.subscribers.connect(subscriber("left", "0b"));
    drop(left);
    // Within the 2 s grace the departed subscriber's ack (0b) caps the purge.
    eventually_async("purge below 0b", || async {
        db.watermarks().await.first().map(String::as_str) == Some("0b")
    })
    .await;
    // After it, its ack no longer counts.
    eventually_async("purge below 0d", || async {
        db.watermarks().await == ["0d", "0e"]
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn cleanup_disabled_decides_but_never_deletes() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0d", aged())])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, "enabled = false\n"),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    assert_eq!(
        decisions(&sidecar, 2).await,
        Decision::Purge {
            before: "0d".into(),
            bound: Bound::Backup,
        }
    );
    assert_eq!(db.rows().await.len(), 20);
    sidecar.stop().await;
}

/// A change DB that keeps rejecting purges is loud where an operator looks — consecutive failures and the error
/// class in `/metrics`, the SQLSTATE in `/keepalive`'s text — deletes nothing meanwhile, and cleanup resumes by
/// itself once the cause is fixed.
#[tokio::test]
async fn purges_the_role_may_not_run_are_reported_and_resume_once_granted() {
    let db = seeded().await;
    let role = format!("reader_{}", db.app_id);
    let grant = |privileges: &str| {
        format!(
            "GRANT {privileges} ON ALL TABLES IN SCHEMA \"{}\" TO \"{role}\"",
            db.schema
        )
    };
    db.client
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; GRANT USAGE ON SCHEMA \"{}\" TO \"{role}\"; {}; \
             CREATE SCHEMA \"{}_0/sidecar\" AUTHORIZATION \"{role}\";",
            db.schema,
            grant("SELECT"),
            db.app_id
        ))
        .await
        .unwrap();
    let mut url = url::Url::parse(&crate::support::pg::database_url()).unwrap();
    url.set_username(&role).unwrap();
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    // Zero's tables as before, reached as the reading role.
    let config = config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"2s\"\nbatch_rows = 3\n",
        db.config().replace(&crate::support::pg::database_url(), url.as_str()),
        litestream.url()
    ));
    let sidecar = start_aged(config, Duration::from_secs(60)).await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));

    eventually("two purges failed", || {
        sidecar.status.get().purge_failures.consecutive >= 2
    })
    .await;
    assert_eq!(db.rows().await.len(), 20, "nothing is deleted");
    let (status, metrics) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let consecutive = metrics
        .lines()
        .find_map(|l| l.strip_prefix("litestream_sidecar_purge_consecutive_failures "))
        .expect("the consecutive failures gauge")
        .parse::<f64>()
        .unwrap();
    assert!(consecutive >= 2.0, "{metrics}");
    assert!(
        metrics.contains("litestream_sidecar_purge_failing{class=\"permission\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("litestream_sidecar_purge_failing{class=\"transient\"} 0"),
        "{metrics}"
    );
    // Ready as soon as the change DB is seen, purge failures or not: they do not take the sidecar out of service.
    eventually_async("ready", || async {
        http(sidecar.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    let (status, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with("OK; cleanup held: the last ")
            && body.contains("(permission, SQLSTATE 42501)")
            && body.contains("permission denied"),
        "{body}"
    );

    db.client
        .batch_execute(&grant("UPDATE, DELETE"))
        .await
        .unwrap();
    eventually_async("purge below 0c once granted", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    eventually("the failures are cleared", || {
        sidecar.status.get().purge_failures.last.is_none()
    })
    .await;
    assert_eq!(sidecar.status.get().purge_failures.consecutive, 0);
    assert_eq!(
        http(sidecar.addr, "GET", "/keepalive").await,
        (200, "OK".to_string())
    );
    let (_, metrics) = http(sidecar.addr, "GET", "/metrics").await;
    assert!(
        metrics.contains("litestream_sidecar_purge_consecutive_failures 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("litestream_sidecar_purge_failing{class=\"permission\"} 0"),
        "{metrics}"
    );
    sidecar.stop().await;

    db.client
        .batch_execute(&format!(
            "REVOKE ALL ON ALL TABLES IN SCHEMA \"{s}\" FROM \"{role}\"; REVOKE ALL ON SCHEMA \"{s}\" FROM \"{role}\";",
            s = db.schema
        ))
        .await
        .unwrap();
    let admin = crate::support::pg::connect().await;
    db.drop().await;
    eventually_async("the role can be dropped", || async {
        admin
            .batch_execute(&format!("DROP ROLE IF EXISTS \"{role}\""))
            .await
            .is_ok()
    })
    .await;
}

/// Zero 0.22 and later: the replication-manager's backup replicator never comes through the sidecar, so with
/// `without_subscribers = "after_grace"` an aged backup alone allows the purge once no relayed subscriber can come
/// back (the grace rules are unit-tested in the policy).
#[tokio::test]
async fn without_subscribers_after_grace_purges_below_the_aged_backup() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, "without_subscribers = \"after_grace\"\n"),
        Duration::from_secs(60),
    )
    .await;
    eventually_async("purge below 0c without subscribers", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;

    // A connected subscriber still bounds the purge at its ack.
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));
    let old = aged();
    litestream.set_page(&progress_page(&[("0d", old), ("0e", old)]));
    eventually_async("purge below 0d, where the subscriber is", || async {
        db.watermarks().await == ["0d", "0e"]
    })
    .await;
    // Settled, not read in passing: the check that purged may still be finishing when the rows are seen gone, and a
    // purge that stopped early is decided once more.
    settles_on(&sidecar, Decision::Hold(HoldReason::SubscriberBehind)).await;
    assert_eq!(db.watermarks().await, ["0d", "0e"]);
    sidecar.stop().await;
}

/// Progress samples on a clamped proxy page, each as (watermark, seconds).
fn clamped_samples(page: &str) -> Vec<(String, f64)> {
    page.lines()
        .filter(|l| l.starts_with("litestream_replica_progress{"))
        .map(|line| {
            let watermark = line
                .split("watermark=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned();
            let secs = line.rsplit(' ').next().unwrap().parse().unwrap();
            (watermark, secs)
        })
        .collect()
}

/// `litestream.proxy_mode = "clamp"` (the default): from the first scrape Zero sees one sample at the change log's
/// oldest watermark, with the time of the backup the sidecar tracks, so a purge Zero schedules from it deletes
/// nothing; it rises as the sidecar purges, and an emptied log shows the replica version.
#[tokio::test]
async fn the_clamped_proxy_shows_the_logs_oldest_watermark_from_the_start() {
    let db = seeded().await;
    let old = aged();
    let newest = epoch_now() - 1.0;
    let litestream = MetricsServer::start(&progress_page(&[("0c", old), ("0e", newest)])).await;
    let sidecar = start_aged(
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [cleanup]\nreconnect_grace = \"2s\"\nbatch_rows = 3\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(60),
    )
    .await;
    // The backup's time is known once the first check has read litestream's page.
    eventually_async("a gauge on the first pages", || async {
        let (status, page) = http(sidecar.proxy_addr, "GET", "/metrics").await;
        status == 200 && page.contains("litestream_replica_progress{")
    })
    .await;
    let (_, page) = http(sidecar.proxy_addr, "GET", "/metrics").await;
    let samples = clamped_samples(&page);
    assert_eq!(samples.len(), 1, "{page}");
    assert_eq!(
        samples[0].0, "0a",
        "nothing purged yet: the log's oldest row: {page}"
    );
    assert!(
        (samples[0].1 - newest).abs() < 0.01,
        "{} vs {newest}",
        samples[0].1
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c", "0d", "0e"]);

    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0e"));
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let (_, page) = http(sidecar.proxy_addr, "GET", "/metrics").await;
    assert_eq!(clamped_samples(&page)[0].0, "0c", "{page}");

    // An empty log (a change DB just reset, say): the replica version, where catch-up would start.
    db.client
        .batch_execute(&format!("DELETE FROM {}", db.table("changeLog")))
        .await
        .unwrap();
    let replica_version: String = db
        .client
        .query_one(
            &format!(
                r#"SELECT "replicaVersion" FROM {}"#,
                db.table("replicationConfig")
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (_, page) = http(sidecar.proxy_addr, "GET", "/metrics").await;
    assert_eq!(clamped_samples(&page)[0].0, replica_version, "{page}");
    sidecar.stop().await;
}

/// `hide` keeps the family off the page for good, purges or not.
#[tokio::test]
async fn the_hidden_proxy_never_shows_a_watermark() {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = start_aged(
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\nproxy_mode = \"hide\"\n\
             [cleanup]\nreconnect_grace = \"2s\"\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0e"));
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let (status, page) = http(sidecar.proxy_addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(!page.contains("litestream_replica_progress"), "{page}");
    sidecar.stop().await;
}

/// Two sidecars for one shard (one Service address in front of both, say): only the holder of the shard's purger
/// lock purges; the other is standby, says so everywhere, refuses WebSocket work that the purger could not see, and
/// takes over once the holder's session ends.
#[tokio::test]
async fn a_second_sidecar_for_the_shard_is_standby_until_the_first_lets_go() {
    let db = seeded().await;
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0b", old)])).await;
    let first = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = first.subscribers.connect(subscriber("vs", "0e"));
    eventually_async("the first purges below 0b", || async {
        db.watermarks().await == ["0b", "0c", "0d", "0e"]
    })
    .await;
    assert_eq!(first.status.get().standby, Some(false));

    let second = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub2 = second.subscribers.connect(subscriber("vs2", "0e"));
    litestream.set_page(&progress_page(&[("0b", old), ("0d", old)]));
    assert_eq!(
        decisions(&second, 2).await,
        Decision::Hold(HoldReason::Standby)
    );
    // A standby serves: ready, and its reservations are slots the purger honours.
    eventually_async("the second is ready", || async {
        http(second.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    let (code, body) = http(second.addr, "GET", "/status").await;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["cleanup"]["role"], "standby");
    assert_eq!(status["cleanup"]["hold_reason"], "standby");
    let page = scrape(&second).await;
    assert_eq!(value(&page, "litestream_sidecar_purger", None), Some(0.0));
    eventually("the second sees 0d", || {
        second.registry.newest_backup().as_deref() == Some("0d")
    })
    .await;
    let mut ws = connect(&second.snapshot_url("vs-9")).await;
    assert!(next_text(&mut ws).await.contains("backupURL"));
    eventually("the first lists the second's reservation", || {
        first
            .status
            .get()
            .slots
            .iter()
            .any(|s| s.key == "vs-9" && s.floor.as_deref() == Some("0d") && s.live)
    })
    .await;
    // The first goes on purging for the shard.
    eventually_async("the first purges below 0d", || async {
        db.watermarks().await == ["0d", "0e"]
    })
    .await;

    first.stop().await;
    eventually("the second takes over", || {
        second.status.get().standby == Some(false)
    })
    .await;
    eventually_async("the second is ready", || async {
        http(second.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    let page = scrape(&second).await;
    assert_eq!(value(&page, "litestream_sidecar_purger", None), Some(1.0));
    second.stop().await;
}

/// A resync: the change DB gets a new replica version and a new change log, below the old one, while litestream
/// still shows the old replica's claims. The sidecar forgets every claim, the last purge and the highest watermark,
/// holds until a backup of the new replica has aged, and deletes nothing of the new log meanwhile.
#[tokio::test]
async fn a_resync_forgets_the_old_replicas_claims_and_purges_nothing_of_the_new_log() {
    let (db, litestream, sidecar, _sub) = purged_below_0c().await;
    let old = aged();
    // Read at the start of each check, and a check may skip it on a slow read: waited for, not read in passing.
    eventually("the replica version read", || {
        sidecar.status.get().replica_version.is_some()
    })
    .await;

    // The resync: a new replica version, a new log from 05 up, and the old replica's claim at 0d still shown.
    db.client
        .batch_execute(&format!(
            r#"UPDATE {} SET "replicaVersion" = '05'; DELETE FROM {}"#,
            db.table("replicationConfig"),
            db.table("changeLog")
        ))
        .await
        .unwrap();
    for w in ["05", "06", "07", "08"] {
        db.insert_transaction(w, 2).await;
    }
    litestream.set_page(&progress_page(&[("0c", old), ("0d", old)]));
    assert_eq!(
        decisions(&sidecar, 3).await,
        Decision::Hold(HoldReason::ReplicaReset)
    );
    let status = sidecar.status.get();
    assert_eq!(status.replica_version.as_deref(), Some("05"));
    assert_eq!(status.last_purge, None);
    assert_eq!(status.highest_backup, None);
    assert!(status.replica_reset.is_some());
    // Nothing tracked is about the old replica, and nothing of the new log went.
    assert!(
        status.recent_backups.is_empty(),
        "{:?}",
        status.recent_backups
    );
    assert_eq!(db.watermarks().await, ["05", "06", "07", "08"]);
    // Statuses wait for a backup of the new replica.
    assert_eq!(sidecar.registry.newest_backup(), None);
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["cleanup"]["replica_version"], "05");
    assert!(json["cleanup"]["replica_reset_at"].is_string(), "{json}");
    sidecar.stop().await;
}

/// litestream restarted (its page's process start time changed) and shows no backup yet: where its backup stands is
/// unknown, so cleanup holds and statuses wait; the next page with a sample makes it known again.
#[tokio::test]
async fn a_restarted_litestream_without_a_sample_leaves_the_backup_unknown_until_it_reports_one() {
    let db = seeded().await;
    let old = aged();
    let page = |start: f64, samples: &[(&str, f64)]| {
        format!(
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {start}\n{}",
            progress_page(samples)
        )
    };
    let litestream = MetricsServer::start(&page(1.7e9, &[("0b", old)])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0c"));
    eventually_async("purged below 0b", || async {
        db.watermarks().await == ["0b", "0c", "0d", "0e"]
    })
    .await;

    litestream.set_page(&page(1.8e9, &[]));
    settles_on(&sidecar, Decision::Hold(HoldReason::BackupUnknown)).await;
    let unknown = sidecar.status.get().backup_unknown.unwrap_or_default();
    assert!(unknown.contains("litestream restarted"), "{unknown}");
    let scrape = scrape(&sidecar).await;
    assert_eq!(
        value(&scrape, "litestream_sidecar_backup_position_known", None),
        Some(0.0)
    );
    // A reservation opened now protects every row and gets no status yet.
    let mut ws = connect(&sidecar.snapshot_url("vs-new")).await;
    eventually("reserved", || sidecar.registry.len() == 1).await;
    assert_eq!(sidecar.registry.open_reservations()[0].floor, None);

    // The new process reports a backup: known again, the status goes out pinned there.
    litestream.set_page(&page(1.8e9, &[("0c", old)]));
    assert!(next_text(&mut ws).await.contains("backupURL"));
    assert_eq!(
        sidecar.registry.open_reservations()[0].floor.as_deref(),
        Some("0c")
    );
    assert_eq!(sidecar.status.get().backup_unknown, None);
    sidecar.stop().await;
}

/// The seeded log purged below an aged backup at 0c, with a subscriber at 0e.
async fn purged_below_0c() -> (
    TestSchema,
    MetricsServer,
    Sidecar,
    litestream_sidecar::cleanup::subscribers::SubscriberHandle,
) {
    let db = seeded().await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = start_aged(
        cleanup_config(&db, &litestream, ""),
        Duration::from_secs(60),
    )
    .await;
    let sub = sidecar.subscribers.connect(subscriber("vs", "0e"));
    eventually_async("purged below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    (db, litestream, sidecar, sub)
}
