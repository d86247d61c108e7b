//! `[litestream]` and `[backup]`: where litestream's page is read and what the proxy shows of it, and how its
//! claims are checked against the backup destination.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::keys::{self, Section};
use crate::litestream::destination::{Location, S3Settings};
use crate::litestream::drill::CheckLevel;
use crate::net::address::parse_host_port;

/// `proxy_mode`: what Zero sees of the watermark gauge behind the metrics proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// One sample at the change log's oldest watermark, with the time of a backup that restores: Zero's backup
    /// verification, staleness checks and readiness gate (Zero 1.10) see a live backup, and a purge it schedules
    /// deletes nothing.
    #[default]
    Clamp,
    /// No `litestream_replica_progress` at all: Zero never schedules a purge, and a Zero 1.10 replication-manager
    /// that waits for a first backup after an initial sync never becomes ready.
    Hide,
}

/// `db` / `name`: which samples count. With several databases or replicas on one litestream, only the configured
/// one may drive cleanup (docs/protocol.md, "A watermark counted once one replica has it"). `None` accepts any value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Required value of label `db`.
    pub db: Option<String>,
    /// Required value of label `name`.
    pub name: Option<String>,
}

impl Filter {
    /// Whether a sample with these `db` and `name` labels (empty when absent) is taken.
    pub fn matches(&self, db: &str, name: &str) -> bool {
        self.db.as_deref().is_none_or(|want| want == db)
            && self.name.as_deref().is_none_or(|want| want == name)
    }
}

keys::section! {
    /// `[litestream]`
    pub struct LitestreamConfig(s) {
        /// The litestream replica URL sent to view-syncers as backupURL in every snapshot status: exactly the
        /// replication-manager's ZERO_LITESTREAM_BACKUP_URL (e.g. "s3://bucket/zero/replica" or
        /// "file:///backups/replica"). Required.
        backup_url: String = key("", |url: String| {
            let url = url.trim();
            if url.is_empty() {
                Err("must not be empty: it is the backupURL every view-syncer restores from".into())
            } else if url.chars().any(char::is_control) {
                Err("must not contain control characters".into())
            } else {
                Ok(url.to_string())
            }
        }),
        /// Where Zero's BackupMonitor fetches http://localhost:{ZERO_LITESTREAM_PORT}/metrics: the sidecar serves
        /// litestream's page there with litestream_replica_progress clamped or removed (proxy_mode), so that Zero never
        /// purges on its own. Every address the host resolves to is bound (127.0.0.1 and ::1 for localhost).
        proxy_listen: String = key("localhost:4850", |text: String| {
            parse_host_port(&text).map(|_| text.trim().to_string())
        }),
        /// litestream's own metrics page: the `addr:` of the litestream config Zero runs with
        /// (ZERO_LITESTREAM_CONFIG_PATH). Moved off Zero's litestream port so that the proxy (proxy_listen) can take
        /// that port.
        metrics_url: hyper::Uri = key("http://127.0.0.1:4860/metrics", |text: String| {
            let url = http_url(&text)?;
            match proxy_listen.as_deref().map(parse_host_port) {
                Some(Ok((host, port))) => not_the_proxy(&url, &host, port).map(|()| url),
                _ => Ok(url),
            }
        }),
        /// How often litestream is scraped and cleanup is decided (at least 1s).
        check_interval: Duration = key("60s", |text: String| keys::at_least(text, Duration::from_secs(1))),
        /// Give up on a scrape after this long; the next interval tries again.
        scrape_timeout: Duration = key("5s", |text: String| {
            keys::duration(text).and_then(|d| {
                if d.is_zero() {
                    Err("must be above 0".to_string())
                } else {
                    Ok(d)
                }
            })
        }),
        /// A metrics page larger than this many bytes is refused.
        max_page_bytes: usize = key(4u64 << 20, |n: u64| match usize::try_from(n) {
            Ok(n) if n >= 1024 => Ok(n),
            _ => Err(format!("{n} is not a size of at least 1024 bytes")),
        }),
        /// Only samples with these `db` / `name` labels count.
        filter: Filter = from(Some(Filter {
            db: s.get("db", String::new(), keys::optional)?,
            name: s.get("name", String::new(), keys::optional)?,
        })) reads {
            /// Count only litestream_replica_progress samples with this `db` label (the replica's absolute path);
            /// "" = any.
            db,
            /// Count only samples with this `name` label (the replica name, e.g. "s3" or "file"); "" = any. Set it when
            /// litestream has more than one replica, or a watermark counts as soon as the first replica has it.
            name,
        },
        /// What Zero sees of the watermark gauge behind the proxy:
        /// "clamp": one sample at the change log's oldest watermark (the replica version on an empty log), read at
        ///   every scrape, with the time of the newest backup that restores (none until there is one): Zero 1.7+'s
        ///   upload verification and staleness checks and 1.10's readiness gate see a live backup, and any purge Zero
        ///   schedules deletes nothing, since the log holds no row below that watermark.
        /// "hide": no litestream_replica_progress at all, so Zero never schedules a purge of its own; a Zero 1.10
        ///   replication-manager that waits for a first backup after an initial sync then never becomes ready, so
        ///   the sidecar refuses to start with "hide" in front of one (upstream.protocols from v4, or its answer
        ///   at start) and says so in the log and /status when it learns it later.
        proxy_mode: ProxyMode = key(ProxyMode::Clamp),
    }
}

