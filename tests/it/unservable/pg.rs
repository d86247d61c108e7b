//! Refusals against a real change DB: the upstream's `replicas` table seen through the change DB's connection (the
//! upstream database and the change DB are one here, as in many deployments), the change log followed behind the
//! relay with a stand-in change-streamer, and the log lines of the binary as operators run it.

use std::time::Duration;

use litestream_sidecar::cleanup::{Decision, HoldReason};
use litestream_sidecar::App;
use serde_json::Value;

use crate::support::pg::TestSchema;
use crate::support::*;

/// `"{app_id}_0"`: the shard's schema in the upstream database.
fn upstream_schema(db: &TestSchema) -> String {
    format!("\"{}_0\"", db.app_id)
}

/// The `replicas` table as Zero 1.9 leaves it (shard schema v23), with one replica.
async fn replicas_of_zero_1_9(db: &TestSchema) {
    let s = upstream_schema(db);
    db.client
        .batch_execute(&format!(
            r#"
            CREATE SCHEMA {s};
            CREATE TABLE {s}.replicas (
              "id"                 TEXT PRIMARY KEY DEFAULT replace(gen_random_uuid()::text, '-', ''),
              "rank"               BIGSERIAL,
              "slot"               TEXT NOT NULL,
              "version"            TEXT NOT NULL,
              "initialSchema"      JSON,
              "initialSyncContext" JSON,
              "subscriberContext"  JSON
            );
            INSERT INTO {s}.replicas ("id", "slot", "version") VALUES ('r1', 'zero_0_1761', '1rs');
            "#
        ))
        .await
        .unwrap();
}

/// Zero 1.10's migrations v24 and v25: `backupPath` and `backupV5`, NULL and false for the existing replica.
async fn migrate_to_zero_1_10(db: &TestSchema) {
    let s = upstream_schema(db);
    db.client
        .batch_execute(&format!(
            r#"
            ALTER TABLE {s}.replicas ADD COLUMN "backupPath" TEXT;
            ALTER TABLE {s}.replicas ADD COLUMN "generation" TEXT;
            ALTER TABLE {s}.replicas ADD COLUMN "backupV5" BOOL DEFAULT false;
            "#
        ))
        .await
        .unwrap();
}

/// What a replication-manager with `ZERO_LITESTREAM_BACKUP_USING_V5` records when it takes the slot over.
async fn set_backup(db: &TestSchema, path: Option<&str>, v5: bool) {
    db.client
        .execute(
            &format!(
                r#"UPDATE {}.replicas SET "backupPath" = $1, "backupV5" = $2 WHERE id = 'r1'"#,
                upstream_schema(db)
            ),
            &[&path, &v5],
        )
        .await
        .unwrap();
}

async fn drop_all(db: TestSchema) {
    let _ = db
        .client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            upstream_schema(&db)
        ))
        .await;
    db.drop().await;
}

