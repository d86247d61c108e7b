//! `/snapshot`: the WebSocket a view-syncer holds open for its snapshot reservation: its request checks, its
//! upgrade ([`serve`]), the status frame, and the socket held open until the reservation ends. The reservations
//! themselves are kept by the cleanup side's registry.
//!
//! Requests Zero would reject are refused with HTTP 400 *before* the upgrade, with Zero's own message as the body:
//! a 0.20 view-syncer whose snapshot socket is accepted and then closed without a status waits forever
//! (docs/protocol.md, "A snapshot socket closed before its status"), while a refused upgrade makes it fail and
//! restart. So is a version the upstream change-streamer does not serve: a status would send the view-syncer to
//! restore for a subscription that upstream then refuses (docs/protocol.md, "Protocol versions the upstream
//! serves").
//!
//! The socket is read, assembled and written with [`crate::net::ws`]'s pieces, as the relay's are: an idle reservation
//! keeps neither a read nor a write buffer, since thousands may wait for hours.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Role, WebSocket};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn};

use crate::cleanup::reservations::{EndReason, Lease};
use crate::net::http::{accept_upgrade, plain, spawn_upgraded};
use crate::net::ws::{
    self, Assembler, CloseWith, Inbox, Liveness, Outbox, OwnedFrame, PeerClose, ReadError, Reads,
};
use crate::protocol::{self, close, Version};

/// Everything a snapshot connection needs besides its socket.
#[derive(Clone)]
pub struct SnapshotContext {
    /// The registry the reservation is opened in; the status, where the replica's size and drills are read.
    pub handles: crate::cleanup::handles::Handles,
    /// Where every status reads the change log's start, and v4+'s `replicaVersion` and `minWatermark`.
    pub change_db: Option<crate::cleanup::change_db::ChangeDb>,
    /// v3 statuses go out without reading the change log: set only for tests of the protocol that run without a
    /// database ([`crate::App::statuses_without_slots`]), where v3's status is all there is to serve.
    pub v3_without_log: bool,
    pub backup_url: Arc<str>,
    /// What the upstream serves, which bounds the versions given a status.
    pub protocols: crate::streamer::protocols::UpstreamProtocols,
    /// Longest a request waits for a probe under way while the upstream's range is unknown
    /// (`upstream.connect_timeout`, which bounds each step of the probe).
    pub protocols_wait: Duration,
    pub ping_interval: Duration,
    /// A peer silent this long is dropped (`server.peer_timeout`).
    pub peer_timeout: Duration,
    pub shutdown: CancellationToken,
}

/// Largest frame (and message) a reservation's client may send. It only ever sends acks (`{"ack":1}`,
/// docs/protocol.md, "Frames and acks"), so a few KiB is generous, and a socket claiming more is closed (1009)
/// before it costs anything.
pub const MAX_CLIENT_FRAME: usize = 4096;

/// Answers a `/snapshot` upgrade request: refused (HTTP 400 with Zero's message, 503 while shutting down), or
/// upgraded, the reservation then held on its own task in `tracker`. While the upstream's range is unknown and being
/// asked, the answer waits for it (at most `protocols_wait`), so that a Zero 1.10 upstream's floor holds from the
/// sidecar's first request on; once nothing is being asked, an unknown range refuses nothing the sidecar can serve.
pub async fn serve(
    mut req: Request<Incoming>,
    version: &Version,
    peer: SocketAddr,
    ctx: &SnapshotContext,
    tracker: &TaskTracker,
) -> Response<Full<Bytes>> {
    let checked = ctx
        .protocols
        .check_snapshot(version, req.uri().query(), ctx.protocols_wait)
        .await;
    let (version, task_id) = match checked {
        Ok(checked) => checked,
        Err(message) => {
            debug!(%message, "snapshot request refused");
            return plain(StatusCode::BAD_REQUEST, message);
        }
    };
    if ctx.shutdown.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let (response, upgrade) = match accept_upgrade(&mut req) {
        Ok(accepted) => accepted,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    let ctx = ctx.clone();
    let span = info_span!("reservation", task_id = %task_id, %peer);
    spawn_upgraded(tracker, upgrade, span, move |ws| async move {
        handle_snapshot(ctx, version, task_id, ws).await;
    });
    response
}

/// How a reservation socket ended, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReservationEnd {
    ClosedByPeer,
    Ended(EndReason),
    Shutdown,
    Unresponsive,
    ProtocolError(CloseWith),
    Gone,
}

/// How often a status that cannot be built yet (no backup, change DB not readable, ...) is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(1);

