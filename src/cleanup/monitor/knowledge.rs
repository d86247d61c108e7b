//! What the cleanup loop knows between checks, and how each observation changes it: transitions without I/O that
//! return what happened, for the loop to log and pass on. The loop reads (litestream's page, the change DB, the
//! destination), hands each reading to one transition here, and publishes the result once per check
//! ([`Knowledge::publish`]); nothing else writes these facts, so no reader sees a half-applied check and no fact is
//! kept in two places that can disagree.

use std::time::SystemTime;

use crate::cleanup::reservations::Registry;
use crate::cleanup::slots::{Slot, SlotLimit, SlotName};
use crate::cleanup::status::{BackupStatus, Status, RECENT_BACKUPS};
use crate::cleanup::unservable::{Reason, Refusals, Unservable};
use crate::cleanup::{Backlog, GaugeMove, LastPurge, PurgeRun};
use crate::litestream::destination::{ListError, Listing};
use crate::litestream::drill::{Failure, Proof};
use crate::litestream::page::Parsed;

use super::Resumed;

/// The owner of what the loop knows: litestream's position and the backlog of its claims, the replica the change
/// log belongs to, the shard's purger lock and slots, the destination's listing and the standing refusals.
#[derive(Debug, Default)]
pub struct Knowledge {
    backlog: Backlog,
    litestream: Litestream,
    replica: Replica,
    /// `(last purge, gauge)` since the first gauge after a start came below the last purge.
    below_purge: Option<(String, String)>,
    /// `(old, new, when)`: the latest change of the replica version seen (a resync).
    replica_reset: Option<(String, String, SystemTime)>,
    /// Since when nothing says which restores were in flight, while cleanup holds for it.
    restores_unknown_since: Option<SystemTime>,
    /// `Some(true)` while another sidecar holds the shard's purger lock; `None` before the first answer.
    standby: Option<bool>,
    /// The shard's memory has been taken in ([`Knowledge::on_resumed`]): until then the last purge and the highest
    /// backup are unknown, whatever the keeper's status already says.
    resumed: bool,
    slots: Slots,
    backup: BackupStatus,
    refusals: Refusals,
}

/// Litestream as its page (or, under `cleanup.requires = "restore"`, the drills' proofs) showed it.
#[derive(Debug, Default)]
struct Litestream {
    /// `process_start_time_seconds` of the last page that had it.
    process_started: Option<f64>,
    /// Why the position is unknown, while it is.
    unknown: Option<String>,
    /// The largest database on the last page that said.
    db_bytes: Option<u64>,
    /// The next sample is the first since a start (or since the shard's memory was taken in): one below the last
    /// purge then means the backup went back across the restart.
    first: bool,
}

/// The replica the change log belongs to, and its last change.
#[derive(Debug, Default)]
struct Replica {
    version: Option<String>,
    reset_at: Option<SystemTime>,
}

/// The shard's slots as last read.
#[derive(Debug, Default)]
struct Slots {
    all: Vec<Slot>,
    bounding: Option<SlotLimit>,
    problem: Option<String>,
}

/// What one page (or proof) changed of litestream's position.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PositionSeen {
    /// The position became unknown now, for this reason (said once: the first reason stays until it is known).
    pub lost: Option<String>,
    /// The backup itself may be gone or older: the registry forgets it, so statuses wait and new reservations
    /// protect every row.
    pub forget_backup: bool,
    /// The position is known again; why it was not.
    pub found: Option<String>,
    /// A litestream that restarted shows a backup again.
    pub restarted: bool,
    /// The samples taken, when there were any.
    pub taken: Option<Taken>,
}

/// One page's samples taken into the backlog.
#[derive(Debug, PartialEq, Eq)]
pub struct Taken {
    /// Watermarks tracked for the first time.
    pub added: usize,
    /// Where the gauge is now: what a reservation opened now is pinned at.
    pub current: String,
    pub gauge: Option<GaugeMove>,
    /// `(last purge, gauge)` when this is the first sample since a start and it is below the last purge: a
    /// restore of this backup cannot catch up from the change log.
    pub below_purge: Option<(String, String)>,
}

/// How the purger lock moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMove {
    /// This sidecar purges for the shard now (first answer, or taken over from another).
    Took,
    /// Another sidecar holds it.
    Lost,
    Same,
}

/// What a read of the shard's slots changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlotsSeen {
    /// A slot bounds purges as malformed, newly so.
    pub malformed: Option<(SlotName, String)>,
    /// Slots are readable after a failed read.
    pub readable_again: bool,
    /// A failed read, newly this problem.
    pub problem: Option<String>,
}

