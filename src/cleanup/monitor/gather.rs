//! Everything besides litestream the policy reads at one instant: the registration, this sidecar's reservations and
//! subscribers with every live slot of the shard's, and the guards (standby, memory, refusals, drills, resets).

use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::cleanup::discovery::{DiscoveryMode, Registration};
use crate::cleanup::slots::SlotKind;
use crate::cleanup::{self, HeldReservation, Ownership, Subscriber};

use super::Monitor;

/// How long a hold sized by the replica lasts while its size is unknown: until it is known (a year stands in for
/// "not yet", and every check computes it afresh).
const UNKNOWN_SIZE_HOLD: Duration = Duration::from_secs(365 * 24 * 3600);

/// What one check saw besides the backlog, in the policy's own types.
pub(super) struct Gathered {
    pub(super) ownership: Ownership,
    /// In mode `owner`, the replication-manager task that held the change log when the ownership was read: every
    /// purge batch checks it still does.
    pub(super) owner: Option<String>,
    pub(super) cleanup_delay: Duration,
    pub(super) reservations: Vec<HeldReservation>,
    pub(super) subscribers: Vec<Subscriber>,
    /// The replica version this check read: a purge it decides stops at a batch that finds another.
    pub(super) replica_version: Option<String>,
}

impl Gathered {
    /// `task=floor` for each reservation, for logs.
    pub(super) fn reservation_list(&self) -> String {
        let list: Vec<String> = self.reservations.iter().map(ToString::to_string).collect();
        list.join(",")
    }
}

/// What the policy hears of the shard's memory: the keeper's word (`kept`), unless the loop has not taken the memory
/// in yet (the keeper says "kept" a moment before it hands the memory over, and a check in between would decide
/// without the last purge and the highest backup), or the slots cannot be read (they are memory too: nothing says
/// which restores are in flight).
pub(super) fn memory_guard(
    kept: cleanup::Memory,
    resumed: bool,
    slots_unread: bool,
) -> cleanup::Memory {
    match kept {
        cleanup::Memory::Kept if !resumed => cleanup::Memory::Loading,
        cleanup::Memory::Kept if slots_unread => cleanup::Memory::Unreadable,
        memory => memory,
    }
}

impl Monitor {
    /// Everything else the policy reads, at one instant.
    pub(super) fn gather(&self, now: Instant) -> Gathered {
        let discovery = self.handles.discovery.get();
        let registered = discovery.registration == Some(Registration::Registered);
        // Registered but not yet stamped: counts as registered just now.
        let registered_since = registered.then(|| discovery.continuity.since().unwrap_or(now));
        let ownership = match (self.discovery_config.mode, registered_since) {
            (DiscoveryMode::Off, _) => Ownership::Unchecked,
            (_, None) => Ownership::NotRegistered,
            (_, Some(since)) => Ownership::RegisteredSince(since),
        };
        let mut reservations = self.handles.registry.for_policy();
        let mut subscribers = self
            .handles
            .subscribers
            .for_policy(now, self.cleanup.reconnect_grace);
        // Every live slot of the shard too: another sidecar's reservations and subscribers, and this one's
        // reservations whose sockets closed. A floor of another replica, or of none known, protects every row here;
        // the purge batch names such a row.
        let holder = self.handles.status.read(|s| s.holder.clone());
        let replica = self.knowledge.replica_version();
        for slot in self.knowledge.slots().iter().filter(|s| s.live) {
            let floor = match (slot.effective_floor(), replica) {
                (Some(floor), Some(version)) if slot.problem(Some(version)).is_none() => {
                    Some(floor.to_owned())
                }
                _ => None,
            };
            match slot.kind {
                SlotKind::Reservation => {
                    // This sidecar's own open one is listed once, at the lower of its two floors.
                    match reservations.iter_mut().find(|r| r.task_id == slot.key) {
                        Some(own) => {
                            own.floor = match (own.floor.take(), floor) {
                                (Some(a), Some(b)) => Some(a.min(b)),
                                _ => None,
                            }
                        }
                        None => reservations.push(HeldReservation {
                            task_id: slot.key.clone(),
                            floor,
                        }),
                    }
                }
                SlotKind::Subscriber if slot.holder != holder => {
                    // A subscriber is always at some watermark; one that cannot be trusted holds at the replica
                    // version, below every row.
                    let replica_version = slot.replica_version.clone().unwrap_or_default();
                    subscribers.push(Subscriber {
                        id: slot
                            .subscriber_id
                            .clone()
                            .unwrap_or_else(|| slot.key.clone()),
                        acked: floor.unwrap_or_else(|| replica_version.clone()),
                        replica_version,
                        departed: (!slot.connected).then_some(now),
                        awaits_upstream: false,
                    })
                }
                SlotKind::Subscriber => {}
            }
        }
        Gathered {
            ownership,
            owner: discovery.owner,
            cleanup_delay: self.handles.registry.cleanup_delay(),
            reservations,
            subscribers,
            replica_version: replica.map(str::to_owned),
        }
    }

    /// The guards of a check at `now` (see [`cleanup::Guards`]).
    pub(super) fn guards(&self, now: Instant) -> cleanup::Guards {
        let knowledge = &self.knowledge;
        // The keeper's and the drills' facts.
        let (memory, restored_less, drill_disk) = self.handles.status.read(|s| {
            (
                s.memory,
                s.drills.restored_less.is_some(),
                s.drills.drives_cleanup && s.drills.disk_short().is_some(),
            )
        });
        let memory = memory_guard(memory, knowledge.resumed(), knowledge.slots_unread());
        let (anchor, anchor_wall) = self.anchor;
        // While the replica's size is unknown, "auto" has no end to give the hold: a restore of a replica of
        // unknown size may still be running.
        let hold_without_state = self
            .cleanup
            .hold_without_state
            .known_for(knowledge.db_bytes())
            .unwrap_or(UNKNOWN_SIZE_HOLD);
        cleanup::Guards {
            unservable: knowledge.refused(),
            standby: knowledge.standby() == Some(true),
            memory,
            restores_unknown_until: knowledge.restores_unknown_since().map(|since| {
                // From this run's start at the latest, so that tests and restarts that date the start back agree.
                let since = since.min(anchor_wall);
                let remaining = (since + hold_without_state)
                    .duration_since(anchor_wall)
                    .unwrap_or_default();
                anchor.min(self.started) + remaining
            }),
            reset_at: knowledge.reset_at(),
            replica_unknown: knowledge.replica_version().is_none(),
            position_unknown: knowledge.position_unknown(),
            restored_less,
            drill_disk,
            steady_now: anchor_wall.checked_add(now.saturating_duration_since(anchor)),
        }
    }

    /// Lets the hold for unknown restores go once it has passed, so the shard's memory stops carrying it.
    pub(super) fn settle_unknown_restores(&mut self, guards: &cleanup::Guards, now: Instant) {
        if guards
            .restores_unknown_until
            .is_some_and(|until| now >= until)
        {
            info!("cleanup.hold_without_state has passed since the start without a state file");
            self.knowledge.settle_unknown_restores();
        }
    }
}