/// Why a status is not sent yet; the handler tries again (pinging the socket meanwhile) and logs each new reason.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Withheld {
    /// No backed-up watermark is known: litestream has reported none yet, or (`cleanup.requires = "restore"`) no
    /// drill has proved one.
    NoBackup,
    /// The destination holds no backup that restores.
    NotRestorable,
    /// The change DB cannot be read.
    ChangeDb,
    /// The sidecar refuses this deployment (a v5 backup, or a log Zero no longer writes).
    Unservable,
    /// The change log's oldest row is past the newest backup: a view-syncer restoring it could not catch up.
    LogPastBackup { oldest: String, newest: String },
    /// A restore drill reached less than the backup claimed, and none has reached the claim since: a view-syncer
    /// would restore less than cleanup and the status go by.
    RestoredLess,
}

impl Withheld {
    /// The reason as `/status` shows it on the reservation.
    fn label(&self) -> &'static str {
        match self {
            Withheld::NoBackup => "no_backup",
            Withheld::NotRestorable => "not_restorable",
            Withheld::ChangeDb => "change_db",
            Withheld::Unservable => "unservable",
            Withheld::LogPastBackup { .. } => "log_past_backup",
            Withheld::RestoredLess => "restored_less",
        }
    }

    fn log(&self) {
        match self {
            Withheld::NoBackup => {
                info!("snapshot status withheld until litestream reports a first backup")
            }
            Withheld::NotRestorable => info!(
                "snapshot status withheld until the backup destination holds a restorable backup"
            ),
            Withheld::ChangeDb => info!("snapshot status held back until the change DB answers"),
            Withheld::Unservable => info!(
                "snapshot status withheld while the sidecar refuses this deployment (see unservable in /status and \
                 the sidecar's error log)"
            ),
            Withheld::LogPastBackup { oldest, newest } => warn!(
                %oldest,
                %newest,
                "snapshot status withheld: the change log's oldest watermark is past the newest backup, so a \
                 view-syncer restoring it could not catch up; waiting for a newer backup (was the log purged by \
                 someone else, or the change DB reset?)"
            ),
            Withheld::RestoredLess => warn!(
                "snapshot status withheld: a restore drill reached less than the backup claims (objects are \
                 missing from it); waiting for a drill that restores the claim again (see drills.restored_less in \
                 /status)"
            ),
        }
    }
}

/// Builds the status frame for `version` and pins the reservation where that status needs it; withheld while it
/// cannot be built yet, and the handler tries again (pinging the socket meanwhile).
///
/// Withheld for every version until litestream has reported a backup and (with `backup.verify`) a listing found an
/// object in the destination, as Zero 1.8+ withholds it: a view-syncer handed a status with nothing to restore
/// fails and retries with a new reservation; and while a restore drill has found that a restore reaches less than
/// the backup claims (`restored_less`), until one reaches the claim again. v4+ statuses also wait while the monitor refuses the deployment
/// ([`crate::cleanup::unservable`]); v3's (Zero 0.20 to 0.24, which have neither v5 backups nor a way to stop
/// writing the change log) carries nothing such a refusal is about, and goes out as before.
///
/// Every version waits while the change log starts past the newest backup, as Zero 1.10 confirms a reservation only
/// when the log's oldest watermark is at or below the backed-up one: a view-syncer restoring that backup could not
/// catch up, whatever its version (a v4+ one loops on `WatermarkTooOld`), so a status would only send it into a
/// restore that fails. So every status reads the change DB, and waits while it cannot.
///
/// v3's status carries only the backup URL: the reservation keeps the floor it opened with, or the newest backup
/// when none was known then, which is never above that backup, and its view-syncer restores that backup or a newer
/// one and catches up from there. v4+'s also carries `minWatermark`, from which a view-syncer that keeps its own
/// replica catches up, so the reservation protects every row from there: while the change DB is read the floor is
/// lowered to "everything" (a running purge stops before its next batch, and the read waits for the batch in
/// flight), then set to the lower of the newest backup and the `minWatermark` sent.
async fn status_frame(
    ctx: &SnapshotContext,
    version: u64,
    lease: &mut Lease,
) -> Result<String, Withheld> {
    let status = build_status(ctx, version, lease).await?;
    // The view-syncer restores once it has the status: from then on its reservation must bound every purge of
    // every sidecar of the shard, so its row must have committed. Without the change DB no status goes out: the
    // handler tries again, and the view-syncer waits or retries.
    if !ctx.handles.registry.durable(DURABLE_WAIT).await {
        return Err(Withheld::ChangeDb);
    }
    Ok(status)
}

