//! What the sidecar knows of the protocol versions its upstream change-streamer serves ([`UpstreamProtocols`]),
//! read before every `/snapshot` and `/changes` upgrade: fixed by `upstream.protocols`, or learned from the
//! upstream's own refusals, of a probe (`relay::probe`) or of a relayed subscription (docs/protocol.md, "Protocol
//! versions the upstream serves").
//!
//! A Zero 1.10 change-streamer refuses v3 on both routes; a v3 view-syncer handed a snapshot status by the sidecar
//! would restore, then have its subscription refused. Knowing the upstream's range, the sidecar refuses such a
//! client before any status, with the text the upstream would have sent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::protocol::versions::{intersect, Versions};
pub use crate::protocol::versions::{Known, Source};
use crate::protocol::{self, Version, CHANGES_VERSIONS};
use crate::streamer::config::Protocols;

/// A client refused on a learned range has the upstream asked again once the range is older than this: an upstream
/// replaced while no subscription was relayed (so that no lost connection told) is noticed within about this long
/// of a client needing it, at the cost of one probe per period while clients are refused.
pub const RECHECK_AFTER: Duration = Duration::from_secs(30);

/// The shared knowledge: cheap to clone, read on every upgrade, written by the probe and the relay.
#[derive(Clone)]
pub struct UpstreamProtocols(Arc<Inner>);

struct Inner {
    fixed: Option<Versions>,
    known: watch::Sender<Known>,
    /// A probe is wanted: the upstream may have changed.
    wanted: Notify,
}

impl UpstreamProtocols {
    /// With `auto`, nothing is known and the first probe counts as under way from here, so that requests that
    /// arrive before it has run wait for it like those that arrive while it runs.
    pub fn new(setting: &Protocols) -> Self {
        let (fixed, known) = match setting {
            Protocols::Fixed(versions) => (
                Some(versions.clone()),
                Known {
                    versions: Some(versions.clone()),
                    source: Some(Source::Config),
                    since: Some(SystemTime::now()),
                    ..Known::default()
                },
            ),
            Protocols::Auto => (
                None,
                Known {
                    probing: true,
                    ..Known::default()
                },
            ),
        };
        Self(Arc::new(Inner {
            fixed,
            known: watch::Sender::new(known),
            wanted: Notify::new(),
        }))
    }

    /// `upstream.protocols` is a range: nothing is learned or probed.
    pub fn is_fixed(&self) -> bool {
        self.0.fixed.is_some()
    }

    pub fn known(&self) -> Known {
        self.0.known.borrow().clone()
    }

    /// A reader of what is known, for those that only report it (`/status`).
    pub fn watch(&self) -> watch::Receiver<Known> {
        self.0.known.subscribe()
    }

    pub fn versions(&self) -> Option<Versions> {
        self.0.known.borrow().versions.clone()
    }

    /// The upstream said it serves `versions`. Logged when first learned and whenever it changes; with a fixed
    /// range, a different answer is only logged, since the operator's range is what the sidecar serves.
    pub fn learned(&self, versions: Versions, source: Source) {
        if let Some(fixed) = &self.0.fixed {
            if *fixed != versions {
                warn!(
                    upstream = %shown(&versions),
                    configured = %shown(fixed),
                    how = source.as_str(),
                    "the upstream serves other protocol versions than upstream.protocols says"
                );
            }
            return;
        }
        let now = Instant::now();
        let mut previous = None;
        self.0.known.send_modify(|known| {
            previous = known.versions.clone();
            if previous.as_ref() != Some(&versions) {
                known.since = Some(SystemTime::now());
            }
            known.versions = Some(versions.clone());
            known.source = Some(source);
            known.confirmed = Some(now);
            if source == Source::Probe {
                known.probe_error = None;
            }
        });
        if previous.as_ref() == Some(&versions) {
            return;
        }
        let before = previous.as_ref().map(shown);
        info!(
            versions = %shown(&versions),
            before = before.as_deref().unwrap_or("unknown"),
            how = source.as_str(),
            "upstream protocol versions learned"
        );
        if intersect(&versions, &CHANGES_VERSIONS).is_none() {
            warn!(
                versions = %shown(&versions),
                "the upstream serves no protocol version the sidecar relays: every client is refused"
            );
        }
    }

