//! The backup destination (`litestream.backup_url`) as the sidecar checks it: litestream's gauge only claims that
//! a watermark was uploaded, and a wedged litestream has advanced it without uploading anything (docs/protocol.md,
//! "Backup claims without an upload").
//! Before a purge relies on a claim, and before a snapshot status sends a view-syncer to restore, the destination
//! is listed and its newest object's last-modified time becomes a fact for the cleanup policy.
//!
//! Only the replica's own path is listed (a directory walk for `file://`, a prefix listing for `s3://`), each
//! listing bounded by `backup.list_timeout` with no retries of its own: the next check is the retry. The names are
//! read by [`crate::litestream::layout`]: a claim counts as covered only by the newest generation's unbroken chain.
//!
//! S3 credentials never come from the config file: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` /
//! `AWS_SESSION_TOKEN`, web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`), the ECS container endpoint, and
//! last the EC2 instance metadata service, in the order `object_store` tries them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::litestream::layout::{Layout, Object, Restorer, Uploads};

/// Where litestream writes the replica, from `litestream.backup_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `file:///path`: the directory litestream writes into.
    Local(PathBuf),
    /// `s3://bucket/prefix`: `prefix` without leading or trailing `/`, possibly empty.
    S3 { bucket: String, prefix: String },
}

impl Location {
    /// Parses a litestream replica URL; only what can be listed is accepted. Other litestream schemes (`gcs`,
    /// `abs`, `sftp`) are refused with a hint, since `backup.verify` would then hold cleanup for good.
    pub fn parse(text: &str) -> Result<Location, String> {
        let url = url::Url::parse(text.trim())
            .map_err(|e| format!("{text:?} is not a URL that can be listed: {e}"))?;
        match url.scheme() {
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|()| format!("{text:?} is not a file:// URL with an absolute path"))?;
                Ok(Location::Local(path))
            }
            "s3" => {
                let bucket = url
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| format!("{text:?} names no bucket (s3://bucket/path)"))?;
                let prefix = percent_decode(url.path().trim_matches('/'));
                Ok(Location::S3 {
                    bucket: bucket.to_string(),
                    prefix,
                })
            }
            other => Err(format!(
                "{text:?}: backup.verify can list only file:// and s3:// destinations, not {other}://; set \
                 backup.verify = false to trust litestream's gauge as it is"
            )),
        }
    }
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("p={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// How far before its own object's last-modified time a claim's stamp may read (see
/// [`Listing::claim_of_another_generation`]).
const CLAIM_ROUNDING: std::time::Duration = std::time::Duration::from_millis(1);

/// What one listing found under the replica's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub objects: u64,
    /// The newest last-modified time; `None` when there is no object.
    pub newest: Option<SystemTime>,
    /// What the names say of a restore of the generation a restore picks.
    pub layout: Layout,
    /// Which generation uploaded when: whose a claim is.
    pub uploads: Uploads,
}

impl Listing {
    /// The newest generation has a snapshot and an unbroken chain: something a view-syncer can restore.
    pub fn is_restorable(&self) -> bool {
        self.layout.chain().is_some()
    }

    /// The newest time a restore reaches: the last-modified time of the newest object of the restorable chain.
    pub fn chain_newest(&self) -> Option<SystemTime> {
        self.layout.chain().map(|chain| chain.newest)
    }

    fn of(objects: &[Object], restorer: Restorer) -> Listing {
        Listing {
            objects: objects.len() as u64,
            newest: objects.iter().map(|o| o.modified).max(),
            layout: Layout::read_for(objects, restorer),
            uploads: Uploads::read(objects),
        }
    }

    /// Whether a claim stamped at `claimed` is of another generation than the one a restore picks: then no object
    /// of the picked generation covers it, however new (see [`Uploads`]). A claim older than every upload is of
    /// none.
    pub fn claim_of_another_generation(&self, claimed: SystemTime) -> bool {
        // The gauge's value is epoch seconds as a float: a claim stamped at its own object's time can read a hair
        // before it.
        let stamped = claimed + CLAIM_ROUNDING;
        match self.layout.chain() {
            Some(chain) => self.uploads.generation_at(stamped) != Some(chain.generation.as_str()),
            None => false,
        }
    }
}

