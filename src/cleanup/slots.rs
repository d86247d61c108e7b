//! Slots: what bounds a purge, kept in the change DB where the purge acts, as PostgreSQL keeps a consumer's position
//! in a replication slot (docs/operations.md, "Slots").
//!
//! Every sidecar of a shard writes one row per open reservation and one per subscriber it relays, whichever of them
//! purges; the purger reads every live row inside each purge batch, so a takeover, a restart or a sidecar frozen
//! for minutes cannot make it forget a restore in flight. This file is the pure part: what a row says, when it is
//! live, whether it is well formed, and which one bounds a purge. The statements are in
//! [`crate::cleanup::change_db`], the writer in [`crate::cleanup::keeper`].

use std::fmt;
use std::time::Duration;

use crate::litestream::page::is_lexi_version;

/// What a slot protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SlotKind {
    /// A snapshot reservation: a view-syncer restoring, or about to.
    Reservation,
    /// A relayed subscriber, connected or recently gone.
    Subscriber,
}

impl SlotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotKind::Reservation => "reservation",
            SlotKind::Subscriber => "subscriber",
        }
    }

    pub fn parse(text: &str) -> Option<SlotKind> {
        match text {
            "reservation" => Some(SlotKind::Reservation),
            "subscriber" => Some(SlotKind::Subscriber),
            _ => None,
        }
    }
}

impl fmt::Display for SlotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the slot table as every sidecar reads it, ages by the database's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub kind: SlotKind,
    /// The reservation's task, or the subscriber's key (`holder#n`: Zero's subscriber ids are not unique).
    pub key: String,
    /// The task the reservation or the subscription is for, if it said.
    pub task_id: Option<String>,
    /// Zero's subscriber id, for subscribers.
    pub subscriber_id: Option<String>,
    /// Rows above this watermark are needed; `None`: every row is.
    pub floor: Option<String>,
    /// The replica the floor is a watermark of; `None`: not known when it was written.
    pub replica_version: Option<String>,
    /// Which sidecar holds the slot's socket (or last held it).
    pub holder: String,
    /// Whether its socket was open at the holder's last write.
    pub connected: bool,
    /// Seconds since it opened.
    pub age: Duration,
    /// Seconds since its holder last vouched for it.
    pub since_heartbeat: Duration,
    /// Reservations: how long its restore may take, fixed when it opened from the replica's size then known.
    pub restore_limit: Option<Duration>,
    /// Whether it still bounds purges now (see [`HEARTBEAT`]).
    pub live: bool,
}

impl Slot {
    /// Why the row cannot be trusted, if it cannot: a floor that is not a watermark, or a watermark of another
    /// replica than the change log's. `replica_version` is the log's, read in the same transaction.
    pub fn problem(&self, replica_version: Option<&str>) -> Option<String> {
        let floor = self.floor.as_deref()?;
        if !is_lexi_version(floor) {
            return Some(format!("floor {floor:?} is not a watermark"));
        }
        match (self.replica_version.as_deref(), replica_version) {
            (Some(ours), Some(log)) if ours != log => Some(format!(
                "floor {floor} is a watermark of replica {ours}, not of the change log's replica {log}"
            )),
            _ => None,
        }
    }

    /// The floor the purge honours: a floor whose replica is unknown protects every row.
    pub fn effective_floor(&self) -> Option<&str> {
        self.replica_version.as_ref()?;
        self.floor.as_deref()
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} at {} (held by {})",
            self.kind,
            self.key,
            self.floor.as_deref().unwrap_or("every row"),
            self.holder
        )
    }
}

