//! Property tests: a model of every rule, written apart from `decide`, checked against it over random histories.

use super::*;

use proptest::prelude::*;

/// The LexiVersion of `n` (docs/protocol.md, "Watermarks"), to produce watermarks of varying length.
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

#[test]
fn lexi_matches_the_protocol_examples() {
    assert_eq!(lexi(0), "00");
    assert_eq!(lexi(10), "0a");
    assert_eq!(lexi(35), "0z");
    assert_eq!(lexi(36), "110");
    assert_eq!(lexi(46655), "2zzz");
}

#[derive(Debug, Clone)]
enum Event {
    /// The stream advances by `step` positions.
    Commit(u64),
    /// Litestream backs up the head (after a commit when `advance`, so possibly at the replica version when
    /// not), reported `lag` seconds ago (or ahead, with clock trouble). Skipped unless newer than every backup.
    Backup {
        advance: bool,
        lag: u64,
        future: bool,
    },
    /// A reservation opens with the newest backup known now as its floor.
    Open,
    Close(usize),
    /// A subscriber connects at some position reached so far.
    Connect(usize),
    /// A connected subscriber acks some position (only a newer one moves it).
    Ack(usize, usize),
    Leave(usize),
    Advance(u64),
    /// The monitor lists the destination: its newest object `ago` seconds old (`None`: empty), or the listing
    /// fails (`ago` unused), or verification is off.
    List {
        outcome: u8,
        ago: Option<u64>,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        2 => (1..400u64).prop_map(Event::Commit),
        3 => (prop::bool::weighted(0.8), 0..120u64, prop::bool::weighted(0.1))
            .prop_map(|(advance, lag, future)| Event::Backup { advance, lag, future }),
        1 => Just(Event::Open),
        2 => any::<usize>().prop_map(Event::Close),
        2 => any::<usize>().prop_map(Event::Connect),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(s, p)| Event::Ack(s, p)),
        1 => any::<usize>().prop_map(Event::Leave),
        4 => (0..90u64).prop_map(Event::Advance),
        2 => (0..3u8, prop::option::weighted(0.9, 0..200u64))
            .prop_map(|(outcome, ago)| Event::List { outcome, ago }),
    ]
}

struct Model {
    mode: ReservationMode,
    without_subscribers: WithoutSubscribers,
    delay: Duration,
    grace: Duration,
    clock: u64,
    head: u64,
    positions: Vec<String>,
    backups: Vec<Backup>,
    reservations: Vec<HeldReservation>,
    next_task: u32,
    subscribers: Vec<Subscriber>,
    last_purged: Option<String>,
    destination: DestinationCheck,
}

impl Model {
    fn new(
        mode: ReservationMode,
        without_subscribers: WithoutSubscribers,
        delay: u64,
        grace: u64,
        head: u64,
    ) -> Self {
        Model {
            mode,
            without_subscribers,
            delay: Duration::from_secs(delay),
            grace: Duration::from_secs(grace),
            clock: 0,
            head,
            positions: vec![lexi(head)],
            backups: vec![],
            reservations: vec![],
            next_task: 0,
            subscribers: vec![],
            last_purged: None,
            destination: DestinationCheck::Unchecked,
        }
    }

