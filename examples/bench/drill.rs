//! Restore drills (`backup.drill_*`, `cleanup.requires = "restore"`): what one drill of a large replica costs.
//!
//! A SQLite database of `BENCH_DRILL_MIB` MiB (1024 by default) shaped like a Zero replica (`_zero.replicationConfig`,
//! `_zero.replicationState`, `_zero.changeLog`, two large tables with indexes) is built by a child process of this
//! bench (so that its page cache and heap stay out of the figures below), put in WAL mode, and replicated by the real
//! `litestream replicate` (`LITESTREAM_BIN`, which `make bench` installs: upstream v0.3.13) to a `file://`
//! destination, with a few hundred small transactions written on top while it runs. Once litestream has uploaded
//! them and stopped, the source is removed (the drill needs only the backup, and the disk is spared) and
//! [`Drill::run`] restores and checks the backup in this process, as the daemon runs it: `quick_check`, then a
//! second drill with `integrity_check` (`drill_check = "full"`). A thread samples this process's resident memory,
//! litestream's, and the scratch directory's size meanwhile.
//!
//! Everything lives in one temp directory (`TMPDIR` picks the filesystem), removed at the end. The destination is a
//! local directory whose files are still in the page cache: the restore time leaves out the download a real
//! destination costs. The figures and how to read them: docs/operations.md, "Sizing a drill".

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use litestream_sidecar::litestream::drill::{CheckLevel, Drill, Proof};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use crate::util::{free_addr, mib, Report};

const MIB: u64 = 1 << 20;
const DEFAULT_MIB: u64 = 1024;
const REPLICA_VERSION: &str = "0e4vx4s8";
/// Rows per transaction while the database is filled, and how often its size is looked at.
const COMMIT_ROWS: u64 = 100_000;
const SIZE_CHECK_ROWS: u64 = 2_000;
/// The transactions written while litestream replicates, each updating this many issues.
const LIVE_TRANSACTIONS: u64 = 300;
const LIVE_ROWS: u64 = 10;
/// Free space the drills leave (`backup.drill_reserve`, 1 GiB by default): less, so that the bench fits a small disk.
const DRILL_RESERVE: u64 = 256 * MIB;
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// What the builder made, as it tells the bench on its stdout.
#[derive(Debug, Serialize, Deserialize)]
pub struct Built {
    bytes: u64,
    issues: u64,
    comments: u64,
    changes: u64,
    /// The last version the fill wrote: the transactions on top continue from it.
    version: u64,
    seconds: f64,
}

/// `bench drill-build <path> <bytes>`: builds the replica, prints [`Built`] as JSON.
pub fn build_main(args: &[String]) {
    let path = Path::new(args.first().expect("drill-build <path> <bytes>"));
    let bytes: u64 = args
        .get(1)
        .and_then(|b| b.parse().ok())
        .expect("drill-build <path> <bytes>");
    let built = build(path, bytes).expect("build the replica");
    println!("{}", serde_json::to_string(&built).unwrap());
}

