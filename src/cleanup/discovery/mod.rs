//! Registration in the shard's address table: whether `ownerAddress` leads view-syncers to this sidecar (modes
//! `verify` and `adopt`, view-syncers in discover mode) or still names the replication-manager the sidecar fronts,
//! held by the same task (mode `owner`, view-syncers pointed at the sidecar by `ZERO_CHANGE_STREAMER_URI`), and —
//! only in `adopt` mode against a change-streamer that takes row locks — when to write it.
//!
//! Writing that row is dangerous with Zero 0.20: an outside UPDATE committing while the change-streamer's
//! SERIALIZABLE storer transaction is open aborts it with 40001 and stops the replication-manager
//! (docs/protocol.md, "The storer's transactions" and "Writing ownerAddress under a serializable storer"). So
//! `verify` (the default) never writes, and `adopt` writes only when the schema's data version shows the row-lock
//! storer (Zero 0.26+, `dataVersion >= 6`).

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cleanup::change_db::{ChangeDb, DbState};
pub mod config;

use crate::net::address::same_address;
pub use config::{DiscoveryConfig, DiscoveryMode};

/// `versionHistory.dataVersion` from which the change-streamer stores under row locks (docs/protocol.md, "What each
/// Zero release changed").
pub const ROW_LOCK_DATA_VERSION: i32 = 6;

/// What the address table says, as read from the change DB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// No `replicationState` row yet, or `ownerAddress` NULL (first start, or after a resync: docs/protocol.md,
    /// "Tables").
    NoAddress,
    Address(String),
}

/// Registration state derived from one reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// `ownerAddress` is the sidecar's advertise address.
    Registered,
    /// Another address is registered: view-syncers bypass the sidecar.
    Elsewhere(String),
    /// Nothing registered yet.
    Unregistered,
}

pub fn registration(observed: &Observed, ours: &str) -> Registration {
    match observed {
        Observed::NoAddress => Registration::Unregistered,
        Observed::Address(address) if same_address(address, ours) => Registration::Registered,
        Observed::Address(address) => Registration::Elsewhere(address.clone()),
    }
}

/// Registration in `mode`: whether `ownerAddress` names the sidecar (`verify`, `adopt`), or names the
/// replication-manager it fronts with an `owner` task beside it (`owner`: Zero writes both together, and an address
/// without an owner is not a takeover to trust).
pub fn registration_in(
    mode: DiscoveryMode,
    observed: &Observed,
    owner: Option<&str>,
    ours: &str,
    upstream: &str,
) -> Registration {
    match mode {
        DiscoveryMode::Owner => match registration(observed, upstream) {
            Registration::Registered if owner.is_none() => Registration::Unregistered,
            other => other,
        },
        _ => registration(observed, ours),
    }
}

/// What `adopt` mode should do about one reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adopt {
    /// Nothing to write (already ours, nothing registered, or a foreign address that is not the upstream's).
    Nothing,
    /// Replace the upstream's address with ours.
    Write { from: String },
    /// Writing is needed but the schema is older than the row-lock storer: refuse (and behave as `verify`).
    RefuseOldSchema { data_version: Option<i32> },
}

/// Decides the adopt write: only the co-located change-streamer's own address is ever replaced.
pub fn adopt(observed: &Observed, ours: &str, upstream: &str, data_version: Option<i32>) -> Adopt {
    let Observed::Address(address) = observed else {
        return Adopt::Nothing;
    };
    if same_address(address, ours) || !same_address(address, upstream) {
        return Adopt::Nothing;
    }
    match data_version {
        Some(v) if v >= ROW_LOCK_DATA_VERSION => Adopt::Write {
            from: address.clone(),
        },
        other => Adopt::RefuseOldSchema {
            data_version: other,
        },
    }
}

/// Tracks how long the sidecar has been registered without interruption: cleanup waits until subscribers that
/// were connected to the change-streamer directly have had time to come through the sidecar.
#[derive(Debug, Default, Clone)]
pub struct Continuity {
    since: Option<Instant>,
}

impl Continuity {
    pub fn record(&mut self, registered: bool, now: Instant) {
        match (registered, self.since) {
            (true, None) => self.since = Some(now),
            (false, _) => self.since = None,
            (true, Some(_)) => {}
        }
    }

    /// Since when the sidecar has been registered without interruption; how long that must be is the cleanup
    /// policy's call ([`crate::cleanup::Ownership`]).
    pub fn since(&self) -> Option<Instant> {
        self.since
    }
}

/// What the discovery loop knows, shared with `/keepalive`, the monitor and the snapshot handler.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The change DB answered and Zero's schema is there.
    pub db_up: bool,
    pub registration: Option<Registration>,
    pub continuity: Continuity,
    /// `owner` (the replication-manager's task ID) as last read while registered: in `owner` mode every purge
    /// batch checks that it is still the same.
    pub owner: Option<String>,
}

/// Shared view of [`State`].
pub type StateHandle = crate::shared::Cell<State>;

