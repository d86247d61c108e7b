//! Restore drills: the only proof that a backup restores is restoring it (docs/operations.md, "Backups you can
//! restore"). A drill runs `litestream restore` of the newest backup with the litestream executable the host runs,
//! into a scratch directory, at a low CPU and I/O priority, within a time limit and the disk's free space; then
//! opens the result with SQLite, runs `PRAGMA quick_check` (or `integrity_check`) and reads the replica's own
//! position (`"_zero.replicationState".stateVersion`) and version (`"_zero.replicationConfig".replicaVersion`).
//! The scratch directory is removed whatever happens, and leftovers of a drill cut short (a crash, `kill -9`) are
//! removed before the next one starts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::litestream::destination::S3Settings;

/// How thoroughly the restored database is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckLevel {
    /// `PRAGMA quick_check`: every page and record readable, without the index cross-checks.
    #[default]
    Quick,
    /// `PRAGMA integrity_check`: also every index against its table; much slower on a large database.
    Full,
}

/// What a drill needs to run.
#[derive(Debug, Clone)]
pub struct Drill {
    /// The litestream executable (`backup.litestream`).
    pub litestream: PathBuf,
    /// `litestream.backup_url`, restored from exactly as view-syncers restore it.
    pub backup_url: String,
    pub s3: S3Settings,
    /// `backup.drill_dir`: each drill gets a fresh directory below it.
    pub dir: PathBuf,
    /// `backup.drill_timeout`: fixed, or scaled to the database's size.
    pub timeout: crate::litestream::restore_limit::RestoreLimit,
    /// Free space the drill leaves on the scratch filesystem: it does not start, or is stopped, below it.
    pub reserve: u64,
    pub check: CheckLevel,
    /// The release view-syncers restore with (`backup.restore_with`): a drill refuses to run another, whose restore
    /// may pick another generation than theirs.
    pub restore_with: crate::litestream::layout::Restorer,
    /// Variables added to litestream's environment (tests give the destination's `AWS_*` this way).
    pub env: Vec<(String, String)>,
}

/// What the backup claimed to reach when a drill started. A restore that starts later must reach at least that: one
/// that reaches less read a backup with objects missing (a WAL segment gone from the middle of an index, which no
/// listing can see), and view-syncers restoring it would start behind what cleanup and statuses went by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// litestream's gauge, at its newest watermark that the listing covered (or the gauge alone where nothing is
    /// listed): a restore reaches it whichever generation it picks.
    pub gauge: Option<Claim>,
    /// The last drill's proof: a restore of the same generation reaches it again.
    pub proof: Option<Claim>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub watermark: String,
    /// The generation it is of (the one a restore picked, or the listing showed it would pick); `None` where the
    /// layout has none (not listed, or litestream 0.5).
    pub generation: Option<String>,
}

/// A drill that restored and checked the backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// `stateVersion` of the restored replica: the watermark the backup is proven to reach.
    pub watermark: String,
    pub replica_version: String,
    /// The generation litestream restored (from its own log); `None` where it names none.
    pub generation: Option<String>,
    pub started: SystemTime,
    pub finished: SystemTime,
    pub restore_took: Duration,
    pub check_took: Duration,
    /// The restored database's size.
    pub bytes: u64,
}

