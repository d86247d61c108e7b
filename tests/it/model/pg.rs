//! Several sidecars sharing one change DB, over random interleavings, against the real statements: the slot table
//! and the purge batches that read it. Each history runs three sidecars (each its own session, as three processes
//! have) that open, close and replace reservations, relay subscriptions that end them through any sidecar, ack,
//! vouch for their subscribers or stop doing so (frozen), restart under a new name (what their sockets knew is
//! lost, their rows are not), and purge, any of them at any step (a takeover), with the replica's size known or
//! not. What each view-syncer needs is kept by the model from the protocol, and after every purge every row any of
//! them still needs must be there.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio_util::sync::CancellationToken;

use crate::support::lexi;
use crate::support::pg::TestSchema;
use litestream_sidecar::cleanup::change_db::{
    ChangeDb, ReservationWrite, SlotWrites, SubscriberRow,
};

const SIDECARS: usize = 3;
const TASKS: usize = 4;

#[derive(Debug, Clone)]
enum Step {
    /// Zero stores a transaction; litestream backs it up when `backup`.
    Commit { backup: bool },
    /// A view-syncer reserves `task` at `sidecar` (a retry replaces its earlier reservation and restore).
    Open { task: usize, sidecar: usize },
    /// The reservation's socket closes; its restore goes on.
    Close { task: usize },
    /// The task's view-syncer, restored, subscribes through `sidecar` from the floor it restored to.
    Subscribe { task: usize, sidecar: usize },
    /// A subscriber acknowledges up to a newer commit.
    Ack { sub: usize, pick: usize },
    /// A sidecar vouches for its subscribers (its heartbeat).
    Heartbeat { sidecar: usize },
    /// A sidecar freezes (SIGSTOP) or thaws.
    Freeze { sidecar: usize },
    /// A sidecar restarts: its sockets die, its rows stay, it comes back under a new name.
    Restart { sidecar: usize },
    /// A sidecar purges below a backup, with the replica's size known or not.
    Purge {
        sidecar: usize,
        pick: usize,
        size_known: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<bool>().prop_map(|backup| Step::Commit { backup }),
        2 => (0..TASKS, 0..SIDECARS).prop_map(|(task, sidecar)| Step::Open { task, sidecar }),
        1 => (0..TASKS).prop_map(|task| Step::Close { task }),
        2 => (0..TASKS, 0..SIDECARS).prop_map(|(task, sidecar)| Step::Subscribe { task, sidecar }),
        2 => (0..8usize, 0..8usize).prop_map(|(sub, pick)| Step::Ack { sub, pick }),
        2 => (0..SIDECARS).prop_map(|sidecar| Step::Heartbeat { sidecar }),
        1 => (0..SIDECARS).prop_map(|sidecar| Step::Freeze { sidecar }),
        1 => (0..SIDECARS).prop_map(|sidecar| Step::Restart { sidecar }),
        3 => (0..SIDECARS, 0..16usize, any::<bool>())
            .prop_map(|(sidecar, pick, size_known)| Step::Purge { sidecar, pick, size_known }),
    ]
}

/// A sidecar as the model sees it: its name in the slot table, its session, what its sockets hold.
struct Sidecar {
    name: String,
    db: ChangeDb,
    stop: CancellationToken,
    frozen: bool,
    restarts: usize,
    /// Its subscribers (the model's index into `subs`).
    subscribers: Vec<usize>,
}

struct Sub {
    key: String,
    acked: String,
}

/// A restore in flight: needs every row above `floor` (every row when `None`) until its subscription.
#[derive(Clone)]
struct Restore {
    floor: Option<String>,
    sidecar: usize,
    lease: i64,
    socket: bool,
}

struct World {
    schema: TestSchema,
    sidecars: Vec<Sidecar>,
    log: Vec<String>,
    backup: Option<String>,
    restores: BTreeMap<usize, Restore>,
    subs: Vec<Sub>,
    leases: i64,
}