/// How often a sidecar vouches for its slots, which decides when a slot stops bounding purges (all ages by the
/// database's clock, one clock for every sidecar of a shard):
///
/// - A reservation lives while its holder vouches for its open socket (with room for two missed heartbeats),
///   however long its restore takes; after that until its task subscribes (through any sidecar: that transaction
///   deletes it) or its restore limit has passed since it opened. The limit is fixed when it opens from the
///   replica's size then known; one opened while the size was unknown takes the limit of the size known now, and
///   while no size is known it does not expire at all: a restore of a large replica can take hours.
/// - A subscriber lives while its holder vouches for it, and for its grace after the last heartbeat:
///   `cleanup.reconnect_grace` plus room for two missed heartbeats. A holder that stops (frozen, killed, cut off)
///   frees no floor before that.
///
/// A socket closing frees nothing by itself once a reservation's status went out: a view-syncer restores without
/// its snapshot socket, and a subscriber reconnects within the grace.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How long a subscriber's slot outlives its holder's last heartbeat.
pub fn subscriber_grace(reconnect_grace: Duration) -> Duration {
    reconnect_grace + 3 * HEARTBEAT
}

/// What the live slots allow a purge that may go up to `bound`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotLimit {
    /// No live slot is below the bound.
    Clear,
    /// This slot's floor is below the bound: delete below the floor only.
    Below { floor: String, slot: SlotName },
    /// This slot protects every row (no floor, or mode `pause` and a reservation is open): delete nothing.
    Everything { slot: SlotName },
    /// A live row is not well formed: delete nothing until someone looks.
    Malformed { slot: SlotName, problem: String },
}

/// A slot named for logs and statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotName {
    pub kind: SlotKind,
    pub key: String,
    pub holder: String,
}

impl fmt::Display for SlotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} held by {}", self.kind, self.key, self.holder)
    }
}

impl From<&Slot> for SlotName {
    fn from(slot: &Slot) -> Self {
        SlotName {
            kind: slot.kind,
            key: slot.key.clone(),
            holder: slot.holder.clone(),
        }
    }
}

/// The limit the live `slots` put on a purge below `bound`, for a change log of `replica_version`; `pause`: an open
/// reservation protects every row (`cleanup.reservations = "pause"`). A malformed row wins over everything, then a
/// slot protecting every row, then the lowest floor below the bound (ties: reservations first, then by key).
pub fn limit(slots: &[Slot], bound: &str, replica_version: Option<&str>, pause: bool) -> SlotLimit {
    let live = || slots.iter().filter(|s| s.live);
    let mut ordered: Vec<&Slot> = live().collect();
    ordered.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
    if let Some((slot, problem)) = ordered
        .iter()
        .find_map(|s| s.problem(replica_version).map(|p| (*s, p)))
    {
        return SlotLimit::Malformed {
            slot: slot.into(),
            problem,
        };
    }
    if let Some(slot) = ordered
        .iter()
        .find(|s| s.effective_floor().is_none() || (pause && s.kind == SlotKind::Reservation))
    {
        return SlotLimit::Everything {
            slot: (*slot).into(),
        };
    }
    ordered
        .iter()
        .filter_map(|s| s.effective_floor().map(|f| (f, *s)))
        .filter(|(floor, _)| *floor < bound)
        .min_by(|a, b| a.0.cmp(b.0))
        .map_or(SlotLimit::Clear, |(floor, slot)| SlotLimit::Below {
            floor: floor.to_owned(),
            slot: slot.into(),
        })
}

/// The live slot that bounds purges now, with no bound of the purge's own: the lowest floor, or one protecting
/// everything (for `/status`).
pub fn bounding(slots: &[Slot], replica_version: Option<&str>, pause: bool) -> Option<SlotLimit> {
    // Above every watermark: every floor is below it.
    match limit(slots, "\u{10FFFF}", replica_version, pause) {
        SlotLimit::Clear => None,
        other => Some(other),
    }
}