keys::section! {
    /// `[backup]`: how litestream's claims are checked against the destination before a purge relies on them.
    pub struct BackupConfig(s, backup_url: Option<&str>) {
        /// Check litestream's claims against the destination (litestream.backup_url) before relying on them.
        /// litestream's gauge says watermark W was backed up at time T; a purge below W, and a snapshot status that
        /// sends a view-syncer to restore, wait until a listing of the replica's path shows that the newest generation
        /// restores (a snapshot and every WAL index after it, names of any hex width) and that its chain holds an
        /// object written at or after T, with no slack (a wedged litestream once advanced the gauge with nothing
        /// uploaded). A generation without a snapshot, a gap in its WAL indexes or a name that is not litestream's is
        /// reported and holds cleanup and statuses; a litestream 0.5 (LTX) destination is refused. Works for file://
        /// and s3:// (and S3-compatible) destinations. false: trust the gauge as it is (the only choice for gcs://,
        /// abs:// and sftp:// destinations).
        verify: bool = key(true),
        /// Removed: a claim is covered only by an object of an unbroken chain written at or after it.
        slack_removed: () = from(s.removed(
            "slack",
            "no longer used: a claim counts as backed up only when the newest generation's unbroken chain holds an \
             object written at or after it (docs/operations.md, \"Checking litestream's claims against the destination\"); delete the key",
        )),
        /// The destination is stale while its newest object is this much older than litestream's newest claim: logged
        /// at error once, shown by /keepalive and litestream_sidecar_backup_stale. The sidecar keeps serving; cleanup
        /// holds for the claims nothing covers.
        stale_after: Duration = key("15m", keys::positive_duration),
        /// One listing, every page of it, gives up after this long and cleanup holds for that check. The check waits
        /// for it. The destination is listed at every check (litestream.check_interval).
        list_timeout: Duration = key("10s", keys::positive_duration),
        /// Where the backup lives, parsed from `litestream.backup_url` (`None` with `verify` off).
        location: Option<Location> = from(match (backup_url, verify) {
            (Some(url), Some(true)) => match Location::parse(url) {
                Ok(location) => Some(Some(location)),
                Err(problem) => s.problem_elsewhere("litestream.backup_url", problem),
            },
            _ => Some(None),
        }),
        s3: S3Settings = from(s3_settings(s)) reads {
            /// S3-compatible endpoint (litestream's `endpoint`), scheme://host[:port], e.g.
            /// "https://minio.internal:9000". "" = AWS, or AWS_ENDPOINT from the environment. Credentials come only
            /// from the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, web identity
            /// (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), the ECS container endpoint, else the EC2 instance metadata
            /// service; never from this file.
            endpoint,
            /// Bucket region (litestream's `region`); "" = AWS_REGION or AWS_DEFAULT_REGION, else us-east-1.
            region,
            /// true: path-style requests (endpoint/bucket/key), as MinIO and most S3-compatible servers want; false:
            /// virtual-hosted (bucket.endpoint/key), as AWS wants.
            force_path_style,
            /// Allow a plain http:// endpoint. Only for a loopback or otherwise trusted network.
            allow_http,
        },
        /// The litestream release view-syncers restore with: "0.3" (Zero up to 1.9, and 1.10 with
        /// ZERO_LITESTREAM_RESTORE_USING_V5=false), or "0.5" (Zero 1.10's default: its ZERO_LITESTREAM_EXECUTABLE_V5
        /// restores the same v0.3 backup). The two restore a different generation when two litestreams write to one
        /// path (0.3: the one updated last, its WAL counted; 0.5: the one with the newest snapshot), so the listing
        /// behind statuses and cleanup is read as this release restores, and drills refuse a `litestream` whose
        /// `litestream version` names another release.
        restore_with: crate::litestream::layout::Restorer = key(crate::litestream::layout::Restorer::V03),
        /// Restore drills: the newest backup restored with this litestream executable (the one view-syncers restore
        /// with: upstream 0.3 or Zero's fork, or litestream 0.5 under restore_with = "0.5"), into a directory of
        /// drill_dir, at a low CPU and I/O priority (nice -n 10, ionice -c 2 -n 7), then opened with SQLite: PRAGMA
        /// quick_check (drill_check = "full": integrity_check), and the replica's stateVersion and replicaVersion
        /// read and compared with the change DB's. The outcome is in /status, the metrics and `litestream-sidecar
        /// status`; `litestream-sidecar drill` runs one now. The scratch directory is removed whatever happens.
        litestream: std::path::PathBuf = key("litestream", |text: String| match text.trim() {
            "" => Err("must name the litestream executable".to_string()),
            path => Ok(path.into()),
        }),
        /// How often a drill runs, once the destination holds something restorable; after a failure, again after
        /// 1 minute, then 2, 4, ... up to this. "off": only `litestream-sidecar drill` (not with
        /// cleanup.requires = "restore").
        drill_interval: Option<Duration> = key("1h", |text: String| match text.trim() {
            "off" => Ok(None),
            _ => keys::at_least(text, Duration::from_secs(1)).map(Some),
        }),
        /// A drill still restoring after this long is stopped and reported (not held against the backup). "auto": an
        /// hour per 50 GiB of the database (litestream_db_size), never less than an hour (an hour while the size is
        /// unknown), as cleanup.restore_limit scales: a restore takes about that long, and a fixed hour would never let
        /// a large replica be proven. Or a duration.
        drill_timeout: crate::litestream::restore_limit::RestoreLimit =
            key("auto", crate::litestream::restore_limit::RestoreLimit::parse),
        /// Where drills restore to, each into a directory of its own that is removed afterwards: on disk (a tmpfs /tmp
        /// would hold the whole database in memory).
        drill_dir: std::path::PathBuf = key("/var/tmp/litestream-sidecar", |text: String| {
            match text.trim() {
                path if path.starts_with('/') => Ok(path.into()),
                _ => Err("must be an absolute path".to_string()),
            }
        }),
        /// Bytes of free space a drill leaves on drill_dir's filesystem: it does not start unless the database
        /// (litestream_db_size) plus this fits, and is stopped when free space falls below this.
        drill_reserve: u64 = key(1u64 << 30),
        /// "quick": PRAGMA quick_check (every page and record readable); "full": integrity_check (indexes against their
        /// tables too; much slower on a large database).
        drill_check: CheckLevel = key(CheckLevel::Quick),
    }
}

