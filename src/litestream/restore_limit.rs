//! How long a restore of a litestream backup is taken to last: what `cleanup.restore_limit` keeps a reservation
//! for, and what `backup.drill_timeout` gives a drill.

use std::time::Duration;

use crate::keys;

/// The longest a restore is taken to last: a fixed duration, or scaled to the backup's size as Zero scales its own
/// wait for a first backup (an hour per 50 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreLimit {
    /// [`RestoreLimit::AUTO_PER`] per [`RestoreLimit::AUTO_UNIT`] of the largest database on litestream's page,
    /// never less than one hour; one hour while the size is unknown.
    Auto,
    Fixed(Duration),
}

impl RestoreLimit {
    pub const AUTO_PER: Duration = Duration::from_secs(3600);
    pub const AUTO_UNIT: u64 = 50 << 30;

    /// The limit for a backup of `db_bytes` (`None`: not known).
    pub fn for_size(self, db_bytes: Option<u64>) -> Duration {
        match self {
            RestoreLimit::Fixed(limit) => limit,
            RestoreLimit::Auto => {
                let units = db_bytes.unwrap_or(0).div_ceil(Self::AUTO_UNIT).max(1);
                Self::AUTO_PER.saturating_mul(u32::try_from(units).unwrap_or(u32::MAX))
            }
        }
    }

    /// The limit for a backup of `db_bytes`, or `None` while `"auto"` has no size to go by: a restore of a replica
    /// of unknown size may take any time, so nothing that waits for one may count it over.
    pub fn known_for(self, db_bytes: Option<u64>) -> Option<Duration> {
        match (self, db_bytes) {
            (RestoreLimit::Auto, None) => None,
            (limit, size) => Some(limit.for_size(size)),
        }
    }

    /// `"auto"` or a duration.
    pub(crate) fn parse(text: String) -> Result<RestoreLimit, String> {
        match text.trim() {
            "auto" => Ok(RestoreLimit::Auto),
            other => keys::duration(other.to_string())
                .map(RestoreLimit::Fixed)
                .map_err(|e| format!("{e}; or \"auto\"")),
        }
    }
}
