//! The address row: reading `ownerAddress` and `owner`, and the compare-and-set that is the sidecar's only write to
//! `replicationState`, kept apart because it must never conflict with Zero's SERIALIZABLE storer.

use tokio_postgres::GenericClient;
use tracing::info;

use super::sql::Sql;
use super::{ChangeDb, DbError};

/// The shard's address table row: where view-syncers are sent, and which replication-manager task owns the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerRow {
    /// `ownerAddress`; `None` if the row is missing or NULL.
    pub address: Option<String>,
    /// `owner`, the replication-manager's task ID; `None` if the row is missing or NULL.
    pub owner: Option<String>,
}

impl ChangeDb {
    /// The discovery address (`SELECT "ownerAddress" FROM replicationState`); `None` if the row is missing or NULL.
    pub async fn owner_address(&self) -> Result<Option<String>, DbError> {
        Ok(self.ownership().await?.address)
    }

    /// `ownerAddress` and `owner` of the address table row, read together.
    pub async fn ownership(&self) -> Result<OwnerRow, DbError> {
        let result = async {
            let client = self.client().await?;
            read_ownership(&*client, &self.inner.sql)
                .await
                .map_err(|e| self.query_error("reading ownerAddress", e))
        }
        .await;
        self.noting_schema(result)
    }

    /// Sets `ownerAddress` to `to` only if it is exactly `from` now (and `from` differs from `to`); returns whether
    /// the row changed. A call that changes nothing writes nothing, so it cannot conflict with Zero's storer.
    pub async fn adopt_address(&self, from: &str, to: &str) -> Result<bool, DbError> {
        let result = async {
            let client = self.client().await?;
            let changed = client
                .execute(&self.inner.sql.adopt_address, &[&from, &to])
                .await
                .map_err(|e| self.query_error("updating ownerAddress", e))?;
            Ok(changed > 0)
        }
        .await;
        let result = self.noting_schema(result);
        if let Ok(true) = result {
            info!(from, to, "ownerAddress changed");
        }
        result
    }

    /// Puts the replication-manager's address back where ours is, as [`ChangeDb::adopt_address`] in reverse; returns
    /// whether the row changed. A row that someone else has changed meanwhile is left alone.
    pub async fn restore_address(&self, ours: &str, theirs: &str) -> Result<bool, DbError> {
        self.adopt_address(ours, theirs).await
    }
}

/// `ownerAddress` and `owner`, on a plain client or inside a purge batch's transaction.
pub(super) async fn read_ownership(
    client: &impl GenericClient,
    sql: &Sql,
) -> Result<OwnerRow, tokio_postgres::Error> {
    let row = client.query_opt(&sql.owner_address, &[]).await?;
    Ok(row.map_or_else(OwnerRow::default, |r| OwnerRow {
        address: r.get(0),
        owner: r.get(1),
    }))
}
