//! Snapshot reservations: the registry the cleanup policy reads, and the `/snapshot` WebSocket: its request
//! checks, its upgrade ([`serve`]) and the socket held open for the reservation.
//!
//! A reservation protects a view-syncer's restore: while it is open, change-log rows the restored backup may need
//! must stay. It ends when its socket closes, when a retry with the same taskID replaces it, or when the task's
//! first `initial=true` subscription arrives — only that last way proves how long a restore takes, so only it can
//! raise the cleanup delay (docs/protocol.md, "How a reservation ends").
//!
//! Requests Zero would reject are refused with HTTP 400 *before* the upgrade, with Zero's own message as the body:
//! a 0.20 view-syncer whose snapshot socket is accepted and then closed without a status waits forever
//! (docs/protocol.md, "A snapshot socket closed before its status"), while a refused upgrade makes it fail and
//! restart.
//!
//! The socket is read, assembled and written with [`crate::net::ws`]'s pieces, as the relay's are: an idle reservation
//! keeps neither a read nor a write buffer, since thousands may wait for hours.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Role, WebSocket};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn};

use crate::net::http::{accept_upgrade, plain, spawn_upgraded};
use crate::net::ws::{
    self, Assembler, CloseWith, Inbox, Liveness, Outbox, OwnedFrame, PeerClose, ReadError, Reads,
};
use crate::protocol::{self, close, Version};

/// Zero's `MIN_CLEANUP_DELAY_MS`: the delay never goes below what a reconnecting subscriber needs.
pub const MIN_CLEANUP_DELAY: Duration = Duration::from_secs(30);

/// Why a reservation's socket is being closed by the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// A new reservation with the same taskID took its place.
    Replaced,
    /// The task's restore finished: its `initial=true` subscription arrived.
    Subscribed,
}

/// An open reservation as the cleanup logic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub task_id: String,
    pub started: Instant,
    /// The newest backed-up watermark known when it opened: the restore it protects yields that backup or a
    /// newer one, so it needs no change-log row below this. `None`: no backup was known yet.
    pub floor: Option<String>,
    /// Opened before the sidecar's last restart and kept from its state file: no socket, honoured until its task
    /// subscribes or `cleanup.restore_limit` has passed since it opened.
    pub kept: bool,
}

/// A reservation as the state file keeps it across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub task_id: String,
    pub floor: Option<String>,
    /// The protocol version of its `/snapshot` request (0: not known).
    pub protocol: u64,
    /// When it opened, by the wall clock.
    pub opened_at: SystemTime,
}

/// Shared registry of open reservations and the cleanup delay. Cheap to clone; the lock is never held across an
/// `.await`.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Mutex<Book>>,
    durability: Arc<Durability>,
    /// Every ended reservation's duration, for `/metrics`.
    durations: prometheus_client::metrics::histogram::Histogram,
}

struct Book {
    next_id: u64,
    open: HashMap<String, Held>,
    cleanup_delay: Duration,
    newest_backup: Option<String>,
    /// The destination holds something to restore (always, unless the monitor lists it and found nothing yet).
    restorable: bool,
}

struct Held {
    /// 0 for a reservation kept from the previous run: older than every [`Ticket`] of this one.
    id: u64,
    started: Instant,
    opened_at: SystemTime,
    protocol: u64,
    floor: Option<String>,
    /// `None` for a kept reservation: there is no socket to close.
    end: Option<oneshot::Sender<EndReason>>,
}

/// What the state file must keep of the registry: bumped at every change of it, and the version the last write
/// made durable. A status is sent only once its reservation is durable (or the write failed): a view-syncer that
/// starts restoring must not depend on a reservation a restart would forget.
struct Durability {
    changed: tokio::sync::watch::Sender<u64>,
    written: tokio::sync::watch::Sender<Written>,
}

/// The outcome of the state file's latest write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Every change up to this version is on disk.
    Through(u64),
    /// Nothing is written (`cleanup.state_file = "none"`) or the last write failed: nobody waits for it.
    NotKept,
}