    fn replica_version(&self) -> &str {
        &self.positions[0]
    }

    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Commit(step) => {
                self.head += step;
                self.positions.push(lexi(self.head));
            }
            Event::Backup {
                advance,
                lag,
                future,
            } => {
                if advance {
                    self.head += 1;
                    self.positions.push(lexi(self.head));
                }
                let watermark = lexi(self.head);
                if self
                    .backups
                    .iter()
                    .map(|b| b.watermark.as_str())
                    .max()
                    .is_some_and(|newest| newest >= watermark.as_str())
                {
                    return;
                }
                let backed_up_at = if future {
                    wall(self.clock + lag + 1)
                } else {
                    wall(self.clock.saturating_sub(lag))
                };
                self.backups.push(Backup {
                    watermark,
                    backed_up_at,
                });
            }
            Event::Open => {
                self.next_task += 1;
                let floor = self.backups.iter().map(|b| b.watermark.clone()).max();
                self.reservations.push(HeldReservation {
                    task_id: format!("t{}", self.next_task),
                    floor,
                });
            }
            Event::Close(i) if !self.reservations.is_empty() => {
                let i = i % self.reservations.len();
                self.reservations.remove(i);
            }
            Event::Connect(p) => {
                let acked = self.positions[p % self.positions.len()].clone();
                let replica_version = self.replica_version().to_owned();
                self.subscribers.push(Subscriber {
                    id: format!("vs-{}", self.subscribers.len()),
                    acked,
                    replica_version,
                    departed: None,
                    awaits_upstream: false,
                });
            }
            Event::Ack(s, p) if !self.subscribers.is_empty() => {
                let position = self.positions[p % self.positions.len()].clone();
                let i = s % self.subscribers.len();
                let subscriber = &mut self.subscribers[i];
                if subscriber.is_connected() && position > subscriber.acked {
                    subscriber.acked = position;
                }
            }
            Event::Leave(s) if !self.subscribers.is_empty() => {
                let i = s % self.subscribers.len();
                let now = at(self.clock);
                self.subscribers[i].departed.get_or_insert(now);
            }
            Event::Advance(secs) => self.clock += secs,
            Event::List { outcome, ago } => {
                self.destination = match outcome {
                    0 => DestinationCheck::Unchecked,
                    1 => DestinationCheck::Unreadable,
                    _ => DestinationCheck::Listed {
                        reaches: ago.map(|ago| wall(self.clock.saturating_sub(ago))),
                    },
                }
            }
            Event::Close(_) | Event::Ack(..) | Event::Leave(_) => {}
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            now: at(self.clock),
            wall_now: wall(self.clock),
            started: at(0),
            ownership: Ownership::Unchecked,
            cleanup_delay: self.delay,
            reconnect_grace: self.grace,
            mode: self.mode,
            without_subscribers: self.without_subscribers,
            backups: &self.backups,
            reservations: &self.reservations,
            subscribers: &self.subscribers,
            last_purged: self.last_purged.as_deref(),
            // Backups only ever advance in this model: the gauge is at its highest.
            highest_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
            current_backup: self.backups.iter().map(|b| b.watermark.as_str()).max(),
            destination: self.destination,
            other_generation: &[],
            guards: Guards::default(),
        }
    }

    fn tracked(&self) -> impl Iterator<Item = &Subscriber> {
        let now = at(self.clock);
        self.subscribers.iter().filter(move |s| match s.departed {
            None => true,
            Some(d) => now - d < self.grace,
        })
    }

    fn is_aged(&self, backup: &Backup) -> bool {
        backup.backed_up_at + self.delay <= wall(self.clock)
    }

    /// Every rule, written independently of `decide`, for purging below `w`.
    fn violations(&self, w: &str) -> Vec<&'static str> {
        let mut broken = vec![];
        if Duration::from_secs(self.clock) < self.delay.max(self.grace) {
            broken.push("purge before uptime reached the delay and the reconnect grace");
        }
        if self.mode == ReservationMode::Pause && !self.reservations.is_empty() {
            broken.push("purge in pause mode with a reservation open");
        }
        for r in &self.reservations {
            match &r.floor {
                None => broken.push("purge with a floorless reservation open"),
                Some(floor) if w > floor.as_str() => broken.push("purge above a reservation floor"),
                Some(_) => {}
            }
        }
        if !self.subscribers.iter().any(Subscriber::is_connected) {
            match self.without_subscribers {
                WithoutSubscribers::Hold => broken.push("purge without a connected subscriber"),
                WithoutSubscribers::AfterGrace => {
                    if self.tracked().next().is_some() {
                        broken.push("purge while a departed subscriber may still come back");
                    }
                    if Duration::from_secs(self.clock) < self.grace {
                        broken.push("purge without subscribers before the grace since start");
                    }
                }
            }
        }
        for s in self.tracked() {
            if w > s.acked.as_str() {
                broken.push("purge above a tracked subscriber's ack");
            }
            if s.acked == s.replica_version {
                broken.push("purge with a tracked subscriber at the replica version");
            }
        }
        if !self
            .backups
            .iter()
            .any(|b| b.watermark == w && self.is_aged(b))
        {
            broken.push("purge at a watermark that is not an aged backup");
        }
        if self.last_purged.as_deref().is_some_and(|last| w <= last) {
            broken.push("purge not above the last purge");
        }
        let claimed = self.backups.iter().find(|b| b.watermark == w);
        match (self.destination, claimed) {
            (DestinationCheck::Unchecked, _) | (_, None) => {}
            (DestinationCheck::Unreadable, _) => broken.push("purge on a failed listing"),
            (DestinationCheck::Listed { reaches: None }, _) => {
                broken.push("purge with nothing restorable in the destination")
            }
            (DestinationCheck::Listed { reaches: Some(n) }, Some(b)) => {
                if n < b.backed_up_at {
                    broken.push("purge at a claim with no object behind it")
                }
            }
        }
        broken
    }

    /// The bound names a constraint that really lowered the purge, and nothing else did after it.
    fn check_bound(&self, before: &str, bound: &Bound) -> Result<(), TestCaseError> {
        let newest_candidate = self
            .backups
            .iter()
            .filter(|b| self.is_aged(b))
            .filter(|b| {
                self.last_purged
                    .as_deref()
                    .is_none_or(|l| b.watermark.as_str() > l)
            })
            .map(|b| b.watermark.as_str())
            .max();
        match bound {
            Bound::Backup => {
                prop_assert_eq!(Some(before), newest_candidate, "bound by the backup alone")
            }
            Bound::Destination => {
                prop_assert!(
                    Some(before) < newest_candidate,
                    "the destination lowered it"
                );
                prop_assert!(!self
                    .violations(newest_candidate.unwrap_or_default())
                    .is_empty());
            }
            Bound::Reservation { task_id, floor } => {
                prop_assert!(before <= floor.as_str() && newest_candidate > Some(floor.as_str()));
                prop_assert!(self
                    .reservations
                    .iter()
                    .any(|r| &r.task_id == task_id && r.floor.as_ref() == Some(floor)));
            }
            Bound::Subscriber { acked, .. } => {
                prop_assert!(before <= acked.as_str() && newest_candidate > Some(acked.as_str()));
                prop_assert!(self.tracked().any(|s| &s.acked == acked));
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        let decision = decide(&self.inputs());
        // The largest backup that every rule allows, if any.
        let best = self
            .backups
            .iter()
            .map(|b| b.watermark.as_str())
            .filter(|w| self.violations(w).is_empty())
            .max()
            .map(str::to_owned);
        match decision {
            Decision::Purge { before, bound } => {
                let broken = self.violations(&before);
                self.check_bound(&before, &bound)?;
                prop_assert!(broken.is_empty(), "Purge({}) breaks {:?}", before, broken);
                prop_assert_eq!(Some(&before), best.as_ref(), "not the largest safe backup");
                self.last_purged = Some(before);
            }
            Decision::Hold(reason) => {
                prop_assert_eq!(best, None, "held ({}) although a backup was safe", reason);
            }
        }
        Ok(())
    }
}

fn mode() -> impl Strategy<Value = ReservationMode> {
    prop_oneof![Just(ReservationMode::Pin), Just(ReservationMode::Pause)]
}

fn without_subscribers() -> impl Strategy<Value = WithoutSubscribers> {
    prop_oneof![
        Just(WithoutSubscribers::Hold),
        Just(WithoutSubscribers::AfterGrace)
    ]
}

proptest! {
    #[test]
    fn decisions_over_random_histories_are_safe_and_maximal(
        mode in mode(),
        without in without_subscribers(),
        delay in 30..150u64,
        grace in 0..60u64,
        start in 1..1400u64,
        events in prop::collection::vec(event(), 1..100),
    ) {
        let mut model = Model::new(mode, without, delay, grace, start);
        model.check()?;
        for event in &events {
            model.apply(event);
            model.check()?;
        }
    }

    #[test]
    fn purges_the_newest_aged_backup_when_nothing_stands_in_the_way(
        mode in mode(),
        delay in 30..3600u64,
        ages in prop::collection::vec(0..7200u64, 1..6),
        start in 1..3000u64,
        steps in prop::collection::vec(1..2000u64, 6),
        uptime_extra in 0..3600u64,
    ) {
        // Backups at increasing watermarks, oldest first; at least the first is aged.
        let mut ages = ages;
        ages.sort_unstable_by(|a, b| b.cmp(a));
        ages[0] += delay;
        let now = 20_000;
        let mut head = start;
        let backups: Vec<Backup> = ages
            .iter()
            .zip(&steps)
            .map(|(&age, &step)| {
                head += step;
                Backup { watermark: lexi(head), backed_up_at: wall(now - age) }
            })
            .collect();
        let newest_aged = backups
            .iter()
            .zip(&ages)
            .rev()
            .find(|(_, age)| **age >= delay)
            .map(|(b, _)| b.watermark.clone())
            .unwrap();
        let subscribers = [Subscriber {
            id: "vs".into(),
            acked: lexi(head),
            replica_version: lexi(start),
            departed: None,
            awaits_upstream: false,
        }];
        let d = decide(&Inputs {
            now: at(now),
            wall_now: wall(now),
            started: at(now - delay - uptime_extra),
            cleanup_delay: Duration::from_secs(delay),
            reconnect_grace: Duration::from_secs(30),
            mode,
            without_subscribers: WithoutSubscribers::Hold,
            backups: &backups,
            reservations: &[],
            subscribers: &subscribers,
            last_purged: None,
            ownership: Ownership::Unchecked,
            highest_backup: backups.last().map(|b| b.watermark.as_str()),
            current_backup: backups.last().map(|b| b.watermark.as_str()),
            destination: DestinationCheck::Unchecked,
            other_generation: &[],
            guards: Guards::default(),
        });
        prop_assert_eq!(d, Decision::Purge { before: newest_aged, bound: Bound::Backup });
    }
}
