//! The read-only facts the sidecar reports and decides by (replica version, the log's size, start and reach, data
//! version, the upstream's `replicas`): none locks or writes, so they stay apart from the purge and the address row.

use tokio_postgres::error::SqlState;

use super::{sql, with_cause, ChangeDb, DbError};

/// Rows in the change log up to this many are counted; above it the size is PostgreSQL's estimate, so that reading
/// it never scans a large log.
pub const EXACT_COUNT_LIMIT: i64 = 10_000;

/// How many rows the change log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeLogSize {
    pub rows: u64,
    /// Counted (at most [`EXACT_COUNT_LIMIT`] rows), rather than estimated from `pg_class.reltuples`, which lags
    /// behind purges until autovacuum catches up.
    pub exact: bool,
}

impl ChangeDb {
    /// The change-streamer's replica version from `replicationConfig`; `None` if the row is missing.
    pub async fn replica_version(&self) -> Result<Option<String>, DbError> {
        let result = async {
            let client = self.client().await?;
            let row = client
                .query_opt(&self.inner.sql.replica_version, &[])
                .await
                .map_err(|e| self.query_error("reading replicaVersion", e))?;
            Ok(row.map(|r| r.get(0)))
        }
        .await;
        self.noting_schema(result)
    }

    /// How many rows `changeLog` holds: counted while PostgreSQL's estimate says it is small (or has none), else the
    /// estimate. Reads at most [`EXACT_COUNT_LIMIT`] + 1 rows, so it stays cheap on any log.
    pub async fn change_log_size(&self) -> Result<ChangeLogSize, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = &self.inner.sql;
            let estimate: i64 = client
                .query_opt(&sql.change_log_estimate, &[&sql.tables[0]])
                .await
                .map_err(|e| self.query_error("reading the change log's size estimate", e))?
                .and_then(|row| row.get::<_, Option<i64>>(0))
                .unwrap_or(-1);
            if estimate > EXACT_COUNT_LIMIT {
                return Ok(ChangeLogSize {
                    rows: estimate as u64,
                    exact: false,
                });
            }
            let counted: i64 = client
                .query_one(&sql.change_log_count, &[&(EXACT_COUNT_LIMIT + 1)])
                .await
                .map_err(|e| self.query_error("counting the change log", e))?
                .get(0);
            let exact = counted <= EXACT_COUNT_LIMIT;
            let rows = if exact {
                counted
            } else {
                counted.max(estimate)
            };
            Ok(ChangeLogSize {
                rows: rows.max(0) as u64,
                exact,
            })
        }
        .await;
        self.noting_schema(result)
    }

    /// The oldest watermark in `changeLog` (byte-wise); `None` when the log is empty.
    pub async fn min_watermark(&self) -> Result<Option<String>, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = self.watermark_sql(&client).await?;
            let row = client
                .query_one(&sql.min_watermark, &[])
                .await
                .map_err(|e| self.query_error("reading min(watermark)", e))?;
            Ok(row.get(0))
        }
        .await;
        self.noting_schema(result)
    }

    /// The change log table, quoted as statements name it: for messages about it.
    pub fn change_log_table(&self) -> &str {
        &self.inner.sql.tables[0]
    }

    /// The upstream's `replicas` table, quoted as statements name it: for messages about it.
    pub fn replicas_table(&self) -> &str {
        &self.inner.sql.replicas
    }

    /// Whether `changeLog` holds a row at or past `watermark` (byte-wise): what the storer has written so far.
    /// Served by the primary-key index where the column's collation orders as bytes.
    pub async fn log_reaches(&self, watermark: &str) -> Result<bool, DbError> {
        let result = async {
            let client = self.client().await?;
            let sql = self.watermark_sql(&client).await?;
            let row = client
                .query_one(&sql.reaches, &[&watermark])
                .await
                .map_err(|e| self.query_error("looking for a watermark in the change log", e))?;
            Ok(row.get(0))
        }
        .await;
        self.noting_schema(result)
    }

    /// The rows of the upstream's `"{app}_{shard}".replicas` that back up to a path of their own or with
    /// litestream 0.5 (Zero 1.10's v5 backups), read through the change DB's connection: `None` when that table, or
    /// both of its columns that say so, are not there (the upstream is another database, or Zero is older than
    /// 1.10), which is no error. A table dropped between the two reads counts as absent.
    pub async fn replica_backups(
        &self,
    ) -> Result<Option<Vec<crate::cleanup::unservable::ReplicaRow>>, DbError> {
        let client = self.client().await?;
        let sql = &self.inner.sql;
        let context = format!("reading {}", sql.replicas);
        let columns: Vec<String> = client
            .query(&sql.replica_columns, &[&self.inner.upstream_schema])
            .await
            .map_err(|e| self.upstream_error(&context, e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let Some(select) = sql::replica_backups(&sql.replicas, &columns) else {
            return Ok(None);
        };
        match client.query(&select, &[]).await {
            Ok(rows) => Ok(Some(
                rows.iter()
                    .map(|row| crate::cleanup::unservable::ReplicaRow {
                        id: row.get(0),
                        backup_path: row.get(1),
                        backup_v5: row.get(2),
                    })
                    .collect(),
            )),
            Err(e)
                if e.code() == Some(&SqlState::UNDEFINED_TABLE)
                    || e.code() == Some(&SqlState::UNDEFINED_COLUMN) =>
            {
                Ok(None)
            }
            Err(e) => Err(self.upstream_error(&context, e)),
        }
    }

    /// A failed read outside the change DB's own schema: never [`DbError::SchemaMissing`], which is about that
    /// schema.
    fn upstream_error(&self, context: &str, err: tokio_postgres::Error) -> DbError {
        if err.is_closed() {
            return DbError::Unavailable {
                reason: with_cause(&err),
            };
        }
        DbError::Query {
            context: context.into(),
            source: err,
        }
    }

    /// `versionHistory.dataVersion`: 5 for Zero 0.20-0.25 (SERIALIZABLE storer), 6 from 0.26 (row locks).
    /// `None` if the table or its row is absent.
    pub async fn data_version(&self) -> Result<Option<i32>, DbError> {
        let client = self.client().await?;
        match client.query_opt(&self.inner.sql.data_version, &[]).await {
            Ok(row) => Ok(row.map(|r| r.get(0))),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(None),
            Err(e) => Err(self.query_error("reading versionHistory", e)),
        }
    }
}