/// `endpoint`, `region`, `force_path_style` and `allow_http`: the S3 client's settings over `AWS_*`.
fn s3_settings(s: &mut Section<'_>) -> Option<S3Settings> {
    let allow_http = s.value("allow_http", false);
    let endpoint = s.get("endpoint", String::new(), |text: String| {
        match text.trim() {
            "" => Ok(None),
            endpoint => endpoint_url(endpoint, allow_http.unwrap_or(false)).map(Some),
        }
    });
    let region = s.get("region", String::new(), keys::optional);
    let force_path_style = s.value("force_path_style", false);
    Some(S3Settings {
        endpoint: endpoint?,
        region: region?,
        force_path_style: force_path_style?,
        allow_http: allow_http?,
    })
}

/// Scraping the proxy would read a page with the watermarks already removed: cleanup would never run.
fn not_the_proxy(url: &hyper::Uri, proxy_host: &str, proxy_port: u16) -> Result<(), String> {
    let local = |h: &str| {
        matches!(
            h,
            "localhost" | "127.0.0.1" | "::1" | "[::1]" | "0.0.0.0" | "[::]"
        )
    };
    let host = url.host().unwrap_or("");
    let same_host = host == proxy_host || (local(host) && local(proxy_host));
    if same_host && url.port_u16().unwrap_or(80) == proxy_port {
        return Err(format!(
            "{url} is the sidecar's own metrics proxy (litestream.proxy_listen): point it at litestream's real addr, \
             e.g. http://127.0.0.1:4860/metrics"
        ));
    }
    Ok(())
}