    pub(crate) fn probe_started(&self) {
        self.0.known.send_modify(|known| known.probing = true);
    }

    /// The probe is over; `error` says why it learned nothing (the answer itself goes through [`Self::learned`]).
    pub(crate) fn probe_ended(&self, error: Option<String>) {
        self.0.known.send_modify(|known| {
            known.probing = false;
            if error.is_some() {
                known.probe_error = error;
            }
        });
    }

    /// The upstream may have changed (a relayed connection to it was lost, or could not be made): the probe asks
    /// it again. Calls while a probe is due are one probe.
    pub fn recheck(&self) {
        if !self.is_fixed() {
            self.0.wanted.notify_one();
        }
    }

    /// Waits until [`Self::recheck`] asks for a probe.
    pub(crate) async fn wanted(&self) {
        self.0.wanted.notified().await;
    }

    /// Waits, at most `bound`, while nothing is known and a probe is under way: its answer decides the request.
    pub async fn settled(&self, bound: Duration) {
        let mut known = self.0.known.subscribe();
        let settled = known.wait_for(|k| k.versions.is_some() || !k.probing);
        let _ = tokio::time::timeout(bound, settled).await;
    }

    /// Checks a `/snapshot` request (`protocol::check_snapshot`) against what is known once it is settled
    /// ([`Self::settled`], at most `wait`). While nothing is known the sidecar serves what it can, as before it
    /// knew upstream ranges: a 0.20 or 1.9 deployment whose upstream cannot be asked keeps getting statuses.
    pub async fn check_snapshot(
        &self,
        version: &Version,
        query: Option<&str>,
        wait: Duration,
    ) -> Result<(u64, String), String> {
        // Refused whatever the upstream says: its answer is not waited for.
        let anyway = protocol::check_snapshot(version, query, None);
        if anyway.is_ok() {
            self.settled(wait).await;
        }
        let versions = self.versions();
        let checked = protocol::check_snapshot(version, query, versions.as_ref());
        if checked.is_err() && anyway.is_ok() {
            self.refused_on_range();
        }
        checked
    }

    /// Checks a `/changes` request (`protocol::check_changes`) against what is known now; returns its version.
    /// Nothing is waited for: while the range is unknown the upstream decides, and its refusal is learned.
    pub fn check_changes(&self, version: &Version) -> Result<u64, String> {
        let versions = self.versions();
        let checked = protocol::check_changes(version, versions.as_ref());
        if checked.is_err() && protocol::check_changes(version, None).is_ok() {
            self.refused_on_range();
        }
        checked?;
        match version {
            Version::Number(n) => Ok(*n),
            Version::Invalid(path) => Err(protocol::invalid_path(path)),
        }
    }

    /// A client was refused on the upstream's learned range: asked again if that range is old
    /// ([`RECHECK_AFTER`]).
    fn refused_on_range(&self) {
        let confirmed = self.0.known.borrow().confirmed;
        if confirmed.is_some_and(|at| at.elapsed() >= RECHECK_AFTER) {
            self.recheck();
        }
    }
}