async fn report(sidecar: &Sidecar) -> Value {
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The `reason` of every refusal `/status` shows.
fn refused(json: &Value) -> Vec<String> {
    json["unservable"]
        .as_array()
        .unwrap_or_else(|| panic!("no unservable array: {json:#}"))
        .iter()
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .collect()
}

/// Until `/status` shows exactly the refusals `reasons`.
async fn refuses(sidecar: &Sidecar, reasons: &[&str]) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let json = report(sidecar).await;
        if refused(&json) == reasons {
            return json;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the refusals {reasons:?}: {json:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn unservable_metric(page: &prometheus_parse::Scrape, reason: &str) -> Option<f64> {
    value(
        page,
        "litestream_sidecar_unservable",
        Some(("reason", reason)),
    )
}

/// A change log 0a..0e, litestream's gauge at 0c backed up two minutes ago, a subscriber acked at 0d, and a sidecar
/// up for a minute: nothing but a refusal keeps it from purging below 0c.
async fn purgeable(db: &TestSchema, litestream: &MetricsServer) -> Sidecar {
    for w in ["0a", "0b", "0c", "0d", "0e"] {
        db.insert_transaction(w, 2).await;
    }
    let config = config(&format!(
        "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"2s\"\n\
         [server]\nping_interval = \"100ms\"\n",
        db.config(),
        litestream.url()
    ));
    start_aged(config, Duration::from_secs(60)).await
}

/// A v6 reservation, as a Zero 1.9+ view-syncer opens before it restores.
async fn reserve(sidecar: &Sidecar, task: &str) -> RawClient {
    RawClient::connect(
        sidecar.addr,
        &format!("/replication/v6/snapshot?taskID={task}"),
    )
    .await
}

#[tokio::test]
async fn a_replica_backing_up_to_a_path_of_its_own_is_refused_until_its_path_is_cleared() {
    let db = TestSchema::create(Some(6), None).await;
    replicas_of_zero_1_9(&db).await;
    migrate_to_zero_1_10(&db).await;
    // Taken over by a replication-manager with ZERO_LITESTREAM_BACKUP_USING_V5: a path per replica, litestream 0.5.
    set_backup(&db, Some("1761300000000"), true).await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = purgeable(&db, &litestream).await;
    let all = db.watermarks().await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));

    let json = refuses(&sidecar, &["backup_path"]).await;
    let refusal = &json["unservable"][0];
    let table = format!("\"{}_0\".\"replicas\"", db.app_id);
    assert_eq!(
        refusal["detail"],
        format!(
            "Zero records per-replica or v5 backups in {table}: replica \"r1\" (backupPath \"1761300000000\", \
             backupV5 true)"
        ),
        "{json:#}"
    );
    assert!(refusal["remedy"]
        .as_str()
        .unwrap()
        .contains("unset ZERO_LITESTREAM_BACKUP_USING_V5"));
    assert!(refusal["since"].is_string(), "{json:#}");
    settles_on(&sidecar, Decision::Hold(HoldReason::Unservable)).await;
    // Check after check: held, nothing purged, and no v4+ status for a view-syncer.
    let mut reservation = reserve(&sidecar, "vs-2").await;
    for _ in 0..3 {
        assert_eq!(
            decisions(&sidecar, 1).await,
            Decision::Hold(HoldReason::Unservable)
        );
        assert_eq!(text_after_pings(&mut reservation, 5).await, None);
    }
    assert_eq!(db.watermarks().await, all, "nothing purged");
    let json = report(&sidecar).await;
    assert_eq!(json["cleanup"]["hold_reason"], "unservable", "{json:#}");
    let page = scrape(&sidecar).await;
    assert_eq!(unservable_metric(&page, "backup_path"), Some(1.0));
    assert_eq!(unservable_metric(&page, "ltx"), Some(0.0));
    assert_eq!(
        value(
            &page,
            "litestream_sidecar_cleanup_held_seconds",
            Some(("reason", "unservable"))
        )
        .map(|s| s >= 0.0),
        Some(true)
    );
    let (code, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with(
            "OK; refused (backup_path): cleanup and snapshot statuses held: Zero records"
        ),
        "{body}"
    );
    assert!(body.contains("what to do: "), "{body}");

    // Rolled back to a v3 backup in place, still below its own path: still refused, with the new detail.
    set_backup(&db, Some("1761300000000"), false).await;
    eventually_async("the detail follows the row", || async {
        report(&sidecar).await["unservable"][0]["detail"]
            .as_str()
            .is_some_and(|d| d.ends_with("backupV5 false)"))
    })
    .await;

    // Resynced without v5: nothing recorded, the refusal clears, and cleanup purges what it may.
    drop(reservation);
    eventually("the reservation ended", || sidecar.registry.is_empty()).await;
    set_backup(&db, None, false).await;
    refuses(&sidecar, &[]).await;
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let page = scrape(&sidecar).await;
    assert_eq!(unservable_metric(&page, "backup_path"), Some(0.0));
    let mut reservation = reserve(&sidecar, "vs-3").await;
    let mut status = None;
    for _ in 0..100 {
        status = text_after_pings(&mut reservation, 1).await;
        if status.is_some() {
            break;
        }
    }
    let status = status.expect("a v6 status once the refusal cleared");
    assert!(status.starts_with(V4_STATUS), "{status}");
    let (_, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert!(!body.contains("refused"), "{body}");
    sidecar.stop().await;
    drop_all(db).await;
}

#[tokio::test]
async fn without_the_replicas_table_or_its_backup_columns_nothing_is_refused() {
    // No upstream schema at all: the upstream is another database (or Zero has not created it).
    let db = TestSchema::create(Some(6), None).await;
    let litestream = MetricsServer::start(&progress_page(&[("0c", aged())])).await;
    let sidecar = purgeable(&db, &litestream).await;
    let _sub = sidecar.subscribers.connect(subscriber("vs-1", "0d"));
    eventually_async("purge below 0c", || async {
        db.watermarks().await == ["0c", "0d", "0e"]
    })
    .await;
    let json = report(&sidecar).await;
    assert_eq!(refused(&json), Vec::<String>::new(), "{json:#}");
    let page = scrape(&sidecar).await;
    for reason in ["ltx", "backup_path", "log_not_written"] {
        assert_eq!(unservable_metric(&page, reason), Some(0.0), "{reason}");
    }

    // Zero 1.9's table, without the columns; then 1.10's migrations with nothing recorded: still nothing.
    replicas_of_zero_1_9(&db).await;
    for _ in 0..3 {
        decisions(&sidecar, 1).await;
        assert_eq!(refused(&report(&sidecar).await), Vec::<String>::new());
    }
    migrate_to_zero_1_10(&db).await;
    for _ in 0..3 {
        decisions(&sidecar, 1).await;
        assert_eq!(refused(&report(&sidecar).await), Vec::<String>::new());
    }
    // The same sidecar sees v5 once it is recorded: the check runs all along.
    set_backup(&db, None, true).await;
    refuses(&sidecar, &["backup_path"]).await;
    sidecar.stop().await;
    drop_all(db).await;
}

/// The watermark of the `n`th transaction after the test schema's replica version (`lexi(1000)`, "1rs").
fn wm(n: u64) -> String {
    lexi(1000 + n)
}

fn commit(w: &str) -> String {
    format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#)
}

#[tokio::test]
async fn commits_relayed_that_never_reach_the_change_log_are_refused_until_they_do() {
    let db = TestSchema::create(Some(6), None).await;
    db.insert_transaction(&wm(1), 1).await;
    let mut upstream = Upstream::start().await;
    let config = upstream.config(&format!(
        "{}[litestream]\ncheck_interval = \"1s\"\n[server]\nping_interval = \"100ms\"\n",
        db.config()
    ));
    let after = Duration::from_secs(4);
    let sidecar = start_app(App::new(config).log_unwritten_after(after)).await;
    let path = format!(
        "/replication/v6/changes?taskID=vs&id=vs-1&mode=serving&watermark={}&replicaVersion=1rs&initial=false",
        wm(1)
    );
    let url = sidecar.url(&path);
    let (mut client, mut conn) = tokio::join!(connect(&url), upstream.accept());
    conn.send_msg(1, UPSTREAM_STATUS).await;
    next_text(&mut client).await;

    // A storer that writes each commit shortly after the change-streamer forwards it: never refused, however
    // long it runs.
    for (id, n) in [(2, 2), (3, 3)] {
        conn.send_msg(id, &commit(&wm(n))).await;
        next_text(&mut client).await;
        db.insert_transaction(&wm(n), 1).await;
    }
    let checks = sidecar.status.get().checks;
    let started = tokio::time::Instant::now();
    // Past the bound by a few checks.
    while tokio::time::Instant::now() < started + after * 2
        || sidecar.status.get().checks < checks + 4
    {
        assert_eq!(refused(&report(&sidecar).await), Vec::<String>::new());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Zero stops writing the change log (pgChangeLogEnabled off): commits keep coming, none is stored.
    for (id, n) in [(4, 4), (5, 5), (6, 6)] {
        conn.send_msg(id, &commit(&wm(n))).await;
        next_text(&mut client).await;
    }
    let all = db.rows().await;
    let json = refuses(&sidecar, &["log_not_written"]).await;
    // The commit followed is the newest relayed when a check first saw one not in the log.
    let detail = json["unservable"][0]["detail"].as_str().unwrap();
    let named = |n| detail.starts_with(&format!("commit {} was relayed to subscribers at ", wm(n)));
    assert!(
        (named(4) || named(5) || named(6))
            && detail.ends_with(&format!(
                "and the change log \"{}\".\"changeLog\" still holds nothing at or past it",
                db.schema
            )),
        "{detail}"
    );
    assert!(json["unservable"][0]["remedy"]
        .as_str()
        .unwrap()
        .contains("pgChangeLogEnabled"));
    settles_on(&sidecar, Decision::Hold(HoldReason::Unservable)).await;
    let mut reservation = reserve(&sidecar, "vs-2").await;
    assert_eq!(text_after_pings(&mut reservation, 10).await, None);
    let page = scrape(&sidecar).await;
    assert_eq!(unservable_metric(&page, "log_not_written"), Some(1.0));
    assert_eq!(db.rows().await, all, "nothing purged");

    // Written again (the setting undone, or the storer back): the log reaches the commit, and it clears.
    db.insert_transaction(&wm(6), 1).await;
    refuses(&sidecar, &[]).await;
    // A backup that reaches the log: no status goes out while the log starts past the newest backup.
    sidecar.registry.saw_backup(&wm(6));
    let mut status = None;
    for _ in 0..100 {
        status = text_after_pings(&mut reservation, 1).await;
        if status.is_some() {
            break;
        }
    }
    let status = status.expect("a v6 status once the refusal cleared");
    assert!(status.starts_with(V4_STATUS), "{status}");
    sidecar.stop().await;
    db.drop().await;
}

/// The binary as operators run it: kills it on the way out, whatever the test did.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits (up to 30 s) for a line of `lines` that has every one of `needles`; returns it.
fn line_with(
    lines: &std::sync::mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    needles: &[&str],
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push(line.clone());
                if needles.iter().all(|n| line.contains(n)) {
                    return line;
                }
            }
            Err(_) => panic!("no log line with {needles:?}; the log:\n{}", seen.concat()),
        }
    }
}