/// The buckets of the reservation durations: 1 s to ~9 h, as restores take seconds to hours.
pub fn duration_histogram() -> prometheus_client::metrics::histogram::Histogram {
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

impl Registry {
    /// `initial_delay` comes from configuration; it is raised to Zero's 30 s minimum.
    pub fn new(initial_delay: Duration) -> Self {
        Self::with_durations(initial_delay, duration_histogram())
    }

    /// Like [`Registry::new`], observing how long each reservation was held into `durations`.
    pub fn with_durations(
        initial_delay: Duration,
        durations: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        Self {
            durations,
            durability: Arc::new(Durability {
                changed: tokio::sync::watch::Sender::new(0),
                written: tokio::sync::watch::Sender::new(Written::NotKept),
            }),
            inner: Arc::new(Mutex::new(Book {
                next_id: 0,
                open: HashMap::new(),
                cleanup_delay: initial_delay.max(MIN_CLEANUP_DELAY),
                newest_backup: None,
                restorable: true,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A panic while holding this lock leaves plain data behind; keep serving with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a reservation for `task_id`, replacing (and closing) any existing one for the same task.
    pub fn open(&self, task_id: &str, now: Instant) -> Lease {
        self.open_for(task_id, 0, now)
    }

    /// [`Registry::open`] for a `/snapshot` request of `protocol` version, which the state file keeps.
    pub fn open_for(&self, task_id: &str, protocol: u64, now: Instant) -> Lease {
        let (end, ended) = oneshot::channel();
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        let floor = inner.newest_backup.clone();
        let entry = Held {
            id,
            started: now,
            opened_at: SystemTime::now(),
            protocol,
            floor,
            end: Some(end),
        };
        let previous = inner.open.insert(task_id.to_string(), entry);
        drop(inner);
        self.changed();
        if let Some(previous) = previous {
            self.record_duration(previous.started, now);
            if let Some(end) = previous.end {
                let _ = end.send(EndReason::Replaced);
            }
        }
        Lease {
            registry: self.clone(),
            task_id: task_id.to_string(),
            id,
            ended,
        }
    }

    /// Where the registry stands now: a subscription takes one when it is requested, so that it ends only the
    /// reservations that were already open then.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.lock().next_id)
    }

    /// Ends `task_id`'s reservation because its subscription arrived; a restore that took longer than the current
    /// cleanup delay raises it. Returns how long the reservation was held, or `None` if there was none to end.
    ///
    /// Only a reservation opened before the subscription was `requested` is ended: a subscription that the
    /// upstream answers late (or whose client already left and retried with a new restore) must not end the
    /// reservation of the restore that followed it, whose rows are still needed.
    pub fn end_by_subscription(
        &self,
        task_id: &str,
        requested: Ticket,
        now: Instant,
    ) -> Option<Duration> {
        let mut inner = self.lock();
        if inner.open.get(task_id)?.id > requested.0 {
            return None;
        }
        let entry = inner.open.remove(task_id)?;
        // A kept reservation's restore began before the restart: it took at least this long too.
        let held = now.saturating_duration_since(entry.started);
        if held > inner.cleanup_delay {
            inner.cleanup_delay = held;
        }
        drop(inner);
        self.changed();
        self.durations.observe(held.as_secs_f64());
        if let Some(end) = entry.end {
            let _ = end.send(EndReason::Subscribed);
        }
        Some(held)
    }

    fn release(&self, task_id: &str, id: u64) {
        let mut inner = self.lock();
        if inner.open.get(task_id).is_some_and(|entry| entry.id == id) {
            if let Some(entry) = inner.open.remove(task_id) {
                drop(inner);
                self.changed();
                debug!(
                    task_id,
                    floor = entry.floor.as_deref().unwrap_or(""),
                    "reservation released"
                );
                self.record_duration(entry.started, Instant::now());
            }
        }
    }

    fn record_duration(&self, started: Instant, ended: Instant) {
        self.durations
            .observe(ended.saturating_duration_since(started).as_secs_f64());
    }

    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The open reservations, oldest first.
    pub fn open_reservations(&self) -> Vec<Reservation> {
        let inner = self.lock();
        let mut list: Vec<_> = inner
            .open
            .iter()
            .map(|(task_id, entry)| Reservation {
                task_id: task_id.clone(),
                started: entry.started,
                floor: entry.floor.clone(),
                kept: entry.end.is_none(),
            })
            .collect();
        list.sort_by(|a, b| {
            a.started
                .cmp(&b.started)
                .then_with(|| a.task_id.cmp(&b.task_id))
        });
        list
    }

    /// The open reservations in the cleanup policy's terms.
    pub fn for_policy(&self) -> Vec<crate::cleanup::HeldReservation> {
        self.lock()
            .open
            .iter()
            .map(|(task_id, entry)| crate::cleanup::HeldReservation {
                task_id: task_id.clone(),
                floor: entry.floor.clone(),
            })
            .collect()
    }

    /// The newest backed-up watermark seen: what a restore started now gets at least.
    pub fn newest_backup(&self) -> Option<String> {
        self.lock().newest_backup.clone()
    }

    /// Whether the backup destination was seen holding at least one object: a status sends a view-syncer to restore
    /// from it, and with nothing there its restore fails (Zero 1.8.0 withholds the status too: docs/protocol.md,
    /// "The snapshot status").
    /// True unless [`Registry::set_restorable`] said otherwise: with `backup.verify` off nothing is listed.
    pub fn is_restorable(&self) -> bool {
        self.lock().restorable
    }

    /// What the latest listing of the destination found (the monitor's job).
    pub fn set_restorable(&self, restorable: bool) {
        self.lock().restorable = restorable;
    }

    /// Never above the newest backup: a floor computed before the gauge went back (a v4 status built across a
    /// regression, or one put back after a failed read) would protect less than the restore now gets.
    fn set_floor(&self, task_id: &str, id: u64, floor: Option<String>) {
        let mut inner = self.lock();
        let floor = match (floor, inner.newest_backup.clone()) {
            (Some(floor), Some(newest)) => Some(floor.min(newest)),
            (floor, _) => floor,
        };
        if let Some(entry) = inner.open.get_mut(task_id).filter(|e| e.id == id) {
            if entry.floor != floor {
                entry.floor = floor;
                drop(inner);
                self.changed();
            }
        }
    }

    fn floor(&self, task_id: &str, id: u64) -> Option<String> {
        let inner = self.lock();
        inner
            .open
            .get(task_id)
            .filter(|e| e.id == id)
            .and_then(|e| e.floor.clone())
    }

    /// Where litestream's gauge is now: reservations opened from now on are pinned there. It follows the gauge
    /// down as well as up: after a litestream restart on an older generation a restore gets that older backup,
    /// so a floor at the old high would let a purge delete rows the restore needs. For the same reason open
    /// reservations pinned above it are lowered to it (protecting more rows is always safe); returns how many.
    pub fn saw_backup(&self, watermark: &str) -> usize {
        let mut inner = self.lock();
        inner.newest_backup = Some(watermark.to_string());
        let mut lowered = 0;
        for entry in inner.open.values_mut() {
            if let Some(floor) = entry.floor.as_mut().filter(|f| f.as_str() > watermark) {
                *floor = watermark.to_string();
                lowered += 1;
            }
        }
        drop(inner);
        if lowered > 0 {
            self.changed();
        }
        lowered
    }

    /// Where litestream's backup stands is no longer known (it restarted, its page lost its samples): statuses
    /// wait, and reservations opened meanwhile protect every row, until a page shows the gauge again.
    pub fn forget_backup(&self) {
        self.lock().newest_backup = None;
    }

    /// The replica was reset (a resync): what open reservations pinned belongs to the old replica, so each
    /// protects every row from now on, and statuses wait for a backup of the new one.
    pub fn replica_reset(&self) {
        let mut inner = self.lock();
        inner.newest_backup = None;
        for entry in inner.open.values_mut() {
            entry.floor = None;
        }
        drop(inner);
        self.changed();
    }

    /// Takes the reservations the previous run kept, as of `now` and `wall_now`: each is honoured until its task
    /// subscribes through this sidecar, or until [`Registry::expire_kept`] finds it older than any real restore.
    /// Its age counts from its opening by the wall clock, and on from here by the monotonic clock.
    pub fn keep(&self, kept: Vec<Kept>, now: Instant, wall_now: SystemTime) {
        let mut inner = self.lock();
        for k in kept {
            let age = wall_now.duration_since(k.opened_at).unwrap_or_default();
            let entry = Held {
                id: 0,
                // Below the process's start it cannot go: the age then counts from here, longer, never shorter.
                started: now.checked_sub(age).unwrap_or(now),
                opened_at: k.opened_at,
                protocol: k.protocol,
                floor: k.floor,
                end: None,
            };
            inner.open.entry(k.task_id).or_insert(entry);
        }
        drop(inner);
        self.changed();
    }

    /// Ends the kept reservations open `limit` or longer; returns each one's task and age.
    pub fn expire_kept(&self, now: Instant, limit: Duration) -> Vec<(String, Duration)> {
        let mut inner = self.lock();
        let mut expired = Vec::new();
        inner.open.retain(|task_id, entry| {
            let age = now.saturating_duration_since(entry.started);
            let keep = entry.end.is_some() || age < limit;
            if !keep {
                expired.push((task_id.clone(), age));
            }
            keep
        });
        drop(inner);
        if !expired.is_empty() {
            self.changed();
        }
        expired
    }

    /// Every open reservation as the state file keeps it, by task.
    pub fn to_keep(&self) -> Vec<Kept> {
        let inner = self.lock();
        let mut list: Vec<Kept> = inner
            .open
            .iter()
            .map(|(task_id, entry)| Kept {
                task_id: task_id.clone(),
                floor: entry.floor.clone(),
                protocol: entry.protocol,
                opened_at: entry.opened_at,
            })
            .collect();
        list.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        list
    }

    /// Says the registry changed; returns the new version.
    fn changed(&self) -> u64 {
        let mut version = 0;
        self.durability.changed.send_modify(|v| {
            *v += 1;
            version = *v;
        });
        version
    }

    /// The registry's version now, and a receiver that sees every later change (the state file's writer).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durability.changed.subscribe()
    }

    /// What the state file's writer made durable.
    pub fn set_written(&self, written: Written) {
        self.durability.written.send_replace(written);
    }

    /// Waits until the registry as it is now is on disk, at most `limit`; `true` if it is (or nothing is kept).
    pub async fn durable(&self, limit: Duration) -> bool {
        let version = *self.durability.changed.borrow();
        let mut written = self.durability.written.subscribe();
        let reached = async {
            written
                .wait_for(|w| match *w {
                    Written::NotKept => true,
                    Written::Through(through) => through >= version,
                })
                .await
                .is_ok()
        };
        tokio::time::timeout(limit, reached).await.unwrap_or(false)
    }

    /// `max(30 s, initial delay, longest reservation ended by a subscription)`.
    pub fn cleanup_delay(&self) -> Duration {
        self.lock().cleanup_delay
    }
}

/// A point in the registry's history, taken by [`Registry::ticket`]: reservations opened after it are newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// A held reservation. Dropping it removes the reservation unless something else already ended or replaced it,
/// so no exit path of a handler (error, panic, cancellation) can leave one behind.
pub struct Lease {
    registry: Registry,
    task_id: String,
    id: u64,
    ended: oneshot::Receiver<EndReason>,
}

impl Lease {
    /// The watermark this reservation is pinned at now (see [`Reservation::floor`]); read from the registry,
    /// which lowers it when litestream's gauge goes back. `None` as well once the reservation has ended.
    pub fn floor(&self) -> Option<String> {
        self.registry.floor(&self.task_id, self.id)
    }

    /// Moves the floor (`None`: protect every row), never above the newest backup. Purges ask the registry
    /// before every batch, so a floor lowered here holds from the next batch on.
    pub fn set_floor(&mut self, floor: Option<String>) {
        self.registry.set_floor(&self.task_id, self.id, floor);
    }

    /// Resolves when the registry ends this reservation (replaced or subscribed).
    pub async fn ended(&mut self) -> EndReason {
        match (&mut self.ended).await {
            Ok(reason) => reason,
            // The sender is only dropped with the entry, which happens only through `end`.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.registry.release(&self.task_id, self.id);
    }
}

/// Everything a snapshot connection needs besides its socket.
#[derive(Clone)]
pub struct SnapshotContext {
    pub registry: Registry,
    /// Where v4+ statuses read `replicaVersion` and `minWatermark`.
    pub change_db: Option<crate::cleanup::change_db::ChangeDb>,
    pub backup_url: Arc<str>,
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
/// upgraded, the reservation then held on its own task in `tracker`.
pub fn serve(
    mut req: Request<Incoming>,
    version: &Version,
    peer: SocketAddr,
    ctx: &SnapshotContext,
    tracker: &TaskTracker,
) -> Response<Full<Bytes>> {
    let (version, task_id) = match protocol::check_snapshot(version, req.uri().query()) {
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

/// How often a v4+ status that cannot be built yet (change DB not readable) is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(1);

/// Builds the status frame for `version` and pins the reservation where that status needs it; `None` while it
/// cannot be built yet, and the handler tries again (pinging the socket meanwhile).
///
/// Withheld for every version until litestream has reported a backup and (with `backup.verify`) a listing found an
/// object in the destination, as Zero 1.8+ withholds it: a view-syncer handed a status with nothing to restore
/// fails and retries with a new reservation.
///
/// v3's status carries only the backup URL: the reservation keeps the floor it opened with, or the newest backup
/// when none was known then. v4+'s also carries `minWatermark`, from which a view-syncer that keeps its own replica
/// catches up, so the reservation protects every row from there: while the change DB is read the floor is lowered
/// to "everything" (a running purge stops before its next batch, and the read waits for the batch in flight), then
/// set to the lower of the newest backup and the `minWatermark` sent.
async fn status_frame(ctx: &SnapshotContext, version: u64, lease: &mut Lease) -> Option<String> {
    let status = build_status(ctx, version, lease).await?;
    // The view-syncer restores once it has the status: the reservation must survive a restart from then on.
    if !ctx.registry.durable(DURABLE_WAIT).await {
        warn!("snapshot status sent before its reservation reached the state file");
    }
    Some(status)
}

/// How long a status waits for its reservation to reach the state file; a slower disk is logged, not waited for
/// (cleanup holds while the file cannot be written).
const DURABLE_WAIT: Duration = Duration::from_secs(5);

async fn build_status(ctx: &SnapshotContext, version: u64, lease: &mut Lease) -> Option<String> {
    let newest = ctx.registry.newest_backup()?;
    if !ctx.registry.is_restorable() {
        return None;
    }
    if version < 4 {
        if lease.floor().is_none() {
            lease.set_floor(Some(newest));
        }
        return Some(protocol::snapshot_status_v3(&ctx.backup_url));
    }
    let db = ctx.change_db.as_ref()?;
    let pinned = lease.floor();
    lease.set_floor(None);
    let read = async {
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
    };
    let Some((replica_version, min_watermark)) = read.await else {
        lease.set_floor(pinned);
        return None;
    };
    lease.set_floor(Some(newest.min(min_watermark.clone())));
    Some(protocol::snapshot_status_v4(
        &ctx.backup_url,
        &replica_version,
        &min_watermark,
    ))
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

/// Serves one reservation: status frame, then hold the socket open with pings until something ends it. A v4+
/// status that cannot be built yet is held back (the socket is pinged meanwhile) rather than sent incomplete;
/// a reservation is never closed without a status for lack of one.
async fn handle_snapshot<S>(
    ctx: SnapshotContext,
    version: u64,
    task_id: String,
    ws: WebSocket<S>,
) -> ReservationEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut lease = ctx.registry.open_for(&task_id, version, Instant::now());
    info!(
        floor = lease.floor().unwrap_or_default(),
        "reservation opened"
    );
    // The socket is read with a buffer that exists only while bytes are pending, and written through an outbox
    // that keeps none once flushed: an open reservation mostly waits, and thousands may be open at once.
    let (mut reader, mut writer) = tokio::io::split(ws.into_inner());
    let mut inbox = Inbox::new(true, MAX_CLIENT_FRAME, Reads::Small);
    let mut outbox = Outbox::new(Role::Server);
    // v3's status needs nothing but config: it is queued at once, and the loop's first flush writes it. A v4+
    // status that cannot be built yet is retried in the loop below. Boxed: the database read is a large future
    // that idle reservations never need.
    let mut status_sent = false;
    if let Some(status) = Box::pin(status_frame(&ctx, version, &mut lease)).await {
        outbox.push(true, OpCode::Text, BytesMut::from(status.as_bytes()));
        status_sent = true;
        log_pinned(&lease);
    } else if ctx.registry.newest_backup().is_none() {
        info!("snapshot status withheld until litestream reports a first backup");
    } else if !ctx.registry.is_restorable() {
        info!("snapshot status withheld until the backup destination holds a restorable backup");
    } else {
        info!("snapshot status held back until the change DB answers");
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
                if let Some(status) = Box::pin(status_frame(&ctx, version, &mut lease)).await {
                    outbox.push(true, OpCode::Text, BytesMut::from(status.as_bytes()));
                    status_sent = true;
                    log_pinned(&lease);
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

    fn at(secs: u64) -> Instant {
        // A fixed base keeps the arithmetic readable; Instant has no zero.
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    #[test]
    fn delay_starts_at_thirty_seconds_or_the_configured_value() {
        assert_eq!(
            Registry::new(Duration::from_secs(5)).cleanup_delay(),
            MIN_CLEANUP_DELAY
        );
        assert_eq!(
            Registry::new(Duration::from_secs(240)).cleanup_delay(),
            Duration::from_secs(240)
        );
    }

    #[tokio::test]
    async fn subscription_end_raises_the_delay_only_when_longer() {
        let registry = Registry::new(Duration::from_secs(100));
        let mut lease = registry.open("t1", at(0));
        assert_eq!(
            registry.end_by_subscription("t1", registry.ticket(), at(125)),
            Some(Duration::from_secs(125))
        );
        assert_eq!(lease.ended().await, EndReason::Subscribed);
        assert_eq!(registry.cleanup_delay(), Duration::from_secs(125));
        assert!(registry.is_empty());

        let _short = registry.open("t2", at(200));
        assert_eq!(
            registry.end_by_subscription("t2", registry.ticket(), at(210)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(registry.cleanup_delay(), Duration::from_secs(125));
        assert_eq!(
            registry.end_by_subscription("unknown", registry.ticket(), at(300)),
            None
        );
    }

    #[tokio::test]
    async fn retry_replaces_and_leaves_the_delay_alone() {
        let registry = Registry::new(Duration::ZERO);
        let mut first = registry.open("t1", at(0));
        let second = registry.open("t1", at(500));
        assert_eq!(first.ended().await, EndReason::Replaced);
        assert_eq!(registry.len(), 1);
        // The replaced lease going away must not remove its successor.
        drop(first);
        assert_eq!(
            registry.open_reservations(),
            vec![Reservation {
                task_id: "t1".into(),
                started: at(500),
                floor: None,
                kept: false,
            }]
        );
        assert_eq!(registry.cleanup_delay(), MIN_CLEANUP_DELAY);
        drop(second);
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn a_subscription_ends_only_a_reservation_opened_before_it_was_requested() {
        let registry = Registry::new(Duration::ZERO);
        let requested = registry.ticket();
        // The restore retried: a new reservation for the task opened while the old subscription was pending.
        let mut newer = registry.open("t1", at(10));
        assert_eq!(registry.end_by_subscription("t1", requested, at(20)), None);
        assert_eq!(registry.len(), 1);
        assert_eq!(registry.cleanup_delay(), MIN_CLEANUP_DELAY);
        // The subscription that follows it ends it.
        let after = registry.ticket();
        assert_eq!(
            registry.end_by_subscription("t1", after, at(70)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(newer.ended().await, EndReason::Subscribed);
        assert!(registry.is_empty());
    }

    #[test]
    fn dropping_a_lease_ends_the_reservation_without_touching_the_delay() {
        let registry = Registry::new(Duration::ZERO);
        let lease = registry.open("t1", at(0));
        let _other = registry.open("t2", at(1));
        drop(lease);
        assert_eq!(registry.len(), 1);
        assert_eq!(
            registry.end_by_subscription("t1", registry.ticket(), at(1000)),
            None
        );
        assert_eq!(registry.cleanup_delay(), MIN_CLEANUP_DELAY);
    }

    fn floors(registry: &Registry) -> Vec<Option<String>> {
        registry
            .open_reservations()
            .into_iter()
            .map(|r| r.floor)
            .collect()
    }

    #[test]
    fn reservations_are_pinned_where_the_gauge_is_when_they_open() {
        let registry = Registry::new(Duration::ZERO);
        let _early = registry.open("early", at(0));
        registry.saw_backup("0b");
        let _middle = registry.open("middle", at(1));
        registry.saw_backup("110");
        let _late = registry.open("late", at(2));
        assert_eq!(
            floors(&registry),
            [None, Some("0b".into()), Some("110".into())]
        );
    }

    #[test]
    fn a_gauge_going_back_lowers_new_and_open_floors_to_it() {
        let registry = Registry::new(Duration::ZERO);
        let floorless = registry.open("floorless", at(0));
        registry.saw_backup("0b");
        let low = registry.open("low", at(1));
        registry.saw_backup("0d");
        let high = registry.open("high", at(2));
        assert_eq!(high.floor().as_deref(), Some("0d"));

        // Litestream restarted on an older generation: a restore now gets 0c.
        assert_eq!(registry.saw_backup("0c"), 1);
        assert_eq!(registry.newest_backup().as_deref(), Some("0c"));
        let during = registry.open("during", at(3));
        assert_eq!(
            floors(&registry),
            [
                None,
                Some("0b".into()),
                Some("0c".into()),
                Some("0c".into())
            ]
        );
        // The lease sees the lowered floor, and cannot put the old one back.
        assert_eq!(high.floor().as_deref(), Some("0c"));
        let mut high = high;
        high.set_floor(Some("0d".into()));
        assert_eq!(high.floor().as_deref(), Some("0c"));
        // Back up again: floors stay where they were lowered to (they protect more, never less).
        assert_eq!(registry.saw_backup("0e"), 0);
        assert_eq!(
            floors(&registry),
            [
                None,
                Some("0b".into()),
                Some("0c".into()),
                Some("0c".into())
            ]
        );
        drop((floorless, low, during));
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

/// Statuses protect what they announce, over any interleaving of reservations, the two steps of building a v4+
/// status (protect everything, then read `min(watermark)` and pin there, as `status_frame` does), batched purges
/// that ask the registry before every batch (as `ChangeDb::purge_within` does) and new change-log rows: no row at
/// or above an open reservation's announced `minWatermark` is ever deleted.
#[cfg(test)]
mod announced_floors {
    use super::*;
    use proptest::prelude::*;

    use crate::cleanup::{ceiling, Ceiling, ReservationMode};

    /// A status handler's state: its lease, what it read, and what it announced.
    type Handler = (Lease, Option<String>, Option<String>);

    #[derive(Debug, Clone)]
    enum Step {
        /// A view-syncer opens a reservation (task `n % 4`).
        Open(usize),
        /// Its status handler protects everything before reading the change DB.
        Protect(usize),
        /// It reads `min(watermark)` (a purge batch may run before the next step).
        Read(usize),
        /// It pins the reservation at what it read and announces it.
        Announce(usize),
        /// Its socket closes.
        Close(usize),
        /// A purge towards the `n`th row's watermark starts; its batches run as `Batch` steps.
        StartPurge(usize),
        /// One batch of the running purge: at most two rows.
        Batch,
        /// A new transaction is stored.
        Append,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => (0..4usize).prop_map(Step::Open),
            1 => (0..4usize).prop_map(Step::Protect),
            1 => (0..4usize).prop_map(Step::Read),
            1 => (0..4usize).prop_map(Step::Announce),
            1 => (0..4usize).prop_map(Step::Close),
            1 => (0..40usize).prop_map(Step::StartPurge),
            3 => Just(Step::Batch),
            1 => Just(Step::Append),
        ]
    }

    proptest! {
        #[test]
        fn no_row_at_or_above_an_announced_min_watermark_is_purged(steps in prop::collection::vec(step(), 1..120)) {
            let registry = Registry::new(Duration::from_secs(30));
            registry.saw_backup("zz");
            // The change log: sorted watermarks, each of the same width so that byte order is numeric order.
            let mut log: Vec<String> = (0..10).map(|i| format!("{i:04}")).collect();
            let mut next = 10;
            // Per task: the lease, what its handler read, and what it announced.
            let mut leases: Vec<Option<Handler>> = (0..4).map(|_| None).collect();
            let mut purge: Option<String> = None;
            for (n, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Open(t) => {
                        leases[t] = Some((registry.open(&format!("t{t}"), at(n as u64)), None, None));
                    }
                    Step::Protect(t) => {
                        if let Some((lease, _, _)) = leases[t].as_mut() {
                            lease.set_floor(None);
                        }
                    }
                    Step::Read(t) => {
                        if let Some((lease, read, _)) = leases[t].as_mut() {
                            // Only once protected, as the handler does.
                            if lease.floor().is_none() {
                                *read = Some(log.first().cloned().unwrap_or_else(|| "0000".into()));
                            }
                        }
                    }
                    Step::Announce(t) => {
                        if let Some((lease, read, announced)) = leases[t].as_mut() {
                            if let Some(min) = read.take() {
                                lease.set_floor(Some(min.clone()));
                                *announced = Some(min);
                            }
                        }
                    }
                    Step::Close(t) => leases[t] = None,
                    Step::StartPurge(i) => purge = log.get(i).cloned(),
                    Step::Batch => {
                        if let Some(before) = purge.clone() {
                            let target = match ceiling(ReservationMode::Pin, &registry.for_policy()) {
                                Ceiling::None => Some(before),
                                Ceiling::Everything => None,
                                Ceiling::Below(floor) => Some(floor.min(before)),
                            };
                            match target {
                                None => purge = None,
                                Some(target) => {
                                    let doomed = log.iter().take_while(|w| **w < target).take(2).count();
                                    log.drain(..doomed);
                                    if doomed < 2 {
                                        purge = None;
                                    }
                                }
                            }
                        }
                    }
                    Step::Append => {
                        log.push(format!("{next:04}"));
                        next += 1;
                    }
                }
                for (lease, _, announced) in leases.iter().flatten() {
                    if let Some(announced) = announced {
                        // Every row from the announced watermark on is still there: the first row left is at or
                        // below it (rows are only ever removed from the front).
                        prop_assert!(
                            log.first().is_some_and(|first| first <= announced),
                            "{} announced {announced}, the log now starts at {:?}",
                            lease.task_id,
                            log.first()
                        );
                    }
                }
            }
        }
    }

    fn at(secs: u64) -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    #[tokio::test]
    async fn kept_reservations_hold_until_their_task_subscribes_or_the_limit_passes() {
        let registry = Registry::new(Duration::ZERO);
        let wall_now = SystemTime::now();
        let kept = |task: &str, floor: Option<&str>, age: u64| Kept {
            task_id: task.into(),
            floor: floor.map(Into::into),
            protocol: 6,
            opened_at: wall_now - Duration::from_secs(age),
        };
        registry.keep(
            vec![
                kept("a", Some("0c"), 100),
                kept("b", None, 3000),
                kept("c", Some("0d"), 10),
            ],
            at(10_000),
            wall_now,
        );
        let mut policy = registry.for_policy();
        policy.sort_by(|x, y| x.task_id.cmp(&y.task_id));
        assert_eq!(
            policy.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["a=0c", "b=none", "c=0d"]
        );
        assert!(registry.open_reservations().iter().all(|r| r.kept));
        // Their ages count from when they opened: "b" passes an hour first, then "a"; time here, not the wall.
        assert_eq!(
            registry.expire_kept(at(10_000), Duration::from_secs(3600)),
            vec![]
        );
        assert_eq!(
            registry.expire_kept(at(10_600), Duration::from_secs(3600)),
            vec![("b".to_string(), Duration::from_secs(3600))]
        );
        // Its task's subscription ends one, with how long its restore took across the restart.
        assert_eq!(
            registry.end_by_subscription("a", registry.ticket(), at(10_200)),
            Some(Duration::from_secs(300))
        );
        assert_eq!(registry.cleanup_delay(), Duration::from_secs(300));
        // A retry of the same task replaces a kept one; the new one is of this run.
        let lease = registry.open_for("c", 4, at(10_300));
        assert_eq!(registry.open_reservations().len(), 1);
        assert!(!registry.open_reservations()[0].kept);
        // Nothing this run opened expires by age.
        assert_eq!(
            registry.expire_kept(at(99_999), Duration::from_secs(1)),
            vec![]
        );
        let to_keep = registry.to_keep();
        assert_eq!(to_keep.len(), 1);
        assert_eq!((to_keep[0].task_id.as_str(), to_keep[0].protocol), ("c", 4));
        drop(lease);
        assert!(registry.to_keep().is_empty());
    }

    #[tokio::test]
    async fn a_status_waits_until_its_reservation_is_durable() {
        let registry = Registry::new(Duration::ZERO);
        // Nothing kept: nobody waits.
        assert!(registry.durable(Duration::from_secs(5)).await);
        let mut changes = registry.changes();
        registry.set_written(Written::Through(*changes.borrow_and_update()));
        let _lease = registry.open("t1", Instant::now());
        assert!(changes.has_changed().unwrap());
        let version = *changes.borrow_and_update();
        // Not written yet: the wait ends at its limit, unanswered.
        assert!(!registry.durable(Duration::from_millis(50)).await);
        let waiter = {
            let registry = registry.clone();
            tokio::spawn(async move { registry.durable(Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        registry.set_written(Written::Through(version));
        assert!(waiter.await.unwrap());
        // A failed write releases waiters too (cleanup holds for it instead).
        let _other = registry.open("t2", Instant::now());
        registry.set_written(Written::NotKept);
        assert!(registry.durable(Duration::from_secs(5)).await);
    }

    #[test]
    fn a_reset_replica_leaves_every_reservation_protecting_every_row() {
        let registry = Registry::new(Duration::ZERO);
        registry.saw_backup("0c");
        let _a = registry.open("a", at(0));
        registry.replica_reset();
        assert_eq!(registry.for_policy()[0].floor, None);
        assert_eq!(registry.newest_backup(), None);
        let _b = registry.open("b", at(1));
        assert!(registry.for_policy().iter().all(|r| r.floor.is_none()));
    }
}