/// What a listing of the destination changed.
#[derive(Debug, PartialEq, Eq)]
pub enum StaleMove {
    /// Claims have nothing behind them now: `(newest object, newest claim)`.
    Began(Option<SystemTime>, SystemTime),
    Ended(Option<SystemTime>),
    Same,
}

/// What a running purge holds litestream's page (or proofs) to before each batch, as of the check that decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct GaugeWatch {
    highest: Option<String>,
    process_started: Option<f64>,
    reset_at: Option<SystemTime>,
}

/// Whether a page read during a purge still supports it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why it does not (the purge stops; the next check decides afresh).
    pub moved: Option<String>,
    /// The newest watermark the page shows, for the registry to pin new reservations at.
    pub saw: Option<String>,
    /// The backup may be gone or older: the registry forgets it.
    pub forget_backup: bool,
}

impl PositionSeen {
    /// Hands the change to the reservation registry, which pins new reservations at litestream's position (and
    /// lowers open ones to a gauge that went back). Returns how many floors it lowered.
    pub fn pass_on(&self, registry: &Registry) -> usize {
        if self.forget_backup {
            registry.forget_backup();
        }
        self.taken
            .as_ref()
            .map_or(0, |taken| registry.saw_backup(&taken.current))
    }
}

impl Verdict {
    /// Hands what the page read during a purge showed to the reservation registry, as [`PositionSeen::pass_on`].
    pub fn pass_on(&self, registry: &Registry) {
        if self.forget_backup {
            registry.forget_backup();
        }
        if let Some(newest) = &self.saw {
            registry.saw_backup(newest);
        }
    }
}

impl Knowledge {
    /// Nothing known yet: the first sample is compared with the last purge as a first page after a start is.
    pub fn new(verifying: bool) -> Self {
        let mut knowledge = Self::default();
        knowledge.litestream.first = true;
        knowledge.backup.verifying = verifying;
        knowledge
    }

    pub fn backlog(&self) -> &Backlog {
        &self.backlog
    }

    pub fn replica_version(&self) -> Option<&str> {
        self.replica.version.as_deref()
    }

    pub fn reset_at(&self) -> Option<SystemTime> {
        self.replica.reset_at
    }

    pub fn position_unknown(&self) -> bool {
        self.litestream.unknown.is_some()
    }

    pub fn db_bytes(&self) -> Option<u64> {
        self.litestream.db_bytes
    }

    pub fn standby(&self) -> Option<bool> {
        self.standby
    }

    pub fn resumed(&self) -> bool {
        self.resumed
    }

    pub fn restores_unknown_since(&self) -> Option<SystemTime> {
        self.restores_unknown_since
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots.all
    }

    pub fn slots_unread(&self) -> bool {
        self.slots.problem.is_some()
    }

    pub fn refused(&self) -> bool {
        !self.refusals.is_empty()
    }

    /// The generation a restore picks, as the latest listing read it (`None`: nothing listed, nothing restorable).
    pub fn restore_target(&self) -> Option<&str> {
        let listing = self.backup.listing.as_ref()?;
        Some(listing.layout.chain()?.generation.as_str())
    }

    /// The tracked claims of a generation other than the one a restore picks, which the destination's objects do
    /// not cover ([`crate::cleanup::Inputs::other_generation`]).
    pub fn claims_of_other_generations(&self) -> Vec<String> {
        let Some(listing) = self.backup.listing.as_ref() else {
            return Vec::new();
        };
        self.backlog
            .backups()
            .iter()
            .filter(|b| listing.claim_of_another_generation(b.backed_up_at))
            .map(|b| b.watermark.clone())
            .collect()
    }

    /// Takes in the shard's memory. Read after this run's first checks, it may be of another replica than the
    /// change log now holds (a resync while no sidecar ran): its watermarks are then left out, and the reset holds
    /// cleanup as a resync seen live does. Returns `(remembered, current)` replica versions in that case.
    pub fn on_resumed(&mut self, resumed: &Resumed, at: SystemTime) -> Option<(String, String)> {
        self.litestream.first = true;
        self.resumed = true;
        self.restores_unknown_since = resumed.restores_unknown_since;
        match (&self.replica.version, &resumed.replica_version) {
            (Some(now), Some(then)) if now != then => {
                self.replica.reset_at = Some(at);
                Some((then.clone(), now.clone()))
            }
            _ => {
                self.backlog.resume(
                    resumed.last_purge.as_ref(),
                    resumed.highest_backup.as_deref(),
                );
                if self.replica.version.is_none() {
                    self.replica.version = resumed.replica_version.clone();
                }
                None
            }
        }
    }

