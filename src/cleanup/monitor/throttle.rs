//! How the loop says what changed: each recurring problem once when it starts or changes, then at most every
//! [`WARN_EVERY`], and once when it clears. An operator sees every transition without a line per check.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, info, warn, Level};

use crate::cleanup::unservable::Reason;
use crate::cleanup::HoldReason;

/// A warning repeated at most this often while the same problem persists.
const WARN_EVERY: Duration = Duration::from_secs(300);

/// One recurring problem's log.
#[derive(Default)]
pub(super) struct Throttle {
    current: Option<String>,
    last_warned: Option<Instant>,
}

impl Throttle {
    pub(super) fn failed(&mut self, what: &str, problem: String, level: Level, now: Instant) {
        let changed = self.current.as_deref() != Some(problem.as_str());
        let due = self
            .last_warned
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY);
        if changed || due {
            if level == Level::ERROR {
                error!(error = %problem, "{what}");
            } else {
                warn!(error = %problem, "{what}");
            }
            self.last_warned = Some(now);
        } else {
            debug!(error = %problem, "{what}");
        }
        self.current = Some(problem);
    }

    /// Like [`Throttle::failed`] at warn, but said only when the problem starts or changes: for a check the
    /// sidecar can do without, whose failure an operator may choose to leave as it is.
    pub(super) fn failed_once(&mut self, what: &str, problem: String) {
        if self.current.as_deref() != Some(problem.as_str()) {
            warn!(error = %problem, "{what}");
        } else {
            debug!(error = %problem, "{what}");
        }
        self.current = Some(problem);
    }

    pub(super) fn succeeded(&mut self, what: &str) {
        if self.current.take().is_some() {
            info!("{what}");
            self.last_warned = None;
        }
    }
}

/// What the loop remembers between checks to log each change once.
#[derive(Default)]
pub(super) struct Said {
    pub(super) scrape_problem: Throttle,
    pub(super) listing_problem: Throttle,
    pub(super) layout_problem: Throttle,
    pub(super) last_hold: Option<HoldReason>,
    pub(super) replica_problem: Throttle,
    /// One per [`Reason`], in the order of [`Reason::ALL`].
    refused: [Throttle; 3],
    pub(super) replicas_problem: Throttle,
}

impl Said {
    pub(super) fn refused(&mut self, reason: Reason) -> &mut Throttle {
        let at = Reason::ALL
            .iter()
            .position(|r| *r == reason)
            .expect("every reason is in ALL");
        &mut self.refused[at]
    }
}
