//! The real litestream replicating a Zero-shaped SQLite replica, for the restore-drill tests: upstream v0.3.13
//! (`LITESTREAM_BIN`), the layout Zero's fork is built on, and v0.5.17 (`LITESTREAM_05_BIN`) for the LTX layout.
//! Both are installed by scripts/install-litestream.sh (`make test` does it and exports the variables).
//!
//! - [`Replica`]: a replica as Zero's replicator keeps it, in WAL mode: `_zero.replicationConfig` with its
//!   `replicaVersion`, `_zero.replicationState` with its `stateVersion`, and one data table; each
//!   [`Replica::apply`] commits one upstream transaction and moves `stateVersion` to its watermark.
//! - [`Litestream`]: `litestream replicate` of it, killed (SIGKILL) and reaped when dropped; [`Litestream::restored`]
//!   restores the destination as it is now, the ground truth of what was uploaded.
//! - [`Files`]: a file:// destination's objects, to delete, move aside, truncate or corrupt.
//! - [`Tmpfs`]: a small tmpfs, unmounted when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::process::Reaped;

/// litestream v0.3.13.
pub fn v03() -> PathBuf {
    find(
        "LITESTREAM_BIN",
        "tests/litestream/node_modules/@flydotio/litestream-linux-x64/litestream",
        "scripts/install-litestream.sh",
    )
}

/// litestream v0.5.17 (LTX files).
pub fn v05() -> PathBuf {
    find(
        "LITESTREAM_05_BIN",
        "target/litestream-0.5/litestream",
        "scripts/install-litestream.sh 0.5",
    )
}

fn find(var: &str, fallback: &str, install: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{var}={} is not a file: run `{install}` (it prints the path)",
            path.display()
        );
        return path;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(fallback);
    assert!(
        path.is_file(),
        "the real litestream is missing: {var} is not set and {} does not exist; run `{install}` \
         (make test runs it and exports {var})",
        path.display()
    );
    path
}

/// A Zero replica: what `litestream replicate` backs up and a drill restores.
pub struct Replica {
    pub path: PathBuf,
    db: rusqlite::Connection,
}

