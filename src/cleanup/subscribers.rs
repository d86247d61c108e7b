//! Relayed subscribers and how far each has acknowledged: the cleanup policy's view of who still needs which
//! change-log rows (docs/protocol.md, "A subscriber's acknowledged watermark").
//!
//! The relay registers a subscriber when the upstream accepts it, advances its acked watermark as commits are
//! acknowledged, and drops the handle when the connection ends; the departure is remembered for the reconnect
//! grace so that a subscriber between two connections still holds cleanup back.
//!
//! A grace cannot run while the upstream is away: subscribers it dropped back off and come back only after it
//! returns, one at a time. So once the upstream has been lost, departed subscribers are kept, and each gets its
//! grace anew from the upstream's return: the first to reconnect does not let cleanup run past the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cleanup;
use crate::protocol::Mode;

/// What a subscription said about itself in its query string (docs/protocol.md, "Subscription parameters").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberInfo {
    /// Zero's `id` parameter, for logs.
    pub id: String,
    pub task_id: Option<String>,
    pub mode: Mode,
    pub replica_version: String,
    /// The watermark it subscribed from: durable on the subscriber already.
    pub watermark: String,
}

#[derive(Debug, Clone)]
struct Seen {
    info: SubscriberInfo,
    acked: String,
    connected: Instant,
    departed: Option<Instant>,
    /// The newest commit relayed to it, and when it first was.
    last_sent: Option<String>,
    last_sent_at: Option<Instant>,
    /// When the oldest commit relayed to it and not yet acknowledged was relayed: how long it has been behind.
    unacked_since: Option<Instant>,
}

/// A subscriber as the state file keeps it across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptSubscriber {
    pub id: String,
    pub task_id: Option<String>,
    /// `mode=backup` (a replication-manager's backup replicator) rather than a serving view-syncer.
    pub backup: bool,
    pub replica_version: String,
    pub acked: String,
}

/// A relayed subscriber as `/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberView {
    pub info: SubscriberInfo,
    pub acked: String,
    pub connected: Instant,
    pub departed: Option<Instant>,
    /// See [`Seen::unacked_since`]; `None` while it has acknowledged every commit relayed to it.
    pub unacked_since: Option<Instant>,
}

/// Shared registry of relayed subscribers. Cheap to clone; the lock is never held across an `.await`.
#[derive(Clone, Default)]
pub struct Subscribers {
    inner: Arc<Mutex<Roster>>,
}

#[derive(Default)]
struct Roster {
    next_id: u64,
    entries: HashMap<u64, Seen>,
    /// The upstream was lost and has not been reached since.
    upstream_lost: bool,
    /// The newest commit relayed to any tracked subscriber, and when it first was.
    newest_commit: Option<(String, Instant)>,
}

impl Seen {
    /// Tracked by the policy at `now`: connected, departed within `grace`, or departed at any time while the
    /// upstream is lost (`waiting`).
    fn is_tracked(&self, waiting: bool, now: Instant, grace: Duration) -> bool {
        match self.departed {
            None => true,
            Some(at) => waiting || now.saturating_duration_since(at) < grace,
        }
    }
}

