//! The real PostgreSQL of `SIDECAR_TEST_DATABASE_URL` (set by `scripts/with-postgres.sh`): a per-test change DB
//! schema with Zero 0.20's DDL (docs/protocol.md, "Tables"), realistic change-log rows, and a plain client for assertions.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use litestream_sidecar::cleanup::change_db::{ChangeDb, Options};
use litestream_sidecar::protocol::shard::ZeroConfig;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;

use super::lexi;

pub const ENV: &str = "SIDECAR_TEST_DATABASE_URL";

/// The test server's URL; panics with instructions when unset, so a missing server is never a silent pass.
pub fn database_url() -> String {
    std::env::var(ENV).unwrap_or_else(|_| {
        panic!(
            "{ENV} is not set: these tests need a real PostgreSQL. Run them as \
             `scripts/with-postgres.sh cargo test --test it -- pg::` (or `make test`); \
             `cargo test --test it -- --skip pg::` runs the tests that need none."
        )
    })
}

pub fn pg_config() -> tokio_postgres::Config {
    database_url()
        .parse()
        .expect("SIDECAR_TEST_DATABASE_URL is a connection string")
}

/// A plain client for setting up and inspecting tables, separate from the sidecar's.
pub async fn connect() -> Client {
    connect_with(&pg_config()).await
}

