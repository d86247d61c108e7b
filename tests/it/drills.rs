//! Restore drills and the destination's layout against the real litestream (upstream v0.3.13, and v0.5.17 for
//! the LTX layout) replicating a Zero-shaped replica: drills prove what litestream uploaded and no more, and every
//! fault of the backup (an object deleted, truncated or corrupted, litestream killed mid-upload, the destination
//! unreachable, a disk too small for a drill, an LTX destination) is reported, holds what it must, and leaves no
//! scratch directory behind.
//!
//! No litestream_replica_progress gauge comes from upstream litestream (only Zero's fork has it): where a case
//! needs one, a [`MetricsServer`] serves it, set to a watermark only after a restore of the destination has shown
//! it uploaded, at the time of the object that carries it.
//!
//! The cases that need PostgreSQL are in [`pg`].

mod pg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::litestream::{self, Files, Litestream, Options, Replica, Tmpfs};
use crate::support::*;

/// TestSchema's replica version, `lexi(1000)`: the replica's too.
const REPLICA_VERSION: &str = "1rs";

/// The watermark of the `n`th upstream transaction after the replica version.
fn wm(n: u64) -> String {
    lexi(1000 + n)
}

/// A replica, the real litestream replicating it (to a file:// destination unless told otherwise), and the
/// directory drills use, all in one temporary directory.
/// Dropped in this order: litestream is killed before its directory goes.
struct Rig {
    litestream: Litestream,
    replica: Replica,
    /// The file:// destination (empty when litestream writes elsewhere).
    dest: Files,
    /// Where litestream writes: `dest`'s URL unless told otherwise.
    url: String,
    dir: tempfile::TempDir,
}

impl Rig {
    /// A replica at [`REPLICA_VERSION`] (grown by `fill` bytes first), replicated by litestream v0.3.13.
    fn start(options: Options, fill: usize) -> Rig {
        let mut rig = Rig::new(&litestream::v03(), None, options, fill);
        rig.litestream.start();
        rig
    }

    /// The replica and litestream's config, with `bin` writing to `url` (`None`: the file:// destination);
    /// litestream not started yet.
    fn new(bin: &Path, url: Option<&str>, options: Options, fill: usize) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let replica = Replica::create(&dir.path().join("replica.db"), REPLICA_VERSION);
        if fill > 0 {
            replica.fill(fill);
        }
        replica.checkpoint();
        let dest = Files::new(&dir.path().join("backup"));
        let url = url.map_or_else(|| dest.url(), str::to_string);
        let litestream = Litestream::configure(bin, &replica.path, &url, options);
        std::fs::create_dir_all(dir.path().join("drills")).unwrap();
        Rig {
            litestream,
            replica,
            dest,
            url,
            dir,
        }
    }

    fn drill_dir(&self) -> PathBuf {
        self.dir.path().join("drills")
    }

    /// Where objects taken out of the destination are kept (to put them back).
    fn aside(&self) -> PathBuf {
        self.dir.path().join("aside")
    }

    /// Applies the transaction `wm(n)` (`rows` inserts) and waits until a restore of the destination gets it.
    async fn apply(&self, n: u64, rows: i64) -> String {
        let watermark = wm(n);
        self.replica.apply(&watermark, rows);
        self.litestream.uploaded(&watermark).await;
        watermark
    }
}

/// TOML sections merged key by key, later parts over earlier ones (a section may appear in several parts).
fn merge(parts: &[&str]) -> String {
    let mut merged = toml::Table::new();
    for part in parts {
        let table: toml::Table = part.parse().expect("TOML");
        for (section, values) in table {
            let target = merged
                .entry(section)
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .unwrap();
            for (key, value) in values.as_table().expect("sections only") {
                target.insert(key.clone(), value.clone());
            }
        }
    }
    toml::to_string(&merged).unwrap()
}