/// Why a drill proved nothing. [`Failure::is_backup`] tells a backup that does not restore from a drill that could
/// not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("litestream restore exited with {status}: {stderr}")]
    Restore { status: String, stderr: String },
    #[error("the restore produced no database (litestream found no backup to restore): {stderr}")]
    Nothing { stderr: String },
    #[error("the restored database fails {check}: {detail}")]
    Check { check: &'static str, detail: String },
    #[error("the restored database is not a Zero replica: {0}")]
    NotAReplica(String),
    #[error(
        "the restored replica is of version {restored}, the change DB's is {current}: the backup is of \
         another replica (a resync it has not caught up with?)"
    )]
    OtherReplica { restored: String, current: String },
    #[error(
        "the backup claims {claimed} ({by}), but a restore{} reaches only {restored}: objects are missing \
         from the backup (a WAL segment inside an index?), and view-syncers restoring it get less than cleanup \
         and statuses went by",
        generation.as_deref().map(|g| format!(" of generation {g}")).unwrap_or_default()
    )]
    RestoredLess {
        claimed: String,
        restored: String,
        generation: Option<String>,
        /// Where the claim came from.
        by: &'static str,
    },
    #[error(
        "no complete restore within {0:?} (backup.drill_timeout; \"auto\" allows an hour per 50 GiB of the \
         database)"
    )]
    Timeout(Duration),
    #[error(
        "not enough disk in {dir}: {free} bytes free, the drill needs {need} (the database's size plus \
         backup.drill_reserve)"
    )]
    Disk { dir: String, free: u64, need: u64 },
    #[error("cannot run the drill: {0}")]
    Setup(String),
}

impl Failure {
    /// The backup itself failed the drill, as a view-syncer's restore would: cleanup and statuses hold for it.
    /// A drill that could not run (disk, time, setup) says nothing about the backup.
    pub fn is_backup(&self) -> bool {
        matches!(
            self,
            Failure::Restore { .. }
                | Failure::Nothing { .. }
                | Failure::Check { .. }
                | Failure::NotAReplica(_)
                | Failure::OtherReplica { .. }
                | Failure::RestoredLess { .. }
        )
    }

    /// The metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Restore { .. } => "restore",
            Failure::Nothing { .. } => "nothing",
            Failure::Check { .. } => "check",
            Failure::NotAReplica(_) => "not_a_replica",
            Failure::OtherReplica { .. } => "other_replica",
            Failure::RestoredLess { .. } => "restored_less",
            Failure::Timeout(_) => "timeout",
            Failure::Disk { .. } => "disk",
            Failure::Setup(_) => "setup",
        }
    }

    pub const KINDS: [&'static str; 9] = [
        "restore",
        "nothing",
        "check",
        "not_a_replica",
        "other_replica",
        "restored_less",
        "timeout",
        "disk",
        "setup",
    ];
}

/// The scratch directories' name prefix: anything below `drill_dir` with it is a drill's and may be removed.
const SCRATCH_PREFIX: &str = "drill-";
/// How often free space is looked at while a restore runs.
const DISK_POLL: Duration = Duration::from_millis(250);
/// The end of litestream's error output kept for the report.
const STDERR_KEPT: usize = 2048;

impl Drill {
    /// Restores the newest backup and checks it. `expected_bytes`: the database's size where known (litestream's
    /// `litestream_db_size`), to refuse a drill the disk cannot hold before it starts. `replica_version`: the change
    /// DB's, which the restored replica must carry. `claims`: what the backup claimed as the drill started, which
    /// the restore must reach.
    pub async fn run(
        &self,
        expected_bytes: Option<u64>,
        replica_version: Option<&str>,
        claims: &Claims,
    ) -> Result<Proof, Failure> {
        let started = SystemTime::now();
        // Before anything is written: without litestream no drill can run, and no directory is made for one.
        let litestream = self.executable()?;
        self.same_release(&litestream).await?;
        let scratch = Scratch::create(&self.dir)?;
        let need = expected_bytes.unwrap_or(0).saturating_add(self.reserve);
        let free = free_bytes(&self.dir)?;
        if free < need {
            return Err(Failure::Disk {
                dir: self.dir.display().to_string(),
                free,
                need,
            });
        }
        let restore_started = Instant::now();
        let output = scratch.path.join("replica.db");
        let timeout = self.timeout.for_size(expected_bytes);
        let generation = self.restore(&scratch.path, &output, timeout).await?;
        let restore_took = restore_started.elapsed();
        let check_started = Instant::now();
        let level = self.check;
        let checked = {
            let output = output.clone();
            tokio::task::spawn_blocking(move || check(&output, level))
                .await
                .map_err(|e| Failure::Setup(format!("the check did not finish: {e}")))??
        };
        let check_took = check_started.elapsed();
        if let Some(current) = replica_version {
            if checked.replica_version != current {
                return Err(Failure::OtherReplica {
                    restored: checked.replica_version,
                    current: current.to_string(),
                });
            }
        }
        restored_enough(&checked.watermark, generation.as_deref(), claims)?;
        drop(scratch);
        Ok(Proof {
            watermark: checked.watermark,
            replica_version: checked.replica_version,
            generation,
            started,
            finished: SystemTime::now(),
            restore_took,
            check_took,
            bytes: checked.bytes,
        })
    }

