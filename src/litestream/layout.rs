//! What a listing of the backup destination says about whether it restores, read from litestream's object names
//! (docs/protocol.md, "The backup layout"). A destination that lists fine can still fail to restore: a generation
//! whose snapshot is gone makes `litestream restore` fail outright, and a WAL index missing from the chain (or a
//! name the reader skips) makes it stop early or restore an older database without a word. Only what the names
//! prove counts here; what only a restore proves (offsets without a gap inside an index, objects that decompress)
//! is the drills' job.
//!
//! Layouts:
//! - litestream 0.3 (the base of Zero's fork): `generations/<id>/snapshots/<index>.snapshot.lz4` and
//!   `generations/<id>/wal/<index>_<offset>.wal.lz4` (before 0.3.10, `wal/<index>/<offset>.wal.lz4`). Indexes and
//!   offsets are lower-case hex of any width: 8 digits is only the usual width, and an offset past 4 GiB has more.
//! - litestream 0.5: `ltx/<level>/<min txid>-<max txid>.ltx`, and Zero 1.10's v5 backups put the same one path segment
//!   deeper (`<backupPath>/ltx/…`, a path per replica). Recognised so that it can be refused: Zero reads such
//!   backups itself, so no proxy can keep it from purging.
//!
//! Which generation and snapshot a restore starts from depends on the litestream that restores
//! ([`Restorer`], `backup.restore_with`): 0.3 and 0.5 read the same 0.3 layout but choose differently.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// The litestream release view-syncers restore the backup with (`backup.restore_with`). Both read the 0.3 layout
/// Zero's replication-manager writes, but pick what to restore differently (docs/protocol.md, "The backup layout"):
/// 0.3 the generation with the latest update time, its snapshots and its WAL up to its last snapshot's index
/// counted; 0.5 (`RestoreV3`) the generation of the newest snapshot by time, WAL not counted. With two writers on one
/// path they can restore different generations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Restorer {
    /// litestream 0.3 (Zero up to 1.9; Zero 1.10 with `ZERO_LITESTREAM_RESTORE_USING_V5=false`).
    #[default]
    #[serde(rename = "0.3")]
    V03,
    /// litestream 0.5 (Zero 1.10's default, `ZERO_LITESTREAM_RESTORE_USING_V5`).
    #[serde(rename = "0.5")]
    V05,
}

impl Restorer {
    pub fn as_str(self) -> &'static str {
        match self {
            Restorer::V03 => "0.3",
            Restorer::V05 => "0.5",
        }
    }

    /// The release a `litestream version` output names (`v0.3.13`, `0.5.17`), if it is one of these.
    pub fn of_version(output: &str) -> Option<Restorer> {
        let version = output.split_whitespace().next()?.trim_start_matches('v');
        let mut parts = version.split(['.', '-', '+']);
        match (parts.next()?, parts.next()?) {
            ("0", "3") => Some(Restorer::V03),
            ("0", "5") => Some(Restorer::V05),
            _ => None,
        }
    }
}

/// One object of a listing: its path below the replica's URL, and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub path: String,
    pub modified: SystemTime,
}

/// When each generation uploaded, from the objects' last-modified times: which generation a claim of litestream's
/// gauge belongs to. The fork's gauge names no generation; it moves once an upload has finished, so a claim stamped
/// at `T` is of the generation whose object is the newest at or before `T`. With two writers on one path (or
/// across a litestream restart) that tells the claims of one generation from another's, where the generation a
/// restore picks may have objects newer than a claim it does not contain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uploads {
    /// Every object's time and the index of its generation in `generations`, by time.
    times: Vec<(SystemTime, usize)>,
    generations: Vec<String>,
}

impl Uploads {
    pub fn read<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Uploads {
        let mut uploads = Uploads::default();
        for object in objects {
            let path = object.path.trim_start_matches('/');
            let Some((id, inner)) = path
                .strip_prefix("generations/")
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            if inner.ends_with(".tmp") {
                continue;
            }
            let at = match uploads.generations.iter().position(|g| g == id) {
                Some(at) => at,
                None => {
                    uploads.generations.push(id.to_string());
                    uploads.generations.len() - 1
                }
            };
            uploads.times.push((object.modified, at));
        }
        uploads.times.sort();
        uploads
    }

