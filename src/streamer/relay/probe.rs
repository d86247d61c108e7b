//! Asking the upstream which protocol versions it serves, before any client needs to know: a WebSocket to
//! `/replication/v0/changes`, whose refusal names the range (docs/protocol.md, "Protocol versions the upstream
//! serves"). Made at start, whenever the relay lost or could not make a connection to the upstream, and when a client
//! is refused on a range not confirmed for a while ([`crate::streamer::protocols::RECHECK_AFTER`]); retried with a
//! backoff while the upstream cannot be asked.
//!
//! Why the probe is sound, checked in Zero's `change-streamer-http.ts` from 0.20 through 1.9 and the 1.10 canaries:
//! the `/changes` handler reads the version from the path (`getSubscriberContext` → `checkProtocolVersion`, 0.20's
//! `checkPath`) before it looks at any parameter, starts the change-streamer, subscribes, or ends a reservation; the
//! version is below every release's `MIN_SUPPORTED_PROTOCOL_VERSION` (1, then 4 from 1.10), so every release throws
//! at once and closes the upgraded socket with 1002 and `Error: Cannot service client at protocol v0. Supported
//! protocols: [vA ... vB]`. Nothing is registered and no state changes; the only trace is the warning Zero logs for
//! every rejected socket ("closing connection to client with error"), once per probe. `/snapshot` would not do: 0.20
//! does not check its version, and the 1.10 canaries start the change-streamer before they do. The answer is trusted only in that exact
//! form (a 1002 close whose text reads back as a refusal of v0); anything else teaches nothing, and the probe is
//! tried again later.

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{OpCode, Role};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::net::ws::{self, Inbox, Outbox, PeerClose, ReadError, Reads};
use crate::protocol::close;
use crate::protocol::versions::{parse_refusal, Versions};
use crate::streamer::protocols::{Source, UpstreamProtocols};

use super::upstream::connect;
use super::Settings;

/// The probe's request target: a version no Zero serves, and no parameters, since the version is checked first.
pub const PROBE_PATH: &str = "/replication/v0/changes";

/// Probes are at least this far apart, however often the relay asks: a thousand subscriptions lost together are one
/// probe.
const MIN_GAP: Duration = Duration::from_secs(1);

/// Longest wait before a probe is tried again after one that learned nothing: an upstream being restarted (a Zero
/// upgrade) is asked again within this long of coming back.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The wait after `failures` probes in a row learned nothing: 1 s, doubling, at most [`MAX_BACKOFF`].
pub(super) fn backoff(failures: u32) -> Duration {
    MIN_GAP
        .saturating_mul(1 << failures.saturating_sub(1).min(8))
        .min(MAX_BACKOFF)
}

/// What a probe's answer teaches: the range, when the close is Zero's refusal of v0 exactly.
pub(super) fn read_answer(code: Option<u16>, reason: &str) -> Result<Versions, String> {
    let refusal = parse_refusal(reason).filter(|r| r.version == 0);
    match (code, refusal) {
        (Some(close::PROTOCOL_ERROR), Some(refusal)) => Ok(refusal.supported),
        (code, _) => Err(format!(
            "the upstream closed the probe with {} {reason:?}, not with Zero's refusal of v0",
            code.map_or("no code".to_string(), |c| c.to_string())
        )),
    }
}

/// Probes until `shutdown`: at once, then whenever asked ([`UpstreamProtocols::recheck`]) or, after a probe that
/// learned nothing, after a backoff.
pub async fn run(
    settings: Arc<Settings>,
    protocols: UpstreamProtocols,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    let mut last: Option<Instant> = None;
    loop {
        if let Some(last) = last {
            let next = if failures == 0 {
                // Learned: asked again only when something says the upstream may have changed.
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = protocols.wanted() => last + MIN_GAP,
                }
            } else {
                last + backoff(failures)
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
        }
        last = Some(Instant::now());
        protocols.probe_started();
        let answer = tokio::select! {
            _ = shutdown.cancelled() => {
                protocols.probe_ended(None);
                return;
            }
            answer = probe(&settings) => answer,
        };
        match answer {
            Ok(versions) => {
                failures = 0;
                protocols.learned(versions, Source::Probe);
                protocols.probe_ended(None);
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    info!(%error, "upstream protocol probe learned nothing; trying again");
                } else {
                    debug!(%error, failures, "upstream protocol probe failed");
                }
                protocols.probe_ended(Some(error));
            }
        }
    }
}

/// One probe, outside the loop: the answer to a question that cannot wait for [`run`] (the start's check of
/// `proxy_mode`).
pub async fn once(settings: &Settings) -> Result<Versions, String> {
    probe(settings).await
}

/// One probe: the upgrade, then the upstream's close, each under `upstream.connect_timeout`.
async fn probe(settings: &Settings) -> Result<Versions, String> {
    let upstream = &settings.upstream;
    let socket = connect(upstream, settings.upstream_tls.as_deref(), PROBE_PATH)
        .await
        .map_err(|e| e.to_string())?;
    let (mut reader, mut writer) = tokio::io::split(socket);
    // Only a close is expected; anything large is not Zero's answer.
    let mut inbox = Inbox::new(false, 4096, Reads::Small);
    let read = async {
        loop {
            let frame = match inbox.read_frame(&mut reader).await {
                Ok(frame) => frame,
                Err(ReadError::Gone) => {
                    return Err("the upstream dropped the probe without a close".into())
                }
                Err(ReadError::Protocol(with)) => {
                    return Err(format!(
                        "the upstream's answer to the probe: {}",
                        with.reason
                    ))
                }
            };
            match frame.opcode {
                OpCode::Ping | OpCode::Pong => continue,
                OpCode::Close => return Ok(frame.payload),
                _ => return Err("the upstream accepted the probe instead of refusing v0".into()),
            }
        }
    };
    let payload = tokio::time::timeout(upstream.connect_timeout, read)
        .await
        .map_err(|_| {
            format!(
                "the upstream did not answer the probe within {:?}",
                upstream.connect_timeout
            )
        })??;
    match ws::read_close(payload) {
        PeerClose::Valid { code, payload } => {
            let reason = std::str::from_utf8(payload.get(2..).unwrap_or_default()).unwrap_or("");
            let answer = read_answer(code, reason);
            // The close handshake, answered as received; the upstream drops the socket either way.
            let mut outbox = Outbox::new(Role::Client);
            outbox.push(true, OpCode::Close, payload);
            let _ = tokio::time::timeout(ws::CLOSE_LINGER, outbox.flush(&mut writer)).await;
            answer
        }
        PeerClose::Invalid(with) => Err(format!(
            "the upstream's close of the probe: {}",
            with.reason
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zeros_refusal_of_v0_teaches_a_range() {
        let refusal =
            "Error: Cannot service client at protocol v0. Supported protocols: [v4 ... v6]";
        assert_eq!(read_answer(Some(1002), refusal), Ok(4..=6));
        assert_eq!(
            read_answer(
                Some(1002),
                "Error: Cannot service client at protocol v0. Supported protocols: [v1 ... v3]"
            ),
            Ok(1..=3)
        );
        for (code, reason) in [
            (Some(1011), refusal),
            (None, refusal),
            (Some(1000), ""),
            (
                Some(1002),
                "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]",
            ),
            (Some(1002), "Error: invalid path: /replication/v0/changes"),
            (
                Some(1002),
                "Error: received request before change-streamer is ready",
            ),
        ] {
            assert!(read_answer(code, reason).is_err(), "{code:?} {reason}");
        }
    }

    #[test]
    fn the_backoff_doubles_to_its_cap() {
        let waits: Vec<u64> = (1..=6).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