impl Subscribers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a connected subscriber; its acked watermark starts at the watermark it subscribed from.
    pub fn connect(&self, info: SubscriberInfo) -> SubscriberHandle {
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        let acked = info.watermark.clone();
        inner.entries.insert(
            id,
            Seen {
                info,
                acked,
                connected: Instant::now(),
                departed: None,
                last_sent: None,
                last_sent_at: None,
                unacked_since: None,
            },
        );
        SubscriberHandle {
            subscribers: self.clone(),
            id,
        }
    }

    /// Subscribers connected now.
    pub fn connected(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|e| e.departed.is_none())
            .count()
    }

    /// The subscribers the policy tracks now (see [`Subscribers::for_policy`]), as the state file keeps them: after
    /// a restart they are the previous run's, cut off by it, and still to be waited for.
    pub fn to_keep(&self, now: Instant, grace: Duration) -> Vec<KeptSubscriber> {
        let inner = self.lock();
        let waiting = inner.upstream_lost;
        let mut list: Vec<KeptSubscriber> = inner
            .entries
            .values()
            .filter(|e| e.is_tracked(waiting, now, grace))
            .map(|e| KeptSubscriber {
                id: e.info.id.clone(),
                task_id: e.info.task_id.clone(),
                backup: e.info.mode == Mode::Backup,
                replica_version: e.info.replica_version.clone(),
                acked: e.acked.clone(),
            })
            .collect();
        list.sort_by(|a, b| (&a.id, &a.acked).cmp(&(&b.id, &b.acked)));
        list
    }

    /// Takes the subscribers the previous run tracked, departed at `now`: the restart cut each one off, and each
    /// gets its reconnect grace from here (or longer, should the upstream turn out lost) to come back.
    pub fn keep(&self, kept: Vec<KeptSubscriber>, now: Instant) {
        let mut inner = self.lock();
        for k in kept {
            inner.next_id += 1;
            let id = inner.next_id;
            inner.entries.insert(
                id,
                Seen {
                    info: SubscriberInfo {
                        id: k.id,
                        task_id: k.task_id,
                        mode: if k.backup {
                            Mode::Backup
                        } else {
                            Mode::Serving
                        },
                        replica_version: k.replica_version,
                        watermark: k.acked.clone(),
                    },
                    acked: k.acked,
                    connected: now,
                    departed: Some(now),
                    last_sent: None,
                    last_sent_at: None,
                    unacked_since: None,
                },
            );
        }
    }

    /// The upstream dropped a subscription or could not be reached: departed subscribers stay until it is back.
    pub fn upstream_lost(&self) {
        self.lock().upstream_lost = true;
    }

    /// The upstream answered again: every subscriber that departed before gets its full grace from `now`.
    pub fn upstream_reached(&self, now: Instant) {
        let mut inner = self.lock();
        if std::mem::take(&mut inner.upstream_lost) {
            for departed in inner
                .entries
                .values_mut()
                .filter_map(|e| e.departed.as_mut())
            {
                *departed = (*departed).max(now);
            }
        }
    }

    /// The policy's input: connected subscribers and those that left within `grace`, or at any time while the
    /// upstream is lost (shown as departed `now`). Older departures are forgotten here.
    pub fn for_policy(&self, now: Instant, grace: Duration) -> Vec<cleanup::Subscriber> {
        let mut inner = self.lock();
        let waiting = inner.upstream_lost;
        inner
            .entries
            .retain(|_, e| e.is_tracked(waiting, now, grace));
        inner
            .entries
            .values()
            .map(|e| cleanup::Subscriber {
                id: e.info.id.clone(),
                acked: e.acked.clone(),
                replica_version: e.info.replica_version.clone(),
                departed: e.departed.map(|at| if waiting { at.max(now) } else { at }),
                awaits_upstream: waiting && e.departed.is_some(),
            })
            .collect()
    }

    /// Every subscriber the policy still tracks, as its slot says it, by its number in this run (unique here, where
    /// Zero's ids are not).
    pub fn for_slots(&self, now: Instant, grace: Duration) -> Vec<(u64, SubscriberView)> {
        let inner = self.lock();
        let waiting = inner.upstream_lost;
        inner
            .entries
            .iter()
            .filter(|(_, e)| e.is_tracked(waiting, now, grace))
            .map(|(n, e)| {
                (
                    *n,
                    SubscriberView {
                        info: e.info.clone(),
                        acked: e.acked.clone(),
                        connected: e.connected,
                        departed: e.departed,
                        unacked_since: e.unacked_since,
                    },
                )
            })
            .collect()
    }

    /// Every subscriber the policy still tracks (see [`Subscribers::for_policy`]), connected ones first, each
    /// group oldest first. Reads only: departures past the grace are forgotten by the policy's next check.
    pub fn view(&self, now: Instant, grace: Duration) -> Vec<SubscriberView> {
        let inner = self.lock();
        let waiting = inner.upstream_lost;
        let mut list: Vec<_> = inner
            .entries
            .values()
            .filter(|e| e.is_tracked(waiting, now, grace))
            .map(|e| SubscriberView {
                info: e.info.clone(),
                acked: e.acked.clone(),
                connected: e.connected,
                departed: e.departed,
                unacked_since: e.unacked_since,
            })
            .collect();
        list.sort_by(|a, b| {
            (a.departed.is_some(), a.connected, &a.info.id).cmp(&(
                b.departed.is_some(),
                b.connected,
                &b.info.id,
            ))
        });
        list
    }

    /// The newest commit watermark relayed to any tracked subscriber (byte-wise), and when it was first relayed:
    /// what `/status` measures subscribers' lag against.
    pub fn newest_commit(&self) -> Option<(String, Instant)> {
        self.lock().newest_commit.clone()
    }

    /// The newest commit relayed to a subscriber of replica `replica_version` that is still known (connected, or
    /// departed and not yet forgotten), and when it was first relayed: what the change log of that replica must
    /// come to hold ([`crate::cleanup::unservable::LogWatch`]). Only that replica's subscribers count, so that a
    /// resync onto lower watermarks is not judged by the old replica's commits.
    pub fn newest_commit_of(&self, replica_version: &str) -> Option<(String, Instant)> {
        let inner = self.lock();
        let mut newest: Option<(&str, Instant)> = None;
        for entry in inner
            .entries
            .values()
            .filter(|e| e.info.replica_version == replica_version)
        {
            let (Some(sent), Some(at)) = (entry.last_sent.as_deref(), entry.last_sent_at) else {
                continue;
            };
            newest = match newest {
                Some((w, first)) if sent < w || (sent == w && first <= at) => Some((w, first)),
                _ => Some((sent, at)),
            };
        }
        newest.map(|(w, at)| (w.to_owned(), at))
    }

    /// The acked watermarks of connected subscribers, by Zero's `id`, for logs and tests.
    pub fn acked_by_id(&self) -> Vec<(String, String)> {
        let mut list: Vec<_> = self
            .lock()
            .entries
            .values()
            .filter(|e| e.departed.is_none())
            .map(|e| (e.info.id.clone(), e.acked.clone()))
            .collect();
        list.sort();
        list
    }
}