/// A range as Zero writes it: `[v4 ... v6]`.
pub fn shown(versions: &Versions) -> String {
    format!("[v{} ... v{}]", versions.start(), versions.end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version::Number(n)
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_fixed_range_decides_at_once_and_learns_nothing() {
        let protocols = UpstreamProtocols::new(&Protocols::Fixed(4..=6));
        assert!(protocols.is_fixed());
        assert_eq!(
            protocols
                .check_snapshot(&v(3), Some("taskID=t"), WAIT)
                .await,
            Err(
                "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]"
                    .into()
            )
        );
        assert_eq!(
            protocols.check_changes(&v(3)),
            Err(
                "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]"
                    .into()
            )
        );
        assert_eq!(protocols.check_changes(&v(6)), Ok(6));
        protocols.learned(1..=3, Source::Refusal);
        assert_eq!(protocols.versions(), Some(4..=6));
        assert_eq!(protocols.known().source, Some(Source::Config));
    }

    #[tokio::test(start_paused = true)]
    async fn while_unknown_a_snapshot_waits_for_the_probe_under_way() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        assert!(protocols.known().probing);
        let asking = protocols.clone();
        let check =
            tokio::spawn(async move { asking.check_snapshot(&v(3), Some("taskID=t"), WAIT).await });
        tokio::time::sleep(WAIT / 2).await;
        assert!(!check.is_finished(), "decided before the probe answered");
        protocols.learned(4..=6, Source::Probe);
        assert_eq!(
            check.await.unwrap(),
            Err(
                "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]"
                    .into()
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn while_unknown_and_not_probing_a_snapshot_is_served_as_the_sidecar_can() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        protocols.probe_ended(Some("upstream unreachable".into()));
        assert_eq!(
            protocols
                .check_snapshot(&v(3), Some("taskID=t"), WAIT)
                .await,
            Ok((3, "t".into()))
        );
        assert_eq!(protocols.check_changes(&v(3)), Ok(3));
        assert_eq!(
            protocols.known().probe_error.as_deref(),
            Some("upstream unreachable")
        );
        // A probe that never answers delays a request by `wait` at most, then it is served as before.
        protocols.probe_started();
        let started = Instant::now();
        assert_eq!(
            protocols
                .check_snapshot(&v(3), Some("taskID=t"), WAIT)
                .await,
            Ok((3, "t".into()))
        );
        assert_eq!(started.elapsed(), WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_refused_whatever_the_upstream_says_do_not_wait() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        let started = Instant::now();
        assert_eq!(
            protocols.check_snapshot(&v(3), None, WAIT).await,
            Err(protocol::MISSING_TASK_ID.into())
        );
        assert_eq!(
            protocols
                .check_snapshot(&v(9), Some("taskID=t"), WAIT)
                .await,
            Err(
                "Error: Cannot service client at protocol v9. Supported protocols: [v3 ... v6]"
                    .into()
            )
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_0_20_upstream_keeps_v3_and_a_1_9_upstream_v6() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        protocols.learned(1..=3, Source::Probe);
        assert_eq!(
            protocols
                .check_snapshot(&v(3), Some("taskID=t"), WAIT)
                .await,
            Ok((3, "t".into()))
        );
        assert_eq!(protocols.check_changes(&v(3)), Ok(3));
        protocols.learned(1..=6, Source::Probe);
        assert_eq!(
            protocols
                .check_snapshot(&v(6), Some("taskID=t"), WAIT)
                .await,
            Ok((6, "t".into()))
        );
        assert_eq!(protocols.check_changes(&v(6)), Ok(6));
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_learned_is_kept_with_its_source_until_the_upstream_says_otherwise() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        protocols.learned(4..=6, Source::Refusal);
        let first = protocols.known();
        assert_eq!(first.versions, Some(4..=6));
        assert_eq!(first.source, Some(Source::Refusal));
        tokio::time::advance(Duration::from_secs(1)).await;
        // Said again: confirmed, not changed.
        protocols.learned(4..=6, Source::Probe);
        let again = protocols.known();
        assert_eq!(again.since, first.since);
        assert!(again.confirmed > first.confirmed);
        assert_eq!(again.source, Some(Source::Probe));
        protocols.learned(1..=6, Source::Probe);
        assert_eq!(protocols.versions(), Some(1..=6));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_refused_on_an_old_range_asks_the_upstream_again() {
        let protocols = UpstreamProtocols::new(&Protocols::Auto);
        protocols.learned(4..=6, Source::Probe);
        let wanted = |p: &UpstreamProtocols| {
            let p = p.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(1), p.wanted())
                    .await
                    .is_ok()
            }
        };
        // Fresh: refused without asking.
        assert!(protocols.check_changes(&v(3)).is_err());
        assert!(!wanted(&protocols).await);
        tokio::time::advance(RECHECK_AFTER).await;
        assert!(protocols.check_changes(&v(3)).is_err());
        assert!(wanted(&protocols).await);
        // A client the range admits asks nothing.
        assert_eq!(protocols.check_changes(&v(4)), Ok(4));
        assert!(!wanted(&protocols).await);
        // A lost upstream always asks.
        protocols.recheck();
        assert!(wanted(&protocols).await);
    }
}
