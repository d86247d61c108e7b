//! Deployments the sidecar cannot serve, said once in one vocabulary: cleanup holds for them, v4+ snapshot statuses
//! are withheld, and `/status`, the metrics, `/keepalive` and the log all name the same [`Reason`].
//!
//! Zero 1.10 can run without what the sidecar stands on (docs/protocol.md, "Zero 1.10 setups the sidecar refuses"):
//! v5 backups (`ZERO_LITESTREAM_BACKUP_USING_V5`) are litestream 0.5 files under a per-replica path, with no progress
//! gauge, and Zero tells view-syncers that path itself; with `pgChangeLogEnabled` off Zero stops writing the
//! PostgreSQL change log altogether. Left alone, the sidecar would wait for a gauge that never comes, verify a
//! destination nobody writes, or purge a log nobody reads: a silent stall at best. So each sign of such a setup is a
//! refusal, with what was found, why it cannot be served, and what to do.
//!
//! Pure: the monitor reads the listing, the upstream's `replicas` table and the change log, and hands the facts
//! here; nothing in this file does I/O or reads a clock.

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::litestream::layout::Layout;

/// How long a relayed commit may stay absent from the change log before the log counts as not written. A healthy
/// storer writes a commit within seconds of the change-streamer forwarding it (its queue is bounded, and a full one
/// pauses the stream), so minutes of absence are no lag.
pub const LOG_UNWRITTEN_AFTER: Duration = Duration::from_secs(300);

/// Why the sidecar cannot serve the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The backup destination holds litestream 0.5 (LTX) files.
    Ltx,
    /// The upstream's `replicas` table records a per-replica backup path or a v5 backup.
    BackupPath,
    /// Commits are relayed that the change log never receives.
    LogNotWritten,
}

impl Reason {
    /// Every reason, for pre-registering metric label values.
    pub const ALL: [Reason; 3] = [Reason::Ltx, Reason::BackupPath, Reason::LogNotWritten];

    /// The snake_case value of the `reason` metric label and of `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ltx => "ltx",
            Reason::BackupPath => "backup_path",
            Reason::LogNotWritten => "log_not_written",
        }
    }

    /// Why a deployment with this sign cannot be served.
    pub fn why(self) -> &'static str {
        match self {
            Reason::Ltx => {
                "Zero reads litestream 0.5 backups itself (through litestream's VFS) and purges on its own knowledge, \
                 and the sidecar can neither list nor restore them"
            }
            Reason::BackupPath => {
                "Zero 1.10's v5 backups go to a per-replica path below the backup URL, in litestream 0.5's format and \
                 without a progress gauge, and Zero hands view-syncers that path itself: the sidecar's \
                 litestream.backup_url, its gauge and its snapshot statuses would all be about another backup"
            }
            Reason::LogNotWritten => {
                "Zero does not write the PostgreSQL change log (pgChangeLogEnabled off, which comes with v5 backups), \
                 or the sidecar reads another change DB than the change-streamer writes: the log it would purge and \
                 read for snapshot statuses is not the one view-syncers catch up from"
            }
        }
    }

    /// What an operator does about it.
    pub fn remedy(self) -> &'static str {
        match self {
            Reason::Ltx => {
                "back up with litestream 0.3 (Zero's fork) and unset ZERO_LITESTREAM_BACKUP_USING_V5, or run this \
                 deployment without the sidecar"
            }
            Reason::BackupPath => {
                "unset ZERO_LITESTREAM_BACKUP_USING_V5 and back up with litestream 0.3 (Zero's fork); a replica \
                 restored from a v5 backup keeps its path until it is resynced (a new initial sync records none), \
                 or run this deployment without the sidecar"
            }
            Reason::LogNotWritten => {
                "keep Zero's pgChangeLogEnabled on and ZERO_LITESTREAM_BACKUP_USING_V5 unset, and check that \
                 change_db.url, zero.app_id and zero.shard_num name the change-streamer's change DB"
            }
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sign that the deployment cannot be served: its reason and what exactly was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unservable {
    pub reason: Reason,
    /// What was found, naming the objects, rows or watermarks: stable while the cause lasts, so that it is logged
    /// once (and every 5 minutes), not at every check.
    pub detail: String,
}

/// `found: why; what to do: remedy`, the whole story in one line for logs and `/keepalive`.
impl fmt::Display for Unservable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}; what to do: {}",
            self.detail,
            self.reason.why(),
            self.reason.remedy()
        )
    }
}

