//! `proxy_mode = "hide"` in front of a Zero 1.10 replication-manager: after an initial sync its readiness gate waits
//! for a backed-up watermark on the metrics page, which `hide` removes, so it never becomes ready and answers
//! neither `/` nor `/keepalive` (docs/protocol.md, "What each Zero release changed"). A replication-manager that
//! restarts with its replica does not wait, so such a deployment runs until its next initial sync (a resync, a new
//! volume) and then stays down. The sidecar cannot see Zero's version, but it knows the protocol versions the
//! upstream serves: v4 and up only is Zero 1.10 or later. When it knows that before it serves (`upstream.protocols`,
//! or the upstream answering its first probe) it refuses to start; when it learns it later, it says so in the log
//! and in `/status` (`upstream.readiness_warning`) rather than leave an outage nobody can explain.

use crate::litestream::config::ProxyMode;
use crate::protocol::versions::{Known, Versions};

/// The lowest protocol version a Zero 1.10 upstream serves; earlier releases serve v1 on.
const ZERO_1_10_FLOOR: u64 = 4;

/// Why a replication-manager that serves `versions` cannot work behind a proxy in `mode`, or `None` when it can.
pub fn never_ready(mode: ProxyMode, versions: &Versions) -> Option<String> {
    (mode == ProxyMode::Hide && *versions.start() >= ZERO_1_10_FLOOR).then(|| {
        format!(
            "litestream.proxy_mode = \"hide\" removes the backed-up watermark from the page the replication-manager \
             reads, and it serves protocols v{}..v{} (Zero 1.10 or later), whose readiness gate waits for one after \
             an initial sync: it will not answer / or /keepalive; set proxy_mode = \"clamp\"",
            versions.start(),
            versions.end()
        )
    })
}

/// [`never_ready`] for what is known of the upstream so far.
pub fn warning(mode: ProxyMode, known: &Known) -> Option<String> {
    never_ready(mode, known.versions.as_ref()?)
}

/// Logs [`warning`] each time it starts to hold (once per upstream that serves such a range), until `shutdown`.
pub async fn watch(
    mode: ProxyMode,
    mut known: tokio::sync::watch::Receiver<Known>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut said = false;
    loop {
        let now = warning(mode, &known.borrow_and_update());
        match now {
            Some(text) if !said => {
                tracing::error!(reason = %text, "the replication-manager will not become ready");
                said = true;
            }
            None => said = false,
            Some(_) => {}
        }
        tokio::select! {
            changed = known.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(range: Option<std::ops::RangeInclusive<u64>>) -> Known {
        Known {
            versions: range,
            ..Known::default()
        }
    }

    #[test]
    fn only_hide_in_front_of_a_v4_floor_is_said() {
        assert!(warning(ProxyMode::Hide, &known(Some(4..=6)))
            .unwrap()
            .contains("v4..v6"));
        assert_eq!(warning(ProxyMode::Clamp, &known(Some(4..=6))), None);
        assert_eq!(warning(ProxyMode::Hide, &known(Some(1..=6))), None);
        assert_eq!(warning(ProxyMode::Hide, &known(None)), None);
    }
}