/// Why a listing gave no answer; `kind` is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ListError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No answer within `backup.list_timeout`.
    Timeout,
    /// Credentials missing, wrong or without permission to list.
    Denied,
    /// The bucket (or the local directory's parent) does not exist.
    NotFound,
    /// Anything else: a refused connection, a server error, an unreadable directory.
    Other,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Timeout,
        ErrorKind::Denied,
        ErrorKind::NotFound,
        ErrorKind::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Denied => "denied",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Other => "other",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ListError {
    fn of(err: &object_store::Error) -> Self {
        let message = err.to_string();
        let kind = match err {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => ErrorKind::Denied,
            // S3 list errors reach here as generic ones carrying the service's code and status.
            _ if message.contains("NoSuchBucket") => ErrorKind::NotFound,
            _ if [
                "AccessDenied",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "403",
            ]
            .iter()
            .any(|code| message.contains(code)) =>
            {
                ErrorKind::Denied
            }
            _ => ErrorKind::Other,
        };
        Self { kind, message }
    }
}

/// The destination, ready to be listed.
pub struct Destination {
    location: Location,
    /// `None` for a local directory: it is opened at each listing, as it may not exist yet.
    store: Option<Arc<dyn ObjectStore>>,
    timeout: Duration,
    /// Whose restore the listing's layout is read for (`backup.restore_with`).
    restorer: Restorer,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("location", &self.location)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Destination {
    /// Builds the client; nothing is contacted yet. `env` is where the `AWS_*` variables come from: the process
    /// environment in the daemon, an explicit set in tests.
    pub fn open(
        location: &Location,
        s3: &S3Settings,
        timeout: Duration,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, String> {
        let store: Option<Arc<dyn ObjectStore>> = match location {
            Location::Local(_) => None,
            Location::S3 { bucket, .. } => Some(Arc::new(s3_client(bucket, s3, timeout, env)?)),
        };
        Ok(Self {
            location: location.clone(),
            store,
            timeout,
            restorer: Restorer::default(),
        })
    }

    /// Reads what a restore picks as `restorer` picks it (litestream 0.3 unless told).
    pub fn restoring_with(mut self, restorer: Restorer) -> Self {
        self.restorer = restorer;
        self
    }

    /// Lists every object under the replica's path, within the timeout.
    pub async fn list(&self) -> Result<Listing, ListError> {
        let listing = async {
            match (&self.location, &self.store) {
                (Location::S3 { prefix, .. }, Some(store)) => {
                    let prefix = (!prefix.is_empty())
                        .then(|| object_store::path::Path::from(prefix.as_str()));
                    newest_of(store.as_ref(), prefix.as_ref(), self.restorer).await
                }
                (Location::Local(dir), _) => list_local(dir, self.restorer).await,
                (Location::S3 { .. }, None) => {
                    unreachable!("an s3 location is opened with its client")
                }
            }
        };
        tokio::time::timeout(self.timeout, listing)
            .await
            .unwrap_or_else(|_| {
                Err(ListError {
                    kind: ErrorKind::Timeout,
                    message: format!("no complete listing within {:?}", self.timeout),
                })
            })
    }
}

/// A directory litestream has not created yet holds nothing: empty, not an error.
async fn list_local(dir: &std::path::Path, restorer: Restorer) -> Result<Listing, ListError> {
    match tokio::fs::metadata(dir).await {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ListError {
                kind: ErrorKind::Other,
                message: format!("{} is not a directory", dir.display()),
            })
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Listing::of(&[], restorer))
        }
        Err(err) => {
            return Err(ListError {
                kind: ErrorKind::Other,
                message: format!("{}: {err}", dir.display()),
            })
        }
    }
    let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| ListError::of(&e))?;
    newest_of(&store, None, restorer).await
}

async fn newest_of(
    store: &dyn ObjectStore,
    prefix: Option<&object_store::path::Path>,
    restorer: Restorer,
) -> Result<Listing, ListError> {
    let mut listed = store.list(prefix);
    let mut objects = Vec::new();
    while let Some(meta) = listed.try_next().await.map_err(|e| ListError::of(&e))? {
        // Names below the replica's path, as litestream lays them out there.
        let path = meta.location.as_ref();
        let path = match prefix {
            Some(prefix) => path
                .strip_prefix(prefix.as_ref())
                .map_or(path, |rest| rest.trim_start_matches('/')),
            None => path,
        };
        objects.push(Object {
            path: path.to_string(),
            modified: SystemTime::from(meta.last_modified),
        });
    }
    Ok(Listing::of(&objects, restorer))
}

/// S3 connection settings from the file; credentials come only from the environment (see [`crate::litestream::destination`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// An S3-compatible endpoint such as `https://minio.internal:9000`; `None`: AWS (or `AWS_ENDPOINT`).
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// `https://endpoint/bucket/key` rather than `https://bucket.endpoint/key`.
    pub force_path_style: bool,
    pub allow_http: bool,
}