/// A connected subscriber. Dropping it records the departure time.
pub struct SubscriberHandle {
    subscribers: Subscribers,
    id: u64,
}

impl SubscriberHandle {
    /// Records that a commit at `watermark` was relayed to the subscriber at `at`.
    pub fn sent(&self, watermark: &str, at: Instant) {
        let mut inner = self.subscribers.lock();
        match &mut inner.newest_commit {
            Some((newest, since)) if watermark > newest.as_str() => {
                overwrite(newest, watermark);
                *since = at;
            }
            Some(_) => {}
            none => *none = Some((watermark.to_string(), at)),
        }
        if let Some(entry) = inner.entries.get_mut(&self.id) {
            if watermark > entry.acked.as_str() && entry.unacked_since.is_none() {
                entry.unacked_since = Some(at);
            }
            match &mut entry.last_sent {
                Some(last) if watermark > last.as_str() => {
                    overwrite(last, watermark);
                    entry.last_sent_at = Some(at);
                }
                Some(_) => {}
                none => {
                    *none = Some(watermark.to_string());
                    entry.last_sent_at = Some(at);
                }
            }
        }
    }

    /// Records that the subscriber acknowledged a commit at `watermark`. Watermarks compare as bytes; an older
    /// one never moves the acked watermark back. Once it has acknowledged the newest commit relayed to it, it is
    /// no longer behind.
    pub fn ack(&self, watermark: &str) {
        self.ack_with_pending(watermark, None);
    }

    /// [`SubscriberHandle::ack`], with when the oldest commit still unacknowledged was relayed, if any is.
    pub fn ack_with_pending(&self, watermark: &str, pending_since: Option<Instant>) {
        let mut inner = self.subscribers.lock();
        if let Some(entry) = inner.entries.get_mut(&self.id) {
            if watermark > entry.acked.as_str() {
                overwrite(&mut entry.acked, watermark);
            }
            let caught_up = entry
                .last_sent
                .as_deref()
                .is_none_or(|last| last <= entry.acked.as_str());
            entry.unacked_since = if caught_up {
                None
            } else {
                pending_since.or(entry.unacked_since)
            };
        }
    }

