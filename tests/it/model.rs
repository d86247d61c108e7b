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
//!
//! It also reaches the edges of a run: restarts of the sidecar (its state file kept and read back, or lost),
//! litestream restarting (its page without samples, maybe on an older backup) or unreadable at any moment, a
//! purge included, resyncs that start a new change log below the old one, a second sidecar holding the purger
//! lock, ownership moving away, subscribers between their handshake and the upstream's first frame, and steps of
//! the wall clock.

use crate::support::lexi;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Several sidecars sharing one change DB's slot table, against a real PostgreSQL.
mod pg;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio::time::Instant;

use litestream_sidecar::cleanup::monitor::knowledge::{GaugeWatch, Knowledge};
use litestream_sidecar::cleanup::monitor::{purge_limit, Resumed};
use litestream_sidecar::cleanup::reservations::{Lease, Registry, Ticket};
use litestream_sidecar::cleanup::subscribers::{SubscriberHandle, SubscriberInfo, Subscribers};
use litestream_sidecar::cleanup::{
    self, Ceiling, Decision, Guards, HeldReservation, Inputs, Memory, Ownership, ReservationMode,
    WithoutSubscribers,
};
use litestream_sidecar::litestream::page::{Parsed, Progress};
use litestream_sidecar::protocol::Mode;

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
    /// The upstream answers a pending subscription with its first frame: its relay ends the task's reservation
    /// (the subscriber has been tracked since the handshake).
    Answer {
        pending: usize,
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
    /// The sidecar process dies and starts again, its state file read back (`kept`) or lost.
    Restart {
        kept: bool,
    },
    /// Litestream restarts, maybe on an older backup (`older`), and its page has no sample until it uploads.
    Blackout {
        older: Option<usize>,
    },
    /// Litestream's page cannot be read (it answers 500, or not at all).
    PageFails,
    /// A resync: the change DB gets a new replica version and a new change log, below the old one.
    Resync,
    /// Another sidecar takes the shard's purger lock, or lets it go.
    Standby(bool),
    /// `ownerAddress` stops naming the sidecar, or names it again.
    Registered(bool),
    /// The wall clock steps forward by this many seconds; the monotonic clock does not.
    ClockStep(u64),
    /// A new subscription cannot reach the upstream.
    UpstreamUnreachable,
    Advance(u64),
    /// The monitor's next step: gather reservations, then gather subscribers and decide, then one purge batch at
    /// a time.
    Monitor,
}

/// The events of a history; `restarts` weighs the sidecar's restarts (1 to 4): the more of them, the less it
/// purges (each starts a start-up wait), and the more restores and subscribers cross one.
fn event(restarts: u32) -> impl Strategy<Value = Event> {
    prop_oneof![
        12 => (1..40u64).prop_map(Event::Commit),
        12 => (0..90u64).prop_map(|lag| Event::Backup { lag }),
        4 => (any::<usize>(), 0..90u64).prop_map(|(pick, lag)| Event::Regress { pick, lag }),
        12 => (0..TASKS, any::<bool>()).prop_map(|(task, v4)| Event::Open { task, v4 }),
        16 => (any::<usize>(), 1..4usize, prop::bool::weighted(0.2))
            .prop_map(|(held, steps, read_fails)| Event::Status { held, steps, read_fails }),
        4 => any::<usize>().prop_map(Event::Close),
        12 => (any::<usize>(), any::<bool>(), any::<usize>())
            .prop_map(|(held, own_replica, pick)| Event::Request { held, own_replica, pick }),
        20 => any::<usize>().prop_map(|pending| Event::Answer { pending }),
        8 => Just(Event::Join),
        16 => (any::<usize>(), any::<usize>()).prop_map(|(sub, pick)| Event::Ack { sub, pick }),
        8 => any::<usize>().prop_map(Event::Leave),
        8 => any::<usize>().prop_map(Event::Reconnect),
        4 => Just(Event::UpstreamLost),
        4 => Just(Event::UpstreamUnreachable),
        // The edges: rarer than the rest, and the states that hold cleanup rarer than their ends, so that most
        // histories still purge.
        restarts => prop::bool::weighted(0.9).prop_map(|kept| Event::Restart { kept }),
        1 => prop::option::of(any::<usize>()).prop_map(|older| Event::Blackout { older }),
        1 => Just(Event::PageFails),
        1 => Just(Event::Resync),
        1 => prop::bool::weighted(0.3).prop_map(Event::Standby),
        1 => prop::bool::weighted(0.7).prop_map(Event::Registered),
        1 => (1..600u64).prop_map(Event::ClockStep),
        32 => (1..60u64).prop_map(Event::Advance),
        24 => Just(Event::Monitor),
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
    /// `cleanup.restore_limit`, and `cleanup.hold_without_state` with it.
    restore_limit: Duration,
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
        10..40u64,
        60..600u64,
    )
        .prop_map(
            |(mode, without_subscribers, delay, grace, batch_rows, start, limit)| Settings {
                mode,
                without_subscribers,
                initial_delay: Duration::from_secs(delay),
                grace: Duration::from_secs(grace),
                batch_rows,
                start,
                restore_limit: Duration::from_secs(limit),
            },
        )
}