    /// The generation whose object is the newest at or before `t` (of two at the same time, the later by name, as
    /// the sort leaves them); `None` when nothing was uploaded by then.
    pub fn generation_at(&self, t: SystemTime) -> Option<&str> {
        let after = self.times.partition_point(|&(at, _)| at <= t);
        after
            .checked_sub(1)
            .map(|i| self.generations[self.times[i].1].as_str())
    }
}

/// What the generation a restore picks (or its absence) means for a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Nothing of litestream's yet: no generation and no LTX file.
    Empty,
    /// The newest generation has a snapshot and every WAL index from it to its last one.
    Restorable(Chain),
    /// The newest generation would not restore, or not all of it.
    Broken {
        generation: String,
        problem: Problem,
    },
    /// litestream 0.5's LTX files: Zero reads these backups itself.
    Ltx,
}

/// The newest generation's restorable chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub generation: String,
    /// The snapshot a restore starts from: the generation's highest-indexed one.
    pub snapshot_index: u64,
    /// The last WAL index a restore applies (the snapshot's own index when no WAL follows it).
    pub last_index: u64,
    /// The newest last-modified time among the chain's objects: a claim stamped at or before it was uploaded
    /// before litestream wrote this object, which a restore reaches.
    pub newest: SystemTime,
    /// Snapshot plus WAL segments in the chain.
    pub objects: u64,
}

/// Why the newest generation does not restore in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No snapshot: `litestream restore` fails ("no snapshots available").
    NoSnapshot,
    /// A WAL index between the snapshot and the last index has no segment, or its segments do not start at offset
    /// 0: a restore stops there or fails.
    IndexGap { missing: u64 },
    /// An object of the generation whose name is not litestream's: a reader that skips it may restore less than
    /// was uploaded.
    UnreadableName { path: String },
}

impl Problem {
    /// The metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::NoSnapshot => "no_snapshot",
            Problem::IndexGap { .. } => "index_gap",
            Problem::UnreadableName { .. } => "unreadable_name",
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NoSnapshot => f.write_str("the generation has no snapshot: a restore fails"),
            Problem::IndexGap { missing } => write!(
                f,
                "WAL index {missing:08x} is missing from the chain after the snapshot: a restore ends before it"
            ),
            Problem::UnreadableName { path } => {
                write!(f, "{path:?} is not a name litestream writes")
            }
        }
    }
}