/// A sidecar config for `rig`: destination verified every second, a drill every second with the real litestream
/// into the rig's drill directory, `requires`; `pg` (TestSchema::config, or "") and `extra` merged over it.
fn drill_config(
    rig: &Rig,
    pg: &str,
    metrics_url: &str,
    requires: &str,
    extra: &str,
) -> litestream_sidecar::Config {
    let base = format!(
        "[litestream]\nbackup_url = \"{}\"\nmetrics_url = \"{metrics_url}\"\ncheck_interval = \"1s\"\n\
         [backup]\nverify = true\nlist_timeout = \"2s\"\nlitestream = \"{}\"\ndrill_interval = \"1s\"\n\
         drill_timeout = \"60s\"\ndrill_dir = \"{}\"\ndrill_reserve = 0\n\
         [cleanup]\nrequires = \"{requires}\"\nreconnect_grace = \"2s\"\n\
         [server]\nping_interval = \"100ms\"\n[discovery]\ninterval = \"100ms\"\n",
        rig.url,
        rig.litestream.bin.display(),
        rig.drill_dir().display(),
    );
    config(&merge(&[&base, pg, extra]))
}

/// `GET /status`, parsed.
async fn report(sidecar: &Sidecar) -> Value {
    let (code, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Waits (up to `guard`) until `/status` satisfies `check`; returns that report.
async fn reported(
    sidecar: &Sidecar,
    what: &str,
    guard: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + guard;
    loop {
        let json = report(sidecar).await;
        if check(&json) {
            return json;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; /status: {json:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the latest drill proved `watermark`.
async fn proves(sidecar: &Sidecar, watermark: &str) -> Value {
    reported(
        sidecar,
        &format!("a drill proving {watermark}"),
        Duration::from_secs(90),
        |json| json["drills"]["last"]["proven_watermark"] == watermark,
    )
    .await
}

/// Waits until the latest drill failed with `kind`; returns its `/status` entry.
async fn fails(sidecar: &Sidecar, kind: &str) -> Value {
    let json = reported(
        sidecar,
        &format!("a drill failing with {kind}"),
        Duration::from_secs(90),
        |json| json["drills"]["last"]["error_kind"] == kind,
    )
    .await;
    json["drills"]["last"].clone()
}

/// Drills that have ended so far.
fn runs(sidecar: &Sidecar) -> u64 {
    sidecar.status.get().drills.runs
}

/// Waits until `n` more drills have ended.
async fn more_drills(sidecar: &Sidecar, n: u64) {
    let target = runs(sidecar) + n;
    within("drills", Duration::from_secs(90), || async {
        runs(sidecar) >= target
    })
    .await;
}

/// The drill directory holds nothing while no drill runs: every scratch directory was removed. Read between two
/// looks at the status that both see no drill running and the same number of drills ended.
async fn left_nothing(sidecar: &Sidecar, dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let before = sidecar.status.get().drills;
        let entries = list(dir);
        let after = sidecar.status.get().drills;
        if before.running_since.is_none()
            && after.running_since.is_none()
            && before.runs == after.runs
        {
            assert_eq!(entries, Vec::<String>::new(), "left in {}", dir.display());
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a drill was always running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The names in `dir`.
fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn drills_prove_what_litestream_uploaded_and_no_more() {
    let mut rig = Rig::start(Options::default(), 0);
    let w1 = rig.apply(1, 2).await;
    // No change DB: the drills need none (the restored replica's version is then not compared).
    let sidecar = start(drill_config(&rig, "", NO_LITESTREAM, "listing", "")).await;

    let json = proves(&sidecar, &w1).await;
    let last = &json["drills"]["last"];
    assert_eq!(last["ok"], true, "{json:#}");
    assert_eq!(last["replica_version"], REPLICA_VERSION);
    assert_eq!(last["error"], Value::Null);
    assert!(last["bytes"].as_u64().unwrap() > 0, "{json:#}");
    assert_eq!(json["drills"]["last_proof"], *last);
    assert_eq!(json["drills"]["interval_seconds"], 1.0);
    assert_eq!(json["destination"]["layout"], "restorable");

    // More uploaded: the next drills prove it, exactly the replica's stateVersion at the upload.
    rig.apply(2, 1).await;
    let w3 = rig.apply(3, 3).await;
    proves(&sidecar, &w3).await;
    assert_eq!(rig.replica.state_version(), w3);

    // litestream stops; the replica goes on to wm(4), which is never uploaded: drills keep proving wm(3).
    rig.litestream.kill();
    rig.replica.apply(&wm(4), 1);
    more_drills(&sidecar, 3).await;
    let json = report(&sidecar).await;
    assert_eq!(json["drills"]["last"]["ok"], true, "{json:#}");
    assert_eq!(json["drills"]["last"]["proven_watermark"], w3.as_str());
    assert_eq!(json["drills"]["failures"], 0);
    assert_eq!(rig.replica.state_version(), wm(4));

    left_nothing(&sidecar, &rig.drill_dir()).await;
    sidecar.stop().await;
    assert_eq!(list(&rig.drill_dir()), Vec::<String>::new());
}

/// The database the disk cases restore: twice the tmpfs.
const LARGE: usize = 4 << 20;

#[tokio::test]
async fn a_disk_too_small_for_the_database_fails_the_drill_before_or_while_it_restores() {
    // litestream's own page says how large the database is.
    let rig = Rig::start(
        Options {
            metrics: true,
            ..Options::default()
        },
        LARGE,
    );
    let w1 = rig.apply(1, 1).await;
    assert!(rig.replica.bytes() >= LARGE as u64);
    let small = Tmpfs::mount(&rig.dir.path().join("small"), "2m");
    let size = small.free();
    assert!(size < LARGE as u64);
    let extra = format!(
        "[backup]\ndrill_dir = \"{}\"\ndrill_reserve = 65536\n",
        small.dir.display()
    );

    // Before it starts: the page's litestream_db_size plus the reserve does not fit, nothing is written.
    let sidecar = start(drill_config(
        &rig,
        "",
        &rig.litestream.metrics_url(),
        "restore",
        &extra,
    ))
    .await;
    let last = fails(&sidecar, "disk").await;
    let error = last["error"].as_str().unwrap();
    assert!(error.contains("not enough disk"), "{error}");
    assert!(error.contains(&small.dir.display().to_string()), "{error}");
    // Under "restore" nothing will be proven until there is room: cleanup says so, with how much and where.
    let json = report(&sidecar).await;
    let problem = json["cleanup"]["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains(&format!(
            "cleanup held: restore drills cannot run: not enough disk in {}",
            small.dir.display()
        )) && problem.contains("the drill needs"),
        "{json:#}"
    );
    let status = sidecar.status.get();
    assert!(
        status.db_bytes.unwrap() >= LARGE as u64,
        "{:?}",
        status.db_bytes
    );
    assert_eq!(status.drills.last_proof, None);
    left_nothing(&sidecar, &small.dir).await;
    assert_eq!(small.free(), size, "nothing was written");
    sidecar.stop().await;

    // While it restores: with no page to say the size, litestream starts and runs out of space.
    let sidecar = start(drill_config(&rig, "", NO_LITESTREAM, "restore", &extra)).await;
    let last = fails(&sidecar, "disk").await;
    assert!(
        last["error"].as_str().unwrap().contains("not enough disk"),
        "{last:#}"
    );
    assert_eq!(sidecar.status.get().db_bytes, None);
    left_nothing(&sidecar, &small.dir).await;
    assert_eq!(small.free(), size, "the partial restore was removed");
    sidecar.stop().await;

    // The same backup restores where there is room.
    assert_eq!(rig.litestream.restored().await.as_deref(), Ok(w1.as_str()));
    assert_eq!(list(&small.dir), Vec::<String>::new());
    drop(small);
}

/// `litestream-sidecar drill` with `config` (the daemon's, change DB unreachable): its exit code and output.
async fn drill_command(config: &std::path::Path) -> (Option<i32>, String) {
    let config = config.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(crate::support::process::BIN)
            .arg("--config")
            .arg(&config)
            .arg("drill")
            .env("LITESTREAM_SIDECAR__CLEANUP__STATE_FILE", "none")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stdout).unwrap(),
        )
    })
    .await
    .unwrap()
}

/// `litestream-sidecar drill`: one drill in its own process, with the daemon's config. Exit 0 and the proven
/// watermark when the backup restores; exit 1 and the reason when its snapshot is gone; nothing left behind. The
/// change DB is not reachable here, so versions are not compared (and the drill does not wait for it).
#[tokio::test]
async fn the_drill_command_proves_the_backup_or_exits_1() {
    let rig = Rig::start(Options::default(), 0);
    let watermark = rig.apply(2, 3).await;
    let config = rig.dir.path().join("sidecar.toml");
    std::fs::write(
        &config,
        format!(
            "[litestream]\nbackup_url = \"{}\"\n[discovery]\nmode = \"off\"\n\
             [change_db]\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n\
             [backup]\nlitestream = \"{}\"\ndrill_dir = \"{}\"\ndrill_reserve = 0\n",
            rig.url,
            rig.litestream.bin.display(),
            rig.drill_dir().display(),
        ),
    )
    .unwrap();
    let (code, out) = drill_command(&config).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with(&format!(
            "drill passed: the backup restores to watermark {watermark} from generation {} (replica version \
             {REPLICA_VERSION}, compared with nothing: the change DB did not answer; claimed: no claim: \
             litestream's page cannot be read",
            rig.dest.generation()
        )),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(rig.drill_dir()).unwrap().count(), 0);

    for snapshot in rig.dest.snapshots() {
        std::fs::remove_file(snapshot).unwrap();
    }
    let (code, out) = drill_command(&config).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("drill FAILED (restore): litestream restore exited with exit status: 1"),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(rig.drill_dir()).unwrap().count(), 0);
}