    /// `litestream restore -config <scratch>/litestream.yml -o <output> <scratch>/source.db`, under `nice -n 10`
    /// and `ionice -c 2 -n 7` (best effort, lowest) where the host has them. Returns the generation it restored,
    /// as its log names it.
    async fn restore(
        &self,
        scratch: &Path,
        output: &Path,
        timeout: Duration,
    ) -> Result<Option<String>, Failure> {
        let config = scratch.join("litestream.yml");
        let source = scratch.join("source.db");
        std::fs::write(&config, restore_config(&source, &self.backup_url, &self.s3))
            .map_err(|e| Failure::Setup(format!("{}: {e}", config.display())))?;
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        // Low, not idle: at nice 19 and the idle I/O class a drill on a busy host can wait without end.
        for (tool, args) in [
            ("nice", &["-n", "10"][..]),
            ("ionice", &["-c", "2", "-n", "7"][..]),
        ] {
            if let Some(path) = on_path(tool) {
                argv.push(path.into());
                argv.extend(args.iter().map(Into::into));
            }
        }
        // Found here rather than by the wrappers: `ionice` failing to run it would look like a failed restore.
        let litestream = self.executable()?;
        argv.push(litestream.into());
        for arg in [
            "restore".as_ref(),
            "-config".as_ref(),
            config.as_os_str(),
            "-o".as_ref(),
            output.as_os_str(),
            source.as_os_str(),
        ] {
            argv.push(arg.to_owned());
        }
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(scratch)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::Setup(format!("{}: {e}", argv[0].to_string_lossy())))?;
        // litestream 0.3 logs to stdout when it reads a config file (as here), to stderr otherwise: both are kept.
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let collect = async move {
            let (mut text, mut errors) = (Vec::new(), Vec::new());
            let _ = tokio::join!(
                stdout.read_to_end(&mut text),
                stderr.read_to_end(&mut errors)
            );
            text.extend_from_slice(&errors);
            text
        };
        let dir = self.dir.clone();
        let reserve = self.reserve;
        let watch_disk = async move {
            loop {
                tokio::time::sleep(DISK_POLL).await;
                if let Ok(free) = free_bytes(&dir) {
                    if free < reserve {
                        return Failure::Disk {
                            dir: dir.display().to_string(),
                            free,
                            need: reserve,
                        };
                    }
                }
            }
        };
        let finished = async { tokio::join!(child.wait(), collect) };
        let stopped = tokio::select! {
            done = tokio::time::timeout(timeout, finished) => match done {
                Ok(done) => Ok(done),
                Err(_) => Err(Failure::Timeout(timeout)),
            },
            failure = watch_disk => Err(failure),
        };
        let (status, text) = match stopped {
            Ok(done) => done,
            Err(failure) => {
                // Waited for, not only signalled: the files it still holds open keep their space until it is
                // gone, and the scratch directory is removed right after.
                let _ = child.kill().await;
                return Err(failure);
            }
        };
        let stderr = tail(&text);
        let status = status.map_err(|e| Failure::Setup(format!("waiting for litestream: {e}")))?;
        if !status.success() {
            // Out of space before the disk watch looked: the drill's disk, not the backup, failed it.
            let free = free_bytes(&self.dir).ok();
            if free.is_some_and(|free| free < self.reserve)
                || stderr.contains("no space left on device")
            {
                return Err(Failure::Disk {
                    dir: self.dir.display().to_string(),
                    free: free.unwrap_or(0),
                    need: self.reserve,
                });
            }
            return Err(Failure::Restore {
                status: status.to_string(),
                stderr,
            });
        }
        if !output.exists() {
            return Err(Failure::Nothing { stderr });
        }
        Ok(restored_generation(&text))
    }

    /// Refuses an executable whose `litestream version` names another release than `restore_with`: its restore
    /// would not prove what view-syncers restore. One whose output names no known release is let through (a build
    /// of its own, a wrapper).
    async fn same_release(&self, litestream: &Path) -> Result<(), Failure> {
        let output = tokio::process::Command::new(litestream)
            .arg("version")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .output();
        let Ok(Ok(output)) = tokio::time::timeout(Duration::from_secs(10), output).await else {
            return Ok(());
        };
        let text = String::from_utf8_lossy(&output.stdout);
        match crate::litestream::layout::Restorer::of_version(&text) {
            Some(release) if release != self.restore_with => Err(Failure::Setup(format!(
                "{} is litestream {}, but backup.restore_with = \"{}\": drills restore with the release \
                 view-syncers restore with, which picks the same generation",
                litestream.display(),
                text.trim(),
                self.restore_with.as_str()
            ))),
            _ => Ok(()),
        }
    }

    /// The litestream executable: a path as given, a bare name from `PATH`.
    fn executable(&self) -> Result<PathBuf, Failure> {
        let found = if self.litestream.components().count() > 1 {
            self.litestream.is_file().then(|| self.litestream.clone())
        } else {
            self.litestream.to_str().and_then(on_path)
        };
        found.ok_or_else(|| {
            Failure::Setup(format!(
                "no litestream executable at {:?} (backup.litestream; a bare name is looked up on PATH)",
                self.litestream
            ))
        })
    }

    /// Removes what drills cut short left below `drill_dir`; returns how many. A directory whose process still
    /// runs (another sidecar sharing the default `drill_dir`, or `litestream-sidecar drill`) is that process's.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let ours = std::process::id();
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix(SCRATCH_PREFIX).is_some_and(|rest| {
                    match rest
                        .rsplit_once('-')
                        .and_then(|(_, pid)| pid.parse::<u32>().ok())
                    {
                        Some(pid) if pid != ours => !Path::new(&format!("/proc/{pid}")).exists(),
                        _ => true,
                    }
                })
            })
            .filter(|e| std::fs::remove_dir_all(e.path()).is_ok())
            .count()
    }
}