pub async fn run(report: &mut Report) {
    println!("restore drill");
    let Some(litestream) = std::env::var_os("LITESTREAM_BIN")
        .filter(|bin| !bin.is_empty())
        .map(PathBuf::from)
    else {
        report.add(
            "restore drill",
            "skipped",
            "needs LITESTREAM_BIN (make bench installs litestream 0.3.13)",
            None,
        );
        return;
    };
    let size_mib = std::env::var("BENCH_DRILL_MIB")
        .ok()
        .and_then(|m| m.trim().parse::<u64>().ok())
        .filter(|m| *m > 0)
        .unwrap_or(DEFAULT_MIB);
    let target = size_mib * MIB;
    let work = tempfile::Builder::new()
        .prefix("bench-drill-")
        .tempdir()
        .expect("temp dir");
    // The source and its backup (lz4, up to its size) side by side, then the backup and the restored copy.
    let need = target * 9 / 4 + 512 * MIB;
    let free = free_bytes(work.path());
    if free < need {
        report.add(
            format!("restore drill of {size_mib} MiB"),
            "skipped",
            format!(
                "needs {} MiB free in {}, has {} MiB (BENCH_DRILL_MIB, TMPDIR)",
                need / MIB,
                work.path().parent().unwrap_or(work.path()).display(),
                free / MIB
            ),
            None,
        );
        return;
    }
    let tmpfs = rustix::fs::statfs(work.path()).is_ok_and(|s| s.f_type as u64 == TMPFS_MAGIC);
    println!("  litestream {}", litestream.display());
    report.add(
        format!(
            "replica, backup and scratch in {} (TMPDIR)",
            work.path().parent().unwrap_or(work.path()).display()
        ),
        if tmpfs { "tmpfs: in memory" } else { "on disk" },
        "",
        None,
    );

    // The replica, built by a child process.
    let source_dir = work.path().join("source");
    std::fs::create_dir(&source_dir).unwrap();
    let source = source_dir.join("replica.db");
    let output = Command::new(std::env::current_exe().expect("the bench's own path"))
        .arg("drill-build")
        .arg(&source)
        .arg(target.to_string())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the builder");
    assert!(output.status.success(), "building the replica failed");
    let built: Built = serde_json::from_slice(&output.stdout).expect("the builder's answer");
    report.add(
        format!(
            "build the replica (setup): {} issues, {} comments, {} changes",
            built.issues, built.comments, built.changes
        ),
        format!("{:.1} s", built.seconds),
        "",
        None,
    );

    // litestream replicate to a file:// destination, with transactions on top once the snapshot is up.
    let backup_dir = work.path().join("backup");
    let backup_url = format!("file://{}", backup_dir.display());
    let config = work.path().join("litestream.yml");
    let addr = free_addr();
    std::fs::write(
        &config,
        format!(
            "addr: {addr}\ndbs:\n  - path: {}\n    replicas:\n      - url: {}\n",
            json(&source.to_string_lossy()),
            json(&backup_url)
        ),
    )
    .unwrap();
    let log = work.path().join("litestream.log");
    let started = Instant::now();
    let mut replicating = Replicating::start(&litestream, &config, &log);
    let listing = |what: &str| -> Vec<Vec<String>> {
        let out = Command::new(&litestream)
            .arg(what)
            .arg("-config")
            .arg(&config)
            .arg(&source)
            .stderr(Stdio::null())
            .output()
            .expect("litestream listing");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(1800);
    while listing("snapshots").is_empty() {
        replicating.alive(&log);
        assert!(
            Instant::now() < deadline,
            "no snapshot within 30 min:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let snapshot_took = started.elapsed();
    let (watermark, live_took) = write_on_top(&source, &built);
    // Uploaded: the WAL listing holds a segment written since the last commit and stays the same over a second and
    // a half (litestream looks at the WAL every second, then its replica syncs every second). Stopping litestream
    // then syncs once more (litestream 0.3 does on SIGTERM), and the drill's stateVersion tells whether it all came.
    let committed = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let wal = listing("wal");
        let since = wal
            .iter()
            .any(|row| row.get(5).is_some_and(|c| *c >= committed));
        if (since && wal == seen) || Instant::now() > deadline {
            break;
        }
        seen = wal;
    }
    let expected_bytes = metrics(&addr).get("litestream_db_size").map(|b| *b as u64);
    replicating.stop().await;
    let snapshots = listing("snapshots");
    let wal = listing("wal");
    let column = |rows: &[Vec<String>], i: usize| -> u64 {
        rows.iter()
            .filter_map(|r| r.get(i).and_then(|s| s.parse::<u64>().ok()))
            .sum()
    };
    let db_bytes = expected_bytes.unwrap_or(built.bytes);
    report.add(
        format!(
            "replica size (litestream_db_size), {} pages of 4 KiB",
            db_bytes / 4096
        ),
        mib(db_bytes / 1024),
        "",
        None,
    );
    report.add(
        format!(
            "litestream: snapshot up (lz4), {} of the replica's size",
            ratio(column(&snapshots, 3), db_bytes)
        ),
        format!(
            "{:.1} s, {}",
            snapshot_took.as_secs_f64(),
            mib(column(&snapshots, 3) / 1024)
        ),
        "",
        None,
    );
    report.add(
        format!("  then {LIVE_TRANSACTIONS} transactions of {LIVE_ROWS} rows: WAL segments"),
        format!(
            "{} in {:.1} s, {}",
            wal.len(),
            live_took.as_secs_f64(),
            mib(column(&wal, 4) / 1024)
        ),
        "",
        None,
    );
    // The drill needs only the backup.
    std::fs::remove_dir_all(&source_dir).unwrap();

    let drill = drill_of(&litestream, &backup_url, &work.path().join("drills"));
    let interval = drill.interval;
    let drill = drill.drill;
    let quick = measure(&drill, db_bytes).await;
    let full = measure(
        &Drill {
            check: CheckLevel::Full,
            ..drill.clone()
        },
        db_bytes,
    )
    .await;
    for (name, m) in [("quick_check", &quick), ("integrity_check", &full)] {
        let Measured { proof, .. } = m;
        let per_gib = |d: Duration| d.as_secs_f64() / (proof.bytes as f64 / (1u64 << 30) as f64);
        report.add(
            format!("drill ({name}): restore, per GiB"),
            format!(
                "{:.1} s, {:.1} s",
                proof.restore_took.as_secs_f64(),
                per_gib(proof.restore_took)
            ),
            "",
            None,
        );
        report.add(
            format!("  {name}, per GiB"),
            format!(
                "{:.1} s, {:.1} s",
                proof.check_took.as_secs_f64(),
                per_gib(proof.check_took)
            ),
            "",
            None,
        );
        report.add(
            "  whole drill (restore, check, scratch removed)",
            format!("{:.1} s", m.took().as_secs_f64()),
            "",
            None,
        );
        report.add(
            format!(
                "  sidecar RSS in the check: peak, over {} before",
                mib(m.baseline_kib)
            ),
            format!(
                "{}, +{}",
                mib(m.check_peak_kib),
                mib(m.check_peak_kib.saturating_sub(m.baseline_kib))
            ),
            "",
            None,
        );
        if let Some(hwm) = m.hwm_kib {
            report.add(
                "  sidecar VmHWM over the whole drill, over before",
                format!("{}, +{}", mib(hwm), mib(hwm.saturating_sub(m.baseline_kib))),
                "",
                None,
            );
        }
        report.add(
            "  litestream restore: peak RSS (its VmHWM)",
            mib(m.litestream_peak_kib),
            "",
            None,
        );
        report.add(
            format!(
                "  scratch directory's peak, {} of the replica",
                ratio(m.scratch_peak, proof.bytes)
            ),
            mib(m.scratch_peak / 1024),
            "",
            None,
        );
        report.add(
            "  restored stateVersion is the last one written",
            if proof.watermark == watermark {
                "yes".to_string()
            } else {
                format!("NO: {}, wrote {watermark}", proof.watermark)
            },
            "",
            None,
        );
    }
    report.add(
        "  integrity_check / quick_check, whole drill",
        format!(
            "x{:.2}, x{:.2}",
            full.proof.check_took.as_secs_f64() / quick.proof.check_took.as_secs_f64(),
            full.took().as_secs_f64() / quick.took().as_secs_f64()
        ),
        "",
        None,
    );
    // Drills run drill_interval after the previous one ended. A backup made just after a drill started restoring
    // waits for that drill, the interval and the next drill: drill_interval + 2 drills at worst; on average half a
    // period (drill_interval + a drill) plus the drill that proves it.
    let Some(interval) = interval else {
        return;
    };
    let every = humantime::format_duration(interval);
    let half = humantime::format_duration(interval / 2);
    for (name, m) in [("quick_check", &quick), ("integrity_check", &full)] {
        let d = m.took().as_secs_f64();
        report.add(
            format!("cleanup lag of requires = \"restore\" ({name}): worst"),
            format!("{every} + {:.1} s", 2.0 * d),
            "",
            None,
        );
        report.add("  mean", format!("{half} + {:.1} s", 1.5 * d), "", None);
        report.add(
            format!("  share of the time spent drilling, every {every}"),
            format!("{:.2} %", 100.0 * d / (interval.as_secs_f64() + d)),
            "",
            None,
        );
    }
}

/// The daemon's drill and interval for a sidecar.toml with this backup and `cleanup.requires = "restore"`.
struct Configured {
    drill: Drill,
    interval: Option<Duration>,
}

fn drill_of(litestream: &Path, backup_url: &str, dir: &Path) -> Configured {
    let toml = format!(
        "[litestream]\nbackup_url = {}\n[backup]\nlitestream = {}\ndrill_dir = {}\ndrill_reserve = {DRILL_RESERVE}\n\
         [cleanup]\nrequires = \"restore\"\n[discovery]\nadvertise_address = \"127.0.0.1:4849\"\n",
        json(backup_url),
        json(&litestream.to_string_lossy()),
        json(&dir.to_string_lossy()),
    );
    let config = litestream_sidecar::config::from_toml_str(&toml, Some(HashMap::new()))
        .expect("the bench's config")
        .validate()
        .expect("the bench's config");
    Configured {
        drill: config.backup.drill(&config.litestream.backup_url),
        interval: config.backup.drill_interval,
    }
}

/// A TOML or YAML string.
fn json(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

fn ratio(part: u64, whole: u64) -> String {
    format!("{:.2}x", part as f64 / whole.max(1) as f64)
}

/// One drill and what was sampled while it ran.
struct Measured {
    proof: Proof,
    baseline_kib: u64,
    check_peak_kib: u64,
    hwm_kib: Option<u64>,
    litestream_peak_kib: u64,
    scratch_peak: u64,
}

impl Measured {
    fn took(&self) -> Duration {
        self.proof
            .finished
            .duration_since(self.proof.started)
            .unwrap_or_default()
    }
}

async fn measure(drill: &Drill, bytes: u64) -> Measured {
    // The peak resident memory is reset (Linux: "5" to clear_refs), so that VmHWM is the drill's own.
    let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let baseline_kib = status_kib("self", "VmRSS").unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let dir = drill.dir.clone();
        std::thread::spawn(move || sample(&dir, &stop))
    };
    let proved = drill
        .run(Some(bytes), Some(REPLICA_VERSION), &Default::default())
        .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let proof = proved.unwrap_or_else(|failure| panic!("the drill failed: {failure}"));
    assert_eq!(proof.replica_version, REPLICA_VERSION);
    let hwm_kib = hwm_reset.then(|| status_kib("self", "VmHWM")).flatten();
    let check_peak_kib = samples
        .own
        .iter()
        .filter(|(at, _)| *at >= proof.restore_took)
        .map(|(_, kib)| *kib)
        .max()
        .unwrap_or(0);
    Measured {
        proof,
        baseline_kib,
        check_peak_kib,
        hwm_kib,
        litestream_peak_kib: samples.litestream_peak_kib,
        scratch_peak: samples.scratch_peak,
    }
}

#[derive(Default)]
struct Samples {
    /// This process's VmRSS, by time since the drill started.
    own: Vec<(Duration, u64)>,
    litestream_peak_kib: u64,
    scratch_peak: u64,
}

fn sample(dir: &Path, stop: &AtomicBool) -> Samples {
    let started = Instant::now();
    let mut samples = Samples::default();
    // litestream restore is this process's only child while the drill runs (nice and ionice exec it).
    let mut child: Option<u32> = None;
    let mut child_gone = false;
    while !stop.load(Ordering::Relaxed) {
        if let Some(kib) = status_kib("self", "VmRSS") {
            samples.own.push((started.elapsed(), kib));
        }
        if child.is_none() && !child_gone {
            child = child_of(std::process::id());
        }
        if let Some(pid) = child {
            match status_kib(&pid.to_string(), "VmHWM") {
                Some(kib) => samples.litestream_peak_kib = samples.litestream_peak_kib.max(kib),
                None => {
                    child = None;
                    child_gone = true;
                }
            }
        }
        samples.scratch_peak = samples.scratch_peak.max(disk_usage(dir));
        std::thread::sleep(SAMPLE_EVERY);
    }
    samples
}

/// A field of `/proc/<pid>/status` in KiB.
fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
}

/// Bytes allocated on disk below `path`.
fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    own + std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| disk_usage(&e.path()))
        .sum::<u64>()
}