const REPLICA: &str = "1rs";
const GRACE: Duration = Duration::from_secs(3600);

impl World {
    async fn new() -> World {
        let schema = TestSchema::create(None, None).await;
        let mut sidecars = Vec::new();
        for n in 0..SIDECARS {
            let (db, stop) = schema.connected().await;
            db.migrate().await.unwrap();
            sidecars.push(Sidecar {
                name: format!("s{n}"),
                db,
                stop,
                frozen: false,
                restarts: 0,
                subscribers: Vec::new(),
            });
        }
        World {
            schema,
            sidecars,
            log: Vec::new(),
            backup: None,
            restores: BTreeMap::new(),
            subs: Vec::new(),
            leases: 0,
        }
    }

    async fn write(&self, sidecar: usize, writes: SlotWrites) {
        let s = &self.sidecars[sidecar];
        s.db.write_slots(&s.name, &writes).await.unwrap();
    }

    fn subscriber_rows(&self, sidecar: usize) -> (Vec<SubscriberRow>, Duration) {
        let rows = self.sidecars[sidecar]
            .subscribers
            .iter()
            .map(|&n| SubscriberRow {
                key: self.subs[n].key.clone(),
                task_id: None,
                subscriber_id: self.subs[n].key.clone(),
                floor: self.subs[n].acked.clone(),
                replica_version: REPLICA.into(),
                connected: true,
            })
            .collect();
        (rows, GRACE)
    }