/// Compares what a drill restored with what was claimed as it started: the gauge's claim whatever the generation,
/// an earlier proof only when the restore is of that proof's generation (a new generation may start lower, from a
/// litestream that lost its position, and its own claims say how far it goes).
pub fn restored_enough(
    restored: &str,
    generation: Option<&str>,
    claims: &Claims,
) -> Result<(), Failure> {
    let less = |claim: &Claim, by: &'static str| Failure::RestoredLess {
        claimed: claim.watermark.clone(),
        restored: restored.to_string(),
        generation: generation.map(str::to_string),
        by,
    };
    if let Some(claim) = claims
        .gauge
        .as_ref()
        .filter(|c| restored < c.watermark.as_str())
    {
        return Err(less(
            claim,
            "litestream's gauge, covered by the destination's objects",
        ));
    }
    if let Some(claim) = claims.proof.as_ref().filter(|c| {
        restored < c.watermark.as_str()
            && c.generation.is_some()
            && c.generation.as_deref() == generation
    }) {
        return Err(less(claim, "an earlier drill of the same generation"));
    }
    Ok(())
}

/// The generation litestream names in its restore log (`generation=<16 hex digits>`), the first one named: 0.3 at
/// its info level, 0.5 at debug ("selected v0.3.x snapshot"), which the restore config asks for.
fn restored_generation(log: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(log);
    text.match_indices("generation=").find_map(|(at, key)| {
        let value = text[at + key.len()..].trim_start_matches('"');
        let id: String = value.chars().take_while(char::is_ascii_hexdigit).collect();
        (id.len() == 16).then_some(id)
    })
}

