//! What the sidecar keeps across restarts: the open reservations, the subscribers the policy tracks with their acks,
//! the cleanup delay learned from observed restores, the last purge, the highest watermark litestream reported, and
//! the replica version all of that belongs to.
//!
//! The reservations matter most: a view-syncer that has its status restores without ever opening its snapshot
//! socket again, so after a restart only the kept reservation still protects the rows its restore needs; a
//! subscriber the restart cut off is waited for as if it had just left. The delay
//! keeps the start-up wait as long as the restores seen; the highest watermark keeps a regression across a restart
//! visible; the replica version tells a resync during the downtime.
//!
//! The file is small JSON, replaced atomically (written beside it, synced, renamed over it, directory synced), so a
//! crash at any point leaves the old state or the new one. A missing file means a first start. An unreadable or
//! corrupt one is an error, never guessed around: the sidecar serves, but holds cleanup and leaves the file alone
//! for the operator. Files of version 1 (which kept no reservations) are read, as a start without them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::cleanup::reservations::Kept;
use crate::cleanup::subscribers::KeptSubscriber;
use crate::cleanup::Backup;

/// The file's format; a file of another version is refused like a corrupt one, but for version 1.
const VERSION: u32 = 2;

/// What is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The cleanup delay in force, learned or configured.
    pub cleanup_delay: Duration,
    /// The backup the last complete purge went up to.
    pub last_purge: Option<Backup>,
    /// The highest watermark litestream's gauge reported.
    pub highest_backup: Option<String>,
    /// The change DB's `replicaVersion` the rest belongs to.
    pub replica_version: Option<String>,
    /// Open reservations, by task.
    pub reservations: Vec<Kept>,
    /// Subscribers the cleanup policy tracked (connected, or departed and still expected back): a restart cuts
    /// them off, and the next run waits for them as if they had just left.
    pub subscribers: Vec<KeptSubscriber>,
    /// `false` for a version 1 file, which did not keep reservations: which restores were in flight is unknown.
    pub knows_reservations: bool,
    /// Since when (a start without a state file) which restores were in flight is unknown, while cleanup still
    /// holds for it: a restart during that hold must not cut it short.
    pub restores_unknown_since: Option<SystemTime>,
}

impl Default for Saved {
    fn default() -> Self {
        Self {
            cleanup_delay: Duration::ZERO,
            last_purge: None,
            highest_backup: None,
            replica_version: None,
            reservations: Vec::new(),
            subscribers: Vec::new(),
            knows_reservations: true,
            restores_unknown_since: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    cleanup_delay_ms: u64,
    last_purge: Option<FileBackup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    highest_backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica_version: Option<String>,
    #[serde(default)]
    reservations: Option<Vec<FileReservation>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restores_unknown_since_ms: Option<u64>,
    #[serde(default)]
    subscribers: Vec<FileSubscriber>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSubscriber {
    id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task_id: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    backup: bool,
    replica_version: String,
    acked: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileReservation {
    task_id: String,
    floor: Option<String>,
    protocol: u64,
    /// When it opened, in milliseconds since the Unix epoch.
    opened_at_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBackup {
    watermark: String,
    /// When it was backed up, in milliseconds since the Unix epoch.
    backed_up_at_ms: u64,
}

/// Why a state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a state file of this version: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads the state; `Ok(None)` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<Saved>, StateError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Read {
                path: path.into(),
                source,
            })
        }
    };
    decode(&text)
        .map(Some)
        .map_err(|reason| StateError::Corrupt {
            path: path.into(),
            reason,
        })
}