/// The error an operator reads at 3 a.m.: at error, at the first check, saying what was found, why and what to do;
/// and one line at info when it clears.
#[tokio::test]
async fn the_log_says_at_error_what_was_found_why_and_what_to_do_and_when_it_clears() {
    use std::io::BufRead;
    let db = TestSchema::create(Some(6), None).await;
    replicas_of_zero_1_9(&db).await;
    migrate_to_zero_1_10(&db).await;
    set_backup(&db, Some("1761300000000"), true).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.toml");
    std::fs::write(
        &path,
        format!(
            "{}[server]\nlisten = \"127.0.0.1:0\"\n[litestream]\nbackup_url = \"s3://b/r\"\n\
             proxy_listen = \"127.0.0.1:0\"\nmetrics_url = \"{NO_LITESTREAM}\"\ncheck_interval = \"1s\"\n\
             [discovery]\nmode = \"off\"\n[backup]\nverify = false\n[log]\nformat = \"text\"\n",
            db.config()
        ),
    )
    .unwrap();
    let mut child = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_litestream-sidecar"))
            .arg("--config")
            .arg(&path)
            .env_clear()
            .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
            .env("NO_COLOR", "1")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line + "\n").is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let refused = line_with(&lines, &mut seen, &["refused (backup_path)"]);
    assert!(refused.contains("ERROR"), "{refused}");
    for needle in [
        "the sidecar cannot serve this deployment",
        r#"replica "r1" (backupPath "1761300000000", backupV5 true)"#,
        "per-replica path below the backup URL",
        "what to do: unset ZERO_LITESTREAM_BACKUP_USING_V5",
    ] {
        assert!(refused.contains(needle), "no {needle:?} in {refused}");
    }
    set_backup(&db, None, false).await;
    let cleared = line_with(&lines, &mut seen, &["no longer refused (backup_path)"]);
    assert!(cleared.contains("INFO"), "{cleared}");
    let errors = seen
        .iter()
        .filter(|l| l.contains("refused (backup_path)") && l.contains("ERROR"))
        .count();
    assert_eq!(
        errors,
        1,
        "said once, not at every check:\n{}",
        seen.concat()
    );
    drop(child);
    drop_all(db).await;
}
