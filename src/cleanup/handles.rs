//! The cleanup side's state that the rest of the sidecar reads and writes, bundled: built once when the app is, and
//! handed whole to each component that needs any of it (the loop, the keeper, `/status`, `/metrics`, the snapshot
//! handler, the relay), so that a new reader takes one value and no component is filled field by field.

use std::time::Duration;

use crate::cleanup::discovery;
use crate::cleanup::reservations::Registry;
use crate::cleanup::status::StatusHandle;
use crate::cleanup::subscribers::Subscribers;

/// Cheap to clone: each handle is shared.
#[derive(Clone)]
pub struct Handles {
    /// Open reservations, and the backup they are pinned at.
    pub registry: Registry,
    /// Relayed subscribers and their acknowledged watermarks.
    pub subscribers: Subscribers,
    /// What the cleanup loop, the keeper and the drills last saw and did.
    pub status: StatusHandle,
    /// Whether the shard's address table names this sidecar.
    pub discovery: discovery::StateHandle,
}

/// What tests change in a running sidecar instead of waiting or sharing the process's environment; a deployment
/// never sets them.
#[derive(Debug, Clone)]
pub struct Hooks {
    /// How long a relayed commit may stay out of the change log before the log counts as not written.
    pub log_unwritten_after: Duration,
    /// Where the backup destination's `AWS_*` settings come from; `None`: the process environment.
    pub backup_env: Option<Vec<(String, String)>>,
    /// Statuses go out without their reservation's row, and v3's without reading the change log: for tests of the
    /// protocol that run without a database.
    pub statuses_without_slots: bool,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            log_unwritten_after: crate::cleanup::unservable::LOG_UNWRITTEN_AFTER,
            backup_env: None,
            statuses_without_slots: false,
        }
    }
}