pub struct Discovery {
    /// `[discovery]`: the mode, the sidecar's advertise address (`ours` below), how often to read.
    pub config: DiscoveryConfig,
    /// The co-located change-streamer's advertised address (what Zero writes when not told otherwise).
    pub upstream: String,
    pub db: ChangeDb,
    pub state: StateHandle,
    /// When the sidecar started: a registration found at the first reading counts from then.
    pub started: Instant,
}

impl Discovery {
    /// Logs a change of registration, with the fix for the topology of the mode.
    fn log_registration(&self, current: &Registration, owner: Option<&str>) {
        let owner_mode = self.config.mode == DiscoveryMode::Owner;
        match (current, owner_mode) {
            (Registration::Registered, true) => info!(
                address = %self.upstream,
                owner = owner.unwrap_or(""),
                "the change log's owner is the replication-manager this sidecar fronts"
            ),
            (Registration::Registered, false) => {
                info!(address = %self.config.advertise_address, "registered as the change-streamer")
            }
            (Registration::Elsewhere(address), true) => warn!(
                registered = %address,
                expected = %self.upstream,
                "ownerAddress names another replication-manager: cleanup is held. Fix: set \
                 upstream.advertised_address to the address the replication-manager this sidecar \
                 relays to writes as ownerAddress (its ZERO_CHANGE_STREAMER_ADDRESS, or its IP and port)"
            ),
            (Registration::Elsewhere(address), false) => warn!(
                registered = %address,
                ours = %self.config.advertise_address,
                "ownerAddress names another address: view-syncers bypass the sidecar and cleanup is held. \
                 Fix: with Zero 0.20, set ZERO_CHANGE_STREAMER_ADDRESS={} on the replication-manager; with \
                 Zero 0.22 and later, point view-syncers at the sidecar with \
                 ZERO_CHANGE_STREAMER_URI=ws://{}/ and set discovery.mode = \"owner\"",
                self.config.advertise_address,
                self.config.advertise_address
            ),
            (Registration::Unregistered, true) => info!(
                "no owner registered yet (first start, a resync, or the replication-manager still \
                 waiting for ZERO_CHANGE_STREAMER_STARTUP_DELAY_MS); waiting"
            ),
            (Registration::Unregistered, false) => info!(
                "no ownerAddress registered yet (first start or after a resync); waiting for the \
                 replication-manager"
            ),
        }
    }