/// How long a status waits for its reservation's row to commit before the handler tries again.
const DURABLE_WAIT: Duration = Duration::from_secs(5);

async fn build_status(
    ctx: &SnapshotContext,
    version: u64,
    lease: &mut Lease,
) -> Result<String, Withheld> {
    let facts = ctx.handles.registry.status_facts();
    let newest = facts.newest_backup.ok_or(Withheld::NoBackup)?;
    if !facts.restorable {
        return Err(Withheld::NotRestorable);
    }
    if ctx
        .handles
        .status
        .read(|s| s.drills.restored_less.is_some())
    {
        return Err(Withheld::RestoredLess);
    }
    if version < 4 {
        if !ctx.v3_without_log {
            // Nothing sent depends on what is read, so the floor stays: the check is only whether the backup
            // reaches the log, and a purge keeps every row from the floor on, which is at or below that backup.
            let db = ctx.change_db.as_ref().ok_or(Withheld::ChangeDb)?;
            let (replica_version, min_watermark) = read_log(db).await.ok_or(Withheld::ChangeDb)?;
            reaches_log(db, &replica_version, &min_watermark, &newest).await?;
        }
        if lease.floor().is_none() {
            lease.set_floor(Some(newest));
        }
        return Ok(protocol::snapshot_status_v3(&ctx.backup_url));
    }
    // Its `minWatermark` would come from a change log that may not be the one view-syncers catch up from, and its
    // backup URL from a location Zero may not back up to (docs/protocol.md, "Zero 1.10 setups the sidecar refuses").
    if facts.unservable {
        return Err(Withheld::Unservable);
    }
    let db = ctx.change_db.as_ref().ok_or(Withheld::ChangeDb)?;
    let pinned = lease.floor();
    lease.set_floor(None);
    let Some((replica_version, min_watermark)) = read_log(db).await else {
        lease.set_floor(pinned);
        return Err(Withheld::ChangeDb);
    };
    if let Err(why) = reaches_log(db, &replica_version, &min_watermark, &newest).await {
        lease.set_floor(pinned);
        return Err(why);
    }
    lease.set_floor(Some(newest.min(min_watermark.clone())));
    // `litestream_db_size` is 0 until litestream's first sync: no size is better than a wrong one.
    let replica_size = ctx
        .handles
        .status
        .read(|s| s.db_bytes)
        .filter(|bytes| *bytes > 0);
    Ok(protocol::snapshot_status_v4(
        &ctx.backup_url,
        &replica_version,
        &min_watermark,
        replica_size,
    ))
}

/// The change DB's replica version and the change log's oldest watermark; `None` while they cannot be read.
async fn read_log(db: &crate::cleanup::change_db::ChangeDb) -> Option<(String, String)> {
    let replica_version = match db.replica_version().await {
        Ok(Some(v)) => v,
        Ok(None) => return None,
        Err(err) => {
            debug!(error = %err, "snapshot status waits for the change DB");
            return None;
        }
    };
    match db.min_watermark().await {
        // An empty change log can be caught up from the replica version itself (docs/protocol.md, "Fresh
        // replicas refused by Zero 0.25").
        Ok(min) => Some((replica_version.clone(), min.unwrap_or(replica_version))),
        Err(err) => {
            debug!(error = %err, "snapshot status waits for the change DB");
            None
        }
    }
}

/// Whether a restore of `newest` can catch up from the change log that starts at `min_watermark`.
async fn reaches_log(
    db: &crate::cleanup::change_db::ChangeDb,
    replica_version: &str,
    min_watermark: &str,
    newest: &str,
) -> Result<(), Withheld> {
    if min_watermark > newest && !unseeded_log_at_its_start(db, replica_version, newest).await {
        return Err(Withheld::LogPastBackup {
            oldest: min_watermark.to_string(),
            newest: newest.to_string(),
        });
    }
    Ok(())
}

/// Whether a backup at the replica version meets a change log that Zero before 0.26 wrote: such a log is not
/// seeded with rows at the replica version, so even untouched it starts past it, and a restore at the replica
/// version catches up from its first row (docs/protocol.md, "The snapshot status"). Zero 0.26 and later seed it
/// (change DB `dataVersion` 6), so there a log past the backup has lost rows the restore needs.
async fn unseeded_log_at_its_start(
    db: &crate::cleanup::change_db::ChangeDb,
    replica_version: &str,
    newest: &str,
) -> bool {
    newest == replica_version && matches!(db.data_version().await, Ok(Some(version)) if version < 6)
}

