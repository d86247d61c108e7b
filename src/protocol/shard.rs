//! `[zero]`: which Zero app and shard the sidecar serves: it names the change DB's schemas.

use crate::keys;

keys::section! {
    /// `[zero]`
    pub struct ZeroConfig(s) {
        /// Zero's app ID (ZERO_APP_ID): lower-case letters, digits and '_'.
        app_id: String = key("zero", |id: String| validate_app_id(&id).map(|()| id)),
        /// Zero's shard number (ZERO_SHARD_NUM). With app_id it names the change DB schema "{app_id}_{shard_num}/cdc".
        shard_num: u32 = key(0i64, |n: i64| {
            u32::try_from(n).map_err(|_| format!("{n} is not a shard number (0..=4294967295)"))
        }),
    }
}

impl ZeroConfig {
    /// The change DB schema, e.g. `zero_0/cdc`, unquoted (docs/protocol.md, "Schema and app ID").
    pub fn cdc_schema(&self) -> String {
        format!("{}_{}/cdc", self.app_id, self.shard_num)
    }

    /// The sidecar's own schema in the change DB, e.g. `zero_0/sidecar`, unquoted: its slots and the shard's memory
    /// (docs/operations.md, "Slots").
    pub fn sidecar_schema(&self) -> String {
        format!("{}_{}/sidecar", self.app_id, self.shard_num)
    }

    /// The shard's schema in the upstream database, e.g. `zero_0`, unquoted: Zero keeps its `replicas` table there.
    pub fn upstream_schema(&self) -> String {
        format!("{}_{}", self.app_id, self.shard_num)
    }
}

/// Zero refuses other app IDs (docs/protocol.md, "Schema and app ID"); the ID also becomes part of a quoted SQL identifier.
pub fn validate_app_id(app_id: &str) -> Result<(), String> {
    if app_id.is_empty() {
        return Err("must not be empty".into());
    }
    if !app_id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "{app_id:?} must match ^[a-z0-9_]+$ (lower-case letters, digits and '_', as Zero requires)"
        ));
    }
    Ok(())
}
