//! The registry, the subscriber tracker and the cleanup policy together, over random interleavings: nothing an
//! open reservation or a tracked subscriber still needs is ever purged.
//!
//! `decide` has its own property test over plain inputs (src/cleanup.rs); this one drives the real [`Registry`],
//! [`Subscribers`] and [`Backlog`] the way the sidecar's tasks do, with tokio's paused clock and a simulated wall
//! clock, and lets their steps interleave where the tasks can: a relay registers its subscriber and then ends its
//! task's reservation while the monitor gathers reservations and then subscribers, a v4 status handler protects
//! everything, reads `min(watermark)` and then pins, and a purge re-asks the ceiling before each batch while
//! everything else goes on. What each actor needs is kept by the model itself, from the protocol rather than from
//! the code under test, and checked after every step.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use tokio::time::Instant;

use litestream_sidecar::cleanup::{
    self, Backlog, Ceiling, Decision, HeldReservation, Inputs, Ownership, ReservationMode,
    WithoutSubscribers,
};
use litestream_sidecar::monitor::purge_limit;
use litestream_sidecar::protocol::Mode;
use litestream_sidecar::reservations::{Lease, Registry, Ticket};
use litestream_sidecar::subscribers::{SubscriberHandle, SubscriberInfo, Subscribers};

/// View-syncer tasks: few, so that retries with the same taskID are common.
const TASKS: usize = 3;

#[derive(Debug, Clone)]
enum Event {
    /// A transaction is stored, `step` positions after the last.
    Commit(u64),
    /// Litestream backs up the newest transaction, `lag` seconds ago by its clock, and the monitor scrapes it.
    Backup {
        lag: u64,
    },
    /// Litestream restarts on an older generation: the gauge goes back to an earlier backup still in the log.
    Regress {
        pick: usize,
        lag: u64,
    },
    /// A view-syncer opens a reservation for `task` (replacing its previous one, as a retry does).
    Open {
        task: usize,
        v4: bool,
    },
    /// An open reservation's status handler takes its next `steps` steps (v3: one; v4: protect, read, pin).
    Status {
        held: usize,
        steps: usize,
        read_fails: bool,
    },
    /// An open reservation's socket closes.
    Close(usize),
    /// An open reservation's view-syncer, restored, asks for its `initial=true` subscription; a v4 one may catch
    /// up from its own replica at or above the announced `minWatermark`.
    Request {
        held: usize,
        own_replica: bool,
        pick: usize,
    },
    /// The upstream answers a pending subscription: its relay registers the subscriber, then ends the task's
    /// reservation (`both`: in one go, else the end at the next answer).
    Answer {
        pending: usize,
        both: bool,
    },
    /// A subscriber that restores nothing (a replication manager's backup replicator) connects at the head.
    Join,
    /// A connected subscriber acknowledges a commit.
    Ack {
        sub: usize,
        pick: usize,
    },
    /// A connected subscriber's connection ends.
    Leave(usize),
    /// A departed subscriber still tracked comes back from its acked watermark.
    Reconnect(usize),
    /// The upstream drops every subscription.
    UpstreamLost,
    /// A new subscription cannot reach the upstream.
    UpstreamUnreachable,
    Advance(u64),
    /// The monitor's next step: gather reservations, then gather subscribers and decide, then one purge batch at
    /// a time.
    Monitor,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (1..40u64).prop_map(Event::Commit),
        3 => (0..90u64).prop_map(|lag| Event::Backup { lag }),
        1 => (any::<usize>(), 0..90u64).prop_map(|(pick, lag)| Event::Regress { pick, lag }),
        3 => (0..TASKS, any::<bool>()).prop_map(|(task, v4)| Event::Open { task, v4 }),
        4 => (any::<usize>(), 1..4usize, prop::bool::weighted(0.2))
            .prop_map(|(held, steps, read_fails)| Event::Status { held, steps, read_fails }),
        1 => any::<usize>().prop_map(Event::Close),
        3 => (any::<usize>(), any::<bool>(), any::<usize>())
            .prop_map(|(held, own_replica, pick)| Event::Request { held, own_replica, pick }),
        5 => (any::<usize>(), any::<bool>()).prop_map(|(pending, both)| Event::Answer { pending, both }),
        2 => Just(Event::Join),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(sub, pick)| Event::Ack { sub, pick }),
        2 => any::<usize>().prop_map(Event::Leave),
        2 => any::<usize>().prop_map(Event::Reconnect),
        1 => Just(Event::UpstreamLost),
        1 => Just(Event::UpstreamUnreachable),
        4 => (1..60u64).prop_map(Event::Advance),
        6 => Just(Event::Monitor),
    ]
}