impl Replica {
    /// A replica as Zero's initial sync leaves it: at `replica_version`, in WAL mode.
    pub fn create(path: &Path, replica_version: &str) -> Replica {
        let db = rusqlite::Connection::open(path).expect("create the replica");
        let mode: String = db
            .query_row("PRAGMA journal_mode = wal", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        db.execute_batch(
            r#"
            CREATE TABLE "_zero.replicationConfig" (
              "replicaVersion" TEXT NOT NULL,
              "publications"   TEXT NOT NULL,
              "lock"           INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            CREATE TABLE "_zero.replicationState" (
              "stateVersion" TEXT NOT NULL,
              "lock"         INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock=1)
            );
            CREATE TABLE "issue" (
              "id"          TEXT PRIMARY KEY,
              "title"       TEXT,
              "_0_version"  TEXT NOT NULL
            );
            CREATE TABLE "filler" ("id" INTEGER PRIMARY KEY, "bytes" BLOB);
            "#,
        )
        .unwrap();
        db.execute(
            r#"INSERT INTO "_zero.replicationConfig" ("replicaVersion", "publications") VALUES (?1, ?2)"#,
            (replica_version, r#"["_zero_public_0","zero_data"]"#),
        )
        .unwrap();
        db.execute(
            r#"INSERT INTO "_zero.replicationState" ("stateVersion") VALUES (?1)"#,
            [replica_version],
        )
        .unwrap();
        Replica {
            path: path.to_path_buf(),
            db,
        }
    }

    /// Another connection to the replica at `path` (for a writer on a thread of its own).
    pub fn open(path: &Path) -> Replica {
        Replica {
            path: path.to_path_buf(),
            db: rusqlite::Connection::open(path).expect("open the replica"),
        }
    }

    /// Commits the upstream transaction at `watermark` as Zero's replicator does: its `rows` inserts (the ones
    /// [`super::pg::TestSchema::insert_transaction`] logs) and `stateVersion`, in one transaction.
    pub fn apply(&self, watermark: &str, rows: i64) {
        let tx = self.db.unchecked_transaction().unwrap();
        for pos in 1..=rows {
            tx.execute(
                r#"INSERT INTO "issue" ("id", "title", "_0_version") VALUES (?1, ?2, ?3)"#,
                (
                    format!("iss-{watermark}-{pos}"),
                    format!("Row {pos} at {watermark}"),
                    watermark,
                ),
            )
            .unwrap();
        }
        tx.execute(
            r#"UPDATE "_zero.replicationState" SET "stateVersion" = ?1"#,
            [watermark],
        )
        .unwrap();
        tx.commit().unwrap();
    }

    /// Grows the database by about `bytes` of zeroes: nothing in the compressed backup, all of it on restore.
    pub fn fill(&self, bytes: usize) {
        let tx = self.db.unchecked_transaction().unwrap();
        let chunk = 256 << 10;
        for _ in 0..bytes.div_ceil(chunk) {
            tx.execute(
                r#"INSERT INTO "filler" ("bytes") VALUES (zeroblob(?1))"#,
                [chunk as i64],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }

    /// Moves everything in the WAL into the database file (before litestream runs: a small first WAL).
    pub fn checkpoint(&self) {
        self.db
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }

    pub fn state_version(&self) -> String {
        state_version(&self.path).expect("the replica's stateVersion")
    }

    /// The database file's size now.
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.path).unwrap().len()
    }
}

/// `stateVersion` of the replica at `path`.
pub fn state_version(path: &Path) -> Result<String, String> {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| e.to_string())?;
    db.query_row(
        r#"SELECT "stateVersion" FROM "_zero.replicationState""#,
        [],
        |row| row.get(0),
    )
    .map_err(|e| e.to_string())
}

/// What a [`Litestream`] is started with besides the database and the URL.
#[derive(Default, Clone)]
pub struct Options {
    /// YAML lines under the database (`min-checkpoint-page-count: 2`, say).
    pub db: Vec<String>,
    /// YAML lines under the replica (`endpoint: ...`, say); `sync-interval: 1s` is always there.
    pub replica: Vec<String>,
    /// Serve litestream's own metrics page on a free loopback port.
    pub metrics: bool,
    /// Environment variables (an S3 destination's credentials).
    pub env: Vec<(String, String)>,
}

/// `litestream replicate` of one replica to one destination, SIGKILLed and reaped when dropped.
pub struct Litestream {
    pub bin: PathBuf,
    /// The config file, next to the database; a restore reads it too.
    pub config: PathBuf,
    pub db: PathBuf,
    /// Where its metrics page is, with [`Options::metrics`].
    pub addr: Option<std::net::SocketAddr>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Reaped>,
}

impl Litestream {
    /// `litestream replicate` of `db` to `url` every second, written down; [`Litestream::start`] starts it.
    pub fn configure(bin: &Path, db: &Path, url: &str, options: Options) -> Litestream {
        let dir = db.parent().expect("the database is in a directory");
        let quote = |text: &str| serde_json::to_string(text).unwrap();
        let addr = options.metrics.then(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        });
        let mut yaml = String::new();
        if let Some(addr) = addr {
            yaml += &format!("addr: \"{addr}\"\n");
        }
        yaml += &format!("dbs:\n  - path: {}\n", quote(&db.to_string_lossy()));
        for line in &options.db {
            yaml += &format!("    {line}\n");
        }
        yaml += &format!(
            "    replicas:\n      - url: {}\n        sync-interval: 1s\n",
            quote(url)
        );
        for line in &options.replica {
            yaml += &format!("        {line}\n");
        }
        let config = dir.join("litestream.yml");
        std::fs::write(&config, yaml).unwrap();
        Litestream {
            bin: bin.to_path_buf(),
            config,
            db: db.to_path_buf(),
            addr,
            env: options.env,
            log: dir.join("litestream.log"),
            child: None,
        }
    }

    /// Starts it (again): a restart after [`Litestream::kill`].
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "litestream is running already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("replicate")
            .arg("-config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
        self.child = Some(Reaped(child));
    }

    /// SIGKILL: whatever it was uploading stops where it is.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    pub fn metrics_url(&self) -> String {
        format!(
            "http://{}/metrics",
            self.addr.expect("started with Options::metrics")
        )
    }

    /// Its output so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Restores the destination as it is now (`litestream restore` with this config) and reads the restored
    /// replica's `stateVersion`: what was uploaded, or why nothing restores.
    pub async fn restored(&self) -> Result<String, String> {
        let scratch = tempfile::tempdir().unwrap();
        let output = scratch.path().join("restored.db");
        let out = tokio::process::Command::new(&self.bin)
            .arg("restore")
            .arg("-config")
            .arg(&self.config)
            .arg("-o")
            .arg(&output)
            .arg(&self.db)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        tokio::task::spawn_blocking(move || state_version(&output))
            .await
            .unwrap()
    }

    /// Waits until a restore of the destination gets the replica at `watermark`: it has been uploaded.
    pub async fn uploaded(&self, watermark: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let restored = self.restored().await;
            if restored.as_deref() == Ok(watermark) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{watermark} not uploaded within 20s; a restore gets {restored:?}; litestream's log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Litestream {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One object of a file:// destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Below the destination's root, with `/`.
    pub name: String,
    pub path: PathBuf,
    pub modified: SystemTime,
}