    /// Reads the address table every `interval` until `shutdown`; in `adopt` mode puts the upstream's address
    /// back on the way out if the sidecar replaced it.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut every = crate::shared::Every::new(self.config.interval);
        let mut last_registration: Option<Registration> = None;
        let mut refused_logged = false;
        let mut adopted_from: Option<String> = None;
        while every.tick(&shutdown).await {
            let now = Instant::now();
            // `status` logs its own state changes (down, schema missing, up).
            let db_up = self.db.status().await == DbState::Up;
            if self.config.mode == DiscoveryMode::Off {
                self.state.update(|s| s.db_up = db_up);
                continue;
            }
            let ownership = if db_up {
                match self.db.ownership().await {
                    Ok(ownership) => Some(ownership),
                    Err(err) => {
                        warn!(error = %err, "cannot read ownerAddress");
                        None
                    }
                }
            } else {
                None
            };
            let Some(ownership) = ownership else {
                self.state.update(|s| {
                    s.db_up = db_up;
                    s.continuity.record(false, now);
                });
                continue;
            };
            let mut observed = match ownership.address {
                Some(address) => Observed::Address(address),
                None => Observed::NoAddress,
            };

            // Set when this reading wrote the sidecar's address: view-syncers find the sidecar from now on only.
            let mut adopted_now = false;
            if self.config.mode == DiscoveryMode::Adopt {
                let data_version = self.db.data_version().await.ok().flatten();
                match adopt(
                    &observed,
                    &self.config.advertise_address,
                    &self.upstream,
                    data_version,
                ) {
                    Adopt::Nothing => {}
                    Adopt::Write { from } => match self
                        .db
                        .adopt_address(&from, &self.config.advertise_address)
                        .await
                    {
                        Ok(true) => {
                            info!(from = %from, to = %self.config.advertise_address, "ownerAddress adopted");
                            adopted_from = Some(from);
                            adopted_now = true;
                            observed = Observed::Address(self.config.advertise_address.clone());
                        }
                        Ok(false) => {}
                        Err(err) => warn!(error = %err, "cannot adopt ownerAddress"),
                    },
                    Adopt::RefuseOldSchema { data_version } => {
                        if !refused_logged {
                            warn!(
                                data_version = ?data_version,
                                "discovery.mode = \"adopt\" refuses to write ownerAddress: this change DB's schema \
                                 (dataVersion < 6, Zero before 0.26) stores changes in SERIALIZABLE transactions that \
                                 an outside write can abort, stopping the replication-manager; behaving as \"verify\". \
                                 Set ZERO_CHANGE_STREAMER_ADDRESS to the sidecar's address instead"
                            );
                            refused_logged = true;
                        }
                    }
                }
            }

            let current = registration_in(
                self.config.mode,
                &observed,
                ownership.owner.as_deref(),
                &self.config.advertise_address,
                &self.upstream,
            );
            // Only mode `owner` follows the task: the purge checks it, and a new one restarts the wait.
            let owner = ownership.owner.filter(|_| {
                self.config.mode == DiscoveryMode::Owner && current == Registration::Registered
            });
            if last_registration.as_ref() != Some(&current) {
                self.log_registration(&current, owner.as_deref());
            }
            let first = last_registration.is_none();
            last_registration = Some(current.clone());
            self.state.update(|s| {
                s.db_up = true;
                // Another task took over: its subscribers and restores start from scratch.
                if s.owner.is_some() && owner.is_some() && s.owner != owner {
                    info!(
                        from = s.owner.as_deref().unwrap_or(""),
                        to = owner.as_deref().unwrap_or(""),
                        "the change log has a new owner; cleanup waits again"
                    );
                    s.continuity.record(false, now);
                }
                // A registration found at the first reading has held since the sidecar started (it was made for
                // this sidecar before, or by the replication-manager's own config); one the sidecar has just
                // written holds from now, however late the first reading came.
                let since = if first && !adopted_now {
                    self.started.min(now)
                } else {
                    now
                };
                s.continuity
                    .record(current == Registration::Registered, since);
                s.registration = Some(current);
                s.owner = owner;
            });
        }
        if let Some(theirs) = adopted_from {
            match self
                .db
                .restore_address(&self.config.advertise_address, &theirs)
                .await
            {
                Ok(true) => info!(address = %theirs, "ownerAddress restored"),
                Ok(false) => info!("ownerAddress no longer ours; left as is"),
                Err(err) => warn!(error = %err, address = %theirs, "cannot restore ownerAddress"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(s: &str) -> Observed {
        Observed::Address(s.into())
    }

    #[test]
    fn registration_states() {
        let ours = "10.0.0.5:4851";
        assert_eq!(
            registration(&Observed::NoAddress, ours),
            Registration::Unregistered
        );
        assert_eq!(
            registration(&addr("ws://10.0.0.5:4851"), ours),
            Registration::Registered
        );
        assert_eq!(
            registration(&addr("10.0.0.5:4849"), ours),
            Registration::Elsewhere("10.0.0.5:4849".into())
        );
    }

    #[test]
    fn owner_mode_registers_the_replication_manager_with_its_task() {
        let (ours, rm) = ("10.0.0.5:4851", "10.0.0.5:4849");
        let owner = |observed: &Observed, task: Option<&str>| {
            registration_in(DiscoveryMode::Owner, observed, task, ours, rm)
        };
        assert_eq!(
            owner(&addr("ws://10.0.0.5:4849"), Some("rm-1")),
            Registration::Registered
        );
        assert_eq!(owner(&addr(rm), None), Registration::Unregistered);
        assert_eq!(
            owner(&addr(ours), Some("rm-1")),
            Registration::Elsewhere(ours.into())
        );
        assert_eq!(
            owner(&Observed::NoAddress, Some("rm-1")),
            Registration::Unregistered
        );
        // The other modes look for the sidecar and ignore the task.
        assert_eq!(
            registration_in(DiscoveryMode::Verify, &addr(ours), None, ours, rm),
            Registration::Registered
        );
    }

    #[test]
    fn adopt_replaces_only_the_upstreams_address_on_row_lock_schemas() {
        let (ours, upstream) = ("10.0.0.5:4851", "10.0.0.5:4849");
        assert_eq!(
            adopt(&addr(upstream), ours, upstream, Some(6)),
            Adopt::Write {
                from: upstream.into()
            }
        );
        assert_eq!(
            adopt(&addr("wss://10.0.0.5:4849"), ours, upstream, Some(7)),
            Adopt::Write {
                from: "wss://10.0.0.5:4849".into()
            }
        );
        assert_eq!(adopt(&addr(ours), ours, upstream, Some(6)), Adopt::Nothing);
        assert_eq!(
            adopt(&addr("10.9.9.9:4849"), ours, upstream, Some(6)),
            Adopt::Nothing
        );
        assert_eq!(
            adopt(&Observed::NoAddress, ours, upstream, Some(6)),
            Adopt::Nothing
        );
        assert_eq!(
            adopt(&addr(upstream), ours, upstream, Some(5)),
            Adopt::RefuseOldSchema {
                data_version: Some(5)
            }
        );
        assert_eq!(
            adopt(&addr(upstream), ours, upstream, None),
            Adopt::RefuseOldSchema { data_version: None }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn continuity_restarts_when_registration_is_lost() {
        let mut c = Continuity::default();
        let t0 = Instant::now();
        c.record(true, t0);
        assert_eq!(c.since(), Some(t0));
        c.record(true, t0 + Duration::from_secs(70));
        // Still counted from t0.
        assert_eq!(c.since(), Some(t0));
        c.record(false, t0 + Duration::from_secs(80));
        assert_eq!(c.since(), None);
        c.record(true, t0 + Duration::from_secs(90));
        assert_eq!(c.since(), Some(t0 + Duration::from_secs(90)));
    }
}