    /// The change DB's `replicaVersion` as read now. A change is a resync: every claim, the highest watermark, the
    /// last purge and the listing are facts about another replica, and are forgotten. Returns the old version then.
    pub fn on_replica_version(&mut self, version: String, at: SystemTime) -> Option<String> {
        let old = self.replica.version.replace(version.clone());
        let old = old.filter(|old| *old != version)?;
        self.replica.reset_at = Some(at);
        self.replica_reset = Some((old.clone(), version, at));
        self.backlog = Backlog::default();
        self.below_purge = None;
        self.backup.listing = None;
        self.backup.verified = false;
        Some(old)
    }

    /// Litestream's page could not be read. Before any page showed a backup there is no position to lose.
    pub fn on_unreadable_page(&mut self, problem: &str) -> PositionSeen {
        let mut seen = PositionSeen::default();
        if self.backlog.current().is_some() {
            seen.lost = self.lose(format!("its page cannot be read: {problem}"));
        }
        seen
    }

    /// One readable page: its size, whether litestream restarted, and its samples of this replica (those taken
    /// before the replica's last reset are of the old one). A page without samples, or a restart, makes the
    /// position unknown until a page shows the gauge again.
    pub fn on_page(&mut self, page: &Parsed) -> PositionSeen {
        if page.db_bytes.is_some() {
            self.litestream.db_bytes = page.db_bytes;
        }
        let restarted = matches!(
            (self.litestream.process_started, page.process_started),
            (Some(before), Some(after)) if before != after
        );
        if page.process_started.is_some() {
            self.litestream.process_started = page.process_started;
        }
        let reset_at = self.replica.reset_at;
        let samples: Vec<_> = page
            .progress
            .iter()
            .filter(|p| reset_at.is_none_or(|reset| p.backed_up_at >= reset))
            .map(|p| (p.watermark.as_str(), p.backed_up_at))
            .collect();
        let mut seen = PositionSeen::default();
        if samples.is_empty() {
            if self.backlog.current().is_some() {
                let why = if restarted {
                    "litestream restarted and has not reported a backup since"
                } else {
                    "its page has no backed-up watermark"
                };
                seen.lost = self.lose(why.to_string());
                seen.forget_backup = true;
            }
            return seen;
        }
        seen.restarted = restarted;
        seen.found = self.litestream.unknown.take();
        seen.taken = self.take(&samples);
        seen
    }

    /// Only the page's size, under `cleanup.requires = "restore"` (the gauge is not read).
    pub fn on_size(&mut self, db_bytes: Option<u64>) {
        if db_bytes.is_some() {
            self.litestream.db_bytes = db_bytes;
        }
    }

    /// `cleanup.requires = "restore"`: the latest drill's proof stands in for litestream's gauge, through the same
    /// backlog, regression watch and reservation floors. A drill that found the backup broken makes the position
    /// unknown until a drill proves it again (restoring less than was claimed has a hold of its own); one that
    /// could not run leaves the last proof standing. A proof stands only for its replica and its generation.
    pub fn on_proof(&mut self, failure: Option<&Failure>, proof: Option<&Proof>) -> PositionSeen {
        let mut seen = PositionSeen::default();
        if let Some(failure) = failure {
            if !matches!(failure, Failure::RestoredLess { .. }) {
                seen.lost = self.lose(format!("the last restore drill failed: {failure}"));
                seen.forget_backup = true;
            }
            return seen;
        }
        let Some(proof) = proof else {
            return seen;
        };
        let of_this_replica = self.replica.version.as_deref()
            == Some(proof.replica_version.as_str())
            && self
                .replica
                .reset_at
                .is_none_or(|reset| proof.started >= reset);
        if !of_this_replica {
            if self.backlog.current().is_some() {
                seen.lost =
                    self.lose("the last drill's proof is of another replica version".to_string());
                seen.forget_backup = true;
            }
            return seen;
        }
        if let (Some(target), Some(generation)) = (self.restore_target(), &proof.generation) {
            if target != generation {
                let why = format!(
                    "the last drill's proof is of generation {generation}, and a restore now picks generation \
                     {target}"
                );
                seen.lost = self.lose(why);
                seen.forget_backup = true;
                return seen;
            }
        }
        seen.found = self.litestream.unknown.take();
        seen.taken = self.take(&[(proof.watermark.as_str(), proof.finished)]);
        seen
    }