    pub fn acked(&self) -> String {
        let inner = self.subscribers.lock();
        inner
            .entries
            .get(&self.id)
            .map(|e| e.acked.clone())
            .unwrap_or_default()
    }
}

/// Replaces `dst` with `src` in the buffer it already has: a live stream relays a commit, and reads an ack, every
/// few hundred microseconds, and watermarks are all about as long, so this saves an allocation and a free for each of the three per commit.
fn overwrite(dst: &mut String, src: &str) {
    dst.clear();
    dst.push_str(src);
}

impl Drop for SubscriberHandle {
    fn drop(&mut self) {
        let mut inner = self.subscribers.lock();
        if let Some(entry) = inner.entries.get_mut(&self.id) {
            entry.departed = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, watermark: &str) -> SubscriberInfo {
        SubscriberInfo {
            id: id.into(),
            task_id: None,
            mode: Mode::Serving,
            replica_version: "01".into(),
            watermark: watermark.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acks_only_move_forward_and_departures_are_kept_for_the_grace() {
        let subscribers = Subscribers::default();
        let a = subscribers.connect(info("a", "0a"));
        let b = subscribers.connect(info("b", "0b"));
        a.ack("0c");
        a.ack("0b");
        assert_eq!(a.acked(), "0c");
        assert_eq!(
            subscribers.acked_by_id(),
            [
                ("a".to_string(), "0c".to_string()),
                ("b".to_string(), "0b".to_string())
            ]
        );
        drop(b);
        assert_eq!(subscribers.connected(), 1);
        let grace = Duration::from_secs(30);
        let view = subscribers.for_policy(Instant::now(), grace);
        assert_eq!(view.len(), 2);
        assert_eq!(view.iter().filter(|s| s.departed.is_some()).count(), 1);
        tokio::time::advance(Duration::from_secs(31)).await;
        let view = subscribers.for_policy(Instant::now(), grace);
        assert_eq!(view.len(), 1);
        assert_eq!(view[0].acked, "0c");
    }

    /// Lexi watermarks grow longer as they grow: each bookkeeping string is rewritten in place, longer and shorter.
    #[tokio::test(start_paused = true)]
    async fn relayed_and_acked_commits_are_tracked_whatever_their_length() {
        let subscribers = Subscribers::default();
        let a = subscribers.connect(info("a", "0a"));
        let first = Instant::now();
        a.sent("1az", first);
        tokio::time::advance(Duration::from_millis(5)).await;
        a.sent("0b", Instant::now());
        a.sent("2b10", Instant::now());
        assert_eq!(
            subscribers.newest_commit(),
            Some(("2b10".to_string(), Instant::now()))
        );
        let behind = |subscribers: &Subscribers| {
            subscribers.view(Instant::now(), Duration::from_secs(30))[0].unacked_since
        };
        assert_eq!(behind(&subscribers), Some(first));

        a.ack_with_pending("1az", Some(Instant::now()));
        assert_eq!(a.acked(), "1az");
        assert_eq!(behind(&subscribers), Some(Instant::now()));
        a.ack("0b");
        assert_eq!(a.acked(), "1az", "an older ack does not move it back");
        a.ack("2b10");
        assert_eq!(a.acked(), "2b10");
        assert_eq!(
            behind(&subscribers),
            None,
            "caught up with the newest relayed"
        );
        tokio::time::advance(Duration::from_millis(5)).await;
        let newest = subscribers.newest_commit();
        a.sent("2b1", Instant::now());
        assert_eq!(
            behind(&subscribers),
            None,
            "an older commit than acked is not behind"
        );
        assert_eq!(subscribers.newest_commit(), newest, "nor the newest");
        a.sent("2b11", Instant::now());
        assert_eq!(behind(&subscribers), Some(Instant::now()));
        a.ack("2b11");
        assert_eq!(a.acked(), "2b11");
        assert_eq!(behind(&subscribers), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_newest_commit_of_a_replica_counts_only_its_subscribers_and_the_first_time_it_was_relayed(
    ) {
        let subscribers = Subscribers::default();
        assert_eq!(subscribers.newest_commit_of("01"), None);
        let a = subscribers.connect(info("a", "0a"));
        let b = subscribers.connect(info("b", "0a"));
        let old = subscribers.connect(SubscriberInfo {
            replica_version: "00".into(),
            ..info("old", "9a")
        });
        let first = Instant::now();
        a.sent("0c", first);
        old.sent("9z", first);
        tokio::time::advance(Duration::from_secs(3)).await;
        b.sent("0c", Instant::now());
        b.sent("0b", Instant::now());
        assert_eq!(
            subscribers.newest_commit_of("01"),
            Some(("0c".to_string(), first)),
            "the other replica's 9z does not count, and 0c was first relayed to a"
        );
        assert_eq!(
            subscribers.newest_commit_of("00"),
            Some(("9z".to_string(), first))
        );
        // A departed subscriber still counts until it is forgotten.
        drop(a);
        b.sent("0d", Instant::now());
        assert_eq!(
            subscribers.newest_commit_of("01"),
            Some(("0d".to_string(), Instant::now()))
        );
        assert_eq!(subscribers.newest_commit_of("02"), None);
    }

    /// With no reconnect grace, a subscriber the upstream cut off still holds cleanup until the upstream is back.
    #[tokio::test(start_paused = true)]
    async fn without_a_grace_subscribers_cut_off_with_the_upstream_hold_until_it_returns() {
        let subscribers = Subscribers::default();
        let none = Duration::ZERO;
        let a = subscribers.connect(info("a", "0a"));
        tokio::time::advance(Duration::from_secs(1)).await;
        subscribers.upstream_lost();
        drop(a);
        tokio::time::advance(Duration::from_secs(60)).await;
        let now = Instant::now();
        let view = subscribers.for_policy(now, none);
        assert_eq!(view.len(), 1);
        assert!(view[0].is_tracked(now, none), "{view:?}");

        subscribers.upstream_reached(Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        let now = Instant::now();
        assert!(subscribers
            .for_policy(now, none)
            .iter()
            .all(|s| !s.is_tracked(now, none)));
    }

    #[tokio::test(start_paused = true)]
    async fn subscribers_dropped_with_the_upstream_get_their_grace_from_its_return() {
        let subscribers = Subscribers::default();
        let grace = Duration::from_secs(30);
        let a = subscribers.connect(info("a", "0a"));
        let b = subscribers.connect(info("b", "0b"));
        // The upstream goes away and takes both subscriptions with it, for longer than the grace.
        drop((a, b));
        subscribers.upstream_lost();
        tokio::time::advance(Duration::from_secs(300)).await;
        let view = subscribers.for_policy(Instant::now(), grace);
        assert_eq!(view.len(), 2, "kept while the upstream is lost");
        assert!(view.iter().all(|s| s.is_tracked(Instant::now(), grace)));

        // It is back; b reconnects at once, a is still backing off: a keeps holding cleanup for a whole grace.
        subscribers.upstream_reached(Instant::now());
        let _b = subscribers.connect(info("b", "0b"));
        tokio::time::advance(Duration::from_secs(29)).await;
        let view = subscribers.for_policy(Instant::now(), grace);
        let tracked: Vec<_> = view
            .iter()
            .filter(|s| s.is_tracked(Instant::now(), grace))
            .map(|s| (s.id.as_str(), s.departed.is_some()))
            .collect();
        assert!(tracked.contains(&("a", true)), "{tracked:?}");
        // Past it, a is forgotten; reaching the upstream again changes nothing.
        tokio::time::advance(Duration::from_secs(2)).await;
        subscribers.upstream_reached(Instant::now());
        let view = subscribers.for_policy(Instant::now(), grace);
        assert!(view.iter().all(|s| s.id != "a"), "{view:?}");
    }
}