/// The refusal a listing's layout calls for: litestream 0.5's files, at the replica's path or one level below it.
pub fn of_layout(layout: &Layout) -> Option<Unservable> {
    matches!(layout, Layout::Ltx).then(|| Unservable {
        reason: Reason::Ltx,
        detail: "the backup destination (litestream.backup_url) holds litestream 0.5 (LTX) files"
            .into(),
    })
}

/// A row of the upstream's `"{app}_{shard}".replicas` as far as where it backs up goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    /// `id` (or `slot` where there is no `id`), for the operator to find the row.
    pub id: String,
    /// `"backupPath"`: the subpath of the backup URL the replica backs up to; `NULL` for the classic location.
    pub backup_path: Option<String>,
    /// `"backupV5"`: it backs up with litestream 0.5.
    pub backup_v5: bool,
}

/// Rows named in a refusal at most; the rest are counted.
const ROWS_NAMED: usize = 3;

/// The refusal the upstream's `replicas` table (`table`, as quoted for SQL) calls for: any row with a backup path or
/// a v5 backup. Every row counts, not only the newest: a replica that backs up elsewhere may be the one a
/// replication-manager restores from next, and an old row lingers only until Zero drops it with its slot.
pub fn of_replicas(table: &str, rows: &[ReplicaRow]) -> Option<Unservable> {
    let found: Vec<&ReplicaRow> = rows
        .iter()
        .filter(|r| r.backup_path.is_some() || r.backup_v5)
        .collect();
    if found.is_empty() {
        return None;
    }
    let mut named: Vec<String> = found
        .iter()
        .take(ROWS_NAMED)
        .map(|r| {
            let path = r
                .backup_path
                .as_deref()
                .map_or("NULL".to_string(), |p| format!("{p:?}"));
            format!(
                "replica {:?} (backupPath {path}, backupV5 {})",
                r.id, r.backup_v5
            )
        })
        .collect();
    if found.len() > ROWS_NAMED {
        named.push(format!("{} more", found.len() - ROWS_NAMED));
    }
    Some(Unservable {
        reason: Reason::BackupPath,
        detail: format!(
            "Zero records per-replica or v5 backups in {table}: {}",
            named.join(", ")
        ),
    })
}

/// Whether the change log is written, judged by the commits the relay passes on: a commit relayed to a subscriber
/// of the change DB's replica is one the storer writes within seconds, so a log that has nothing at or past it
/// [`LOG_UNWRITTEN_AFTER`] later is not being written.
///
/// One commit is followed at a time (the probe), from when it was first relayed until the log reaches it: under a
/// steady stream the newest commit keeps changing, and only a fixed one can age. Nothing is relayed on an idle
/// stack, so nothing is probed; a log that lags a few seconds reaches the probe long before the bound. A resync
/// starts over: the new log owes nothing to the old replica's commits.
#[derive(Debug, Clone, Default)]
pub struct LogWatch {
    replica_version: Option<String>,
    probe: Option<Probe>,
    /// The newest probe the log reached: commits at or below it are not asked about again.
    reached: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Probe {
    watermark: String,
    relayed_at: Instant,
    /// The same moment on the wall clock, fixed once so that the refusal's text stays the same.
    relayed_wall: SystemTime,
}

impl LogWatch {
    /// Follows the change DB's replica `version`: another one (a resync) forgets the probe and what was reached.
    pub fn for_replica(&mut self, version: &str) {
        if self.replica_version.as_deref() != Some(version) {
            *self = LogWatch {
                replica_version: Some(version.to_owned()),
                ..LogWatch::default()
            };
        }
    }