/// An `http://host:port/path` URL; litestream serves plain HTTP on loopback.
fn http_url(text: &str) -> Result<hyper::Uri, String> {
    // Errors show the URL without any `user:password@`.
    let shown = keys::without_userinfo(text.trim());
    let uri: hyper::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "{shown:?} must be an http:// URL with a host, e.g. http://127.0.0.1:4860/metrics"
        ));
    }
    // The scraper is the judge of what it can scrape: whatever it would refuse once running is refused here.
    crate::net::client::HttpClient::new(uri.clone(), Duration::ZERO, 0)
        .map_err(|e| e.to_string())?;
    Ok(uri)
}

/// An `https://host[:port]` endpoint; `http://` only with `allow_http`, since request signatures and listings
/// would cross the network in clear.
fn endpoint_url(text: &str, allow_http: bool) -> Result<String, String> {
    if keys::without_userinfo(text) != text {
        // Shown without them: whatever is there may be a secret.
        return Err(format!(
            "{:?}: credentials in the endpoint are not used; they come from the environment \
             (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...)",
            keys::without_userinfo(text)
        ));
    }
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if url.host_str().is_none() || !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!(
            "{text:?} must be scheme://host[:port] with no path, e.g. https://minio.internal:9000"
        ));
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => {
            return Err(format!(
                "{text:?} is plain http: set backup.allow_http = true for a loopback or trusted-network endpoint"
            ))
        }
        other => return Err(format!("{text:?}: scheme {other:?} is neither https nor http")),
    }
    Ok(text.trim_end_matches('/').to_string())
}

impl BackupConfig {
    /// The restore drill these settings describe, of the backup at `backup_url`.
    pub fn drill(&self, backup_url: &str) -> crate::litestream::drill::Drill {
        crate::litestream::drill::Drill {
            litestream: self.litestream.clone(),
            backup_url: backup_url.to_string(),
            s3: self.s3.clone(),
            dir: self.drill_dir.clone(),
            timeout: self.drill_timeout,
            reserve: self.drill_reserve,
            check: self.drill_check,
            restore_with: self.restore_with,
            env: Vec::new(),
        }
    }
}