/// One WAL segment of litestream 0.3's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub generation: String,
    pub index: u64,
    pub offset: u64,
    pub path: PathBuf,
    pub modified: SystemTime,
}

/// A file:// destination.
pub struct Files {
    pub root: PathBuf,
}

impl Files {
    pub fn new(root: &Path) -> Files {
        Files {
            root: root.to_path_buf(),
        }
    }

    /// The URL litestream writes to and the sidecar lists and restores (a directory URL).
    pub fn url(&self) -> String {
        url::Url::from_directory_path(&self.root)
            .unwrap()
            .to_string()
    }

    /// Every file below the root, by name.
    pub fn objects(&self) -> Vec<Object> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<Object>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                let meta = entry.metadata().unwrap();
                if meta.is_dir() {
                    walk(root, &path, out);
                } else {
                    out.push(Object {
                        name: path
                            .strip_prefix(root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                        path,
                        modified: meta.modified().unwrap(),
                    });
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &self.root, &mut out);
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The generations that exist, the one with the newest object last (with one writer, the one a restore picks;
    /// with two, see `litestream::layout`).
    pub fn generations(&self) -> Vec<String> {
        let mut newest: std::collections::BTreeMap<String, SystemTime> = Default::default();
        for object in self.objects() {
            if let Some(rest) = object.name.strip_prefix("generations/") {
                let id = rest.split('/').next().unwrap().to_string();
                let at = newest.entry(id).or_insert(object.modified);
                *at = (*at).max(object.modified);
            }
        }
        let mut list: Vec<_> = newest.into_iter().collect();
        list.sort_by_key(|(id, at)| (*at, id.clone()));
        list.into_iter().map(|(id, _)| id).collect()
    }

    /// The newest generation's id.
    pub fn generation(&self) -> String {
        self.generations()
            .pop()
            .unwrap_or_else(|| panic!("no generation in {}", self.root.display()))
    }

    /// The newest generation's WAL segments, by index and offset.
    pub fn segments(&self) -> Vec<Segment> {
        let generation = self.generation();
        let prefix = format!("generations/{generation}/wal/");
        let mut out: Vec<Segment> = self
            .objects()
            .into_iter()
            .filter_map(|object| {
                let name = object
                    .name
                    .strip_prefix(&prefix)?
                    .strip_suffix(".wal.lz4")?;
                let (index, offset) = name.split_once('_')?;
                Some(Segment {
                    generation: generation.clone(),
                    index: u64::from_str_radix(index, 16).ok()?,
                    offset: u64::from_str_radix(offset, 16).ok()?,
                    path: object.path,
                    modified: object.modified,
                })
            })
            .collect();
        out.sort_by_key(|s| (s.index, s.offset));
        out
    }

    /// The newest generation's snapshots.
    pub fn snapshots(&self) -> Vec<PathBuf> {
        let prefix = format!("generations/{}/snapshots/", self.generation());
        self.objects()
            .into_iter()
            .filter(|o| o.name.starts_with(&prefix) && o.name.ends_with(".snapshot.lz4"))
            .map(|o| o.path)
            .collect()
    }

    /// When the newest object below the root was written.
    pub fn newest(&self) -> Option<SystemTime> {
        self.objects().into_iter().map(|o| o.modified).max()
    }
}

/// A backup time for a litestream_replica_progress sample: `at` to the millisecond below, never after it.
pub fn gauge_time(at: SystemTime) -> f64 {
    let millis = at.duration_since(UNIX_EPOCH).unwrap().as_millis();
    millis as f64 / 1000.0
}

/// Moves `path` into `aside` (same filesystem: its last-modified time is kept), returning where it went.
pub fn move_aside(path: &Path, aside: &Path) -> PathBuf {
    std::fs::create_dir_all(aside).unwrap();
    let to = aside.join(path.file_name().unwrap());
    std::fs::rename(path, &to).unwrap();
    to
}

/// A tmpfs of `size` (mount's syntax: `2m`) at a directory, unmounted when dropped, also when the test fails.
/// Mounting needs root, as the tests run in CI.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs at {} (these tests run as root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    /// Bytes free on it.
    pub fn free(&self) -> u64 {
        let stat = rustix::fs::statvfs(&self.dir).unwrap();
        stat.f_bavail * stat.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Busy (a drill's litestream still has a file open): detach it now, gone once released.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}