/// The S3 client: `AWS_*` variables first, the file's settings over them. Requests are not retried (the next
/// check is the retry); the listing's timeout bounds them.
fn s3_client(
    bucket: &str,
    s3: &S3Settings,
    timeout: Duration,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<object_store::aws::AmazonS3, String> {
    let mut builder = AmazonS3Builder::new();
    for (key, value) in env {
        if key.starts_with("AWS_") {
            if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(config_key, value);
            }
        }
    }
    builder = builder.with_bucket_name(bucket).with_retry(RetryConfig {
        max_retries: 0,
        retry_timeout: timeout,
        ..RetryConfig::default()
    });
    // The listing's own timeout decides (and reports a timeout as one); the client's only catches what outlives
    // it, so it is set a little longer rather than racing it.
    let request_timeout = timeout + Duration::from_secs(1);
    let mut options = ClientOptions::new()
        .with_timeout(request_timeout)
        .with_connect_timeout(request_timeout);
    if s3.allow_http {
        options = options.with_allow_http(true);
    }
    builder = builder.with_client_options(options);
    if let Some(region) = &s3.region {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = &s3.endpoint {
        builder = builder.with_endpoint(virtual_hosted(endpoint, bucket, s3.force_path_style)?);
    }
    builder = builder.with_virtual_hosted_style_request(!s3.force_path_style);
    builder.build().map_err(|e| e.to_string())
}

/// `object_store` expects a virtual-hosted endpoint to name the bucket already; litestream takes the bare endpoint
/// and puts the bucket in front of its host, as done here.
fn virtual_hosted(endpoint: &str, bucket: &str, path_style: bool) -> Result<String, String> {
    if path_style {
        return Ok(endpoint.to_string());
    }
    let mut url = url::Url::parse(endpoint).map_err(|e| format!("{endpoint:?}: {e}"))?;
    let host = url.host_str().unwrap_or_default().to_string();
    url.set_host(Some(&format!("{bucket}.{host}")))
        .map_err(|e| format!("{endpoint:?}: {e}"))?;
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// Whether the destination is stale: its newest object is more than `stale_after` older than litestream's newest
/// claim. Measured against the claim rather than the clock, so an idle database whose gauge stands still is not
/// stale; an empty destination behind a claim is.
pub fn is_stale(
    newest_object: Option<SystemTime>,
    claimed: SystemTime,
    stale_after: Duration,
) -> bool {
    match newest_object {
        None => true,
        Some(newest) => claimed
            .duration_since(newest)
            .is_ok_and(|behind| behind > stale_after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn only_listable_urls_are_accepted() {
        assert_eq!(
            Location::parse("s3://acme-zero/zero/replica/").unwrap(),
            Location::S3 {
                bucket: "acme-zero".into(),
                prefix: "zero/replica".into()
            }
        );
        assert_eq!(
            Location::parse("s3://acme-zero").unwrap(),
            Location::S3 {
                bucket: "acme-zero".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            Location::parse("file:///var/backups/zero%20replica").unwrap(),
            Location::Local("/var/backups/zero replica".into())
        );
        for refused in ["gcs://b/r", "abs://a@b/r", "s3:///r", "/plain/path"] {
            assert!(Location::parse(refused).is_err(), "{refused}");
        }
        assert!(Location::parse("gcs://b/r")
            .unwrap_err()
            .contains("backup.verify = false"));
    }

    #[test]
    fn the_bucket_goes_in_front_of_the_endpoint_host_unless_path_style() {
        assert_eq!(
            virtual_hosted("https://storage.example:9000", "zb", false).unwrap(),
            "https://zb.storage.example:9000"
        );
        assert_eq!(
            virtual_hosted("http://127.0.0.1:9000", "zb", true).unwrap(),
            "http://127.0.0.1:9000"
        );
    }

    #[test]
    fn stale_when_the_newest_object_is_far_behind_the_newest_claim() {
        let t = |secs: u64| UNIX_EPOCH + Duration::from_secs(1_746_600_000 + secs);
        let after = Duration::from_secs(900);
        assert!(!is_stale(Some(t(100)), t(1000), after));
        assert!(is_stale(Some(t(99)), t(1000), after));
        // An object newer than the claim, or an idle gauge: not stale.
        assert!(!is_stale(Some(t(2000)), t(1000), after));
        assert!(is_stale(None, t(1000), after));
    }
}
