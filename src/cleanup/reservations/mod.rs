//! Snapshot reservations: the registry the cleanup policy reads. The `/snapshot` WebSocket that opens and holds
//! them is the streamer's.
//!
//! A reservation protects a view-syncer's restore: while it is open, change-log rows the restored backup may need
//! must stay. It ends when its socket closes, when a retry with the same taskID replaces it, or when the task's
//! first `initial=true` subscription arrives — only that last way proves how long a restore takes, so only it can
//! raise the cleanup delay (docs/protocol.md, "How a reservation ends").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

#[cfg(test)]
mod tests;

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
    /// Why its status is not sent yet, while it waits (`log_past_backup`, `change_db`, ...): a view-syncer
    /// waiting on a pinged socket shows nothing of why. `None` once sent, or before the first try.
    pub withheld: Option<&'static str>,
}

/// See [`Registry::status_facts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusFacts {
    /// The newest backed-up watermark seen: what a restore started now gets at least.
    pub newest_backup: Option<String>,
    /// The backup destination was seen holding something to restore: a status sends a view-syncer to restore from
    /// it, and with nothing there its restore fails (Zero 1.8.0 withholds the status too: docs/protocol.md, "The
    /// snapshot status"). True unless [`Registry::set_restorable`] said otherwise: with `backup.verify` off
    /// nothing is listed.
    pub restorable: bool,
    /// The monitor refuses the deployment ([`crate::cleanup::unservable`]): v4+ statuses wait.
    pub unservable: bool,
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
    /// Where litestream's gauge is, as the monitor last told ([`Registry::saw_backup`]); the monitor's backlog is
    /// the fact's owner. A copy stays here because a reservation opens pinned at it and a gauge going back lowers
    /// the open floors to it: both must happen under this lock, in one step with the reservations, or a reservation
    /// opened between the two would keep a floor above the backup.
    newest_backup: Option<String>,
    /// The destination holds something to restore (always, unless the monitor lists it and found nothing yet). Set
    /// by the monitor from the same listing it publishes in its status; kept here so that a snapshot status is
    /// withheld or sent under the same lock that reads `newest_backup`.
    restorable: bool,
    /// The deployment cannot be served ([`crate::cleanup::unservable`]): v4+ statuses, whose `minWatermark` comes
    /// from a change log nobody may be reading, wait. Set by the monitor alongside its status.
    unservable: bool,
    /// Tasks whose `initial=true` subscription the upstream accepted, and when each was requested, not yet written
    /// to the slot table: that write ends their reservation rows, whichever sidecar opened them.
    subscribed: Vec<(String, Instant)>,
    /// Reservations whose sockets closed, by task and lease, and whether their status had gone out: the slot table
    /// keeps the row of one whose view-syncer may be restoring, and forgets one nobody was told to restore from.
    released: Vec<(String, u64, bool)>,
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
    /// Its status went out: its view-syncer may be restoring from here on.
    sent: bool,
    /// See [`Reservation::withheld`]. Not a change the state file keeps: setting it never waits for a write.
    withheld: Option<&'static str>,
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
                unservable: false,
                subscribed: Vec::new(),
                released: Vec::new(),
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
            sent: false,
            withheld: None,
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
        Ticket(self.lock().next_id, Instant::now())
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
        // Its row in the slot table ends too, whoever opened it (another sidecar, or this one before a restart).
        inner.subscribed.push((task_id.to_string(), requested.1));
        cap(&mut inner.subscribed);
        if inner.open.get(task_id).is_none_or(|e| e.id > requested.0) {
            drop(inner);
            self.changed();
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
                inner.released.push((task_id.to_string(), id, entry.sent));
                cap(&mut inner.released);
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
                withheld: entry.withheld,
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

    /// What a snapshot status goes by, read together under the one lock that the monitor's writes of them take:
    /// the newest backup, whether the destination holds something restorable, and whether the deployment is
    /// refused. Read apart, a status could pair a backup with a listing or a refusal of another moment.
    pub fn status_facts(&self) -> StatusFacts {
        let inner = self.lock();
        StatusFacts {
            newest_backup: inner.newest_backup.clone(),
            restorable: inner.restorable,
            unservable: inner.unservable,
        }
    }

    /// The newest backed-up watermark seen: what a restore started now gets at least.
    pub fn newest_backup(&self) -> Option<String> {
        self.lock().newest_backup.clone()
    }

    /// What the latest listing of the destination found (the monitor's job).
    pub fn set_restorable(&self, restorable: bool) {
        self.lock().restorable = restorable;
    }

    /// Whether the monitor refuses the deployment ([`crate::cleanup::unservable`]): a v4+ status is withheld
    /// meanwhile. False until it says otherwise.
    pub fn is_unservable(&self) -> bool {
        self.lock().unservable
    }

    /// What the monitor's last checks found (its job, as [`Registry::set_restorable`]).
    pub fn set_unservable(&self, unservable: bool) {
        self.lock().unservable = unservable;
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

    fn mark_sent(&self, task_id: &str, id: u64) {
        if let Some(entry) = self.lock().open.get_mut(task_id).filter(|e| e.id == id) {
            entry.sent = true;
            entry.withheld = None;
        }
    }

    fn mark_withheld(&self, task_id: &str, id: u64, why: &'static str) {
        if let Some(entry) = self.lock().open.get_mut(task_id).filter(|e| e.id == id) {
            entry.withheld = Some(why);
        }
    }

    /// The reservations whose sockets closed since the last call: task, lease, and whether their status went out.
    pub fn take_released(&self) -> Vec<(String, u64, bool)> {
        std::mem::take(&mut self.lock().released)
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
                sent: true,
                withheld: None,
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

    /// A state file is kept: until its writer's first write, nothing is durable. Called before the server
    /// accepts a connection; without it a status served before that first write would be called durable
    /// ([`Written::NotKept`], the starting value, releases every waiter) and a crash then would forget its
    /// reservation while the file written next says it knows them all.
    pub fn kept_on_disk(&self) {
        self.durability.written.send_replace(Written::Through(0));
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

    /// The subscriptions not yet written to the slot table, with how long before `now` each was requested.
    pub fn take_subscribed(&self, now: Instant) -> Vec<(String, Duration)> {
        std::mem::take(&mut self.lock().subscribed)
            .into_iter()
            .map(|(task, at)| (task, now.saturating_duration_since(at)))
            .collect()
    }

    /// Puts back subscriptions whose write failed (taken by [`Registry::take_subscribed`] at `now`).
    pub fn put_back_subscribed(&self, subscribed: Vec<(String, Duration)>, now: Instant) {
        let mut inner = self.lock();
        for (task, ago) in subscribed {
            inner
                .subscribed
                .push((task, now.checked_sub(ago).unwrap_or(now)));
        }
    }

    /// Every open reservation as its slot says it: task, lease (unique in this run), floor, protocol.
    pub fn for_slots(&self) -> Vec<(String, u64, Option<String>, u64)> {
        let inner = self.lock();
        let mut list: Vec<_> = inner
            .open
            .iter()
            .map(|(task, e)| (task.clone(), e.id, e.floor.clone(), e.protocol))
            .collect();
        list.sort();
        list
    }

    /// A restore that took `held` (its reservation, opened by any sidecar, ended by its subscription) raises the
    /// cleanup delay to it.
    pub fn learned(&self, held: Duration) {
        let mut inner = self.lock();
        if held > inner.cleanup_delay {
            inner.cleanup_delay = held;
        }
    }

    /// The reservation `task_id` opened as `lease` no longer has a row: its task subscribed through another sidecar,
    /// which ended it there. Ended here too, as by a subscription; `true` if it was still open.
    pub fn ended_elsewhere(&self, task_id: &str, lease: u64) -> bool {
        let mut inner = self.lock();
        if inner.open.get(task_id).is_none_or(|e| e.id != lease) {
            return false;
        }
        let Some(entry) = inner.open.remove(task_id) else {
            return false;
        };
        drop(inner);
        self.changed();
        self.record_duration(entry.started, Instant::now());
        if let Some(end) = entry.end {
            let _ = end.send(EndReason::Subscribed);
        }
        true
    }

    /// `max(30 s, initial delay, longest reservation ended by a subscription)`.
    pub fn cleanup_delay(&self) -> Duration {
        self.lock().cleanup_delay
    }
}

/// At most this many closed reservations and subscriptions wait for the slot table's writer (while the change DB is
/// down): past it the oldest are dropped, and their rows stay as they were, which protects more, never less.
const PENDING_WRITES: usize = 10_000;

fn cap<T>(pending: &mut Vec<T>) {
    if pending.len() > PENDING_WRITES {
        let excess = pending.len() - PENDING_WRITES;
        pending.drain(..excess);
    }
}

/// A point in the registry's history, taken by [`Registry::ticket`]: reservations opened after it are newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64, Instant);

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

    /// Its status went out: from here on its view-syncer may restore, and its slot outlives its socket.
    pub fn status_sent(&self) {
        self.registry.mark_sent(&self.task_id, self.id);
    }

    /// Its status waits, for the reason `why` names (see [`Reservation::withheld`]), until [`Lease::status_sent`].
    pub fn status_withheld(&self, why: &'static str) {
        self.registry.mark_withheld(&self.task_id, self.id, why);
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