/// An open reservation, and what its view-syncer needs: every row at or above `need` (`None`: every row).
struct Held {
    /// `None` once a restart took its socket: the view-syncer restores on, and only the state file kept it.
    lease: Option<Lease>,
    /// After a restart that lost the state file, the sidecar cannot know of it: it promises to hold cleanup for
    /// `cleanup.hold_without_state`, until then, and no longer.
    unknown_until: Option<Instant>,
    /// The model's own name for it, so that a subscription knows which reservation it was requested under.
    serial: u64,
    v4: bool,
    need: Option<String>,
    /// Opened while the sidecar knew no backup: it protected every row then, and its status pins it later.
    unpinned: bool,
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

/// An `initial=true` subscription between its handshake (when the relay tracks its subscriber) and the upstream's
/// first frame (when the relay ends its task's reservation).
struct Pending {
    task: usize,
    serial: u64,
    ticket: Ticket,
    /// Its view-syncer gave up on this restore (closed or retried the reservation): nothing waits for it.
    orphan: bool,
}

/// Litestream's metrics page as the monitor would read it now.
#[derive(Debug, Clone, PartialEq)]
enum Page {
    Shows(String, SystemTime),
    /// Readable, without a sample: litestream restarted and has not uploaded yet.
    Nothing,
    /// Unreadable.
    Fails,
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
    /// A restart lost the state file that named it: the sidecar knows nothing of it, and its only protection is
    /// the hold for restores it cannot know of, until this instant.
    forgotten_until: Option<Instant>,
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
        /// What the deciding check held litestream's page to: one below it stops the purge.
        watch: GaugeWatch,
        /// The replica version the deciding check read: a batch that finds another deletes nothing.
        replica: Option<String>,
    },
}

struct World {
    settings: Settings,
    registry: Registry,
    subscribers: Subscribers,
    /// What the monitor knows: the same state machine the loop runs.
    knowledge: Knowledge,
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
    page: Page,
    /// Another sidecar holds the purger lock.
    standby: bool,
    /// `ownerAddress` names the sidecar.
    registered: bool,
    /// The change DB's replica version.
    replica: String,
    resyncs: u64,
    /// The monotonic and wall clocks at this run's start: the monitor's steady wall clock.
    anchor: (Instant, SystemTime),
    restores_unknown_until: Option<Instant>,
    restarts: usize,
}