fn free_bytes(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(0)
}

/// `litestream replicate`, killed when dropped (a panic) unless stopped.
struct Replicating(Child);

impl Replicating {
    fn start(litestream: &Path, config: &Path, log: &Path) -> Replicating {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(litestream)
            .arg("replicate")
            .arg("-config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start litestream replicate");
        Replicating(child)
    }

    fn alive(&mut self, log: &Path) {
        if let Some(status) = self.0.try_wait().unwrap() {
            panic!(
                "litestream replicate exited with {status}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }

    /// SIGTERM: litestream 0.3 syncs the database and its replica once more, then exits.
    async fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "litestream did not stop");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Replicating {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// litestream's metrics page by name (one database, one replica), empty while it does not answer.
fn metrics(addr: &str) -> HashMap<String, f64> {
    let mut page = String::new();
    if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: litestream\r\n\r\n");
        let _ = stream.read_to_string(&mut page);
    }
    page.lines()
        .filter(|l| l.starts_with("litestream_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The replica: its tables with indexes, filled in big transactions with no journal and no syncs, then switched
/// to WAL as Zero's replicas are.
fn build(path: &Path, target: u64) -> rusqlite::Result<Built> {
    let started = Instant::now();
    let mut db = Connection::open(path)?;
    db.execute_batch(
        r#"
        PRAGMA page_size = 4096;
        PRAGMA journal_mode = OFF;
        PRAGMA synchronous = OFF;
        PRAGMA cache_size = -262144;
        CREATE TABLE "_zero.replicationConfig" (
          "replicaVersion" TEXT NOT NULL, "publications" TEXT NOT NULL,
          "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK ("lock" = 1));
        CREATE TABLE "_zero.replicationState" (
          "stateVersion" TEXT NOT NULL, "lock" INTEGER PRIMARY KEY DEFAULT 1 CHECK ("lock" = 1));
        CREATE TABLE "_zero.changeLog" (
          "stateVersion" TEXT NOT NULL, "table" TEXT NOT NULL, "rowKey" TEXT NOT NULL, "op" TEXT NOT NULL,
          PRIMARY KEY ("stateVersion", "table", "rowKey"), UNIQUE ("table", "rowKey"));
        CREATE TABLE "issue" (
          "id" TEXT NOT NULL PRIMARY KEY, "title" TEXT, "description" TEXT, "open" INTEGER, "modified" REAL,
          "created" REAL, "creatorID" TEXT, "assigneeID" TEXT, "_0_version" TEXT NOT NULL);
        CREATE INDEX "issue_modified" ON "issue" ("modified");
        CREATE INDEX "issue_creatorID" ON "issue" ("creatorID", "modified");
        CREATE TABLE "comment" (
          "id" TEXT NOT NULL PRIMARY KEY, "issueID" TEXT NOT NULL, "body" TEXT, "created" REAL, "creatorID" TEXT,
          "_0_version" TEXT NOT NULL);
        CREATE INDEX "comment_issueID" ON "comment" ("issueID", "created");
        "#,
    )?;
    db.execute(
        r#"INSERT INTO "_zero.replicationConfig" ("replicaVersion", "publications") VALUES (?1, ?2)"#,
        (REPLICA_VERSION, r#"["_zero_public_0"]"#),
    )?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut text = String::new();
    // A third of the bytes in issues, half in comments, the rest in the change log.
    let issues = fill(&mut db, target * 35 / 100, |tx, n| {
        text.clear();
        let description_words = 30 + rng.below(60);
        words(&mut rng, description_words, &mut text);
        let title_words = 3 + rng.below(8);
        let mut title = String::new();
        words(&mut rng, title_words, &mut title);
        let created = 1.6e12 + (n * 60_000) as f64;
        tx.prepare_cached(r#"INSERT INTO "issue" VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"#)?
            .execute((
                id(n),
                title,
                &text,
                rng.below(3) == 0,
                created + rng.below(1 << 30) as f64,
                created,
                id(USERS + rng.below(5_000)),
                (rng.below(2) == 0).then(|| id(USERS + rng.below(5_000))),
                version(n / 10),
            ))?;
        Ok(())
    })?;
    let comments = fill(&mut db, target * 85 / 100, |tx, n| {
        text.clear();
        let body_words = 10 + rng.below(70);
        words(&mut rng, body_words, &mut text);
        tx.prepare_cached(r#"INSERT INTO "comment" VALUES (?1, ?2, ?3, ?4, ?5, ?6)"#)?
            .execute((
                id(COMMENTS + n),
                id(rng.below(issues)),
                &text,
                1.6e12 + (n * 20_000) as f64,
                id(USERS + rng.below(5_000)),
                version((issues + n) / 10),
            ))?;
        Ok(())
    })?;
    let mut last = 0;
    let changes = fill(&mut db, target, |tx, n| {
        let (table, key) = if n % 3 == 0 {
            ("issue", id(rng.below(issues)))
        } else {
            ("comment", id(COMMENTS + rng.below(comments)))
        };
        last = (issues + comments + n) / 10;
        tx.prepare_cached(r#"INSERT OR REPLACE INTO "_zero.changeLog" VALUES (?1, ?2, ?3, ?4)"#)?
            .execute((version(last), table, format!(r#"{{"id":"{key}"}}"#), "s"))?;
        Ok(())
    })?;
    db.execute(
        r#"INSERT INTO "_zero.replicationState" ("stateVersion") VALUES (?1)"#,
        [version(last)],
    )?;
    let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    assert_eq!(mode, "wal");
    let pages: u64 = db.query_row("PRAGMA page_count", [], |row| row.get(0))?;
    drop(db);
    Ok(Built {
        bytes: pages * 4096,
        issues,
        comments,
        changes,
        version: last,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Ids of users and of comments, apart from issues'.
const USERS: u64 = 1 << 40;
const COMMENTS: u64 = 1 << 41;

/// Inserts rows `0..` until the database reaches `until` bytes; returns how many.
fn fill(
    db: &mut Connection,
    until: u64,
    mut insert: impl FnMut(&rusqlite::Transaction, u64) -> rusqlite::Result<()>,
) -> rusqlite::Result<u64> {
    let mut n = 0;
    loop {
        let tx = db.transaction()?;
        for _ in 0..COMMIT_ROWS / SIZE_CHECK_ROWS {
            for _ in 0..SIZE_CHECK_ROWS {
                insert(&tx, n)?;
                n += 1;
            }
            let pages: u64 = tx.query_row("PRAGMA page_count", [], |row| row.get(0))?;
            if pages * 4096 >= until {
                tx.commit()?;
                return Ok(n);
            }
        }
        tx.commit()?;
    }
}

/// Transactions as Zero's replicator writes them, on the replica litestream replicates: issues updated, their
/// change-log rows, the new `stateVersion`. Returns the last `stateVersion` and how long they took.
fn write_on_top(path: &Path, built: &Built) -> (String, Duration) {
    let started = Instant::now();
    let mut db = Connection::open(path).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
    let mut rng = Rng(42);
    let mut state = String::new();
    for t in 0..LIVE_TRANSACTIONS {
        state = version(built.version + 1 + t);
        let tx = db.transaction().unwrap();
        for _ in 0..LIVE_ROWS {
            let key = id(rng.below(built.issues));
            tx.execute(
                r#"UPDATE "issue" SET "modified" = "modified" + 1, "_0_version" = ?1 WHERE "id" = ?2"#,
                (&state, &key),
            )
            .unwrap();
            tx.execute(
                r#"INSERT OR REPLACE INTO "_zero.changeLog" VALUES (?1, 'issue', ?2, 's')"#,
                (&state, format!(r#"{{"id":"{key}"}}"#)),
            )
            .unwrap();
        }
        tx.execute(
            r#"UPDATE "_zero.replicationState" SET "stateVersion" = ?1"#,
            [&state],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    (state, started.elapsed())
}

/// A version that sorts as it counts, as Zero's do.
fn version(n: u64) -> String {
    format!("8{n:010x}")
}

/// A nanoid-shaped id (21 characters) of `n`.
fn id(n: u64) -> String {
    const ALPHABET: &[u8; 64] = b"_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let (mut a, mut b) = (splitmix(n), splitmix(n ^ 0x5555_5555_5555_5555));
    (0..21)
        .map(|i| {
            let word = if i < 10 { &mut a } else { &mut b };
            let c = ALPHABET[(*word & 63) as usize] as char;
            *word >>= 6;
            c
        })
        .collect()
}

fn splitmix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Text of `count` words, about as compressible as prose.
fn words(rng: &mut Rng, count: u64, out: &mut String) {
    const WORDS: [&str; 64] = [
        "the",
        "issue",
        "sync",
        "replica",
        "when",
        "client",
        "query",
        "should",
        "after",
        "before",
        "fails",
        "with",
        "error",
        "page",
        "load",
        "view",
        "update",
        "cache",
        "server",
        "change",
        "stream",
        "row",
        "table",
        "index",
        "slow",
        "fast",
        "user",
        "because",
        "we",
        "it",
        "is",
        "not",
        "this",
        "that",
        "a",
        "an",
        "to",
        "from",
        "on",
        "in",
        "of",
        "and",
        "or",
        "but",
        "mobile",
        "desktop",
        "release",
        "version",
        "reproduce",
        "steps",
        "expected",
        "actual",
        "login",
        "button",
        "screen",
        "network",
        "timeout",
        "retry",
        "offline",
        "mutation",
        "permission",
        "filter",
        "sort",
        "label",
    ];
    for i in 0..count {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.below(64) as usize]);
    }
}