/// Who this process is in the slot table: the host and the process, and when it started, so that two runs of one
/// host never share their rows.
pub fn holder_name(host: &str, pid: u32, started_unix_ms: u128) -> String {
    format!("{host}/{pid}/{}", started_unix_ms % 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(kind: SlotKind, key: &str, floor: Option<&str>) -> Slot {
        Slot {
            kind,
            key: key.into(),
            task_id: None,
            subscriber_id: None,
            floor: floor.map(Into::into),
            replica_version: Some("01".into()),
            holder: "a".into(),
            connected: true,
            age: Duration::ZERO,
            since_heartbeat: Duration::ZERO,
            restore_limit: None,
            live: true,
        }
    }

    #[test]
    fn the_lowest_live_floor_below_the_bound_limits_the_purge() {
        let mut slots = vec![
            slot(SlotKind::Subscriber, "s#1", Some("0e")),
            slot(SlotKind::Reservation, "vs-1", Some("0c")),
            slot(SlotKind::Reservation, "vs-2", Some("0a")),
        ];
        slots[2].live = false;
        assert_eq!(
            limit(&slots, "0f", Some("01"), false),
            SlotLimit::Below {
                floor: "0c".into(),
                slot: SlotName {
                    kind: SlotKind::Reservation,
                    key: "vs-1".into(),
                    holder: "a".into()
                }
            }
        );
        // At or below every floor: nothing to lower.
        assert_eq!(limit(&slots, "0c", Some("01"), false), SlotLimit::Clear);
        assert_eq!(limit(&[], "0c", Some("01"), false), SlotLimit::Clear);
    }

    #[test]
    fn a_slot_without_a_floor_or_a_known_replica_protects_every_row() {
        let mut slots = vec![
            slot(SlotKind::Subscriber, "s#1", Some("0e")),
            slot(SlotKind::Reservation, "vs-1", None),
        ];
        assert!(matches!(
            limit(&slots, "0f", Some("01"), false),
            SlotLimit::Everything { slot } if slot.key == "vs-1"
        ));
        slots[1].floor = Some("0f".into());
        slots[1].replica_version = None;
        assert!(matches!(
            limit(&slots, "0a", Some("01"), false),
            SlotLimit::Everything { slot } if slot.key == "vs-1"
        ));
        // Mode pause: any open reservation.
        slots[1].replica_version = Some("01".into());
        assert!(matches!(
            limit(&slots, "0a", Some("01"), true),
            SlotLimit::Everything { slot } if slot.key == "vs-1"
        ));
        assert_eq!(limit(&slots, "0a", Some("01"), false), SlotLimit::Clear);
    }

    #[test]
    fn malformed_rows_stop_everything_and_are_named() {
        for (floor, replica, says) in [
            ("zz", "01", "not a watermark"),
            ("", "01", "not a watermark"),
            ("0e", "02", "replica 02"),
        ] {
            let mut slots = vec![slot(SlotKind::Reservation, "vs-1", Some("0a"))];
            let mut bad = slot(SlotKind::Subscriber, "b#7", Some(floor));
            bad.replica_version = Some(replica.into());
            slots.push(bad);
            match limit(&slots, "0f", Some("01"), false) {
                SlotLimit::Malformed { slot, problem } => {
                    assert_eq!(slot.key, "b#7");
                    assert!(problem.contains(says), "{problem}");
                }
                other => panic!("{floor}/{replica}: {other:?}"),
            }
        }
        // A dead malformed row bounds nothing.
        let mut dead = slot(SlotKind::Subscriber, "b#7", Some("zz"));
        dead.live = false;
        assert_eq!(limit(&[dead], "0f", Some("01"), false), SlotLimit::Clear);
    }

    #[test]
    fn the_bounding_slot_is_the_lowest_whatever_the_bound() {
        let slots = vec![
            slot(SlotKind::Subscriber, "s#1", Some("4l002q")),
            slot(SlotKind::Reservation, "vs-1", Some("4l005u")),
        ];
        assert!(matches!(
            bounding(&slots, Some("01"), false),
            Some(SlotLimit::Below { floor, .. }) if floor == "4l002q"
        ));
        assert_eq!(bounding(&[], Some("01"), false), None);
    }

    #[test]
    fn holders_differ_between_runs_of_one_host() {
        assert_ne!(holder_name("h", 7, 1000), holder_name("h", 7, 2000));
        assert_eq!(holder_name("h", 7, 1000), "h/7/1000");
    }
}