/// Replaces the state atomically.
pub fn store(path: &Path, saved: &Saved) -> Result<(), StateError> {
    let failed = |source| StateError::Write {
        path: path.into(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // Outside systemd nothing makes the default directory.
    std::fs::create_dir_all(dir).map_err(failed)?;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut file = std::fs::File::create(&tmp).map_err(failed)?;
    file.write_all(&encode(saved)).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(failed)?;
    // The rename is durable once the directory is.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn encode(saved: &Saved) -> Vec<u8> {
    let file = File {
        version: VERSION,
        cleanup_delay_ms: u64::try_from(saved.cleanup_delay.as_millis()).unwrap_or(u64::MAX),
        last_purge: saved.last_purge.as_ref().map(|b| FileBackup {
            watermark: b.watermark.clone(),
            backed_up_at_ms: millis(b.backed_up_at),
        }),
        highest_backup: saved.highest_backup.clone(),
        replica_version: saved.replica_version.clone(),
        reservations: Some(
            saved
                .reservations
                .iter()
                .map(|r| FileReservation {
                    task_id: r.task_id.clone(),
                    floor: r.floor.clone(),
                    protocol: r.protocol,
                    opened_at_ms: millis(r.opened_at),
                })
                .collect(),
        ),
        restores_unknown_since_ms: saved.restores_unknown_since.map(millis),
        subscribers: saved
            .subscribers
            .iter()
            .map(|k| FileSubscriber {
                id: k.id.clone(),
                task_id: k.task_id.clone(),
                backup: k.backup,
                replica_version: k.replica_version.clone(),
                acked: k.acked.clone(),
            })
            .collect(),
    };
    let mut text = serde_json::to_vec_pretty(&file).expect("plain data serializes");
    text.push(b'\n');
    text
}

/// A state file's bytes, as [`load`] reads them: apart from the file, so that any bytes a corrupt file may hold
/// can be tried without one.
pub fn decode(text: &[u8]) -> Result<Saved, String> {
    let file: File = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    match (file.version, &file.reservations) {
        (1, None) | (VERSION, Some(_)) => {}
        (1 | VERSION, _) => {
            return Err(format!(
                "version {} with{} reservations",
                file.version,
                if file.reservations.is_some() {
                    ""
                } else {
                    "out"
                }
            ))
        }
        (other, _) => return Err(format!("version {other} (expected {VERSION})")),
    }
    let at = |ms: u64| {
        UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or("a time out of range")
    };
    let watermark = |w: Option<String>, what: &str| match w {
        Some(w) if w.is_empty() => Err(format!("an empty {what}")),
        w => Ok(w),
    };
    let mut reservations = Vec::new();
    for r in file.reservations.iter().flatten() {
        if r.task_id.is_empty() {
            return Err("a reservation without a task".into());
        }
        if reservations.iter().any(|k: &Kept| k.task_id == r.task_id) {
            return Err(format!("task {:?} reserved twice", r.task_id));
        }
        reservations.push(Kept {
            task_id: r.task_id.clone(),
            floor: watermark(r.floor.clone(), "reservation floor")?,
            protocol: r.protocol,
            opened_at: at(r.opened_at_ms)?,
        });
    }
    let last_purge = match file.last_purge {
        None => None,
        Some(b) => {
            if b.watermark.is_empty() {
                return Err("an empty watermark".into());
            }
            let backed_up_at = at(b.backed_up_at_ms)?;
            Some(Backup {
                watermark: b.watermark,
                backed_up_at,
            })
        }
    };
    Ok(Saved {
        cleanup_delay: Duration::from_millis(file.cleanup_delay_ms),
        last_purge,
        highest_backup: watermark(file.highest_backup, "highest watermark")?,
        replica_version: watermark(file.replica_version, "replica version")?,
        knows_reservations: file.reservations.is_some(),
        reservations,
        subscribers: file
            .subscribers
            .into_iter()
            .map(|f| {
                if f.acked.is_empty() || f.replica_version.is_empty() {
                    return Err(format!("subscriber {:?} without a watermark", f.id));
                }
                Ok(KeptSubscriber {
                    id: f.id,
                    task_id: f.task_id,
                    backup: f.backup,
                    replica_version: f.replica_version,
                    acked: f.acked,
                })
            })
            .collect::<Result<_, String>>()?,
        restores_unknown_since: file.restores_unknown_since_ms.map(at).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> Saved {
        Saved {
            cleanup_delay: Duration::from_millis(7_345_120),
            last_purge: Some(Backup {
                watermark: "718sh0nk8".into(),
                backed_up_at: UNIX_EPOCH + Duration::from_millis(1_764_000_000_123),
            }),
            highest_backup: Some("718sh0nkz".into()),
            replica_version: Some("618ocqq8".into()),
            reservations: vec![
                Kept {
                    task_id: "vs-1".into(),
                    floor: Some("718sh0nk9".into()),
                    protocol: 6,
                    opened_at: UNIX_EPOCH + Duration::from_millis(1_764_000_100_456),
                },
                Kept {
                    task_id: "vs-2".into(),
                    floor: None,
                    protocol: 3,
                    opened_at: UNIX_EPOCH + Duration::from_millis(1_764_000_200_000),
                },
            ],
            subscribers: vec![
                KeptSubscriber {
                    id: "vs-a".into(),
                    task_id: Some("task-a".into()),
                    backup: false,
                    replica_version: "618ocqq8".into(),
                    acked: "718sh0nk7".into(),
                },
                KeptSubscriber {
                    id: "rm".into(),
                    task_id: None,
                    backup: true,
                    replica_version: "618ocqq8".into(),
                    acked: "718sh0nk9".into(),
                },
            ],
            knows_reservations: true,
            restores_unknown_since: Some(UNIX_EPOCH + Duration::from_millis(1_764_000_000_000)),
        }
    }

    #[test]
    fn a_version_1_file_is_read_as_one_that_kept_no_reservations() {
        let old = br#"{"version":1,"cleanup_delay_ms":45000,"last_purge":{"watermark":"0c","backed_up_at_ms":1}}"#;
        let read = decode(old).unwrap();
        assert_eq!(read.cleanup_delay, Duration::from_secs(45));
        assert_eq!(read.last_purge.unwrap().watermark, "0c");
        assert!(read.reservations.is_empty());
        assert!(!read.knows_reservations);
    }

    #[test]
    fn a_stored_state_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert!(load(&path).unwrap().is_none(), "no file: a first start");
        store(&path, &saved()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(saved()));
        let empty = Saved::default();
        store(&path, &empty).unwrap();
        assert_eq!(load(&path).unwrap(), Some(empty));
        // Nothing is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn corrupt_or_foreign_files_are_errors_that_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        for text in [
            "",
            "{",
            "null",
            r#"{"version":3,"cleanup_delay_ms":1,"last_purge":null,"reservations":[]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null}"#,
            r#"{"version":1,"cleanup_delay_ms":1,"last_purge":null,"reservations":[]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"reservations":[{"task_id":"","floor":null,"protocol":3,"opened_at_ms":1}]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"reservations":[{"task_id":"a","floor":"","protocol":3,"opened_at_ms":1}]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"reservations":[{"task_id":"a","floor":null,"protocol":3,"opened_at_ms":1},{"task_id":"a","floor":null,"protocol":3,"opened_at_ms":2}]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"highest_backup":"","reservations":[]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"reservations":[],"subscribers":[{"id":"a","replica_version":"01","acked":""}]}"#,
            r#"{"version":2,"cleanup_delay_ms":-1,"last_purge":null,"reservations":[]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":{"watermark":"","backed_up_at_ms":1},"reservations":[]}"#,
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null,"reservations":[],"extra":true}"#,
        ] {
            std::fs::write(&path, text).unwrap();
            let err = load(&path).expect_err(text);
            assert!(matches!(err, StateError::Corrupt { .. }), "{text}: {err}");
            assert!(err.to_string().contains("state.json"), "{err}");
        }
    }

    #[test]
    fn a_write_that_cannot_happen_leaves_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        store(&path, &saved()).unwrap();
        // The temporary file's place is taken by a directory: the write fails before the rename.
        std::fs::create_dir(dir.path().join("state.json.tmp")).unwrap();
        assert!(matches!(
            store(&path, &Saved::default()),
            Err(StateError::Write { .. })
        ));
        assert_eq!(load(&path).unwrap(), Some(saved()));
    }
}