    /// The first reason stays until the position is known again: "litestream restarted" says more than the
    /// sample-less pages that follow it. Returns the reason when it is new.
    fn lose(&mut self, why: String) -> Option<String> {
        if self.litestream.unknown.is_some() {
            return None;
        }
        self.litestream.unknown = Some(why.clone());
        Some(why)
    }

    fn take(&mut self, samples: &[(&str, SystemTime)]) -> Option<Taken> {
        let observed = self.backlog.observe(samples);
        let current = self.backlog.current()?.watermark.clone();
        let first = std::mem::take(&mut self.litestream.first);
        let mut newly_below = None;
        self.below_purge = match self.backlog.last_purged() {
            Some(purged) if current.as_str() < purged => {
                if first {
                    newly_below = Some((purged.to_owned(), current.clone()));
                    newly_below.clone()
                } else {
                    self.below_purge.take()
                }
            }
            _ => None,
        };
        Some(Taken {
            added: observed.added,
            current,
            gauge: observed.gauge,
            below_purge: newly_below,
        })
    }

    /// The purger lock as the change DB answered now.
    pub fn on_lock(&mut self, standby: bool) -> LockMove {
        let was = self.standby.replace(standby);
        match (was, standby) {
            (Some(true) | None, false) => LockMove::Took,
            (Some(false) | None, true) => LockMove::Lost,
            _ => LockMove::Same,
        }
    }

    /// The shard's slots, read now (`pause`: `cleanup.reservations = "pause"`).
    pub fn on_slots(&mut self, slots: Vec<Slot>, pause: bool) -> SlotsSeen {
        let bounding =
            crate::cleanup::slots::bounding(&slots, self.replica.version.as_deref(), pause);
        let mut seen = SlotsSeen {
            readable_again: self.slots.problem.take().is_some(),
            ..SlotsSeen::default()
        };
        if let Some(SlotLimit::Malformed { slot, problem }) = &bounding {
            if self.slots.bounding != bounding {
                seen.malformed = Some((slot.clone(), problem.clone()));
            }
        }
        self.slots = Slots {
            all: slots,
            bounding,
            problem: None,
        };
        seen
    }

    /// The slots could not be read: cleanup holds until they are (they are memory: nothing else says which
    /// restores are in flight). Returns the problem when it is new.
    pub fn on_slots_unread(&mut self, problem: String) -> Option<String> {
        if self.slots.problem.as_deref() == Some(problem.as_str()) {
            return None;
        }
        self.slots.problem = Some(problem.clone());
        Some(problem)
    }

    /// A refusal check's finding for `reason` (`None`: it does not apply now). Returns whether any refusal stands.
    pub fn on_refusal(
        &mut self,
        reason: Reason,
        found: Option<Unservable>,
        at: SystemTime,
    ) -> bool {
        self.refusals.set(reason, found, at);
        self.refused()
    }

    /// A listing that failed.
    pub fn on_listing_failed(&mut self, err: ListError) {
        *self.backup.errors.entry(err.kind).or_default() += 1;
        self.backup.verified = false;
        self.backup.failing = Some(err);
    }

    /// A listing that succeeded, with what it covers (`reaches`: the newest object of the generation a restore
    /// picks) and whether it is stale against litestream's newest claim.
    pub fn on_listing(
        &mut self,
        listing: Listing,
        covers: impl Fn(SystemTime) -> bool,
        stale_after: std::time::Duration,
    ) -> StaleMove {
        let claimed = self
            .backlog
            .backups()
            .iter()
            .chain(self.backlog.current())
            .map(|b| b.backed_up_at)
            .max();
        let stale = claimed.and_then(|claimed| {
            crate::litestream::destination::is_stale(listing.newest, claimed, stale_after)
                .then_some((listing.newest, claimed))
        });
        let moved = match (self.backup.stale, stale) {
            (None, Some((newest, claimed))) => StaleMove::Began(newest, claimed),
            (Some(_), None) => StaleMove::Ended(listing.newest),
            _ => StaleMove::Same,
        };
        self.backup.verified = claimed.is_some_and(covers);
        self.backup.stale = stale;
        self.backup.listing = Some(listing);
        self.backup.failing = None;
        moved
    }