impl World {
    fn new(settings: Settings) -> Self {
        let rv = lexi(settings.start);
        World {
            registry: Registry::new(settings.initial_delay),
            subscribers: Subscribers::default(),
            knowledge: Knowledge::new(false),
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
            page: Page::Nothing,
            standby: false,
            registered: true,
            replica: lexi(settings.start),
            resyncs: 0,
            anchor: (
                Instant::now(),
                UNIX_EPOCH + Duration::from_secs(1_750_000_000),
            ),
            restores_unknown_until: None,
            restarts: 0,
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
        let now = Instant::now();
        if sub.forgotten_until.is_some_and(|until| now < until) {
            return true;
        }
        match sub.grace_from {
            None => true,
            Some(from) => sub.kept || now.saturating_duration_since(from) < self.settings.grace,
        }
    }

    /// Litestream's backup is now at `watermark` (uploaded `lag` seconds ago by its clock), and its page says so.
    fn litestream_at(&mut self, watermark: String, lag: u64) {
        let backed_up_at = self.wall() - Duration::from_secs(lag);
        self.truth(watermark.clone());
        self.page = Page::Shows(watermark.clone(), backed_up_at);
        self.reported.push(watermark);
    }

    /// What a restore started from now on gets, whatever a reservation was promised before.
    fn truth(&mut self, watermark: String) {
        for held in self.held.iter_mut().flatten() {
            if let Some(need) = held.need.as_mut().filter(|n| **n > watermark) {
                *need = watermark.clone();
            }
        }
        self.gauge = Some(watermark);
    }

    /// Litestream's page as the monitor reads it.
    fn parsed(&self) -> Option<Parsed> {
        match &self.page {
            Page::Fails => None,
            Page::Nothing => Some(Parsed::default()),
            Page::Shows(watermark, at) => Some(Parsed {
                progress: vec![Progress {
                    watermark: watermark.clone(),
                    backed_up_at: *at,
                    db: "/data/replica.db".into(),
                    name: "s3".into(),
                }],
                ..Parsed::default()
            }),
        }
    }

    /// `Monitor::scrape`: the page into what the monitor knows, and on to the registry.
    fn scrape(&mut self) {
        let seen = match self.parsed() {
            Some(page) => self.knowledge.on_page(&page),
            None => self.knowledge.on_unreadable_page("connection refused"),
        };
        seen.pass_on(&self.registry);
    }

    /// `Monitor::batch_limit`, before every purge batch: whether the page still supports the purge.
    fn gauge_holds(&mut self, watch: &GaugeWatch) -> bool {
        let page = self.parsed();
        let verdict = watch.judge_page(
            page.as_ref()
                .ok_or_else(|| "connection refused".to_string()),
        );
        verdict.pass_on(&self.registry);
        verdict.moved.is_none()
    }

    /// `Monitor::read_replica`: a new replica version forgets everything about the old replica.
    fn read_replica(&mut self) {
        let wall = self.wall();
        if self
            .knowledge
            .on_replica_version(self.replica.clone(), wall)
            .is_some()
        {
            self.registry.replica_reset();
            // A reservation opened after the resync but before this check was pinned at the old replica's backup,
            // which says nothing of the new log. Open reservations protect every row from now on (docs/operations.md,
            // "Reliability"), and one whose status is still to come restores what litestream has when it is sent,
            // as one opened while no backup was known does.
            let first = self.log[0].clone();
            for held in self.held.iter_mut().flatten() {
                if !matches!(held.status, StatusStep::Sent { .. }) {
                    held.need = Some(first.clone());
                    held.unpinned = true;
                }
            }
        }
    }

    fn guards(&self, now: Instant) -> Guards {
        let (anchor, anchor_wall) = self.anchor;
        Guards {
            unservable: false,
            standby: self.standby,
            memory: Memory::Kept,
            restores_unknown_until: self.restores_unknown_until,
            replica_unknown: self.knowledge.replica_version().is_none(),
            reset_at: self.knowledge.reset_at(),
            position_unknown: self.knowledge.position_unknown(),
            restored_less: false,
            drill_disk: false,
            steady_now: Some(anchor_wall + now.saturating_duration_since(anchor)),
        }
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
            let sub = &self.subs[i];
            let known = sub.forgotten_until.is_none();
            if known && sub.grace_from.is_some() && self.tracked(sub) {
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
            replica_version: self.replica.clone(),
            watermark: watermark.clone(),
        });
        self.subs.push(Sub {
            handle: Some(handle),
            acked: watermark,
            needed,
            grace_from: None,
            kept: false,
            forgotten_until: None,
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
        // What the restore gets: where litestream's backup really is.
        let truth = self.gauge.clone();
        // Withheld until the registry knows a backup.
        let known = self.registry.newest_backup();
        let Some(held) = self.held[task].as_mut() else {
            return;
        };
        let Some(lease) = held.lease.as_mut() else {
            return;
        };
        let (Some(newest), Some(truth)) = (known, truth) else {
            return;
        };
        match held.status.clone() {
            StatusStep::NotSent if !held.v4 => {
                if lease.floor().is_none() {
                    lease.set_floor(Some(newest.clone()));
                }
                // The restore starts now and gets where litestream is now.
                held.need = match (std::mem::take(&mut held.unpinned), held.need.take()) {
                    (false, Some(need)) => Some(need.min(truth)),
                    _ => Some(truth),
                };
                held.status = StatusStep::Sent { min: None };
            }
            StatusStep::NotSent => {
                let pinned = lease.floor();
                lease.set_floor(None);
                held.status = StatusStep::Protected { pinned, newest };
            }
            StatusStep::Protected { pinned, .. } if read_fails => {
                lease.set_floor(pinned);
                held.status = StatusStep::NotSent;
            }
            StatusStep::Protected { newest, .. } => {
                held.status = StatusStep::Read { newest, min: first };
            }
            StatusStep::Read { newest, min } => {
                lease.set_floor(Some(newest.min(min.clone())));
                // It catches up from its own replica at or above `min`, or restores the backup there now (or an
                // older one, should the gauge go back).
                held.need = Some(min.clone().min(truth));
                held.status = StatusStep::Sent { min: Some(min) };
            }
            StatusStep::Sent { .. } => {}
        }
    }

    /// The relay's `on_subscribed` for the `i`th pending subscription, at the upstream's first frame: it ends its
    /// task's reservation (its subscriber was tracked from the handshake).
    fn answer(&mut self, i: usize) {
        let p = self.pending.remove(i);
        self.registry
            .end_by_subscription(&format!("t{}", p.task), p.ticket, Instant::now());
        if !p.orphan {
            // The snapshot socket closes; the subscriber carries on from here.
            self.held[p.task] = None;
        }
    }

    /// The sidecar process dies and starts again: every socket closes, every relayed subscription ends, and what
    /// the new process knows is what the state file kept (`kept`), or nothing.
    fn restart(&mut self, kept: bool) {
        let now = Instant::now();
        self.restarts += 1;
        let saved = kept.then(|| {
            (
                self.registry.to_keep(),
                self.registry.cleanup_delay(),
                self.knowledge.backlog().last_purge().cloned(),
                self.knowledge.backlog().highest().map(str::to_owned),
                self.knowledge.replica_version().map(str::to_owned),
                self.subscribers.to_keep(now, self.settings.grace),
            )
        });
        self.monitor = MonitorStep::Idle;
        // Subscriptions in flight die; their view-syncers keep restoring and will ask again.
        self.pending.clear();
        for i in 0..self.subs.len() {
            let was_tracked = self.tracked(&self.subs[i]);
            if self.subs[i].handle.is_some() {
                self.depart(i);
            }
            let sub = &mut self.subs[i];
            // The new process takes those it knew from the state file as departed now, or knows nothing of them.
            if was_tracked {
                if sub.forgotten_until.is_none() {
                    sub.kept = false;
                    sub.grace_from = Some(now);
                }
                if !kept {
                    sub.forgotten_until = Some(now + self.settings.restore_limit);
                }
            }
        }
        for task in 0..TASKS {
            let Some(held) = self.held[task].as_mut() else {
                continue;
            };
            if matches!(held.status, StatusStep::Sent { .. }) {
                held.lease = None;
                if !kept {
                    held.unknown_until = Some(now + self.settings.restore_limit);
                }
            } else {
                // No status yet: the view-syncer's socket closed, and it retries with a new reservation.
                self.drop_held(task);
            }
        }
        self.subscribers = Subscribers::default();
        self.upstream_lost = false;
        // The new process knows nothing until its first check: the replica version, then the shard's memory.
        self.knowledge = Knowledge::new(false);
        let wall = self.wall();
        self.knowledge
            .on_replica_version(self.replica.clone(), wall);
        self.started = now;
        self.anchor = (now, self.wall());
        match saved {
            Some((reservations, delay, last_purge, highest, replica_version, subscribers)) => {
                self.registry = Registry::new(self.settings.initial_delay.max(delay));
                self.registry.keep(reservations, now, SystemTime::now());
                self.subscribers.keep(subscribers, now);
                self.knowledge.on_resumed(
                    &Resumed {
                        last_purge,
                        highest_backup: highest,
                        replica_version,
                        restores_unknown_since: None,
                    },
                    wall,
                );
                // A hold for unknown restores still in force carries on.
                self.restores_unknown_until = self.restores_unknown_until.filter(|u| *u > now);
            }
            None => {
                self.registry = Registry::new(self.settings.initial_delay);
                self.restores_unknown_until = Some(now + self.settings.restore_limit);
            }
        }
    }

    /// A resync: a new replica version, and a new change log below the old one. Every view-syncer and subscriber
    /// of the old replica must start over (Zero resets them); litestream still shows the old replica's backup
    /// until it uploads the new one.
    fn resync(&mut self) {
        self.resyncs += 1;
        let replica = lexi(self.resyncs - 1);
        self.replica = replica.clone();
        self.log = vec![replica.clone()];
        self.history = vec![replica];
        self.deleted = None;
        self.reported.clear();
        self.pending.clear();
        for task in 0..TASKS {
            self.drop_held(task);
        }
        for i in 0..self.subs.len() {
            if self.subs[i].handle.is_some() {
                self.depart(i);
            }
            self.subs[i].needed = false;
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
            // Litestream moves at any time; the monitor reads its page at every check and before every batch
            // (and here at once when idle, so that most histories see backups promptly).
            Event::Backup { lag } => {
                let head = self.head().to_owned();
                if self.gauge.as_deref() != Some(head.as_str()) || self.page == Page::Nothing {
                    self.litestream_at(head, lag);
                    if idle {
                        self.scrape();
                    }
                }
            }
            // A move back is read before anything else happens: the monitor polls, and a restore that got an older
            // backup between two reads of a page that then moved on is beyond what polling can see.
            Event::Regress { pick, lag } if idle => {
                // Only to a backup whose rows are all still there: a gauge going back below a purge would make any
                // restore from it impossible, whatever the sidecar did.
                let older = self.older_backups();
                if !older.is_empty() {
                    self.litestream_at(older[pick % older.len()].clone(), lag);
                    self.scrape();
                }
            }
            Event::Blackout { older } if idle => {
                let backups = self.older_backups();
                if let (Some(pick), false) = (older, backups.is_empty()) {
                    // Restores begun before it have what they got; those begun after it wait for a status until
                    // the page shows the gauge again.
                    self.gauge = Some(backups[pick % backups.len()].clone());
                }
                self.page = Page::Nothing;
                self.scrape();
            }
            Event::Regress { .. } | Event::Blackout { .. } => {}
            Event::PageFails => self.page = Page::Fails,
            Event::Open { task, v4 } => {
                let lease = self.registry.open(&format!("t{task}"), Instant::now());
                // A retry: the old reservation was replaced, its socket closes.
                self.drop_held(task);
                self.next_serial += 1;
                self.held[task] = Some(Held {
                    lease: Some(lease),
                    unknown_until: None,
                    serial: self.next_serial,
                    v4,
                    // What the sidecar pins it at: the backup it knows now, or (none known, after a reset or a
                    // blackout) every row still there.
                    need: self.registry.newest_backup().or(Some(self.log[0].clone())),
                    unpinned: self.registry.newest_backup().is_none(),
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
                    // A kept reservation has no socket to close.
                    if self.held[task].as_ref().is_some_and(|h| h.lease.is_some()) {
                        self.drop_held(task);
                    }
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
                // One subscription at a time per restore (another only once the first failed).
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
                    (None, _) => held.need.clone().or(self.gauge.clone()).unwrap_or_default(),
                };
                // A restore the sidecar could not know of is promised nothing once `cleanup.hold_without_state` has
                // passed (docs/operations.md, "What survives a restart"), and `check` stops counting it then. Should
                // its rows be gone by the time it subscribes, they went while nothing protected them: it cannot catch
                // up whatever the sidecar does now, and the model follows it no further.
                let unprotected = held
                    .unknown_until
                    .is_some_and(|until| Instant::now() >= until);
                if unprotected && self.deleted.as_ref().is_some_and(|d| *d >= watermark) {
                    self.drop_held(task);
                    return Ok(());
                }
                let serial = held.serial;
                self.held[task].as_mut().unwrap().restored = Some(watermark.clone());
                // As the relay does: the ticket first, then the upstream connection, and the subscriber tracked
                // from the handshake, before the upstream says anything.
                let ticket = self.registry.ticket();
                self.reached();
                self.connect(format!("vs{task}-{serial}"), Some(task), watermark, true);
                self.pending.push(Pending {
                    task,
                    serial,
                    ticket,
                    orphan: false,
                });
            }
            Event::Answer { pending } if !self.pending.is_empty() => {
                self.answer(pending % self.pending.len());
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
                self.pending.clear();
            }
            Event::UpstreamUnreachable => self.lost(),
            Event::Restart { kept } => self.restart(kept),
            Event::Resync => self.resync(),
            Event::Standby(standby) => self.standby = standby,
            Event::Registered(registered) => self.registered = registered,
            // Gathering takes no time.
            Event::Advance(secs) if !matches!(self.monitor, MonitorStep::Gathered { .. }) => {
                tokio::time::advance(Duration::from_secs(secs)).await;
                self.wall_secs += secs;
            }
            Event::Advance(_) => {}
            Event::ClockStep(secs) => self.wall_secs += secs,
            Event::Monitor => self.monitor_step()?,
        }
        Ok(())
    }

    /// Backups litestream reported whose rows are all still in the log, below where it is now.
    fn older_backups(&self) -> Vec<String> {
        let first = self.log[0].clone();
        let gauge = self.gauge.clone().unwrap_or_default();
        self.reported
            .iter()
            .filter(|w| **w >= first && **w < gauge)
            .cloned()
            .collect()
    }

    /// One step of `Monitor::run` and `ChangeDb::purge_within`.
    fn monitor_step(&mut self) -> Result<(), TestCaseError> {
        match std::mem::replace(&mut self.monitor, MonitorStep::Idle) {
            MonitorStep::Idle => {
                // `Monitor::run`: the replica version, the page, the kept reservations' limit, then `gather`:
                // reservations first, then subscribers.
                let now = Instant::now();
                self.read_replica();
                self.scrape();
                for (task_id, _) in self.registry.expire_kept(now, self.settings.restore_limit) {
                    // Outlived: no real restore takes this long, and the sidecar no longer waits for it.
                    let task: usize = task_id[1..].parse().unwrap();
                    if self.held[task].as_ref().is_some_and(|h| h.lease.is_none()) {
                        self.drop_held(task);
                    }
                }
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
                    now,
                    wall_now: self.wall(),
                    started: self.started,
                    ownership: if self.registered {
                        Ownership::Unchecked
                    } else {
                        Ownership::NotRegistered
                    },
                    cleanup_delay,
                    reconnect_grace: self.settings.grace,
                    mode: self.settings.mode,
                    without_subscribers: self.settings.without_subscribers,
                    backups: self.knowledge.backlog().backups(),
                    reservations: &reservations,
                    subscribers: &subscribers,
                    last_purged: self.knowledge.backlog().last_purged(),
                    highest_backup: self.knowledge.backlog().highest(),
                    current_backup: self
                        .knowledge
                        .backlog()
                        .current()
                        .map(|b| b.watermark.as_str()),
                    // The model's backups exist where they are claimed: verification is tested on its own.
                    destination: cleanup::DestinationCheck::Unchecked,
                    other_generation: &[],
                    guards: self.guards(now),
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
                        watch: self.knowledge.gauge_watch(),
                        replica: self.knowledge.replica_version().map(str::to_owned),
                    };
                }
            }
            MonitorStep::Purging {
                before,
                mut reserved,
                watch,
                replica,
            } => {
                // The closure the monitor hands `ChangeDb::purge_within`: the page read again, then the ceiling.
                let limit = if self.gauge_holds(&watch) {
                    purge_limit(
                        self.settings.mode,
                        &self.registry,
                        &self.subscribers,
                        self.settings.grace,
                    )
                } else {
                    Ceiling::Everything
                };
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
                // Each batch checks the owner, the purger lock and the replica version, and refuses a target above
                // the newest row.
                let newest = self.log.last().unwrap().clone();
                let same_replica = replica.as_ref().is_none_or(|r| *r == self.replica);
                let target = target.filter(|target| {
                    let allowed =
                        self.registered && !self.standby && same_replica && *target <= newest;
                    reserved |= !allowed;
                    allowed
                });
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
                    self.monitor = MonitorStep::Purging {
                        before,
                        reserved,
                        watch,
                        replica,
                    };
                } else if !reserved {
                    self.knowledge.on_purged(
                        &before,
                        cleanup::PurgeRun {
                            bound: "model".into(),
                            rows: 0,
                            completed_at: SystemTime::now(),
                        },
                    );
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
        let now = Instant::now();
        for (task, held) in self.held.iter().enumerate() {
            let Some(held) = held else { continue };
            // A restore the sidecar could not know of is promised only `hold_without_state`.
            if held.unknown_until.is_some_and(|until| now >= until) {
                continue;
            }
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
                    held.lease.as_ref().map(Lease::floor)
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

/// How many histories the property runs: `MODEL_CASES`, else 2,000.
fn model_cases() -> u32 {
    std::env::var("MODEL_CASES")
        .ok()
        .map(|text| text.parse().expect("MODEL_CASES is a number of cases"))
        .unwrap_or(2000)
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
    // 2,000 histories in `make test`; `make fuzz` sets MODEL_CASES higher.
    // The regressions are kept beside this file, in model.proptest-regressions: proptest's default would look for
    // them in tests/proptest-regressions/, beside the binary's main.rs.
    #![proptest_config(ProptestConfig {
        cases: model_cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn nothing_still_needed_is_ever_purged(
        settings in settings(),
        events in prop::collection::vec(event(4), 1..300),
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
    let histories = (settings(), prop::collection::vec(event(4), 250..300));
    let mut purged = 0;
    for _ in 0..40 {
        let (settings, events) = histories.new_tree(&mut runner).unwrap().current();
        if run(settings, events).unwrap() > 0 {
            purged += 1;
        }
    }
    // Restarts, resyncs and the other edges hold cleanup for a while each: about a sixth of the histories purge.
    assert!(purged >= 6, "only {purged} of 40 histories purged");
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
        restore_limit: Duration::from_secs(3600),
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
        Answer { pending: 0 },
        Monitor,
        Monitor,
        Monitor,
        Monitor,
    ];
    run(settings, events).unwrap();
}

/// A restore begun before a restart that lost the state file is protected for `cleanup.hold_without_state` and no
/// longer: once that hold and the reconnect grace of its cut-off subscription have passed, its rows may be purged,
/// and a subscription it asks for later cannot count as a subscriber the sidecar failed.
#[test]
fn a_restore_unknown_to_the_sidecar_is_promised_only_the_hold_without_state() {
    use Event::*;
    let settings = Settings {
        mode: ReservationMode::Pin,
        without_subscribers: WithoutSubscribers::Hold,
        initial_delay: Duration::ZERO,
        grace: Duration::ZERO,
        batch_rows: 1,
        start: 10,
        restore_limit: Duration::from_secs(60),
    };
    let status = Status {
        held: 0,
        steps: 1,
        read_fails: false,
    };
    let request = Request {
        held: 0,
        own_replica: false,
        pick: 0,
    };
    let events = vec![
        Open { task: 0, v4: false },
        Backup { lag: 0 },
        status,
        request.clone(),
        Restart { kept: false },
        Commit(1),
        Join,
        Reconnect(0),
        Advance(60),
        Leave(1), // the reconnected subscription, at the replica version
        Backup { lag: 30 },
        Monitor,
        Monitor, // gather, decide: purge below the backup
        Monitor, // the replica version's row goes
        Monitor, // nothing more below the backup: the purge is done
        request,
    ];
    assert_eq!(run(settings, events).unwrap(), 1);
}