/// Logs the floor a reservation keeps once its status is built (v3: the newest backup when it opened, or when the
/// first one came; v4+: lowered to the status's `minWatermark`): while it is open, no purge deletes a change-log row
/// at or above it. Once per reservation, as its status is sent once.
fn log_pinned(lease: &Lease) {
    info!(
        floor = lease.floor().as_deref().unwrap_or(""),
        "reservation pinned"
    );
}

/// How a reservation's socket is left once the loop has decided that it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// At once: the peer is gone or stopped answering.
    Drop,
    /// Once what is queued is written (an answer to the peer's close, or a close after a broken frame).
    Flush,
    /// Once what is queued (ending with our close) is written and the peer's close has arrived, or briefly.
    Linger,
}

/// Serves one reservation: status frame, then hold the socket open with pings until something ends it. A status
/// that cannot be built yet is held back (the socket is pinged meanwhile, and the reservation says why in
/// `/status`) rather than sent too early; a reservation is never closed without a status for lack of one.
async fn handle_snapshot<S>(
    ctx: SnapshotContext,
    version: u64,
    task_id: String,
    ws: WebSocket<S>,
) -> ReservationEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut lease = ctx
        .handles
        .registry
        .open_for(&task_id, version, Instant::now());
    info!(
        floor = lease.floor().unwrap_or_default(),
        "reservation opened"
    );
    // The socket is read with a buffer that exists only while bytes are pending, and written through an outbox
    // that keeps none once flushed: an open reservation mostly waits, and thousands may be open at once.
    let (mut reader, mut writer) = tokio::io::split(ws.into_inner());
    let mut inbox = Inbox::new(true, MAX_CLIENT_FRAME, Reads::Small);
    let mut outbox = Outbox::new(Role::Server);
    // A status that can be built now is queued at once, and the loop's first flush writes it; one that cannot is
    // retried in the loop below. Boxed: the database read is a large future that idle reservations never need.
    let mut status_sent = false;
    // The reason logged last: a status that keeps waiting for the same thing is logged once.
    let mut withheld = None;
    match Box::pin(status_frame(&ctx, version, &mut lease)).await {
        Ok(status) => {
            outbox.push(true, OpCode::Text, BytesMut::from(status.as_bytes()));
            status_sent = true;
            lease.status_sent();
            log_pinned(&lease);
        }
        Err(why) => {
            why.log();
            lease.status_withheld(why.label());
            withheld = Some(why);
        }
    }
    let mut status_retry = tokio::time::interval_at(Instant::now() + STATUS_RETRY, STATUS_RETRY);
    status_retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut liveness = Liveness::new(ctx.ping_interval, ctx.peer_timeout);
    let mut assembler = Assembler::new(MAX_CLIENT_FRAME);
    let mut acked = false;

    let (outcome, leave) = loop {
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => {
                outbox.push_close(Some(&CloseWith::new(close::GOING_AWAY, "sidecar shutting down")));
                break (ReservationEnd::Shutdown, Leave::Linger);
            }
            reason = lease.ended() => {
                // Zero closes an ended or replaced reservation without a status code (docs/protocol.md, "How a
                // reservation ends").
                outbox.push_close(None);
                break (ReservationEnd::Ended(reason), Leave::Linger);
            }
            _ = status_retry.tick(), if !status_sent => {
                match Box::pin(status_frame(&ctx, version, &mut lease)).await {
                    Ok(status) => {
                        outbox.push(true, OpCode::Text, BytesMut::from(status.as_bytes()));
                        status_sent = true;
                        lease.status_sent();
                        log_pinned(&lease);
                    }
                    Err(why) => {
                        if withheld.as_ref() != Some(&why) {
                            why.log();
                            lease.status_withheld(why.label());
                            withheld = Some(why);
                        }
                    }
                }
            }
            at = liveness.tick() => {
                if liveness.is_silent(at, false) {
                    // Like Zero's terminate(): no close handshake with a peer that stopped answering.
                    break (ReservationEnd::Unresponsive, Leave::Drop);
                }
                outbox.push_control(OpCode::Ping, b"");
            }
            result = outbox.flush(&mut writer), if !outbox.is_empty() => {
                if result.is_err() {
                    break (ReservationEnd::Gone, Leave::Drop);
                }
            }
            result = inbox.read_frame(&mut reader) => {
                let frame = match result {
                    Ok(frame) => frame,
                    Err(ReadError::Protocol(with)) => {
                        debug!(reason = %with.reason, "bad frame");
                        // The stream is unusable after a framing error: close and drop without lingering.
                        outbox.push_close(Some(&with));
                        break (ReservationEnd::ProtocolError(with), Leave::Flush);
                    }
                    Err(ReadError::Gone) => break (ReservationEnd::Gone, Leave::Drop),
                };
                liveness.heard();
                match frame.opcode {
                    OpCode::Ping => outbox.push_control(OpCode::Pong, &frame.payload),
                    OpCode::Pong => {}
                    OpCode::Close => match ws::read_close(frame.payload) {
                        PeerClose::Valid { payload, .. } => {
                            outbox.push(true, OpCode::Close, payload);
                            break (ReservationEnd::ClosedByPeer, Leave::Flush);
                        }
                        PeerClose::Invalid(with) => {
                            outbox.push_close(Some(&with));
                            break (ReservationEnd::ProtocolError(with), Leave::Flush);
                        }
                    },
                    OpCode::Text | OpCode::Binary | OpCode::Continuation => {
                        match read_ack(&mut assembler, &frame, acked || !status_sent) {
                            Ok(ack) => acked |= ack,
                            Err(with) => {
                                outbox.push_close(Some(&with));
                                break (ReservationEnd::ProtocolError(with), Leave::Linger);
                            }
                        }
                    }
                }
            }
        }
    };
    if leave != Leave::Drop && outbox.flush(&mut writer).await.is_ok() && leave == Leave::Linger {
        // Wait briefly for the peer's close so that ours is not lost to a reset.
        let linger = async {
            while let Ok(frame) = inbox.read_frame(&mut reader).await {
                if frame.opcode == OpCode::Close {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(ws::CLOSE_LINGER, linger).await;
    }
    drop(lease);
    info!(outcome = ?outcome, "reservation closed");
    outcome
}

/// Takes a data frame from a reservation client: `Ok(true)` once it completes the ack of the status. Anything
/// else a client may not send is refused with its close: a binary message, a second ack, a broken fragment.
fn read_ack(
    assembler: &mut Assembler,
    frame: &OwnedFrame,
    already_acked: bool,
) -> Result<bool, CloseWith> {
    let read = assembler.push_checked(
        frame.fin,
        frame.opcode,
        &frame.payload,
        |opcode, message| match opcode {
            OpCode::Text => check_ack(message, already_acked),
            _ => Err(CloseWith::new(
                close::UNSUPPORTED_DATA,
                "binary frames are not supported",
            )),
        },
    );
    Ok(read.and_then(Option::transpose)?.is_some())
}

/// The only message a reservation client sends is the ack of the status, id 1, once.
fn check_ack(payload: &[u8], already_acked: bool) -> Result<(), CloseWith> {
    match protocol::decode_ack(payload) {
        Ok(1) if !already_acked => Ok(()),
        Ok(n) => Err(CloseWith::new(
            close::PROTOCOL_ERROR,
            format!("Error: unexpected ack {n}: only the status (message 1) is acknowledged, once"),
        )),
        Err(err) => Err(CloseWith::new(
            close::PROTOCOL_ERROR,
            format!("Error: {err}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/status` and docs/operations.md name the reasons by these labels.
    #[test]
    fn each_reason_for_withholding_has_its_own_label() {
        let labels = [
            Withheld::NoBackup,
            Withheld::NotRestorable,
            Withheld::ChangeDb,
            Withheld::Unservable,
            Withheld::LogPastBackup {
                oldest: "0c".into(),
                newest: "0b".into(),
            },
            Withheld::RestoredLess,
        ]
        .map(|why| why.label());
        assert_eq!(
            labels,
            [
                "no_backup",
                "not_restorable",
                "change_db",
                "unservable",
                "log_past_backup",
                "restored_less"
            ]
        );
    }

    #[test]
    fn only_a_single_ack_of_the_status_is_accepted() {
        assert_eq!(check_ack(br#"{"ack":1}"#, false), Ok(()));
        assert_eq!(
            check_ack(br#"{"ack":1}"#, true).unwrap_err().code,
            close::PROTOCOL_ERROR
        );
        assert_eq!(
            check_ack(br#"{"ack":2}"#, false).unwrap_err().code,
            close::PROTOCOL_ERROR
        );
        assert_eq!(
            check_ack(br#"{"ack":1,"x":1}"#, false).unwrap_err().code,
            close::PROTOCOL_ERROR
        );
    }
}
