//! What the sidecar keeps across restarts: the cleanup delay learned from observed restores, and the last purge.
//!
//! The delay matters for safety: after a restart the sidecar waits one cleanup delay before purging, so that a
//! restore that began before the restart (its reservation lost with the old process) finishes first. A delay
//! learned from a two-hour restore and forgotten at restart leaves only `cleanup.initial_delay` of protection.
//!
//! The file is small JSON, replaced atomically (written beside it, synced, renamed over it, directory synced), so a
//! crash at any point leaves the old state or the new one. A missing file means a first start; an unreadable or
//! corrupt one is logged and replaced by the configured defaults: never a reason not to start.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::cleanup::Backup;

/// The file's format; a file of another version is ignored like a corrupt one.
const VERSION: u32 = 1;

/// What is kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Saved {
    /// The cleanup delay in force, learned or configured.
    pub cleanup_delay: Duration,
    /// The backup the last complete purge went up to.
    pub last_purge: Option<Backup>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    cleanup_delay_ms: u64,
    last_purge: Option<FileBackup>,
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

fn encode(saved: &Saved) -> Vec<u8> {
    let file = File {
        version: VERSION,
        cleanup_delay_ms: u64::try_from(saved.cleanup_delay.as_millis()).unwrap_or(u64::MAX),
        last_purge: saved.last_purge.as_ref().map(|b| FileBackup {
            watermark: b.watermark.clone(),
            backed_up_at_ms: b
                .backed_up_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }),
    };
    let mut text = serde_json::to_vec_pretty(&file).expect("plain data serializes");
    text.push(b'\n');
    text
}

/// A state file's bytes, as [`load`] reads them: apart from the file, so that any bytes a corrupt file may hold
/// can be tried without one.
pub fn decode(text: &[u8]) -> Result<Saved, String> {
    let file: File = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!("version {} (expected {VERSION})", file.version));
    }
    let last_purge = match file.last_purge {
        None => None,
        Some(b) => {
            if b.watermark.is_empty() {
                return Err("an empty watermark".into());
            }
            let backed_up_at = UNIX_EPOCH
                .checked_add(Duration::from_millis(b.backed_up_at_ms))
                .ok_or("a backup time out of range")?;
            Some(Backup {
                watermark: b.watermark,
                backed_up_at,
            })
        }
    };
    Ok(Saved {
        cleanup_delay: Duration::from_millis(file.cleanup_delay_ms),
        last_purge,
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
        }
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
            r#"{"version":2,"cleanup_delay_ms":1,"last_purge":null}"#,
            r#"{"version":1,"cleanup_delay_ms":-1,"last_purge":null}"#,
            r#"{"version":1,"cleanup_delay_ms":1,"last_purge":{"watermark":"","backed_up_at_ms":1}}"#,
            r#"{"version":1,"cleanup_delay_ms":1,"last_purge":null,"extra":true}"#,
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
