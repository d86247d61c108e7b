//! `proxy_mode = "hide"` in front of a Zero 1.10 replication-manager: after an initial sync its readiness gate waits
//! for a backed-up watermark on the metrics page, which `hide` removes, so it never becomes ready and answers
//! neither `/` nor `/keepalive` (docs/protocol.md, "What each Zero release changed"). The sidecar cannot see Zero's
//! version, but it learns the protocol versions the upstream serves: v4 and up only is Zero 1.10 or later. Said in
//! the log once and in `/status` (`upstream.readiness_warning`) rather than left to an outage nobody can explain.

use crate::litestream::config::ProxyMode;
use crate::protocol::versions::Known;

/// The lowest protocol version a Zero 1.10 upstream serves; earlier releases serve v1 on.
const ZERO_1_10_FLOOR: u64 = 4;

/// Why the replication-manager behind this sidecar never becomes ready, or `None` when nothing says so.
pub fn warning(mode: ProxyMode, known: &Known) -> Option<String> {
    let versions = known.versions.as_ref()?;
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
                tracing::warn!(reason = %text, "the replication-manager will not become ready");
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