/// `backup.drill_timeout = "auto"` (the default) gives a restore the time a restore of the database's size takes,
/// as `cleanup.restore_limit` does: a restore slower than a fixed timeout is stopped under it, and proves the backup
/// under "auto". (A stand-in litestream that waits before restoring plays the large replica.)
#[tokio::test]
async fn a_slow_restore_times_out_under_a_fixed_timeout_and_proves_the_backup_under_auto() {
    use litestream_sidecar::cleanup::config::RestoreLimit;
    use litestream_sidecar::litestream::drill::{CheckLevel, Claims, Drill, Failure};
    let rig = Rig::start(Options::default(), 0);
    let watermark = rig.apply(1, 1).await;
    let slow = rig.dir.path().join("slow-litestream");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\n[ \"$1\" = restore ] && sleep 3\nexec {} \"$@\"\n",
            rig.litestream.bin.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let drill = |timeout| Drill {
        litestream: slow.clone(),
        backup_url: rig.url.clone(),
        s3: Default::default(),
        dir: rig.drill_dir(),
        timeout,
        reserve: 0,
        check: CheckLevel::Quick,
        restore_with: Default::default(),
        env: Vec::new(),
    };
    let bytes = Some(rig.replica.bytes());
    let fixed = drill(RestoreLimit::Fixed(Duration::from_secs(2)))
        .run(bytes, None, &Claims::default())
        .await;
    assert_eq!(fixed, Err(Failure::Timeout(Duration::from_secs(2))));
    let auto = drill(RestoreLimit::Auto)
        .run(bytes, None, &Claims::default())
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(auto.watermark, watermark);
    assert_eq!(list(&rig.drill_dir()), Vec::<String>::new());
    // What "auto" gives a 150 GiB replica: three hours, as its restore takes about that long.
    assert_eq!(
        RestoreLimit::Auto.for_size(Some(150 << 30)),
        Duration::from_secs(3 * 3600)
    );
}

/// A drill runs only the litestream release view-syncers restore with (`backup.restore_with`): the 0.3 binary under
/// "0.5" is refused before anything is restored, and proves the backup under "0.3".
#[tokio::test]
async fn a_drill_refuses_a_litestream_of_another_release_than_restore_with() {
    use litestream_sidecar::cleanup::config::RestoreLimit;
    use litestream_sidecar::litestream::drill::{CheckLevel, Claims, Drill, Failure};
    use litestream_sidecar::litestream::layout::Restorer;
    let rig = Rig::start(Options::default(), 0);
    let watermark = rig.apply(1, 1).await;
    let drill = |restore_with| Drill {
        litestream: rig.litestream.bin.clone(),
        backup_url: rig.url.clone(),
        s3: Default::default(),
        dir: rig.drill_dir(),
        timeout: RestoreLimit::Auto,
        reserve: 0,
        check: CheckLevel::Quick,
        restore_with,
        env: Vec::new(),
    };
    let bytes = Some(rig.replica.bytes());
    match drill(Restorer::V05)
        .run(bytes, None, &Claims::default())
        .await
    {
        Err(Failure::Setup(text)) => assert!(
            text.contains("is litestream v0.3") && text.contains("backup.restore_with = \"0.5\""),
            "{text}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(list(&rig.drill_dir()), Vec::<String>::new());
    let proof = drill(Restorer::V03)
        .run(bytes, None, &Claims::default())
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(proof.watermark, watermark);
    assert!(
        proof.generation.is_some(),
        "0.3 names the generation it restored"
    );
}

/// Two generations at one path, as an old writer that still uploads WAL beside a newer one leaves them: the real
/// litestream 0.3 restores the one updated last, the real 0.5 (Zero 1.10's view-syncers) the one with the newest
/// snapshot. The listing read for each release (`backup.restore_with`) names the generation that release restores,
/// and a drill with each binary proves that generation's watermark.
#[tokio::test]
async fn each_litestream_release_restores_the_generation_the_listing_reads_for_it() {
    use litestream_sidecar::cleanup::config::RestoreLimit;
    use litestream_sidecar::litestream::destination::{Destination, Location, S3Settings};
    use litestream_sidecar::litestream::drill::{CheckLevel, Claims, Drill};
    use litestream_sidecar::litestream::layout::Restorer;
    use std::time::{SystemTime, UNIX_EPOCH};
    let mut rig = Rig::start(Options::default(), 0);
    let old = rig.apply(1, 1).await;
    let first = rig.dest.generations();
    assert_eq!(first.len(), 1, "{first:?}");
    // litestream loses its place (its local state gone): the next run starts a new generation.
    rig.litestream.kill();
    let state = rig.replica.path.with_file_name(".replica.db-litestream");
    std::fs::remove_dir_all(&state).unwrap_or_else(|e| panic!("{}: {e}", state.display()));
    rig.litestream.start();
    let new = rig.apply(2, 1).await;
    rig.litestream.kill();
    let (a, b) = (first[0].clone(), {
        let all = rig.dest.generations();
        all.into_iter()
            .find(|g| *g != first[0])
            .expect("a second generation")
    });
    // A's snapshot is the oldest object, its WAL the newest; B's snapshot is newer than A's.
    let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(1_764_900_000 + secs);
    let touch = |generation: &str, kind: &str, t: SystemTime| {
        let dir = rig
            .dir
            .path()
            .join("backup/generations")
            .join(generation)
            .join(kind);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let file = std::fs::File::options()
                .write(true)
                .open(entry.unwrap().path())
                .unwrap();
            file.set_modified(t).unwrap();
        }
    };
    touch(&a, "snapshots", at(100));
    touch(&a, "wal", at(500));
    touch(&b, "snapshots", at(300));
    touch(&b, "wal", at(400));

    for (restorer, bin, generation, watermark) in [
        (Restorer::V03, litestream::v03(), &a, &old),
        (Restorer::V05, litestream::v05(), &b, &new),
    ] {
        let listing = Destination::open(
            &Location::Local(rig.dir.path().join("backup")),
            &S3Settings::default(),
            Duration::from_secs(10),
            Vec::new(),
        )
        .unwrap()
        .restoring_with(restorer)
        .list()
        .await
        .unwrap();
        let chain = listing.layout.chain().expect("restorable");
        assert_eq!(
            &chain.generation, generation,
            "{restorer:?}: {:?}",
            listing.layout
        );
        let proof = Drill {
            litestream: bin,
            backup_url: rig.url.clone(),
            s3: Default::default(),
            dir: rig.drill_dir(),
            timeout: RestoreLimit::Auto,
            reserve: 0,
            check: CheckLevel::Quick,
            restore_with: restorer,
            env: Vec::new(),
        }
        .run(None, None, &Claims::default())
        .await
        .unwrap_or_else(|failure| panic!("{restorer:?}: {failure}"));
        assert_eq!(proof.generation.as_ref(), Some(generation), "{restorer:?}");
        assert_eq!(&proof.watermark, watermark, "{restorer:?}");
    }
}