impl Layout {
    /// One word for the metric and the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Layout::Empty => "empty",
            Layout::Restorable(_) => "restorable",
            Layout::Broken { problem, .. } => problem.kind(),
            Layout::Ltx => "ltx",
        }
    }

    pub fn chain(&self) -> Option<&Chain> {
        match self {
            Layout::Restorable(chain) => Some(chain),
            _ => None,
        }
    }

    /// Reads a listing's names as litestream 0.3 restores them ([`Layout::read_for`]).
    pub fn read<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Layout {
        Layout::read_for(objects, Restorer::V03)
    }

    /// Reads a listing's names as `restorer` restores them. Objects outside `generations/`, `ltx/` and
    /// `<one segment>/ltx/` are not litestream's and are ignored; inside a generation every name must be one
    /// litestream writes.
    pub fn read_for<'a>(
        objects: impl IntoIterator<Item = &'a Object>,
        restorer: Restorer,
    ) -> Layout {
        let mut generations: BTreeMap<&str, Generation> = BTreeMap::new();
        let mut ltx = false;
        for object in objects {
            let path = object.path.trim_start_matches('/');
            if is_ltx(path) {
                ltx = true;
                continue;
            }
            let Some(rest) = path.strip_prefix("generations/") else {
                continue;
            };
            let (id, inner) = rest.split_once('/').unwrap_or((rest, ""));
            // An upload in progress (or cut short by a kill) on a file:// destination: litestream writes
            // `<name>.tmp` and renames it, and its own restore never reads one.
            if inner.ends_with(".tmp") {
                continue;
            }
            let generation = generations.entry(id).or_default();
            generation.newest = generation.newest.max(Some(object.modified));
            match parse_entry(inner) {
                Some(Entry::Snapshot(index)) => {
                    generation.snapshots.insert(index, object.modified);
                }
                Some(Entry::Wal { index, offset }) => {
                    generation
                        .wal
                        .entry(index)
                        .or_default()
                        .push((offset, object.modified));
                }
                None => {
                    generation
                        .unreadable
                        .get_or_insert_with(|| object.path.clone());
                }
            }
        }
        // litestream 0.5 keeps 0.3's generations when it takes over a destination; its LTX files are what a
        // restore reads from then on.
        if ltx {
            return Layout::Ltx;
        }
        match restorer {
            Restorer::V03 => match restore_target(&generations) {
                Some(id) => generations[id].verdict(id, None),
                None => Layout::Empty,
            },
            Restorer::V05 => match newest_snapshot(&generations) {
                Some((id, index)) => generations[id].verdict(id, Some(index)),
                None => restore_target(&generations)
                    .map_or(Layout::Empty, |id| generations[id].verdict(id, None)),
            },
        }
    }
}

/// The snapshot litestream 0.5's `RestoreV3` starts from when given no time: every generation's snapshots, in
/// name order and each generation's by index, sorted by creation time with its exchange sort (kept as it is:
/// snapshots of the same time end where that sort leaves them), and the last one taken. Its WAL is then the
/// generation's from that snapshot's index on. `None` when no generation has a snapshot.
fn newest_snapshot<'a>(generations: &BTreeMap<&'a str, Generation>) -> Option<(&'a str, u64)> {
    let mut snapshots: Vec<(SystemTime, &str, u64)> = generations
        .iter()
        .flat_map(|(&id, g)| g.snapshots.iter().map(move |(&index, &t)| (t, id, index)))
        .collect();
    for i in 0..snapshots.len() {
        for j in i + 1..snapshots.len() {
            if snapshots[i].0 > snapshots[j].0 {
                snapshots.swap(i, j);
            }
        }
    }
    snapshots.last().map(|&(_, id, index)| (id, index))
}

/// The generation `litestream restore` (0.3) picks when given none, as its `CalcRestoreTarget` does: of the
/// generations in name order, the first with the latest update time, where a generation's update time is the
/// newest of its snapshots and of its WAL segments whose index lies between its lowest and highest snapshot's
/// (segments after the last snapshot's index do not count, and a generation without a snapshot has none, so a
/// restore never picks it). When no generation has a snapshot, the one written last: the listing then reports
/// why nothing restores.
fn restore_target<'a>(generations: &BTreeMap<&'a str, Generation>) -> Option<&'a str> {
    let mut target: Option<(&str, SystemTime)> = None;
    for (&id, generation) in generations {
        if let Some(updated) = generation.restore_updated() {
            if target.is_none_or(|(_, best)| updated > best) {
                target = Some((id, updated));
            }
        }
    }
    target.map(|(id, _)| id).or_else(|| {
        generations
            .iter()
            .max_by(|(a_id, a), (b_id, b)| a.newest.cmp(&b.newest).then(b_id.cmp(a_id)))
            .map(|(&id, _)| id)
    })
}

#[derive(Default)]
struct Generation {
    snapshots: BTreeMap<u64, SystemTime>,
    wal: BTreeMap<u64, Vec<(u64, SystemTime)>>,
    unreadable: Option<String>,
    newest: Option<SystemTime>,
}