/// The policy's settings for one history.
#[derive(Debug, Clone)]
struct Settings {
    mode: ReservationMode,
    without_subscribers: WithoutSubscribers,
    initial_delay: Duration,
    grace: Duration,
    batch_rows: usize,
    /// The replica version, and the first position of the change log.
    start: u64,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        prop_oneof![4 => Just(ReservationMode::Pin), 1 => Just(ReservationMode::Pause)],
        prop_oneof![
            Just(WithoutSubscribers::Hold),
            Just(WithoutSubscribers::AfterGrace)
        ],
        0..90u64,
        0..60u64,
        1..4usize,
        1..40u64,
    )
        .prop_map(
            |(mode, without_subscribers, delay, grace, batch_rows, start)| Settings {
                mode,
                without_subscribers,
                initial_delay: Duration::from_secs(delay),
                grace: Duration::from_secs(grace),
                batch_rows,
                start,
            },
        )
}

/// The LexiVersion of `n` (PROTOCOL.md §2): watermarks of varying length that sort byte-wise as numbers.
fn lexi(n: u64) -> String {
    let mut digits = Vec::new();
    let mut rest = n;
    loop {
        digits.push(std::char::from_digit((rest % 36) as u32, 36).unwrap());
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(std::char::from_digit(digits.len() as u32 - 1, 36).unwrap());
    digits.iter().rev().collect()
}

/// An open reservation, and what its view-syncer needs: every row at or above `need` (`None`: every row).
struct Held {
    lease: Lease,
    /// The model's own name for it, so that a subscription knows which reservation it was requested under.
    serial: u64,
    v4: bool,
    need: Option<String>,
    status: StatusStep,
    /// Where its replica stands once restored (or caught up): every subscription it asks for starts there.
    restored: Option<String>,
}

/// Where a reservation's status handler is (`status_frame` in src/reservations.rs).
#[derive(Debug, Clone, PartialEq)]
enum StatusStep {
    NotSent,
    /// v4: the floor was lowered to "everything"; `pinned` is the one before, `newest` the backup read first.
    Protected {
        pinned: Option<String>,
        newest: String,
    },
    /// v4: `min(watermark)` was read.
    Read {
        newest: String,
        min: String,
    },
    /// Sent; v4 announced `min`.
    Sent {
        min: Option<String>,
    },
}

/// An `initial=true` subscription between its request and the end of its task's reservation.
struct Pending {
    task: usize,
    serial: u64,
    ticket: Ticket,
    watermark: String,
    /// The index of its subscriber once registered.
    registered: Option<usize>,
    /// Its view-syncer gave up on this restore (closed or retried the reservation): nothing waits for it.
    orphan: bool,
}

/// A subscriber as the relay holds it and as the model judges it.
struct Sub {
    handle: Option<SubscriberHandle>,
    acked: String,
    /// False for an orphan, and for one that reconnected (the new connection is another entry).
    needed: bool,
    /// From when its reconnect grace runs, once departed.
    grace_from: Option<Instant>,
    /// Departed within its grace, then the upstream was lost: it waits for the upstream's return.
    kept: bool,
}

enum MonitorStep {
    Idle,
    /// Reservations gathered; subscribers not yet.
    Gathered {
        cleanup_delay: Duration,
        reservations: Vec<HeldReservation>,
    },
    Purging {
        before: String,
        reserved: bool,
    },
}

struct World {
    settings: Settings,
    registry: Registry,
    subscribers: Subscribers,
    backlog: Backlog,
    started: Instant,
    /// Seconds since the start, on litestream's (wall) clock.
    wall_secs: u64,
    /// The change log, sorted.
    log: Vec<String>,
    /// Every watermark ever committed, in order.
    history: Vec<String>,
    /// The highest watermark ever deleted.
    deleted: Option<String>,
    /// Every watermark the gauge reported.
    reported: Vec<String>,
    /// Where the gauge is (as last scraped: a scrape follows every move in this model).
    gauge: Option<String>,
    held: Vec<Option<Held>>,
    next_serial: u64,
    pending: Vec<Pending>,
    subs: Vec<Sub>,
    upstream_lost: bool,
    monitor: MonitorStep,
    purges: usize,
}

impl World {
    fn new(settings: Settings) -> Self {
        let rv = lexi(settings.start);
        World {
            registry: Registry::new(settings.initial_delay),
            subscribers: Subscribers::default(),
            backlog: Backlog::default(),
            started: Instant::now(),
            wall_secs: 0,
            log: vec![rv.clone()],
            history: vec![rv],
            deleted: None,
            reported: vec![],
            gauge: None,
            held: (0..TASKS).map(|_| None).collect(),
            next_serial: 0,
            pending: vec![],
            subs: vec![],
            upstream_lost: false,
            monitor: MonitorStep::Idle,
            purges: 0,
            settings,
        }
    }

    fn head(&self) -> &str {
        self.history.last().unwrap()
    }

    fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000 + self.wall_secs)
    }

    fn tracked(&self, sub: &Sub) -> bool {
        match sub.grace_from {
            None => true,
            Some(from) => {
                sub.kept || Instant::now().saturating_duration_since(from) < self.settings.grace
            }
        }
    }

    /// The monitor scraping a page whose gauge is at `watermark`, as `Monitor::scrape` passes it on.
    fn scrape(&mut self, watermark: String, lag: u64) {
        let backed_up_at = self.wall() - Duration::from_secs(lag);
        self.backlog.observe(&[(watermark.as_str(), backed_up_at)]);
        if let Some(current) = self.backlog.current() {
            self.registry.saw_backup(&current.watermark);
        }
        // A restore started from now on gets this backup, whatever a reservation was promised before.
        for held in self.held.iter_mut().flatten() {
            if let Some(need) = held.need.as_mut().filter(|n| **n > watermark) {
                *need = watermark.clone();
            }
        }
        self.reported.push(watermark.clone());
        self.gauge = Some(watermark);
    }

    /// A relay reached the upstream.
    fn reached(&mut self) {
        let now = Instant::now();
        self.subscribers.upstream_reached(now);
        if std::mem::take(&mut self.upstream_lost) {
            for sub in self.subs.iter_mut().filter(|s| s.kept) {
                sub.kept = false;
                sub.grace_from = sub.grace_from.map(|from| from.max(now));
            }
        }
    }

    fn lost(&mut self) {
        self.subscribers.upstream_lost();
        self.upstream_lost = true;
        for i in 0..self.subs.len() {
            if self.subs[i].grace_from.is_some() && self.tracked(&self.subs[i]) {
                self.subs[i].kept = true;
            }
        }
    }

    fn depart(&mut self, i: usize) {
        let sub = &mut self.subs[i];
        sub.handle = None;
        sub.grace_from = Some(Instant::now());
        sub.kept = self.upstream_lost;
    }

    /// Ends the model's reservation of `task`; its pending subscriptions are left without a client.
    fn drop_held(&mut self, task: usize) {
        if let Some(held) = self.held[task].take() {
            for p in self.pending.iter_mut().filter(|p| p.serial == held.serial) {
                p.orphan = true;
            }
        }
    }

    fn connect(&mut self, id: String, task: Option<usize>, watermark: String, needed: bool) {
        let handle = self.subscribers.connect(SubscriberInfo {
            id,
            task_id: task.map(|t| format!("t{t}")),
            mode: Mode::Serving,
            replica_version: lexi(self.settings.start),
            watermark: watermark.clone(),
        });
        self.subs.push(Sub {
            handle: Some(handle),
            acked: watermark,
            needed,
            grace_from: None,
            kept: false,
        });
    }

    /// The task of the `pick`th open reservation, if any is open.
    fn open_task(&self, pick: usize) -> Option<usize> {
        let open: Vec<usize> = (0..TASKS).filter(|&t| self.held[t].is_some()).collect();
        open.get(pick % open.len().max(1)).copied()
    }

    /// One step of `status_frame` (src/reservations.rs) for `task`'s reservation.
    fn status_step(&mut self, task: usize, read_fails: bool) {
        let first = self.log[0].clone();
        let gauge = self.gauge.clone();
        let Some(held) = self.held[task].as_mut() else {
            return;
        };
        // Withheld until litestream reported a backup.
        let Some(newest) = gauge else {
            return;
        };
        match held.status.clone() {
            StatusStep::NotSent if !held.v4 => {
                if held.lease.floor().is_none() {
                    held.lease.set_floor(Some(newest.clone()));
                }
                held.need.get_or_insert(newest);
                held.status = StatusStep::Sent { min: None };
            }
            StatusStep::NotSent => {
                let pinned = held.lease.floor();
                held.lease.set_floor(None);
                held.status = StatusStep::Protected { pinned, newest };
            }
            StatusStep::Protected { pinned, .. } if read_fails => {
                held.lease.set_floor(pinned);
                held.status = StatusStep::NotSent;
            }
            StatusStep::Protected { newest, .. } => {
                held.status = StatusStep::Read { newest, min: first };
            }
            StatusStep::Read { newest, min } => {
                held.lease.set_floor(Some(newest.min(min.clone())));
                // It catches up from its own replica at or above `min`, or restores the backup there now (or an
                // older one, should the gauge go back).
                let now = self.gauge.clone().unwrap_or_default();
                held.need = Some(min.clone().min(now));
                held.status = StatusStep::Sent { min: Some(min) };
            }
            StatusStep::Sent { .. } => {}
        }
    }

    /// One step of the relay's `on_subscribed` for the `i`th pending subscription: registers its subscriber, or
    /// (once registered) ends its task's reservation. Returns whether the subscription is still pending.
    fn answer_step(&mut self, i: usize) -> bool {
        match self.pending[i].registered {
            None => {
                let p = &self.pending[i];
                let (id, task, watermark, needed) = (
                    format!("vs{}-{}", p.task, p.serial),
                    p.task,
                    p.watermark.clone(),
                    !p.orphan,
                );
                self.connect(id, Some(task), watermark, needed);
                self.pending[i].registered = Some(self.subs.len() - 1);
                true
            }
            Some(_) => {
                let p = self.pending.remove(i);
                self.registry.end_by_subscription(
                    &format!("t{}", p.task),
                    p.ticket,
                    Instant::now(),
                );
                if !p.orphan {
                    // The snapshot socket closes; the subscriber carries on from here.
                    self.held[p.task] = None;
                }
                false
            }
        }
    }

    async fn apply(&mut self, event: &Event) -> Result<(), TestCaseError> {
        let idle = matches!(self.monitor, MonitorStep::Idle);
        match *event {
            Event::Commit(step) => {
                let next = self.settings.start + self.history.len() as u64 * 40 + step;
                let watermark = lexi(next);
                self.log.push(watermark.clone());
                self.history.push(watermark);
            }
            // Scrapes happen in the monitor's loop, never during its check or purge.
            Event::Backup { lag } if idle => {
                let head = self.head().to_owned();
                if self.gauge.as_deref() != Some(head.as_str()) {
                    self.scrape(head, lag);
                }
            }
            Event::Regress { pick, lag } if idle => {
                // Only to a backup whose rows are all still there: a gauge going back below a purge would make any
                // restore from it impossible, whatever the sidecar did.
                let first = self.log[0].clone();
                let gauge = self.gauge.clone().unwrap_or_default();
                let older: Vec<String> = self
                    .reported
                    .iter()
                    .filter(|w| **w >= first && **w < gauge)
                    .cloned()
                    .collect();
                if !older.is_empty() {
                    self.scrape(older[pick % older.len()].clone(), lag);
                }
            }
            Event::Backup { .. } | Event::Regress { .. } => {}
            Event::Open { task, v4 } => {
                let lease = self.registry.open(&format!("t{task}"), Instant::now());
                // A retry: the old reservation was replaced, its socket closes.
                self.drop_held(task);
                self.next_serial += 1;
                self.held[task] = Some(Held {
                    lease,
                    serial: self.next_serial,
                    v4,
                    need: self.gauge.clone(),
                    status: StatusStep::NotSent,
                    restored: None,
                });
            }
            Event::Status {
                held,
                steps,
                read_fails,
            } => {
                if let Some(task) = self.open_task(held) {
                    for _ in 0..steps {
                        self.status_step(task, read_fails);
                    }
                }
            }
            Event::Close(held) => {
                if let Some(task) = self.open_task(held) {
                    self.drop_held(task);
                }
            }
            Event::Request {
                held,
                own_replica,
                pick,
            } => {
                let Some(task) = self.open_task(held) else {
                    return Ok(());
                };
                let held = self.held[task].as_ref().unwrap();
                let StatusStep::Sent { min } = &held.status else {
                    return Ok(());
                };
                // One subscription at a time per restore (another only once the upstream failed the first).
                if self.pending.iter().any(|p| p.serial == held.serial) {
                    return Ok(());
                }
                let watermark = match (&held.restored, min) {
                    (Some(restored), _) => restored.clone(),
                    (None, Some(min)) if own_replica => {
                        let from: Vec<&String> =
                            self.history.iter().filter(|w| *w >= min).collect();
                        from[pick % from.len()].clone()
                    }
                    // The backup it restored: where the gauge is (nothing tells it which one came first).
                    (None, _) => self.gauge.clone().unwrap_or_default(),
                };
                let serial = held.serial;
                self.held[task].as_mut().unwrap().restored = Some(watermark.clone());
                // As the relay does: the ticket first, then the upstream connection.
                let ticket = self.registry.ticket();
                self.reached();
                self.pending.push(Pending {
                    task,
                    serial,
                    ticket,
                    watermark,
                    registered: None,
                    orphan: false,
                });
            }
            Event::Answer { pending, both } if !self.pending.is_empty() => {
                let i = pending % self.pending.len();
                if self.answer_step(i) && both {
                    self.answer_step(i);
                }
            }
            Event::Answer { .. } => {}
            Event::Join => {
                self.reached();
                let head = self.head().to_owned();
                let id = format!("rm{}", self.subs.len());
                self.connect(id, None, head, true);
            }
            Event::Ack { sub, pick } => {
                let connected: Vec<usize> = (0..self.subs.len())
                    .filter(|&i| self.subs[i].handle.is_some())
                    .collect();
                if let Some(&i) = connected.get(sub % connected.len().max(1)) {
                    let ahead: Vec<&String> = self
                        .history
                        .iter()
                        .filter(|w| **w > self.subs[i].acked)
                        .collect();
                    if !ahead.is_empty() {
                        let watermark = ahead[pick % ahead.len()].clone();
                        self.subs[i].handle.as_ref().unwrap().ack(&watermark);
                        self.subs[i].acked = watermark;
                    }
                }
            }
            Event::Leave(sub) => {
                let connected: Vec<usize> = (0..self.subs.len())
                    .filter(|&i| self.subs[i].handle.is_some())
                    .collect();
                if let Some(&i) = connected.get(sub % connected.len().max(1)) {
                    self.depart(i);
                }
            }
            Event::Reconnect(sub) => {
                let back: Vec<usize> = (0..self.subs.len())
                    .filter(|&i| {
                        let s = &self.subs[i];
                        s.handle.is_none() && s.needed && self.tracked(s)
                    })
                    .collect();
                if let Some(&i) = back.get(sub % back.len().max(1)) {
                    self.reached();
                    self.subs[i].needed = false;
                    let acked = self.subs[i].acked.clone();
                    self.connect(format!("again{i}"), None, acked, true);
                }
            }
            Event::UpstreamLost => {
                // As the relay does: the upstream is marked lost, then the subscription ends.
                self.lost();
                for i in 0..self.subs.len() {
                    if self.subs[i].handle.is_some() {
                        self.depart(i);
                    }
                }
                // Subscriptions not answered yet fail; their view-syncers keep their reservations and retry.
                self.pending.retain(|p| p.registered.is_some());
            }
            Event::UpstreamUnreachable => self.lost(),
            // Gathering takes no time.
            Event::Advance(secs) if !matches!(self.monitor, MonitorStep::Gathered { .. }) => {
                tokio::time::advance(Duration::from_secs(secs)).await;
                self.wall_secs += secs;
            }
            Event::Advance(_) => {}
            Event::Monitor => self.monitor_step()?,
        }
        Ok(())
    }

    /// One step of `Monitor::run` and `ChangeDb::purge_into`.
    fn monitor_step(&mut self) -> Result<(), TestCaseError> {
        match std::mem::replace(&mut self.monitor, MonitorStep::Idle) {
            MonitorStep::Idle => {
                // `Monitor::gather`: reservations first, then subscribers.
                self.monitor = MonitorStep::Gathered {
                    cleanup_delay: self.registry.cleanup_delay(),
                    reservations: self.registry.for_policy(),
                };
            }
            MonitorStep::Gathered {
                cleanup_delay,
                reservations,
            } => {
                let now = Instant::now();
                let subscribers = self.subscribers.for_policy(now, self.settings.grace);
                let decision = cleanup::decide(&Inputs {
                    guards: cleanup::Guards::default(),
                    now,
                    wall_now: self.wall(),
                    started: self.started,
                    ownership: Ownership::Unchecked,
                    cleanup_delay,
                    reconnect_grace: self.settings.grace,
                    mode: self.settings.mode,
                    without_subscribers: self.settings.without_subscribers,
                    backups: self.backlog.backups(),
                    reservations: &reservations,
                    subscribers: &subscribers,
                    last_purged: self.backlog.last_purged(),
                    highest_backup: self.backlog.highest(),
                    current_backup: self.backlog.current().map(|b| b.watermark.as_str()),
                    // The model's backups exist where they are claimed: verification is tested on its own.
                    destination: cleanup::Destination::Unchecked,
                });
                if let Decision::Purge { before, .. } = decision {
                    // The running purge's ceiling would catch a decision past a subscriber, but the decision
                    // itself must not aim there: every subscriber was read for it.
                    for sub in self.subs.iter().filter(|s| s.needed && self.tracked(s)) {
                        prop_assert!(
                            before <= sub.acked,
                            "decided to purge below {}, past a subscriber acked at {}",
                            before,
                            sub.acked
                        );
                    }
                    self.monitor = MonitorStep::Purging {
                        before,
                        reserved: false,
                    };
                }
            }
            MonitorStep::Purging {
                before,
                mut reserved,
            } => {
                // The closure the monitor hands `ChangeDb::purge_into`.
                let limit = purge_limit(
                    self.settings.mode,
                    &self.registry,
                    &self.subscribers,
                    self.settings.grace,
                );
                let target = match limit {
                    Ceiling::None => Some(before.clone()),
                    Ceiling::Everything => {
                        reserved = true;
                        None
                    }
                    Ceiling::Below(floor) if floor < before => {
                        reserved = true;
                        Some(floor)
                    }
                    Ceiling::Below(_) => Some(before.clone()),
                };
                let done = match target {
                    None => true,
                    Some(target) => {
                        // Rows below the target, never the newest row.
                        let deletable = self.log.len() - 1;
                        let rows = self.log[..deletable]
                            .iter()
                            .take_while(|w| **w < target)
                            .take(self.settings.batch_rows)
                            .count();
                        if rows > 0 {
                            self.deleted = self.log.drain(..rows).next_back();
                        }
                        rows < self.settings.batch_rows
                    }
                };
                if !done {
                    self.monitor = MonitorStep::Purging { before, reserved };
                } else if !reserved {
                    self.backlog.purged(&before);
                    self.purges += 1;
                }
            }
        }
        Ok(())
    }

    /// Nothing that an open reservation or a tracked subscriber needs is gone, and the newest row is there.
    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.log.last(), self.history.last(), "the newest row went");
        let Some(deleted) = &self.deleted else {
            return Ok(());
        };
        for (task, held) in self.held.iter().enumerate() {
            let Some(held) = held else { continue };
            match &held.need {
                None => prop_assert!(
                    false,
                    "t{task} protects every row, yet rows up to {deleted} were deleted"
                ),
                Some(need) => prop_assert!(
                    deleted < need,
                    "t{} needs rows from {}, yet {} was deleted (status {:?}, floor in the registry {:?})",
                    task,
                    need,
                    deleted,
                    held.status,
                    held.lease.floor()
                ),
            }
        }
        for (i, sub) in self.subs.iter().enumerate() {
            if sub.needed && self.tracked(sub) {
                prop_assert!(
                    *deleted < sub.acked,
                    "subscriber {} ({}) acked {}, yet {} was deleted",
                    i,
                    if sub.handle.is_some() {
                        "connected"
                    } else {
                        "departed"
                    },
                    sub.acked,
                    deleted
                );
            }
        }
        Ok(())
    }
}

