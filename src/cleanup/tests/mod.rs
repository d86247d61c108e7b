//! Tests of the cleanup decision, one file per subject, over the fixtures here: a [`Case`] of owned inputs decided
//! at [`NOW`], and the decisions the tests expect of it.

mod backlog;
mod backups;
mod ceiling;
mod destination;
mod guards;
mod labels;
mod properties;
mod reservations;
mod start_up;
mod subscribers;
mod timeline;

use super::*;
use std::sync::OnceLock;
use std::time::UNIX_EPOCH;

/// Seconds since the test epoch at which most tests decide.
const NOW: u64 = 10_000;
/// The replica version every test subscriber asked for; below every test watermark.
const RV: &str = "01";

fn at(secs: u64) -> Instant {
    // A fixed base keeps the arithmetic readable; Instant has no zero.
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now) + Duration::from_secs(secs)
}

fn wall(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_746_600_000 + secs)
}

fn wm(s: &str) -> String {
    s.to_owned()
}

/// Backed up `secs_ago` seconds before [`NOW`].
fn backup(watermark: &str, secs_ago: u64) -> Backup {
    Backup {
        watermark: wm(watermark),
        backed_up_at: wall(NOW - secs_ago),
    }
}

fn reservation(task_id: &str, floor: Option<&str>) -> HeldReservation {
    HeldReservation {
        task_id: task_id.to_owned(),
        floor: floor.map(wm),
    }
}

fn sub(acked: &str) -> Subscriber {
    Subscriber {
        id: format!("vs-{acked}"),
        acked: wm(acked),
        replica_version: wm(RV),
        departed: None,
        awaits_upstream: false,
    }
}

/// Disconnected `secs_ago` seconds before [`NOW`].
fn departed(acked: &str, secs_ago: u64) -> Subscriber {
    Subscriber {
        departed: Some(at(NOW - secs_ago)),
        ..sub(acked)
    }
}

/// Owned inputs; defaults: long uptime, 60 s delay, 30 s grace, mode pin, nothing tracked.
struct Case {
    now: u64,
    started: u64,
    ownership: Ownership,
    delay: u64,
    grace: u64,
    mode: ReservationMode,
    without_subscribers: WithoutSubscribers,
    backups: Vec<Backup>,
    reservations: Vec<HeldReservation>,
    subscribers: Vec<Subscriber>,
    last_purged: Option<String>,
    /// The gauge: `(highest, current)`; unset, it reports the newest backup.
    gauge: Option<(&'static str, &'static str)>,
    destination: DestinationCheck,
    other_generation: Vec<String>,
    guards: Guards,
}

fn case() -> Case {
    Case {
        now: NOW,
        started: 0,
        ownership: Ownership::Unchecked,
        delay: 60,
        grace: 30,
        mode: ReservationMode::Pin,
        without_subscribers: WithoutSubscribers::Hold,
        backups: vec![],
        reservations: vec![],
        subscribers: vec![],
        last_purged: None,
        gauge: None,
        destination: DestinationCheck::Unchecked,
        other_generation: vec![],
        guards: Guards::default(),
    }
}

impl Case {
    fn decide(&self) -> Decision {
        let newest = self.backups.iter().map(|b| b.watermark.as_str()).max();
        let (highest, current) = self
            .gauge
            .map_or((newest, newest), |(h, c)| (Some(h), Some(c)));
        decide(&Inputs {
            now: at(self.now),
            wall_now: wall(self.now),
            started: at(self.started),
            ownership: self.ownership,
            cleanup_delay: Duration::from_secs(self.delay),
            reconnect_grace: Duration::from_secs(self.grace),
            mode: self.mode,
            without_subscribers: self.without_subscribers,
            backups: &self.backups,
            reservations: &self.reservations,
            subscribers: &self.subscribers,
            last_purged: self.last_purged.as_deref(),
            highest_backup: highest,
            current_backup: current,
            destination: self.destination,
            other_generation: &self.other_generation,
            guards: self.guards,
        })
    }
}

/// A purge below the newest aged backup, which nothing lowered.
fn purge(before: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Backup,
    }
}

/// A purge lowered to `before` by reservation `task_id`'s floor.
fn purge_at_floor(before: &str, task_id: &str, floor: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Reservation {
            task_id: wm(task_id),
            floor: wm(floor),
        },
    }
}

/// A purge lowered to `before` by the subscriber that acked `acked` (ids are `vs-{acked}`).
fn purge_at_ack(before: &str, acked: &str) -> Decision {
    Decision::Purge {
        before: wm(before),
        bound: Bound::Subscriber {
            id: format!("vs-{acked}"),
            acked: wm(acked),
        },
    }
}

/// One aged backup at "0a" and a caught-up subscriber: purges unless the test adds an obstacle.
fn ready() -> Case {
    Case {
        backups: vec![backup("0a", 120)],
        subscribers: vec![sub("0a")],
        ..case()
    }
}
