//! The change DB for tests: a schema per test in the PostgreSQL server `make test` starts
//! (`SIDECAR_TEST_DATABASE_URL`), created with Zero 0.20's DDL (PROTOCOL.md §8.2).

use tokio_postgres::{Client, NoTls};

pub fn database_url() -> String {
    std::env::var("SIDECAR_TEST_DATABASE_URL").expect(
        "SIDECAR_TEST_DATABASE_URL is not set: run the tests with `make test`, which starts a throwaway \
         PostgreSQL, or point it at a server you own",
    )
}

pub async fn connect() -> Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    client
}

/// One test's change DB: Zero's `"{app_id}_0/cdc"` schema with a unique app ID.
pub struct TestDb {
    pub client: Client,
    pub app_id: String,
}

impl TestDb {
    /// Creates the schema and tables; `data_version` fills `versionHistory` (5 for Zero 0.20, 6 for 0.26+).
    pub async fn create(data_version: i32) -> TestDb {
        let db = TestDb::empty().await;
        db.create_tables(data_version).await;
        db
    }

    /// A unique app ID whose schema does not exist yet (Zero not initialised).
    pub async fn empty() -> TestDb {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let app_id = format!("t{}_{}", std::process::id(), n);
        TestDb {
            client: connect().await,
            app_id,
        }
    }

    pub fn schema(&self) -> String {
        format!("\"{}_0/cdc\"", self.app_id)
    }

    pub async fn create_tables(&self, data_version: i32) {
        let s = self.schema();
        self.client
            .batch_execute(&format!(
                r#"
                CREATE SCHEMA IF NOT EXISTS {s};
                CREATE TABLE {s}."changeLog" (
                  watermark TEXT, pos INT8, change JSON NOT NULL, precommit TEXT,
                  PRIMARY KEY (watermark, pos));
                CREATE TABLE {s}."replicationState" (
                  "lastWatermark" TEXT NOT NULL, "owner" TEXT, "ownerAddress" TEXT,
                  "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1));
                CREATE TABLE {s}."replicationConfig" (
                  "replicaVersion" TEXT NOT NULL, "publications" TEXT[] NOT NULL, "resetRequired" BOOL,
                  "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1));
                CREATE TABLE {s}."versionHistory" (
                  "dataVersion" int NOT NULL, "schemaVersion" int NOT NULL, "minSafeVersion" INT NOT NULL,
                  "lock" char(1) NOT NULL CONSTRAINT DF_schema_meta_lock DEFAULT 'v',
                  CONSTRAINT PK_schema_meta_lock PRIMARY KEY (lock),
                  CONSTRAINT CK_schema_meta_lock CHECK (lock='v'));
                INSERT INTO {s}."versionHistory" ("dataVersion", "schemaVersion", "minSafeVersion")
                  VALUES ({data_version}, {data_version}, 1);
                INSERT INTO {s}."replicationConfig" ("replicaVersion", "publications") VALUES ('01', '{{}}');
                INSERT INTO {s}."replicationState" ("lastWatermark", "owner", "ownerAddress")
                  VALUES ('01', 'rm-task', NULL);
                "#
            ))
            .await
            .expect("create Zero's change DB tables");
    }

    /// Stores one transaction as Zero's storer does: begin, `data` changes, commit, all at the commit watermark.
    pub async fn insert_tx(&self, watermark: &str, data: usize) {
        let s = self.schema();
        let last = data as i64 + 1;
        self.client
            .execute(
                &format!(
                    r#"INSERT INTO {s}."changeLog" (watermark, pos, change, precommit)
                       SELECT $1, p,
                              CASE WHEN p = 0 THEN '{{"tag":"begin"}}'::json
                                   WHEN p = $2::int8 THEN '{{"tag":"commit"}}'::json
                                   ELSE json_build_object('tag', 'insert', 'new', json_build_object('id', p)) END,
                              CASE WHEN p = $2::int8 THEN $1 END
                       FROM generate_series(0::int8, $2::int8) AS p"#
                ),
                &[&watermark, &last],
            )
            .await
            .expect("insert a transaction");
        self.client
            .execute(
                &format!(r#"UPDATE {s}."replicationState" SET "lastWatermark" = $1"#),
                &[&watermark],
            )
            .await
            .unwrap();
    }

    /// The distinct watermarks left in the change log, in order.
    pub async fn watermarks(&self) -> Vec<String> {
        let s = self.schema();
        self.client
            .query(
                &format!(r#"SELECT DISTINCT watermark FROM {s}."changeLog" ORDER BY watermark"#),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    pub async fn rows(&self) -> i64 {
        let s = self.schema();
        self.client
            .query_one(&format!(r#"SELECT count(*) FROM {s}."changeLog""#), &[])
            .await
            .unwrap()
            .get(0)
    }

    pub async fn set_owner_address(&self, address: Option<&str>) {
        let s = self.schema();
        self.client
            .execute(
                &format!(r#"UPDATE {s}."replicationState" SET "ownerAddress" = $1"#),
                &[&address],
            )
            .await
            .unwrap();
    }

    pub async fn owner_address(&self) -> Option<String> {
        let s = self.schema();
        self.client
            .query_opt(
                &format!(r#"SELECT "ownerAddress" FROM {s}."replicationState""#),
                &[],
            )
            .await
            .unwrap()
            .and_then(|row| row.get(0))
    }

    /// The row version of the address row: unchanged when nothing wrote it.
    pub async fn state_xmin(&self) -> String {
        let s = self.schema();
        self.client
            .query_one(
                &format!(r#"SELECT xmin::text FROM {s}."replicationState""#),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Config lines pointing the sidecar at this schema.
    pub fn config(&self) -> String {
        format!(
            "[zero]\napp_id = \"{}\"\nshard_num = 0\n[change_db]\nurl = \"{}\"\n",
            self.app_id,
            database_url()
        )
    }
}