fn run(settings: Settings, events: Vec<Event>) -> Result<usize, TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut world = World::new(settings);
        for event in &events {
            world.apply(event).await?;
            world.check()?;
        }
        Ok(world.purges)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn nothing_still_needed_is_ever_purged(
        settings in settings(),
        events in prop::collection::vec(event(), 1..200),
    ) {
        run(settings, events)?;
    }
}

/// The histories above must purge, or the property holds vacuously.
#[test]
fn random_histories_do_purge() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let histories = (settings(), prop::collection::vec(event(), 150..200));
    let mut purged = 0;
    for _ in 0..40 {
        let (settings, events) = histories.new_tree(&mut runner).unwrap().current();
        if run(settings, events).unwrap() > 0 {
            purged += 1;
        }
    }
    assert!(purged >= 8, "only {purged} of 40 histories purged");
}

/// A v4 view-syncer whose reservation announced the `minWatermark` of a half-purged log catches up from its own
/// replica below the running purge's target; once its subscription ends the reservation, the purge's remaining
/// batches must stop at its ack rather than go on to the target decided before it existed.
#[test]
fn a_subscriber_registered_behind_a_running_purge_holds_its_remaining_batches() {
    use Event::*;
    let settings = Settings {
        mode: ReservationMode::Pin,
        without_subscribers: WithoutSubscribers::Hold,
        initial_delay: Duration::ZERO,
        grace: Duration::from_secs(30),
        batch_rows: 1,
        start: 1,
    };
    let events = vec![
        Commit(1),
        Commit(1),
        Commit(1),
        Commit(1),
        Commit(1),
        Join,
        Ack { sub: 0, pick: 1000 },
        Backup { lag: 60 },
        Commit(1),
        Advance(40),
        Monitor,
        Monitor, // gather, decide: purge below the backup
        Monitor, // batch 1
        Open { task: 0, v4: true },
        Status {
            held: 0,
            steps: 3,
            read_fails: false,
        },
        Request {
            held: 0,
            own_replica: true,
            pick: 0,
        },
        Answer {
            pending: 0,
            both: true,
        },
        Monitor,
        Monitor,
        Monitor,
        Monitor,
    ];
    run(settings, events).unwrap();
}