    /// A purge went all the way below `before`. The backup at `before` stays tracked: the clamped proxy page shows
    /// it with its real time.
    pub fn on_purged(&mut self, before: &str, run: PurgeRun) {
        let backed_up_at = self
            .backlog
            .backups()
            .iter()
            .find(|b| b.watermark == before)
            .map(|b| b.backed_up_at);
        self.backlog.record_purge(LastPurge {
            before: before.to_owned(),
            backed_up_at,
            run: Some(run),
        });
    }

    /// The hold for unknown restores has passed: the shard's memory stops carrying it.
    pub fn settle_unknown_restores(&mut self) {
        self.restores_unknown_since = None;
    }

    /// What a purge decided now holds litestream to before each of its batches.
    pub fn gauge_watch(&self) -> GaugeWatch {
        GaugeWatch {
            highest: self.backlog.highest().map(str::to_owned),
            process_started: self.litestream.process_started,
            reset_at: self.replica.reset_at,
        }
    }

    /// Writes every fact the loop owns into the status readers see.
    pub fn publish(&self, s: &mut Status) {
        let backlog = &self.backlog;
        s.newest_backup = backlog
            .current()
            .map(|b| (b.watermark.clone(), b.backed_up_at));
        s.backup_regressed = backlog
            .regression()
            .map(|(highest, current)| (highest.to_owned(), current.to_owned()));
        s.highest_backup = backlog.highest().map(str::to_owned);
        s.backup_unknown = self.litestream.unknown.clone();
        s.backup_below_purge = self.below_purge.clone();
        s.last_purge = backlog.last_purge().cloned();
        let mut recent = backlog.backups().to_vec();
        recent.sort_by(|a, b| b.watermark.cmp(&a.watermark));
        s.backups_tracked = recent.len();
        recent.truncate(RECENT_BACKUPS);
        s.recent_backups = recent;
        s.replica_version = self.replica.version.clone();
        s.replica_reset = self.replica_reset.clone();
        s.db_bytes = self.litestream.db_bytes;
        s.restores_unknown_since = self.restores_unknown_since;
        s.standby = self.standby;
        s.slots = self.slots.all.clone();
        s.bounding_slot = self.slots.bounding.clone();
        s.slots_problem = self.slots.problem.clone();
        s.backup = self.backup.clone();
        s.unservable = self.refusals.clone();
    }
}

impl GaugeWatch {
    /// A page read during the purge: unreadable, without samples of this replica, from a litestream that
    /// restarted, or with a gauge below the highest it reported, it no longer supports the purge.
    pub fn judge_page(&self, page: Result<&Parsed, String>) -> Verdict {
        let page = match page {
            Ok(page) => page,
            Err(problem) => {
                return Verdict {
                    moved: Some(format!("its page cannot be read: {problem}")),
                    ..Verdict::default()
                }
            }
        };
        if let (Some(before), Some(now)) = (self.process_started, page.process_started) {
            if before != now {
                return Verdict {
                    moved: Some("litestream restarted".into()),
                    forget_backup: true,
                    saw: None,
                };
            }
        }
        let newest = page
            .progress
            .iter()
            .filter(|p| self.reset_at.is_none_or(|reset| p.backed_up_at >= reset))
            .map(|p| p.watermark.as_str())
            .max();
        let Some(newest) = newest else {
            return Verdict {
                moved: Some("its page has no backed-up watermark".into()),
                forget_backup: true,
                saw: None,
            };
        };
        let moved = match self.highest.as_deref() {
            Some(highest) if newest < highest => {
                Some(format!("it went back from {highest} to {newest}"))
            }
            _ => None,
        };
        Verdict {
            moved,
            saw: Some(newest.to_owned()),
            forget_backup: false,
        }
    }

    /// `cleanup.requires = "restore"`: a drill that ended during the purge and found the backup broken, or proved
    /// less than before, stops it as a gauge that went back would.
    pub fn judge_proof(&self, failure: Option<&Failure>, proof: Option<&Proof>) -> Verdict {
        if let Some(failure) = failure {
            return Verdict {
                moved: Some(format!("a restore drill failed: {failure}")),
                forget_backup: true,
                saw: None,
            };
        }
        let moved = match (self.highest.as_deref(), proof) {
            (Some(highest), Some(proof)) if proof.watermark.as_str() < highest => Some(format!(
                "a restore drill proved only {} (below {highest})",
                proof.watermark
            )),
            _ => None,
        };
        Verdict {
            moved,
            ..Verdict::default()
        }
    }
}