pub async fn connect_with(config: &tokio_postgres::Config) -> Client {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// An app ID no other test (or earlier run against the same server) uses.
pub fn unique_app_id() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// One test's change DB schema `"{app_id}_0/cdc"`, dropped by [`TestSchema::drop`].
pub struct TestSchema {
    pub app_id: String,
    pub schema: String,
    pub client: Client,
}

impl TestSchema {
    /// Creates the schema with Zero 0.20's tables and, when given, a `versionHistory` row with that data version.
    /// The `replicationState` row names `owner_address`, as after `assumeOwnership`.
    pub async fn create(data_version: Option<i32>, owner_address: Option<&str>) -> TestSchema {
        let schema = TestSchema::empty().await;
        schema.create_tables(data_version, owner_address).await;
        schema
    }

    /// Only a name: nothing exists in the database yet.
    pub async fn empty() -> TestSchema {
        TestSchema::empty_on(&pg_config()).await
    }

    /// [`TestSchema::create`] on another server than the test server (a test's own cluster).
    pub async fn create_on(
        config: &tokio_postgres::Config,
        data_version: Option<i32>,
        owner_address: Option<&str>,
    ) -> TestSchema {
        let schema = TestSchema::empty_on(config).await;
        schema.create_tables(data_version, owner_address).await;
        schema
    }

    /// [`TestSchema::empty`] on another server than the test server.
    pub async fn empty_on(config: &tokio_postgres::Config) -> TestSchema {
        let app_id = unique_app_id();
        TestSchema {
            schema: format!("{app_id}_0/cdc"),
            app_id,
            client: connect_with(config).await,
        }
    }

    /// A new plain client, after the server it was connected to restarted.
    pub async fn reconnect(&mut self, config: &tokio_postgres::Config) {
        self.client = connect_with(config).await;
    }

    pub async fn create_tables(&self, data_version: Option<i32>, owner_address: Option<&str>) {
        let s = format!("\"{}\"", self.schema);
        self.client
            .batch_execute(&format!(
                r#"
                CREATE SCHEMA IF NOT EXISTS {s};
                CREATE TABLE {s}."changeLog" (
                  watermark  TEXT,
                  pos        INT8,
                  change     JSON NOT NULL,
                  precommit  TEXT,
                  PRIMARY KEY (watermark, pos)
                );
                CREATE TABLE {s}."replicationState" (
                  "lastWatermark" TEXT NOT NULL,
                  "owner"         TEXT,
                  "ownerAddress"  TEXT,
                  "lock"          INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
                );
                CREATE TABLE {s}."replicationConfig" (
                  "replicaVersion" TEXT NOT NULL,
                  "publications"   TEXT[] NOT NULL,
                  "resetRequired"  BOOL,
                  "lock"           INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
                );
                "#
            ))
            .await
            .expect("create the change DB tables");
        let replica_version = lexi(1_000);
        self.client
            .execute(
                &format!(
                    r#"INSERT INTO {s}."replicationConfig" ("replicaVersion", "publications")
                       VALUES ($1, ARRAY['_zero_public_0', 'zero_data'])"#
                ),
                &[&replica_version],
            )
            .await
            .unwrap();
        self.client
            .execute(
                &format!(
                    r#"INSERT INTO {s}."replicationState" ("lastWatermark", "owner", "ownerAddress")
                       VALUES ($1, 'rm-task-1', $2)"#
                ),
                &[&replica_version, &owner_address],
            )
            .await
            .unwrap();
        if let Some(version) = data_version {
            self.client
                .batch_execute(&format!(
                    r#"
                    CREATE TABLE {s}."versionHistory" (
                      "dataVersion" int NOT NULL,
                      "schemaVersion" int NOT NULL,
                      "minSafeVersion" INT NOT NULL,
                      lock char(1) NOT NULL DEFAULT 'v',
                      CONSTRAINT "PK_schema_meta_lock" PRIMARY KEY (lock),
                      CONSTRAINT "CK_schema_meta_lock" CHECK (lock='v')
                    );
                    INSERT INTO {s}."versionHistory" ("dataVersion", "schemaVersion", "minSafeVersion")
                      VALUES ({version}, {version}, 1);
                    "#
                ))
                .await
                .unwrap();
        }
    }

    pub fn zero(&self) -> ZeroConfig {
        ZeroConfig {
            app_id: self.app_id.clone(),
            shard_num: 0,
        }
    }

    /// `"{schema}"."{name}"`.
    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".\"{name}\"", self.schema)
    }

    /// The sidecar's handle for this schema, with fast reconnects and an `application_name` unique to the test.
    pub fn start(&self, config: tokio_postgres::Config) -> (ChangeDb, CancellationToken) {
        let mut config = config;
        config.application_name(self.application_name());
        let shutdown = CancellationToken::new();
        let db = ChangeDb::start(config, &self.zero(), fast_options(), shutdown.clone());
        (db, shutdown)
    }

    /// [`TestSchema::start`] against the test server, waiting for the connection.
    pub async fn connected(&self) -> (ChangeDb, CancellationToken) {
        let (db, shutdown) = self.start(pg_config());
        tokio::time::timeout(Duration::from_secs(10), db.ready())
            .await
            .expect("the sidecar connects to the test server");
        (db, shutdown)
    }

    pub fn application_name(&self) -> String {
        format!("sidecar-{}", self.app_id)
    }

    /// Zero's storer's transactions at `watermarks`, `data_rows` inserts each between `begin` (pos 0) and `commit`,
    /// written in one statement: the restart case needs thousands of rows.
    pub async fn insert_transactions(&self, watermarks: &[String], data_rows: i64) {
        let sql = format!(
            r#"INSERT INTO {} (watermark, pos, change, precommit)
               SELECT w, p,
                      (CASE WHEN p = 0 THEN '{{"tag":"begin","json":"p"}}'
                            WHEN p = $2::int8 + 1 THEN '{{"tag":"commit"}}'
                            ELSE json_build_object(
                                   'tag', 'insert',
                                   'relation', json_build_object('schema', 'public', 'name', 'issue',
                                                                 'keyColumns', json_build_array('id'),
                                                                 'replicaIdentity', 'default'),
                                   'new', json_build_object('id', 'iss-' || w || '-' || p,
                                                            'title', 'Row ' || p || ' at ' || w,
                                                            'open', true, 'modified', 1715000000000))::text
                       END)::json,
                      CASE WHEN p = $2::int8 + 1 THEN w END
                 FROM unnest($1::text[]) AS w, generate_series(0::int8, $2::int8 + 1) AS p"#,
            self.table("changeLog")
        );
        self.client
            .execute(&sql, &[&watermarks, &data_rows])
            .await
            .expect("insert the change log");
    }

    /// One upstream transaction as Zero's storer writes it: `begin`, `data_rows` inserts, `commit`, all at the
    /// commit watermark (docs/protocol.md, "Tables").
    pub async fn insert_transaction(&self, watermark: &str, data_rows: i64) {
        let sql = format!(
            r#"INSERT INTO {} (watermark, pos, change, precommit) VALUES ($1, $2, $3::text::json, $4)"#,
            self.table("changeLog")
        );
        let statement = self.client.prepare(&sql).await.unwrap();
        let begin = r#"{"tag":"begin","json":"p"}"#.to_string();
        self.client
            .execute(&statement, &[&watermark, &0i64, &begin, &None::<String>])
            .await
            .unwrap();
        for pos in 1..=data_rows {
            let change = format!(
                r#"{{"tag":"insert","relation":{{"schema":"public","name":"issue","keyColumns":["id"],"replicaIdentity":"default"}},"new":{{"id":"iss-{watermark}-{pos}","title":"Row {pos} at {watermark}","open":true,"modified":1715000000000}}}}"#
            );
            self.client
                .execute(&statement, &[&watermark, &pos, &change, &None::<String>])
                .await
                .unwrap();
        }
        let commit = r#"{"tag":"commit"}"#.to_string();
        self.client
            .execute(
                &statement,
                &[&watermark, &(data_rows + 1), &commit, &Some(watermark)],
            )
            .await
            .unwrap();
    }

    /// Every `(watermark, pos)` left in the change log, in key order.
    pub async fn rows(&self) -> Vec<(String, i64)> {
        self.client
            .query(
                &format!(
                    "SELECT watermark, pos FROM {} ORDER BY watermark COLLATE \"C\", pos",
                    self.table("changeLog")
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// `(ownerAddress, owner, xmin)` of the `replicationState` row; `xmin` changes with every new row version.
    pub async fn replication_state(&self) -> (Option<String>, Option<String>, String) {
        let row = self
            .client
            .query_one(
                &format!(
                    r#"SELECT "ownerAddress", "owner", xmin::text FROM {}"#,
                    self.table("replicationState")
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    pub async fn set_owner_address(&self, address: Option<&str>) {
        self.client
            .execute(
                &format!(
                    r#"UPDATE {} SET "ownerAddress" = $1"#,
                    self.table("replicationState")
                ),
                &[&address],
            )
            .await
            .unwrap();
    }

    /// The distinct watermarks left in the change log, in byte order.
    pub async fn watermarks(&self) -> Vec<String> {
        let mut watermarks: Vec<String> = self.rows().await.into_iter().map(|(w, _)| w).collect();
        watermarks.dedup();
        watermarks
    }

    /// `sidecar.toml` lines pointing the sidecar at this schema on the test server.
    pub fn config(&self) -> String {
        self.config_at(&database_url())
    }

    /// `sidecar.toml` lines pointing the sidecar at this schema on the server at `url`.
    pub fn config_at(&self, url: &str) -> String {
        format!(
            "[zero]\napp_id = \"{}\"\nshard_num = 0\n[change_db]\nurl = \"{url}\"\n",
            self.app_id
        )
    }

    pub async fn drop(self) {
        let _ = self
            .client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE; DROP SCHEMA IF EXISTS \"{}_0/sidecar\" CASCADE",
                self.schema, self.app_id
            ))
            .await;
    }
}

/// Reconnects within tens of milliseconds, so tests do not wait on production backoff.
pub fn fast_options() -> Options {
    Options {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(200),
        connect_timeout: Duration::from_secs(5),
        lock_timeout: Duration::from_secs(5),
    }
}

/// Rows `(watermark, pos)` of transactions at `watermarks` with `per_tx` rows each, in key order.
pub fn expected_rows(watermarks: &[&str], per_tx: i64) -> Vec<(String, i64)> {
    watermarks
        .iter()
        .flat_map(|w| (0..per_tx).map(move |pos| (w.to_string(), pos)))
        .collect()
}

/// A purge of `db`'s change log below `before`, for the log of `replica`, `batch_rows` a batch, that reads every
/// live slot of the shard in each batch as the monitor's purges do (`limit_now`: the restore limit of reservations
/// opened without one; `None`: the replica's size is unknown). No ownership is checked.
pub async fn purge_with_slots(
    db: &ChangeDb,
    before: &str,
    replica: &str,
    batch_rows: i64,
    limit_now: Option<Duration>,
) -> litestream_sidecar::cleanup::change_db::PurgeOutcome {
    use litestream_sidecar::cleanup::change_db::{PurgeOutcome, PurgeTarget, SlotCheck, SlotRule};
    let mut outcome = PurgeOutcome::default();
    db.purge_within(
        PurgeTarget {
            before,
            replica_version: Some(replica),
            slots: Some(SlotCheck {
                rule: SlotRule {
                    pause: false,
                    restore_limit_now: limit_now,
                },
                own: None,
            }),
        },
        None::<&str>,
        batch_rows,
        &CancellationToken::new(),
        || std::future::ready(litestream_sidecar::cleanup::Ceiling::None),
        &mut outcome,
    )
    .await
    .expect("purge");
    outcome
}