/// The config a restore reads: the backup URL as view-syncers get it, and the S3 settings the sidecar lists with.
/// Values are JSON strings, which YAML reads as they are. Debug logging: litestream 0.5 names the generation it
/// restores only there (0.3 logs as before).
pub fn restore_config(source: &Path, backup_url: &str, s3: &S3Settings) -> String {
    let quote = |text: &str| serde_json::to_string(text).expect("a string serialises");
    let mut replica = format!("      - url: {}\n", quote(backup_url));
    if let Some(endpoint) = &s3.endpoint {
        replica += &format!("        endpoint: {}\n", quote(endpoint));
    }
    if let Some(region) = &s3.region {
        replica += &format!("        region: {}\n", quote(region));
    }
    if s3.force_path_style {
        replica += "        force-path-style: true\n";
    }
    format!(
        "logging:\n  level: debug\ndbs:\n  - path: {}\n    replicas:\n{replica}",
        quote(&source.to_string_lossy())
    )
}

/// What the check read of the restored database.
#[derive(Debug)]
struct Checked {
    watermark: String,
    replica_version: String,
    bytes: u64,
}

fn check(path: &Path, level: CheckLevel) -> Result<Checked, Failure> {
    use rusqlite::{Connection, OpenFlags};
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let db = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| Failure::Check {
        check: "open",
        detail: e.to_string(),
    })?;
    let pragma = match level {
        CheckLevel::Quick => "quick_check",
        CheckLevel::Full => "integrity_check",
    };
    let problems = (|| -> rusqlite::Result<Vec<String>> {
        let mut statement = db.prepare(&format!("PRAGMA {pragma}"))?;
        let rows = statement.query_map([], |row| row.get::<_, String>(0))?;
        rows.collect()
    })()
    .map_err(|e| Failure::Check {
        check: pragma,
        detail: e.to_string(),
    })?;
    if problems != ["ok"] {
        return Err(Failure::Check {
            check: pragma,
            detail: problems.into_iter().take(5).collect::<Vec<_>>().join("; "),
        });
    }
    let one = |sql: &str| {
        db.query_row(sql, [], |row| row.get::<_, String>(0))
            .map_err(|e| Failure::NotAReplica(format!("{sql}: {e}")))
    };
    Ok(Checked {
        watermark: one(r#"SELECT "stateVersion" FROM "_zero.replicationState""#)?,
        replica_version: one(r#"SELECT "replicaVersion" FROM "_zero.replicationConfig""#)?,
        bytes,
    })
}

/// A drill's directory, removed when dropped: on success, on failure and when the drill's future is dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn create(parent: &Path) -> Result<Scratch, Failure> {
        std::fs::create_dir_all(parent)
            .map_err(|e| Failure::Setup(format!("{}: {e}", parent.display())))?;
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let path = parent.join(format!("{SCRATCH_PREFIX}{stamp}-{}", std::process::id()));
        std::fs::create_dir(&path)
            .map_err(|e| Failure::Setup(format!("{}: {e}", path.display())))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn free_bytes(dir: &Path) -> Result<u64, Failure> {
    let stat = rustix::fs::statvfs(dir)
        .map_err(|e| Failure::Setup(format!("free space of {}: {e}", dir.display())))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(tool))
            .find(|path| path.is_file())
    })
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes).trim().replace('\n', " | ");
    let start = text.len().saturating_sub(STDERR_KEPT);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restore_config_quotes_what_it_is_given() {
        let s3 = S3Settings {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("us-east-1".into()),
            force_path_style: true,
            allow_http: true,
        };
        assert_eq!(
            restore_config(Path::new("/scratch/source.db"), "s3://zb/replica \"x\"", &s3),
            "logging:\n  level: debug\ndbs:\n  - path: \"/scratch/source.db\"\n    replicas:\n      - url: \"s3://zb/replica \\\"x\\\"\"\n        \
             endpoint: \"http://127.0.0.1:9000\"\n        region: \"us-east-1\"\n        force-path-style: true\n"
        );
    }

    #[test]
    fn backup_failures_are_told_from_drills_that_could_not_run() {
        assert!(Failure::Check {
            check: "quick_check",
            detail: "x".into()
        }
        .is_backup());
        assert!(!Failure::Timeout(Duration::from_secs(1)).is_backup());
        assert!(!Failure::Disk {
            dir: "/d".into(),
            free: 1,
            need: 2
        }
        .is_backup());
        assert_eq!(Failure::KINDS.len(), 9);
        assert!(Failure::RestoredLess {
            claimed: "0b".into(),
            restored: "0a".into(),
            generation: None,
            by: "x"
        }
        .is_backup());
    }

    #[test]
    fn the_sweep_spares_the_directories_of_running_processes() {
        let dir = tempfile::tempdir().unwrap();
        let drill = Drill {
            litestream: "litestream".into(),
            backup_url: "file:///nowhere".into(),
            s3: S3Settings::default(),
            dir: dir.path().to_path_buf(),
            timeout: crate::litestream::restore_limit::RestoreLimit::Fixed(Duration::from_secs(1)),
            reserve: 0,
            check: CheckLevel::Quick,
            restore_with: Default::default(),
            env: Vec::new(),
        };
        // PID 1 runs; no process has the largest PID; this process's own leftovers are from an earlier run.
        let names = [
            "drill-1-1".to_string(),
            format!("drill-2-{}", u32::MAX),
            format!("drill-3-{}", std::process::id()),
            "other".to_string(),
        ];
        for name in &names {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(drill.sweep(), 2);
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["drill-1-1", "other"]);
    }

    #[test]
    fn a_restore_below_a_claim_is_a_broken_backup() {
        let claim = |w: &str, g: Option<&str>| {
            Some(Claim {
                watermark: w.into(),
                generation: g.map(Into::into),
            })
        };
        let gauge = Claims {
            gauge: claim("0f", Some("aa")),
            proof: None,
        };
        assert!(restored_enough("0f", Some("aa"), &gauge).is_ok());
        assert!(restored_enough("0g", Some("bb"), &gauge).is_ok());
        let failure = restored_enough("0e", Some("bb"), &gauge).unwrap_err();
        assert_eq!(failure.kind(), "restored_less");
        assert!(failure.to_string().contains("claims 0f"), "{failure}");
        assert!(
            failure
                .to_string()
                .contains("generation bb reaches only 0e"),
            "{failure}"
        );
        // An earlier proof binds its own generation only.
        let proof = Claims {
            gauge: None,
            proof: claim("0f", Some("aa")),
        };
        assert!(restored_enough("0e", Some("aa"), &proof).is_err());
        assert!(restored_enough("0e", Some("bb"), &proof).is_ok());
        assert!(restored_enough("0e", None, &proof).is_ok());
        assert!(restored_enough("0e", None, &Claims::default()).is_ok());
    }

    #[test]
    fn the_restored_generation_is_read_from_litestream_s_log() {
        let log =
            b"time=2026-12-07T02:00:00Z level=INFO msg=\"restoring snapshot\" db=/x/source.db \
                    replica=file generation=6876d0f712825346 index=0 path=/x/replica.db.tmp\n";
        assert_eq!(
            restored_generation(log).as_deref(),
            Some("6876d0f712825346")
        );
        assert_eq!(
            restored_generation(b"generation=\"00000000000000bb\"").as_deref(),
            Some("00000000000000bb")
        );
        assert_eq!(restored_generation(b"generation=123 nothing"), None);
        assert_eq!(restored_generation(b""), None);
    }

    #[test]
    fn the_kept_error_output_is_the_end_on_one_line() {
        let long = format!("{}\nlast line", "x".repeat(3000));
        let kept = tail(long.as_bytes());
        assert!(kept.ends_with(" | last line"));
        assert!(kept.len() <= STDERR_KEPT);
    }
}
