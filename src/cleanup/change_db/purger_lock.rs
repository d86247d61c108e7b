//! The shard's purger lock, so that only one sidecar purges a change log. Apart from the purge that checks it,
//! because its key is a contract with every other sidecar release and must never change.

use std::sync::atomic::Ordering;

use tokio_postgres::Client;
use tracing::{debug, info};

use super::{ChangeDb, DbError, Inner};
use crate::protocol::shard::ZeroConfig;

/// The result of [`ChangeDb::claim_purger`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purger {
    /// This handle's session holds the shard's purger lock: it may purge.
    Held,
    /// Another session holds it: another sidecar purges this shard.
    Standby,
}

/// The class half of the purger lock's key: names this program among users of two-int4 advisory locks ("ltsc").
/// Part of the lock's contract with other sidecar releases: never change it.
pub const PURGER_LOCK_CLASS: i32 = i32::from_be_bytes(*b"ltsc");

/// The purger lock's key for a shard: [`PURGER_LOCK_CLASS`] and the 32-bit FNV-1a hash of its change DB schema
/// name (`"{app_id}_{shard_num}/cdc"`, UTF-8), as the bits of an `int4`. Sidecars of different releases must agree
/// on it, hence a fixed hash rather than std's `DefaultHasher`. `pg_locks` shows it as `classid` and `objid` (as
/// `oid`, so a negative half shows as itself plus 2^32) with `objsubid` 2.
pub fn purger_lock_key(zero: &ZeroConfig) -> (i32, i32) {
    (
        PURGER_LOCK_CLASS,
        fnv1a_32(zero.cdc_schema().as_bytes()) as i32,
    )
}

pub(super) fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Inner {
    /// Releases the purger lock if `client`'s session holds it; returns whether it did.
    pub(super) async fn release_purger_lock(
        &self,
        client: &Client,
    ) -> Result<bool, tokio_postgres::Error> {
        if !self.purger_required.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let (class, key) = self.purger_lock;
        let row = client
            .query_one(&self.sql.release_purger_lock, &[&class, &key])
            .await?;
        Ok(row.get(0))
    }
}

impl ChangeDb {
    /// Takes the shard's purger lock ([`purger_lock_key`]) on this handle's session, unless the session holds it
    /// already (advisory locks stack, and one release must free it). Call it before every purge.
    ///
    /// From the first call on, every purge batch of this handle and its clones checks that the session still holds
    /// the lock, and stops with [`PurgeStop::NotPurger`](super::PurgeStop::NotPurger) if not. The lock goes with
    /// the session: after a reconnect, or once the other holder's session ends, the next call takes it if it is free.
    pub async fn claim_purger(&self) -> Result<Purger, DbError> {
        self.inner.purger_required.store(true, Ordering::SeqCst);
        let client = self.client().await?;
        let (class, key) = self.inner.purger_lock;
        let sql = &self.inner.sql;
        let held: bool = client
            .query_one(&sql.holds_purger_lock, &[&class, &key])
            .await
            .map_err(|e| self.query_error("checking the purger lock", e))?
            .get(0);
        if held {
            return Ok(Purger::Held);
        }
        let taken: bool = client
            .query_one(&sql.try_purger_lock, &[&class, &key])
            .await
            .map_err(|e| self.query_error("taking the purger lock", e))?
            .get(0);
        if taken {
            info!(schema = %self.inner.schema, class, key, "purger lock taken: this sidecar purges the change log");
            Ok(Purger::Held)
        } else {
            debug!(schema = %self.inner.schema, class, key, "purger lock held by another session");
            Ok(Purger::Standby)
        }
    }

    /// Releases the purger lock if this handle's session holds it; returns whether it did. Purge batches still
    /// require it until the next [`ChangeDb::claim_purger`]. Shutdown releases it without this call.
    pub async fn release_purger(&self) -> Result<bool, DbError> {
        let client = self.client().await?;
        let released = self
            .inner
            .release_purger_lock(&client)
            .await
            .map_err(|e| self.query_error("releasing the purger lock", e))?;
        if released {
            info!(schema = %self.inner.schema, "purger lock released");
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key is shared by every release that may run beside this one: a change here lets two sidecars purge.
    #[test]
    fn the_purger_lock_key_is_fnv1a_of_the_schema_and_never_changes() {
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        let shard = |shard_num| ZeroConfig {
            app_id: "zero".into(),
            shard_num,
        };
        assert_eq!(PURGER_LOCK_CLASS, 0x6c74_7363);
        assert_eq!(purger_lock_key(&shard(0)), (0x6c74_7363, -1_060_586_361));
        assert_eq!(purger_lock_key(&shard(1)), (0x6c74_7363, 0x5248_8a1c));
    }
}