    async fn run(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Commit { backup } => {
                let w = lexi(100 + self.log.len() as u64);
                self.schema
                    .insert_transactions(std::slice::from_ref(&w), 0)
                    .await;
                self.log.push(w.clone());
                if backup {
                    self.backup = Some(w);
                }
            }
            Step::Open { task, sidecar } => {
                if self.sidecars[sidecar].frozen {
                    return Ok(());
                }
                self.leases += 1;
                let floor = self.backup.clone();
                // The status goes out once this has committed: from then on the restore needs its rows.
                self.write(
                    sidecar,
                    SlotWrites {
                        reservations: vec![ReservationWrite::Open {
                            task_id: format!("t{task}"),
                            lease: self.leases,
                            floor: floor.clone(),
                            replica_version: Some(REPLICA.into()),
                            protocol: 6,
                            connected: true,
                            restore_limit: None,
                            opened_ago: Duration::ZERO,
                        }],
                        ..SlotWrites::default()
                    },
                )
                .await;
                self.restores.insert(
                    task,
                    Restore {
                        floor,
                        sidecar,
                        lease: self.leases,
                        socket: true,
                    },
                );
            }
            Step::Close { task } => {
                let Some(restore) = self.restores.get_mut(&task) else {
                    return Ok(());
                };
                if !restore.socket || self.sidecars[restore.sidecar].frozen {
                    return Ok(());
                }
                restore.socket = false;
                let (sidecar, lease) = (restore.sidecar, restore.lease);
                self.write(
                    sidecar,
                    SlotWrites {
                        reservations: vec![ReservationWrite::Close {
                            task_id: format!("t{task}"),
                            lease,
                        }],
                        ..SlotWrites::default()
                    },
                )
                .await;
            }
            Step::Subscribe { task, sidecar } => {
                if self.sidecars[sidecar].frozen {
                    return Ok(());
                }
                let Some(restore) = self.restores.get(&task).cloned() else {
                    return Ok(());
                };
                // A restore of "every row" catches up from the replica version itself.
                let from = restore.floor.clone().unwrap_or_else(|| lexi(0));
                let n = self.subs.len();
                self.subs.push(Sub {
                    key: format!("{}#{n}", self.sidecars[sidecar].name),
                    acked: from,
                });
                self.sidecars[sidecar].subscribers.push(n);
                let subscribers = Some(self.subscriber_rows(sidecar));
                self.write(
                    sidecar,
                    SlotWrites {
                        subscribed: vec![(format!("t{task}"), Duration::ZERO)],
                        subscribers,
                        ..SlotWrites::default()
                    },
                )
                .await;
                self.restores.remove(&task);
            }
            Step::Ack { sub, pick } => {
                let Some(s) = self.subs.get_mut(sub) else {
                    return Ok(());
                };
                if let Some(w) = self.log.get(pick % self.log.len().max(1)) {
                    if *w > s.acked {
                        s.acked = w.clone();
                    }
                }
            }
            Step::Heartbeat { sidecar } => {
                if self.sidecars[sidecar].frozen {
                    return Ok(());
                }
                let subscribers = Some(self.subscriber_rows(sidecar));
                self.write(
                    sidecar,
                    SlotWrites {
                        subscribers,
                        heartbeat: true,
                        ..SlotWrites::default()
                    },
                )
                .await;
            }
            Step::Freeze { sidecar } => {
                let s = &mut self.sidecars[sidecar];
                s.frozen = !s.frozen;
            }
            Step::Restart { sidecar } => {
                let s = &mut self.sidecars[sidecar];
                s.restarts += 1;
                s.frozen = false;
                s.name = format!("s{sidecar}r{}", s.restarts);
                // Its subscribers are cut off: they are gone for the model (a reconnect is a new subscriber),
                // and their rows bound purges for their grace all the same.
                s.subscribers.clear();
                for restore in self.restores.values_mut().filter(|r| r.sidecar == sidecar) {
                    restore.socket = false;
                }
            }
            Step::Purge {
                sidecar,
                pick,
                size_known,
            } => {
                if self.sidecars[sidecar].frozen || self.log.is_empty() {
                    return Ok(());
                }
                let Some(backup) = self.backup.clone() else {
                    return Ok(());
                };
                // Any aged backup up to the newest: the slots alone must keep what anyone needs.
                let candidates: Vec<&String> = self.log.iter().filter(|w| **w <= backup).collect();
                let before = candidates[pick % candidates.len()].clone();
                crate::support::pg::purge_with_slots(
                    &self.sidecars[sidecar].db,
                    &before,
                    REPLICA,
                    2,
                    size_known.then_some(Duration::from_secs(3600)),
                )
                .await;
                self.check(&before).await?;
            }
        }
        Ok(())
    }

    /// Every row a restore in flight or a subscriber (of a live sidecar, or within its grace) still needs is there.
    async fn check(&self, before: &str) -> Result<(), TestCaseError> {
        let left: Vec<String> = self.schema.watermarks().await;
        let needs = self
            .restores
            .values()
            .map(|r| r.floor.clone())
            .chain(self.subs.iter().map(|s| Some(s.acked.clone())));
        for floor in needs {
            for w in &self.log {
                let needed = floor.as_ref().is_none_or(|f| w > f);
                prop_assert!(
                    !needed || left.contains(w),
                    "a purge below {before} deleted {w}, needed above {floor:?}; left {left:?}"
                );
            }
        }
        // The newest row always stays.
        if let Some(newest) = self.log.last() {
            prop_assert!(left.contains(newest));
        }
        Ok(())
    }

    async fn drop(self) {
        for s in &self.sidecars {
            s.stop.cancel();
        }
        self.schema.drop().await;
    }
}

/// How many histories run: `MODEL_CASES` / 50, at least 24 (each starts a schema and three sessions).
fn cases() -> u32 {
    std::env::var("MODEL_CASES")
        .ok()
        .and_then(|text| text.parse::<u32>().ok())
        .map_or(24, |n| (n / 50).max(24))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_sidecar_of_a_shard_purges_a_row_another_ones_slots_need(
        steps in proptest::collection::vec(step(), 10..60)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut world = World::new().await;
            let mut result = Ok(());
            for s in &steps {
                if let Err(err) = world.run(s).await {
                    result = Err(err);
                    break;
                }
            }
            world.drop().await;
            result
        })?;
    }
}
