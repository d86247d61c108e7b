use std::time::Duration;

use crate::support::pg::{self, TestSchema};
use crate::support::*;
use litestream_sidecar::cleanup::discovery::Registration;
use litestream_sidecar::cleanup::{Decision, HoldReason};

const OURS: &str = "127.0.0.1:4851";

fn discovery_config(db: &TestSchema, mode: &str, extra: &str) -> litestream_sidecar::Config {
    config(&format!(
        "{}[discovery]\nmode = \"{mode}\"\nadvertise_address = \"{OURS}\"\ninterval = \"100ms\"\n{extra}",
        db.config()
    ))
}

async fn registration(sidecar: &Sidecar) -> Option<Registration> {
    sidecar.discovery.get().registration
}

#[tokio::test]
async fn verify_reports_registered_elsewhere_missing_and_prefixed_addresses() {
    let db = TestSchema::create(Some(5), None).await;
    let sidecar = start(discovery_config(&db, "verify", "")).await;
    eventually_async("unregistered (NULL)", || async {
        registration(&sidecar).await == Some(Registration::Unregistered)
    })
    .await;
    assert_eq!(http(sidecar.addr, "GET", "/keepalive").await.0, 503);

    db.set_owner_address(Some("10.1.1.1:4849")).await;
    eventually_async("elsewhere", || async {
        registration(&sidecar).await == Some(Registration::Elsewhere("10.1.1.1:4849".into()))
    })
    .await;
    let (status, body) = http(sidecar.addr, "GET", "/keepalive").await;
    assert_eq!(status, 503);
    assert!(body.contains("ownerAddress"), "{body}");

    db.set_owner_address(Some(OURS)).await;
    eventually_async("registered", || async {
        registration(&sidecar).await == Some(Registration::Registered)
    })
    .await;
    assert_eq!(
        http(sidecar.addr, "GET", "/keepalive").await,
        (200, "OK".into())
    );

    // Newer Zero versions may write the address with a protocol prefix.
    db.set_owner_address(Some(&format!("wss://{OURS}"))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(registration(&sidecar).await, Some(Registration::Registered));

    // A missing row (a resync truncated the tables) is waited out.
    db.client
        .execute(
            &format!("DELETE FROM {}", db.table("replicationState")),
            &[],
        )
        .await
        .unwrap();
    eventually_async("row missing", || async {
        registration(&sidecar).await == Some(Registration::Unregistered)
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn verify_never_writes_the_row() {
    let db = TestSchema::create(Some(6), None).await;
    db.set_owner_address(Some("127.0.0.1:4849")).await;
    let before = db.replication_state().await.2;
    let sidecar = start(discovery_config(&db, "verify", "")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.replication_state().await.2, before);
    assert_eq!(
        db.replication_state().await.0.as_deref(),
        Some("127.0.0.1:4849")
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn keepalive_needs_the_change_db_even_with_discovery_off() {
    let db = TestSchema::empty().await;
    let sidecar = start(discovery_config(&db, "off", "")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(http(sidecar.addr, "GET", "/keepalive").await.0, 503);
    db.create_tables(Some(5), None).await;
    eventually_async("ready", || async {
        http(sidecar.addr, "GET", "/keepalive").await.0 == 200
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn no_purge_while_not_registered_or_registered_too_recently() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
    let extra = format!(
        "[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"1s\"\n",
        litestream.url()
    );
    // Not registered: held, however long the sidecar has been up.
    let sidecar = start_aged(
        discovery_config(&db, "verify", &extra),
        Duration::from_secs(120),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0c"));
    db.set_owner_address(Some("10.1.1.1:4849")).await;
    let checks = sidecar.status.get().checks;
    eventually("two checks", || sidecar.status.get().checks >= checks + 2).await;
    assert_eq!(
        sidecar.status.get().last_decision,
        Some(Decision::Hold(HoldReason::NotRegistered))
    );

    // Registered now, but only just: subscribers that used the change-streamer directly get time to move over.
    db.set_owner_address(Some(OURS)).await;
    eventually("recently registered", || {
        sidecar.status.get().last_decision == Some(Decision::Hold(HoldReason::RecentlyRegistered))
    })
    .await;
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c"]);
    sidecar.stop().await;

    // Registered from the start of a sidecar that has been up long enough: purges.
    let sidecar = start_aged(
        discovery_config(&db, "verify", &extra),
        Duration::from_secs(120),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0c"));
    eventually_async("purged below 0b", || async {
        db.watermarks().await == ["0b", "0c"]
    })
    .await;
    sidecar.stop().await;
}

#[tokio::test]
async fn the_purge_rechecks_ownership_and_deletes_nothing_once_the_address_moved() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    db.set_owner_address(Some("10.1.1.1:4849")).await;
    let change_db = litestream_sidecar::cleanup::change_db::ChangeDb::start(
        discovery_config(&db, "verify", "").change_db.url,
        &discovery_config(&db, "verify", "").zero,
        Default::default(),
        Default::default(),
    );
    tokio::time::timeout(Duration::from_secs(10), change_db.ready())
        .await
        .unwrap();
    // The decision was made while registered; the address moved before the delete.
    let stop = Default::default();
    let outcome = change_db.purge("0c", Some(OURS), 10, &stop).await.unwrap();
    assert_eq!(outcome.rows, 0);
    assert!(!outcome.is_complete());
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c"]);
    db.set_owner_address(Some(OURS)).await;
    let outcome = change_db.purge("0c", Some(OURS), 10, &stop).await.unwrap();
    assert_eq!(outcome.rows, 6);
    assert_eq!(db.watermarks().await, ["0c"]);
}

#[tokio::test]
async fn v4_status_carries_replica_version_and_min_watermark_and_v3_keeps_its_shape() {
    let db = TestSchema::create(Some(5), None).await;
    let sidecar = start(discovery_config(&db, "off", "")).await;
    // An empty change log: catch-up can start from the replica version itself.
    let mut ws = connect(&sidecar.url("/replication/v4/snapshot?taskID=t4")).await;
    assert_eq!(next_text(&mut ws).await, v4_status_unsized("1rs"));
    for w in ["0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    for version in 4..=6 {
        let mut ws = connect(&sidecar.url(&format!(
            "/replication/v{version}/snapshot?taskID=t{version}"
        )))
        .await;
        assert_eq!(next_text(&mut ws).await, v4_status_unsized("0b"));
    }
    let mut v3 = connect(&sidecar.url("/replication/v3/snapshot?taskID=t3")).await;
    assert_eq!(
        next_text(&mut v3).await,
        r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn v4_status_is_held_back_with_pings_until_the_change_db_answers() {
    let db = TestSchema::empty().await;
    let sidecar = start(discovery_config(
        &db,
        "off",
        "[server]\nping_interval = \"100ms\"\n",
    ))
    .await;
    let mut raw = RawClient::connect(sidecar.addr, "/replication/v4/snapshot?taskID=early").await;
    // Only pings while the schema is missing.
    for _ in 0..3 {
        let (opcode, _) = raw.read_frame().await.unwrap();
        assert_eq!(opcode, 0x9, "expected a ping while the status is held back");
        raw.write_frame(true, 0xA, b"").await;
    }
    assert_eq!(sidecar.registry.len(), 1);
    db.create_tables(Some(5), None).await;
    loop {
        let (opcode, payload) = raw.read_frame().await.unwrap();
        if opcode == 0x9 {
            raw.write_frame(true, 0xA, b"").await;
            continue;
        }
        assert_eq!(opcode, 0x1);
        assert_eq!(
            String::from_utf8(payload).unwrap(),
            v4_status_unsized("1rs")
        );
        break;
    }
    sidecar.stop().await;
}

/// Zero 0.20's storer: SERIALIZABLE, reads replicationState at `begin`, inserts the transaction's changes, then
/// updates "lastWatermark" at `commit` (docs/protocol.md, "The storer's transactions"). Nothing the sidecar does in `verify` mode — reading the
/// address every 100 ms, purging — may make that commit fail with 40001.
#[tokio::test]
async fn verify_mode_never_aborts_zeros_serializable_storer() {
    let db = TestSchema::create(Some(5), None).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    db.set_owner_address(Some(OURS)).await;
    let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
    let extra = format!(
        "[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"1s\"\n",
        litestream.url()
    );
    let storer = pg::connect().await;
    let (state, log) = (db.table("replicationState"), db.table("changeLog"));
    storer
        .batch_execute(&format!(
            r#"BEGIN ISOLATION LEVEL SERIALIZABLE;
               SELECT * FROM {state};
               INSERT INTO {log} (watermark, pos, change) VALUES ('0d', 0, '{{"tag":"begin"}}');"#
        ))
        .await
        .unwrap();

    let sidecar = start_aged(
        discovery_config(&db, "verify", &extra),
        Duration::from_secs(120),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0c"));
    eventually_async("purged below 0b", || async {
        db.watermarks().await == ["0b", "0c"]
    })
    .await;

    storer
        .batch_execute(&format!(
            r#"INSERT INTO {log} (watermark, pos, change, precommit) VALUES ('0d', 1, '{{"tag":"commit"}}', '0d');
               UPDATE {state} SET "lastWatermark" = '0d';
               COMMIT;"#
        ))
        .await
        .expect("the storer's transaction commits");
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d"]);
    sidecar.stop().await;
}

const UPSTREAM: &str = "127.0.0.1:4849";

fn adopt_config(db: &TestSchema) -> litestream_sidecar::Config {
    discovery_config(
        db,
        "adopt",
        &format!("[upstream]\naddress = \"{UPSTREAM}\"\nadvertised_address = \"{UPSTREAM}\"\n"),
    )
}

#[tokio::test]
async fn adopt_replaces_only_the_upstreams_address_on_row_lock_schemas() {
    let db = TestSchema::create(Some(6), Some(UPSTREAM)).await;
    let sidecar = start(adopt_config(&db)).await;
    eventually_async("adopted", || async {
        db.replication_state().await.0.as_deref() == Some(OURS)
    })
    .await;
    let (_, owner, xmin) = db.replication_state().await;
    assert_eq!(
        owner.as_deref(),
        Some("rm-task-1"),
        "owner is never touched"
    );
    // Already registered: nothing is written (the row version stays the same).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.replication_state().await.2, xmin);

    // The change-streamer restarts and writes its own address again: adopted again.
    db.set_owner_address(Some(UPSTREAM)).await;
    eventually_async("adopted again", || async {
        db.replication_state().await.0.as_deref() == Some(OURS)
    })
    .await;

    // A foreign address (another replication-manager took over) is left alone.
    db.set_owner_address(Some("10.9.9.9:4849")).await;
    let xmin = db.replication_state().await.2;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.replication_state().await,
        (Some("10.9.9.9:4849".into()), Some("rm-task-1".into()), xmin)
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn an_adopted_address_counts_as_registered_from_the_adoption_not_from_the_start() {
    let db = TestSchema::create(Some(6), Some(UPSTREAM)).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
    let extra = format!(
        "[upstream]\naddress = \"{UPSTREAM}\"\nadvertised_address = \"{UPSTREAM}\"\n\
         [litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"1s\"\n",
        litestream.url()
    );
    // Up for two minutes (its first good reading of the change DB came that late), then it adopts the address:
    // view-syncers that streamed from the replication-manager until now get their grace to move over.
    let sidecar = start_aged(
        discovery_config(&db, "adopt", &extra),
        Duration::from_secs(120),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0c"));
    eventually_async("adopted", || async {
        db.replication_state().await.0.as_deref() == Some(OURS)
    })
    .await;
    let checks = sidecar.status.get().checks;
    eventually("three checks", || sidecar.status.get().checks >= checks + 3).await;
    assert_eq!(
        sidecar.status.get().last_decision,
        Some(Decision::Hold(HoldReason::RecentlyRegistered))
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c"]);
    sidecar.stop().await;
}

#[tokio::test]
async fn adopt_refuses_to_write_on_zero_0_20_schemas() {
    for data_version in [Some(5), None] {
        let db = TestSchema::create(data_version, Some(UPSTREAM)).await;
        let before = db.replication_state().await;
        let sidecar = start(adopt_config(&db)).await;
        eventually_async("read", || async {
            registration(&sidecar).await == Some(Registration::Elsewhere(UPSTREAM.into()))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(db.replication_state().await, before, "{data_version:?}");
        sidecar.stop().await;
    }
}

#[tokio::test]
async fn adopt_puts_the_address_back_when_the_binary_gets_sigterm() {
    use std::io::{BufRead, BufReader};
    let db = TestSchema::create(Some(6), Some(UPSTREAM)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.toml");
    std::fs::write(
        &path,
        format!(
            "{}[server]\nlisten = \"127.0.0.1:0\"\n[litestream]\nbackup_url = \"s3://b/r\"\nproxy_listen = \"127.0.0.1:0\"\n\
             [discovery]\nmode = \"adopt\"\nadvertise_address = \"{OURS}\"\ninterval = \"100ms\"\n\
             [upstream]\naddress = \"{UPSTREAM}\"\n[log]\nformat = \"json\"\n\
             [cleanup]\nstate_file = \"{}\"\n",
            db.config(),
            // Its own state, not the host's default path.
            dir.path().join("state.json").display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_litestream-sidecar"))
        .arg("--config")
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    eventually_async("adopted", || async {
        db.replication_state().await.0.as_deref() == Some(OURS)
    })
    .await;
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(db.replication_state().await.0.as_deref(), Some(UPSTREAM));
    let logs = logs.join().unwrap();
    assert!(
        logs.iter().any(|l| l.contains("ownerAddress restored")),
        "{logs:?}"
    );
}

const RM: &str = "10.1.1.1:4849";

/// Zero 1.9's recommended topology: view-syncers reach the sidecar by URI, `ownerAddress` keeps the
/// replication-manager's own address. Mode `owner` purges while that address and its task hold the log, holds when
/// another replication-manager or another task takes it over, and never needs the sidecar's own address.
#[tokio::test]
async fn owner_mode_purges_only_while_the_fronted_replication_manager_owns_the_log() {
    let db = TestSchema::create(Some(6), Some(RM)).await;
    for w in ["0a", "0b", "0c", "0d"] {
        db.insert_transaction(w, 1).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0b", aged())])).await;
    let sidecar = start_aged(
        config(&format!(
            "{}[discovery]\nmode = \"owner\"\ninterval = \"100ms\"\n[upstream]\nadvertised_address = \"ws://{RM}\"\n\
             [litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nreconnect_grace = \"1s\"\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(120),
    )
    .await;
    let _sub = sidecar.subscribers.connect(subscriber("vs", "0d"));
    eventually_async("purged below 0b", || async {
        db.watermarks().await == ["0b", "0c", "0d"]
    })
    .await;
    assert_eq!(sidecar.discovery.get().owner.as_deref(), Some("rm-task-1"));
    // The sidecar never writes the row.
    assert_eq!(db.replication_state().await.0.as_deref(), Some(RM));

    // Another task of the same replication-manager address takes over: everything waits again.
    db.client
        .execute(
            &format!(
                r#"UPDATE {} SET "owner" = 'rm-task-2'"#,
                db.table("replicationState")
            ),
            &[],
        )
        .await
        .unwrap();
    litestream.set_page(&progress_page(&[("0b", aged()), ("0c", aged())]));
    eventually("a new owner is recently registered", || {
        sidecar.status.get().last_decision == Some(Decision::Hold(HoldReason::RecentlyRegistered))
    })
    .await;
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d"]);

    // Another replication-manager: not ours to purge for.
    db.set_owner_address(Some("10.9.9.9:4849")).await;
    eventually("not registered", || {
        sidecar.status.get().last_decision == Some(Decision::Hold(HoldReason::NotRegistered))
    })
    .await;
    assert_eq!(db.watermarks().await, ["0b", "0c", "0d"]);
    // View-syncers reach the sidecar by URI whoever owns the log: it stays ready, only cleanup waits.
    assert_eq!(http(sidecar.addr, "GET", "/keepalive").await.0, 200);
    sidecar.stop().await;
    db.drop().await;
}

/// Every purge batch re-reads `owner` in its own transaction: a takeover between the decision and the delete
/// deletes nothing.
#[tokio::test]
async fn the_purge_rechecks_the_owner_task_and_deletes_nothing_after_a_takeover() {
    let db = TestSchema::create(Some(6), Some(RM)).await;
    for w in ["0a", "0b", "0c"] {
        db.insert_transaction(w, 1).await;
    }
    let (change_db, shutdown) = db.connected().await;
    let stop = Default::default();
    let taken_over = litestream_sidecar::cleanup::change_db::Expected {
        address: RM,
        owner: Some("rm-task-0"),
    };
    let outcome = change_db
        .purge("0c", Some(taken_over), 10, &stop)
        .await
        .unwrap();
    assert_eq!(
        (outcome.rows, outcome.stopped),
        (
            0,
            Some(
                litestream_sidecar::cleanup::change_db::PurgeStop::OwnerChanged {
                    found: Some("rm-task-1".into())
                }
            )
        )
    );
    assert_eq!(db.watermarks().await, ["0a", "0b", "0c"]);
    let current = litestream_sidecar::cleanup::change_db::Expected {
        address: RM,
        owner: Some("rm-task-1"),
    };
    let outcome = change_db
        .purge("0c", Some(current), 10, &stop)
        .await
        .unwrap();
    assert_eq!((outcome.rows, outcome.stopped), (6, None));
    assert_eq!(db.watermarks().await, ["0c"]);
    shutdown.cancel();
    db.drop().await;
}

/// Zero >= 1.8 withholds the snapshot status until a restorable backup exists: a view-syncer handed one with
/// nothing to restore fails and retries with a new reservation. Every version waits, pinged meanwhile.
#[tokio::test]
async fn statuses_are_withheld_until_litestream_reports_a_first_backup() {
    let db = TestSchema::create(Some(6), None).await;
    db.insert_transaction("0b", 1).await;
    let litestream = MetricsServer::start("# litestream without a backup yet\n").await;
    let sidecar = start(discovery_config(
        &db,
        "off",
        &format!(
            "[server]\nping_interval = \"100ms\"\n[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n",
            litestream.url()
        ),
    ))
    .await;
    let mut v3 = RawClient::connect(sidecar.addr, "/replication/v3/snapshot?taskID=v3").await;
    let mut v6 = RawClient::connect(sidecar.addr, "/replication/v6/snapshot?taskID=v6").await;
    // Both sockets are read in turn, a ping at a time, so that neither misses its pongs.
    for _ in 0..3 {
        assert_eq!(
            text_after_pings(&mut v3, 1).await,
            None,
            "no v3 status without a backup"
        );
        assert_eq!(
            text_after_pings(&mut v6, 1).await,
            None,
            "no v6 status without a backup"
        );
    }
    assert_eq!(sidecar.registry.len(), 2);

    litestream.set_page(&progress_page(&[("0b", epoch_now() - 10.0)]));
    let (mut status3, mut status6) = (None, None);
    for _ in 0..100 {
        if status3.is_none() {
            status3 = text_after_pings(&mut v3, 1).await;
        }
        if status6.is_none() {
            status6 = text_after_pings(&mut v6, 1).await;
        }
        if status3.is_some() && status6.is_some() {
            break;
        }
    }
    assert_eq!(
        status3.as_deref(),
        Some(r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#)
    );
    assert_eq!(status6, Some(v4_status("0b")));
    sidecar.stop().await;
    db.drop().await;
}

/// A view-syncer that keeps its replica catches up from the `minWatermark` it was sent, not from the backup: the
/// reservation's floor is what the status announced, so no purge goes past it while the reservation is open.
#[tokio::test]
async fn a_v4_reservation_protects_the_min_watermark_it_announced() {
    let db = TestSchema::create(Some(6), None).await;
    for w in ["0a", "0b", "0c", "0d"] {
        db.insert_transaction(w, 1).await;
    }
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0c", old)])).await;
    let sidecar = start_aged(
        discovery_config(
            &db,
            "off",
            &format!(
                "[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nenabled = false\n",
                litestream.url()
            ),
        ),
        Duration::from_secs(120),
    )
    .await;
    eventually("backup seen", || {
        sidecar
            .status
            .get()
            .newest_backup
            .map(|(w, _)| w)
            .as_deref()
            == Some("0c")
    })
    .await;
    let mut v3 = connect(&sidecar.url("/replication/v3/snapshot?taskID=v3")).await;
    next_text(&mut v3).await;
    let mut v6 = connect(&sidecar.url("/replication/v6/snapshot?taskID=v6")).await;
    assert_eq!(next_text(&mut v6).await, v4_status("0a"));
    let floors: std::collections::HashMap<String, Option<String>> = sidecar
        .registry
        .open_reservations()
        .into_iter()
        .map(|r| (r.task_id, r.floor))
        .collect();
    // v3 protects from the backup it restores; v6 from the minWatermark it announced.
    assert_eq!(floors["v3"].as_deref(), Some("0c"));
    assert_eq!(floors["v6"].as_deref(), Some("0a"));
    assert_eq!(
        litestream_sidecar::cleanup::ceiling(
            litestream_sidecar::cleanup::ReservationMode::Pin,
            &sidecar.registry.for_policy()
        ),
        litestream_sidecar::cleanup::Ceiling::Below("0a".into())
    );
    sidecar.stop().await;
    db.drop().await;
}

/// Zero 1.10 confirms a reservation only while the change log's oldest watermark is at or below the backed-up one
/// (docs/protocol.md, "The snapshot status"): a log purged past the newest backup by someone else would leave a
/// restore of it unable to catch up, whatever the view-syncer's version. Every status waits, pinging, until a backup
/// reaches the log again, and `/status` says why; the v6 status then carries the replica's size.
#[tokio::test]
async fn a_status_of_any_version_waits_while_the_log_starts_past_the_newest_backup() {
    let db = TestSchema::create(Some(6), None).await;
    for w in ["0a", "0b", "0c", "0d"] {
        db.insert_transaction(w, 1).await;
    }
    let old = aged();
    let litestream = MetricsServer::start(&progress_page(&[("0b", old)])).await;
    let sidecar = start_aged(
        discovery_config(
            &db,
            "off",
            &format!(
                "[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nenabled = false\n\
                 [server]\nping_interval = \"100ms\"\n",
                litestream.url()
            ),
        ),
        Duration::from_secs(120),
    )
    .await;
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
    // Purged past the backup behind the sidecar's back.
    db.client
        .batch_execute(&format!(
            "DELETE FROM {} WHERE watermark < '0c'",
            db.table("changeLog")
        ))
        .await
        .unwrap();
    let mut v6 = RawClient::connect(sidecar.addr, "/replication/v6/snapshot?taskID=v6").await;
    let mut v3 = RawClient::connect(sidecar.addr, "/replication/v3/snapshot?taskID=v3").await;
    // Longer than a few tries of the status (one a second): nothing but pings.
    let waiting = tokio::time::Instant::now();
    while waiting.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            text_after_pings(&mut v6, 1).await,
            None,
            "no v6 status while the log starts at 0c and the backup is at 0b"
        );
        assert_eq!(
            text_after_pings(&mut v3, 1).await,
            None,
            "no v3 status while the log starts at 0c and the backup is at 0b"
        );
    }
    assert_eq!(
        withheld(&sidecar).await,
        [
            ("v3".to_string(), Some("log_past_backup".to_string())),
            ("v6".to_string(), Some("log_past_backup".to_string()))
        ]
    );

    // A backup that reaches the log again: the statuses go out, v6's from the log's oldest row.
    litestream.set_page(&progress_page(&[("0b", old), ("0d", old)]));
    let (mut status3, mut status6) = (None, None);
    for _ in 0..200 {
        if status3.is_none() {
            status3 = text_after_pings(&mut v3, 1).await;
        }
        if status6.is_none() {
            status6 = text_after_pings(&mut v6, 1).await;
        }
        if status3.is_some() && status6.is_some() {
            break;
        }
    }
    assert_eq!(status3.as_deref(), Some(V3_STATUS));
    assert_eq!(status6, Some(v4_status("0c")));
    assert_eq!(
        withheld(&sidecar).await,
        [("v3".to_string(), None), ("v6".to_string(), None)]
    );
    // v3 keeps the floor it opened with, the backup it would have restored then; v6 protects its minWatermark.
    let floors: std::collections::HashMap<String, Option<String>> = sidecar
        .registry
        .open_reservations()
        .into_iter()
        .map(|r| (r.task_id, r.floor))
        .collect();
    assert_eq!(floors["v3"].as_deref(), Some("0b"));
    assert_eq!(floors["v6"].as_deref(), Some("0c"));
    sidecar.stop().await;
    db.drop().await;
}

/// Each open reservation's task and why its status is withheld, as `/status` says, by task.
async fn withheld(sidecar: &Sidecar) -> Vec<(String, Option<String>)> {
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut list: Vec<_> = json["reservations"]
        .as_array()
        .expect("reservations listed")
        .iter()
        .map(|r| {
            assert!(
                r.get("withheld").is_some(),
                "withheld is always listed: {r}"
            );
            (
                r["task_id"].as_str().unwrap().to_string(),
                r["withheld"].as_str().map(str::to_string),
            )
        })
        .collect();
    list.sort();
    list
}

/// Zero before 0.26 (change DB `dataVersion` 5) did not seed the log at the replica version: untouched, it starts
/// past a backup taken right after the initial sync, and a restore of that backup catches up from its first row.
#[tokio::test]
async fn an_unseeded_log_past_a_backup_at_the_replica_version_still_gets_its_status() {
    let db = TestSchema::create(Some(5), None).await;
    let replica_version = lexi(1000);
    let after = lexi(2000);
    db.insert_transaction(&after, 1).await;
    let litestream = MetricsServer::start(&progress_page(&[(&replica_version, aged())])).await;
    let sidecar = start_aged(
        discovery_config(
            &db,
            "off",
            &format!(
                "[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n[cleanup]\nenabled = false\n[server]\nping_interval = \"100ms\"\n",
                litestream.url()
            ),
        ),
        Duration::from_secs(120),
    )
    .await;
    eventually("backup seen", || {
        sidecar.status.get().newest_backup.is_some()
    })
    .await;
    let mut v4 = connect(&sidecar.url("/replication/v4/snapshot?taskID=v4")).await;
    assert_eq!(next_text(&mut v4).await, v4_status(&after));

    // The same log once Zero 0.26 wrote it (dataVersion 6): seeded, so starting past the backup means rows are gone.
    db.client
        .batch_execute(&format!(
            r#"UPDATE {} SET "dataVersion" = 6"#,
            db.table("versionHistory")
        ))
        .await
        .unwrap();
    let mut v6 = RawClient::connect(sidecar.addr, "/replication/v6/snapshot?taskID=v6").await;
    for _ in 0..3 {
        assert_eq!(text_after_pings(&mut v6, 1).await, None);
    }
    sidecar.stop().await;
    db.drop().await;
}
