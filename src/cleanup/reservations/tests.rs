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
            withheld: None,
        }]
    );
    assert_eq!(registry.cleanup_delay(), MIN_CLEANUP_DELAY);
    drop(second);
    assert!(registry.is_empty());
}

#[test]
fn a_withheld_status_says_why_until_it_is_sent() {
    let registry = Registry::new(Duration::ZERO);
    let replaced = registry.open("t1", at(0));
    let lease = registry.open("t1", at(5));
    let withheld = || registry.open_reservations()[0].withheld;
    assert_eq!(withheld(), None);
    let version = *registry.changes().borrow();
    lease.status_withheld("log_past_backup");
    assert_eq!(withheld(), Some("log_past_backup"));
    // The state file keeps nothing of it: a status waiting for its reservation's row never waits for this too.
    assert_eq!(*registry.changes().borrow(), version);
    // A replaced lease speaks for its own reservation only.
    replaced.status_withheld("change_db");
    replaced.status_sent();
    assert_eq!(withheld(), Some("log_past_backup"));
    lease.status_withheld("change_db");
    assert_eq!(withheld(), Some("change_db"));
    lease.status_sent();
    assert_eq!(withheld(), None);
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

/// Statuses protect what they announce, over any interleaving of reservations, the two steps of building a v4+
/// status (protect everything, then read `min(watermark)` and pin there, as `status_frame` does), batched purges
/// that ask the registry before every batch (as `ChangeDb::purge_within` does) and new change-log rows: no row at
/// or above an open reservation's announced `minWatermark` is ever deleted.
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

    #[tokio::test]
    async fn with_a_state_file_kept_a_status_before_its_first_write_waits_for_it() {
        let registry = Registry::new(Duration::ZERO);
        registry.kept_on_disk();
        // A reservation opened before the writer's first write (a request the moment the server listens).
        let _lease = registry.open("t1", Instant::now());
        let version = *registry.changes().borrow();
        assert!(!registry.durable(Duration::from_millis(50)).await);
        // The first write, made before the reservation: still not durable.
        registry.set_written(Written::Through(0));
        assert!(!registry.durable(Duration::from_millis(50)).await);
        registry.set_written(Written::Through(version));
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