    /// The watermark to ask the change log about now: the probe, or else the newest commit `relayed` (to
    /// subscribers of this replica; with when it was first relayed) if the log has not been seen reaching it.
    pub fn probe(
        &mut self,
        relayed: Option<(&str, Instant)>,
        now: Instant,
        wall_now: SystemTime,
    ) -> Option<&str> {
        if self.probe.is_none() {
            if let Some((watermark, at)) = relayed {
                if self.reached.as_deref().is_none_or(|r| watermark > r) {
                    let ago = now.saturating_duration_since(at);
                    self.probe = Some(Probe {
                        watermark: watermark.to_owned(),
                        relayed_at: at,
                        relayed_wall: wall_now.checked_sub(ago).unwrap_or(wall_now),
                    });
                }
            }
        }
        self.probe.as_ref().map(|p| p.watermark.as_str())
    }

    /// Takes the change log's answer for the probe (`reaches`: it holds a row at or past its watermark) and says
    /// whether the log counts as not written: the probe was relayed at least `bound` ago and the log has not reached
    /// it. `table` names the log in the refusal. With no probe, the log is not suspected.
    pub fn answer(
        &mut self,
        reaches: bool,
        now: Instant,
        bound: Duration,
        table: &str,
    ) -> Option<Unservable> {
        let probe = self.probe.as_ref()?;
        if reaches {
            self.reached = self.probe.take().map(|p| p.watermark);
            return None;
        }
        (now.saturating_duration_since(probe.relayed_at) >= bound).then(|| Unservable {
            reason: Reason::LogNotWritten,
            detail: format!(
                "commit {} was relayed to subscribers at {} and the change log {table} still holds nothing at or \
                 past it",
                probe.watermark,
                humantime::format_rfc3339_seconds(probe.relayed_wall)
            ),
        })
    }

    /// Whether a refusal for an unwritten log could stand now: only while a probe is out.
    pub fn is_probing(&self) -> bool {
        self.probe.is_some()
    }
}

/// A refusal in force, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandingRefusal {
    pub unservable: Unservable,
    pub since: SystemTime,
}

/// The refusals in force, at most one per reason, in [`Reason`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    current: Vec<StandingRefusal>,
}

