//! Registration in the shard's address table: whether `ownerAddress` leads view-syncers to this sidecar, and —
//! only in `adopt` mode against a change-streamer that takes row locks — when to write it.
//!
//! Writing that row is dangerous with Zero 0.20: an outside UPDATE committing while the change-streamer's
//! SERIALIZABLE storer transaction is open aborts it with 40001 and stops the replication-manager (PROTOCOL.md
//! §8.5, §11.1). So `verify` (the default) never writes, and `adopt` writes only when the schema's data version
//! shows the row-lock storer (Zero 0.26+, `dataVersion >= 6`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// `versionHistory.dataVersion` from which the change-streamer stores under row locks (PROTOCOL.md §12).
pub const ROW_LOCK_DATA_VERSION: i32 = 6;

/// Config `discovery.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Read `ownerAddress` and report; the operator points `ZERO_CHANGE_STREAMER_ADDRESS` at the sidecar.
    #[default]
    Verify,
    /// Replace the co-located change-streamer's address with the sidecar's (row-lock schemas only).
    Adopt,
    /// No discovery: nothing is read, and cleanup does not depend on registration.
    Off,
}

/// `host:port` of an address as Zero writes it: bare, or with a `ws://`/`wss://` prefix from Zero 0.22 on.
pub fn host_port(address: &str) -> &str {
    let address = address.trim();
    let address = address
        .strip_prefix("ws://")
        .or_else(|| address.strip_prefix("wss://"))
        .or_else(|| address.strip_prefix("http://"))
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    address.trim_end_matches('/')
}

/// Whether two addresses name the same endpoint (host compared case-insensitively).
pub fn same_address(a: &str, b: &str) -> bool {
    host_port(a).eq_ignore_ascii_case(host_port(b))
}

/// What the address table says, as read from the change DB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// No `replicationState` row yet, or `ownerAddress` NULL (first start, or after a resync, §8.2).
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
    pub fn observe(&mut self, registered: bool, now: Instant) {
        match (registered, self.since) {
            (true, None) => self.since = Some(now),
            (false, _) => self.since = None,
            (true, Some(_)) => {}
        }
    }

    /// Registered continuously for at least `needed`.
    pub fn held_for(&self, needed: Duration, now: Instant) -> bool {
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= needed)
    }

    pub fn since(&self) -> Option<Instant> {
        self.since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Observed {
        Observed::Address(s.into())
    }

    #[test]
    fn addresses_compare_by_host_and_port() {
        assert!(same_address("10.0.0.5:4851", "10.0.0.5:4851"));
        assert!(same_address(
            "wss://Sidecar.example:4851",
            "sidecar.example:4851"
        ));
        assert!(same_address("ws://[::1]:4851/", "[::1]:4851"));
        assert!(!same_address("10.0.0.5:4851", "10.0.0.5:4849"));
        assert!(!same_address("10.0.0.5:4851", "10.0.0.6:4851"));
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
        c.observe(true, t0);
        assert!(!c.held_for(Duration::from_secs(60), t0 + Duration::from_secs(59)));
        assert!(c.held_for(Duration::from_secs(60), t0 + Duration::from_secs(60)));
        c.observe(true, t0 + Duration::from_secs(70));
        assert_eq!(c.since(), Some(t0));
        c.observe(false, t0 + Duration::from_secs(80));
        c.observe(true, t0 + Duration::from_secs(90));
        assert!(!c.held_for(Duration::from_secs(60), t0 + Duration::from_secs(100)));
    }
}