impl Generation {
    /// The update time litestream's restore compares generations by (see [`restore_target`]).
    fn restore_updated(&self) -> Option<SystemTime> {
        let (&low, _) = self.snapshots.first_key_value()?;
        let (&high, _) = self.snapshots.last_key_value()?;
        let snapshots = self.snapshots.values().copied();
        let wal = self
            .wal
            .range(low..=high)
            .flat_map(|(_, segments)| segments.iter().map(|&(_, t)| t));
        snapshots.chain(wal).max()
    }

    /// What a restore of this generation from `snapshot` (its highest-indexed one when `None`) reaches.
    fn verdict(&self, id: &str, snapshot: Option<u64>) -> Layout {
        let broken = |problem| Layout::Broken {
            generation: id.to_string(),
            problem,
        };
        if let Some(path) = &self.unreadable {
            return broken(Problem::UnreadableName { path: path.clone() });
        }
        let picked = match snapshot {
            Some(index) => self.snapshots.get_key_value(&index),
            None => self.snapshots.last_key_value(),
        };
        let Some((&snapshot_index, &snapshot_time)) = picked else {
            return broken(Problem::NoSnapshot);
        };
        let mut newest = snapshot_time;
        let mut objects = 1;
        let mut last_index = snapshot_index;
        if let Some((&last, _)) = self.wal.range(snapshot_index..).next_back() {
            for index in snapshot_index..=last {
                let Some(segments) = self.wal.get(&index) else {
                    return broken(Problem::IndexGap { missing: index });
                };
                // Every index's WAL starts with its header at offset 0; without it the index cannot be applied.
                if !segments.iter().any(|&(offset, _)| offset == 0) {
                    return broken(Problem::IndexGap { missing: index });
                }
                objects += segments.len() as u64;
                newest = segments
                    .iter()
                    .map(|&(_, t)| t)
                    .fold(newest, SystemTime::max);
            }
            last_index = last;
        }
        Layout::Restorable(Chain {
            generation: id.to_string(),
            snapshot_index,
            last_index,
            newest,
            objects,
        })
    }
}

/// litestream 0.5's file at the replica's path, or below one path segment of it (a v5 backup's per-replica path):
/// `ltx/<level>/<name>.ltx`.
fn is_ltx(path: &str) -> bool {
    let below = |path: &str| {
        path.strip_prefix("ltx/")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(level, name)| {
                !level.is_empty() && !name.contains('/') && name.ends_with(".ltx")
            })
    };
    path.starts_with("ltx/")
        || path
            .split_once('/')
            .is_some_and(|(first, rest)| first != "generations" && below(rest))
}

enum Entry {
    Snapshot(u64),
    Wal { index: u64, offset: u64 },
}

/// A name inside a generation: `snapshots/<index>.snapshot.lz4`, `wal/<index>_<offset>.wal.lz4` or
/// `wal/<index>/<offset>.wal.lz4`.
fn parse_entry(inner: &str) -> Option<Entry> {
    if let Some(name) = inner.strip_prefix("snapshots/") {
        return hex(name.strip_suffix(".snapshot.lz4")?).map(Entry::Snapshot);
    }
    let name = inner.strip_prefix("wal/")?.strip_suffix(".wal.lz4")?;
    let (index, offset) = name.split_once('_').or_else(|| name.split_once('/'))?;
    Some(Entry::Wal {
        index: hex(index)?,
        offset: hex(offset)?,
    })
}