impl Refusals {
    /// Records what the check for `reason` found now (`None`: it no longer applies). A refusal keeps the time it
    /// started while its reason holds, whatever its detail becomes.
    pub fn set(&mut self, reason: Reason, found: Option<Unservable>, now: SystemTime) {
        let at = self
            .current
            .iter()
            .position(|r| r.unservable.reason == reason);
        match (at, found) {
            (None, None) => {}
            (Some(i), None) => {
                self.current.remove(i);
            }
            (Some(i), Some(found)) => self.current[i].unservable = found,
            (None, Some(found)) => {
                self.current.push(StandingRefusal {
                    unservable: found,
                    since: now,
                });
                self.current.sort_by_key(|r| r.unservable.reason);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &StandingRefusal> {
        self.current.iter()
    }

    pub fn has(&self, reason: Reason) -> bool {
        self.current.iter().any(|r| r.unservable.reason == reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, path: Option<&str>, v5: bool) -> ReplicaRow {
        ReplicaRow {
            id: id.into(),
            backup_path: path.map(Into::into),
            backup_v5: v5,
        }
    }

    const TABLE: &str = r#""zero_0".replicas"#;
    const LOG: &str = r#""zero_0/cdc"."changeLog""#;
    const BOUND: Duration = LOG_UNWRITTEN_AFTER;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn only_ltx_layouts_are_refused() {
        let refused = of_layout(&Layout::Ltx).unwrap();
        assert_eq!(refused.reason, Reason::Ltx);
        assert!(refused.detail.contains("LTX"), "{refused}");
        assert_eq!(of_layout(&Layout::Empty), None);
        assert_eq!(
            of_layout(&Layout::Broken {
                generation: "a1b2c3d4e5f60718".into(),
                problem: crate::litestream::layout::Problem::NoSnapshot,
            }),
            None
        );
    }

    #[test]
    fn a_replica_backing_up_to_its_own_path_or_with_v5_is_refused() {
        // Zero <= 1.9, or 1.10 with classic backups: nothing recorded.
        assert_eq!(of_replicas(TABLE, &[]), None);
        assert_eq!(of_replicas(TABLE, &[row("r1", None, false)]), None);

        let v5 = of_replicas(
            TABLE,
            &[row("r1", None, false), row("r2", Some("1761"), true)],
        )
        .unwrap();
        assert_eq!(v5.reason, Reason::BackupPath);
        assert_eq!(
            v5.detail,
            r#"Zero records per-replica or v5 backups in "zero_0".replicas: replica "r2" (backupPath "1761", backupV5 true)"#
        );
        let text = v5.to_string();
        assert!(text.contains("ZERO_LITESTREAM_BACKUP_USING_V5"), "{text}");

        // Rolled back from v5: a litestream 0.3 backup, but still below a path of its own.
        let rolled_back = of_replicas(TABLE, &[row("r3", Some("1761"), false)]).unwrap();
        assert!(
            rolled_back.detail.contains("backupV5 false"),
            "{rolled_back:?}"
        );
        // A v5 replica whose path is not recorded yet.
        assert!(of_replicas(TABLE, &[row("r4", None, true)]).is_some());
    }

    #[test]
    fn many_rows_are_named_up_to_three_and_counted() {
        let rows: Vec<_> = (0..5)
            .map(|n| row(&format!("r{n}"), Some("p"), true))
            .collect();
        let detail = of_replicas(TABLE, &rows).unwrap().detail;
        assert!(
            detail.contains(r#"replica "r2""#) && !detail.contains(r#""r3""#),
            "{detail}"
        );
        assert!(detail.ends_with(", 2 more"), "{detail}");
    }

    #[test]
    fn an_idle_stack_is_never_suspected() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
        let mut watch = LogWatch::default();
        watch.for_replica("01");
        // Nothing relayed, for hours.
        for hour in 0..5 {
            let now = start + secs(hour * 3600);
            assert_eq!(watch.probe(None, now, wall), None);
            assert_eq!(watch.answer(false, now, BOUND, LOG), None);
        }
        // One commit, stored, then silence: asked once, never again.
        assert_eq!(watch.probe(Some(("0b", start)), start, wall), Some("0b"));
        assert_eq!(watch.answer(true, start, BOUND, LOG), None);
        let later = start + secs(86_400);
        assert_eq!(watch.probe(Some(("0b", start)), later, wall), None);
        assert!(!watch.is_probing());
    }

    #[test]
    fn a_storer_that_lags_under_load_is_not_a_log_that_is_not_written() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
        let mut watch = LogWatch::default();
        watch.for_replica("01");
        // A commit every second, the storer 20 s behind, checked every 60 s for an hour.
        for check in 1..=60u64 {
            let now = start + secs(check * 60);
            let newest = format!("{:04}", check * 60);
            let stored = format!("{:04}", check * 60 - 20);
            let asked = watch
                .probe(Some((&newest, now)), now, wall)
                .map(str::to_owned);
            if let Some(asked) = asked {
                let refused = watch.answer(stored >= asked, now, BOUND, LOG);
                assert_eq!(refused, None, "check {check}");
            }
        }
        // The storer stalls for four minutes and catches up: still no refusal.
        let mut watch = LogWatch::default();
        watch.for_replica("01");
        assert_eq!(
            watch.probe(Some(("1000", start)), start, wall),
            Some("1000")
        );
        for minute in 0..4 {
            assert_eq!(
                watch.answer(false, start + secs(minute * 60), BOUND, LOG),
                None
            );
        }
        assert_eq!(watch.answer(true, start + secs(240), BOUND, LOG), None);
        assert!(!watch.is_probing());
    }

    #[test]
    fn a_log_that_never_reaches_a_relayed_commit_is_refused_until_it_does() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
        let mut watch = LogWatch::default();
        watch.for_replica("01");
        // First relayed 30 s before the check that adopts it.
        let relayed = start - secs(30);
        assert_eq!(watch.probe(Some(("0b", relayed)), start, wall), Some("0b"));
        assert_eq!(watch.answer(false, start, BOUND, LOG), None);
        // Newer commits keep coming; the probe stays on the first.
        let before = start + secs(269);
        assert_eq!(watch.probe(Some(("0z", before)), before, wall), Some("0b"));
        assert_eq!(watch.answer(false, before, BOUND, LOG), None);
        let after = start + secs(270);
        assert_eq!(watch.probe(Some(("1a", after)), after, wall), Some("0b"));
        let refused = watch.answer(false, after, BOUND, LOG).expect("refused");
        assert_eq!(refused.reason, Reason::LogNotWritten);
        let at = humantime::format_rfc3339_seconds(wall - secs(30)).to_string();
        assert_eq!(
            refused.detail,
            format!(
                r#"commit 0b was relayed to subscribers at {at} and the change log "zero_0/cdc"."changeLog" still holds nothing at or past it"#
            )
        );
        // The same words at every check while it lasts.
        let later = after + secs(600);
        watch.probe(Some(("2a", later)), later, wall + secs(900));
        assert_eq!(watch.answer(false, later, BOUND, LOG), Some(refused));
        // Written again: cleared, and the next commit is probed afresh.
        assert_eq!(watch.answer(true, later, BOUND, LOG), None);
        assert!(!watch.is_probing());
        assert_eq!(watch.probe(Some(("2a", later)), later, wall), Some("2a"));
    }

    #[test]
    fn a_resync_forgets_the_old_replicas_commits() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
        let mut watch = LogWatch::default();
        watch.for_replica("01");
        watch.probe(Some(("9z", start)), start, wall);
        let late = start + BOUND;
        assert!(watch.answer(false, late, BOUND, LOG).is_some());
        watch.for_replica("02");
        assert!(!watch.is_probing());
        assert_eq!(watch.answer(false, late, BOUND, LOG), None);
        // The same version again changes nothing.
        watch.probe(Some(("03", late)), late, wall);
        watch.for_replica("02");
        assert!(watch.is_probing());
    }

    #[test]
    fn refusals_keep_their_start_while_their_reason_holds() {
        let t0 = SystemTime::UNIX_EPOCH + secs(1_800_000_000);
        let found = |detail: &str| Unservable {
            reason: Reason::BackupPath,
            detail: detail.into(),
        };
        let mut refusals = Refusals::default();
        refusals.set(Reason::Ltx, None, t0);
        assert!(refusals.is_empty());
        refusals.set(Reason::BackupPath, Some(found("a")), t0);
        refusals.set(Reason::Ltx, of_layout(&Layout::Ltx), t0 + secs(5));
        let order: Vec<_> = refusals.iter().map(|r| r.unservable.reason).collect();
        assert_eq!(order, [Reason::Ltx, Reason::BackupPath]);
        refusals.set(Reason::BackupPath, Some(found("b")), t0 + secs(60));
        let kept = refusals
            .iter()
            .find(|r| r.unservable.reason == Reason::BackupPath)
            .unwrap();
        assert_eq!((kept.since, kept.unservable.detail.as_str()), (t0, "b"));
        refusals.set(Reason::BackupPath, None, t0 + secs(90));
        assert!(refusals.has(Reason::Ltx) && !refusals.has(Reason::BackupPath));
        refusals.set(Reason::Ltx, None, t0 + secs(90));
        assert!(refusals.is_empty());
        // Back again: a new start.
        refusals.set(Reason::BackupPath, Some(found("b")), t0 + secs(120));
        assert_eq!(refusals.iter().next().unwrap().since, t0 + secs(120));
    }

    #[test]
    fn labels_are_distinct_and_every_reason_says_what_to_do() {
        let labels: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
        for reason in Reason::ALL {
            assert!(!reason.why().is_empty() && !reason.remedy().is_empty());
        }
    }
}