/// Lower-case hex of any width that fits 64 bits, as litestream formats indexes and offsets.
fn hex(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_764_900_000 + secs)
    }

    fn objects(list: &[(&str, u64)]) -> Vec<Object> {
        list.iter()
            .map(|&(path, secs)| Object {
                path: path.to_string(),
                modified: at(secs),
            })
            .collect()
    }

    const G: &str = "generations/6876d0f712825346";

    #[test]
    fn a_snapshot_and_every_index_after_it_restore() {
        let listing = objects(&[
            (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
            (&format!("{G}/wal/00000000_00000000.wal.lz4"), 1),
            (&format!("{G}/wal/00000000_00004080.wal.lz4"), 3),
            (&format!("{G}/wal/00000001_00000000.wal.lz4"), 5),
            (&format!("{G}/wal/00000001_000070c8.wal.lz4"), 7),
        ]);
        assert_eq!(
            Layout::read(&listing),
            Layout::Restorable(Chain {
                generation: "6876d0f712825346".into(),
                snapshot_index: 0,
                last_index: 1,
                newest: at(7),
                objects: 5,
            })
        );
    }

    #[test]
    fn offsets_and_indexes_wider_than_eight_digits_are_read() {
        let listing = objects(&[
            (&format!("{G}/snapshots/00000002.snapshot.lz4"), 1),
            (&format!("{G}/wal/00000002_00000000.wal.lz4"), 2),
            (&format!("{G}/wal/00000002_100000000.wal.lz4"), 9),
            (&format!("{G}/wal/00000003/00000000.wal.lz4"), 10),
            (&format!("{G}/wal/00000003/1000000a0.wal.lz4"), 11),
        ]);
        let chain = Layout::read(&listing).chain().cloned().unwrap();
        assert_eq!(
            (chain.last_index, chain.newest, chain.objects),
            (3, at(11), 5)
        );
    }

    #[test]
    fn restores_start_from_the_last_snapshot_and_ignore_older_wal() {
        let listing = objects(&[
            (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
            // Index 1 is gone, but the restore starts from snapshot 2.
            (&format!("{G}/wal/00000000_00000000.wal.lz4"), 1),
            (&format!("{G}/snapshots/00000002.snapshot.lz4"), 4),
            (&format!("{G}/wal/00000002_00000000.wal.lz4"), 5),
        ]);
        let chain = Layout::read(&listing).chain().cloned().unwrap();
        assert_eq!((chain.snapshot_index, chain.last_index), (2, 2));
    }

    #[test]
    fn a_missing_snapshot_index_or_first_segment_breaks_the_chain() {
        let broken = |listing: &[(&str, u64)]| match Layout::read(&objects(listing)) {
            Layout::Broken { problem, .. } => problem,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            broken(&[(&format!("{G}/wal/00000000_00000000.wal.lz4"), 1)]),
            Problem::NoSnapshot
        );
        assert_eq!(
            broken(&[
                (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
                (&format!("{G}/wal/00000000_00000000.wal.lz4"), 1),
                (&format!("{G}/wal/00000002_00000000.wal.lz4"), 3),
            ]),
            Problem::IndexGap { missing: 1 }
        );
        assert_eq!(
            broken(&[
                (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
                (&format!("{G}/wal/00000000_00004080.wal.lz4"), 3),
            ]),
            Problem::IndexGap { missing: 0 }
        );
        assert_eq!(
            broken(&[
                (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
                (&format!("{G}/wal/0000000G_00000000.wal.lz4"), 3),
            ]),
            Problem::UnreadableName {
                path: format!("{G}/wal/0000000G_00000000.wal.lz4")
            }
        );
    }

    #[test]
    fn uploads_in_progress_are_not_read() {
        let listing = objects(&[
            (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
            (&format!("{G}/wal/00000000_00000000.wal.lz4"), 2),
            (&format!("{G}/wal/00000001_00000000.wal.lz4.tmp"), 9),
        ]);
        let chain = Layout::read(&listing).chain().cloned().unwrap();
        assert_eq!(
            (chain.last_index, chain.newest, chain.objects),
            (0, at(2), 2)
        );
    }

    #[test]
    fn a_generation_without_a_snapshot_is_never_restored() {
        let old = "generations/0000000000000001";
        let listing = objects(&[
            (&format!("{old}/snapshots/00000000.snapshot.lz4"), 1),
            // Written last: a generation litestream started after losing its position, with no snapshot yet. A
            // restore skips it and restores the old one, whose newest object is from before any later claim.
            (&format!("{G}/wal/00000000_00000000.wal.lz4"), 9),
        ]);
        assert!(matches!(
            Layout::read(&listing),
            Layout::Restorable(Chain { generation, newest, .. })
                if generation == "0000000000000001" && newest == at(1)
        ));
        // Alone, it restores nothing, and says why.
        assert!(matches!(
            Layout::read(&listing[1..]),
            Layout::Broken { generation, problem: Problem::NoSnapshot } if generation == "6876d0f712825346"
        ));
    }

    #[test]
    fn a_claim_belongs_to_the_generation_that_uploaded_last_before_it() {
        let a = "generations/00000000000000aa";
        let b = "generations/00000000000000bb";
        let listing = objects(&[
            (&format!("{a}/snapshots/00000000.snapshot.lz4"), 1),
            (&format!("{b}/snapshots/00000000.snapshot.lz4"), 3),
            (&format!("{a}/wal/00000000_00000000.wal.lz4"), 5),
            (&format!("{b}/wal/00000000_00000000.wal.lz4"), 9),
            (&format!("{a}/wal/00000000_00001000.wal.lz4.tmp"), 10),
        ]);
        let uploads = Uploads::read(&listing);
        assert_eq!(uploads.generation_at(at(0)), None);
        assert_eq!(uploads.generation_at(at(2)), Some("00000000000000aa"));
        assert_eq!(uploads.generation_at(at(4)), Some("00000000000000bb"));
        assert_eq!(uploads.generation_at(at(5)), Some("00000000000000aa"));
        assert_eq!(uploads.generation_at(at(8)), Some("00000000000000aa"));
        // An upload in progress is not an upload.
        assert_eq!(uploads.generation_at(at(10)), Some("00000000000000bb"));
    }

    /// Two writers on one path (a second litestream, or one that restarted): `litestream restore` compares the
    /// generations by their snapshots and the WAL up to their last snapshot's index only, and of equals takes the
    /// first by name.
    #[test]
    fn two_generations_are_chosen_as_litestream_restore_chooses() {
        let a = "generations/00000000000000aa";
        let b = "generations/00000000000000bb";
        // A's snapshot is the newer one; B has WAL written later, but past its only snapshot's index.
        let listing = objects(&[
            (&format!("{a}/snapshots/00000001.snapshot.lz4"), 5),
            (&format!("{a}/wal/00000001_00000000.wal.lz4"), 6),
            (&format!("{b}/snapshots/00000000.snapshot.lz4"), 2),
            (&format!("{b}/wal/00000001_00000000.wal.lz4"), 9),
        ]);
        let target = |listing: &[Object]| Layout::read(listing).chain().unwrap().generation.clone();
        assert_eq!(target(&listing), "00000000000000aa");
        // WAL at B's snapshot's own index counts: B now wins.
        let mut later = listing.clone();
        later.extend(objects(&[(
            &format!("{b}/wal/00000000_00000000.wal.lz4"),
            8,
        )]));
        assert_eq!(target(&later), "00000000000000bb");
        // A tie goes to the first by name.
        let tie = objects(&[
            (&format!("{b}/snapshots/00000000.snapshot.lz4"), 4),
            (&format!("{a}/snapshots/00000000.snapshot.lz4"), 4),
        ]);
        assert_eq!(target(&tie), "00000000000000aa");
        // A's chain is what a restore reaches: its newest object is A's own.
        assert_eq!(Layout::read(&listing).chain().unwrap().newest, at(6));
    }

    /// litestream 0.5 restores the generation of the newest snapshot: WAL written later elsewhere does not count,
    /// and it starts from that snapshot even where the generation has one of a higher index but older.
    #[test]
    fn litestream_0_5_restores_the_generation_of_the_newest_snapshot() {
        let a = "generations/00000000000000aa";
        let b = "generations/00000000000000bb";
        // A (an old writer still uploading WAL) against B (a newer snapshot): 0.3 takes A, 0.5 takes B.
        let listing = objects(&[
            (&format!("{a}/snapshots/00000000.snapshot.lz4"), 1),
            (&format!("{a}/wal/00000000_00000000.wal.lz4"), 9),
            (&format!("{b}/snapshots/00000000.snapshot.lz4"), 5),
            (&format!("{b}/wal/00000000_00000000.wal.lz4"), 7),
        ]);
        let chain = |restorer| {
            Layout::read_for(&listing, restorer)
                .chain()
                .unwrap()
                .clone()
        };
        assert_eq!(chain(Restorer::V03).generation, "00000000000000aa");
        assert_eq!(chain(Restorer::V03).newest, at(9));
        assert_eq!(chain(Restorer::V05).generation, "00000000000000bb");
        assert_eq!(chain(Restorer::V05).newest, at(7));
        // Equal times: the exchange sort leaves the later by name last here.
        let tie = objects(&[
            (&format!("{a}/snapshots/00000000.snapshot.lz4"), 4),
            (&format!("{b}/snapshots/00000000.snapshot.lz4"), 4),
        ]);
        let generation = Layout::read_for(&tie, Restorer::V05)
            .chain()
            .unwrap()
            .generation
            .clone();
        assert_eq!(generation, "00000000000000bb");
        // Within a generation, the newest snapshot, not the highest index.
        let odd = objects(&[
            (&format!("{a}/snapshots/00000000.snapshot.lz4"), 8),
            (&format!("{a}/snapshots/00000002.snapshot.lz4"), 3),
            (&format!("{a}/wal/00000000_00000000.wal.lz4"), 8),
            (&format!("{a}/wal/00000001_00000000.wal.lz4"), 8),
            (&format!("{a}/wal/00000002_00000000.wal.lz4"), 8),
        ]);
        assert_eq!(
            Layout::read_for(&odd, Restorer::V05)
                .chain()
                .unwrap()
                .snapshot_index,
            0
        );
        assert_eq!(
            Layout::read_for(&odd, Restorer::V03)
                .chain()
                .unwrap()
                .snapshot_index,
            2
        );
        // No snapshot anywhere: nothing restores, as with 0.3.
        let none = objects(&[(&format!("{a}/wal/00000000_00000000.wal.lz4"), 1)]);
        assert_eq!(
            Layout::read_for(&none, Restorer::V05),
            Layout::read_for(&none, Restorer::V03)
        );
        assert_eq!(Restorer::of_version("v0.3.13\n"), Some(Restorer::V03));
        assert_eq!(Restorer::of_version("0.5.17"), Some(Restorer::V05));
        assert_eq!(Restorer::of_version("development build"), None);
    }

    #[test]
    fn ltx_files_and_foreign_objects() {
        assert_eq!(
            Layout::read(&objects(&[(
                "ltx/0/0000000000000001-0000000000000001.ltx",
                1
            )])),
            Layout::Ltx
        );
        assert_eq!(
            Layout::read(&objects(&[
                (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
                ("ltx/9/0000000000000001-0000000000000002.ltx", 2),
            ])),
            Layout::Ltx
        );
        assert_eq!(Layout::read(&objects(&[("README.txt", 1)])), Layout::Empty);
        // Zero 1.10's v5 backups: one path per replica below the backup URL, old 0.3 generations beside them.
        assert_eq!(
            Layout::read(&objects(&[
                (&format!("{G}/snapshots/00000000.snapshot.lz4"), 1),
                (
                    "1761300000000/ltx/0/0000000000000001-0000000000000001.ltx",
                    2
                ),
            ])),
            Layout::Ltx
        );
        // Not litestream 0.5's: deeper, not `.ltx`, or a name inside a generation.
        for path in [
            "a/b/ltx/0/0000000000000001-0000000000000001.ltx",
            "backups/ltx/0/notes.txt",
            "backups/ltx/0000000000000001-0000000000000001.ltx",
        ] {
            assert_eq!(
                Layout::read(&objects(&[(path, 1)])),
                Layout::Empty,
                "{path}"
            );
        }
        assert!(matches!(
            Layout::read(&objects(&[(&format!("{G}/ltx/0/x.ltx"), 1)])),
            Layout::Broken { .. }
        ));
    }
}
